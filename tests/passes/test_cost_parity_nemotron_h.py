"""issue 19: Nemotron-H's matmul FLOPs against torch's FlopCounterMode over transformers' own
model on the meta device (sdpa attention, batched_mm experts): Nemotron-3-Nano's and
Nemotron-H-8B's published configs cut to their first layers, prefill (the Mamba2 layers' chunked
form: its five einsums count as matmuls), decode (the recurrent step's bmm) and several tokens
after a past (the chunked form from the carried state).

FlopCounterMode also counts the Mamba2 conv (aten.convolution over T + K - 1 padded outputs),
which graphllm counts as 2K (+1 for its bias) FLOPs per output outside the matmuls: the conv is
left out of the comparison, and checked against its closed form below."""

from __future__ import annotations

import functools
import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from graphllm import Workload, build_graph  # noqa: E402
from graphllm.models.config import PRESETS_DIR, config_from_dict  # noqa: E402
from graphllm.passes import run  # noqa: E402
from tests.support.flop_counter import count_forward  # noqa: E402

# preset -> its first layers (the published pattern's opening)
MODELS = {"nemotron-3-nano-30b-a3b": "MEMEM*", "nemotron-h-8b": "M-M-M-M*"}
WORKLOADS = {
    "prefill-b1-t256": {"batch": 1, "seq_len": 256},
    "prefill-b2-t128-last": {"batch": 2, "seq_len": 128, "logits": "last"},
    "decode-b2-p48": {"batch": 2, "seq_len": 1, "past_len": 48},
    "extend-b1-t8-p40": {"batch": 1, "seq_len": 8, "past_len": 40},
}
DROP = ("model_type", "architectures", "auto_map", "transformers_version", "torch_dtype")


@functools.cache
def _models(preset: str):
    d = json.loads((PRESETS_DIR / f"{preset}.json").read_text(encoding="utf-8"))
    d = {k: v for k, v in d.items() if not k.startswith("_")}
    d |= {"hybrid_override_pattern": MODELS[preset], "num_hidden_layers": len(MODELS[preset])}
    cfg = config_from_dict(dict(d), preset)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(
                "nemotron_h", **{k: v for k, v in d.items() if k not in DROP}
            ),
            attn_implementation="sdpa",
            experts_implementation="batched_mm",
        )
    return cfg, model.eval()


def _conv_flops(counter) -> int:
    counts = counter.get_flop_counts()["Global"]
    return sum(v for k, v in counts.items() if "convolution" in str(k))


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
@pytest.mark.parametrize("preset", sorted(MODELS))
def test_matmul_flops_equal_flop_counter(preset, workload):
    cfg, model = _models(preset)
    wl = WORKLOADS[workload]
    counter = count_forward(model, wl)
    cost = run(build_graph(cfg, Workload(**wl)), ["cost"])["cost"]
    assert cost.flops["matmul"] == counter.get_total_flops() - _conv_flops(counter)


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_the_conv_and_the_scan_against_their_closed_forms(workload):
    """The conv: 2K + 1 per output channel and position (a bias); the scan's matmuls: the
    chunked form's five einsums, or the recurrent step's bmm."""
    cfg, _ = _models("nemotron-3-nano-30b-a3b")
    wl = WORKLOADS[workload]
    g = build_graph(cfg, Workload(**wl))
    run(g, ["cost"])
    b, t, k = wl["batch"], wl["seq_len"], cfg.conv_kernel
    h, p, n, ell = cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.ssm_state_size, cfg.mamba_chunk_size
    conv_dim = cfg.mamba_inner + 2 * cfg.mamba_n_groups * n
    conv = g["backbone.layers.0.mixer.conv1d"].meta["cost"]
    assert conv.flops == (2 * k + 1) * b * t * conv_dim and conv.matmul == 0
    scan = g["backbone.layers.0.mixer.scan"].meta["cost"]
    if t == 1:
        assert scan.matmul == 2 * b * h * p * n
    else:
        c = -(-t // ell)
        assert scan.matmul == 2 * b * h * (
            c * ell * ell * (n + p) + 2 * c * ell * p * n + (c + 1) ** 2 * p * n
        )
    assert scan.flops > scan.matmul  # the elementwise rest, which FlopCounterMode does not see
