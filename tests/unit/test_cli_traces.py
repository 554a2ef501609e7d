"""``migsched traces`` and the loaders' errors tell a fresh clone where the public traces come from."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from migsched.cli import main
from shared.mig.geometry import default_geometry
from shared.sim.errors import WorkloadError
from shared.sim.workloads.catalog import ITP_SNAPSHOT, ITP_UPSTREAM, SNAPSHOT, UPSTREAM
from shared.sim.workloads.dlrm import load_dlrm
from shared.sim.workloads.itp import load_itp
from shared.sim.workloads.openb import load_openb

pytestmark = pytest.mark.unit


def _traces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MIGSCHED_TRACES_DIR", str(tmp_path))
    return tmp_path


def test_traces_lists_what_it_found_and_exits_non_zero_naming_the_source_of_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _traces(tmp_path, monkeypatch)
    (root / "alibaba-gpu-v2023-openb").mkdir()
    (root / "alibaba-gpu-v2023-openb" / "openb_pod_list_default.csv").write_text("name\n")
    r = CliRunner().invoke(main, ["traces", "--json"])
    assert r.exit_code == 1
    listing = {t["name"]: t for t in json.loads(r.stdout)["traces"]}
    assert listing["openb"]["found"] == ["openb_pod_list_default.csv"]
    assert listing["dlrm"]["found"] == []
    assert listing["dlrm"]["source"] == {
        "repository": UPSTREAM,
        "commit": SNAPSHOT,
        "path": "cluster-trace-gpu-v2025/disaggregated_DLRM_trace.csv",
    }
    assert listing["itp"]["source"] == {
        "repository": ITP_UPSTREAM, "commit": ITP_SNAPSHOT, "path": "data/raw-traces.tar.gz",
    }
    text = CliRunner().invoke(main, ["traces"]).stdout
    assert "dlrm: MISSING" in text and SNAPSHOT in text and str(root) in text
    assert "unpack data/raw-traces.tar.gz into $MIGSCHED_TRACES_DIR/microsoft-itp-2021/" in text


def test_traces_exits_zero_when_every_known_trace_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _traces(tmp_path, monkeypatch)
    for folder, name in (
        ("alibaba-gpu-v2023-openb", "openb_pod_list_gpushare60.csv"),
        ("alibaba-gpu-v2025-dlrm", "disaggregated_DLRM_trace.csv"),
        ("microsoft-itp-2021", "cluster04.csv"),
    ):
        (root / folder).mkdir()
        (root / folder / name).write_text("x\n")
    assert CliRunner().invoke(main, ["traces"]).exit_code == 0


def test_a_missing_trace_error_says_where_it_looked_and_where_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _traces(tmp_path, monkeypatch)
    a100 = default_geometry().model("A100-40GB")
    with pytest.raises(WorkloadError) as openb:
        load_openb("default", a100)
    with pytest.raises(WorkloadError) as dlrm:
        load_dlrm(random.Random(1), gpus=8)
    with pytest.raises(WorkloadError) as itp:
        load_itp("cluster04", a100)
    for err, upstream in ((openb, UPSTREAM), (dlrm, UPSTREAM), (itp, ITP_UPSTREAM)):
        message = str(err.value)
        assert str(tmp_path) in message and upstream in message and "migsched traces" in message
