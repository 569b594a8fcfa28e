"""DeepSeek-V3's multi-token-prediction module assembled from transformers' own DeepseekV3
modules (DeepseekV3DecoderLayer, DeepseekV3RMSNorm, nn.Embedding, nn.Linear) wired as vLLM's
deepseek_mtp.py and SGLang's deepseek_nextn.py run the published weights, and a tiny V3
checkpoint with such an MTP layer written beside it (the `tiny_mtp` fixture)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import safetensors.torch as safetensors_torch
import torch
import transformers
from torch.utils.flop_counter import FlopCounterMode
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_v3

import graphllm
from graphllm.build.weights import load_weights
from graphllm.passes import run
from graphllm.passes.cost import scopes_of
from graphllm.runtime.interpret import run_graph
from tests.support.tiny_models import BATCH, presents


class MTPReference(torch.nn.Module):
    """One MTP depth: head(norm(block(eh_proj([enorm(embed(ids)), hnorm(hidden)]))))."""

    def __init__(
        self,
        config,
        layer: int,
        block_cls: type = hf_v3.DeepseekV3DecoderLayer,
        norm_cls: type = hf_v3.DeepseekV3RMSNorm,
    ) -> None:
        # issue 18: GLM-4.5's MTP layer is the same module of Glm4MoeDecoderLayer and
        # Glm4MoeRMSNorm (vLLM's glm4_moe_mtp.py, SGLang's glm4_moe_nextn.py)
        super().__init__()
        d, eps = config.hidden_size, config.rms_norm_eps
        self.embed_tokens = torch.nn.Embedding(config.vocab_size, d)
        self.enorm = norm_cls(d, eps)
        self.hnorm = norm_cls(d, eps)
        self.eh_proj = torch.nn.Linear(2 * d, d, bias=False)
        self.block = block_cls(config, layer)
        self.shared_head = torch.nn.ModuleDict(
            {
                "norm": norm_cls(d, eps),
                "head": torch.nn.Linear(d, config.vocab_size, bias=False),
            }
        )

    def forward(self, ids, hidden, position_embeddings, mask=None, last=False, cache=None):
        e = self.enorm(self.embed_tokens(ids))
        x = self.eh_proj(torch.cat([e, self.hnorm(hidden)], dim=-1))
        x = self.block(x, attention_mask=mask, position_embeddings=position_embeddings, cache=cache)
        x = x[:, -1:] if last else x
        return self.shared_head["head"](self.shared_head["norm"](x))

    def checkpoint(self, layer: int) -> dict[str, torch.Tensor]:
        """The weights under DeepSeek-V3's checkpoint names (experts one tensor each)."""
        state = {k.removeprefix("block."): t for k, t in self.state_dict().items()}
        return {f"model.layers.{layer}.{k}": v for k, v in unfuse_experts(state).items()}


class TinyMTP:
    """A tiny V3 checkpoint (tiny_deepseek's v3-noaux) plus an MTP layer written beside it."""

    def __init__(self, base, *modules: type) -> None:
        self.base, model = base, base.model
        self.layer = model.config.num_hidden_layers
        torch.manual_seed(1)
        ref = MTPReference(model.config, self.layer, *modules)
        with torch.no_grad():
            for p in ref.parameters():  # fused experts start uninitialised (torch.empty)
                p.copy_((p.ndim == 1) + 0.1 * torch.randn_like(p))  # norms near 1
            bias = ref.block.mlp.gate.e_score_correction_bias
            bias.copy_(0.05 * torch.randn_like(bias))
        self.ref = ref.eval()
        safetensors_torch.save_file(ref.checkpoint(self.layer), base.folder / "mtp.safetensors")
        self.weights: dict | None = None

    def run(self, ids, mtp_ids, past=None, mla: str = "naive") -> dict:
        p = 0 if past is None else next(iter(past.values())).shape[2]
        wl = graphllm.Workload(batch=BATCH, seq_len=ids.shape[1], past_len=p, dtype="fp32")
        g = graphllm.build_graph(self.base.cfg, wl, mla=mla, mtp=True)
        if self.weights is None:
            self.weights = load_weights(g, self.base.folder)
        return run_graph(g, self.weights, ids, past, extra={"mtp.1.input_ids": mtp_ids})

    def hf(self, ids: np.ndarray, mtp_ids: np.ndarray) -> np.ndarray:
        """The whole sequence through the main model and the reference (no cache)."""
        return reference_logits(self.base, self.ref, ids, mtp_ids)


@torch.no_grad()
def reference_logits(
    base, ref: torch.nn.Module, ids: np.ndarray, mtp_ids: np.ndarray
) -> np.ndarray:
    """The whole sequence through the tiny main model `base` then the MTP reference `ref` (no
    cache, causal mask): the MTP logits to match."""
    t = torch.from_numpy(ids)
    hidden = base.model.model(input_ids=t).last_hidden_state  # after model.norm
    pos = torch.arange(t.shape[1])[None].expand(t.shape[0], -1)
    pe = base.model.model.rotary_emb(hidden, pos)
    mask = torch.full((t.shape[1],) * 2, float("-inf")).triu(1)[None, None]
    return ref(torch.from_numpy(mtp_ids), hidden, pe, mask).numpy()


def draw_ids(vocab: int, seed: int, seq: int) -> np.ndarray:
    """BATCH rows of `seq` token ids below `vocab`, seeded."""
    return np.random.default_rng(seed).integers(0, vocab, (BATCH, seq))


def assert_mtp_matches_reference(
    tiny, vocab: int, seq: int, steps: int = 3, atol: float = 1e-4, **run_kw: object
) -> None:
    """`tiny.run`'s MTP logits on a prefill of `seq` tokens and `steps` cached steps == the
    reference's on the whole sequence (`tiny.hf`), its main logits == transformers' own; each
    step's past holds the MTP block's own cache. run_kw go to `tiny.run` (mla=...)."""
    ids, mids = draw_ids(vocab, 1, seq), draw_ids(vocab, 2, seq)
    ours = tiny.run(ids, mids, **run_kw)
    np.testing.assert_allclose(ours["mtp.1.logits"], tiny.hf(ids, mids), atol=atol, rtol=0)
    np.testing.assert_allclose(
        ours["logits"], tiny.base.hf(ids).logits.numpy(), atol=atol, rtol=0
    )  # the main model is untouched
    for step in range(steps):
        past = presents(ours)
        assert f"present.{tiny.layer}.key" in past  # the MTP block's own cache
        nxt, mnxt = draw_ids(vocab, 100 + step, 1), draw_ids(vocab, 200 + step, 1)
        ids, mids = np.concatenate([ids, nxt], 1), np.concatenate([mids, mnxt], 1)
        ours = tiny.run(nxt, mnxt, past=past, **run_kw)
        want = tiny.hf(ids, mids)[:, -1:]
        np.testing.assert_allclose(
            ours["mtp.1.logits"], want, atol=atol, rtol=0, err_msg=f"step {step}"
        )


def assert_mtp_export_matches(
    tiny, path, vocab: int, seq: int, steps: int = 3, atol: float = 1e-4
) -> None:
    """The ONNX export of `tiny`'s main model and MTP layer at `path` (decomposed) == the
    reference's MTP logits on the prefill, and == the interpreter's logits, MTP logits and MTP
    cache over the prefill and `steps` cached steps."""
    from graphllm.build.builder import build_export_graph
    from graphllm.exporters.onnx import export_onnx
    from graphllm.runtime.session import OnnxModel

    graph = build_export_graph(tiny.base.cfg, mtp=True)
    export_onnx(graph, path, weights=tiny.base.folder, ops="decomposed")
    session = OnnxModel(path, device="cpu")
    ids, mids = draw_ids(vocab, 1, seq), draw_ids(vocab, 2, seq)
    ours = session.forward(ids, extra={"mtp.1.input_ids": mids})
    np.testing.assert_allclose(ours["mtp.1.logits"], tiny.hf(ids, mids), atol=atol, rtol=0)
    interp = tiny.run(ids, mids)
    for step in range(steps):
        for k in ("logits", "mtp.1.logits", f"present.{tiny.layer}.key"):
            np.testing.assert_allclose(ours[k], interp[k], atol=atol, rtol=0, err_msg=k)
        nxt, mnxt = draw_ids(vocab, 100 + step, 1), draw_ids(vocab, 200 + step, 1)
        ours = session.forward(nxt, past=presents(ours), extra={"mtp.1.input_ids": mnxt})
        interp = tiny.run(nxt, mnxt, presents(interp))


def assert_mtp_tokens_move_only_later(tiny, ids: np.ndarray, mids: np.ndarray, vocab: int) -> None:
    """Perturbing one position j (first, fourth, last) of either token input, main or MTP,
    changes the MTP logits at positions >= j only. `tiny` runs (ids, mtp_ids) to outputs."""
    seq = ids.shape[1]
    base = tiny.run(ids, mids)["mtp.1.logits"]
    for which in ("main", "mtp"):
        for j in (0, 3, seq - 1):
            a, b = ids.copy(), mids.copy()
            x = a if which == "main" else b
            x[:, j] = (x[:, j] + 1) % vocab
            moved = np.abs(tiny.run(a, b)["mtp.1.logits"] - base).max(axis=(0, 2)) > 1e-6
            assert list(moved) == [t >= j for t in range(seq)], (which, j)


def mtp_mixing(cfg, seq: int) -> tuple[graphllm.Graph, set[str]]:
    """The graph with its MTP layer at T = seq, and the nodes the tokens pass finds mixing."""
    g = graphllm.build_graph(cfg, graphllm.Workload(seq_len=seq), mtp=True)
    verdicts = run(g, ["tokens"])["tokens"].verdicts
    return g, {n for n, v in verdicts.items() if v.mixes}


def mtp_matmul_flops(cfg, workload: dict) -> int:
    """The cost pass's matmul FLOPs of the nodes under the `mtp` scope alone."""
    g = graphllm.build_graph(cfg, graphllm.Workload(**workload), mtp=True)
    run(g, ["cost"])
    mtp_nodes = [n for n in g.nodes() if any(k == "mtp" for _, k in scopes_of(g, n.name))]
    return round(sum(n.meta["cost"].matmul for n in mtp_nodes if "cost" in n.meta))


def counted_mtp_flops(model, make_ref: Callable[[], torch.nn.Module], workload: dict) -> int:
    """FlopCounterMode's FLOPs of one MTP step of the workload, on the meta device: the reference
    make_ref builds (there), its own cache filled first by a prefill of past_len uncounted."""
    b, t, p = workload["batch"], workload["seq_len"], workload.get("past_len", 0)
    d = model.config.hidden_size

    def step(ref, start: int, n: int, cache, last: bool = False):
        hidden = torch.zeros((b, n, d))
        pe = model.model.rotary_emb(hidden, torch.arange(start, start + n)[None].expand(b, -1))
        mask = torch.zeros((1, 1, n, start + n))
        return ref(torch.zeros((b, n), dtype=torch.long), hidden, pe, mask, last, cache)

    with torch.device("meta"), torch.no_grad():
        ref = make_ref().eval()
        cache = transformers.DynamicCache()
        if p:
            step(ref, 0, p, cache)
        counter = FlopCounterMode(display=False)
        with counter:
            step(ref, p, t, cache, last=workload.get("logits") == "last")
    return counter.get_total_flops()


def unfuse_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' fused experts (mlp.experts.gate_up_proj (E, 2F, d), gate rows then up rows,
    and mlp.experts.down_proj) as the published checkpoints store them, one tensor per expert
    and projection; every other tensor as it is (all contiguous, for safetensors)."""
    out = {}
    for name, t in state.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            base, f = name.removesuffix("gate_up_proj"), t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :f]
                out[f"{base}{e}.up_proj.weight"] = t[e, f:]
        elif name.endswith("mlp.experts.down_proj"):
            base = name.removesuffix("down_proj")
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e]
        else:
            out[name] = t
    return {k: v.contiguous() for k, v in out.items()}
