"""What Redis's append-only file spends its bytes on, by command and kind of key.

Every byte appended is a byte a later AOF rewrite had to make room for, so the bytes per job say how often the
rewrites come (at ``auto-aof-rewrite-percentage 100`` a rewrite follows each doubling). Redis 7 writes a Lua
script's effects, not the call: each ``HSET``/``RPUSH``/... a transition makes, inside ``MULTI``/``EXEC``.
This tallies them from the increment files (``appendonlydir/*.incr.aof``), keyed by command, the kind of key
(the part after the hash tag: ``gpu``, ``job``, ``hist``, ``occ``, ...) and, for ``HSET``, the first fields
written, so that "the GPU's instance JSON" and "a job's state" are told apart::

    .venv/bin/python -m load.aof_bytes /path/to/redis/appendonlydir --jobs 10000

``python -m load.live ... --aof-bytes`` prints the same for its private Redis before removing it.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

LIMIT_BYTES = 64 * 2**20
"""How much of the increments is read by default: a soak appends ~1 GB, and the mix is the same throughout."""


class AofFormatError(ValueError):
    """The bytes are not a sequence of RESP arrays of bulk strings (an AOF increment)."""


def _number(raw: bytes, at: int) -> int:
    try:
        return int(raw)
    except ValueError:
        raise AofFormatError(f"expected a length at byte {at}, found {raw[:20]!r}") from None


def commands(data: bytes) -> Iterator[tuple[list[bytes], int]]:
    """Each whole command in ``data``: its arguments and its size in the file. A command cut off at the end
    (a read limited to the first bytes of a file) is left out."""
    i, end = 0, len(data)
    while i < end:
        start = i
        if data[i : i + 1] != b"*":
            raise AofFormatError(f"expected '*' at byte {i}, found {data[i:i + 1]!r}")
        j = data.find(b"\r\n", i)
        if j < 0:
            return
        argc = _number(data[i + 1 : j], i)
        i = j + 2
        args = []
        for _ in range(argc):
            j = data.find(b"\r\n", i)
            if j < 0:
                return
            if data[i : i + 1] != b"$":
                raise AofFormatError(f"expected '$' at byte {i}, found {data[i:i + 1]!r}")
            n = _number(data[i + 1 : j], i)
            i = j + 2
            if i + n + 2 > end:
                return
            args.append(data[i : i + n])
            i += n + 2
        yield args, i - start


def tag(args: Sequence[bytes]) -> str:
    """``HSET gpu inst,rev,ver``: the command, its key's kind and, for a hash write, its first three fields
    (``*`` for a field named by an id)."""
    cmd = args[0].decode(errors="replace").upper()
    if len(args) < 2:
        return cmd
    key = args[1].decode(errors="replace")
    # {ns:shard}:kind[:id]: the kind names the key; a key without a hash tag stands for itself
    kind = key.split("}:", 1)[1].split(":", 1)[0] if "}:" in key else key
    if cmd == "HSET" and len(args) > 2:  # a field that is an id (``place:<job>:<attempt>``) is one of many
        fields = (a.decode(errors="replace") for a in args[2::2][:3])
        kind += " " + ",".join("*" if ":" in f else f for f in fields)
    return f"{cmd} {kind}"


def tally(files: Sequence[Path], limit: int = LIMIT_BYTES) -> tuple[Counter[str], Counter[str]]:
    """Bytes and counts per ``tag`` over the first ``limit`` bytes of ``files`` together."""
    size: Counter[str] = Counter()
    count: Counter[str] = Counter()
    left = limit
    for f in files:
        if left <= 0:
            break
        with f.open("rb") as fh:
            data = fh.read(left)
        left -= len(data)
        for args, n in commands(data):
            t = tag(args)
            size[t] += n
            count[t] += 1
    return size, count


def increments(path: Path) -> list[Path]:
    """The increment files under an ``appendonlydir`` (or a Redis working directory holding one), oldest
    first; a file is taken as it is."""
    if path.is_file():
        return [path]

    def sequence(p: Path) -> tuple[int, str]:  # appendonly.aof.<n>.incr.aof; another name sorts first, by name
        n = p.name.split(".")[-3] if p.name.count(".") >= 3 else ""
        return (int(n) if n.isdigit() else -1, p.name)

    return sorted(path.rglob("*.incr.aof"), key=sequence)


def summary(path: Path, jobs: int = 0, limit: int = LIMIT_BYTES, top: int = 12) -> str:
    """A readable table of the largest tags; with ``jobs`` (those the run ended) also bytes per job."""
    files = increments(path)
    if not files:
        return f"no AOF increments under {path}"
    size, count = tally(files, limit)
    total = sum(size.values())
    on_disk = sum(f.stat().st_size for f in files)
    read = min(limit, on_disk)
    out = [f"AOF bytes by command ({read / 2**20:.0f} MiB of increments read, {total:,} bytes in whole commands)"]
    if jobs > 0 and read >= on_disk:  # bytes per job only over the whole run
        out[0] += f", {total / jobs:,.0f} bytes per job"
    for t, n in size.most_common(top):
        out.append(f"    {100 * n / total:5.1f} %  {n / count[t]:7.0f} B x {count[t]:8d}  {t}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m load.aof_bytes", description=__doc__.split("\n\n")[0])
    ap.add_argument("path", type=Path, help="an appendonlydir, a Redis working directory, or one .incr.aof file")
    ap.add_argument("--jobs", type=int, default=0, help="jobs the run ended (prints bytes per job)")
    ap.add_argument("--limit-mib", type=float, default=LIMIT_BYTES / 2**20, help="MiB of increments to read")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args(argv)
    print(summary(args.path, args.jobs, int(args.limit_mib * 2**20), args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
