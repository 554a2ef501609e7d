"""The partitioner service with the node registry (DESIGN §2): ``python -m services.partitioner`` or
``migsched service partitioner``."""
