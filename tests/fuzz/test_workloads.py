"""Workloads a careless or hostile user asks for: sizes past any published model's, on the command
line and in a YAML file's `workload:` section. Each is refused in one line naming the field and
the limit, before a graph is built (so in well under a second, and under the memory limit)."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphllm.errors import GraphllmError
from tests.support.hostile import Case, cases_params, check_case
from tests.support.paths import EXAMPLES

TINY = (EXAMPLES / "tiny.yaml").read_text()
MODEL = ["--model", "llama3-8b"]


def yaml_workload(section: str) -> object:
    """A `make` writing tiny.yaml with its workload section replaced by `section` (YAML lines)."""

    def make(root: Path) -> None:
        model = TINY.split("\nworkload:")[0]
        (root / "w.yaml").write_text(model + "\nworkload:\n" + section + "\n")

    return make


def trace(*args: str) -> list[str]:
    return ["trace", *MODEL, *args]


DIGITS_4000 = "9" * 4000  # parses as an int (Python refuses str <-> int past 4300 digits)
DIGITS_5000 = "9" * 5000

FLAGS = [
    Case("seq-len-1e15", trace("--seq-len", str(10**15)), expect="seq_len (--seq-len) is 1,000,"),
    Case("past-len-1e20", trace("--past-len", str(10**20)), expect="past_len (--past-len)"),
    Case("batch-1e15", trace("-b", str(10**15)), expect="batch (--batch)"),
    Case("seq-len-2-to-63", trace("-t", str(2**63)), expect="at most 16,777,216"),
    Case("seq-len-2-to-64-plus", trace("-t", str(2**64 + 1)), expect="seq_len"),
    Case("key-len", trace("-t", str(10**7), "--past-len", str(10**7)), expect="key length"),
    Case("positions-in-flight", trace("-b", str(2**20), "-t", "2048"), expect="batch x key"),
    Case("query-key-pairs", trace("-b", "16", "-t", str(2**23)), expect="query-key pairs"),
    Case("decode-huge-batch", trace("-b", str(2**24), "-t", "1", "--past-len", "128")),
    Case("seq-len-4000-digits", trace("-t", DIGITS_4000), expect="4000-digit number"),
    Case("seq-len-5000-digits", trace("-t", DIGITS_5000), expect="--seq-len"),
    Case("batch-5000-digits", trace("-b", DIGITS_5000), expect="--batch"),
    Case("past-len-4000-digits", trace("--past-len", DIGITS_4000), expect="past_len"),
    Case("sweep-300-points", trace("-t", ",".join(["8"] * 300)), expect="at most 256"),
    Case("sweep-one-huge", trace("-t", f"128,{10**15}"), expect="seq_len"),
    Case("batch-zero", trace("-b", "0"), expect="--batch"),
    Case("batch-negative", trace("-b", "-4"), expect="--batch"),
    Case("batch-float", trace("-b", "1.5"), expect="--batch"),
    Case("seq-len-negative", trace("-t", "-5"), expect="positive"),
    Case("seq-len-float", trace("-t", "1e15"), expect="--seq-len"),
    Case("past-len-negative", trace("--past-len", "-1"), expect="--past-len"),
    Case(
        "per-op-huge-writes-nothing",
        trace("-t", str(10**15), "--per-op", "csv", "rows.csv"),
        expect="seq_len",
    ),
    Case(
        "plot-huge-writes-nothing",
        trace("-t", f"128,{10**12}", "--plot", "sweep.png"),
        expect="seq_len",
    ),
    Case("partition-seq-len", ["partition", *MODEL, "-t", str(10**15)], expect="seq_len"),
    Case("plan-past-len", ["plan", *MODEL, "-n", "8", "--past-len", str(10**20)], expect="past"),
    Case(
        "render-tokens-batch",
        ["render", *MODEL, "--view", "tokens", "-o", "t.dot", "-b", str(10**15)],
        expect="batch",
    ),
    Case(
        "render-model-seq-len",
        ["render", *MODEL, "--view", "model", "-o", "m.dot", "-t", str(10**15)],
        expect="seq_len",
    ),
    Case(
        "render-tokens-17",
        ["render", *MODEL, "--view", "tokens", "-o", "t.dot", "--tokens", "17"],
        expect="--tokens",
    ),
]


def from_yaml(id: str, section: str, expect: str) -> Case:
    return Case(id, ["trace", "--config", "w.yaml"], make=yaml_workload(section), expect=expect)


YAML = [
    from_yaml("yaml-seq-len-1e15-float", "  seq_len: 1.0e+15", "seq_len must be a positive"),
    from_yaml("yaml-seq-len-1e15-int", f"  seq_len: {10**15}", "seq_len (--seq-len) is"),
    from_yaml("yaml-seq-len-string", '  seq_len: "2048"', "seq_len"),
    from_yaml("yaml-seq-len-nan", "  seq_len: .nan", ".nan is not a finite number"),
    from_yaml("yaml-seq-len-inf", "  seq_len: .inf", ".inf is not a finite number"),
    from_yaml("yaml-seq-len-list", "  seq_len: [8, 16]", "seq_len"),
    from_yaml("yaml-batch-bool", "  batch: true", "batch must be a positive integer, got True"),
    from_yaml("yaml-batch-zero", "  batch: 0", "batch"),
    from_yaml("yaml-past-negative", "  past_len: -3", "past_len must be a non-negative"),
    from_yaml("yaml-past-4000-digits", f"  past_len: {DIGITS_4000}", "an integer of 4,000 digits"),
    from_yaml(
        "yaml-past-negative-digits", f"  past_len: -{DIGITS_4000}", "an integer of 4,000 digits"
    ),
    from_yaml("yaml-positions-in-flight", "  batch: 1048576\n  seq_len: 4096", "batch x key"),
    from_yaml("yaml-logits-long", "  logits: " + "y" * 5000, "5,000 characters"),
    from_yaml("yaml-logits-mapping", "  logits: {a: 1}", "logits"),
    from_yaml("yaml-dtype-long", "  dtype: " + "z" * 5000, "dtype"),
]

CASES = FLAGS + YAML


@pytest.mark.parametrize("case", cases_params(CASES))
def test_refused(case, tmp_path):
    check_case(case, tmp_path)


def test_the_tokens_pass_is_priced(monkeypatch):
    """Its sets are n long, a few dozen alive at once: under less memory than they need it
    refuses in one line instead of running out."""
    from graphllm.build.builder import build_graph
    from graphllm.models.config import load_config
    from graphllm.models.workload import Workload
    from graphllm.passes import run
    from graphllm.passes.tokens import propagation_bytes

    graph = build_graph(load_config("llama3-8b"), Workload(seq_len=4096))
    need = propagation_bytes(4096, exact=False)
    monkeypatch.setattr("graphllm.limits.memory_available", lambda: int(need))
    with pytest.raises(GraphllmError, match=r"tokens pass \(intervals over 4,096 positions\)"):
        run(graph, ["tokens"])
    monkeypatch.setattr("graphllm.limits.memory_available", lambda: int(4 * need))
    assert run(graph, ["tokens"])["tokens"].receptive_field == 4096


def test_exact_sets_are_priced_quadratically():
    from graphllm.passes.tokens import propagation_bytes

    assert propagation_bytes(50_000, exact=True) > 40 * propagation_bytes(5_000, exact=True)
    assert propagation_bytes(50_000, exact=False) < 20 * propagation_bytes(5_000, exact=False)
