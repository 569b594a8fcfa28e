"""Multi-token-prediction (MTP) modules, as the builder adds them with `mtp=True`: DeepSeek-V3's,
and GLM-4.5's of the same layout (vLLM's glm4_moe_mtp.py, SGLang's glm4_moe_nextn.py;
the block is the family's own decoder layer, read from the config like the main model's).

Depth k (1 .. num_nextn_predict_layers) is checkpoint layer L = num_hidden_layers + k - 1 and
predicts the token k + 1 positions ahead. As the serving engines that run the published weights
compute it (vLLM's deepseek_mtp.py, SGLang's deepseek_nextn.py):

    e      = enorm(embed_tokens(mtp.{k}.input_ids))     the layer's own copy of the embedding
    h      = hnorm(h_prev)                               the main model's last hidden state
                                                         *after* model.norm for k = 1 (what
                                                         their DeepseekV2Model returns), depth
                                                         k-1's block output for k > 1
    x      = eh_proj(concat([e, h], hidden axis))
    x_out  = decoder block L (MLA + MoE for V3, its own KV cache `past_key_values.{L}`)
    logits = shared_head.head(shared_head.norm(x_out))   -> output `mtp.{k}.logits`

The token ids of depth k are a graph input (the tokens at positions i + k, which the caller
supplies, as speculative decoding does), so no shift op is needed and the positions are the main
model's. vLLM also zeroes the embedding at position 0 (a position its drafts never use); SGLang
does not, and neither does this graph. Everything of layer L sits in the scope `model.layers.L`
of kind `mtp`, so reports, diagrams and the pipeline (which puts it on the last stage) see it.
"""

from __future__ import annotations

from graphllm.build.dims import T_LAST, B, T
from graphllm.build.emit import Emitter
from graphllm.errors import ConfigError
from graphllm.ir import Dim, Node, TensorType
from graphllm.models.families import FAMILY_TABLE
from graphllm.models.model_config import ModelConfig


def check_mtp(cfg: ModelConfig) -> None:
    """One line when `cfg` has no multi-token-prediction layers to include."""
    if cfg.num_nextn_predict_layers == 0:
        family = FAMILY_TABLE.get(cfg.model_type)
        has_them = family is not None and "num_nextn_predict_layers" in family.fields
        why = (
            "num_nextn_predict_layers is 0"
            if has_them
            else f"{cfg.model_type} has none; DeepSeek-V3, Kimi-K2 and GLM-4.5 have them"
        )
        if family is not None and "num_mtp_modules" in family.fields:
            # MiniMax-M2's config names MTP modules its published checkpoint does not
            # hold (the Hub's count of its tensors is the main model's), nor does any reference
            why = (
                f"{cfg.model_type}'s MTP modules (num_mtp_modules) are not modelled: its "
                "published checkpoint holds no MTP weights and transformers has no MTP module"
            )
        if family is not None and family.mtp_refusal:  # Qwen3-Next's, not yet
            why = family.mtp_refusal
        raise ConfigError(f"--mtp: {cfg.name} has no multi-token-prediction layers ({why})")
    if len(cfg.mtp_moe_layers) != cfg.num_nextn_predict_layers:  # a config built by hand
        raise ConfigError(
            f"--mtp: {cfg.name} says {len(cfg.mtp_moe_layers)} of its "
            f"{cfg.num_nextn_predict_layers} MTP layers are MoE or dense (mtp_moe_layers)"
        )


def mtp_modules(b: Emitter, hidden: Node) -> None:
    """Every MTP depth after the main model; `hidden` is its last hidden state after model.norm."""
    b.g.meta["mtp"] = []
    h = hidden
    for k in range(1, b.cfg.num_nextn_predict_layers + 1):
        h = _depth(b, k, h)


def _depth(b: Emitter, k: int, h_prev: Node) -> Node:
    if b.cfg.mtp_layout == "mtp":
        return _shared_depth(b, k, h_prev)
    c, g = b.cfg, b.g
    i = c.num_hidden_layers + k - 1
    p = f"model.layers.{i}"
    b.scopes[p] = "mtp"
    ids = g.add("input", f"mtp.{k}.input_ids", (), {"type": TensorType((B, T), "int64")})
    table = b.param(f"{p}.embed_tokens.weight", (b.vocab, b.d), "embedding")
    e = g.add("embedding", f"{p}.embed_tokens", (ids, table))
    e = b.rmsnorm(f"{p}.enorm", e, b.d)
    h = b.rmsnorm(f"{p}.hnorm", h_prev, b.d)
    both = Dim("2d", "hidden", 2 * c.hidden_size)
    x = g.add(
        "concat", f"{p}.eh_concat", (e, h), {"axes": {"f": both}, "parts": ("embedding", "hidden")}
    )
    x = b.linear(f"{p}.eh_proj", x, b.d, "mtp_proj")
    first = len(g)
    out = b.block(i, x, kind="mtp", moe=c.mtp_moe_layers[k - 1])
    block = [n.name for n in g.topo()[first:]]
    y = b.rmsnorm(f"{p}.shared_head.norm", out, b.d)
    if b.wl.logits == "last":
        y = g.add("last_position", f"{p}.last_position", (y,), {"axes": {"l": T_LAST}})
    logits = b.linear(f"{p}.shared_head.head", y, b.vocab, "lm_head")
    g.set_output(f"mtp.{k}.logits", logits)
    g.meta["mtp"].append({"depth": k, "prefix": p, "block": block})
    return out


def _shared_depth(b: Emitter, k: int, h_prev: Node) -> Node:
    """Qwen3-Next's MTP layer (mtp_layout "mtp"), as vLLM's qwen3_next_mtp.py runs it: the main
    model's embed_tokens and lm_head (the checkpoint holds no copy of either),
    pre_fc_norm_embedding and pre_fc_norm_hidden, fc over [embedding; hidden], the
    full-attention block mtp.layers.0 (its KV cache past_key_values.{n}), mtp.norm."""
    c, g = b.cfg, b.g
    if k > 1:  # the engines run deeper drafts through the one layer again, not a depth of its own
        raise ConfigError(f"--mtp: {c.name} has one MTP layer (mtp.layers.0), not {k}")
    i, p = c.num_hidden_layers, "mtp"
    b.scopes[p] = "mtp"
    ids = g.add("input", "mtp.1.input_ids", (), {"type": TensorType((B, T), "int64")})
    table = g["model.embed_tokens.weight"]
    e = g.add("embedding", f"{p}.embed_tokens", (ids, table))
    e = b.rmsnorm(f"{p}.pre_fc_norm_embedding", e, b.d)
    h = b.rmsnorm(f"{p}.pre_fc_norm_hidden", h_prev, b.d)
    both = Dim("2d", "hidden", 2 * c.hidden_size)
    parts = {"axes": {"f": both}, "parts": ("embedding", "hidden")}
    x = g.add("concat", f"{p}.fc_concat", (e, h), parts)
    x = b.linear(f"{p}.fc", x, b.d, "mtp_proj")
    first = len(g)
    out = b.block(i, x, kind="mtp", moe=c.mtp_moe_layers[0], prefix=f"{p}.layers.0")
    block = [n.name for n in g.topo()[first:]]
    y = b.rmsnorm(f"{p}.norm", out, b.d)
    if b.wl.logits == "last":
        y = g.add("last_position", f"{p}.last_position", (y,), {"axes": {"l": T_LAST}})
    head = table if c.tie_word_embeddings else g["lm_head.weight"]
    g.set_output("mtp.1.logits", g.add("linear", f"{p}.lm_head", (y, head)))
    g.meta["mtp"].append({"depth": 1, "prefix": p, "block": block})
    return out
