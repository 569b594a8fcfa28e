"""DeepSeek's multi-head latent attention (MLA), as the builder adds it.

MLA: the query comes from one projection or a low-rank pair (down, norm, up); the keys and values
come from one shared latent of kv_lora_rank values per position (after its norm) plus one RoPE key
of qk_rope_head_dim values shared by all heads. The cache holds exactly these two:
`present.{i}.key` is the latent (B, 1, S, kv_lora_rank), `present.{i}.value` the RoPE key
(B, 1, S, qk_rope_head_dim).

- `naive` (transformers' computation): every step expands the whole cached latent through
  kv_b_proj into per-head no-RoPE keys and values, then runs ordinary attention with
  q = [q_nope, q_rope] and k = [k_nope, k_rope repeated over heads].
- `absorbed`: kv_b_proj's key block is folded into the query (q_nope W_uk: the query in latent
  space) and its value block into the output, so attention runs against the cached latent itself
  (one key/value head shared by all query heads) and the latent is never expanded.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphllm.build.dims import B, P, S
from graphllm.build.emit import Emitter
from graphllm.ir import CACHE, Dim, Node, Ref, TensorType
from graphllm.models.model_config import ModelConfig

MLA_FORMS = ("naive", "absorbed")


def _parts(joined: Dim, first: str, second: str) -> dict:
    """A concat's attrs: the joined axis, and what its two parts are (for the diagrams)."""
    return {"axes": {"f": joined}, "parts": (first, second)}


def _split(b: Emitter, name: str, x: Node | Ref, a: Dim, c: Dim) -> tuple[Ref, Ref]:
    attrs = {"axes": {"f1": a, "f2": c}, "sizes": [a.size, c.size]}
    n = b.g.add("split", name, (x,), attrs)
    return Ref(n.name, 0), Ref(n.name, 1)


@dataclass(frozen=True)
class _MlaDims:
    """The axes MLA adds: per-head no-RoPE, RoPE and value widths, the latent's rank, and the
    one head the latent and the RoPE key are (shared by all query heads)."""

    nope: Dim
    rope: Dim
    v: Dim
    rank: Dim
    one: Dim

    @classmethod
    def of(cls, c: ModelConfig) -> _MlaDims:
        return cls(
            Dim("d_nope", "head_dim", c.qk_nope_head_dim),
            Dim("d_rope", "head_dim", c.qk_rope_head_dim),
            Dim("d_v", "head_dim", c.v_head_dim),
            Dim("r_kv", "hidden", c.kv_lora_rank),
            Dim("h_lat", "kv_head", 1),
        )


def mla_attention(b: Emitter, p: str, x: Node, i: int) -> Node:
    """MLA for layer i (scope p = model.layers.i.self_attn), in the builder's `mla` form."""

    c = b.cfg
    b.scopes[p] = "attention"
    dims = _MlaDims.of(c)
    q_nope, q_rope = _query(b, p, x, dims)
    lat, k_rope = _compressed_kv(b, p, x, dims)
    q_rope = b.rope(f"{p}.q_rope", q_rope, c.qk_rope_head_dim)  # (B, h, T, d_rope)
    k_rope = b.rope(f"{p}.k_rope", k_rope, c.qk_rope_head_dim)  # (B, 1, T, d_rope)
    lat, k_rope = _cached(b, p, i, lat, k_rope, dims)
    if b.mla == "absorbed":
        o = _absorbed(b, p, q_nope, q_rope, lat, k_rope, dims)
    else:
        o = _naive(b, p, q_nope, q_rope, lat, k_rope, dims)
    d_o = Dim("d_o", "hidden", c.num_attention_heads * c.v_head_dim)
    o = b.g.add("merge_heads", f"{p}.merge_heads", (o,), {"axes": {"(h e)": d_o}})
    return b.linear(f"{p}.o_proj", o, b.d, "attention")


def _query(b: Emitter, p: str, x: Node, dims: _MlaDims) -> tuple[Ref, Ref]:
    """The query from one projection or down -> norm -> up, split into heads and into its no-RoPE
    and RoPE parts."""
    c = b.cfg
    d_q = b.d_q  # heads x (qk_nope_head_dim + qk_rope_head_dim)
    if c.q_lora_rank:
        r_q = Dim("r_q", "hidden", c.q_lora_rank)
        q = b.linear(f"{p}.q_a_proj", x, r_q, "attention")
        q = b.rmsnorm(f"{p}.q_a_layernorm", q, r_q)
        q = b.linear(f"{p}.q_b_proj", q, d_q, "attention")
    else:
        q = b.linear(f"{p}.q_proj", x, d_q, "attention")
    axes = {"h": b.h, "e": b.d_h}  # d_h = qk_nope_head_dim + qk_rope_head_dim
    q = b.g.add("split_heads", f"{p}.q_heads", (q,), {"axes": axes})  # (B, h, T, d_qk)
    return _split(b, f"{p}.q_split", q, dims.nope, dims.rope)


def _compressed_kv(b: Emitter, p: str, x: Node, dims: _MlaDims) -> tuple[Node, Node]:
    """The latent (normed) and the RoPE key, each one shared head: what the cache holds."""
    c, g, one = b.cfg, b.g, dims.one
    d_a = Dim("d_kv_a", "hidden", c.kv_lora_rank + c.qk_rope_head_dim)
    ckv = b.linear(f"{p}.kv_a_proj_with_mqa", x, d_a, "attention")  # (B, T, r + d_rope)
    lat, k_rope = _split(b, f"{p}.kv_split", ckv, dims.rank, dims.rope)
    lat = g.add("split_heads", f"{p}.latent_head", (lat,), {"axes": {"h": one, "e": dims.rank}})
    lat = b.rmsnorm(f"{p}.kv_a_layernorm", lat, dims.rank)  # (B, 1, T, r)
    axes = {"h": one, "e": dims.rope}
    return lat, g.add("split_heads", f"{p}.k_rope_head", (k_rope,), {"axes": axes})


def _cached(
    b: Emitter, p: str, i: int, lat: Node, k_rope: Node, dims: _MlaDims
) -> tuple[Node, Node]:
    """The latent and RoPE key behind the past ones (decode), set as layer i's cache outputs."""
    g = b.g
    if b.wl.past_len > 0:
        cache = lambda width: TensorType((B, dims.one, P, width), b.wl.kv_dtype)  # noqa: E731
        lat_t = g.add("input", f"past_key_values.{i}.key", (), {"type": cache(dims.rank)})
        rope_t = g.add("input", f"past_key_values.{i}.value", (), {"type": cache(dims.rope)})
        lat = g.add("kv_concat", f"{p}.latent_cache", (lat_t, lat), {"axes": {"s": S}})
        k_rope = g.add("kv_concat", f"{p}.k_rope_cache", (rope_t, k_rope), {"axes": {"s": S}})
    g.set_output(f"present.{i}.key", lat, CACHE)  # (B, 1, S, r)
    g.set_output(f"present.{i}.value", k_rope, CACHE)  # (B, 1, S, d_rope)
    return lat, k_rope


def _kv_b_dims(c: ModelConfig) -> tuple[Dim, Dim]:
    """kv_b_proj's per-head output (no-RoPE key and value) and its whole output width."""
    d_kv = Dim("d_kv_h", "head_dim", c.qk_nope_head_dim + c.v_head_dim)
    width = c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim)
    return d_kv, Dim("d_kv_b", "hidden", width)


def _absorbed(
    b: Emitter, p: str, q_nope: Ref, q_rope: Node, lat: Node, k_rope: Node, dims: _MlaDims
) -> Node:
    """Attention against the latent itself: kv_b_proj's key block folded into the query, its
    value block into the output."""
    c, g = b.cfg, b.g
    d_kv, d_kvb = _kv_b_dims(c)
    w = b.param(f"{p}.kv_b_proj.weight", (d_kvb, dims.rank), "attention")
    axes = {"h": b.h, "f": d_kv, "n": dims.nope, "v": dims.v}
    wn = g.add("split_heads_weight", f"{p}.kv_b_heads", (w,), {"axes": axes})
    w_k, w_v = Ref(wn.name, 0), Ref(wn.name, 1)  # (h, d_nope, r), (h, d_v, r)
    q_lat = g.add("absorb_q", f"{p}.q_absorb", (q_nope, w_k))  # (B, h, T, r)
    d_l = Dim("d_lat", "head_dim", c.kv_lora_rank + c.qk_rope_head_dim)
    q = g.add("concat", f"{p}.q_cat", (q_lat, q_rope), _parts(d_l, "latent query", "RoPE"))
    k = g.add("concat", f"{p}.k_cat", (lat, k_rope), _parts(d_l, "latent", "RoPE"))  # (B,1,S,r+dr)
    o = b.core_attention(f"{p}.core", q, k, lat, None, ("scores_mqa", "pv_mqa"))
    return g.add("absorb_o", f"{p}.o_absorb", (o, w_v))  # (B, h, T, d_v)


def _naive(
    b: Emitter, p: str, q_nope: Ref, q_rope: Node, lat: Node, k_rope: Node, dims: _MlaDims
) -> Node:
    """transformers' computation: the whole cached latent expanded through kv_b_proj into
    per-head keys and values, then ordinary attention."""
    g = b.g
    d_kv, d_kvb = _kv_b_dims(b.cfg)
    kv = b.linear(f"{p}.kv_b_proj", lat, d_kvb, "attention")  # (B, 1, S, h (d_nope + d_v))
    kv = g.add("latent_heads", f"{p}.kv_heads", (kv,), {"axes": {"h": b.h, "e": d_kv}})
    k_nope, v = _split(b, f"{p}.kv_b_split", kv, dims.nope, dims.v)  # (B, h, S, d_nope), (.., d_v)
    k_rep = g.add("repeat_kv", f"{p}.k_rope_repeat", (k_rope,), {"axes": {"h": b.h}})
    k = g.add("concat", f"{p}.k_cat", (k_nope, k_rep), _parts(b.d_h, "no-RoPE", "RoPE"))
    q = g.add("concat", f"{p}.q_cat", (q_nope, q_rope), _parts(b.d_h, "no-RoPE", "RoPE"))
    return b.core_attention(f"{p}.core", q, k, v, None)  # (B, h, T, d_v)
