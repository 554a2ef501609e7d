"""``python -m services.balancer``: settings from ``MIGSCHED_*`` (``shared.settings.BalancerSettings``)."""

from services.balancer.service import Balancer
from services.common.runner import run
from shared.settings import BalancerSettings

if __name__ == "__main__":
    run(Balancer, BalancerSettings)
