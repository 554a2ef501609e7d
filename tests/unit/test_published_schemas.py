"""The schemas in ``schemas/`` are the ones the code generates: a message changed without regenerating them
fails here, with the command that fixes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from migsched.commands.schema import schema_text
from shared.events import json_schemas

pytestmark = pytest.mark.unit
PUBLISHED = Path(__file__).resolve().parents[2] / "schemas"


def test_every_message_schema_is_published_as_generated() -> None:
    schemas = json_schemas()
    assert sorted(p.stem for p in PUBLISHED.glob("*.json")) == sorted(schemas)
    stale = [name for name, s in schemas.items() if (PUBLISHED / f"{name}.json").read_text() != schema_text(s)]
    assert not stale, f"schemas/ is stale for {stale}: run `migsched schema --write schemas` and commit it"
