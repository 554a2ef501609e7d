"""Microsoft's ITP traces (ElasticFlow, ASPLOS '23): the training jobs of ten internal GPU clusters over two
months of 2021, one CSV per cluster (``cluster01.csv`` ... ``cluster10.csv``) with ``job_id``,
``submission_time``, ``duration`` and ``num_gpu`` (1 to 64 whole GPUs). Jobs of more than eight GPUs are gangs
across nodes: 1.5-4.5 % of the jobs and 16-74 % of the GPU-hours in clusters 01-04 and 06.

Replayed through the CSV loader (``shared.sim.workloads.csv``): a one-GPU job is a full-size instance, a bigger
one a gang of whole GPUs. The traces name no priority, tenant or class."""

from __future__ import annotations

from shared.mig.geometry import GpuModel
from shared.sim.errors import WorkloadError
from shared.sim.jobs import Workload
from shared.sim.workloads import catalog
from shared.sim.workloads.csv import load_csv

COLUMNS = "arrival=submission_time,duration=duration,gpus=num_gpu,id=job_id"
"""The CSV loader's mapping of an ITP cluster file."""


def load_itp(cluster: str, model: GpuModel) -> Workload:
    """The jobs of one ITP cluster (``cluster04``, or ``04``), read from the traces directory."""
    name = cluster if cluster.startswith("cluster") else f"cluster{cluster}"
    path = catalog.traces_dir() / catalog.trace("itp").folder / f"{name}.csv"
    if not path.exists():
        raise WorkloadError(f"ITP trace {path.name} is absent: {catalog.missing_hint('itp')}")
    # whole GPUs for training, as openb's whole-GPU pods: the large-training interference class
    return load_csv(path, COLUMNS, model, name=f"itp:{name}", default_class="large-training")
