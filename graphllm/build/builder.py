"""ModelConfig + Workload -> Graph. Reads like the model: embedding, N blocks, final norm, LM head.

Node names follow the HF module tree (`model.layers.3.self_attn.q_proj`); weights are `param` nodes
named exactly like the checkpoint tensors they hold. Routed experts are stacked along an expert
axis in one param node whose name has `*` where the checkpoint has the expert index.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from fractions import Fraction

import graphllm.ops  # noqa: F401  (the rows of the ops this builder emits)
from graphllm.build.delta import gated_deltanet  # noqa: F401  (registers its MIXERS entry)
from graphllm.build.dims import P_C, P_W, S_C, S_W, T_LAST, B, P, S, T
from graphllm.build.emit import Emitter
from graphllm.build.mamba import mamba_mixer  # noqa: F401  (registers its MIXERS entry)
from graphllm.build.mla import MLA_FORMS, mla_attention
from graphllm.build.moe import moe_ffn
from graphllm.build.mtp import check_mtp, mtp_modules
from graphllm.build.recurrent import MIXERS, conv_bindings
from graphllm.errors import ConfigError
from graphllm.ir import CACHE, Dim, Graph, Node, Ref, TensorType
from graphllm.models.model_config import ModelConfig
from graphllm.models.quantization import QuantFormat
from graphllm.models.workload import Workload


def build_graph(
    config: ModelConfig,
    workload: Workload | None = None,
    mla: str = "naive",
    mtp: bool = False,
    stored: Mapping[str, QuantFormat] | None = None,
) -> Graph:
    """The decoder of `config` as an explicit op graph for `workload` (default: B=1, T=1, P=0).

    `mla` picks how an MLA model (DeepSeek-V2/V3) attends: 'naive' re-expands the cached latent
    every step, as transformers does; 'absorbed' folds the up projections into the query and the
    output (graphllm.build_mla); asking another model for 'absorbed' is a ConfigError. `mtp`
    adds DeepSeek-V3's multi-token-prediction modules after the main model (graphllm.build_mtp);
    a config without them is a ConfigError. `stored` gives params a stored form of their own
    (an export's MatMulNBits weights, by name), over the config's quantization.
    """
    if mla not in MLA_FORMS:
        raise ConfigError(f"mla must be one of {', '.join(MLA_FORMS)}, got {mla!r}")
    if mla != "naive" and not config.is_mla:
        raise ConfigError(
            f"--mla {mla}: {config.name} has no latent attention (MLA: DeepSeek-V2/V3 and Kimi-K2 have it)"
        )
    if mtp:
        check_mtp(config)
    return _Builder(config, workload or Workload(), mla, mtp, stored or {}).build()


def build_export_graph(
    config: ModelConfig,
    dtype: str = "fp32",
    logits: str = "all",
    mla: str = "naive",
    mtp: bool = False,
) -> Graph:
    """The graph an ONNX export lowers: one model for prefill and decode, so the past K/V inputs
    are present (every length stays symbolic in the export). `mla` and `mtp` as in build_graph."""
    wl = Workload(batch=1, seq_len=1, past_len=1, dtype=dtype, logits=logits)
    # an export computes at `dtype`: a quantized checkpoint's weights enter it dequantized
    g = build_graph(replace(config, quantization=None), wl, mla=mla, mtp=mtp)
    # how a checkpoint of this config stores them, for the reader (graphllm.build.weights)
    g.meta["checkpoint_quantization"] = config.quantization
    return g


def _bindings(cfg: ModelConfig, wl: Workload) -> dict[str, float]:
    """The workload's bindings and the sizes the config's layers add to them."""
    bindings: dict[str, float] = dict(wl.bindings())
    if cfg.is_moe:
        # balanced routing: T*k token-expert pairs spread over E experts (need not be whole)
        # a Fraction where E does not divide B*T*k, so the counts over all E experts stay
        # the exact integers B*T*k*... (a float would round them)
        pairs, e = wl.batch * wl.seq_len * cfg.num_experts_per_tok, cfg.num_experts
        bindings["C"] = pairs // e if pairs % e == 0 else Fraction(pairs, e)
    if cfg.sliding_window is not None and "sliding_attention" in cfg.layer_types:
        bindings["P_w"] = min(wl.past_len, cfg.sliding_window - 1)
        bindings["S_w"] = bindings["P_w"] + wl.seq_len
    if cfg.attention_chunk_size is not None and "chunked_attention" in cfg.layer_types:
        bindings["P_c"] = min(wl.past_len, cfg.attention_chunk_size - 1)
        bindings["S_c"] = bindings["P_c"] + wl.seq_len
    if cfg.conv_kernel:  # a conv reads its K-1 carried inputs and the T new
        bindings |= conv_bindings(cfg.conv_kernel, wl.seq_len)
    return bindings


class _Builder(Emitter):
    """The model: embedding, N blocks, final norm, LM head, over the Emitter's primitives."""

    def __init__(
        self,
        cfg: ModelConfig,
        wl: Workload,
        mla: str = "naive",
        mtp: bool = False,
        stored: Mapping[str, QuantFormat] | None = None,
    ) -> None:
        super().__init__(cfg, wl, _bindings(cfg, wl), mla, mtp, stored)

    # -- the model -----------------------------------------------------------------------------
    def build(self) -> Graph:
        c, g = self.cfg, self.g
        ids = g.add("input", "input_ids", (), {"type": TensorType((B, T), "int64")})
        self.positions = g.add("input", "position_ids", (), {"type": TensorType((B, T), "int64")})
        emb = c.embedding_name
        table = self.param(f"{emb}.weight", (self.vocab, self.d), "embedding")
        x = g.add("embedding", emb, (ids, table))
        self.scopes.update({emb: "embedding", "model.embed_scale": "embedding"})
        if c.embedding_multiplier != 1.0:
            # gemma rounds sqrt(d) to the activation dtype; in fp32 it is exact enough
            x = g.add("mul_const", "model.embed_scale", (x,), {"value": c.embedding_multiplier})
        blocks = []
        for i in range(c.num_hidden_layers):
            x = self.block(i, x)
            blocks.append(x.name)
        g.meta["blocks"] = blocks  # each block's output, for per-layer reports
        hidden = x = self.layer_norm(c.final_norm_name, x, self.d)
        if self.wl.logits == "last":
            x = g.add("last_position", "model.last_position", (x,), {"axes": {"l": T_LAST}})
        self.scopes["lm_head"] = "lm_head"
        if c.tie_word_embeddings:
            logits = g.add("linear", "lm_head", (x, table))
        else:
            logits = self.linear("lm_head", x, self.vocab, "lm_head")
        if c.logits_multiplier != 1.0:
            attrs = {"value": c.logits_multiplier}
            logits = g.add("mul_const", "lm_head.logits_multiplier", (logits,), attrs)
        if c.final_logit_softcapping is not None:
            cap = {"cap": c.final_logit_softcapping}
            logits = g.add("softcap", "lm_head.softcap", (logits,), cap)
        g.set_output("logits", logits)
        if self.mtp:
            mtp_modules(self, hidden)
        return g

    def block(
        self,
        i: int,
        x: Node,
        kind: str = "layer",
        moe: bool | None = None,
        prefix: str | None = None,
    ) -> Node:
        """h = x + attn(x); out = h + ffn(h), or out = x + attn(x) + ffn(x) for a parallel block;
        each sub-layer inside the norms the config's BlockLayout names. `kind` is the scope's
        kind (an MTP module's block is not one of the main model's layers); `moe` overrides the
        layer's FFN; `prefix` the names (Qwen3-Next's MTP block is mtp.layers.0, its cache
        still layer i's)."""
        lay, p = self.cfg.block, prefix or f"{self.cfg.layers_prefix}.{i}"
        self.scopes[p] = kind
        if self.cfg.layer_block(i) != "both":
            return self.one_sublayer(i, x, moe)
        a_in = self.norm(p, lay.attention_pre, x)
        a = self.norm(p, lay.attention_post, self.mixer(p, a_in, i))
        a = self.residual_scale(f"{p}.attn_residual_scale", a)
        h = self.g.add("add", f"{p}.attn_residual", (x, a))
        if lay.parallel:
            # beside the attention: the block's input, through its own pre-norm or the attention's
            f_in = self.norm(p, lay.ffn_pre, x) if lay.ffn_pre else a_in
        else:
            f_in = self.norm(p, lay.ffn_pre, h)
        routed = self.cfg.moe_layers[i] if moe is None else moe
        f = moe_ffn(self, p, f_in) if routed else self.mlp(f"{p}.{self.cfg.mlp_name}", f_in)
        f = self.norm(p, lay.ffn_post, f)
        f = self.residual_scale(f"{p}.mlp_residual_scale", f)
        return self.g.add("add", f"{p}.mlp_residual", (h, f))

    def one_sublayer(self, i: int, x: Node, moe: bool | None = None) -> Node:
        """out = x + sub(norm(x)) for a layer that holds its token mixer alone or its
        FFN alone (Nemotron-H), inside the mixer's or the FFN's norms of the BlockLayout."""
        c, lay, p = self.cfg, self.cfg.block, f"{self.cfg.layers_prefix}.{i}"
        if c.layer_block(i) == "mixer":
            a = self.mixer(p, self.norm(p, lay.attention_pre, x), i)
            a = self.residual_scale(f"{p}.attn_residual_scale", self.norm(p, lay.attention_post, a))
            return self.g.add("add", f"{p}.attn_residual", (x, a))
        f_in = self.norm(p, lay.ffn_pre, x)
        routed = c.moe_layers[i] if moe is None else moe
        f = moe_ffn(self, p, f_in) if routed else self.mlp(f"{p}.{c.mlp_name}", f_in)
        f = self.residual_scale(f"{p}.mlp_residual_scale", self.norm(p, lay.ffn_post, f))
        return self.g.add("add", f"{p}.mlp_residual", (x, f))

    def mixer(self, layer: str, x: Node, i: int) -> Node:
        """Layer i's token mixer: attention (`{layer}.<attention_name>`), or the one its layer type
        names in MIXERS (a linear-attention or Mamba layer)."""
        kind = self.cfg.layer_type(i)
        if kind in MIXERS:
            name, build = MIXERS[kind]
            return build(self, f"{layer}.{name}", x, i)
        return self.attention(f"{layer}.{self.cfg.attention_name}", x, i)

    def residual_scale(self, name: str, x: Node) -> Node:
        """A sub-layer's output scaled before its residual add (granite's residual_multiplier;
        x itself where the multiplier is 1, so other families' graphs stay as they were)."""
        m = self.cfg.residual_multiplier
        return x if m == 1.0 else self.g.add("mul_const", name, (x,), {"value": m})

    def norm(self, layer: str, name: str | None, x: Node) -> Node:
        """x through the block's norm `name` (None: the block has no norm there, x itself)."""
        return x if name is None else self.layer_norm(f"{layer}.{name}", x, self.d)

    # -- attention -----------------------------------------------------------------------------
    def attention(self, p: str, x: Node, i: int) -> Node:
        c, g = self.cfg, self.g
        if c.is_mla:
            return mla_attention(self, p, x, i)
        self.scopes[p] = "attention"
        q, k, v, gate = self.qkv(p, x)
        qa = {"axes": {"h": self.h, "e": self.d_h}}
        kva = {"axes": {"h": self.h_kv, "e": self.d_h}}
        q = g.add("split_heads", f"{p}.q_heads", (q,), qa)  # (B, h, T, d_h)
        k = g.add("split_heads", f"{p}.k_heads", (k,), kva)  # (B, h_kv, T, d_h)
        v = g.add("split_heads", f"{p}.v_heads", (v,), kva)  # (B, h_kv, T, d_h)
        q, k = self.positioned(p, q, k, i)
        window = c.sliding_window if c.layer_type(i) == "sliding_attention" else None
        chunk = c.attention_chunk_size if c.layer_type(i) == "chunked_attention" else None
        k, v = self.kv_cache(p, k, v, i, window, chunk)
        if c.n_rep > 1:
            k = g.add("repeat_kv", f"{p}.k_repeat", (k,), {"axes": {"h": self.h}})  # (B, h, S, d_h)
            v = g.add("repeat_kv", f"{p}.v_repeat", (v,), {"axes": {"h": self.h}})
        o = self.core_attention(f"{p}.core", q, k, v, window, chunk=chunk)
        o = g.add("merge_heads", f"{p}.merge_heads", (o,), {"axes": {"(h e)": self.d_q}})
        if gate is not None:
            gate = g.add("sigmoid", f"{p}.gate_act", (gate,))
            o = g.add("mul", f"{p}.output_gate", (o, gate))
        return self.linear(f"{p}.o_proj", o, self.d, "attention", bias=c.o_bias)

    def qkv(self, p: str, x: Node) -> tuple[Node | Ref, Node | Ref, Node | Ref, Node | None]:
        """Q, K and V (B, T, heads x d_h), fused in one projection or apart, normed over the
        projection where the config says; and the output gate where q_proj writes one."""
        c, g = self.cfg, self.g
        gate = None
        if c.fused_qkv:
            d_qkv = Dim("d_qkv", "hidden", self.d_q.size + 2 * self.d_kv.size)  # type: ignore[operator]
            qkv = self.linear(f"{p}.qkv_proj", x, d_qkv, "attention", bias=c.qkv_bias)
            parts = {"f1": self.d_q, "f2": self.d_kv, "f3": self.d_kv}
            sizes = [d.size for d in parts.values()]
            split = g.add("split3", f"{p}.qkv_split", (qkv,), {"axes": parts, "sizes": sizes})
            q, k, v = Ref(split.name, 0), Ref(split.name, 1), Ref(split.name, 2)
        elif c.attn_output_gate:
            # Qwen3-Next: q_proj writes each head's query then its gate
            d_qg = Dim("d_qg", "hidden", 2 * self.d_q.size)  # type: ignore[operator]
            qg = self.linear(f"{p}.q_proj", x, d_qg, "attention", bias=c.qkv_bias)
            e, heads = c.head_dim, c.num_attention_heads
            iq = [h * 2 * e + j for h in range(heads) for j in range(e)]
            ig = [h * 2 * e + e + j for h in range(heads) for j in range(e)]
            sel = {"axes": {"c": self.d_q}, "groups": heads}  # head by head: TP splits heads
            q = g.add("select_blocked", f"{p}.query", (qg,), sel | {"index": iq})
            gate = g.add("select_blocked", f"{p}.gate", (qg,), sel | {"index": ig})
            k = self.linear(f"{p}.k_proj", x, self.d_kv, "attention", bias=c.qkv_bias)
            v = self.linear(f"{p}.v_proj", x, self.d_kv, "attention", bias=c.qkv_bias)
        else:
            q = self.linear(f"{p}.q_proj", x, self.d_q, "attention", bias=c.qkv_bias)
            k = self.linear(f"{p}.k_proj", x, self.d_kv, "attention", bias=c.qkv_bias)
            v = self.linear(f"{p}.v_proj", x, self.d_kv, "attention", bias=c.qkv_bias)
        if c.qk_norm and c.qk_norm_scope == "projection":
            # one norm over all heads' channels (OLMo 2), so it reads the projection whole
            q = self.rmsnorm(f"{p}.q_norm", q, self.d_q)
            k = self.rmsnorm(f"{p}.k_norm", k, self.d_kv)
        return q, k, v, gate

    def positioned(self, p: str, q: Node, k: Node, i: int) -> tuple[Node, Node]:
        """q and k (B, heads, T, d_h) through the per-head norms and layer i's RoPE (or, on a
        NoPE layer, the query's temperature where the config has one)."""
        c, g = self.cfg, self.g
        if c.qk_norm and c.qk_norm_scope == "head":
            q = self.rmsnorm(f"{p}.q_norm", q, self.d_h)
            k = self.rmsnorm(f"{p}.k_norm", k, self.d_h)
        if c.qk_norm and c.qk_norm_scope == "each_head":
            q = self.head_norm(f"{p}.q_norm", q, self.h)
            k = self.head_norm(f"{p}.k_norm", k, self.h_kv)
        if c.rotates(i):  # else a NoPE layer: positions enter through the mask alone
            q = self.rope(f"{p}.q_rope", q, c.head_dim, i)
            k = self.rope(f"{p}.k_rope", k, c.head_dim, i)
            if c.qk_l2_norm:  # Llama 4: after RoPE, and on RoPE layers only
                q = self.l2norm(f"{p}.q_norm", q)
                k = self.l2norm(f"{p}.k_norm", k)
        elif c.temperature_floor_scale:
            attrs = {
                "floor_scale": c.temperature_floor_scale,
                "attn_scale": c.temperature_attn_scale,
            }
            q = g.add("attn_temperature", f"{p}.attn_temperature", (q,), attrs)
        return q, k

    def kv_cache(
        self, p: str, k: Node, v: Node, i: int, window: int | None, chunk: int | None
    ) -> tuple[Node, Node]:
        """K and V after layer i's past ones where the workload has a past, written as the
        outputs present.{i}.key|value (role CACHE); a window or chunked layer's cache rolls."""
        g = self.g
        if self.wl.past_len > 0:
            # a window layer's cache rolls: it holds the last W-1 positions, not all P; a
            # chunked layer's the last C-1 (all a query of the chunk may still need)
            span, rolled = (window, (P_W, S_W)) if chunk is None else (chunk, (P_C, S_C))
            rolls = span is not None and self.wl.past_len > span - 1
            past, keys = rolled if rolls else (P, S)
            kv_t = TensorType((B, self.h_kv, past, self.d_h), self.wl.kv_dtype)
            past_k = g.add("input", f"past_key_values.{i}.key", (), {"type": kv_t})
            past_v = g.add("input", f"past_key_values.{i}.value", (), {"type": kv_t})
            k = g.add("kv_concat", f"{p}.k_cache", (past_k, k), {"axes": {"s": keys}})
            v = g.add("kv_concat", f"{p}.v_cache", (past_v, v), {"axes": {"s": keys}})
        g.set_output(f"present.{i}.key", k, CACHE)
        g.set_output(f"present.{i}.value", v, CACHE)
        span = window if chunk is None else chunk
        if span is not None:
            # what the next step needs of this step's keys: a window's or chunk's last span - 1
            # (a prefill attends over all its T keys, but transformers' cache keeps these)
            keeps = g.meta.setdefault("cache_keeps", {})
            keeps[f"present.{i}.key"] = keeps[f"present.{i}.value"] = span - 1
        return k, v
