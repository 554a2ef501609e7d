"""The migration-planner service: ``python -m services.migration_planner`` or
``migsched service migration-planner``."""
