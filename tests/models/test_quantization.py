"""quantization_config read per method: the records, which tensors each method converts, the
bytes a format stores, and the one-line refusals."""

from __future__ import annotations

import dataclasses
import json

import pytest

from graphllm.errors import ConfigError
from graphllm.models.config import load_config
from graphllm.models.model_config import config_from_fields
from graphllm.models.quantization import (
    QuantFormat,
    parse_quantization,
    should_convert_module,
)
from tests.support import tiny_configs

DEEPSEEK_FP8 = {  # deepseek-ai/DeepSeek-V3 config.json's section (the deepseek-v3 preset's)
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128],
}
# AutoGPTQ's section as TheBloke's and Qwen's GPTQ checkpoints write it
GPTQ = {
    "bits": 4, "group_size": 128, "damp_percent": 0.01, "desc_act": False, "static_groups": False,
    "sym": True, "true_sequential": True, "model_name_or_path": None,
    "model_file_base_name": "model", "quant_method": "gptq", "disable_exllama": False,
}  # fmt: skip
# AutoAWQ's (transformers' docs quote TheBloke/zephyr-7B-alpha-AWQ's)
AWQ = {"quant_method": "awq", "zero_point": True, "group_size": 128, "bits": 4, "version": "gemm"}
MXFP4 = {  # gpt-oss's skip list
    "quant_method": "mxfp4",
    "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head",
    ],
}  # fmt: skip
CT_FP8_BLOCK = {  # llm-compressor's FP8_BLOCK scheme
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "ignore": ["lm_head"],
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "block",
                        "block_structure": [128, 128], "dynamic": False, "observer": "minmax"},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "group",
                                  "group_size": 128, "dynamic": True},
        }
    },
}  # fmt: skip


def test_fp8_record():
    q = parse_quantization(DEEPSEEK_FP8, "bf16")
    assert (q.method, q.activation_scheme, q.dtype, q.default_skips) == (
        "fp8",
        "dynamic",
        "bf16",
        True,
    )
    w = q.weights
    assert (w.values, w.value_bits, w.block, w.scale_bits, w.zero_bits, w.dtype) == (
        "e4m3", 8, (128, 128), 32, 0, "fp8"
    )  # fmt: skip


def test_fp8_scale_fmt_and_ignored_layers():
    q = parse_quantization(
        DEEPSEEK_FP8 | {"scale_fmt": "ue8m0", "ignored_layers": ["lm_head", "model.layers.0"]}
    )
    assert (q.weights.scale_fmt, q.weights.scale_bits) == ("e8m0", 8)
    assert q.not_converted == ("lm_head", "model.layers.0") and not q.default_skips


def test_fp8_per_tensor_when_block_is_null():
    q = parse_quantization(DEEPSEEK_FP8 | {"weight_block_size": None})
    assert q.weights.block == (0, 0)
    assert q.weights.nbytes((300, 200)) == 300 * 200 + 4  # one fp32 scale


def test_gptq_and_awq_records():
    g = parse_quantization(GPTQ, "fp16")
    assert (g.method, g.weights.value_bits, g.weights.block, g.weights.zero_bits) == (
        "gptq", 4, (1, 128), 4
    )  # fmt: skip
    assert (g.weights.index_bits, g.weights.symmetric, g.weights.desc_act) == (32, True, False)
    assert parse_quantization(GPTQ | {"group_size": -1}).weights.block == (1, 0)
    assert parse_quantization(GPTQ | {"desc_act": True}).weights.desc_act
    a = parse_quantization(AWQ, "fp16")
    assert (a.weights.packed_along, a.weights.index_bits, a.weights.symmetric) == ("out", 0, False)


def test_mxfp4_record():
    q = parse_quantization(MXFP4)
    assert (q.converts, q.weights.values, q.weights.block, q.weights.scale_bits) == (
        "experts", "e2m1", (1, 32), 8
    )  # fmt: skip


def test_compressed_tensors_maps_onto_fp8_blocks():
    q = parse_quantization(CT_FP8_BLOCK)
    assert (q.weights.values, q.weights.block, q.activation_scheme) == (
        "e4m3",
        (128, 128),
        "dynamic",
    )
    assert q.format_of("lm_head.weight", "lm_head") is None


def test_compressed_tensors_int4_groups():
    ct = json.loads(json.dumps(CT_FP8_BLOCK))
    ct["format"] = "pack-quantized"
    ct["config_groups"]["group_0"]["input_activations"] = None
    ct["config_groups"]["group_0"]["weights"] = {
        "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128,
    }  # fmt: skip
    w = parse_quantization(ct, "bf16").weights
    assert (w.values, w.value_bits, w.block, w.packed_along, w.shape_bytes) == (
        "int", 4, (1, 128), "in", 16
    )  # fmt: skip
    # weight_packed int32 [256, 256 * 4 / 32], weight_scale bf16 [256, 2], weight_shape int64 [2]
    assert w.nbytes((256, 256)) == 256 * 32 * 4 + 256 * 2 * 2 + 16


# ---------------------------------------------------------------------------------------------
# which tensors each method converts


def test_should_convert_module_follows_transformers_patterns():
    assert not should_convert_module("model.layers.1.self_attn.q_proj", ["model.layers.1"])
    assert should_convert_module("model.layers.11.self_attn.q_proj", ["model.layers.1"])
    assert not should_convert_module("model.layers.11.self_attn", ["model.layers.*.self_attn"])
    assert should_convert_module("model.layers.0.mlp.gate_proj", ["mlp.gate"])
    assert not should_convert_module("model.layers.0.mlp.gate", ["mlp.gate"])  # a suffix
    assert should_convert_module("anything", [])


def test_fp8_format_of_deepseek_names():
    q = parse_quantization(DEEPSEEK_FP8)
    fp8 = q.weights
    assert q.format_of("model.layers.3.self_attn.kv_a_proj_with_mqa.weight", "attention") == fp8
    assert q.format_of("model.layers.3.mlp.experts.*.gate_proj.weight", "moe_experts") == fp8
    assert q.format_of("model.layers.3.mlp.shared_experts.up_proj.weight", "shared_experts") == fp8
    # DeepseekV3TopkRouter is no nn.Linear; no skip list: transformers keeps the head
    assert q.format_of("model.layers.3.mlp.gate.weight", "router") is None
    assert q.format_of("lm_head.weight", "lm_head") is None
    assert q.format_of("model.embed_tokens.weight", "embedding") is None
    assert q.format_of("model.layers.3.input_layernorm.weight", "norms") is None
    assert q.format_of("model.layers.61.eh_proj.weight", "mtp_proj") is None  # bf16 as shipped


def test_fp8_skip_list_given_converts_an_unlisted_head():
    q = parse_quantization(DEEPSEEK_FP8 | {"modules_to_not_convert": ["model.layers.0"]})
    assert q.format_of("lm_head.weight", "lm_head") == q.weights
    assert q.format_of("model.layers.0.self_attn.q_proj.weight", "attention") is None
    assert q.format_of("model.layers.10.self_attn.q_proj.weight", "attention") == q.weights


def test_fp8_converts_qwen2_moe_shared_expert_gate_alone_of_the_routers():
    q = parse_quantization(DEEPSEEK_FP8)
    assert q.format_of("model.layers.0.mlp.shared_expert_gate.weight", "router") == q.weights
    assert q.format_of("model.layers.0.mlp.gate.weight", "router") is None


def test_mxfp4_converts_experts_only():
    q = parse_quantization(MXFP4)
    assert q.format_of("model.layers.0.mlp.experts.*.up_proj.weight", "moe_experts") == q.weights
    assert q.format_of("model.layers.0.self_attn.q_proj.weight", "attention") is None
    assert q.format_of("model.layers.0.mlp.shared_expert.up_proj.weight", "shared_experts") is None
    skip = parse_quantization(MXFP4 | {"modules_to_not_convert": ["model.layers.1.mlp.experts"]})
    assert skip.format_of("model.layers.1.mlp.experts.*.up_proj.weight", "moe_experts") is None


def test_gptq_converts_decoder_linears_only():
    q = parse_quantization(GPTQ)
    assert q.format_of("model.layers.2.mlp.down_proj.weight", "mlp") == q.weights
    assert q.format_of("model.layers.2.mlp.experts.*.down_proj.weight", "moe_experts") == q.weights
    assert q.format_of("model.layers.2.mlp.shared_expert_gate.weight", "router") is None
    assert q.format_of("lm_head.weight", "lm_head") is None
    assert parse_quantization(GPTQ | {"lm_head": True}).format_of("lm_head.weight", "lm_head")
    assert q.format_of("model.layers.2.self_attn.q_proj.bias", "attention") is None


def test_awq_skip_list():
    q = parse_quantization(AWQ | {"modules_to_not_convert": ["self_attn"]})
    assert q.format_of("model.layers.0.self_attn.o_proj.weight", "attention") is not None
    assert q.format_of("model.layers.0.self_attn.weight", "attention") is None
    q = parse_quantization(AWQ | {"modules_to_not_convert": ["model.layers.0.self_attn"]})
    assert q.format_of("model.layers.0.self_attn.o_proj.weight", "attention") is None
    assert q.format_of("model.layers.1.self_attn.o_proj.weight", "attention") is not None


# ---------------------------------------------------------------------------------------------
# stored bytes, from each format's published layout


def test_fp8_bytes_ceil_over_blocks():
    # DeepSeek-V3's kv_a_proj_with_mqa [576, 7168]: weight_scale_inv [5, 56] fp32
    f = parse_quantization(DEEPSEEK_FP8).weights
    assert f.nbytes((576, 7168)) == 576 * 7168 + 5 * 56 * 4
    assert f.nbytes((256, 2048, 7168)) == 256 * (2048 * 7168 + 16 * 56 * 4)  # stacked experts


def test_gptq_bytes():
    # qweight int32 [in * 4 / 32, out], scales fp16 [in / g, out], qzeros int32 [in / g,
    # out * 4 / 32], g_idx int32 [in]
    f = parse_quantization(GPTQ | {"group_size": 32}).weights
    out, inp = 96, 64
    assert f.nbytes((out, inp)) == inp // 8 * out * 4 + 2 * out * 2 + 2 * (out // 8) * 4 + inp * 4


def test_awq_bytes():
    # qweight int32 [in, out * 4 / 32], qzeros int32 [in / g, out / 8], scales fp16 [in / g, out]
    f = parse_quantization(AWQ | {"group_size": 32}).weights
    out, inp = 96, 64
    assert f.nbytes((out, inp)) == inp * (out // 8) * 4 + 2 * (out // 8) * 4 + 2 * out * 2


def test_mxfp4_bytes():
    # gpt-oss: *_blocks uint8 [E, out, in / 32, 16], *_scales uint8 [E, out, in / 32]
    f = parse_quantization(MXFP4).weights
    assert f.nbytes((4, 96, 64)) == 4 * 96 * (2 * 16 + 2)
    assert f.nbytes((1, 2, 40)) == 2 * (2 * 16 + 2)  # a partial block pads to 32 values


def test_a_format_refuses_a_vector():
    with pytest.raises(ConfigError, match="matrix"):
        parse_quantization(DEEPSEEK_FP8).weights.nbytes((64,))


# ---------------------------------------------------------------------------------------------
# the record on ModelConfig


def tiny(**kw):
    return {**tiny_configs.LLAMA, **kw}


def test_config_carries_the_record_and_round_trips():
    cfg = load_config(tiny(quantization_config=GPTQ, torch_dtype="float16"))
    assert cfg.quantization == parse_quantization(GPTQ, "fp16")
    back = config_from_fields(json.loads(json.dumps(dataclasses.asdict(cfg))))
    assert back == cfg and isinstance(back.quantization.weights, QuantFormat)
    assert load_config(tiny()).quantization is None


def test_preset_deepseek_v3_is_fp8():
    q = load_config("deepseek-v3").quantization
    assert q == parse_quantization(DEEPSEEK_FP8, "bf16")


def test_multimodal_top_level_section_reaches_the_text_decoder():
    d = {"model_type": "gemma3", "text_config": {"num_hidden_layers": 2},
         "quantization_config": DEEPSEEK_FP8, "torch_dtype": "bfloat16"}  # fmt: skip
    assert load_config(d).quantization.method == "fp8"


# ---------------------------------------------------------------------------------------------
# refusals: one line, naming the problem


@pytest.mark.parametrize("method", ["bitsandbytes", "hqq", "eetq", "torchao", "no-such"])
def test_other_methods_are_refused_by_name(method):
    with pytest.raises(ConfigError) as e:
        load_config(tiny(quantization_config={"quant_method": method}))
    msg = str(e.value)
    assert method in msg and "fp8, mxfp4, gptq, awq, compressed-tensors" in msg
    assert "\n" not in msg


def test_unknown_and_unmodelled_keys_are_named_at_once():
    with pytest.raises(ConfigError) as e:
        parse_quantization(DEEPSEEK_FP8 | {"fmt": "e5m2", "colour": 1, "expert_dtype": "fp4"})
    msg = str(e.value)
    assert "'colour'" in msg and "e5m2" in msg and "expert_dtype" in msg and "\n" not in msg


@pytest.mark.parametrize(
    "section, word",
    [
        (GPTQ | {"bits": 3}, "bits 3"),
        (GPTQ | {"bits": True}, "bits True"),
        (GPTQ | {"group_size": 0}, "group_size"),
        (GPTQ | {"group_size": -2}, "group_size"),
        (GPTQ | {"checkpoint_format": "marlin"}, "marlin"),
        (GPTQ | {"modules_in_block_to_quantize": [["q_proj"]]}, "modules_in_block_to_quantize"),
        (AWQ | {"bits": 8}, "bits 8"),
        (AWQ | {"version": "gemv"}, "gemv"),
        (DEEPSEEK_FP8 | {"weight_block_size": [128]}, "weight_block_size"),
        (DEEPSEEK_FP8 | {"activation_scheme": "none"}, "activation_scheme"),
        (MXFP4 | {"modules_to_not_convert": "lm_head"}, "list of module names"),
    ],
)
def test_bad_values_are_refused(section, word):
    with pytest.raises(ConfigError, match=word):
        parse_quantization(section)


def test_compressed_tensors_that_does_not_map_is_refused():
    ct = json.loads(json.dumps(CT_FP8_BLOCK))
    ct["config_groups"]["group_0"]["weights"]["num_bits"] = 4
    ct["config_groups"]["group_1"] = ct["config_groups"]["group_0"]
    with pytest.raises(ConfigError, match="one group"):
        parse_quantization(ct)
    ct = json.loads(json.dumps(CT_FP8_BLOCK))
    ct["config_groups"]["group_0"]["weights"]["num_bits"] = 4
    with pytest.raises(ConfigError, match="float weights of 4 bits"):
        parse_quantization(ct)


def test_a_bad_torch_dtype_of_a_quantized_config_is_named():
    with pytest.raises(ConfigError, match="torch_dtype"):
        load_config(tiny(quantization_config=GPTQ, torch_dtype="float64"))


def test_describe_says_what_one_scale_covers():
    assert parse_quantization(DEEPSEEK_FP8).describe() == (
        "fp8: 8-bit e4m3 weights, one fp32 scale per 128x128 block; the other tensors bf16"
    )
    gptq = parse_quantization(GPTQ | {"group_size": -1}, "fp16").describe()
    assert "one fp16 scale and a 4-bit zero point per output row" in gptq
    assert "per 128 inputs of a row" in parse_quantization(AWQ).describe()
