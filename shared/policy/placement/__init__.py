"""The placement engine: decisions as data (``decision``), the registry of policies by name (``registry``), their
plug-ins (``plugins``), each giving only its own ``Rules`` that ``rules`` composes with those every policy shares
(time-sliced shares, plain GPUs first for a gang, gangs across nodes, topology domains), slot construction
(``slots``), and the incremental cluster index the simulator and the balancer's mirror keep (``index``)."""
