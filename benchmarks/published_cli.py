"""The command line the scripts that hold published measurements against graphllm's predictions
share (published.py, published_collectives.py): --table, --ideal, --json.

Imported as `benchmarks.published_cli` by scripts run as `python benchmarks/NAME.py`, each of
which puts the checkout on sys.path first.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from graphllm.models.hardware import rate_model


def published_main(
    argv: list[str] | None,
    *,
    description: str,
    table: Path,
    ideal_help: str,
    load: Callable[[Path], Any],
    compare: Callable[[Any], Any],
    document: Callable[[Any], dict[str, Any]],
    show: Callable[[Any, str], None],
) -> int:
    """Load the table, predict each measurement on the chosen rate model, print the result:
    `document(results)` under --json (beside the rate model), else `show(results, model)`."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--table", type=Path, default=table, help="the YAML table of measurements")
    ap.add_argument("--ideal", action="store_true", help=ideal_help)
    ap.add_argument("--json", action="store_true", help="print a JSON document instead")
    args = ap.parse_args(argv)
    items = load(args.table)
    with rate_model(ideal=args.ideal, cuda_graphs=None):
        results = compare(items)
    model = "ideal" if args.ideal else "achievable"
    if args.json:
        print(json.dumps({"rate_model": model} | document(results), indent=2))
    else:
        show(results, model)
    return 0
