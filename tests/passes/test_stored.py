"""Weights counted as the checkpoint stores them: memory, bytes moved and the roofline read each
param's stored format (scales and zero points included); parameter counts do not change."""

from __future__ import annotations

import dataclasses

import pytest

import graphllm
from graphllm.build.builder import build_export_graph
from graphllm.models.hardware import load_hardware
from graphllm.passes import run
from tests.support import tiny_configs

FP8_32 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
          "weight_block_size": [32, 32]}  # fmt: skip
GPTQ_32 = {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": True, "desc_act": False}


def llama(**kw):
    # vocab 256, d 64, 2 layers, 4 query and 2 KV heads of 16, FFN 128, untied
    return graphllm.load_config({**tiny_configs.LLAMA, "torch_dtype": "bfloat16", **kw})


def analyse(cfg, **wl):
    g = graphllm.build_graph(cfg, graphllm.Workload(**wl))
    return g, run(g, ["params", "memory", "cost"])


def test_fp8_bytes_by_hand():
    # a [out, in] matrix: out * in e4m3 bytes + ceil(out/32) * ceil(in/32) fp32 scales
    def fp8(out, inp):
        return out * inp + -(-out // 32) * -(-inp // 32) * 4

    layer = (
        fp8(64, 64) + 2 * fp8(32, 64) + fp8(64, 64)  # q, k, v, o
        + 2 * fp8(128, 64) + fp8(64, 128)  # gate, up, down
        + 2 * 64 * 2  # two bf16 norms
    )  # fmt: skip
    assert layer == 37264
    # bf16 embedding and LM head (no skip list: transformers keeps the head), final norm
    total = 2 * layer + 2 * 256 * 64 * 2 + 64 * 2
    _, res = analyse(llama(quantization_config=FP8_32))
    assert res["memory"].weights == total == 140192
    assert res["memory"].weights_by_dtype == {"bf16": 2 * 256 * 64 * 2 + 64 * 2 + 4 * 64 * 2,
                                              "fp8": total - 65536 - 128 - 512}  # fmt: skip


def test_gptq_bytes_by_hand():
    # qweight int32 [in/8, out], scales fp16 [in/32, out], qzeros int32 [in/32, out/8],
    # g_idx int32 [in]; the rest at the checkpoint's fp16
    def gptq(out, inp):
        groups = -(-inp // 32)
        return inp // 8 * out * 4 + groups * out * 2 + groups * (out // 8) * 4 + inp * 4

    layer = gptq(64, 64) * 2 + gptq(32, 64) * 2 + gptq(128, 64) * 2 + gptq(64, 128) + 256
    total = 2 * layer + 2 * 256 * 64 * 2 + 128
    _, res = analyse(llama(quantization_config=GPTQ_32, torch_dtype="float16"))
    assert res["memory"].weights == total
    assert set(res["memory"].weights_by_dtype) == {"fp16", "int4"}


def test_params_do_not_change():
    plain = analyse(llama())[1]["params"]
    quant = analyse(llama(quantization_config=FP8_32))[1]["params"]
    assert quant == plain


def test_bytes_moved_read_the_stored_weights():
    # decode, one token: every weight is read once, as stored (the embedding: one row)
    _, res = analyse(llama(quantization_config=FP8_32), past_len=4)
    read = res["cost"].bytes["weights"]
    embed_row = 64 * 2
    assert read == pytest.approx(140192 - 256 * 64 * 2 + embed_row)


def test_roofline_time_follows_the_stored_bytes():
    hw = load_hardware("h100").ideal()  # bytes, not the tiny GEMMs' one-tile kernels
    times = []
    for cfg in (llama(), llama(quantization_config=FP8_32)):
        g = graphllm.build_graph(cfg, graphllm.Workload(past_len=64))
        times.append(run(g, ["roofline"], hardware=hw)["roofline"].seconds)
    assert times[1] < times[0]


def mixtral(**kw):
    d = {**tiny_configs.LLAMA, "model_type": "mixtral", "num_local_experts": 4,
         "num_experts_per_tok": 2, "intermediate_size": 96, "torch_dtype": "bfloat16"}  # fmt: skip
    return graphllm.load_config(d | kw)


def test_mxfp4_quantizes_a_tiny_moe_s_experts_alone():
    # the experts [4, out, in]: blocks uint8 [4, out, in/32, 16] + scales uint8 [4, out, in/32]
    def mx(out, inp):
        return 4 * out * (-(-inp // 32)) * 17

    experts = 2 * mx(96, 64) + mx(64, 96)
    plain = analyse(mixtral())[1]["memory"]
    quant = analyse(mixtral(quantization_config={"quant_method": "mxfp4"}))[1]["memory"]
    bf16_experts = 2 * 3 * 4 * 96 * 64 * 2
    assert quant.weights == plain.weights - bf16_experts + 2 * experts
    assert quant.weights_by_dtype["mxfp4"] == 2 * experts


def test_an_excluded_module_stays_at_the_checkpoint_dtype():
    skip = dict(FP8_32, modules_to_not_convert=["lm_head", "model.layers.1"])
    g, _ = analyse(llama(quantization_config=skip))
    assert g["model.layers.1.self_attn.q_proj.weight"].out.dtype == "bf16"
    assert "stored" not in g["model.layers.1.self_attn.q_proj.weight"].attrs
    assert g["model.layers.0.self_attn.q_proj.weight"].out.dtype == "fp8"


def test_without_quantization_the_workload_dtype_rules():
    cfg = dataclasses.replace(llama(quantization_config=FP8_32), quantization=None)
    g, _ = analyse(cfg, weight_dtype="int8")
    assert g["model.layers.0.self_attn.q_proj.weight"].out.dtype == "int8"


def test_export_graph_is_dequantized():
    g = build_export_graph(llama(quantization_config=FP8_32), "fp16")
    assert {p.out.dtype for p in g.params()} == {"fp16"}
