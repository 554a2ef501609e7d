"""The balancer service: ``python -m services.balancer`` or ``migsched service balancer``."""
