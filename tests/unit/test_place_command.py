"""``place_commands``: one committed placement -> the executors' place commands the balancer sends (one per
member node of a gang across nodes)."""

from __future__ import annotations

import pytest

from services.common.place_command import gang_port, place_cmd_id, place_commands, victim_stops
from shared.events import Command, JobInfo, Placed, Workload
from shared.mig.geometry import default_geometry
from shared.policy.gpu_view import GpuView, InstanceView
from shared.policy.partition import PlanConflict
from shared.policy.placement.decision import Placement, Slot

pytestmark = pytest.mark.unit
GEO = default_geometry()


def _slot(profile: str, start: int, size: int, compute: int, action: str = "create", **kw: object) -> Slot:
    return Slot(gpu_id="n1/0", node="n1", model="A100-40GB", profile=profile, start=start, size=size,
                compute=compute, action=action, **kw)  # type: ignore[arg-type]


def _placed(gpu: GpuView, *slots: Slot, attempt: int = 2, preempted: tuple[str, ...] = ()) -> Placed:
    return Placed(
        id="p-1",
        job_id="j1",
        placement=Placement(job_id="j1", policy="test", slots=slots, tier="lazy", frag_before=0.0, frag_after=0.0),
        gpu=gpu,
        gpu_version=7,
        attempt=attempt,
        decided_at=100.0,
        preempted=preempted,
        job=JobInfo(workload=Workload(argv=("python", "x.py")), duration_hint_s=30.0, submitted_at=99.5),
    )


def place_command(p: Placed, geo: object, now: float) -> Command | PlanConflict:
    """The one command of a placement on one node."""
    cmds = place_commands(p, GEO, now)
    if isinstance(cmds, PlanConflict):
        return cmds
    assert len(cmds) == 1
    return cmds[0]


def _idle(profile: str, start: int, size: int, compute: int, job: str | None = None) -> InstanceView:
    return InstanceView(id=f"n1/0:{profile}@{start}:old", profile=profile, start=start, size=size, compute=compute,
                        job_id=job)


def test_a_mig_placement_becomes_a_place_command_that_clears_the_idle_instance_in_its_way_first() -> None:
    gpu = GpuView.build(id="n1/0", node="n1", index=0, model="A100-40GB", instances=(_idle("7g.40gb", 0, 8, 7),))
    p = _placed(gpu, _slot("3g.20gb", 4, 4, 3, destroy=("n1/0:7g.40gb@0:old",)), preempted=("victim",))
    cmd = place_command(p, GEO, 123.0)
    assert isinstance(cmd, Command)
    assert (cmd.id, cmd.cmd_id, cmd.kind, cmd.node, cmd.gpu_id, cmd.gpu_index) == (
        "place:j1:2", "place:j1:2", "place", "n1", "n1/0", 0)
    assert [(op.kind, op.instance_id) for op in cmd.ops] == [
        ("destroy_ci", "n1/0:7g.40gb@0:old"), ("destroy_gi", "n1/0:7g.40gb@0:old"),
        ("create_gi", "n1/0:3g.20gb@4:j1"), ("create_ci", "n1/0:3g.20gb@4:j1")]
    assert cmd.instance_id == "n1/0:3g.20gb@4:j1" and cmd.ops[2].start == 4 and cmd.ops[2].profile_id == 9
    assert (cmd.job_id, cmd.workload.argv, cmd.duration_s, cmd.at, cmd.submitted_at) == (
        "j1", ("python", "x.py"), 30.0, 123.0, 99.5)
    assert cmd.stop_jobs == ("victim",) and cmd.plain == ()


def test_reusing_an_idle_instance_needs_no_mig_operation() -> None:
    gpu = GpuView.build(id="n1/0", node="n1", index=0, model="A100-40GB", instances=(_idle("3g.20gb", 4, 4, 3),))
    cmd = place_command(_placed(gpu, _slot("3g.20gb", 4, 4, 3, "reuse", instance_id="n1/0:3g.20gb@4:old")),
                        GEO, 1.0)
    assert isinstance(cmd, Command) and cmd.ops == () and cmd.instance_id == "n1/0:3g.20gb@4:old"


def test_a_view_where_a_busy_instance_overlaps_the_slot_is_a_conflict_not_a_command() -> None:
    gpu = GpuView.build(id="n1/0", node="n1", index=0, model="A100-40GB",
                        instances=(_idle("4g.20gb", 0, 4, 4, job="other"),))
    res = place_command(_placed(gpu, _slot("3g.20gb", 0, 4, 3)), GEO, 1.0)
    assert isinstance(res, PlanConflict) and "busy instance" in res.reason and "other" in res.reason


def test_a_whole_gpu_gang_becomes_one_plain_command_binding_every_gpu() -> None:
    gpu = GpuView.build(id="n1/0", node="n1", index=0, model="A100-40GB", mig=False)
    slots = tuple(
        Slot(gpu_id=f"n1/{i}", node="n1", model="A100-40GB", profile="gpu", start=0, size=8, compute=7,
             action="create")
        for i in (0, 3)
    )
    cmd = place_command(_placed(gpu, *slots, attempt=0), GEO, 5.0)
    assert isinstance(cmd, Command) and cmd.ops == () and cmd.cmd_id == place_cmd_id("j1", 0) == "place:j1:0"
    assert [(s.gpu_index, s.profile, s.instance_id) for s in cmd.plain] == [
        (0, "gpu", "n1/0:gpu@0:j1"), (3, "gpu", "n1/3:gpu@0:j1")]
    assert cmd.instance_id == "n1/0:gpu@0:j1" and cmd.gpu_index == 0

    assert cmd.gang is not None and (cmd.gang.world_size, cmd.gang.first_rank, cmd.gang.hosts) == (2, 0, ("n1",))


def _whole(node: str, index: int) -> Slot:
    return Slot(gpu_id=f"{node}/{index}", node=node, model="A100-40GB", profile="gpu", start=0, size=8, compute=7,
                action="create")


def test_a_gang_across_nodes_becomes_one_command_per_member_node_with_its_ranks() -> None:
    gpu = GpuView.build(id="a/0", node="a", index=0, model="A100-40GB", mig=False)
    slots = (*(_whole("a", i) for i in range(4)), *(_whole("b", i) for i in (1, 2)), _whole("c", 7))
    cmds = place_commands(_placed(gpu, *slots, attempt=3), GEO, 5.0, master_addr="10.0.0.1")
    assert isinstance(cmds, list)
    assert [(c.node, c.cmd_id, c.id) for c in cmds] == [
        ("a", "place:j1:3/0", "place:j1:3/0"), ("b", "place:j1:3/1", "place:j1:3/1"),
        ("c", "place:j1:3/2", "place:j1:3/2")]
    assert [[s.gpu_index for s in c.plain] for c in cmds] == [[0, 1, 2, 3], [1, 2], [7]]
    assert [c.instance_id for c in cmds] == ["a/0:gpu@0:j1", "b/1:gpu@0:j1", "c/7:gpu@0:j1"]
    gangs = [c.gang for c in cmds]
    assert all(g is not None for g in gangs)
    assert [(g.first_rank, g.node_rank) for g in gangs if g] == [(0, 0), (4, 1), (6, 2)]
    assert {(g.world_size, g.hosts, g.master_addr, g.master_port, g.launch) for g in gangs if g} == {
        (7, ("a", "b", "c"), "10.0.0.1", gang_port("j1"), "per-gpu")}


def test_a_gang_whose_first_node_declared_no_address_meets_at_that_node_name() -> None:
    gpu = GpuView.build(id="a/0", node="a", index=0, model="A100-40GB", mig=False)
    cmds = place_commands(_placed(gpu, _whole("a", 0), _whole("b", 0)), GEO, 5.0)
    assert isinstance(cmds, list) and {c.gang.master_addr for c in cmds if c.gang} == {"a"}


def test_a_preempted_gang_is_stopped_on_its_nodes_that_no_place_command_reaches() -> None:
    gpu = GpuView.build(id="a/0", node="a", index=0, model="A100-40GB", mig=False)
    p = _placed(gpu, _whole("a", 0), _whole("a", 1), preempted=("victim",))
    victim = ("victim", ("a/0", "b/2", "b/3", "c/0"), ("a/0:gpu@0:victim", "b/2:gpu@0:victim", "b/3:gpu@0:victim",
                                                      "c/0:gpu@0:victim"))
    stops = victim_stops(p, [victim], 9.0)
    assert [(s.kind, s.node, s.job_id, s.gpu_index, s.src_instance_id) for s in stops] == [
        ("stop", "b", "victim", 2, "b/2:gpu@0:victim"), ("stop", "c", "victim", 0, "c/0:gpu@0:victim")]
    assert len({s.cmd_id for s in stops}) == 2  # the command stream dedupes by id: each node's stop its own


def test_a_gang_on_mig_gpus_plans_each_member_from_its_own_gpu() -> None:
    a0 = GpuView.build(id="a/0", node="a", index=0, model="A100-40GB", instances=(
        InstanceView(id="a/0:3g.20gb@4:old", profile="3g.20gb", start=4, size=4, compute=3),))
    a1 = GpuView.build(id="a/1", node="a", index=1, model="A100-40GB")
    b0 = GpuView.build(id="b/0", node="b", index=0, model="A100-40GB")
    slots = tuple(Slot(gpu_id=g.id, node=g.node, model="A100-40GB", profile="7g.40gb", start=0, size=8, compute=7,
                       action="create", destroy=tuple(i.id for i in g.instances)) for g in (a0, a1, b0))
    cmds = place_commands(_placed(a0, *slots, attempt=1), GEO, 5.0, "10.0.0.9",
                          {g.id: g for g in (a0, a1, b0)})
    assert isinstance(cmds, list) and [c.cmd_id for c in cmds] == ["place:j1:1/0", "place:j1:1/1"]
    first, second = cmds
    assert [(m.gpu_index, m.instance_id) for m in first.mig_members] == [
        (0, "a/0:7g.40gb@0:j1"), (1, "a/1:7g.40gb@0:j1")]
    assert [(op.kind, op.gpu_id) for op in first.ops] == [
        ("destroy_ci", "a/0"), ("destroy_gi", "a/0"), ("create_gi", "a/0"), ("create_ci", "a/0"),
        ("create_gi", "a/1"), ("create_ci", "a/1")]
    assert second.node == "b" and second.gang is not None and second.gang.first_rank == 2
    missing = place_commands(_placed(a0, *slots), GEO, 5.0, "", {a0.id: a0})
    assert isinstance(missing, PlanConflict) and missing.gpu_id == "a/1"
