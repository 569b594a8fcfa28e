"""The traced frontend against transformers itself: a tiny random model of a config, its weights,
and what its forward gives (logits, cache, FlopCounterMode's count), prefill and decode."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from graphllm.ir import CACHE, Graph
from graphllm.models.workload import Workload
from graphllm.passes import run
from graphllm.runtime.interpret import Interpreter
from graphllm.trace import traced_graph
from graphllm.trace.forward import cache_argument, cache_of, cache_tensors, handed_cache
from graphllm.trace.recurrences import reference_conv_flops

B, T, P = 2, 5, 4
# tiny configs of each kind, as transformers' config classes take them
TINY = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
# DeepSeek's attention, tiny: every head its own latent-derived K and V
MLA = dict(
    {k: v for k, v in TINY.items() if k != "head_dim"},
    num_key_value_heads=4,
    kv_lora_rank=16,
    q_lora_rank=24,
    qk_rope_head_dim=4,
    qk_nope_head_dim=8,
    v_head_dim=8,
    first_k_dense_replace=2,
    n_routed_experts=4,
    num_experts_per_tok=2,
)
FAMILIES = {
    "dense": dict(TINY, model_type="llama"),
    "qk_norm": dict(TINY, model_type="qwen3"),
    "sliding": dict(TINY, model_type="mistral", sliding_window=64),
    "moe": dict(
        TINY, model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16
    ),
    # Gated DeltaNet (with its causal conv) and full attention, a layer each; dense MLPs
    # (mlp_only_layers), whose checkpoint names are the model's
    "linear_attention": dict(
        TINY,
        model_type="qwen3_next",
        layer_types=["linear_attention", "full_attention"],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        mlp_only_layers=[0, 1],
    ),
    # Mamba2 (its chunked scan and causal conv), attention and MLP layers (Nemotron-H)
    "mamba2": dict(
        TINY,
        model_type="nemotron_h",
        layers_block_type=["mamba", "attention", "mlp"],
        mamba_num_heads=4,
        mamba_head_dim=8,
        ssm_state_size=8,
        n_groups=1,
        chunk_size=16,
    ),
    # LFM3's short conv (kernel 7: a 5-token prefill is shorter, which transformers' cache pads)
    # beside full attention
    "short_conv": dict(TINY, model_type="lfm3", layer_types=["conv", "full_attention"]),
    # MLA: latent KV with a decoupled RoPE key, written into its key in two parts in place
    # (k[..., :nope].copy_(k_nope)); dense MLPs (first_k_dense_replace)
    "mla": dict(MLA, model_type="deepseek_v3", n_group=1, topk_group=1),
    # RoPE as complex products (torch.polar, view_as_complex): DeepSeek-V2's MLA, dense
    "complex_rope": dict(MLA, model_type="deepseek_v2"),
    # Llama 4: complex RoPE, chunked attention (its mask closes over per-sequence padding),
    # layers without RoPE, and its experts, which transformers computes for every token
    "chunked_complex_rope": dict(
        TINY,
        model_type="llama4_text",
        attention_chunk_size=64,
        num_local_experts=4,
        num_experts_per_tok=1,
        intermediate_size_mlp=64,
        no_rope_layers=[1, 0],
    ),
    # attention computed by the model's own code, adding the mask to its scores (XGLM)
    "own_attention": dict(
        model_type="xglm",
        vocab_size=96,
        d_model=32,
        num_layers=2,
        attention_heads=4,
        ffn_dim=64,
        max_position_embeddings=512,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    ),
    # attention computed by the model's own code for eager's mask, cast to bool (True where a
    # key is masked) and filled there (MPT, with ALiBi)
    "own_attention_filled": dict(
        model_type="mpt",
        vocab_size=96,
        d_model=32,
        n_heads=4,
        n_layers=2,
        expansion_ratio=2,
        max_seq_len=512,
    ),
    # Doge's dynamic mask attention: a bias a key (from its values) where the mask allows, the
    # minimum where not, handed to the attention as its mask (below keep_window_size keys)
    "dynamic_mask": dict(TINY, model_type="doge", keep_window_size=64),
    # a LayerNorm with neither weight nor bias (the model passes None for both)
    "layernorm_no_affine": {
        k: v for k, v in dict(TINY, model_type="olmo").items() if k != "head_dim"
    },
    # starcoder2 has no head_dim field: hidden / heads
    "layernorm_bias": {
        k: v
        for k, v in dict(TINY, model_type="starcoder2", sliding_window=64).items()
        if k != "head_dim"
    },
}


@dataclass
class Checked:
    graph: Graph
    results: Any
    logits: np.ndarray
    want: np.ndarray
    flops: int  # FlopCounterMode's, less its convolutions
    conv_flops: int  # FlopCounterMode's convolutions
    params: int


def stored_numel(ref: Any) -> int:
    """What a checkpoint of `ref` holds: its parameters and persistent buffers, a tied tensor
    once."""
    return sum(t.numel() for t in {t.data_ptr(): t for t in ref.state_dict().values()}.values())


def assert_recurrent_equal(c: Checked, new: int) -> None:
    """A traced recurrent model's parameters, matmul FLOPs (FlopCounterMode), its convs' FLOPs
    (transformers' padded torch code) and logits within 1e-4 equal transformers'."""
    assert c.results["params"].total == c.params
    assert c.results["cost"].flops["matmul"] == c.flops
    if new > 1:  # transformers' conv at one token is its own update (no padding to count)
        assert c.conv_flops == reference_conv_flops(c.graph)
    np.testing.assert_allclose(c.logits, c.want, atol=1e-4, rtol=0)


def check_traced(raw: dict[str, Any], past: int = 0, new: int = T, batch: int = B) -> Checked:
    """Trace `raw` at B=`batch`, T=`new` (after `past` cached tokens) and run it beside
    transformers' eager forward of a random model with the same weights."""
    import torch
    import transformers
    from torch.utils.flop_counter import FlopCounterMode

    fields = {k: v for k, v in raw.items() if k != "model_type"}
    cfg = transformers.CONFIG_MAPPING[raw["model_type"]](**fields)
    torch.manual_seed(0)
    if hasattr(cfg, "_experts_implementation"):  # the traced one's: FlopCounterMode counts it
        cfg._experts_implementation = "batched_mm"
    ref = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    # FlopCounterMode's module tracker fails on a parameter handed to a kernel-tagged function
    # (itself a module) that still asks for a gradient
    ref.requires_grad_(False)
    # the state dict: parameters and the persistent buffers a checkpoint holds beside them
    weights = {k: v.detach().float().numpy() for k, v in ref.state_dict().items()}
    vocab = ref.get_output_embeddings().weight.shape[0]
    rng = np.random.default_rng(0)
    ids, past_ids = rng.integers(0, vocab, (batch, new)), rng.integers(0, vocab, (batch, past))
    wl = Workload(batch=batch, seq_len=new, past_len=past, dtype="fp32")
    g = traced_graph(raw, wl, values=True)
    res = run(g, ["verify", "params", "tokens", "cost", "memory"])
    feeds: dict[str, np.ndarray] = {"input_ids": ids}
    positions = np.broadcast_to(np.arange(past, past + new), (batch, new)).copy()
    with torch.no_grad():
        cache = past_cache(ref, past_ids) if past else None
        held = {k: t for k, t, _ in carried(ref, cache)} if past else {}
        for n in g.nodes("input"):
            if n.name == "position_ids":
                feeds[n.name] = positions
            elif n.name in held:
                feeds[n.name] = held[n.name].float().numpy().copy()
        with FlopCounterMode(display=False) as fc:
            kw = {"position_ids": torch.tensor(positions)} if "position_ids" in feeds else {}
            want = (
                ref(torch.tensor(ids), **{cache_argument(ref): cache}, **kw).logits.float().numpy()
            )
    got = Interpreter(g, weights).run(feeds)["logits"]
    counts = {str(k): v for k, v in fc.get_flop_counts()["Global"].items()}
    conv = counts.pop("aten.convolution", 0)
    return Checked(g, res, got, want, sum(counts.values()), conv, stored_numel(ref))


def past_cache(ref: Any, past_ids: Any) -> Any:
    """transformers' cache after `past_ids`: the one its output carries, or the one it was
    handed, for a model that returns none (RecurrentGemma keeps the one it is handed and its
    recurrent states on its modules)."""
    import torch

    handed = handed_cache(ref)
    kw = {} if handed is None else {cache_argument(ref): handed}
    out = ref(torch.tensor(past_ids), use_cache=True, **kw)
    return cache_of(out) if handed is None else handed


def carried(ref: Any, cache: Any) -> list[tuple[str, Any, str]]:
    """(name, tensor, role) of what `ref` carries to its next step: its cache's tensors, and
    the states its modules keep beside a cache it was handed."""
    holder = None if handed_cache(ref) is None else ref
    return cache_tensors(cache, "past_key_values", holder)


def onnx_against_transformers(
    raw: dict[str, Any], folder: Any, new: int = T
) -> tuple[float, float]:
    """Export the traced model with the weights of a random transformers model saved in
    `folder`, run `new` tokens on onnxruntime after 4 cached tokens, and all of them from an
    empty cache, and return the largest logit difference to transformers' of each (decode,
    prefill)."""
    import onnxruntime as ort
    import torch
    import transformers

    from graphllm.exporters.onnx import export_onnx

    fields = {k: v for k, v in raw.items() if k != "model_type"}
    cfg = transformers.CONFIG_MAPPING[raw["model_type"]](**fields)
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    ref.save_pretrained(folder)
    g = traced_graph(raw, Workload(batch=1, seq_len=1, past_len=1, dtype="fp32"), values=True)
    path = str(folder / "model.onnx")
    export_onnx(g, path, weights=folder, ops="decomposed")
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    vocab = ref.get_output_embeddings().weight.shape[0]
    ids = np.random.default_rng(0).integers(0, vocab, (B, P + new))
    with torch.no_grad():
        want = ref(torch.tensor(ids)).logits.numpy()
        cache = past_cache(ref, ids[:, :P])
    diffs = []
    for past in (P, 0):
        feeds = {
            "input_ids": ids[:, past:],
            "position_ids": np.broadcast_to(np.arange(past, P + new), (B, P + new - past)).copy(),
            "attention_mask": np.ones((B, P + new), np.int64),
        }
        held = {k: (t, role) for k, t, role in carried(ref, cache)}
        for i in session.get_inputs():
            if i.name in held:
                t, role = held[i.name]
                # no past: no keys (none along the input's past axis), and a recurrent
                # layer's states at their start, zeros
                axis = [d.name for d in g[i.name].out.dims].index("P") if role == CACHE else 0
                empty = np.take(t.numpy(), [], axis) if role == CACHE else np.zeros_like(t.numpy())
                feeds[i.name] = t.numpy() if past else empty
        names = {i.name for i in session.get_inputs()}
        got = session.run(["logits"], {k: v for k, v in feeds.items() if k in names})[0]
        diffs.append(float(np.abs(got - want[:, past:]).max()))
    return diffs[0], diffs[1]
