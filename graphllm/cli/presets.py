"""`graphllm presets`: the built-in model configs."""

from __future__ import annotations

import click
from rich.table import Table

from graphllm.cli.common import (
    user_errors,
)
from graphllm.files import json_text
from graphllm.models.config import list_presets
from graphllm.report.console import console as new_console


@click.command()
@click.option("--json", "as_json", is_flag=True)
@user_errors
def presets(as_json: bool) -> None:
    """List the model presets (`--model NAME`)."""

    rows = list_presets()
    if as_json:
        click.echo(json_text([{"name": n, "description": d} for n, d in rows], indent=2))
        return

    table = Table("preset", "model")
    for name, desc in rows:
        table.add_row(name, desc)
    new_console().print(table)
