"""Gangs within one topology domain (``shared.policy.placement.topology``): the domains of the nodes' labels, and the
choice among the placements each domain alone allows."""

from __future__ import annotations

import pytest

from shared.policy.placement.decision import CannotPlace, Placement, Slot
from shared.policy.placement.topology import domains, place_within

pytestmark = pytest.mark.unit
LABELS = {"a": {"block": "b1", "rack": "r1"}, "b": {"block": "b1", "rack": "r2"}, "c": {"block": "b2"}, "d": {}}


def _placed(*nodes: str) -> Placement:
    slots = tuple(Slot(gpu_id=f"{n}/0", node=n, model="A100-40GB", profile="gpu", start=0, size=8, compute=7,
                       action="create") for n in nodes)
    return Placement(job_id="g", policy="test", slots=slots, tier="lazy", frag_before=0.0, frag_after=0.0)


def test_a_domain_is_the_nodes_sharing_a_label_value_and_unlabelled_nodes_are_in_none() -> None:
    assert domains(LABELS, "block", "abcd") == {"b1": {"a", "b"}, "b2": {"c"}}
    assert domains(LABELS, "rack", "abcd") == {"r1": {"a"}, "r2": {"b"}}


def test_the_domain_needing_the_fewest_nodes_wins_then_the_tightest() -> None:
    answers = {"b1": _placed("a", "b"), "b2": _placed("c"), "b3": _placed("e")}
    doms = {"b1": {"a", "b"}, "b2": {"c"}, "b3": {"e"}}
    tried: list[set[str] | None] = []

    def place(nodes: set[str] | None) -> Placement | CannotPlace:
        tried.append(nodes)
        return next(answers[d] for d, ns in doms.items() if ns == nodes)

    dec = place_within("g", "block", True, doms, {"b1": 9, "b2": 6, "b3": 4}, place)
    assert isinstance(dec, Placement) and dec.slots[0].node == "e"  # one node each in b2 and b3: b3 is tighter
    assert dec.reasons[0].startswith("within block b3") and None not in tried


def test_a_requirement_waits_when_no_domain_holds_the_gang_and_a_preference_spans_domains() -> None:
    doms = {"b1": {"a", "b"}, "b2": {"c"}}
    no = CannotPlace(job_id="g", policy="test", reasons=("no room",))

    def place(nodes: set[str] | None) -> Placement | CannotPlace:
        return _placed("a", "c") if nodes is None else no

    waits = place_within("g", "block", True, doms, {}, place)
    assert isinstance(waits, CannotPlace) and "no block holds the gang now" in waits.reasons[0]
    spans = place_within("g", "block", False, doms, {}, place)
    assert isinstance(spans, Placement) and {s.node for s in spans.slots} == {"a", "c"}


def test_a_requirement_with_no_labelled_node_says_so() -> None:
    dec = place_within("g", "rack", True, {}, {}, lambda nodes: _placed("a"))
    assert isinstance(dec, CannotPlace) and "no node with a rack label" in dec.reasons[0]


def _blocks_snapshot() -> tuple[object, tuple[tuple[str, tuple[str, ...]], ...]]:
    from shared.mig.geometry import default_geometry
    from shared.policy.snapshot import snapshot_of
    from shared.sim.cluster import parse_cluster
    from shared.sim.cluster_spec import gpu_views

    spec = parse_cluster(["A100-40GB:16"], default_geometry(), gpus_per_node=2, block_nodes=2)  # 4 GPUs a block
    return snapshot_of(default_geometry(), gpu_views(spec)), spec.blocks()


@pytest.mark.parametrize("name", ["migsched", "first-fit", "fgd", "paper"])
def test_every_policy_keeps_a_gang_within_one_block_when_asked(name: str) -> None:
    from shared.policy.placement.decision import JobRequest
    from shared.policy.placement.registry import get_policy
    from shared.policy.request import Demand

    snap, blocks = _blocks_snapshot()
    _, policy = get_policy(name)
    node_block = {n: b for b, ns in blocks for n in ns}

    def ask(gpus: int, required: bool) -> object:
        return policy(snap, JobRequest(job_id="g", demand=Demand(kind="gpus", gpus=gpus), domains=blocks,  # type: ignore[arg-type]
                                       domain_level="block", domain_required=required))

    four = ask(4, True)
    assert isinstance(four, Placement) and len({node_block[s.node] for s in four.slots}) == 1
    six = ask(6, True)  # no block has six GPUs
    assert isinstance(six, CannotPlace) and "no block holds the gang now" in six.reasons[0]
    spread = ask(6, False)
    assert isinstance(spread, Placement) and len(spread.slots) == 6
    assert len({node_block[s.node] for s in spread.slots}) == 2


def test_the_simulator_refuses_on_arrival_a_gang_that_requires_a_block_none_has_and_runs_it_when_preferred() -> None:
    import math

    from shared.mig.geometry import default_geometry
    from shared.policy.placement.registry import get_policy
    from shared.policy.request import Demand
    from shared.sim.cluster import parse_cluster
    from shared.sim.config import InterferenceParams, SimConfig
    from shared.sim.engine import Simulator
    from shared.sim.jobs import SimJob, Workload
    from shared.sim.workloads.spec import within_blocks

    geo = default_geometry()
    jobs = (SimJob(id="six", arrival=1.0, duration=60.0, demand=Demand(kind="gpus", gpus=6), shape="7g",
                   patience=600.0),
            SimJob(id="four", arrival=2.0, duration=60.0, demand=Demand(kind="gpus", gpus=4), shape="7g"))
    spec, policy = get_policy("migsched")
    cfg = SimConfig(interference=InterferenceParams(beta=0.0), patience_s=math.inf, check_invariants=True)
    cluster = parse_cluster(["A100-40GB:16"], geo, gpus_per_node=2, block_nodes=2)
    for required, rejected in ((True, 1), (False, 0)):
        wl = within_blocks(Workload(name="w", jobs=jobs), required=required)
        k = Simulator(wl, cluster, spec, policy, cfg).run().kpis
        assert (k.rejected, k.completed) == (rejected, 2 - rejected)
        assert k.refused == ({"needs 6 GPUs within one block; the largest block has 4": 1} if required else {})


def test_a_hold_for_a_gang_kept_within_a_block_is_made_within_one() -> None:
    from shared.policy.reservation import plan_within

    snap, blocks = _blocks_snapshot()
    node_block = {n: b for b, ns in blocks for n in ns}
    taken = {g.id for g in snap.gpus if node_block[g.node] == "b0"}  # b0 is held for another job
    four = plan_within(snap, "g", 4, 0.0, 3600.0, blocks, True, taken)
    assert four is not None and len({node_block[g.rpartition("/")[0]] for g in four.gpus}) == 1
    assert not set(four.gpus) & taken
    assert plan_within(snap, "g", 6, 0.0, 3600.0, blocks, True) is None  # no block has six
    anywhere = plan_within(snap, "g", 6, 0.0, 3600.0, blocks, False)
    assert anywhere is not None and len(anywhere.gpus) == 6
