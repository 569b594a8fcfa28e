"""Qwen3-Next's MTP layer assembled from transformers' own Qwen3Next modules (Qwen3NextRMSNorm,
Qwen3NextDecoderLayer of a full-attention layer, nn.Linear), wired as vLLM's qwen3_next_mtp.py
runs the checkpoint's mtp.* weights (transformers has no MTP module for it and skips them), and a
tiny Qwen3-Next checkpoint with such a layer written beside it (issue 19)."""

from __future__ import annotations

import numpy as np
import safetensors.torch as safetensors_torch
import torch
from transformers.models.qwen3_next import modeling_qwen3_next as hf_next

import graphllm
from graphllm.build.weights import load_weights
from graphllm.runtime.interpret import run_graph
from tests.support.mtp import reference_logits, unfuse_experts
from tests.support.tiny_models import BATCH


class Qwen3NextMTPReference(torch.nn.Module):
    """norm(block(fc([pre_fc_norm_embedding(embed(ids)), pre_fc_norm_hidden(hidden)]))) through
    the main model's lm_head; `embed` and `head` are the main model's (not this module's
    weights: the checkpoint holds no copy)."""

    def __init__(self, config, embed: torch.nn.Module, head: torch.nn.Module) -> None:
        super().__init__()
        d, eps = config.hidden_size, config.rms_norm_eps
        self.pre_fc_norm_embedding = hf_next.Qwen3NextRMSNorm(d, eps)
        self.pre_fc_norm_hidden = hf_next.Qwen3NextRMSNorm(d, eps)
        self.fc = torch.nn.Linear(2 * d, d, bias=False)
        # Qwen3NextDecoderLayer reads its mixer from layer_types[idx]: the first full-attention
        # index builds the attention + MoE layer mtp.layers.0 is (every layer of these routes)
        idx = config.layer_types.index("full_attention")
        self.layers = torch.nn.ModuleList([hf_next.Qwen3NextDecoderLayer(config, idx)])
        self.layers[0].self_attn.layer_idx = 0  # its own cache, layer 0 of a cache of its own
        self.norm = hf_next.Qwen3NextRMSNorm(d, eps)
        self._shared = (embed, head)  # a tuple: not registered, not in state_dict

    def forward(self, ids, hidden, position_embeddings, mask=None, last=False, cache=None):
        embed, head = self._shared
        e = self.pre_fc_norm_embedding(embed(ids))
        x = self.fc(torch.cat([e, self.pre_fc_norm_hidden(hidden)], dim=-1))
        x = self.layers[0](
            x, position_embeddings=position_embeddings, attention_mask=mask, cache=cache
        )
        x = self.norm(x)
        return head(x[:, -1:] if last else x)

    def checkpoint(self) -> dict[str, torch.Tensor]:
        """The weights under the checkpoint's mtp.* names (experts one tensor each)."""
        return {f"mtp.{k}": v for k, v in unfuse_experts(self.state_dict()).items()}


class TinyQwen3NextMTP:
    """A tiny Qwen3-Next checkpoint (tiny_qwen3_next's case) plus its mtp.* layer beside it."""

    def __init__(self, base) -> None:
        self.base, model = base, base.model
        self.layer = model.config.num_hidden_layers  # the MTP block's cache index in the graph
        torch.manual_seed(1)
        ref = Qwen3NextMTPReference(model.config, model.model.embed_tokens, model.lm_head)
        with torch.no_grad():
            for p in ref.parameters():  # zero-centred norms: 1 + w near 1; experts uninitialised
                p.copy_(0.1 * torch.randn_like(p))
        self.ref = ref.eval()
        safetensors_torch.save_file(ref.checkpoint(), base.folder / "mtp.safetensors")
        self.weights: dict | None = None

    def graph(self, seq: int, past: int = 0, **workload) -> graphllm.Graph:
        wl = graphllm.Workload(batch=BATCH, seq_len=seq, past_len=past, dtype="fp32", **workload)
        return graphllm.build_graph(self.base.cfg, wl, mtp=True)

    def run(self, ids: np.ndarray, mtp_ids: np.ndarray, past: dict | None = None) -> dict:
        kv = [v.shape[2] for k, v in (past or {}).items() if k.endswith((".key", ".value"))]
        g = self.graph(ids.shape[1], max(kv, default=0))
        if self.weights is None:
            self.weights = load_weights(g, self.base.folder)
        return run_graph(g, self.weights, ids, past, extra={"mtp.1.input_ids": mtp_ids})

    def hf(self, ids: np.ndarray, mtp_ids: np.ndarray) -> np.ndarray:
        """The whole sequence through the main model and the reference (no cache)."""
        return reference_logits(self.base, self.ref, ids, mtp_ids)
