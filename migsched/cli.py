"""The ``migsched`` command. Each verb lives in ``migsched/commands/<verb>.py`` and is imported only when used,
so ``migsched geometry`` does not pay for NATS, Redis or matplotlib."""

from __future__ import annotations

import importlib
from typing import Any

import click

# verb -> module under migsched.commands exposing a click command named ``command``
VERBS: dict[str, str] = {
    "geometry": "geometry",
    "simulate": "simulate",
    "up": "up",
    "submit": "submit",
    "cancel": "cancel",
    "status": "status",
    "replay": "replay",
    "schema": "schema",
    "check": "check",
    "gpu-check": "gpu_check",
    "service": "service",
    "quota": "quota",
    "traces": "traces",
    "dlq": "dlq",
    "describe": "describe",
    "dashboard": "dashboard",
}


class Unusable(click.ClickException):
    """A live verb that cannot run (an endpoint unreachable, a setting the deployment refuses): one line on
    stderr, exit status 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.message}", err=True)


class LazyGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            from migsched.endpoints import explain

            line = explain(exc, ctx.meta)
            if line is None:
                raise
            raise Unusable(line) from None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(v for v in VERBS if self._load(v) is not None)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return self._load(cmd_name)

    def _load(self, name: str) -> click.Command | None:
        module = VERBS.get(name)
        if module is None:
            return None
        try:
            mod = importlib.import_module(f"migsched.commands.{module}")
        except ModuleNotFoundError as exc:
            if exc.name == f"migsched.commands.{module}":
                return None
            raise
        cmd: click.Command = mod.command
        return cmd


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="migsched")
def main() -> None:
    """migsched: MIG-aware GPU cluster scheduler."""
