"""``load.aof_bytes`` tallies what Redis's AOF increments spend their bytes on, by command and kind of key."""

from __future__ import annotations

from pathlib import Path

import pytest

from load.aof_bytes import AofFormatError, commands, increments, summary, tag, tally

pytestmark = pytest.mark.unit


def resp(*args: str) -> bytes:
    out = f"*{len(args)}\r\n".encode()
    for a in args:
        b = a.encode()
        out += b"$%d\r\n%s\r\n" % (len(b), b)
    return out


GPU = resp("HSET", "{m:0}:gpu:n1/0", "inst", '[{"id":"a"}]', "rev", "2", "ver", "2")
JOB = resp("HSET", "{m:0}:job:j1", "state", "running", "reason", "started", "updated", "1.5")
HIST = resp("RPUSH", "{m:0}:hist:j1", '{"to":"running"}')
CMD = resp("HSET", "{m:0}:cmds", "place:j1:0", "{}")


def test_each_command_comes_back_with_its_arguments_and_its_size_in_the_file() -> None:
    got = list(commands(resp("MULTI") + GPU + resp("EXEC")))
    assert [a[0] for a, _ in got] == [b"MULTI", b"HSET", b"EXEC"]
    assert got[1][0][1] == b"{m:0}:gpu:n1/0" and got[1][1] == len(GPU)


def test_a_command_cut_off_by_the_read_limit_is_left_out() -> None:
    data = GPU + JOB
    for cut in (len(GPU) + 3, len(GPU) + 20, len(data) - 1):
        assert [n for _, n in commands(data[:cut])] == [len(GPU)]


def test_bytes_that_are_not_an_aof_are_refused_with_where() -> None:
    with pytest.raises(AofFormatError, match="byte 0"):
        list(commands(b"GET x\r\n"))
    with pytest.raises(AofFormatError, match="length"):
        list(commands(b"*x\r\n"))


def test_a_tag_names_the_command_the_kind_of_key_and_a_hash_writes_fields() -> None:
    assert tag([b"HSET", b"{m:0}:gpu:n1/0", b"inst", b"[]", b"rev", b"1", b"ver", b"1", b"pos", b"3"]) \
        == "HSET gpu inst,rev,ver"
    assert tag([b"RPUSH", b"{m:0}:hist:j1", b"{}"]) == "RPUSH hist"
    assert tag([b"HSET", b"{m:0}:cmds", b"place:j1:0", b"{}"]) == "HSET cmds *"  # an id field: one of many
    assert tag([b"SET", b"plain", b"1"]) == "SET plain"
    assert tag([b"MULTI"]) == "MULTI"


def test_the_tally_adds_up_bytes_and_counts_per_tag_within_the_limit(tmp_path: Path) -> None:
    d = tmp_path / "appendonlydir"
    d.mkdir()
    (d / "appendonly.aof.1.incr.aof").write_bytes(JOB + JOB + HIST)
    (d / "appendonly.aof.2.incr.aof").write_bytes(CMD)
    (d / "appendonly.aof.1.base.rdb").write_bytes(b"REDIS0011")  # the rewrite's snapshot is not an append
    assert [f.name for f in increments(tmp_path)] == ["appendonly.aof.1.incr.aof", "appendonly.aof.2.incr.aof"]
    size, count = tally(increments(tmp_path))
    assert size == {"HSET job state,reason,updated": 2 * len(JOB), "RPUSH hist": len(HIST), "HSET cmds *": len(CMD)}
    assert count["HSET job state,reason,updated"] == 2
    size, _ = tally(increments(tmp_path), limit=len(JOB) + 5)
    assert size == {"HSET job state,reason,updated": len(JOB)}


def test_the_summary_puts_the_largest_first_and_gives_bytes_per_job(tmp_path: Path) -> None:
    (tmp_path / "appendonly.aof.1.incr.aof").write_bytes(HIST + GPU)
    assert len(GPU) > len(HIST)
    text = summary(tmp_path, jobs=2)
    lines = text.splitlines()
    assert f"{(len(GPU) + len(HIST)) / 2:,.0f} bytes per job" in lines[0]
    assert lines[1].endswith("HSET gpu inst,rev,ver") and lines[2].endswith("RPUSH hist")
    assert summary(tmp_path / "nothing-here").startswith("no AOF increments")


def test_increments_are_taken_in_sequence_and_an_oddly_named_one_first(tmp_path: Path) -> None:
    for name in ("appendonly.aof.10.incr.aof", "appendonly.aof.9.incr.aof", "x.incr.aof"):
        (tmp_path / name).write_bytes(HIST)
    assert [f.name for f in increments(tmp_path)] == ["x.incr.aof", "appendonly.aof.9.incr.aof",
                                                      "appendonly.aof.10.incr.aof"]
