"""A layer's conv state from a first step on either side of the conv's kernel: transformers'
cache pads a step shorter than K to K positions and keeps a longer one's last K, a branch on
the length; the trace records one form for both (graphllm.trace.kernels), so one trace holds
at every length."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")
from graphllm.runtime.interpret import Interpreter
from graphllm.trace.forward import cache_tensors
from graphllm.trace.recurrences import reference_conv_flops
from tests.support.traced import FAMILIES, P, check_traced

SHORT_CONV = FAMILIES["short_conv"]  # LFM3, kernel 7


def _present_states(c, raw, past: int, new: int) -> dict[str, float]:
    """Each conv state the graph writes against transformers' cache after the same step."""
    import torch
    import transformers

    fields = {k: v for k, v in raw.items() if k != "model_type"}
    torch.manual_seed(0)
    cfg = transformers.CONFIG_MAPPING[raw["model_type"]](**fields)
    ref = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    weights = {k: v.detach().float().numpy() for k, v in ref.state_dict().items()}
    ids = np.random.default_rng(1).integers(0, 90, (2, new))
    with torch.no_grad():
        cache = ref(torch.tensor(ids), use_cache=True).past_key_values
    feeds = {"input_ids": ids, "position_ids": np.broadcast_to(np.arange(new), (2, new)).copy()}
    got = Interpreter(c.graph, weights).run({k: v for k, v in feeds.items() if k in c.graph})
    held = {k: t.float().numpy() for k, t, _ in cache_tensors(cache, "present")}
    return {k: float(np.abs(got[k] - held[k]).max()) for k in got if k.endswith("conv_state")}


@pytest.mark.parametrize("new", [1, 5, 7, 9])
def test_a_first_step_shorter_or_longer_than_the_kernel(new):
    """Prefill of 1 to 9 tokens with a kernel of 7: transformers' logits and conv states, its
    FLOPs (its torch conv runs on the K positions a short step is padded to), the state the
    last 7 positions, and the conv and attention what mixes tokens."""
    c = check_traced(SHORT_CONV, 0, new)
    assert c.results["params"].total == c.params
    assert c.results["cost"].flops["matmul"] == c.flops
    assert c.conv_flops == reference_conv_flops(c.graph)
    np.testing.assert_allclose(c.logits, c.want, atol=2e-5, rtol=1e-4)
    g = c.graph
    conv = g["model.layers.0.conv.conv1d"]
    assert conv.attrs["kernel"] == 7 and conv.attrs["padded_to"] == 7
    state = g.type_of(g.outputs["present.0.conv_state"]).dims[-1]
    assert (state.size, state.role, state.positions) == (7, "key_token", ("P+T-7", "P+T"))
    mixing = sorted(c.results["tokens"].to_dict()["mixing_ops"])
    assert mixing == ["causal_conv1d", "pv", "scores", "softmax"]
    assert max(_present_states(c, SHORT_CONV, 0, new).values()) < 1e-5


@pytest.mark.parametrize("new", [1, 5])
def test_a_step_after_a_state(new):
    """After a past the cache prepends its state (no branch): logits, and the conv the step's
    own (padded_to only marks a first step)."""
    c = check_traced(SHORT_CONV, P, new)
    assert c.results["cost"].flops["matmul"] == c.flops
    if new > 1:  # transformers' conv at one token is its own update (no padding to count)
        assert c.conv_flops == reference_conv_flops(c.graph)
    np.testing.assert_allclose(c.logits, c.want, atol=2e-5, rtol=1e-4)
    assert "padded_to" not in c.graph["model.layers.0.conv.conv1d"].attrs


def test_a_short_first_step_of_a_gated_deltanet():
    """Qwen3-Next's conv (kernel 4) through the same cache: a 2-token prefill, once a state
    write of the wrong length."""
    raw = FAMILIES["linear_attention"]
    c = check_traced(raw, 0, 2)
    np.testing.assert_allclose(c.logits, c.want, atol=2e-5, rtol=1e-4)
    assert c.conv_flops == reference_conv_flops(c.graph)
    assert max(_present_states(c, raw, 0, 2).values()) < 1e-5
