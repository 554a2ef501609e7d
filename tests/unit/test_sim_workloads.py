"""Trace loaders and generators: the openb mapping, the DLRM background, the generic CSV mapping,
synthetic load, and cluster specs -- with clear errors for bad input."""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
import numpy as np
import pytest

from shared.mig.geometry import default_geometry
from shared.sim.cluster import load_nodes_file, parse_cluster
from shared.sim.errors import ClusterSpecError, WorkloadError
from shared.sim.workloads.csv import load_csv, parse_mapping
from shared.sim.workloads.dlrm import load_dlrm
from shared.sim.workloads.openb import load_openb
from shared.sim.workloads.spec import WorkloadSpec, build
from shared.sim.workloads.synthetic import synthetic
from tests.traces import needs_trace

pytestmark = pytest.mark.unit

GEO = default_geometry()
A100 = GEO.model("A100-40GB")
OPENB_HEAD = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
)


def _openb(tmp_path: Path) -> Path:
    rows = [
        "p0,1,1,1,1000,,LS,Running,0,5000,0",  # alive before the window opens at 1000
        "p1,1,1,1,120,,BE,Running,1100,1600,1200",  # 1g, runs 400 s
        "p2,1,1,1,250,,Burstable,Running,1200,2000,1200",
        "p3,1,1,1,460,,Guaranteed,Running,1300,2300,1300",  # 0.46 > 3/7 -> 4g
        "p4,1,1,2,1000,,BE,Running,1400,3400,1400",  # 2 whole GPUs
        "p5,1,1,0,0,,BE,Running,1500,1600,1500",  # CPU only: dropped
        "p6,1,1,1,500,,LS,Pending,1600,1000,",  # never scheduled: dropped
    ]
    p = tmp_path / "openb_pod_list_tiny.csv"
    p.write_text(OPENB_HEAD + "\n".join(rows) + "\n")
    return p


def test_openb_pods_map_gpu_milli_to_the_smallest_covering_profile_and_gangs_to_whole_gpus(
    tmp_path: Path,
) -> None:
    wl = load_openb(str(_openb(tmp_path)), A100)
    by = {j.id: j for j in wl.jobs}
    assert [by[i].shape for i in ("p0", "p1", "p2", "p3")] == ["7g", "1g", "2g", "4g"]
    assert by["p4"].demand.kind == "gpus" and by["p4"].demand.gpus == 2
    assert by["p1"].duration == 400 and by["p1"].arrival == 1100
    assert (by["p1"].priority, by["p0"].priority, by["p2"].priority) == (0, 2, 1)
    assert by["p0"].latency_sensitive and not by["p3"].latency_sensitive
    assert wl.dropped == {"cpu_only": 1, "never_scheduled": 1}


def test_openb_pods_alive_when_the_window_opens_arrive_then_with_the_run_time_they_had_left(
    tmp_path: Path,
) -> None:
    wl = load_openb(str(_openb(tmp_path)), A100)
    p0 = next(j for j in wl.jobs if j.id == "p0")
    assert p0.arrival == 1000 and p0.duration == 4000  # the window opens at the earliest deletion time


def test_openb_time_scale_compresses_arrival_gaps_but_not_run_times(tmp_path: Path) -> None:
    wl = load_openb(str(_openb(tmp_path)), A100, time_scale=2.0)
    p1 = next(j for j in wl.jobs if j.id == "p1")
    assert p1.arrival == 1050 and p1.duration == 400


def test_jittered_arrivals_move_each_job_by_at_most_the_jitter_and_keep_every_job_and_run_time(
    tmp_path: Path,
) -> None:
    wl = load_openb(str(_openb(tmp_path)), A100)
    a, b, c = wl.jittered(300.0, 1), wl.jittered(300.0, 1), wl.jittered(300.0, 2)
    assert a == b and a != c  # a seed gives one replay
    was = {j.id: j for j in wl.jobs}
    t0 = wl.jobs[0].arrival
    assert sorted(j.id for j in a.jobs) == sorted(was)
    assert [j.arrival for j in a.jobs] == sorted(j.arrival for j in a.jobs)
    for j in a.jobs:
        assert abs(j.arrival - was[j.id].arrival) <= 300.0 and j.arrival >= t0
        assert msgspec.structs.replace(j, arrival=was[j.id].arrival) == was[j.id]
    assert any(j.arrival != was[j.id].arrival for j in a.jobs)
    assert wl.jittered(0.0, 1) is wl


def test_a_workload_spec_jitters_the_trace_it_builds_by_its_seed(tmp_path: Path) -> None:
    cluster = parse_cluster(["A100-40GB:8"], GEO)
    path = str(_openb(tmp_path))
    plain = build(WorkloadSpec(name=f"openb:{path}"), cluster, GEO)
    moved = build(WorkloadSpec(name=f"openb:{path}", seed=3, jitter_s=120.0), cluster, GEO)
    assert moved == plain.jittered(120.0, 3) and moved != plain


def test_an_openb_file_without_time_columns_is_refused_with_the_reason(tmp_path: Path) -> None:
    p = tmp_path / "openb_pod_list_multigpu20.csv"
    p.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,1000\n")
    with pytest.raises(WorkloadError, match="no time columns"):
        load_openb(str(p), A100)


def test_an_unknown_openb_variant_names_where_it_looked() -> None:
    with pytest.raises(WorkloadError, match="MIGSCHED_TRACES_DIR"):
        load_openb("nosuchvariant", A100)


@needs_trace("openb", "openb_pod_list_default.csv")
def test_the_real_openb_default_trace_loads() -> None:
    wl = load_openb("default", A100)
    assert len(wl.jobs) > 6000 and wl.dropped["cpu_only"] == 1088


def test_an_itp_cluster_file_replays_its_jobs_as_full_gpus_and_gangs_across_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MIGSCHED_TRACES_DIR", str(tmp_path))
    (tmp_path / "microsoft-itp-2021").mkdir()
    (tmp_path / "microsoft-itp-2021" / "cluster02.csv").write_text(
        "job_id,submission_time,duration,num_gpu\nb,30,7200,64\na,10,600,1\nc,50,0,4\n")
    wl = build(WorkloadSpec(name="itp:02"), parse_cluster(["A100-40GB:64"], GEO), GEO)
    assert wl.name == "itp:cluster02" and wl.dropped == {"non_positive_duration": 1}
    assert [(j.id, j.arrival, j.duration, j.shape, j.gpus) for j in wl.jobs] == [
        ("a", 10.0, 600.0, "7g", 1), ("b", 30.0, 7200.0, "7g", 64),
    ]
    assert wl.jobs[1].demand.kind == "gpus" and {j.wclass for j in wl.jobs} == {"large-training"}
    with pytest.raises(WorkloadError, match="needs the cluster"):
        build(WorkloadSpec(name="itp"), parse_cluster(["A100-40GB:64"], GEO), GEO)


@needs_trace("itp", "cluster04.csv")
def test_the_real_itp_cluster04_trace_loads_with_its_gangs_across_nodes() -> None:
    wl = build(WorkloadSpec(name="itp:cluster04"), parse_cluster(["A100-40GB:560"], GEO), GEO)
    sizes = [j.gpus for j in wl.jobs]
    assert len(wl.jobs) > 15000 and max(sizes) == 64 and sum(n > 8 for n in sizes) > 400


def test_a_csv_trace_replays_through_a_column_mapping(tmp_path: Path) -> None:
    p = tmp_path / "jobs.csv"
    p.write_text("submit_ts,runtime,gpu,user,prio\n10,60,0.2,alice,high\n0,30,0.5,bob,1\n20,5,2,carol,0\n")
    wl = load_csv(p, "arrival=submit_ts,duration=runtime,gpu_fraction=gpu,tenant=user,priority=prio", A100)
    assert [(j.arrival, j.shape, j.tenant, j.priority) for j in wl.jobs] == [
        (0.0, "4g", "bob", 1),
        (10.0, "2g", "alice", 2),
        (20.0, "7g", "carol", 0),
    ]
    assert wl.jobs[2].demand.kind == "gpus" and wl.jobs[2].demand.gpus == 2


def test_a_csv_trace_takes_gangs_bigger_than_a_node_and_refuses_more_than_one_job_may_ask(tmp_path: Path) -> None:
    p = tmp_path / "jobs.csv"
    p.write_text("t,d,n\n0,60,16\n5,60,128\n")
    wl = load_csv(p, "arrival=t,duration=d,gpus=n", A100)
    assert [j.demand.gpus for j in wl.jobs] == [16, 128]
    p.write_text("t,d,n\n0,60,5000\n")
    with pytest.raises(WorkloadError, match="5000 is more than one job may ask for"):
        load_csv(p, "arrival=t,duration=d,gpus=n", A100)


def test_a_csv_trace_of_workers_makes_each_job_a_gang_of_its_workers_whole_gpus(tmp_path: Path) -> None:
    p = tmp_path / "jobs.csv"
    # the columns of a distributed-training trace: GPUs per worker, a worker count, HP or Spot jobs
    p.write_text("job,submit,dur,gpu_request,worker_num,job_type\n"
                 "a,0,60,8,16,Spot\nb,5,60,1,1,HP\nc,9,60,1,2,HP\n")
    wl = load_csv(p, "id=job,arrival=submit,duration=dur,gpus=gpu_request,workers=worker_num,priority=job_type",
                  A100)
    got = {j.id: (j.demand.kind, j.demand.gpus if j.demand.kind == "gpus" else j.shape, j.priority) for j in wl.jobs}
    assert got == {"a": ("gpus", 128, 0), "b": ("mig", "7g", 2), "c": ("gpus", 2, 2)}
    # a share of a GPU per worker: each worker takes a whole GPU, as a gang's members are whole GPUs
    p.write_text("t,d,f,w\n0,60,0.5,4\n")
    assert load_csv(p, "arrival=t,duration=d,gpu_fraction=f,workers=w", A100).jobs[0].demand.gpus == 4
    p.write_text("t,d,g,w\n0,60,0.5,4\n")
    with pytest.raises(WorkloadError, match=r"jobs.csv:2: gpus '0.5' per worker is not a positive integer"):
        load_csv(p, "arrival=t,duration=d,gpus=g,workers=w", A100)
    p.write_text("t,d,g,w\n0,60,8,1024\n")
    with pytest.raises(WorkloadError, match=r"jobs.csv:2: 1024 workers of 8 GPUs \(8192 GPUs\) is more than"):
        load_csv(p, "arrival=t,duration=d,gpus=g,workers=w", A100)
    p.write_text("t,d,g,w\n0,60,8,1.5\n")
    with pytest.raises(WorkloadError, match=r"jobs.csv:2: workers '1.5' is not a positive integer"):
        load_csv(p, "arrival=t,duration=d,gpus=g,workers=w", A100)


def test_a_csv_trace_can_give_gaps_profiles_and_millisecond_times(tmp_path: Path) -> None:
    p = tmp_path / "jobs.csv"
    p.write_text("gap,ms,prof\n1000,5000,3g.20gb\n500,2000,1g\n")
    wl = load_csv(p, "gap=gap,duration=ms,profile=prof,time_unit=ms", A100)
    assert [(j.arrival, j.duration, j.shape) for j in wl.jobs] == [(1.0, 5.0, "3g"), (1.5, 2.0, "1g")]


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ("duration=runtime,gpu_fraction=gpu", "arrival=COLUMN or gap=COLUMN"),
        ("arrival=a,gpu_fraction=gpu", "duration=COLUMN or end=COLUMN"),
        ("arrival=a,duration=d", "exactly one demand"),
        ("arrival=a,duration=d,gpus=g,profile=p", "exactly one demand"),
        ("arrival=a,duration=d,gpus=g,colour=c", "unknown"),
        ("arrival=a,duration", "not key=column"),
        ("arrival=a,duration=d,profile=p,workers=w", "whole GPUs, not MIG profiles"),
    ],
)
def test_a_bad_csv_mapping_is_refused_with_a_clear_message(mapping: str, message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        parse_mapping(mapping)


def test_a_csv_missing_a_mapped_column_names_it(tmp_path: Path) -> None:
    p = tmp_path / "jobs.csv"
    p.write_text("submit,runtime\n1,2\n")
    with pytest.raises(WorkloadError, match=r"lacks mapped column.*gpu"):
        load_csv(p, "arrival=submit,duration=runtime,gpu_fraction=gpu", A100)


def test_a_csv_row_with_a_bad_value_names_the_line(tmp_path: Path) -> None:
    p = tmp_path / "jobs.csv"
    p.write_text("a,d,g\n1,2,0.5\n1,x,0.5\n")
    with pytest.raises(WorkloadError, match=r"jobs.csv:3: duration 'x'"):
        load_csv(p, "arrival=a,duration=d,gpu_fraction=g", A100)


def test_dlrm_instances_are_whole_gpu_high_priority_latency_sensitive_background(tmp_path: Path) -> None:
    head = (
        "instance_sn,role,app_name,cpu_request,cpu_limit,gpu_request,gpu_limit,rdma_request,rdma_limit,"
        "memory_request,memory_limit,disk_request,disk_limit,max_instance_per_node,creation_time,"
        "scheduled_time,deletion_time\n"
    )
    rows = [
        "i0,HN,app_0,1,1,1,1,0,0,1,1,1,1,8,,,100",
        "i1,CN,app_0,1,1,0,0,0,0,1,1,1,1,8,,,",
        "i2,HN,app_1,1,1,1,1,0,0,1,1,1,1,8,50,60,",
    ]
    p = tmp_path / "dlrm.csv"
    p.write_text(head + "\n".join(rows) + "\n")
    wl = load_dlrm(random.Random(0), gpus=1e9, path=p, offset=1000.0)
    assert [(j.id, j.arrival, j.duration, j.shape, j.tenant) for j in wl.jobs] == [
        ("dlrm-i0", 1000.0, 100.0, "7g", "app_0"),
        ("dlrm-i2", 1050.0, 40.0, "7g", "app_1"),
    ]
    assert all(j.latency_sensitive and j.priority == 3 for j in wl.jobs)


def test_synthetic_arrivals_offer_about_the_requested_load() -> None:
    wl = synthetic(np.random.default_rng(0), jobs=20000, load=0.8, cluster_slices=700)
    span = wl.jobs[-1].arrival - wl.jobs[0].arrival
    asked = sum((7 * j.gpus if j.shape == "7g" else int(j.shape[0])) * j.duration for j in wl.jobs)
    assert asked / (span * 700) == pytest.approx(0.8, rel=0.15)
    assert {j.wclass for j in wl.jobs} == {"inference", "small-training", "large-training", "interactive"}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("A100-40GB", "MODEL:COUNT"),
        ("A100-40GB:x", "not an integer"),
        ("A100-40GB:0", "at least 1"),
        ("Z999:4", "unknown GPU model"),
    ],
)
def test_a_bad_cluster_spec_is_refused_with_a_clear_message(spec: str, message: str) -> None:
    with pytest.raises(ClusterSpecError, match=message):
        parse_cluster([spec], GEO)


def test_a_cluster_spec_fills_nodes_of_the_given_size() -> None:
    spec = parse_cluster(["A100-40GB:10", "H100-80GB:3"], GEO, gpus_per_node=4)
    assert [(n.model, n.gpus) for n in spec.nodes] == [
        ("A100-40GB", 4),
        ("A100-40GB", 4),
        ("A100-40GB", 2),
        ("H100-80GB", 3),
    ]


def test_a_nodes_file_gives_the_cluster_and_can_map_every_node_to_one_model(tmp_path: Path) -> None:
    p = tmp_path / "nodes.csv"
    p.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,2,P100\nn1,1,1,0,P100\nn2,1,1,8,G2\n")
    spec = load_nodes_file(p, GEO, model_override="A100-40GB")
    assert spec.gpu_count == 10 and len(spec.nodes) == 2
    with pytest.raises(ClusterSpecError, match="unknown GPU model 'P100'"):
        load_nodes_file(p, GEO)
