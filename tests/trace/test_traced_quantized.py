"""A traced model of a quantized checkpoint (its `quantization_config`): each param node carries
the format the checkpoint stores it in, read with the built families' rules from what
transformers' quantizer converts (graphllm.trace.stored), so that its weights' bytes, by dtype
and by kind, and each param's stored format equal the built graph's of the same config; every
method the built families model, an unknown one refused as they refuse it; the weights of a
tiny FP8 checkpoint quantized by the published rule read back dequantized, with transformers'
logits."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
from click.testing import CliRunner

from graphllm.build.weights import load_weights
from graphllm.cli.main import main
from graphllm.errors import ConfigError, WeightsError
from graphllm.files import json_text
from graphllm.models.config import load_config
from graphllm.models.hardware import load_hardware
from graphllm.models.workload import Workload
from graphllm.report import reuse
from graphllm.report.trace_report import traced_report
from graphllm.runtime.interpret import Interpreter
from graphllm.trace import traced_graph
from tests.support.quantized_checkpoints import quantized_tensors, save_tensors
from tests.support.stored import assert_stored_as_built
from tests.support.traced import MLA, TINY

WL = Workload(seq_len=8)
QWEN2_MOE = dict(
    TINY,
    model_type="qwen2_moe",
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    shared_expert_intermediate_size=32,
)
DEEPSEEK = dict(
    MLA,
    model_type="deepseek_v3",
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    moe_intermediate_size=8,
)
FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic"}
METHODS = {
    "fp8": FP8 | {"weight_block_size": [16, 16]},
    "fp8_per_tensor": FP8 | {"weight_block_size": None},
    "fp8_skips": FP8 | {"weight_block_size": [16, 16], "modules_to_not_convert": ["o_proj"]},
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 16, "desc_act": False, "sym": True},
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 16, "zero_point": True},
    "compressed_tensors": {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {
                    "type": "int", "num_bits": 4, "symmetric": True, "strategy": "group",
                    "group_size": 16,
                },
            }
        },
        "ignore": ["lm_head"],
    },
    "mxfp4": {"quant_method": "mxfp4"},
}  # fmt: skip


@pytest.mark.parametrize("method", list(METHODS))
def test_tiny_moe_stores_its_weights_as_built(method):
    """Qwen2-MoE: attention, routed and shared experts, a router that is no nn.Linear and a
    shared_expert_gate that is one (converted by FP8 and compressed-tensors, not GPTQ/AWQ),
    an untied head (left unconverted by FP8's default skips, converted by a skip list that does
    not name it)."""
    raw = QWEN2_MOE | {"quantization_config": METHODS[method]}
    _, traced = assert_stored_as_built(raw, WL)
    stored = {n.name: n.attrs.get("stored") for n in traced.params()}
    gate = stored["model.layers.0.mlp.shared_expert_gate.weight"]
    assert (gate is not None) == (method in ("fp8", "fp8_per_tensor", "fp8_skips",
                                             "compressed_tensors"))  # fmt: skip
    assert stored["model.layers.0.mlp.gate.weight"] is None
    assert stored["model.embed_tokens.weight"] is None
    experts = stored["model.layers.0.mlp.experts.gate_up_proj"]
    assert experts is not None


def test_mla_moe_fp8_as_built():
    """DeepSeek-V3: MLA projections, the fused experts' gate_up_proj (stored as a gate and an up
    projection an expert, each with its scales: a 16x16 block over each 8-row half), fp32 router
    weights stored at the checkpoint's bf16."""
    _, traced = assert_stored_as_built(DEEPSEEK | {"quantization_config": METHODS["fp8"]}, WL)
    gate_up = traced["model.layers.1.mlp.experts.gate_up_proj"]
    assert gate_up.attrs["stored_parts"] == (1, 2)
    assert traced["model.layers.1.mlp.gate.weight"].out.dtype == "bf16"


def test_keep_in_fp32_modules_stay_unconverted():
    """DeepSeek-V3.2's indexer.weights_proj is one of the model's _keep_in_fp32_modules, which
    transformers' FP8 quantizer adds to its skip list: stored at the checkpoint's dtype."""
    raw = dict(DEEPSEEK, model_type="deepseek_v32", index_head_dim=8, index_n_heads=2)
    raw |= {"index_topk": 3, "quantization_config": METHODS["fp8"]}
    g = traced_graph(raw, WL)
    stored = {n.name: n.attrs.get("stored") for n in g.params()}
    attn = "model.layers.0.self_attn."
    assert stored[attn + "indexer.weights_proj.weight"] is None
    assert stored[attn + "indexer.wq_b.weight"] is not None
    assert stored[attn + "indexer.wk.weight"] is not None
    assert g.meta["config"].quantization.method == "fp8"


@pytest.mark.parametrize(
    "section",
    [
        {"quant_method": "bitsandbytes"},
        {"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128], "colour": 1},
    ],
)
def test_what_the_built_side_refuses_is_refused_alike(section):
    raw = QWEN2_MOE | {"quantization_config": section}
    with pytest.raises(ConfigError) as built:
        load_config(raw)
    with pytest.raises(ConfigError) as traced:
        traced_graph(raw, WL)
    assert str(traced.value) == str(built.value)
    assert "\n" not in str(traced.value)


def _checkpoints(tmp_path, raw: dict, method: str, g) -> tuple:
    """A random tiny model of `raw` saved by transformers, the matrices `g` (traced with
    METHODS[method]) says are stored quantized written by the method's published rule (FP8:
    e4m3 values, one scale_inv a 16x16 block; GPTQ and AWQ: their packed int4 groups of 16;
    each expert's projections apart) in folder q, their dequantized values unquantized in m."""
    import torch
    import transformers
    from safetensors.numpy import load_file

    cfg = transformers.CONFIG_MAPPING[raw["model_type"]](
        **{k: v for k, v in raw.items() if k != "model_type"}
    )
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).eval().save_pretrained(tmp_path / "d")
    quantized = set()
    for n in g.params():
        if g.meta["checkpoint_formats"].get(n.name, (None,))[0] is not None:
            how = n.attrs.get("stored_as")
            quantized |= {p for grp in how["parts"] for p in grp} if how else {n.name}
    assert any(".experts.0." in p for p in quantized)
    dense = load_file(str(tmp_path / "d" / "model.safetensors"))
    fmt = g.meta["checkpoint_quantization"].weights
    tensors, meant, dtypes = quantized_tensors(dense, fmt, quantized)
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    for folder, held, section in (
        ("q", tensors, {"quantization_config": METHODS[method]}),
        ("m", {}, {}),
    ):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "config.json").write_text(json.dumps(config | section))
        save_tensors(held or dense | meant, tmp_path / folder / "model.safetensors", dtypes)
    return tmp_path / "q", tmp_path / "m"


def _reference(folder, ids):
    import torch
    import transformers

    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        return ref.eval()(torch.tensor(ids)).logits.numpy()


READ = {"fp8": (DEEPSEEK, "fp8"), "gptq": (QWEN2_MOE, "gptq"), "awq": (QWEN2_MOE, "awq")}


@pytest.mark.parametrize("which", list(READ))
def test_checkpoint_weights_read_dequantized(tmp_path, which):
    """The traced graph reads a quantized checkpoint as its dequantized values (a routed
    expert's pieces each read, put together as transformers' converter does), and the
    interpreter's logits on them are transformers' own on those values."""
    raw, method = READ[which]
    wl = Workload(batch=1, seq_len=5, dtype="fp32")
    g = traced_graph(raw | {"quantization_config": METHODS[method]}, wl, values=True)
    assert g.meta["quantization"] is None  # a graph that runs computes at its dtype
    q, m = _checkpoints(tmp_path, raw, method, g)
    got = load_weights(g, q)
    plain = load_weights(traced_graph(raw, wl, values=True), m)
    assert got.keys() == plain.keys()
    for k, v in got.items():
        np.testing.assert_array_equal(v, plain[k])
    ids = np.random.default_rng(0).integers(0, raw["vocab_size"], (1, 5))
    out = Interpreter(g, got).run({"input_ids": ids, "position_ids": np.arange(5)[None]})
    np.testing.assert_allclose(out["logits"], _reference(m, ids), atol=1e-4, rtol=0)


def test_mxfp4_weights_of_a_traced_model_are_refused_in_one_line(tmp_path):
    """transformers holds gpt-oss's MXFP4 experts transposed from the stored rows, which the
    reader does not undo: refused by name where they are read, analysed all the same."""
    import torch
    import transformers

    raw = dict(TINY, model_type="gpt_oss", num_local_experts=4, num_experts_per_tok=2)
    raw |= {"intermediate_size": 32, "quantization_config": METHODS["mxfp4"]}
    assert traced_graph(raw, WL).meta["quantization"].method == "mxfp4"
    g = traced_graph(raw, Workload(batch=1, seq_len=5, dtype="fp32"), values=True)
    fields = {k: v for k, v in raw.items() if k not in ("model_type", "quantization_config")}
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.CONFIG_MAPPING["gpt_oss"](**fields)
    )
    model.save_pretrained(tmp_path)
    with pytest.raises(WeightsError, match=r"mxfp4 weights are not read") as e:
        load_weights(g, tmp_path)
    assert "\n" not in str(e.value)


def test_fp8_checkpoint_exports_to_onnx(tmp_path):
    """`export --frontend traced --weights` of the quantized checkpoint: onnxruntime's logits
    are transformers' on the dequantized values."""
    import onnxruntime as ort

    wl = Workload(batch=1, seq_len=1, past_len=1, dtype="fp32")
    g = traced_graph(DEEPSEEK | {"quantization_config": METHODS["fp8"]}, wl, values=True)
    q, m = _checkpoints(tmp_path, DEEPSEEK, "fp8", g)
    out = tmp_path / "m.onnx"
    args = ["export", "--weights", str(q), "--frontend", "traced", "-o", str(out)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert "traced from transformers' code" in r.output
    ids = np.random.default_rng(0).integers(0, DEEPSEEK["vocab_size"], (1, 5))
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    feeds = {
        "input_ids": ids,
        "attention_mask": np.ones(ids.shape, np.int64),
        "position_ids": np.arange(5)[None],
    }
    for i in session.get_inputs():
        if i.name not in feeds:  # an empty past
            shape = [0 if isinstance(d, str) and "past" in d.lower() else d for d in i.shape]
            feeds[i.name] = np.zeros([1 if isinstance(d, str) else d for d in shape], np.float32)
    got = session.run(["logits"], {i.name: feeds[i.name] for i in session.get_inputs()})[0]
    np.testing.assert_allclose(got, _reference(m, ids), atol=1e-4, rtol=0)


def _v32(tmp_path) -> str:
    """DeepSeek-V3.2-Exp's config: V3's (FP8, 128x128 blocks) and the indexer's three fields."""
    raw = json.loads(Path("tests/fixtures/hub/deepseek-ai/DeepSeek-V3/config.json").read_text())
    raw.pop("auto_map")
    raw |= {"architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32"}
    raw |= {"index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    return str(path)


def test_deepseek_v32_traces_with_its_fp8_weights(tmp_path):
    """V3's weights (673.15 GB as stored, the built family's) and each of 61 indexers': wq_b
    [8192, 1536] and wk [128, 7168] in FP8 with a fp32 scale a 128x128 block, weights_proj
    [64, 7168] (kept in fp32 by the model: unconverted) and k_norm's weight and bias in bf16."""

    indexer = 8192 * 1536 + 64 * 12 * 4 + 128 * 7168 + 56 * 4 + 64 * 7168 * 2 + 2 * 128 * 2
    args = ["trace", "--config", _v32(tmp_path), "-t", "16", "--json"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["model"]["frontend"] == "traced"
    assert doc["model"]["quantization"]["method"] == "fp8"
    assert doc["memory"]["weights"] == 673_150_582_112 + 61 * indexer
    r = CliRunner().invoke(main, [*args[:-1], "--weight-dtype", "bf16"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert (
        "note: --weight-dtype bf16 overrides the checkpoint's quantization_config (fp8): "
        "every weight is modelled as bf16"
    ) in text
    assert "storage:" not in text


def test_one_layer_of_each_kind_stands_for_a_quantized_model():
    """trace's analysis of the first layer of each kind, unrolled, is the full graph's to the
    last bit, stored formats included (each layer's params carry their own)."""

    raw = DEEPSEEK | {"num_hidden_layers": 3, "quantization_config": METHODS["fp8"]}
    wl, hw = Workload(seq_len=8), load_hardware("h100")
    config = traced_graph(raw, wl, "tiny").meta["config"]
    got = reuse.reused_report(config, wl, hw)
    assert got is not None, "one layer of each kind should stand for this model"
    want, _ = traced_report(raw, "tiny", wl, hw)
    assert got["model"]["quantization"]["method"] == "fp8"
    assert json.loads(json_text(got)) == json.loads(json_text(want))
