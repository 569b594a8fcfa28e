"""graphllm's predictions beside published measurements of real engines (benchmarks/published.yaml).

Each row of the table is a figure someone else measured and published (engine, version, GPUs,
parallelism, precision, batch, prompt and output lengths, the figure, its source URL and a quote).
Beside it: graphllm's prediction on the row's hardware preset, and measured time / predicted time
(above 1: the engine was slower than predicted).

- decode_tokens_per_s: one decode step at batch B with the row's `past` cached tokens (default:
  the prompt plus half the output, the average over the generated tokens), logits for the last
  position; the figure is B / step time.
- ttft_ms: the prefill of the prompt (logits for the last position).
- itl_ms: one sequence's time per output token (inter-token latency), the decode step above.
- tp > 1: the step of one device under tensor parallelism (`partition`), collectives included.

It prints the median of measured/predicted over the batch-1 decode and TTFT rows, and the rows
beyond 1.5x either way. Where one engine version measured the TTFT of one model on one device at
two prompt lengths, it also splits both figures into what each further prompt token costs (the
slope between the two) and what the call costs before its first token (the intercept): a model
can get the one right and miss the other. The goal is a median within 15% of 1 and no row
beyond 1.5x; missed goals are reported, not fatal. Nothing is fitted: the rates are the presets'
achievable figures.

    python benchmarks/published.py [--table FILE] [--ideal] [--json]
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run standalone from a checkout
    sys.path.insert(0, str(ROOT))

from benchmarks.published_cli import published_main  # noqa: E402
from graphllm import Workload, build_graph  # noqa: E402
from graphllm.models.config import config_from_dict  # noqa: E402
from graphllm.models.hardware import load_hardware  # noqa: E402
from graphllm.models.parse import read_mapping  # noqa: E402
from graphllm.passes.parallel.partition import Strategy, partition, partition_report  # noqa: E402
from graphllm.passes.registry import run  # noqa: E402

IDEAL_HELP = "predict on the data-sheet peaks"
TABLE = Path(__file__).with_name("published.yaml")
PRESETS = ROOT / "graphllm" / "models" / "presets"
METRICS = ("decode_tokens_per_s", "ttft_ms", "itl_ms")
REQUIRED = (
    "id",
    "engine",
    "version",
    "gpus",
    "hardware",
    "model",
    "tp",
    "precision",
    "batch",
    "prompt",
    "output",
    "metric",
    "measured",
    "source",
    "quote",
)
GOAL_MEDIAN = 0.15  # the median within 15% of 1
GOAL_ROW = 1.5  # no row beyond 1.5x either way


def load_rows(path: Path = TABLE) -> list[dict[str, Any]]:
    """The table's rows, each checked for every field and a source URL."""
    doc = read_mapping(path)
    groups, overrides = doc.get("groups", {}), doc.get("overrides", {})

    def fields(name: str) -> dict[str, Any]:
        g = dict(groups[name])
        return fields(g.pop("group")) | g if "group" in g else g

    rows = []
    for raw in doc["rows"]:
        row = (fields(raw["group"]) if "group" in raw else {}) | raw
        row.pop("group", None)
        if "overrides" in row:
            row["overrides"] = overrides[row["overrides"]]
        rows.append(row)
    for row in rows:
        missing = [k for k in REQUIRED if k not in row]
        if missing:
            raise SystemExit(f"{path}: row {row.get('id', '?')} lacks {', '.join(missing)}")
        if not str(row["source"]).startswith("https://"):
            raise SystemExit(f"{path}: row {row['id']}: source must be a URL")
        if row["metric"] not in METRICS:
            raise SystemExit(f"{path}: row {row['id']}: metric must be one of {METRICS}")
    return rows


def _config(row: dict[str, Any]) -> Any:
    d = json.loads((PRESETS / f"{row['model']}.json").read_text())
    return config_from_dict(d | dict(row.get("overrides") or {}), row["model"])


def _engine_attention(hw: Any, row: dict[str, Any]) -> Any:
    """The device with its attention kernel at the rate of the row's `attention` dtype, where the
    engine computes attention in another dtype than its GEMMs (TensorRT-LLM v0.5's FP8 engines
    build the attention plugin in float16: FP8 GEMMs, FP16 context FMHA)."""
    want = row.get("attention")
    if want is None or hw.achievable is None:
        return hw
    rates = hw.achievable.attention_flops
    # the attention runs at the rate of the graph's stream dtype (bf16 beside W8A8's fp8)
    stream = Workload(act_dtype=row["precision"]["act"]).stream_dtype
    fixed = replace(hw.achievable, attention_flops=rates | {stream: hw.attention_rate(want)})
    return replace(hw, achievable=fixed)


def predict_seconds(row: dict[str, Any]) -> float:
    """The predicted time of the row's step (a decode step, or the prompt's prefill)."""
    p = row["precision"]
    dtypes = {"weight_dtype": p["weight"], "act_dtype": p["act"], "kv_dtype": p["kv"]}
    if row["metric"] == "ttft_ms":
        wl = Workload(batch=row["batch"], seq_len=row["prompt"], logits="last", **dtypes)
    else:
        past = row.get("past", row["prompt"] + row["output"] // 2)
        wl = Workload(batch=row["batch"], seq_len=1, past_len=past, logits="last", **dtypes)
    hw = _engine_attention(load_hardware(row["hardware"]), row)
    graph = build_graph(_config(row), wl)
    if row["tp"] == 1:
        return run(graph, ["cost", "roofline"], hardware=hw)["roofline"].seconds
    pg = partition(graph, Strategy(tp=row["tp"], whole_vocab=row.get("whole_vocab", False)), hw)
    return partition_report(pg, hw).to_dict()["stages"][0]["seconds"]


def compare(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row with its prediction (in the row's unit) and measured time / predicted time."""
    out = []
    for row in rows:
        secs = predict_seconds(row)
        if row["metric"] in ("ttft_ms", "itl_ms"):
            predicted, ratio = 1e3 * secs, row["measured"] / (1e3 * secs)
        else:
            predicted = row["batch"] / secs
            ratio = predicted / row["measured"]  # measured time over predicted time
        out.append(row | {"predicted": predicted, "ratio": ratio})
    return out


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The median ratio over the batch-1 decode and TTFT rows, and the rows beyond 1.5x."""
    judged = [r for r in results if r["batch"] == 1]
    ratios = [r["ratio"] for r in judged]
    median = statistics.median(ratios) if ratios else float("nan")
    beyond = [r["id"] for r in judged if not 1 / GOAL_ROW <= r["ratio"] <= GOAL_ROW]
    return {
        "rows": len(results),
        "judged": len(judged),
        "median_ratio": median,
        "median_goal_met": abs(median - 1) <= GOAL_MEDIAN,
        "beyond_1.5x": beyond,
    }


def prefill_pairs(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each set of batch-1 TTFT rows of one engine version, device, model, parallelism and
    precision at two or more prompt lengths, as the line through its shortest and longest
    prompt: milliseconds per further 1000 tokens (slope) and at no tokens (intercept), measured
    and predicted."""
    sets: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        if r["metric"] == "ttft_ms" and r["batch"] == 1:
            same = [r[k] for k in ("engine", "version", "hardware", "model", "tp")]
            key = json.dumps(same + [r["precision"], r.get("overrides")], sort_keys=True)
            sets.setdefault(key, []).append(r)
    out = []
    for rows in sets.values():
        short = min(rows, key=lambda r: r["prompt"])
        long = max(rows, key=lambda r: r["prompt"])
        if long["prompt"] == short["prompt"]:
            continue
        span = (long["prompt"] - short["prompt"]) / 1e3
        line = {}
        for side in ("measured", "predicted"):
            slope = (long[side] - short[side]) / span
            line[side] = (slope, short[side] - slope * short["prompt"] / 1e3)
        out.append(
            {
                "rows": [short["id"], long["id"]],
                "hardware": short["hardware"],
                "prompts": [short["prompt"], long["prompt"]],
                "ms_per_1000_tokens": {k: v[0] for k, v in line.items()},
                "intercept_ms": {k: v[1] for k, v in line.items()},
                "slope_ratio": line["measured"][0] / line["predicted"][0],
            }
        )
    return out


def print_pairs(pairs: list[dict[str, Any]]) -> None:
    if not pairs:
        return
    print(
        "TTFT at two prompt lengths: ms per further 1000 prompt tokens (slope) and ms before the "
        "first token (intercept), measured / predicted"
    )
    print(f"{'rows (shortest prompt)':<44} {'prompts':>10} {'slope':>15} {'ratio':>5} intercept")
    for p in pairs:
        s, i = p["ms_per_1000_tokens"], p["intercept_ms"]
        print(
            f"{p['rows'][0]:<44} {p['prompts'][0]:>4}-{p['prompts'][1]:<5} "
            f"{s['measured']:>6.2f} / {s['predicted']:<6.2f} {p['slope_ratio']:5.2f} "
            f"{i['measured']:.2f} / {i['predicted']:.2f}"
        )


def _unit(metric: str) -> str:
    return {"decode_tokens_per_s": "tok/s", "ttft_ms": "ms TTFT", "itl_ms": "ms/token"}[metric]


def print_table(results: list[dict[str, Any]], summ: dict[str, Any], model: str) -> None:
    head = (
        f"{'row':<44} {'hardware':<14} {'tp':>2} {'measured':>10} {'predicted':>10} unit     ratio"
    )
    print(f"predictions on the {model} rate model; ratio = measured time / predicted time")
    print(head)
    for r in results:
        print(
            f"{r['id']:<44} {r['hardware']:<14} {r['tp']:>2} {r['measured']:>10.2f} "
            f"{r['predicted']:>10.2f} {_unit(r['metric']):<8} {r['ratio']:5.2f}"
        )
    print(
        f"median of measured/predicted over {summ['judged']} batch-1 decode and TTFT rows: "
        f"{summ['median_ratio']:.2f} (goal: within {GOAL_MEDIAN:.0%} of 1: "
        f"{'met' if summ['median_goal_met'] else 'missed'})"
    )
    beyond = summ["beyond_1.5x"]
    print(f"rows beyond {GOAL_ROW}x: {len(beyond)}" + (f" ({', '.join(beyond)})" if beyond else ""))
    print_pairs(prefill_pairs(results))
    for r in results:
        print(f"source [{r['id']}]: {r['source']}")


def document(results: list[dict[str, Any]]) -> dict[str, Any]:
    return {"rows": results, "summary": summary(results), "prefill_pairs": prefill_pairs(results)}


def show(results: list[dict[str, Any]], model: str) -> None:
    print_table(results, summary(results), model)


load = load_rows


def main(argv: list[str] | None = None) -> int:
    return published_main(argv, sys.modules[__name__])


if __name__ == "__main__":
    sys.exit(main())
