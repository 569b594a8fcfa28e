"""The command line the scripts that hold published measurements against graphllm's predictions
share (published.py, published_collectives.py, published_gemms.py): --table, --ideal, --json.

Imported as `benchmarks.published_cli` by scripts run as `python benchmarks/NAME.py`, each of
which puts the checkout on sys.path first.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from graphllm.errors import GraphllmError
from graphllm.models.hardware import load_hardware, rate_model
from graphllm.models.parse import read_mapping


def published_main(argv: list[str] | None, script: ModuleType) -> int:
    """Run `script`: load its TABLE (or --table), predict each measurement on the chosen rate
    model (`compare`), print `document(results)` under --json beside the rate model, else
    `show(results, model)`. The script's docstring's first line describes it, and IDEAL_HELP
    says what --ideal predicts on."""
    ap = argparse.ArgumentParser(description=(script.__doc__ or "").split("\n")[0])
    ap.add_argument("--table", type=Path, default=script.TABLE, help="the YAML measurements")
    ap.add_argument("--ideal", action="store_true", help=script.IDEAL_HELP)
    ap.add_argument("--json", action="store_true", help="print a JSON document instead")
    args = ap.parse_args(argv)
    try:
        items = script.load(args.table)
        with rate_model(ideal=args.ideal, cuda_graphs=None):
            results = script.compare(items)
    except GraphllmError as e:  # an unreadable table: its one line
        print(e, file=sys.stderr)
        return 2
    except SystemExit as e:  # a table's problem, named by its loader
        if not isinstance(e.code, str):
            raise
        print(e.code, file=sys.stderr)
        return 2
    model = "ideal" if args.ideal else "achievable"
    if args.json:
        print(json.dumps({"rate_model": model} | script.document(results), indent=2))
    else:
        script.show(results, model)
    return 0


def read_tables(
    path: Path, required: tuple[str, ...], check: Callable[[str, dict[str, Any]], None]
) -> list[dict[str, Any]]:
    """The `tables:` of the YAML file `path`, each with its `required` fields, a source URL and
    a hardware preset graphllm has, then `check(where, table)` for the script's own fields
    (`where` names the table in its errors). Every problem is one SystemExit line."""
    doc = read_mapping(path)
    tables = doc.get("tables") if isinstance(doc, dict) else None
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise SystemExit(f"{path}: needs `tables:`, a list of tables")
    for t in tables:
        where = f"{path}: table {t.get('id', '?')}"
        missing = [k for k in required if k not in t]
        if missing:
            raise SystemExit(f"{where} lacks {', '.join(missing)}")
        if not str(t["source"]).startswith("https://"):
            raise SystemExit(f"{where}: source must be a URL")
        try:
            load_hardware(t["hardware"])
        except GraphllmError as e:
            raise SystemExit(f"{where}: {e}") from None
        check(where, t)
    return tables
