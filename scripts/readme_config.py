"""Regenerate the README's configuration tables from the settings classes (``--check`` only compares).

The tables sit between ``<!-- config:begin -->`` and ``<!-- config:end -->``; a unit test runs ``--check`` so
the README cannot drift from the code.
"""

from __future__ import annotations

import sys
from pathlib import Path

from services.executor.config import ExecutorSettings
from shared.settings import (
    BalancerSettings,
    MigrationPlannerSettings,
    RegistrySettings,
    Settings,
    describe,
)

README = Path(__file__).resolve().parent.parent / "README.md"
BEGIN, END = "<!-- config:begin -->", "<!-- config:end -->"


def tables() -> str:
    out: list[str] = []
    common = {v for v, _, _ in describe(Settings)}
    sections = [
        ("Every service", Settings, set()),
        ("balancer", BalancerSettings, common),
        ("registry", RegistrySettings, common),
        ("migration-planner", MigrationPlannerSettings, common),
        ("executor", ExecutorSettings, common),
    ]
    for title, cls, skip in sections:
        out += [f"**{title}**", "", "| variable | default | meaning |", "|---|---|---|"]
        for var, default, doc in describe(cls):
            if var not in skip:
                out.append(f"| `{var}` | `{default}` | {doc.replace('|', '/')} |")
        out.append("")
    return "\n".join(out)


def render(text: str) -> str:
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{tables()}{END}{tail}"


def main(argv: list[str]) -> int:
    text = README.read_text()
    new = render(text)
    if "--check" in argv:
        if new != text:
            print("README.md configuration tables are stale: run .venv/bin/python scripts/readme_config.py")
            return 1
        return 0
    README.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
