"""``migsched schema``: the JSON Schema of every external message, for publishers in any language."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from shared.events import json_schemas


def schema_text(schema: dict[str, Any]) -> str:
    """One schema as the files in ``schemas/`` hold it (stable key order, so a diff shows only real changes)."""
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write_schemas(directory: Path) -> list[Path]:
    """Write ``<Message>.json`` for every message into ``directory``; the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, schema in json_schemas().items():
        path = directory / f"{name}.json"
        path.write_text(schema_text(schema))
        paths.append(path)
    return paths


@click.command("schema")
@click.argument("message", required=False)
@click.option("--list", "list_only", is_flag=True, help="Only list the message names.")
@click.option("--write", "directory", type=click.Path(file_okay=False, path_type=Path),
              help="Write one <Message>.json per message into this directory (the repository keeps them in "
                   "schemas/).")
def command(message: str | None, list_only: bool, directory: Path | None) -> None:
    """Print the JSON Schema (draft 2020-12) of MESSAGE (e.g. JobSubmit), or of all messages keyed by name."""
    if directory is not None:
        try:
            paths = write_schemas(directory)
        except OSError as exc:
            raise click.ClickException(f"cannot write the schemas into {directory}: {exc.strerror or exc}") from None
        for path in paths:
            click.echo(str(path))
        return
    schemas = json_schemas()
    if list_only:
        click.echo("\n".join(schemas))
        return
    if message is not None:
        if message not in schemas:
            raise click.BadParameter(
                f"unknown message {message!r}; one of {', '.join(schemas)}", param_hint="MESSAGE"
            )
        click.echo(schema_text(schemas[message]), nl=False)
        return
    click.echo(json.dumps(schemas, indent=2, sort_keys=True))
