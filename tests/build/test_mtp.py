"""DeepSeek-V3's multi-token-prediction module (build_graph(..., mtp=True)) against a reference
assembled in this file from transformers' own DeepseekV3 modules (DeepseekV3DecoderLayer,
DeepseekV3RMSNorm, nn.Embedding, nn.Linear) wired as vLLM's deepseek_mtp.py and SGLang's
deepseek_nextn.py run the published weights: logits of the numpy interpreter on a tiny random
checkpoint (prefill and cached decode steps), and the cost pass's matmul FLOPs under
FlopCounterMode on the meta device.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from test_cost_parity_deepseek import WORKLOADS, _models  # noqa: E402
from test_parity_deepseek import BATCH, SEQ, SMALL, Tiny  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_v3  # noqa: E402

import graphllm  # noqa: E402
from graphllm.build.weights import load_weights  # noqa: E402
from graphllm.passes import run  # noqa: E402
from graphllm.passes.cost import scopes_of  # noqa: E402
from graphllm.runtime.interpret import run_graph  # noqa: E402

ATOL, STEPS = 1e-4, 3


class MTPReference(torch.nn.Module):
    """One MTP depth: head(norm(block(eh_proj([enorm(embed(ids)), hnorm(hidden)]))))."""

    def __init__(self, config, layer: int) -> None:
        super().__init__()
        d, eps = config.hidden_size, config.rms_norm_eps
        self.embed_tokens = torch.nn.Embedding(config.vocab_size, d)
        self.enorm = hf_v3.DeepseekV3RMSNorm(d, eps)
        self.hnorm = hf_v3.DeepseekV3RMSNorm(d, eps)
        self.eh_proj = torch.nn.Linear(2 * d, d, bias=False)
        self.block = hf_v3.DeepseekV3DecoderLayer(config, layer)
        self.shared_head = torch.nn.ModuleDict(
            {
                "norm": hf_v3.DeepseekV3RMSNorm(d, eps),
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
        out = {}
        for name, t in self.state_dict().items():
            name = name.removeprefix("block.")
            if name == "mlp.experts.gate_up_proj":  # (E, 2F, d): gate rows, then up rows
                f = t.shape[1] // 2
                for e in range(t.shape[0]):
                    out[f"mlp.experts.{e}.gate_proj.weight"] = t[e, :f]
                    out[f"mlp.experts.{e}.up_proj.weight"] = t[e, f:]
            elif name == "mlp.experts.down_proj":
                for e in range(t.shape[0]):
                    out[f"mlp.experts.{e}.down_proj.weight"] = t[e]
            else:
                out[name] = t
        return {f"model.layers.{layer}.{k}": v.contiguous() for k, v in out.items()}


class TinyMTP:
    """test_parity_deepseek's V3 checkpoint plus an MTP layer written beside it."""

    def __init__(self, base) -> None:
        self.base, model = base, base.model
        self.layer = model.config.num_hidden_layers
        torch.manual_seed(1)
        ref = MTPReference(model.config, self.layer)
        with torch.no_grad():
            for p in ref.parameters():  # fused experts start uninitialised (torch.empty)
                p.copy_((p.ndim == 1) + 0.1 * torch.randn_like(p))  # norms near 1
            ref.block.mlp.gate.e_score_correction_bias.copy_(0.05 * torch.randn(8))
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

    @torch.no_grad()
    def hf(self, ids: np.ndarray, mtp_ids: np.ndarray) -> np.ndarray:
        """The whole sequence through the main model and the reference (no cache)."""
        t = torch.from_numpy(ids)
        hidden = self.base.model.model(input_ids=t).last_hidden_state  # after model.norm
        pos = torch.arange(t.shape[1])[None].expand(t.shape[0], -1)
        pe = self.base.model.model.rotary_emb(hidden, pos)
        mask = torch.full((t.shape[1],) * 2, float("-inf")).triu(1)[None, None]
        return self.ref(torch.from_numpy(mtp_ids), hidden, pe, mask).numpy()


@pytest.fixture(scope="module")
def mtp(tmp_path_factory):
    return TinyMTP(Tiny("v3-noaux", tmp_path_factory.mktemp("v3-mtp")))


def _ids(seed: int, seq: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, SMALL["vocab_size"], (BATCH, seq))


@pytest.mark.parametrize("mla", ["naive", "absorbed"])
def test_mtp_logits_equal_the_reference_prefill_and_cached_steps(mtp, mla):
    ids, mids = _ids(1, SEQ), _ids(2, SEQ)
    ours = mtp.run(ids, mids, mla=mla)
    np.testing.assert_allclose(ours["mtp.1.logits"], mtp.hf(ids, mids), atol=ATOL, rtol=0)
    np.testing.assert_allclose(
        ours["logits"], mtp.base.hf(ids).logits.numpy(), atol=ATOL, rtol=0
    )  # the main model is untouched
    for step in range(STEPS):
        past = {k: v for k, v in ours.items() if k.startswith("present.")}
        assert f"present.{mtp.layer}.key" in past  # the MTP block's own latent cache
        nxt, mnxt = _ids(100 + step, 1), _ids(200 + step, 1)
        ids, mids = np.concatenate([ids, nxt], 1), np.concatenate([mids, mnxt], 1)
        ours = mtp.run(nxt, mnxt, past=past, mla=mla)
        want = mtp.hf(ids, mids)[:, -1:]
        np.testing.assert_allclose(
            ours["mtp.1.logits"], want, atol=ATOL, rtol=0, err_msg=f"step {step}"
        )


def test_mtp_tokens_move_only_their_own_and_later_positions(mtp):
    """Perturbing one position of either token input changes the MTP logits at that position
    and after it only (causal attention is the only mixing, also in the MTP block)."""
    ids, mids = _ids(3, SEQ), _ids(4, SEQ)
    base = mtp.run(ids, mids)["mtp.1.logits"]
    for which in ("main", "mtp"):
        for j in (0, 3, SEQ - 1):
            a, b = ids.copy(), mids.copy()
            x = a if which == "main" else b
            x[:, j] = (x[:, j] + 1) % SMALL["vocab_size"]
            moved = np.abs(mtp.run(a, b)["mtp.1.logits"] - base).max(axis=(0, 2)) > 1e-6
            assert list(moved) == [t >= j for t in range(SEQ)], (which, j)
    g = graphllm.build_graph(mtp.base.cfg, graphllm.Workload(seq_len=SEQ), mtp=True)
    verdicts = run(g, ["tokens"])["tokens"].verdicts
    mixing = {n for n, v in verdicts.items() if v.mixes}
    assert {g[n].op for n in mixing} == {"scores", "softmax", "pv"}
    assert any(n.startswith(f"model.layers.{mtp.layer}.self_attn.core") for n in mixing)


# -- FLOPs: the MTP part of the cost pass == FlopCounterMode on the reference, meta device ----
# (the main model's DeepSeek FLOP parity workloads: prefill, last-position logits, decode, extend)


def _mtp_matmul(workload: dict) -> int:
    cfg, _ = _models("deepseek-v3")  # cut to 2 layers; the MTP layer is layer 2
    g = graphllm.build_graph(cfg, graphllm.Workload(**workload), mtp=True)
    run(g, ["cost"])
    mtp_nodes = [n for n in g.nodes() if any(k == "mtp" for _, k in scopes_of(g, n.name))]
    return round(sum(n.meta["cost"].matmul for n in mtp_nodes if "cost" in n.meta))


def _counted(workload: dict) -> int:
    _, model = _models("deepseek-v3")
    b, t, p = workload["batch"], workload["seq_len"], workload.get("past_len", 0)
    d = model.config.hidden_size

    def step(ref, start: int, n: int, cache, last: bool = False):
        hidden = torch.zeros((b, n, d))
        pe = model.model.rotary_emb(hidden, torch.arange(start, start + n)[None].expand(b, -1))
        mask = torch.zeros((1, 1, n, start + n))
        return ref(torch.zeros((b, n), dtype=torch.long), hidden, pe, mask, last, cache)

    with torch.device("meta"), torch.no_grad():
        ref = MTPReference(model.config, model.config.num_hidden_layers).eval()
        cache = transformers.DynamicCache()  # the MTP layer's own, filled by a prefill of P
        if p:
            step(ref, 0, p, cache)
        counter = FlopCounterMode(display=False)
        with counter:
            step(ref, p, t, cache, last=workload.get("logits") == "last")
    return counter.get_total_flops()


@pytest.mark.parametrize("workload", WORKLOADS.values(), ids=WORKLOADS.keys())
def test_mtp_matmul_flops_equal_flop_counter(workload):
    assert _mtp_matmul(workload) == _counted(workload) > 0


def test_a_checkpoint_without_the_mtp_tensors_is_one_line(tmp_path):
    from click.testing import CliRunner

    from graphllm.cli import main

    base = Tiny("v3-noaux", tmp_path / "ckpt")  # transformers saves no MTP layer
    out = tmp_path / "m.onnx"
    r = CliRunner().invoke(main, ["export", "--weights", str(base.folder), "--mtp", "-o", str(out)])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.output
    assert "has no tensor model.layers.3." in r.stderr and not out.exists()


def test_two_mtp_depths_chain_each_on_the_block_output_before_it():
    from test_cost_parity_deepseek import _config_dict

    from graphllm.models.config import config_from_dict

    d = {**_config_dict("deepseek-v3"), "num_nextn_predict_layers": 2}  # main layers 0-1
    g = graphllm.build_graph(config_from_dict(d, "v3-mtp2"), graphllm.Workload(seq_len=4), mtp=True)
    assert [m["depth"] for m in g.meta["mtp"]] == [1, 2]
    assert g["model.layers.2.hnorm"].inputs[0].node == "model.norm"  # depth 1: the main model's
    assert g["model.layers.3.hnorm"].inputs[0].node == "model.layers.2.mlp_residual"  # depth 2
    assert {"mtp.1.logits", "mtp.2.logits"} <= set(g.outputs)
    p = run(g, ["params"])["params"]
    one = p.mtp // 2
    assert (
        p.mtp == 2 * one
        and one
        == run(
            graphllm.build_graph(
                config_from_dict({**d, "num_nextn_predict_layers": 1}, "v3-mtp1"),
                graphllm.Workload(seq_len=4),
                mtp=True,
            ),
            ["params"],
        )["params"].mtp
    )
