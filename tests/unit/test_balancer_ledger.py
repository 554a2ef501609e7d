"""The balancer's tenancy ledger: usage rebuilt from the mirror, charged and uncharged exactly once, hot
reload that keeps the previous configuration on an invalid edit."""

from __future__ import annotations

import os
from pathlib import Path

from services.balancer.tenancy import TenantLedger
from shared.mig.geometry import default_geometry
from shared.policy.snapshot import GpuView, InstanceView, SnapshotBuilder

GEO = default_geometry()
FILE = """
[tenants.team-a]
quota = { compute_slices = 4 }
"""


def snap(*jobs: tuple[str, str, int]):  # type: ignore[no-untyped-def]
    """(job, tenant, start) of 1g.5gb instances on one A100-40GB."""
    insts = [
        InstanceView(id=f"i{s}", profile="1g.5gb", start=s, size=1, compute=1, job_id=j, tenant=t)
        for j, t, s in jobs
    ]
    b = SnapshotBuilder(GEO)
    b.put(GpuView.build(id="n1/0", node="n1", index=0, model="A100-40GB", instances=insts))
    return b.snapshot()


def ledger(tmp_path: Path, text: str = FILE) -> TenantLedger:
    path = tmp_path / "t.toml"
    path.write_text(text)
    return TenantLedger(str(path), 0, poll_s=0.0, geometry=GEO)


def test_usage_is_rebuilt_from_the_running_instances_of_the_mirror(tmp_path: Path) -> None:
    led = ledger(tmp_path)
    led.rebuild([snap(("a1", "team-a", 0), ("a2", "team-a", 1), ("b1", "team-b", 2))])
    assert led.book.used("team-a")["compute_slices"] == 2
    assert led.book.used("team-b")["compute_slices"] == 1


def test_a_charge_is_given_back_once_however_often_the_exit_is_seen(tmp_path: Path) -> None:
    led = ledger(tmp_path)
    led.charge("j1", "team-a", {"n1/0": {"compute_slices": 3.0}})
    assert led.uncharge("j1") is True
    assert led.uncharge("j1") is False
    assert led.book.used("team-a").amount("compute_slices") == 0


def test_a_reloaded_gpu_rederives_the_charges_of_its_jobs(tmp_path: Path) -> None:
    led = ledger(tmp_path)
    led.rebuild([snap(("a1", "team-a", 0), ("a2", "team-a", 1))])
    led.reloaded(snap(("a2", "team-a", 1)), ["n1/0"])  # a1 ended elsewhere in the meantime
    assert set(led.charges) == {"a2"}
    assert led.book.used("team-a")["compute_slices"] == 1


def test_an_invalid_edit_is_ignored_and_a_valid_one_applies_with_usage_kept(tmp_path: Path) -> None:
    led = ledger(tmp_path)
    led.charge("j1", "team-a", {"n1/0": {"compute_slices": 3.0}})
    path = tmp_path / "t.toml"
    path.write_text(FILE + "\n[tenants.bad]\nquota = { compute_slices = -1 }\n")
    os.utime(path, ns=(1, 1))
    r = led.poll()
    assert r is not None and not r.ok
    assert led.tenancy.quotas.tenant("team-a").nominal("compute_slices") == 4  # type: ignore[union-attr]
    path.write_text(FILE.replace("= 4", "= 2"))
    os.utime(path, ns=(2, 2))
    r = led.poll()
    assert r is not None and r.ok
    assert led.book.policy.tenant("team-a").nominal("compute_slices") == 2  # type: ignore[union-attr]
    assert led.book.used("team-a")["compute_slices"] == 3


def test_without_a_file_the_ledger_is_inactive(tmp_path: Path) -> None:
    led = TenantLedger("", 1)
    assert not led.active and led.poll() is None


def _gang_snap(*gpus: str):  # type: ignore[no-untyped-def]
    """Job g1 (team-a) holding whole non-MIG A100s ``gpus`` of node n1 (GPUs n1/0 and n1/1 exist)."""
    b = SnapshotBuilder(GEO)
    for n in range(2):
        gid = f"n1/{n}"
        insts = (
            [InstanceView(id=f"{gid}:gpu@0:g1", profile="gpu", start=0, size=8, compute=7, job_id="g1",
                          tenant="team-a")]
            if gid in gpus
            else []
        )
        b.put(GpuView.build(id=gid, node="n1", index=n, model="A100-40GB", mig=False, instances=insts))
    return b.snapshot()


def test_a_gang_is_charged_per_gpu_so_reloading_one_gpu_keeps_the_other_charge(tmp_path: Path) -> None:
    led = ledger(tmp_path)
    led.rebuild([_gang_snap("n1/0", "n1/1")])
    assert led.book.used("team-a")["nvidia.com/gpu"] == 2
    assert led.book.used("team-a")["compute_slices"] == 14
    led.reloaded(_gang_snap("n1/0", "n1/1"), ["n1/1"])  # re-derived, not doubled
    assert led.book.used("team-a")["nvidia.com/gpu"] == 2
    assert led.uncharge("g1") is True
    assert led.book.used("team-a").amount("nvidia.com/gpu") == 0


def test_a_committed_gang_charge_is_given_back_whole(tmp_path: Path) -> None:
    led = ledger(tmp_path)
    per_gpu = {g: {"nvidia.com/gpu": 1.0, "compute_slices": 7.0} for g in ("n1/0", "n1/1")}
    assert led.charge("g1", "team-a", per_gpu) is True
    assert led.charge("g1", "team-a", per_gpu) is False
    assert led.book.used("team-a")["nvidia.com/gpu"] == 2
    led.uncharge("g1")
    assert led.book.used("team-a").amount("compute_slices") == 0


def test_a_shards_limits_take_off_what_the_tenant_uses_in_other_shards(tmp_path: Path) -> None:
    led = ledger(tmp_path)  # team-a: 4 compute slices
    led.shard_of = lambda gpu_id: 0 if gpu_id.startswith("n1/") else 1
    led.charge("here", "team-a", {"n1/0": {"compute_slices": 1.0}})
    led.charge("there", "team-a", {"n2/0": {"compute_slices": 2.0}})
    (lim,) = led.limits("team-a", {"compute_slices": 1.0}, 0)
    assert (lim.resource, lim.cap, lim.nominal) == ("compute_slices", 2.0, 2.0)  # 4 less the 2 used in shard 1
    led.uncharge("there")
    (lim,) = led.limits("team-a", {"compute_slices": 1.0}, 0)
    assert lim.cap == 4.0
    led.reloaded(snap(), ["n1/0"])  # "here" ended on shard 0: its part is gone, nothing elsewhere
    assert led.in_shard[0]["team-a"] == {} and led.limits("team-a", {"compute_slices": 1.0}, 1)[0].cap == 4.0
    assert TenantLedger("", 0).limits("team-a", {"compute_slices": 1.0}, 0) == ()
