"""The migration-planner service (DESIGN §2): ``python -m services.migration_planner`` or
``migsched service migration-planner``."""
