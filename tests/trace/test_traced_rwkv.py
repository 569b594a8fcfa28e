"""RWKV (transformers' RwkvForCausalLM) traced: the WKV recurrence recorded whole onto the wkv4
rows, its token shift a mixing op, and its cache (a list of five tensors stacked over the layers,
`state`) read and written as one tensor a layer and entry; against transformers' forward (logits,
the state after the step, parameters, FlopCounterMode's FLOPs) in prefill, several tokens after a
past and one, and on onnxruntime; transformers' rescaling of deep models refused."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")
from graphllm.errors import ConfigError
from graphllm.exporters.onnx import export_onnx
from graphllm.ir import STATE
from graphllm.models.workload import Workload
from graphllm.ops import OPS
from graphllm.ops.generic import ensure_row
from graphllm.passes import run
from graphllm.runtime.interpret import Interpreter
from graphllm.trace import traced_graph
from graphllm.trace.forward import cache_argument, cache_of, cache_tensors
from tests.support.traced import P, stored_numel

# three layers: layer 0 (with its pre-LayerNorm) a kind of its own, layer 2 a repeat of layer 1;
# transformers' default rescale_every (6) is past the last layer: a division of the weights by 1
RWKV = dict(
    model_type="rwkv",
    vocab_size=96,
    hidden_size=32,
    attention_hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    context_length=128,
    bos_token_id=0,
    eos_token_id=0,
)
LAYERS, HIDDEN = 3, 32


def _reference(raw: dict):
    import torch
    import transformers

    fields = {k: v for k, v in raw.items() if k != "model_type"}
    torch.manual_seed(0)
    ref = transformers.RwkvForCausalLM(transformers.RwkvConfig(**fields)).eval()
    return ref.requires_grad_(False)


def _against_transformers(past: int, new: int, batch: int) -> dict:
    """The traced graph at (batch, new, past) run by the numpy interpreter beside transformers'
    forward of a random model with its weights: logits, each layer's five state entries after
    the step, FlopCounterMode's FLOPs."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    ref = _reference(RWKV)
    weights = {k: v.detach().float().numpy() for k, v in ref.state_dict().items()}
    rng = np.random.default_rng(0)
    ids, past_ids = rng.integers(0, 96, (batch, new)), rng.integers(0, 96, (batch, past))
    wl = Workload(batch=batch, seq_len=new, past_len=past, dtype="fp32")
    g = traced_graph(RWKV, wl, values=True)
    feeds: dict[str, np.ndarray] = {"input_ids": ids}
    with torch.no_grad():
        cache = cache_of(ref(torch.tensor(past_ids), use_cache=True)) if past else None
        held = {k: t.numpy().copy() for k, t, _ in cache_tensors(cache, "past_key_values")}
        feeds |= {n.name: held[n.name] for n in g.nodes("input") if n.name in held}
        with FlopCounterMode(display=False) as fc:
            out = ref(torch.tensor(ids), **{cache_argument(ref): cache}, use_cache=True)
    got = Interpreter(g, weights).run(feeds)
    after = {k: t.numpy() for k, t, _ in cache_tensors(out.state, "present")}
    return dict(graph=g, got=got, logits=out.logits.numpy(), state=after, fc=fc, ref=ref)


@pytest.mark.parametrize(("past", "new", "batch"), [(0, 5, 2), (P, 5, 2), (P, 1, 1)])
def test_traced_rwkv_equals_transformers(past, new, batch):
    """Logits within 1e-4, every state entry transformers' cache holds after the step, the
    parameter count and FlopCounterMode's (matmul) FLOPs. One token after a past at batch 1:
    transformers broadcasts a one-token step's (B, D) shift state against (B, 1, D) at B > 1."""
    c = _against_transformers(past, new, batch)
    g, res = c["graph"], run(c["graph"], ["verify", "params", "tokens", "cost", "memory"])
    np.testing.assert_allclose(c["got"]["logits"], c["logits"], atol=1e-4, rtol=0)
    assert sorted(k for k in g.outputs if k != "logits") == sorted(c["state"])
    assert len(c["state"]) == 5 * LAYERS
    for k, want in c["state"].items():
        np.testing.assert_allclose(c["got"][k], want, atol=1e-4, rtol=1e-5, err_msg=k)
        assert g.output_role(k) == STATE
    assert res["params"].total == stored_numel(c["ref"])
    assert res["cost"].flops["matmul"] == c["fc"].get_total_flops()
    assert res["memory"].state == 5 * LAYERS * batch * HIDDEN * 4 and res["memory"].kv_cache == 0
    wkv = [n for n in g.nodes() if n.op.startswith("wkv4_")]
    # transformers hands the WKV its cache's num, den and max whenever it keeps a cache
    assert len(wkv) == LAYERS and {n.op for n in wkv} == {"wkv4_scan_state"}
    mixing = res["tokens"].to_dict()["mixing_ops"]
    assert "wkv4_scan_state" in mixing and any(m.endswith(";shift]") for m in mixing)
    assert res["tokens"].depends_on(new - 1) == list(range(past + new))


def test_each_layer_reads_and_writes_its_own_cache_entries():
    """Layer 2 is layer 1's recording written out under its names: its WKV reads its own
    num, den and max (inputs after a past, layer 2's view of the model's start state in a
    prefill), and its state outputs are its own."""
    for past in (0, P):
        g = traced_graph(RWKV, Workload(batch=2, seq_len=5, past_len=past, dtype="fp32"))
        assert g.meta["layer_kinds"] == {"rwkv.blocks.2": "rwkv.blocks.1"}
        wkv = sorted((n for n in g.nodes() if n.op.startswith("wkv4_")), key=lambda n: n.name)
        for i, n in enumerate(wkv):
            assert n.name.startswith(f"rwkv.blocks.{i}.")
            states = [g[r.node] for r in n.inputs[4:]]
            if past:
                assert [s.name for s in states] == [
                    f"past_key_values.{i}.state.{j}" for j in (2, 3, 4)
                ]
            else:  # a select of the layer's column of the stacked start state
                assert all(s.attrs["args"][1:] == (2, i) for s in states), states


def test_the_token_shift_reads_the_position_before():
    """time_shift (ZeroPad2d((0, 0, 1, -1))) moves the tokens by one: output position t reads
    input position t - 1, a mixing op of its own."""
    g = traced_graph(RWKV, Workload(batch=1, seq_len=6, dtype="fp32"))
    shifts = [n for n in g.nodes() if n.op.endswith(";shift]")]
    assert len(shifts) == 2 * LAYERS  # attention's and the feed-forward's
    assert all(n.attrs["shift"] == 1 for n in shifts)
    name = shifts[0].op
    del OPS[name]  # as a process that reads the lowered graph from disk finds it: undeclared
    ensure_row(name)
    lo, hi = OPS[name].relation(shifts[0].attrs, np.arange(6))
    assert list(lo) == list(hi) == [-1, 0, 1, 2, 3, 4]


@pytest.mark.parametrize(("new", "batch"), [(5, 2), (1, 1)])
def test_traced_rwkv_export_equals_transformers(new, batch, tmp_path):
    """One export (made at one token after a past), on onnxruntime: `new` tokens after 4
    cached ones, and all of them from transformers' start state (num = den = 0, max = -1e30),
    against transformers' forward of the whole sequence."""
    import onnxruntime as ort
    import torch

    ref = _reference(RWKV)
    ref.save_pretrained(tmp_path)
    g = traced_graph(RWKV, Workload(batch=1, seq_len=1, past_len=1, dtype="fp32"), values=True)
    export_onnx(g, tmp_path / "m.onnx", weights=tmp_path, ops="decomposed")
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    ids = np.random.default_rng(0).integers(0, 96, (batch, P + new))
    with torch.no_grad():
        want = ref(torch.tensor(ids)).logits.numpy()
        cache = cache_of(ref(torch.tensor(ids[:, :P]), use_cache=True))
    held = {k: t.numpy() for k, t, _ in cache_tensors(cache, "past_key_values")}
    names = [i.name for i in session.get_inputs() if i.name.startswith("past_key_values.")]
    assert sorted(names) == sorted(held)
    for past in (P, 0):
        # the export takes onnxruntime-genai's mask (all the positions); RWKV reads none
        feeds = {"input_ids": ids[:, past:], "attention_mask": np.ones(ids.shape, np.int64)}
        for k in names:  # the start state: zeros, the max entry (state.4) -1e30
            start = np.full_like(held[k], -1e30 if k.endswith(".4") else 0.0)
            feeds[k] = held[k] if past else start
        got = session.run(["logits"], feeds)[0]
        np.testing.assert_allclose(got, want[:, past:], atol=1e-4, rtol=0)


def test_rescaling_at_inference_is_refused():
    """rescale_every at or below the layer count: transformers divides the deeper layers'
    output weights in eval mode and halves the hidden state, which the trace does not model."""
    with pytest.raises(ConfigError, match=r"rescale_every=2 with 3 layers"):
        traced_graph(dict(RWKV, rescale_every=2), Workload(seq_len=4))
    traced_graph(dict(RWKV, rescale_every=0), Workload(seq_len=4))  # off: traced
