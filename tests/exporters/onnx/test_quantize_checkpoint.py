"""`export --quantize` of a GPTQ/AWQ checkpoint: MatMulNBits takes its integers as stored.

Each MatMulNBits weight, dequantized by the op's definition ((q - zero point) * scale, the
block of input k being g_idx[k] where g_idx is given), equals the checkpoint's matrix as the
reference reader of tests/support/quantized_checkpoints.py dequantizes it, bit for bit; the
logits equal the interpreter's on the same checkpoint (which dequantizes it).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import numpy_helper

import graphllm
from graphllm.build.builder import build_export_graph
from graphllm.build.weights import load_weights
from graphllm.cli.main import main
from graphllm.errors import ConfigError
from graphllm.exporters.onnx import export_onnx
from graphllm.exporters.onnx.export import read_metadata
from graphllm.exporters.onnx.nbits import Quantization
from graphllm.runtime.interpret import run_graph
from graphllm.runtime.session import OnnxModel
from tests.support import quantized_checkpoints as qc

pytest.importorskip("onnxruntime")

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    **qc.SMALL,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
}


def _gptq(bits: int, group: int, desc_act: bool, sym: bool, fmt: str) -> dict:
    return {"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": desc_act,
            "sym": sym, "checkpoint_format": fmt}  # fmt: skip


CASES = {
    "gptq-v1-asym-g32": _gptq(4, 32, False, False, "gptq"),
    "gptq-v2-sym-g64": _gptq(4, 64, False, True, "gptq_v2"),
    "gptq-v1-g128": _gptq(4, 128, False, False, "gptq"),  # K=64 rows: one padded block
    "gptq-v1-desc-act-g32": _gptq(4, 32, True, False, "gptq"),
    "gptq-v2-desc-act-g64": _gptq(4, 64, True, True, "gptq_v2"),
    "gptq-v2-8bit-g32": _gptq(8, 32, False, True, "gptq_v2"),
    "awq-gemm-g32": {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True,
                     "version": "gemm"},
}  # fmt: skip
IDS = np.random.default_rng(3).integers(0, 128, (2, 9))


def _export(tmp_path, case: str, level: int = 0, ops: str = "auto"):
    folder = tmp_path / "q"
    _, meant = qc.write_quantized(folder, LLAMA, CASES[case])
    q = CASES[case]
    method = f"int{q['bits']}"
    path = tmp_path / "q.onnx"
    quant = Quantization(method, q["group_size"], level)
    export_onnx(build_export_graph(graphllm.load_config(folder)), path, weights=folder,
                quantize=quant, ops=ops)  # fmt: skip
    return folder, meant, path


def _op_dequantized(node, inits) -> np.ndarray:
    """The (N, K) weight a MatMulNBits computes with, by the contrib op's definition."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    n, k, bits, block = attrs["N"], attrs["K"], attrs["bits"], attrs["block_size"]
    packed, scales = inits[node.input[1]], inits[node.input[2]].astype(np.float32)
    if bits == 4:
        q = np.stack([packed & 15, packed >> 4], -1).reshape(n, -1).astype(np.float32)
    else:
        q = packed.reshape(n, -1).astype(np.float32)
    blocks = scales.shape[1]
    zp_name = node.input[3] if len(node.input) > 3 else ""
    if not zp_name:
        zp = np.full((n, blocks), 1 << (bits - 1), np.float32)
    elif inits[zp_name].dtype == np.uint8:
        z = inits[zp_name]
        z = np.stack([z & 15, z >> 4], -1).reshape(n, -1) if bits == 4 else z
        zp = z[:, :blocks].astype(np.float32)
    else:
        zp = inits[zp_name].astype(np.float32)
    g_name = node.input[4] if len(node.input) > 4 else ""
    g = inits[g_name] if g_name else np.arange(k) // block
    rows = np.arange(n)[:, None]
    return (q[:, :k] - zp[rows, g[None, :]]) * scales[rows, g[None, :]]


def _nbits(path):
    model = onnx.load(str(path))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return [nd for nd in model.graph.node if nd.op_type == "MatMulNBits"], inits


@pytest.mark.parametrize("case", CASES)
def test_matmulnbits_weights_are_the_checkpoints_bit_for_bit(tmp_path, case):
    _, meant, path = _export(tmp_path, case)
    nodes, inits = _nbits(path)
    seen = 0
    for node in nodes:
        w = _op_dequantized(node, inits)
        src = node.input[1].removesuffix("_Q4").removesuffix("_Q8")
        if src.endswith("qkv_proj.weight"):  # Q, K and V stacked along N
            scope = src.removesuffix("qkv_proj.weight")
            parts = [meant[f"{scope}{p}_proj.weight"] for p in "qkv"]
            want = np.concatenate(parts)
        elif src in meant:
            want = meant[src]
        else:  # the LM head: float in the checkpoint, quantized here
            continue
        np.testing.assert_array_equal(w, want, err_msg=src)
        seen += 1
    assert seen >= 6  # q/k/v (packed or apart), o, gate, up, down of each of 2 layers
    desc_act = CASES[case].get("desc_act", False)
    with_g = [nd for nd in nodes if len(nd.input) > 4 and nd.input[4]]
    assert bool(with_g) == desc_act
    # a real permutation (in the down_proj's two groups at least), where uint8 zero points
    # would be silently wrong: ours are float
    assert not desc_act or any((np.diff(inits[nd.input[4]]) < 0).any() for nd in with_g)
    assert all(inits[nd.input[3]].dtype == np.float32 for nd in with_g)


def _interpreted(folder) -> np.ndarray:
    cfg = graphllm.load_config(folder)
    wl = graphllm.Workload.with_dtype(batch=2, seq_len=IDS.shape[1], dtype="fp32")
    g = graphllm.build_graph(cfg, wl)
    return run_graph(g, load_weights(g, folder), IDS)["logits"]


# max |Δlogit| against the interpreter on the dequantized checkpoint (logits' std ~0.17), the
# LM head (float in these checkpoints, quantized here) taken as the export has it: at accuracy
# level 0 MatMulNBits dequantizes and runs the fp32 GEMM (measured 1.5e-7 to 2.1e-7); level 4's
# int8 activations (measured 0.004-0.005) take the bound of tests/exporters/onnx/test_quantize.py
@pytest.mark.parametrize("ops", ["decomposed", "ort"])
@pytest.mark.parametrize(
    "case", ["gptq-v1-asym-g32", "gptq-v1-desc-act-g32", "gptq-v2-8bit-g32", "awq-gemm-g32"]
)
def test_logits_equal_the_interpreter_on_the_dequantized_checkpoint(tmp_path, case, ops):
    folder, meant, path = _export(tmp_path, case, 0, ops)
    # the interpreter's LM head: the one the export computes with (quantized from float here)
    nodes, inits = _nbits(path)
    head = next(nd for nd in nodes if nd.input[1].startswith("lm_head"))
    ref_folder = tmp_path / "ref"
    weights = qc.checkpoint_weights(build_export_graph(graphllm.load_config(folder)))
    weights = weights | meant | {"lm_head.weight": _op_dequantized(head, inits)}
    qc.write_dense(ref_folder, LLAMA, weights)
    ref = _interpreted(ref_folder)
    ours = OnnxModel(path, "cpu").forward(IDS)["logits"]
    assert np.abs(ours - ref).max() <= 1e-5
    level4 = tmp_path / "l4"
    level4.mkdir()
    _, _, path4 = _export(level4, case, 4, ops)
    d4 = np.abs(OnnxModel(path4, "cpu").forward(IDS)["logits"] - ref).max()
    assert d4 <= 0.1


def test_the_checkpoints_group_is_the_block_and_a_disagreeing_one_is_refused(tmp_path):
    folder = tmp_path / "q"
    qc.write_quantized(folder, LLAMA, CASES["gptq-v2-sym-g64"])
    g = build_export_graph(graphllm.load_config(folder))
    with pytest.raises(ConfigError, match="groups are 64 inputs: --block-size 32 disagrees"):
        export_onnx(g, tmp_path / "x.onnx", weights=folder, quantize=Quantization("int4", 32))
    with pytest.raises(ConfigError, match="stores 4-bit gptq; --quantize int8"):
        export_onnx(g, tmp_path / "x.onnx", weights=folder, quantize=Quantization("int8", 64))
    cli = CliRunner()
    out = tmp_path / "c.onnx"
    r = cli.invoke(main, ["export", "--weights", str(folder), "-o", str(out), "--quantize", "int4"])
    assert r.exit_code == 0, r.output
    assert "block 64" in r.output
    assert read_metadata(out).quantization == Quantization("int4", 64, 4, False)
    r = cli.invoke(main, ["export", "--weights", str(folder), "-o", str(out), "--quantize",
                          "int4", "--block-size", "128"])  # fmt: skip
    assert r.exit_code == 2 and r.output.strip().count("\n") == 0, r.output
    assert "--block-size 128 disagrees" in r.output


@pytest.mark.parametrize(
    ("qconfig", "says"),
    [
        (_gptq(4, -1, False, False, "gptq"), "group_size -1"),
        (_gptq(8, 32, True, False, "gptq_v2"), "8-bit gptq with desc_act needs float zero"),
    ],
)
def test_what_matmulnbits_cannot_keep_is_refused_in_one_line(tmp_path, qconfig, says):
    folder = tmp_path / "q"
    qc.write_quantized(folder, LLAMA, qconfig)
    out = tmp_path / "c.onnx"
    r = CliRunner().invoke(
        main,
        ["export", "--weights", str(folder), "-o", str(out), "--quantize", f"int{qconfig['bits']}"],
    )
    assert r.exit_code == 2, r.output
    assert says in r.output and r.output.strip().count("\n") == 0, r.output
    assert not out.exists()


def test_qkv_stacked_in_one_op_must_share_their_g_idx(tmp_path):
    def reorder(tensors, dtypes):  # K's inputs in groups of their own order
        name = "model.layers.0.self_attn.k_proj.g_idx"
        tensors[name] = np.ascontiguousarray(tensors[name][::-1])

    folder = tmp_path / "q"
    qc.write_quantized(folder, LLAMA, CASES["gptq-v1-desc-act-g32"], reorder)
    out = tmp_path / "c.onnx"
    args = ["export", "--weights", str(folder), "-o", str(out), "--quantize", "int4"]
    r = CliRunner().invoke(main, [*args, "--ops", "ort"])
    assert r.exit_code == 2 and r.output.strip().count("\n") == 0, r.output
    assert "different g_idx" in r.output and "--ops decomposed" in r.output
    assert not out.exists()
    assert CliRunner().invoke(main, [*args, "--ops", "decomposed"]).exit_code == 0
