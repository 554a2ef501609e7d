"""The balancer service (DESIGN §2): ``python -m services.balancer`` or ``migsched service balancer``."""
