"""issue 19: Qwen3-Next's matmul FLOPs == torch's FlopCounterMode over transformers' own model on
the meta device (the published config cut to 4 layers: three Gated DeltaNet layers and an
attention layer; sdpa attention, `batched_mm` experts), at T a multiple of the delta rule's
chunk of 64 (transformers' fallback pads T up to one, and counts the padding).

FlopCounterMode counts the causal conv as a convolution (aten.convolution, over T + K - 1
outputs of its padded input), which graphllm counts as 2K per output element outside the
matmuls: the conv is left out of the comparison and checked on its own. The delta rule's
triangular solves and the recurrent step's multiply-and-sum are not matmuls to FlopCounterMode
either; their closed forms are tests/ops/test_delta.py's.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from graphllm import Workload, build_graph  # noqa: E402
from graphllm.ops import OPS, node_flops  # noqa: E402
from graphllm.passes import run  # noqa: E402
from tests.support.flop_counter import count_forward, qwen3_next_models  # noqa: E402

LAYERS = 4
WORKLOADS = {
    "prefill-b1-t64": {"batch": 1, "seq_len": 64},
    "prefill-b2-t128": {"batch": 2, "seq_len": 128},
    "prefill-b1-t64-last": {"batch": 1, "seq_len": 64, "logits": "last"},
    "decode-b2-p40": {"batch": 2, "seq_len": 1, "past_len": 40},
    "extend-b1-t64-p8": {"batch": 1, "seq_len": 64, "past_len": 8},
}


@pytest.mark.parametrize("workload", WORKLOADS.values(), ids=WORKLOADS)
def test_matmul_flops_equal_flop_counter(workload):
    cfg, model = qwen3_next_models(LAYERS)
    counter = count_forward(model, workload)
    by_op = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
    conv = by_op.pop("aten.convolution", 0)
    g = build_graph(cfg, Workload(**workload))
    assert run(g, ["cost"])["cost"].flops["matmul"] == sum(by_op.values())
    # the conv: graphllm's T outputs, 2K FLOPs each; torch's conv1d over its padded input:
    # T + K - 1 outputs from K - 1 zeros each side of a prompt, T + 1 from the K-input state
    # and the new token (causal_conv1d_update), T + 2K - 1 from the K-input state and T new
    # ones padded K - 1 each side
    b, t, k = workload["batch"], workload["seq_len"], cfg.conv_kernel
    convs = [n for n in g.nodes() if OPS[n.op].relation is not None and "conv1d" in n.name]
    channels = convs[0].out.dims[-1].size
    ours = sum(node_flops(g, n)[1] for n in convs)
    assert ours == len(convs) * 2 * k * b * t * channels
    torch_outputs = {"prompt": t + k - 1, "step": t + 1, "extend": t + 2 * k - 1}
    kind = "prompt" if not workload.get("past_len") else "step" if t == 1 else "extend"
    outputs = torch_outputs[kind]
    assert conv == len(convs) * 2 * k * b * outputs * channels
