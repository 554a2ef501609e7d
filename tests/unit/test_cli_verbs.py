"""The live-stack verbs of ``migsched`` without a stack: argument checking, schema output, dry runs, help."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from migsched.cli import main
from shared.client import MigschedClient
from shared.events import encode
from tests.traces import needs_trace

pytestmark = pytest.mark.unit


def run(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, list(args))
    return r.exit_code, r.output


def run_stdout(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, list(args))
    return r.exit_code, r.stdout


def test_schema_prints_a_json_schema_per_external_message() -> None:
    code, out = run("schema")
    assert code == 0
    schemas = json.loads(out)
    assert {"JobSubmit", "JobCancel", "JobExit", "Command", "NodeReport", "Heartbeat"} <= set(schemas)
    for s in schemas.values():
        jsonschema.Draft202012Validator.check_schema(s)


def test_a_submit_the_client_builds_validates_against_the_printed_schema() -> None:
    code, out = run("schema", "JobSubmit")
    assert code == 0
    schema = json.loads(out)
    msg = MigschedClient.job(job_id="j-1", profile="3g.20gb", tenant="team-a", priority=2, duration_s=60.0)
    jsonschema.validate(json.loads(encode(msg)), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**json.loads(encode(msg)), "priority": 5000}, schema)


def test_schema_of_an_unknown_message_is_a_usage_error() -> None:
    code, out = run("schema", "NoSuchMessage")
    assert code == 2 and "unknown message" in out


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--profile", "3g", "--gpus", "2"], "exactly one of"),
        (["--compute", "3"], "needs both"),
        (["--profile", "9g"], "unknown profile"),
        ([], "exactly one of"),
        (["--profile", "1g", "--env", "NCCL_DEBUG"], "--env expects NAME=VALUE, got 'NCCL_DEBUG'"),
        (["--profile", "1g", "--env", "1X=2"], "invalid job"),
        (["--profile", "1g", "--run-as", "Bad User"], "workload.run_as"),
    ],
)
def test_submit_rejects_a_malformed_request_before_connecting(args: list[str], why: str) -> None:
    code, out = run("submit", "--nats-url", "nats://127.0.0.1:1", *args)  # nothing listens on port 1
    assert code == 2 and why in out


def test_cancel_needs_at_least_one_job_id() -> None:
    code, out = run("cancel")
    assert code == 2 and "JOB_IDS" in out


def test_replay_dry_run_summarises_a_synthetic_workload_without_publishing() -> None:
    code, out = run_stdout(
        "replay",
        "synthetic",
        "--jobs",
        "50",
        "--speedup",
        "1000",
        "--dry-run",
        "--nats-url",
        "nats://127.0.0.1:1",
    )
    assert code == 0
    summary = json.loads(out.strip().splitlines()[0])
    assert summary["jobs"] == 50 and summary["skipped"] == {}
    assert summary["wall_s"] == pytest.approx(summary["span_s"] / 1000)


@needs_trace("openb", "openb_pod_list_default.csv")
def test_replay_dry_run_of_openb_keeps_every_job_and_mig_only_leaves_out_gangs_and_says_so() -> None:
    code, out = run_stdout("replay", "default", "--limit", "300", "--dry-run")
    assert code == 0
    summary = json.loads(out.strip().splitlines()[0])
    assert summary["workload"] == "openb:default" and summary["jobs"] == 300 and summary["skipped"] == {}
    code, out = run_stdout("replay", "default", "--limit", "300", "--dry-run", "--mig-only")
    assert code == 0
    mig = json.loads(out.strip().splitlines()[0])
    assert mig["skipped"]["gang (n whole GPUs)"] > 0 and mig["jobs"] + sum(mig["skipped"].values()) == 300
    code, out = run_stdout("replay", "default", "--limit", "300", "--dry-run", "--whole-as-gpus")
    whole = json.loads(out.strip().splitlines()[0])
    assert code == 0 and whole["jobs"] == 300 and whole["as_gpus"] > 0
    code, out = run_stdout("replay", "default", "--dry-run", "--whole-as-gpus", "--mig-only")
    assert code != 0 and not out.strip()  # refused before anything is read or published


@pytest.mark.parametrize("verb", ["up", "submit", "cancel", "status", "replay", "schema", "dlq", "traces", "describe"])
def test_every_live_stack_verb_has_help(verb: str) -> None:
    code, out = run(verb, "--help")
    assert code == 0 and "Usage:" in out


def test_schema_write_puts_one_file_per_message_as_the_repository_keeps_them(tmp_path: Path) -> None:
    code, out = run("schema", "--write", str(tmp_path / "out"))
    assert code == 0 and len(out.splitlines()) == len(list((tmp_path / "out").glob("*.json")))
    repo = Path(__file__).resolve().parents[2] / "schemas"
    for path in (tmp_path / "out").glob("*.json"):
        assert path.read_text() == (repo / path.name).read_text(), path.name


def test_schema_write_into_a_path_that_is_a_file_says_so_and_exits_non_zero(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("x")
    code, out = run("schema", "--write", str(tmp_path / "taken" / "sub"))
    assert code == 1 and "cannot write the schemas into" in out


def test_describe_lists_a_gang_across_nodes_node_by_node() -> None:
    from migsched.commands.describe import render
    from shared.state import JobRecord

    slots = (("a/0", "a/0:gpu@0:g"), ("a/1", "a/1:gpu@0:g"), ("b/3", "b/3:gpu@0:g"))
    rec = JobRecord(job_id="g", state="running", gpu="a/0", inst="a/0:gpu@0:g", node="a", slots=slots)
    text = render({"record": rec, "spec": None, "history": [], "holds": []}, 0.0)
    assert "holds on a: a/0 (gpu@0:g), a/1 (gpu@0:g)" in text and "holds on b: b/3 (gpu@0:g)" in text


def test_describe_says_where_an_ended_job_ran_not_that_it_still_holds_it() -> None:
    from migsched.commands.describe import render
    from shared.state import JobRecord

    rec = JobRecord(job_id="j", state="failed", gpu="n1/0", inst="n1/0:gpu@0:j", node="n1")
    text = render({"record": rec, "spec": None, "history": [], "holds": []}, 0.0)
    assert "ran on n1: n1/0 (gpu@0:j)" in text and "holds on" not in text


def test_describe_gives_the_priority_the_job_is_ranked_by_not_only_the_number_it_was_submitted_with() -> None:
    from migsched.commands.describe import render
    from shared.state import JobRecord

    def asks(rec: JobRecord, **spec: object) -> str:
        sub = MigschedClient.job(job_id="j", gpus=1, tenant="train", **spec)  # type: ignore[arg-type]
        return render({"record": rec, "spec": sub, "history": [], "holds": []}, 0.0).splitlines()[1]

    ranked = JobRecord(job_id="j", state="running", prio=1000, at=1.0)
    assert asks(ranked) == "  asks 1xGPU for tenant train, priority 1000 (by priority class)"
    assert asks(ranked, priority_class="high").endswith("priority 1000 (class high)")
    plain = JobRecord(job_id="j", state="pending", prio=3, at=1.0)
    assert asks(plain, priority=3).endswith("priority 3")
    refused = JobRecord(job_id="j", state="rejected")  # rejected on arrival: never ranked
    assert asks(refused, priority=7).endswith("priority 7")


@pytest.mark.parametrize("verb", [["status"], ["describe", "j1"], ["check"], ["quota", "recount"]])
def test_a_verb_that_cannot_reach_redis_says_so_in_one_line_without_the_password(verb: list[str]) -> None:
    r = CliRunner().invoke(main, [*verb, "--redis-url", "redis://:s3cret@127.0.0.1:1/0"])  # nothing on port 1
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: cannot r"), r.output  # "reach Redis at", or check's "recount usage in"
    assert "redis://:***@127.0.0.1:1/0" in r.output
    assert "s3cret" not in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("verb", [["submit", "--profile", "1g.5gb"], ["cancel", "j1"], ["dlq"]])
def test_a_verb_that_cannot_reach_nats_gives_up_after_the_set_time_with_the_reason(verb: list[str]) -> None:
    r = CliRunner().invoke(main, [*verb, "--nats-url", "nats://u:s3cret@127.0.0.1:1"],
                           env={"MIGSCHED_CONNECT_GIVE_UP_S": "0.3"})
    assert r.exit_code == 2, r.output
    assert "error: cannot reach NATS at nats://127.0.0.1:1 within 0.3 s: ConnectionRefusedError" in r.output
    assert "s3cret" not in r.output and "Traceback" not in r.output
