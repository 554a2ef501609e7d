"""The audit's check of each GPU's sharing mode (the gang and time-sliced share scenarios run on both stores in
``tests/contract/``)."""

from __future__ import annotations

import pytest

from shared.mig.geometry import default_geometry
from shared.state import JobRecord, StoredGpu, StoredInstance
from shared.state.check import check_state

pytestmark = pytest.mark.unit
GEO = default_geometry()


def _gpu(mig: bool, replicas: int, *insts: StoredInstance) -> StoredGpu:
    return StoredGpu(id="n1/0", node="n1", index=0, model="A100-40GB", mig=mig, replicas=replicas,
                     instances=list(insts))


def _share(job: str, replica: int) -> StoredInstance:
    return StoredInstance(id=f"s{job}", profile="shared", start=replica, size=0, compute=0, state="busy", job=job)


def _whole(job: str) -> StoredInstance:
    return StoredInstance(id=f"w{job}", profile="gpu", start=0, size=8, compute=7, state="busy", job=job)


def _kinds(g: StoredGpu) -> list[str]:
    jobs = [JobRecord(job_id=i.job or "", state="running", gpu=g.id, inst=i.id) for i in g.instances if i.job]
    return [v.detail for v in check_state(GEO, [g], jobs, set()) if v.kind == "sharing"]


@pytest.mark.parametrize(
    ("gpu", "expected"),
    [
        (_gpu(False, 2, _share("a", 0), _share("b", 1)), []),
        (_gpu(False, 0, _whole("a")), []),
        (_gpu(False, 2, _share("a", 0), _share("b", 1), _share("c", 1)), ["3 shares in use > replicas 2",
                                                                        "two shares on one replica"]),
        (_gpu(False, 2, _share("a", 2)), ["replica 2 outside 0..1"]),
        (_gpu(False, 2, _whole("a"), _share("b", 0)), ["shares the GPU"]),
        (_gpu(True, 0, _whole("a")), ["on a GPU in MIG mode"]),
        (_gpu(False, 0, StoredInstance(id="m", profile="1g.5gb", start=0, size=1, compute=1)),
         ["MIG instance 1g.5gb on a GPU not in MIG mode"]),
        (_gpu(False, 0, StoredInstance(id="w", profile="gpu", start=0, size=8, compute=7)), ["idle gpu instance"]),
    ],
    ids=["shares", "whole", "oversubscribed", "replica-range", "whole-beside-share", "plain-on-mig",
         "mig-on-plain", "idle-plain"],
)
def test_the_audit_checks_the_sharing_mode_of_every_gpu(gpu: StoredGpu, expected: list[str]) -> None:
    found = _kinds(gpu)
    assert len(found) == len(expected), found
    for want in expected:
        assert any(want in f for f in found), (want, found)
