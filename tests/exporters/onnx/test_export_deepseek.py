"""The decomposed ONNX export of DeepSeek-V2/V3 == transformers == the numpy interpreter.

The `tiny_deepseek` fixture's checkpoints (V2-Lite greedy, V2 group-limited with yarn, V3 noaux with
correction bias, V3 without rope_interleave), exported by graphllm from the saved folder and run on
onnxruntime: a prefill and cached decode steps fed present -> past, the cache holding the normed
latent as `.key` and the RoPE key as `.value` ([B, 1, S, r]). Both MLA forms (`export_onnx(...,
mla=...)`, `graphllm export --mla`), and V3 with its multi-token-prediction module (`mtp=True`:
inputs `mtp.1.input_ids`, outputs `mtp.1.logits` and the MTP block's cache) against the
interpreter on the `tiny_mtp` fixture's checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from graphllm.build.builder import build_export_graph

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from graphllm.cli import main  # noqa: E402
from graphllm.errors import GraphllmError  # noqa: E402
from graphllm.exporters.onnx import export_onnx  # noqa: E402
from graphllm.exporters.onnx import mla as onnx_mla  # noqa: E402
from graphllm.exporters.onnx.lowering import DECOMPOSED  # noqa: E402
from graphllm.runtime.session import OnnxModel, positions  # noqa: E402
from tests.support.tiny_configs import DEEPSEEK_V3 as V3  # noqa: E402
from tests.support.tiny_deepseek import BATCH, CASES, SEQ, SMALL  # noqa: E402

ATOL, STEPS = 1e-4, 16
MLA_OPS = {
    "naive": {"concat", "latent_heads"},
    "absorbed": {"concat", "split_heads_weight", "absorb_q", "absorb_o", "scores_mqa", "pv_mqa"},
}


class Exported:
    def __init__(self, tiny, mla: str, out: Path) -> None:
        self.tiny, self.mla = tiny, mla
        self.path = out / "model.onnx"
        self.result = export_onnx(
            build_export_graph(tiny.cfg, mla=mla),
            self.path,
            weights=tiny.folder,
            ops="decomposed",
            check=True,
        )
        self.onnx = OnnxModel(self.path, device="cpu")


@pytest.fixture(scope="module")
def exported(tiny_deepseek, tmp_path_factory):
    cache: dict[tuple[str, str], Exported] = {}

    def get(case: str, mla: str) -> Exported:
        if (case, mla) not in cache:
            out = tmp_path_factory.mktemp(f"{case}-{mla}")
            cache[case, mla] = Exported(tiny_deepseek(case), mla, out)
        return cache[case, mla]

    return get


def _ids(seed: int, seq: int = SEQ) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, SMALL["vocab_size"], (BATCH, seq))


def _presents(out: dict) -> dict:
    return {k: v for k, v in out.items() if k.startswith("present.")}


def _close(a: np.ndarray, b: np.ndarray, what: str) -> None:
    np.testing.assert_allclose(a, b, atol=ATOL, rtol=0, err_msg=what)


@pytest.mark.parametrize("mla", ["naive", "absorbed"])
@pytest.mark.parametrize("case", CASES)
def test_prefill_and_cached_decode_steps(exported, case, mla):
    e = exported(case, mla)
    onnx.checker.check_model(str(e.path), full_check=True)
    types = {n.op for n in build_export_graph(e.tiny.cfg, mla=mla).nodes()}
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
    for case in CASES:
        for mla in MLA_OPS:
            for n in build_export_graph(exported(case, mla).tiny.cfg, mla=mla).nodes():
                seen.add(n.op)
                if n.op == "rope_pairs":
                    layouts.add(n.attrs["layout"])
                if n.op == "group_limit":
                    layouts.add(n.attrs["score"])
    # the rows DeepSeek adds to the op table; five lower as the rows they generalise
    ours = {op for op, fn in DECOMPOSED.items() if fn.__module__ == onnx_mla.__name__}
    ours |= {"absorb_q", "absorb_o", "scores_mqa", "pv_mqa", "bias_add"}
    assert len(ours) == 11 and ours <= seen and ours <= set(DECOMPOSED)
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


def test_export_command_takes_mla_absorbed(exported, tmp_path):
    e = exported("v3-noaux", "absorbed")
    out = tmp_path / "absorbed.onnx"
    args = ["export", "--weights", str(e.tiny.folder), "--mla", "absorbed", "-o", str(out)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    names = {n.name for n in onnx.load(str(out)).graph.node}
    assert (
        "model.layers.0.self_attn.q_absorb" in names
        and "model.layers.0.self_attn.kv_heads" not in names
    )
    ids = _ids(5)
    _close(
        OnnxModel(out, device="cpu").forward(ids)["logits"], e.tiny.hf(ids).logits.numpy(), "cli"
    )


@pytest.mark.parametrize("mla", ["naive", "absorbed"])
def test_mtp_export_equals_the_interpreter(tiny_mtp, tmp_path, mla):
    m = tiny_mtp
    path = tmp_path / "mtp.onnx"
    export_onnx(
        build_export_graph(m.base.cfg, mla=mla, mtp=True),
        path,
        weights=m.base.folder,
        ops="decomposed",
    )
    model = onnx.load(str(path))
    assert "mtp.1.input_ids" in {i.name for i in model.graph.input}
    outs = {o.name for o in model.graph.output}
    assert {"mtp.1.logits", f"present.{m.layer}.key", f"present.{m.layer}.value"} <= outs
    ids, mids = _ids(1), _ids(2)
    session = OnnxModel(path, device="cpu")
    with pytest.raises(GraphllmError, match=r"give the token ids of mtp\.1\.input_ids"):
        session.forward(ids)
    ours = session.forward(ids, extra={"mtp.1.input_ids": mids})
    interp = m.run(ids, mids, mla=mla)
    for step in range(STEPS):
        for k in ("logits", "mtp.1.logits", f"present.{m.layer}.key"):
            _close(ours[k], interp[k], f"{k}, step {step}")
        nxt, mnxt = _ids(100 + step, seq=1), _ids(200 + step, seq=1)
        past, ipast = _presents(ours), _presents(interp)
        ours = session.forward(nxt, past=past, extra={"mtp.1.input_ids": mnxt})
        interp = m.run(nxt, mnxt, ipast, mla=mla)


def test_bench_runs_an_mtp_export_and_predicts_the_graph_it_was_built_as(tiny_deepseek, tmp_path):
    from graphllm.models.hardware import load_hardware
    from graphllm.runtime.bench import bench, predict

    cfg = tiny_deepseek("v3-noaux").cfg
    path = tmp_path / "absorbed-mtp.onnx"
    export_onnx(build_export_graph(cfg, mla="absorbed", mtp=True), path, ops="decomposed")
    r = bench(path, prompt_len=6, new_tokens=3, repeats=1, threads=1, hardware="h100")
    h100 = load_hardware("h100")
    as_built = predict(
        cfg, "decomposed", "fp32", "all", 1, 6, 3, h100, {"mla": "absorbed", "mtp": True}
    )
    naive = predict(cfg, "decomposed", "fp32", "all", 1, 6, 3, h100)
    assert (r.predicted_prefill_s, r.predicted_decode_s) == as_built != naive
    tokens = OnnxModel(path, device="cpu").generate(_ids(3), 4)  # the drafts fed along
    assert tokens.shape == (2, 4)


def test_cli_bench_exports_a_deepseek_config_as_asked(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps({**V3, "num_nextn_predict_layers": 1}))
    args = ["bench", "--config", str(tmp_path / "config.json"), "--mla", "absorbed", "--mtp"]
    short = ["--prompt-len", "4", "--new-tokens", "2", "--repeats", "1", "--warmup", "0"]
    r = CliRunner().invoke(main, [*args, *short, "--hardware", "h100", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["lowering"] == "decomposed" and r.stderr == ""  # not a terminal: no chatter
    # the prediction is the absorbed graph with its MTP module: the export was built so
    from graphllm.models.config import config_from_dict
    from graphllm.models.hardware import load_hardware
    from graphllm.runtime.bench import predict

    cfg = config_from_dict({**V3, "num_nextn_predict_layers": 1}, "config")
    h100, build = load_hardware("h100"), {"mla": "absorbed", "mtp": True}
    _, decode = predict(cfg, "decomposed", "fp32", "all", 1, 4, 2, h100, build)
    assert doc["predicted_decode_s"] == pytest.approx(decode, rel=1e-9)
    assert decode != predict(cfg, "decomposed", "fp32", "all", 1, 4, 2, h100)[1]
