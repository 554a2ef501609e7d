"""``python -m services.partitioner``: settings: ``shared.settings.PartitionerSettings``."""

from services.common.runner import run
from services.partitioner.service import Partitioner
from shared.settings import PartitionerSettings

if __name__ == "__main__":
    run(Partitioner, PartitionerSettings)
