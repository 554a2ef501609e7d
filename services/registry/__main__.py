"""``python -m services.registry``: settings: ``shared.settings.RegistrySettings``."""

from services.common.runner import run
from services.registry.service import NodeRegistry
from shared.settings import RegistrySettings

if __name__ == "__main__":
    run(NodeRegistry, RegistrySettings)
