"""The partitioner service with the node registry: ``python -m services.partitioner`` or
``migsched service partitioner``."""
