"""A sweep's op kinds, as its roofline chart plots them, never run above the device's peak: the
attention matmuls are plotted on the FLOPs flash attention was timed on (the mask's pairs)."""

import pytest

from graphllm.models.config import load_config
from graphllm.models.hardware import load_hardware
from graphllm.models.workload import Workload
from graphllm.report.trace_report import sweep


@pytest.mark.parametrize("attention", ["flash", "naive"])
def test_no_op_kind_runs_above_the_peak(attention):
    hw = load_hardware("h100")
    (row,) = sweep(load_config("llama3-8b"), [Workload(seq_len=2048)], hw, attention)
    timed = {op: e for op, e in row["by_op"].items() if e["seconds"]}
    assert {"scores", "pv", "linear"} <= set(timed)
    for op, e in timed.items():
        assert e["timed_flops"] / e["seconds"] <= hw.peak("bf16"), op
    # flash skips about half of a causal prefill's pairs; the unmasked count stays in `flops`
    scores = row["by_op"]["scores"]
    if attention == "flash":
        assert 0.45 < scores["timed_flops"] / scores["flops"] < 0.55
    else:
        assert scores["timed_flops"] == scores["flops"]
