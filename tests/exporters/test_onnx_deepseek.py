"""The decomposed ONNX export of DeepSeek-V2/V3 == transformers == the numpy interpreter.

test_parity_deepseek's tiny checkpoints (V2-Lite greedy, V2 group-limited with yarn, V3 noaux with
correction bias, V3 without rope_interleave), exported by graphllm from the saved folder and run on
onnxruntime: a prefill and cached decode steps fed present -> past, the cache holding the normed
latent as `.key` and the RoPE key as `.value` ([B, 1, S, r]). Both MLA forms: the naive one that
`export_graph` builds, and the absorbed one (its graph swapped in for the export).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

import graphllm  # noqa: E402
from graphllm.exporters import onnx as onnx_export  # noqa: E402
from graphllm.exporters import onnx_mla  # noqa: E402
from graphllm.exporters.onnx import DECOMPOSED, export_onnx  # noqa: E402
from graphllm.runtime import OnnxModel, positions  # noqa: E402


def _parity_module():
    """tests/test_parity_deepseek.py: its tiny cases (one module, however imported)."""
    if "test_parity_deepseek" in sys.modules:
        return sys.modules["test_parity_deepseek"]
    path = Path(__file__).parents[1] / "test_parity_deepseek.py"
    spec = importlib.util.spec_from_file_location("test_parity_deepseek", path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["test_parity_deepseek"] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


parity = _parity_module()
ATOL, BATCH, SEQ, STEPS = 1e-4, parity.BATCH, parity.SEQ, 4
SMALL = parity.SMALL
MLA_OPS = {
    "naive": {"concat", "latent_heads"},
    "absorbed": {"concat", "split_heads_weight", "absorb_q", "absorb_o", "scores_mqa", "pv_mqa"},
}


def _graph_for(mla: str):
    """export_graph, building the `mla` form (export_graph itself builds the naive one)."""

    def build(config, dtype="fp32", logits="all"):
        wl = graphllm.Workload(batch=1, seq_len=1, past_len=1, dtype=dtype, logits=logits)
        return graphllm.build_graph(config, wl, mla=mla)

    return build


class Exported:
    def __init__(self, tiny, mla: str, out: Path) -> None:
        self.tiny, self.mla = tiny, mla
        self.path = out / "model.onnx"
        with mock.patch.object(onnx_export, "export_graph", _graph_for(mla)):
            self.result = export_onnx(
                tiny.cfg, self.path, weights=tiny.folder, ops="decomposed", check=True
            )
        self.onnx = OnnxModel(self.path, device="cpu")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tinies: dict[str, object] = {}
    cache: dict[tuple[str, str], Exported] = {}

    def get(case: str, mla: str) -> Exported:
        if case not in tinies:
            tinies[case] = parity.Tiny(case, tmp_path_factory.mktemp(case))
        if (case, mla) not in cache:
            out = tmp_path_factory.mktemp(f"{case}-{mla}")
            cache[case, mla] = Exported(tinies[case], mla, out)
        return cache[case, mla]

    return get


def _ids(seed: int, seq: int = SEQ) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, SMALL["vocab_size"], (BATCH, seq))


def _presents(out: dict) -> dict:
    return {k: v for k, v in out.items() if k.startswith("present.")}


def _close(a: np.ndarray, b: np.ndarray, what: str) -> None:
    np.testing.assert_allclose(a, b, atol=ATOL, rtol=0, err_msg=what)


@pytest.mark.parametrize("mla", ["naive", "absorbed"])
@pytest.mark.parametrize("case", parity.CASES)
def test_prefill_and_cached_decode_steps(exported, case, mla):
    e = exported(case, mla)
    onnx.checker.check_model(str(e.path), full_check=True)
    types = {n.op for n in _graph_for(mla)(e.tiny.cfg).nodes()}
    assert MLA_OPS[mla] <= types
    ids = _ids(1)
    ours, theirs, interp = e.onnx.forward(ids), e.tiny.hf(ids), e.tiny.run(ids, mla=mla)
    assert ours["logits"].shape == (BATCH, SEQ, SMALL["vocab_size"])
    _close(ours["logits"], theirs.logits.numpy(), "prefill vs transformers")
    _close(ours["logits"], interp["logits"], "prefill vs interpreter")
    for i, layer in enumerate(theirs.cache.layers):  # the latent and the RoPE key, as cached
        _close(ours[f"present.{i}.key"], layer.keys.numpy(), f"layer {i} latent")
        _close(ours[f"present.{i}.value"], layer.values.numpy(), f"layer {i} rope key")
    cache, past = theirs.cache, _presents(interp)
    for step in range(STEPS):
        nxt = _ids(100 + step, seq=1)
        ours = e.onnx.forward(nxt, past=_presents(ours))
        theirs, interp = e.tiny.hf(nxt, past=cache), e.tiny.run(nxt, past=past, mla=mla)
        _close(ours["logits"], theirs.logits.numpy(), f"decode step {step} vs transformers")
        _close(ours["logits"], interp["logits"], f"decode step {step} vs interpreter")
        cache, past = theirs.cache, _presents(interp)
    total = SEQ + STEPS
    assert ours["present.0.key"].shape == (BATCH, 1, total, SMALL["kv_lora_rank"])
    assert ours["present.0.value"].shape == (BATCH, 1, total, SMALL["qk_rope_head_dim"])


@pytest.mark.parametrize("mla", ["naive", "absorbed"])
@pytest.mark.parametrize("case", ["v2-group-yarn", "v3-noaux"])
def test_left_padded_batch(exported, case, mla):
    """Row 1 left-padded by 3: both rows equal transformers, the padded one its prompt alone."""
    e, pad = exported(case, mla), 3
    ids = _ids(2)
    ids[1, :pad] = 0
    mask = np.ones_like(ids)
    mask[1, :pad] = 0
    pos = positions(mask, SEQ)
    ours = e.onnx.forward(ids, mask, pos)
    with torch.no_grad():
        t = torch.from_numpy
        theirs = e.tiny.model(t(ids), attention_mask=t(mask), position_ids=t(pos)).logits.numpy()
    _close(ours["logits"][0], theirs[0], "full row vs transformers")
    _close(ours["logits"][1, pad:], theirs[1, pad:], "padded row vs transformers")
    alone = e.onnx.forward(ids[1:, pad:])["logits"][0]
    _close(ours["logits"][1, pad:], alone, "padded row vs its prompt alone")


def test_the_cases_cover_every_deepseek_row_and_rope_layout(exported):
    seen, layouts = set(), set()
    for case in parity.CASES:
        for mla in MLA_OPS:
            for n in _graph_for(mla)(exported(case, mla).tiny.cfg).nodes():
                seen.add(n.op)
                if n.op == "rope_pairs":
                    layouts.add(n.attrs["layout"])
                if n.op == "group_limit":
                    layouts.add(n.attrs["score"])
    ours = {op for op, fn in DECOMPOSED.items() if fn.__module__ == onnx_mla.__name__}
    assert len(ours) == 11 and ours <= seen
    assert layouts == {"complex", "interleave", "max", "top2"}


def test_io_dims_are_the_latent_cache(exported):
    e = exported("v3-noaux", "naive")
    m = onnx.load(str(e.path))
    dims = {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*m.graph.input, *m.graph.output]
    }
    r, rope = SMALL["kv_lora_rank"], SMALL["qk_rope_head_dim"]
    for i in range(SMALL["num_hidden_layers"]):
        assert dims[f"past_key_values.{i}.key"] == ["batch", 1, "past_sequence_length", r]
        assert dims[f"past_key_values.{i}.value"] == ["batch", 1, "past_sequence_length", rope]
        assert dims[f"present.{i}.key"] == ["batch", 1, "total_sequence_length", r]
        assert dims[f"present.{i}.value"] == ["batch", 1, "total_sequence_length", rope]
