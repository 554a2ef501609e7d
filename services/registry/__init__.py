"""The node registry service: ``python -m services.registry`` or ``migsched service registry``."""
