"""The placement engine: decisions as data (``decision``), the registry of policies by name (``registry``) and
their scoring plug-ins (``plugins``), the incremental cluster index the simulator and the balancer's mirror keep
(``index``), and the rules every policy shares (whole-GPU gangs across nodes, topology domains, time-sliced
shares, slot construction)."""
