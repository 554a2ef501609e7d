"""The immutable view of the cluster that every policy reads.

``GpuView``/``InstanceView`` (``gpu_view``) are frozen structs; ``ClusterSnapshot`` (``cluster_snapshot``) adds
read-only numpy columns (one entry per GPU) so that a decision over thousands of GPUs is a handful of vector
operations. ``SnapshotBuilder`` (``snapshot_builder``) keeps those columns up to date incrementally for the
simulator and the services, so taking a snapshot is a cheap copy; ``with_columns`` derives a snapshot with
some columns replaced; ``snapshot_of`` builds one in one go. The per-GPU rows of the starts and planner columns
are computed in ``snapshot_columns``.

This module is the stable import path for all of them.
"""

from __future__ import annotations

from shared.policy.cluster_snapshot import ClusterSnapshot, Column
from shared.policy.gpu_view import GpuView, InstanceView
from shared.policy.snapshot_builder import SnapshotBuilder, snapshot_of

__all__ = ["ClusterSnapshot", "Column", "GpuView", "InstanceView", "SnapshotBuilder", "snapshot_of"]
