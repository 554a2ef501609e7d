"""What ``migsched status`` draws and prints for machines, from stored GPUs (no Redis needed)."""

from __future__ import annotations

import json

import msgspec
import pytest
from rich.console import Console

from migsched.clusterview import ClusterView, as_json, gpu_row, render
from shared.mig.geometry import default_geometry
from shared.state import StoredGpu, StoredInstance

pytestmark = pytest.mark.unit
GEO = default_geometry()


def gpu() -> StoredGpu:
    return StoredGpu(
        id="n1/0",
        node="n1",
        index=0,
        model="A100-40GB",
        instances=[
            StoredInstance(
                id="n1/0:3g.20gb@4:job-a",
                profile="3g.20gb",
                start=4,
                size=4,
                compute=3,
                state="busy",
                job="job-a",
            ),
            StoredInstance(id="n1/0:1g.5gb@0:x", profile="1g.5gb", start=0, size=1, compute=1, state="idle"),
        ],
    )


def test_a_gpu_row_shows_who_holds_each_slice_its_load_and_fragcost() -> None:
    row = gpu_row(gpu(), GEO)
    assert row.load == pytest.approx(3 / 7, abs=1e-4)
    assert 0.0 < row.frag_cost <= 1.0
    assert "job-a" in row.slices and "idle" in row.slices
    assert row.slices.count("[") == 5  # 1g idle, three free slices, the 3g holding four


def test_status_json_gives_every_instance_and_every_job_state() -> None:
    view = ClusterView(
        at=0.0,
        namespace="",
        nodes={"n1": "up"},
        gpus=(gpu_row(gpu(), GEO),),
        jobs={"job-a": "running", "job-b": "pending"},
        counts={"running": 1, "pending": 1},
    )
    doc = json.loads(as_json(view))
    assert doc["jobs"] == {"job-a": "running", "job-b": "pending"}
    insts = doc["gpus"][0]["instances"]
    assert {(i["profile"], i["start"], i["state"], i["job_id"]) for i in insts} == {
        ("3g.20gb", 4, "busy", "job-a"),
        ("1g.5gb", 0, "idle", None),
    }


def test_the_rendered_view_lists_gpus_and_jobs_by_state() -> None:
    view = ClusterView(
        at=0.0,
        namespace="",
        nodes={"n1": "up"},
        gpus=(gpu_row(gpu(), GEO),),
        jobs={"job-a": "running"},
        counts={"running": 1, "finished": 0},
    )
    console = Console(record=True, width=160)
    console.print(render(view))
    text = console.export_text()
    assert "n1/0 A100-40GB" in text and "job-a" in text and "running 1" in text


def test_status_lists_the_reservations_with_their_gpus_and_expected_start() -> None:
    from shared.policy.reservation import Reservation

    hold = Reservation(job_id="big", gpus=("n1/0",), node="n1", start=1060.0, reason="expected free in 60 s")
    view = ClusterView(at=1000.0, namespace="t", nodes={"n1": "up"}, gpus=(gpu_row(gpu(), GEO),),
                       jobs={"big": "pending"}, counts={"pending": 1}, reasons={"big": "reserved: ..."},
                       holds=(hold,))
    console = Console(record=True, width=120)
    console.print(render(view))
    text = console.export_text()
    assert "reservations (1)" in text and "n1/0" in text and "in 60 s" in text and "expected free in 60 s" in text
    assert json.loads(as_json(view))["holds"][0]["job_id"] == "big"


def _busy_view() -> ClusterView:
    from migsched.clusterview import JobRow

    why = ("cannot place: 4 GPU(s): no free 7g.40gb placement; 2 GPU(s): not in MIG mode or unhealthy; "
           "quota: team-a would use 9 nvidia.com/mig-7g.40gb; its quota is 8 and cohort research lends none")
    gpus = tuple(gpu_row(msgspec.structs.replace(gpu(), id=f"node-with-a-long-name-{k}/0"), GEO) for k in range(3))
    return ClusterView(
        at=10_000.0, namespace="", nodes={"n1": "up"}, gpus=gpus,
        jobs={"job-a": "running", "job-b": "pending", "job-c": "rejected"},
        counts={"running": 1, "pending": 1, "rejected": 1},
        reasons={"job-b": why},
        rows={"job-a": JobRow(tenant="team-a", demand="3g.20gb", since=9_000.0),
              "job-b": JobRow(tenant="team-b", demand="7g", since=9_990.0),
              "job-c": JobRow(tenant="team-b", demand="2xGPU", since=100.0)},
    )


@pytest.mark.parametrize("width", [80, 120])
def test_status_fits_the_terminal_by_wrapping_and_cuts_nothing(width: int) -> None:
    view = _busy_view()
    console = Console(record=True, width=width)
    console.print(render(view, width=width))
    text = console.export_text()
    assert all(len(line) <= width for line in text.splitlines())
    assert "…" not in text  # nothing truncated
    # the reason's wrapped lines, read down its column, give it whole (the row's other cells are blank there)
    squeezed = "".join(c for c in text if not c.isspace() and c not in "│┃")
    assert "".join(view.reasons["job-b"].split()) in squeezed
    for col in ("tenant", "demand", "age"):
        assert col in text
    assert "team-a" in text and "3g.20gb" in text and "17m" in text  # job-a's age: 1,000 s


def test_status_filters_jobs_by_tenant_and_by_state() -> None:
    view = _busy_view()

    def shown(**kw: object) -> str:
        console = Console(record=True, width=200)
        console.print(render(view, **kw))  # type: ignore[arg-type]
        return console.export_text().split("jobs (")[-1]

    assert "job-a" in shown() and "job-b" in shown() and "job-c" not in shown()  # the active ones by default
    assert "job-a" not in shown(tenants=["team-b"]) and "job-b" in shown(tenants=["team-b"])
    only = shown(states=["rejected"])
    assert "job-c" in only and "job-a" not in only and "2xGPU" in only


def _plain(replicas: int, *jobs: str) -> StoredGpu:
    """A GPU not in MIG mode: a whole-GPU job (``replicas`` 0) or time-sliced shares, one per job."""
    if replicas:
        insts = [StoredInstance(id=f"p/0:shared@{k}:{j}", profile="shared", start=k, size=0, compute=0, state="busy",
                                job=j) for k, j in enumerate(jobs)]
    else:
        insts = [StoredInstance(id=f"p/0:gpu@0:{j}", profile="gpu", start=0, size=8, compute=7, state="busy", job=j)
                 for j in jobs]
    return StoredGpu(id="p/0", node="p", index=0, model="A100-40GB", mig=False, replicas=replicas, instances=insts)


def test_a_gpu_not_in_mig_mode_is_drawn_as_one_box_with_its_job_or_its_shares() -> None:
    whole, shares, free = gpu_row(_plain(0, "gang-m3"), GEO), gpu_row(_plain(4, "s1", "s2"), GEO), gpu_row(
        _plain(0), GEO)
    assert whole.slices.count("[") == 1 and "gang-m3" in whole.slices and whole.load == 1.0
    assert shares.slices.count("[") == 1 and "s1, s2" in shares.slices and "2/4 shares" in shares.slices
    assert shares.load == 0.5
    assert free.slices.count("[") == 1 and "not MIG" in free.slices and free.load == 0.0
    # a time-sliced GPU with no share in use takes a whole-GPU job: it is the whole GPU's
    sliced = msgspec.structs.replace(_plain(0, "w"), replicas=4)
    assert gpu_row(sliced, GEO).load == 1.0 and "shares" not in gpu_row(sliced, GEO).slices
    view = ClusterView(at=0.0, namespace="", nodes={"p": "up"}, gpus=(whole, shares, free),
                       jobs={"gang-m3": "running", "s1": "running", "s2": "running"}, counts={"running": 3})
    for width in (80, 160):
        console = Console(record=True, width=width)
        console.print(render(view, width=width))
        assert "p/0 A100-40GB" in console.export_text()
    assert json.loads(as_json(view))["gpus"][1]["instances"][1]["job_id"] == "s2"


def test_the_compact_view_draws_a_gpu_not_in_mig_mode_as_one_box() -> None:
    from migsched.clusterview import compact_slices

    assert compact_slices(gpu_row(_plain(0, "g"), GEO)).plain.count("[") == 1
    shares = compact_slices(gpu_row(_plain(4, "s1", "s2"), GEO)).plain
    assert shares.count("[") == 1 and "2/4" in shares


def test_a_hold_lists_its_gpus_by_node_as_runs_of_indices() -> None:
    from migsched.clusterview import held_gpus

    gpus = [f"n1/{i}" for i in (7, 0, 1, 2, 3, 4, 5, 6)] + ["n2/0", "n2/1", "n2/3", "odd-id"]
    assert held_gpus(gpus) == "n1/0-7, n2/0-1,3, odd-id"
    assert held_gpus(["n1/4"]) == "n1/4"


def test_status_lists_each_topology_block_with_its_nodes_when_nodes_declare_them() -> None:
    base = {"at": 0.0, "namespace": "", "gpus": (gpu_row(gpu(), GEO),), "jobs": {}, "counts": {}}
    labelled = ClusterView(nodes={"n1": "up", "n2": "up", "n3": "up"}, blocks={"n1": "b0", "n3": "b0", "n2": "b1"},
                           **base)  # type: ignore[arg-type]
    console = Console(record=True, width=160)
    console.print(render(labelled))
    assert "blocks: b0 (n1, n3); b1 (n2)" in console.export_text()
    console = Console(record=True, width=160)
    console.print(render(ClusterView(nodes={"n1": "up"}, **base)))  # type: ignore[arg-type]
    assert "blocks:" not in console.export_text()


def test_a_large_cluster_is_listed_one_row_per_node_with_a_mark_per_gpu() -> None:
    from migsched.nodeview import node_table

    def inst(profile: str, start: int, size: int, compute: int, job: str | None) -> StoredInstance:
        return StoredInstance(id=f"{profile}@{start}", profile=profile, start=start, size=size, compute=compute,
                              state="busy" if job else "idle", job=job)

    mig = [StoredGpu(id="a/0", node="a", index=0, model="A100-40GB", instances=[inst("7g.40gb", 0, 8, 7, "big")]),
           StoredGpu(id="a/1", node="a", index=1, model="A100-40GB", instances=[inst("3g.20gb", 4, 4, 3, "half")]),
           StoredGpu(id="a/2", node="a", index=2, model="A100-40GB", instances=[inst("1g.5gb", 0, 1, 1, None)]),
           StoredGpu(id="a/3", node="a", index=3, model="A100-40GB", healthy=False)]
    plain = [StoredGpu(id=f"b/{i}", node="b", index=i, model="A100-40GB", mig=False,
                       instances=[inst("gpu", 0, 8, 7, "whole")] if i == 0 else []) for i in range(2)]
    view = ClusterView(at=0.0, namespace="", nodes={"a": "up", "b": "lost"}, blocks={"a": "b0"},
                       gpus=tuple(gpu_row(g, GEO) for g in mig + plain), jobs={}, counts={})
    console = Console(record=True, width=160)
    console.print(render(view, machines=node_table(view, "migsched cluster")))
    text = console.export_text()
    assert "6 GPUs on 2 nodes" in text and "a/0 A100-40GB" not in text  # no row per GPU
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in text.splitlines() if line.startswith("│")}
    assert rows["a"] == ["b0", "4 MIG", "█▒·x", "1", "0.36"]  # an idle instance leaves its GPU empty
    assert rows["b (lost)"] == ["-", "2 plain", "█·", "1", "0.50"]
