"""The migration engine: the planner that defragments by moves (``planner``, with its search, pulls and plan
assembly), consolidation of lightly used GPUs, and moves that unblock a waiting whole-GPU job (``unblock``)."""
