"""The node-emitting context the builders share: the config, the workload, the graph being
built and its scopes, the model's dims, and the primitives every block is made of (params,
linears, norms, RoPE, core attention, the MLP).

`Emitter` is below graphllm.build.builder (whose `_Builder` adds the model: embedding, blocks,
head) and the mixer and FFN builders it calls (graphllm.build.mla, moe, delta, mamba, mtp, ...),
which take an Emitter: so they need nothing of the builder but what is declared here, `block`
included (an MTP module holds a whole decoder block).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from graphllm.errors import ConfigError
from graphllm.ir import Dim, Graph, Node, Ref, TensorType
from graphllm.models import rope as rope_mod
from graphllm.models.model_config import ModelConfig
from graphllm.models.quantization import QuantFormat
from graphllm.models.workload import WEIGHT_ONLY, Workload


class Emitter(ABC):
    """What a builder adds nodes with. `positions` is the graph input `position_ids`, which the
    model adds before its first block."""

    positions: Node

    def __init__(
        self,
        cfg: ModelConfig,
        wl: Workload,
        bindings: dict[str, float],
        mla: str = "naive",
        mtp: bool = False,
        stored: Mapping[str, QuantFormat] | None = None,
    ) -> None:
        self.cfg, self.wl = cfg, wl
        self.mla, self.mtp = mla, mtp
        self.stored = stored or {}
        self._rope: dict[tuple[int, Any], tuple[Any, float, Any]] = {}
        self.g = Graph(cfg.name, bindings)
        # name prefix -> the kind of scope it is, for cost roll-ups (a node counts in every
        # scope that prefixes its name)
        self.scopes: dict[str, str] = {}
        self.g.meta["scopes"] = self.scopes
        self.g.meta.update(
            config=cfg,
            workload=wl,
            mla=mla if cfg.is_mla else None,
            act_dtype=wl.act_dtype,  # the matmuls' compute dtype
            stream_dtype=wl.stream_dtype,  # what the ops between them write
            weight_dtype=wl.weight_dtype,
            kv_dtype=wl.kv_dtype,
            quantization=cfg.quantization,
        )
        if cfg.quantization is not None:  # the weights are the checkpoint's, not wl.weight_dtype
            self.g.meta["weight_dtype"] = cfg.quantization.weights.dtype
        small = wl.stream_dtype if wl.weight_dtype in WEIGHT_ONLY else wl.weight_dtype
        self.vector_dtype = small  # 1-D weights (norms, biases) are not quantised
        c = cfg
        self.d = Dim("d", "hidden", c.hidden_size)
        self.vocab = Dim("vocab", "vocab", c.vocab_size)
        self.h = Dim("h", "head", c.num_attention_heads)
        # MHA: each query head has its own K/V head, so K/V carry the query head axis itself
        # (repeat_kv only exists for GQA/MQA, as in HF's repeat_kv)
        self.h_kv = self.h if c.n_rep == 1 else Dim("h_kv", "kv_head", c.num_key_value_heads)
        self.d_h = Dim("d_h", "head_dim", c.head_dim)
        self.d_q = Dim("d_q", "hidden", c.num_attention_heads * c.head_dim)
        self.d_kv = Dim("d_kv", "hidden", c.num_key_value_heads * c.head_dim)

    @abstractmethod
    def block(
        self,
        i: int,
        x: Node,
        kind: str = "layer",
        moe: bool | None = None,
        prefix: str | None = None,
    ) -> Node:
        """Decoder block i, the model's (graphllm.build.builder): what an MTP module holds."""

    # -- primitives ----------------------------------------------------------------------------
    def param(self, name: str, dims: tuple[Dim, ...], kind: str, **attrs: object) -> Node:
        if name in self.stored:  # stored as the caller says (an export's MatMulNBits weight)
            fmt = self.stored[name]
            attrs["stored"] = fmt
            return self.g.add(
                "param", name, (), {"type": TensorType(dims, fmt.dtype), "kind": kind, **attrs}
            )
        q = self.cfg.quantization
        if q is not None:  # as the checkpoint stores it: quantized, or at its own dtype
            fmt = q.format_of(name, kind) if len(dims) > 1 else None
            if fmt is not None:
                attrs["stored"] = fmt
            dt = fmt.dtype if fmt is not None else q.dtype
            return self.g.add(
                "param", name, (), {"type": TensorType(dims, dt), "kind": kind, **attrs}
            )
        # a per-head norm's (heads, head_dim) weight is a vector per head, not a matrix
        matrix = len(dims) > 1 and kind != "norms"
        dt = self.wl.weight_dtype if matrix else self.vector_dtype
        return self.g.add("param", name, (), {"type": TensorType(dims, dt), "kind": kind, **attrs})

    def rope(self, name: str, x: Node | Ref, width: int, layer: int | None = None) -> Node:
        """x (B, heads, T, width) rotated by its positions, pairing channels as the config's
        rope_layout says, with the RoPE of `layer` (a sliding layer's own where the model has
        one); the frequencies are computed once per width and RoPE rather than per layer."""
        c = self.cfg
        rope = c.rope if layer is None else c.rope_of(layer)
        key = (width, rope)
        if key not in self._rope:
            # partial rotary: the frequencies span the rotated channels, and the op rotates as
            # many leading channels as it has frequencies for
            rot = c.rotary_dim if c.rotary_dim and width == c.head_dim else width
            inv = rope_mod.inv_freq(rope, rot, c.max_position_embeddings)
            long = rope_mod.long_inv_freq(rope, rot)
            self._rope[key] = (inv, rope_mod.attention_scaling(rope), long)
        inv, scaling, long = self._rope[key]
        attrs: dict[str, Any] = {"inv_freq": inv, "attention_scaling": scaling}
        if long is not None:
            # longrope: the long frequencies for a call whose largest position reaches the
            # pre-scaling context (transformers' longrope_frequency_update)
            attrs |= {
                "long_inv_freq": long,
                "long_from": rope.original_max_position_embeddings,
            }
        if c.rope_layout == "half":
            return self.g.add("rope", name, (x, self.positions), attrs)
        if c.rotary_dim or long is not None:
            raise ConfigError(
                f"rope_layout {c.rope_layout!r} with partial rotary or longrope is not modelled"
            )
        return self.g.add(
            "rope_pairs", name, (x, self.positions), attrs | {"layout": c.rope_layout}
        )

    def linear(
        self,
        name: str,
        x: Node,
        out: Dim,
        kind: str,
        bias: bool = False,
    ) -> Node:
        w = self.param(f"{name}.weight", (out, x.out.dims[-1]), kind)
        if bias:
            b = self.param(f"{name}.bias", (out,), kind)
            return self.g.add("linear_bias", name, (x, w, b))
        return self.g.add("linear", name, (x, w))

    def layer_norm(self, name: str, x: Node, dim: Dim) -> Node:
        """x through one of the model's own norms: RMSNorm, or the LayerNorm its norm_type
        names (the latent and MTP norms are DeepSeek's RMSNorms)."""
        if self.cfg.norm_type == "rmsnorm":
            return self.rmsnorm(name, x, dim)
        self.scopes[name] = "norms"
        w = self.param(f"{name}.weight", (dim,), "norms")
        return self.g.add("layernorm", name, (x, w), {"eps": self.cfg.rms_norm_eps})

    def rmsnorm(self, name: str, x: Node, dim: Dim, kind: str = "norms") -> Node:
        self.scopes[name] = "norms"
        w = self.param(f"{name}.weight", (dim,), kind)
        attrs = {"eps": self.cfg.rms_norm_eps, "weight_offset": self.cfg.norm_weight_offset}
        return self.g.add("rmsnorm", name, (x, w), attrs)

    def head_norm(self, name: str, x: Node, heads: Dim) -> Node:
        """x (B, heads, T, d_h) through a LayerNorm of each head with its own weight (Cohere)."""
        self.scopes[name] = "norms"
        w = self.param(f"{name}.weight", (heads, self.d_h), "norms")
        return self.g.add("head_layernorm", name, (x, w), {"eps": self.cfg.rms_norm_eps})

    def l2norm(self, name: str, x: Node) -> Node:
        """x (B, heads, T, d_h) over each head's channels, without a weight (Llama 4)."""
        self.scopes[name] = "norms"
        return self.g.add("l2norm", name, (x,), {"eps": self.cfg.rms_norm_eps})

    def act(self, name: str, x: Node) -> Node:
        return self.g.add(self.cfg.hidden_act, name, (x,))

    def core_attention(
        self,
        p: str,
        q: Node,
        k: Node,
        v: Node,
        window: int | None,
        ops: tuple[str, str] = ("scores", "pv"),
        chunk: int | None = None,
    ) -> Node:
        """softmax(mask(Q K^T * scale)) V, per head; scale 1/sqrt(d_h) unless the config sets it."""
        g = self.g
        self.scopes[p] = "core_attention"
        scale = self.cfg.attention_scale or self.cfg.head_dim**-0.5
        s = g.add(ops[0], f"{p}.scores", (q, k))  # (B, h, T, S)
        s = g.add("mul_const", f"{p}.scale", (s,), {"value": scale})
        if self.cfg.attn_logit_softcapping is not None:
            # Gemma 2 caps the scaled scores before the mask, as transformers' eager path does
            cap = {"cap": self.cfg.attn_logit_softcapping}
            s = g.add("softcap", f"{p}.softcap", (s,), cap)
        relation: dict[str, Any] = {"causal": True, "window": window}
        if chunk is not None:  # absent elsewhere, so other families' graphs stay as they were
            relation["chunk"] = chunk
        s = g.add("mask", f"{p}.mask", (s,), relation)
        if self.cfg.attention_sinks:
            # gpt-oss: the sink param lives on the attention module (self_attn.sinks)
            sink = self.param(f"{p.rsplit('.', 1)[0]}.sinks", (self.h,), "attention")
            s = g.add("softmax_sink", f"{p}.softmax", (s, sink))
        else:
            s = g.add("softmax", f"{p}.softmax", (s,))
        return g.add(ops[1], f"{p}.pv", (s, v))  # (B, h, T, d_v)

    # -- feed-forward --------------------------------------------------------------------------
    def mlp(self, p: str, x: Node, width: int | None = None, kind: str = "mlp") -> Node:
        """down(act(gate(x)) * up(x)), or down(act(up(x))) where the MLP is not gated."""
        c, g = self.cfg, self.g
        self.scopes[p] = "shared_expert" if kind == "shared_experts" else "mlp"
        ffn = Dim("ffn", "ffn", width or c.intermediate_size)
        if not c.mlp_gated:  # Nemotron-H's relu^2 MLP
            up = self.linear(f"{p}.up_proj", x, ffn, kind, bias=c.mlp_bias)
            a = self.act(f"{p}.act_fn", up)
            return self.linear(f"{p}.down_proj", a, self.d, kind, bias=c.mlp_bias)
        if c.fused_gate_up:
            two = Dim("2ffn", "ffn", 2 * ffn.size)  # type: ignore[operator]
            gu = self.linear(f"{p}.gate_up_proj", x, two, kind, bias=c.mlp_bias)
            attrs = {"axes": {"f1": ffn, "f2": ffn}, "sizes": [ffn.size, ffn.size]}
            split = g.add("split", f"{p}.gate_up_split", (gu,), attrs)
            gate, up = Ref(split.name, 0), Ref(split.name, 1)
            a = g.add(c.hidden_act, f"{p}.act_fn", (gate,))
        else:
            gate = self.linear(f"{p}.gate_proj", x, ffn, kind, bias=c.mlp_bias)
            up = self.linear(f"{p}.up_proj", x, ffn, kind, bias=c.mlp_bias)
            a = self.act(f"{p}.act_fn", gate)
        m = g.add("mul", f"{p}.mul", (a, up))
        return self.linear(f"{p}.down_proj", m, self.d, kind, bias=c.mlp_bias)
