"""When in a run the slow jobs were: submit → command latency per window of submit time.

    python -m load scenario steady-1000-64x8 --timelines /tmp/tl.json ...   (or python -m load.live ... --timelines)
    python -m load.timelines /tmp/tl.json --window 0.5

A p99 over the whole run does not say whether the tail is spread evenly (a saturated machine) or comes in
bursts (a pause somewhere: a collection, a periodic task, a neighbour's job); this table does.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import msgspec

from load.recorder import ORDER


def windows(done: dict[str, dict[str, int]], start: str, end: str, window_s: float) -> list[tuple[float, list[float]]]:
    """Per window of ``start`` instants (seconds from the first), the sorted ``start → end`` latencies in ms."""
    pairs = [(tl[start], tl[end]) for tl in done.values() if start in tl and end in tl]
    if not pairs:
        return []
    t0 = min(a for a, _ in pairs)
    step = int(window_s * 1e9)
    buckets: dict[int, list[float]] = defaultdict(list)
    for a, b in pairs:
        buckets[(a - t0) // step].append((b - a) / 1e6)
    return [(k * window_s, sorted(v)) for k, v in sorted(buckets.items())]


def render(rows: list[tuple[float, list[float]]], span: str) -> str:
    out = [f"| from (s) | jobs | {span} p50 (ms) | p99 | max |", "|---:|---:|---:|---:|---:|"]
    for t, v in rows:
        p50, p99 = v[len(v) // 2], v[min(len(v) - 1, int(len(v) * 0.99))]
        out.append(f"| {t:.1f} | {len(v)} | {p50:.1f} | {p99:.1f} | {v[-1]:.1f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m load.timelines", description=__doc__.splitlines()[0])
    ap.add_argument("file", help="the JSON written by --timelines")
    ap.add_argument("--window", type=float, default=0.5, help="seconds per row")
    ap.add_argument("--start", choices=ORDER, default="submit")
    ap.add_argument("--end", choices=ORDER, default="command")
    args = ap.parse_args(argv)
    done = msgspec.json.decode(Path(args.file).read_bytes(), type=dict[str, dict[str, int]])
    rows = windows(done, args.start, args.end, args.window)
    if not rows:
        print(f"no job has both {args.start} and {args.end}")
        return 1
    print(render(rows, f"{args.start}→{args.end}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
