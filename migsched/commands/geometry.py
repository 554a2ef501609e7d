"""``migsched geometry``: the known GPU models, one model's MIG profiles, and whether an instance mix fits.

Exit status: 0 on success (and when ``--check`` fits), 1 when the mix does not fit, 2 on a usage error
(unknown model or profile, malformed mix, unreadable geometry file).
"""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.table import Table

from shared.errors import GeometryError, UnknownModelError
from shared.mig.geometry import Geometry, GpuModel, default_geometry, load_geometry
from shared.mig.occupancy import draw, fit_mix


def _fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


def _console() -> Console:
    return Console(width=None if sys.stdout.isatty() else 160, soft_wrap=False)


def _emit(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


def parse_mix(model: GpuModel, text: str) -> dict[str, int]:
    """``1g.5gb:2,2g.10gb,3g`` -> profile name -> count on ``model`` (a shape names that model's profile)."""
    mix: dict[str, int] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            raise click.BadParameter(f"empty item in {text!r}", param_hint="--check")
        name, sep, count_text = item.partition(":")
        name = name.strip()
        try:
            count = int(count_text) if sep else 1
        except ValueError:
            raise click.BadParameter(f"count {count_text!r} of {name!r} is not a whole number",
                                     param_hint="--check") from None
        if count < 1:
            raise click.BadParameter(f"count of {name!r} must be at least 1", param_hint="--check")
        if model.has_profile(name):
            prof = model.profile(name)
        else:
            by_shape = next((p for p in model.profiles if p.shape == name), None)
            if by_shape is None:
                known = ", ".join(p.name for p in model.profiles)
                raise click.BadParameter(f"{model.name} has no profile {name!r}; known: {known}",
                                         param_hint="--check")
            prof = by_shape
        mix[prof.name] = mix.get(prof.name, 0) + count
    return mix


def _models(geo: Geometry, as_json: bool) -> None:
    if as_json:
        _emit([{"name": m.name, "aliases": list(m.aliases), "pci_device_ids": list(m.pci_device_ids),
                "memory_slices": m.memory_slices, "compute_slices": m.compute_slices,
                "memory_gib": m.memory_gib, "sm_count": m.sm_count, "verified": m.verified,
                "profiles": [p.name for p in m.profiles]} for m in geo.models])
        return
    table = Table(title="GPU models")
    for col in ("model", "slices (mem/compute)", "GiB", "SMs", "profiles", "PCI ids", "verified"):
        table.add_column(col)
    for m in geo.models:
        table.add_row(m.name, f"{m.memory_slices}/{m.compute_slices}", f"{m.memory_gib:g}", str(m.sm_count),
                      " ".join(p.name for p in m.profiles), " ".join(m.pci_device_ids),
                      "yes" if m.verified else "no")
    _console().print(table)


def _profiles(model: GpuModel, as_json: bool) -> None:
    if as_json:
        _emit({"name": model.name, "aliases": list(model.aliases),
               "pci_device_ids": list(model.pci_device_ids),
               "memory_slices": model.memory_slices, "compute_slices": model.compute_slices,
               "memory_gib": model.memory_gib, "sm_count": model.sm_count, "verified": model.verified,
               "note": model.note,
               "profiles": [{"name": p.name, "shape": p.shape, "profile_id": p.profile_id,
                             "nvml_enum": p.nvml_enum, "compute_slices": p.compute_slices,
                             "memory_slices": p.memory_slices, "placements": list(p.placements),
                             "max_count": p.max_count, "memory_gib": p.memory_gib, "sm_count": p.sm_count}
                            for p in model.profiles]})
        return
    title = f"{model.name}: {model.memory_slices} memory / {model.compute_slices} compute slices, " \
            f"{model.memory_gib:g} GiB, {model.sm_count} SMs" + ("" if model.verified else " (UNVERIFIED)")
    table = Table(title=title)
    for col in ("profile", "shape", "profile id", "enum", "compute", "memory", "placements {starts}:size",
                "max", "GiB", "SMs"):
        table.add_column(col)
    for p in model.profiles:
        starts = ",".join(str(s) for s in p.placements)
        table.add_row(p.name, p.shape, str(p.profile_id), str(p.nvml_enum), str(p.compute_slices),
                      str(p.memory_slices), f"{{{starts}}}:{p.memory_slices}", str(p.max_count),
                      f"{p.memory_gib:g}", str(p.sm_count))
    _console().print(table)


def _check(model: GpuModel, text: str, as_json: bool) -> int:
    mix = parse_mix(model, text)
    layout = fit_mix(model, mix)
    fits = layout is not None
    if as_json:
        _emit({"model": model.name, "mix": mix, "fits": fits,
               "layout": [{"profile": n, "start": s, "size": model.profile(n).memory_slices}
                          for n, s in layout or ()],
               "drawing": draw(model, layout) if layout is not None else None})
    else:
        want = " + ".join(f"{n}×{c}" if c > 1 else n for n, c in mix.items())
        if layout is None:
            click.echo(f"{want} does not fit one {model.name}")
        else:
            click.echo(f"{want} fits one {model.name}:")
            click.echo("  " + draw(model, layout))
            for name, start in layout:
                click.echo(f"  {name}@{start}:{model.profile(name).memory_slices}")
    return 0 if fits else 1


@click.command("geometry")
@click.argument("model", required=False)
@click.option("--check", "mix", metavar="MIX",
              help="Instance mix such as 1g.5gb:2,2g.10gb,3g.20gb: does it fit one GPU?")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--geometry-file", type=click.Path(dir_okay=False), envvar="MIGSCHED_GEOMETRY_FILE",
              help="JSON/TOML file whose models replace or extend the built-in tables.")
def command(model: str | None, mix: str | None, as_json: bool, geometry_file: str | None) -> None:
    """List GPU models, show MODEL's MIG profiles, or --check whether an instance mix fits one GPU."""
    try:
        geo = load_geometry(geometry_file) if geometry_file else default_geometry()
    except GeometryError as exc:
        _fail(str(exc))
    if model is None:
        if mix is not None:
            _fail("--check needs a MODEL")
        _models(geo, as_json)
        return
    try:
        gpu = geo.model(model)
    except UnknownModelError as exc:
        _fail(str(exc))
    if mix is None:
        _profiles(gpu, as_json)
        return
    try:
        code = _check(gpu, mix, as_json)
    except click.BadParameter as exc:
        _fail(exc.format_message())
    sys.exit(code)
