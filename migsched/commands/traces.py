"""``migsched traces``: which public traces this machine has, where they are read from, and how to get the rest.

Exit status: 0 when every known trace is found, 1 when one or more is missing (the listing says how to get it).
"""

from __future__ import annotations

import json
import sys

import click

from shared.sim.workloads.catalog import TRACES, traces_dir


@click.command("traces")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of the listing.")
def command(as_json: bool) -> None:
    """List the public traces found under $MIGSCHED_TRACES_DIR (default <repo>/../shared/traces)."""
    root = traces_dir()
    rows = []
    for t in TRACES:
        files = t.files(root)
        rows.append(
            {
                "name": t.name,
                "folder": str(root / t.folder),
                "found": [f.name for f in files],
                "what": t.what,
                "source": {"repository": t.upstream, "commit": t.snapshot, "path": t.upstream_path},
            }
        )
    missing = [r for r in rows if not r["found"]]
    if as_json:
        click.echo(json.dumps({"traces_dir": str(root), "traces": rows}, indent=2))
    else:
        click.echo(f"traces directory: {root}  (MIGSCHED_TRACES_DIR)")
        for r, t in zip(rows, TRACES, strict=True):
            state = f"{len(r['found'])} file(s)" if r["found"] else "MISSING"
            click.echo(f"\n{t.name}: {state}\n  {t.what}\n  read from {r['folder']}")
            if r["found"]:
                click.echo("  " + ", ".join(r["found"]))
            else:
                click.echo(f"  to get it: {t.fetch_hint()}")
    sys.exit(1 if missing else 0)
