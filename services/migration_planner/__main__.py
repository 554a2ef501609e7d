"""``python -m services.migration_planner``: settings from ``MIGSCHED_*``
(``shared.settings.MigrationPlannerSettings``)."""

from services.common.runner import run
from services.migration_planner.service import MigrationPlanner
from shared.settings import MigrationPlannerSettings

if __name__ == "__main__":
    run(MigrationPlanner, MigrationPlannerSettings)
