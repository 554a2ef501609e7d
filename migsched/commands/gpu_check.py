"""``migsched gpu-check``: what NVML says about this node's GPUs, compared with the built-in MIG tables.

Read-only by default: MIG mode (current/pending), the profile table and placements read from NVML, the
instances that exist, and every difference from the built-in table. ``--measure`` (explicit) times GI/CI
create and destroy per profile on a free MIG-enabled GPU and leaves it as it found it. ``--probe`` starts a
process bound to each GPU or MIG instance the way the executor binds a workload and checks that CUDA shows it
that device alone. It never changes MIG mode and never resets a GPU. Exit codes: 0 fine, 1 a measurement or a
probe was refused or failed, 2 no NVML/driver.
The work is in ``migsched.gpucheck``, imported when the verb runs: it needs the ``[nvml]`` extra.
"""

from __future__ import annotations

import sys

import click


@click.command("gpu-check")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.option("--gpu", "gpus", type=int, multiple=True, help="Only these GPU indices (repeatable).")
@click.option(
    "--measure",
    is_flag=True,
    help="Time GI/CI create+destroy per profile on free MIG GPUs (creates and destroys instances; "
    "needs root; refuses GPUs with existing instances).",
)
@click.option(
    "--repeat", type=click.IntRange(1, 50), default=3, show_default=True, help="Samples per profile."
)
@click.option(
    "--probe",
    is_flag=True,
    help="Start a process bound to each GPU (or each MIG instance that exists) as the executor binds a "
    "workload, and check that CUDA shows it that one device and no other. Read-only.",
)
@click.option("--fake", hidden=True, default=None, help="Use the NVML fake (tests); also $MIGSCHED_NVML_FAKE.")
def command(
    as_json: bool, gpus: tuple[int, ...], measure: bool, repeat: int, probe: bool, fake: str | None
) -> None:
    """Show MIG mode, NVML's profile table and placements, and differences from the built-in tables."""
    try:
        from migsched import gpucheck
    except ModuleNotFoundError as exc:
        if exc.name != "pynvml":
            raise
        click.echo("gpu-check: NVML's Python binding is not installed: pip install 'migsched[nvml]'", err=True)
        sys.exit(2)
    gpucheck.run(as_json, gpus, measure, repeat, fake, probe)
