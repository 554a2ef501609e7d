"""``python -m services.executor``: one executor for this node (settings from MIGSCHED_* variables)."""

from services.executor.service import main

main()
