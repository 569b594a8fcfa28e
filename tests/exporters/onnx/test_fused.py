"""The fused lowerings' refusals, the default table, and the limits of onnxruntime's CPU kernels
that the `ort` lowering works around. Their exactness is tested with every other lowering's, per
family, in test_export.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from graphllm.build.builder import build_export_graph

ort = pytest.importorskip("onnxruntime")

import graphllm  # noqa: E402
from graphllm.cli import main  # noqa: E402
from graphllm.exporters.onnx import LOWERINGS, LoweringError, default_lowering, export_onnx, lower  # noqa: E402
from graphllm.exporters.onnx.fused import DEFAULT_LOWERINGS, can_express  # noqa: E402
from graphllm.models.config import list_presets  # noqa: E402
from graphllm.models.families import FAMILY_TABLE  # noqa: E402
from graphllm.runtime.observe import small_instance  # noqa: E402
from tests.support.paths import EXAMPLES  # noqa: E402

TINY = EXAMPLES / "tiny.yaml"


def _small(preset: str):
    """A small instance of a preset with head_dim 16 (GroupQueryAttention's CPU minimum)."""
    return dataclasses.replace(small_instance(graphllm.load_config(preset), 8), head_dim=16)


def _rotations(path: Path) -> tuple[int, list[int]]:
    """RotaryEmbedding nodes, and GroupQueryAttention's do_rotary per node."""
    import onnx

    nodes = onnx.load(str(path)).graph.node
    gqa = [n for n in nodes if n.op_type == "GroupQueryAttention"]
    fused = [next(a.i for a in n.attribute if a.name == "do_rotary") for n in gqa]
    return sum(n.op_type == "RotaryEmbedding" for n in nodes), fused


def test_ort_rotates_before_attention_where_its_kernel_cannot(tmp_path):
    from graphllm.build.weights import random_weights
    from graphllm.runtime.interpret import run_graph
    from graphllm.runtime.session import OnnxModel

    cfg = graphllm.load_config(TINY)  # head_dim 16: rotated inside GroupQueryAttention
    narrow = dataclasses.replace(cfg, name="tiny-hd8", hidden_size=32, head_dim=8)
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 5))
    for c, want in ((cfg, (0, [1, 1])), (narrow, (4, [0, 0]))):
        path = tmp_path / f"{c.name}.onnx"
        export_onnx(build_export_graph(c), path, ops="ort", seed=2)
        assert _rotations(path) == want
        wl = graphllm.Workload.with_dtype(batch=2, seq_len=5, dtype="fp32")
        graph = graphllm.build_graph(c, wl)
        ref = run_graph(graph, random_weights(graph, 2), ids)["logits"]
        ours = OnnxModel(path, device="cpu").forward(ids)["logits"]
        np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)


def _interleaved(path: Path) -> list[tuple[str, int]]:
    """Each rotating node's op and its interleaved flag (RotaryEmbedding's `interleaved`,
    GroupQueryAttention's `rotary_interleaved` where it rotates)."""
    import onnx

    out = []
    for n in onnx.load(str(path)).graph.node:
        a = {x.name: x.i for x in n.attribute}
        if n.op_type == "RotaryEmbedding" or a.get("do_rotary"):
            out.append((n.op_type, a.get("interleaved", a.get("rotary_interleaved", 0))))
    return out


# issue 16: Cohere's RoPE pairs adjacent channels; head_dim 16 rotates inside
# GroupQueryAttention, head_dim 8 by RotaryEmbedding before it; Command R7B's global layers
# (every fourth) are NoPE and rotate nothing
@pytest.mark.parametrize(
    ("preset", "head_dim"), [("command-r", 16), ("command-r", 8), ("command-r7b", 16)]
)
def test_the_fused_lowerings_rotate_adjacent_pairs_interleaved(tmp_path, preset, head_dim):
    cfg = dataclasses.replace(small_instance(graphllm.load_config(preset), 4), head_dim=head_dim)
    assert default_lowering(build_export_graph(cfg)) == "ort"
    rotating = sum(cfg.rope_layers) if cfg.rope_layers else cfg.num_hidden_layers
    assert rotating == cfg.num_hidden_layers - (preset == "command-r7b")
    inside = [("GroupQueryAttention", 1)] * rotating
    want = {
        "standard": [("RotaryEmbedding", 1)] * 2 * rotating,  # q and k
        "ort": inside if head_dim % 16 == 0 else [("RotaryEmbedding", 1)] * 2 * rotating,
    }
    for ops, rotations in want.items():
        path = tmp_path / f"{ops}.onnx"
        export_onnx(build_export_graph(cfg), path, ops=ops, seed=1)
        assert _interleaved(path) == rotations, ops


def test_the_fused_lowerings_refuse_pairs_they_cannot_write_back():
    graph = build_export_graph(_small("command-r"))
    rope = graph["model.layers.0.self_attn.k_rope"]
    rope.attrs["layout"] = "interleave"  # first members, then second ones: DeepSeek-V3's
    for ops in ("standard", "ort"):
        assert "pairs its channels otherwise than" in can_express(ops, graph)
    graph["model.layers.0.self_attn.q_rope"].attrs["layout"] = "interleave"
    for ops in ("standard", "ort"):
        reason = can_express(ops, graph)
        assert "(layout 'interleave'), which RotaryEmbedding cannot express" in reason
        assert "\n" not in reason


def test_ort_refuses_routing_and_experts_the_moe_op_cannot_run(tmp_path):
    moe = _small("mixtral-8x7b")
    assert can_express("ort", build_export_graph(moe)) is None
    gelu = dataclasses.replace(moe, hidden_act="gelu_tanh")
    reason = can_express("ort", build_export_graph(gelu))
    assert reason is not None and "SwiGLU experts only" in reason and "gelu_tanh" in reason
    assert can_express("standard", build_export_graph(gelu)) is None
    with pytest.raises(LoweringError, match="SwiGLU experts only"):
        export_onnx(build_export_graph(gelu), tmp_path / "m.onnx", ops="ort")
    assert not (tmp_path / "m.onnx").exists()
    v3 = build_export_graph(small_instance(graphllm.load_config("deepseek-v3"), 8))
    for ops in ("standard", "ort"):
        assert "latent attention (MLA)" in can_express(ops, v3)


def test_refusal_on_the_command_line_is_one_line(tmp_path):
    out = tmp_path / "m.onnx"
    args = ["export", "--model", "deepseek-v2-lite", "--no-weights", "-o", str(out)]
    r = CliRunner().invoke(main, [*args, "--ops", "ort"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and not out.exists()
    assert r.stderr.startswith("error: the ort lowering cannot express deepseek-v2-lite: latent")
    # V3's sigmoid routing, scaled, is beyond the MoE op too, and the line says so
    r = CliRunner().invoke(main, [*args[:2], "deepseek-v3", *args[3:], "--ops", "ort"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and not out.exists()
    assert "latent attention (MLA)" in r.stderr and "routing the MoE op cannot do" in r.stderr


def test_default_table():
    assert set(DEFAULT_LOWERINGS) == {"cpu", "cuda"}
    for device in DEFAULT_LOWERINGS:
        assert set(DEFAULT_LOWERINGS[device]) == set(FAMILY_TABLE)
        assert all(set(v) <= set(LOWERINGS) for v in DEFAULT_LOWERINGS[device].values())
    for name, _ in list_presets():
        cfg = graphllm.load_config(name)
        graph = build_export_graph(cfg)
        # onnxruntime's GroupQueryAttention (and MoE op), RoPE on adjacent channel pairs
        # (Cohere's, issue 16) included; latent attention and soft-capped scores (Gemma 2,
        # issue 16): decomposed only
        fused = not cfg.is_mla
        want = "ort" if fused and cfg.attn_logit_softcapping is None else "decomposed"
        if fused and cfg.topk_method == "noaux_tc":
            # issue 18: GLM-4.5's and MiniMax-M2's biased expert choice is beyond the MoE op,
            # not beyond opset 23's Attention and RotaryEmbedding
            want = "standard"
        if cfg.temperature_floor_scale or cfg.qk_l2_norm:
            # issue 18: Llama 4's presets, the query temperature on the NoPE layers (and
            # Scout's L2 QK-norm), beyond the fused attention patterns
            want = "decomposed"
        if cfg.attn_output_gate or "linear_attention" in cfg.layer_types:
            # issue 19: Qwen3-Next's gated attention and Gated DeltaNet layers
            want = "decomposed"
        # issue 18: gpt-oss's sinks are GroupQueryAttention's head_sink (and its experts
        # the MoE op's clamped SwiGLU); opset 23's Attention has no sinks
        assert not cfg.attention_sinks or want == "ort", name
        assert default_lowering(graph, "cpu") == want, name
        assert default_lowering(graph, "cuda") == "decomposed", name
    moe = _small("qwen3-30b-a3b")
    assert default_lowering(build_export_graph(moe), "cpu") == "ort"
    assert (
        default_lowering(build_export_graph(moe, "fp16"), "cpu") == "standard"
    )  # the CPU MoE kernel is fp32 only


def test_unknown_op_set(tmp_path):
    with pytest.raises(graphllm.errors.ConfigError, match="unknown ONNX op set 'fast'"):
        export_onnx(build_export_graph(graphllm.load_config(TINY)), tmp_path / "m.onnx", ops="fast")


def test_every_lowering_lowers_every_single_device_row():
    graph = build_export_graph(_small("qwen1.5-moe-a2.7b"))
    for ops in LOWERINGS:
        model, plan = lower(graph, ops)
        assert model.graph.node and plan


# -- what onnxruntime's CPU kernels run: the limits the ort lowering works around ----------
def _run(node, feeds: dict[str, np.ndarray]):
    from onnx import TensorProto, helper

    types = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32}
    ins = [helper.make_tensor_value_info(k, types[v.dtype], None) for k, v in feeds.items()]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in node.output]
    g = helper.make_graph([node], "g", ins, outs)
    ops = [helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)]
    m = helper.make_model(g, opset_imports=ops, ir_version=10)
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def _gqa(head_dim: int, rotary: bool):
    from onnx import helper

    b, t, h, g = 1, 3, 2, 1
    rng = np.random.default_rng(0)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    feeds = {
        "q": f32(b, t, h * head_dim),
        "k": f32(b, t, g * head_dim),
        "v": f32(b, t, g * head_dim),
        "pk": f32(b, g, 0, head_dim),
        "pv": f32(b, g, 0, head_dim),
        "seqlens": np.array([t - 1], np.int32),
        "total": np.array(t, np.int32),
    }
    if rotary:
        feeds |= {"cos": f32(8, head_dim // 2), "sin": f32(8, head_dim // 2)}
    node = helper.make_node(
        "GroupQueryAttention", list(feeds), ["y", "k_out", "v_out"], domain="com.microsoft",
        num_heads=h, kv_num_heads=g, do_rotary=int(rotary),
    )  # fmt: skip
    return _run(node, feeds)


def test_onnxruntime_cpu_group_query_attention_rotates_heads_of_16():
    assert _gqa(16, rotary=True)[0].shape == (1, 3, 32)
    assert _gqa(8, rotary=False)[0].shape == (1, 3, 16)
    with pytest.raises(Exception, match="multiple of 16"):
        _gqa(8, rotary=True)


def test_onnxruntime_cpu_moe_runs_interleaved_swiglu_only():
    from onnx import helper

    rng = np.random.default_rng(0)
    e, f, d = 2, 4, 8
    w = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    feeds = {"x": w(3, d), "router": w(3, e), "fc1": w(e, 2 * f, d), "fc2": w(e, d, f)}

    def moe(fusion: int, act: str = "swiglu", **extra):
        ins = ["x", "router", "fc1", "", "fc2"] + (["", "fc3"] if "fc3" in extra else [])
        attrs = {"k": 1, "activation_type": act, "swiglu_fusion": fusion}
        node = helper.make_node("MoE", ins, ["y"], domain="com.microsoft", **attrs)
        return _run(node, feeds | extra)

    assert moe(1)[0].shape == (3, d)  # gate and up rows interleaved: runs
    for fusion in (0, 2):  # gate and up as two inputs, or [gate | up]
        with pytest.raises(Exception, match="interleaved SwiGLU"):
            moe(fusion)
    with pytest.raises(Exception, match="FC3 is not implemented"):
        moe(0, "silu", fc1=w(e, f, d), fc3=w(e, f, d))  # silu(gate) * up, gate and up apart


@pytest.mark.parametrize("head_dim", [16, 8])  # rotated inside GroupQueryAttention, or before it
def test_ort_reads_constant_rotary_tables_and_computes_none(tmp_path, head_dim):
    import onnx
    from onnx import numpy_helper

    from graphllm.exporters.onnx import read_metadata

    cfg = dataclasses.replace(
        graphllm.load_config(TINY), hidden_size=4 * head_dim, head_dim=head_dim
    )
    path = tmp_path / "m.onnx"
    export_onnx(build_export_graph(cfg), path, ops="ort", seed=2)
    m = onnx.load(str(path))
    assert not {"Cos", "Sin", "Range"} & {n.op_type for n in m.graph.node}
    tables = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer if "rotary" in t.name}
    rows = max(cfg.max_position_embeddings, 4096)
    assert {k: v.shape for k, v in tables.items()} == {
        "model.rotary_emb.cos_cache": (rows, head_dim // 2),
        "model.rotary_emb.sin_cache": (rows, head_dim // 2),
    }
    readers = [n for n in m.graph.node if "model.rotary_emb.cos_cache" in n.input]
    assert {n.op_type for n in readers} == (
        {"GroupQueryAttention"} if head_dim % 16 == 0 else {"RotaryEmbedding"}
    )
    inv = 1.0 / cfg.rope.theta ** (np.arange(0, head_dim, 2) / head_dim)
    np.testing.assert_allclose(
        tables["model.rotary_emb.cos_cache"][77], np.cos(77 * inv), atol=1e-6
    )
    assert read_metadata(path).tables == {k: v.nbytes for k, v in tables.items()}
