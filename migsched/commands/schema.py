"""``migsched schema``: the JSON Schema of every external message, for publishers in any language."""

from __future__ import annotations

import json

import click

from shared.events import json_schemas


@click.command("schema")
@click.argument("message", required=False)
@click.option("--list", "list_only", is_flag=True, help="Only list the message names.")
def command(message: str | None, list_only: bool) -> None:
    """Print the JSON Schema (draft 2020-12) of MESSAGE (e.g. JobSubmit), or of all messages keyed by name."""
    schemas = json_schemas()
    if list_only:
        click.echo("\n".join(schemas))
        return
    if message is not None:
        if message not in schemas:
            raise click.BadParameter(
                f"unknown message {message!r}; one of {', '.join(schemas)}", param_hint="MESSAGE"
            )
        click.echo(json.dumps(schemas[message], indent=2, sort_keys=True))
        return
    click.echo(json.dumps(schemas, indent=2, sort_keys=True))
