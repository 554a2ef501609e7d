"""What the dashboard page draws is computed from the cluster view: slices by job and tenant, Lazy/Busy per GPU,
held GPUs, the queue oldest first with its reasons."""

from __future__ import annotations

import pytest

from migsched.clusterview import ClusterView, GpuRow, InstanceRow, JobRow
from migsched.dashboard import Decision, fragmentation, page_data
from shared.mig.geometry import default_geometry
from shared.policy.fragcost import UNIFORM_SHAPES, frag_rate
from shared.policy.gpu_view import GpuView, InstanceView
from shared.policy.reservation import Reservation
from shared.policy.snapshot import snapshot_of

pytestmark = pytest.mark.unit
GEO = default_geometry()


def view() -> ClusterView:
    g0 = GpuRow(id="n/0", node="n", index=0, model="A100-40GB", healthy=True, load=3 / 7, frag_cost=0.46,
                instances=(InstanceRow(id="i1", profile="3g.20gb", start=4, size=4, compute=3, state="busy",
                                       job_id="j1"),
                           InstanceRow(id="i2", profile="1g.5gb", start=0, size=1, compute=1, state="idle")),
                slices="")
    g1 = GpuRow(id="n/1", node="n", index=1, model="A100-40GB", healthy=True, load=0.0, frag_cost=0.0,
                instances=(), slices="")
    return ClusterView(
        at=1000.0, namespace="x", nodes={"n": "up"}, gpus=(g0, g1),
        jobs={"j1": "running", "late": "pending", "early": "pending"}, counts={"running": 1, "pending": 2},
        reasons={"late": "capacity: no free 7g", "early": "reserved: held"},
        holds=(Reservation(job_id="early", gpus=("n/1",), node="n", start=1200.0, reason="oldest large job"),),
        rows={"j1": JobRow(tenant="team-a", demand="3g.20gb", since=900.0),
              "late": JobRow(tenant="team-b", demand="7g.40gb", since=990.0),
              "early": JobRow(tenant="team-c", demand="7g.40gb", since=950.0)},
    )


def test_each_gpu_is_drawn_with_its_slices_its_tier_and_what_holds_it() -> None:
    data = page_data(view(), GEO, 0.4, [(1000.0, 0.25, 0.1)], [Decision(job_id="j1", at=995.0, reason="r")])
    g0, g1 = data["gpus"]
    assert g0["tier"] == "busy" and g1["tier"] == "lazy" and g0["slices"] == 8
    assert {(c["job"], c["tenant"], c["state"], c["start"], c["size"]) for c in g0["cells"]} == {
        ("j1", "team-a", "busy", 4, 4), (None, "", "idle", 0, 1)}
    assert g1["held_for"] == "early" and g0["held_for"] is None
    assert data["summary"]["utilisation"] == 4 / 16 and data["summary"]["fragmentation"] == 0.1


def test_the_queue_is_listed_oldest_first_with_its_reasons_and_age() -> None:
    data = page_data(view(), GEO, 0.4, [], [])
    assert [(q["job"], q["tenant"], q["age_s"], q["reason"]) for q in data["queue"]] == [
        ("early", "team-c", 50.0, "reserved: held"), ("late", "team-b", 10.0, "capacity: no free 7g")]
    assert data["holds"][0]["gpus"] == ["n/1"] and "early" in data["holds"][0]["reason"]


def test_fragmentation_counts_only_busy_slices_as_taken() -> None:
    def rate(*instances: InstanceView) -> float:
        gpus = [GpuView.build(id="n/0", node="n", index=0, model="A100-40GB", instances=instances),
                GpuView.build(id="n/1", node="n", index=1, model="A100-40GB")]
        return frag_rate(snapshot_of(GEO, gpus), UNIFORM_SHAPES)

    busy = InstanceView(id="i1", profile="3g.20gb", start=4, size=4, compute=3, job_id="j1")
    idle_as_busy = InstanceView(id="i2", profile="1g.5gb", start=0, size=1, compute=1, job_id="x")
    assert fragmentation(view(), GEO) == pytest.approx(rate(busy))  # the idle 1g is reclaimable
    assert rate(busy) != pytest.approx(rate(busy, idle_as_busy))


def test_gpus_not_in_mig_mode_are_drawn_and_left_out_of_the_fragmentation_rate() -> None:
    from migsched.clusterview import gpu_row
    from shared.state import StoredGpu, StoredInstance

    whole = StoredGpu(id="p/0", node="p", index=0, model="A100-40GB", mig=False, instances=[
        StoredInstance(id="p/0:gpu@0:g", profile="gpu", start=0, size=8, compute=7, state="busy", job="g")])
    shares = StoredGpu(id="p/1", node="p", index=1, model="A100-40GB", mig=False, replicas=4, instances=[
        StoredInstance(id="p/1:shared@0:s", profile="shared", start=0, size=0, compute=0, state="busy", job="s")])
    mig = view()
    plain = ClusterView(at=mig.at, namespace="x", nodes={"n": "up", "p": "up"},
                        gpus=(*mig.gpus, gpu_row(whole, GEO), gpu_row(shares, GEO)), jobs=mig.jobs,
                        counts=mig.counts, rows=mig.rows)
    data = page_data(plain, GEO, 0.4, [], [])
    drawn = {g["id"]: g for g in data["gpus"]}
    # one column for the whole-GPU job, one per share of the time-sliced GPU
    assert (drawn["p/0"]["slices"], drawn["p/0"]["cells"][0]["job"], drawn["p/0"]["cells"][0]["size"]) == (1, "g", 1)
    assert (drawn["p/1"]["slices"], drawn["p/1"]["cells"][0]["job"], drawn["p/1"]["cells"][0]["size"]) == (4, "s", 1)
    assert fragmentation(plain, GEO) == pytest.approx(fragmentation(mig, GEO))  # no MIG slices on plain GPUs
