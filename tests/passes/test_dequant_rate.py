"""Issue 20: a weight-only quantized GEMV streams its weights through a dequantising kernel at a
measured share of the bandwidth (`achievable.dequant_efficiency`, per storage dtype), and torch's
tinygemm layout (`int4g32`: int4 in groups of 32, a bf16 scale and a bf16 zero point each) is
stored at 5/8 of a byte per weight. Expected values are computed by hand."""

from dataclasses import replace

import pytest

from graphllm import Workload, build_graph
from graphllm.errors import ConfigError
from graphllm.models.config import config_from_dict
from graphllm.models.hardware import hardware_from_dict, load_hardware
from graphllm.models.workload import nbytes
from graphllm.passes.registry import meta_result, run
from tests.support import tiny_configs
from tests.support.achievable_spec import SPEC, US, with_achievable

HALF = with_achievable(dequant_efficiency={"int4g32": 0.5})


def _decode(weight_dtype: str, **shape):
    cfg = config_from_dict(tiny_configs.LLAMA | shape, "tiny")
    wl = Workload(batch=1, seq_len=1, past_len=4, weight_dtype=weight_dtype)
    return build_graph(cfg, wl)


def test_int4g32_stores_half_a_byte_and_four_bytes_of_scale_and_zero_per_32():
    assert nbytes("int4g32", 4096 * 4096) == 4096 * 4096 // 2 + 4096 * 4096 // 32 * 4
    assert nbytes("int4g32", 64) / 64 == 0.625  # 0.5 + 2 x 2 bytes / 32


def test_a_quantized_gemv_moves_its_bytes_at_the_kernels_share_of_the_bandwidth():
    hw = hardware_from_dict(HALF, "half")
    g = _decode("int4g32")
    run(g, ["cost", "roofline"], hardware=hw)
    q = g["model.layers.0.self_attn.q_proj"]
    oc = meta_result(q, "cost")
    # batch 1: memory-bound; 3e12 B/s at half -> 1.5e12 B/s, plus the graph's 1 us per kernel
    assert oc.bytes / 1.5e12 > oc.flops / 800e12
    assert meta_result(q, "time").seconds == pytest.approx(oc.bytes / 1.5e12 + 1 * US)
    # an op without quantized weights (the norm) keeps the full bandwidth
    norm = g["model.layers.0.input_layernorm"]
    nc = meta_result(norm, "cost")
    t = max(nc.flops / 1000e12, nc.bytes / 3e12)
    assert meta_result(norm, "time").seconds == pytest.approx(t + 1 * US)


def test_a_dtype_the_table_does_not_name_streams_at_the_full_bandwidth():
    hw = hardware_from_dict(HALF, "half")
    g = _decode("int8")
    run(g, ["cost", "roofline"], hardware=hw)
    q = g["model.layers.0.self_attn.q_proj"]
    oc = meta_result(q, "cost")
    assert meta_result(q, "time").seconds == pytest.approx(oc.bytes / 3e12 + 1 * US)


def test_the_ideal_model_ignores_the_kernel_share():
    hw = hardware_from_dict(HALF, "half").ideal()
    g = _decode("int4g32")
    run(g, ["cost", "roofline"], hardware=hw)
    q = g["model.layers.0.self_attn.q_proj"]
    oc = meta_result(q, "cost")
    assert meta_result(q, "time").seconds == pytest.approx(max(oc.bytes / 4e12, oc.flops / 1e15))


def test_the_a100_preset_prices_tinygemm_at_its_published_share():
    a100 = replace(load_hardware("a100"), cuda_graphs=True)
    assert a100.achievable.dequant_efficiency == {"int4g32": 0.95, "int8": 0.86}
    assert "tinygemm" in a100.achievable.source and "Marlin" in a100.achievable.source
    assert "128002" in a100.achievable.source  # pytorch's gemv_int8 microbenchmark
    # Llama-2-7B's q_proj (4096 x 4096): at batch 1 its 10.5 MB of weights bound it
    g = _decode("int4g32", hidden_size=4096, num_attention_heads=32, num_key_value_heads=32)
    run(g, ["cost", "roofline"], hardware=a100)
    q = g["model.layers.0.self_attn.q_proj"]
    oc = meta_result(q, "cost")
    # batch 1 on the A100: memory-bound, 1.70 TB/s x 0.95, plus a streaming kernel's 3.33 us in
    # the CUDA graph
    assert meta_result(q, "time").seconds == pytest.approx(oc.bytes / (1.70e12 * 0.95) + 3.33 * US)


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({"int7": 0.5}, "int7"),
        ({"int4g32": 1.5}, "int4g32"),
        ({"bf16": 0.9}, "bf16"),
        (3, "mapping"),
    ],
)
def test_a_bad_dequant_share_is_one_line_naming_it(table, says):
    spec = with_achievable(dequant_efficiency=table)
    with pytest.raises(ConfigError, match=says) as e:
        hardware_from_dict(spec, "bad")
    assert "\n" not in str(e.value) and "dequant_efficiency" in str(e.value)


def test_a_spec_without_the_table_loads_and_round_trips():
    hw = hardware_from_dict(SPEC, "plain")
    assert hw.achievable.dequant_efficiency == {}
    d = hardware_from_dict(HALF, "half").to_dict()
    assert hardware_from_dict(d, "again").achievable.dequant_efficiency == {"int4g32": 0.5}


def test_an_int8_weight_only_gemv_streams_at_torch_compiles_measured_share():
    # pytorch#128002's A100 gemv microbenchmark: int8 984.06 GB/s, bf16 1137.92 GB/s
    a100 = replace(load_hardware("a100"), cuda_graphs=True)
    g = _decode("int8", hidden_size=4096, num_attention_heads=32, num_key_value_heads=32)
    run(g, ["cost", "roofline"], hardware=a100)
    q = g["model.layers.0.self_attn.q_proj"]
    oc = meta_result(q, "cost")
    assert oc.bytes > 4096 * 4096  # the int8 weight, a byte each, and the bf16 vectors
    assert meta_result(q, "time").seconds == pytest.approx(oc.bytes / (1.70e12 * 0.86) + 3.33 * US)


def test_int8_times_int8_is_a_plain_gemm_not_a_dequantising_one():
    # W8A8: an int8 GEMM of int8 weights and the 16-bit stream quantized to int8; no kernel
    # dequantises the weight, so int8's share stays unused
    hw = hardware_from_dict(with_achievable(dequant_efficiency={"int8": 0.5}), "half-int8")
    cfg = config_from_dict(tiny_configs.LLAMA, "tiny")
    w8a8 = build_graph(cfg, Workload(batch=1, seq_len=1, past_len=4, weight_dtype="int8",
                                     act_dtype="int8"))  # fmt: skip
    w8a16 = _decode("int8")
    for g in (w8a8, w8a16):
        run(g, ["cost", "roofline"], hardware=hw)
    q8, q16 = (g["model.layers.0.self_attn.q_proj"] for g in (w8a8, w8a16))
    # the stream holds the activation in 16 bits; int8 is the GEMM's input dtype alone
    assert {w8a8.type_of(r).dtype for r in q8.inputs} == {"bf16", "int8"}
    assert w8a8.meta["act_dtype"] == "int8" and w8a8.meta["stream_dtype"] == "bf16"
    oc8, oc16 = meta_result(q8, "cost"), meta_result(q16, "cost")
    assert meta_result(q8, "time").seconds == pytest.approx(oc8.bytes / 3e12 + 1 * US)
    assert meta_result(q16, "time").seconds == pytest.approx(oc16.bytes / 1.5e12 + 1 * US)


def test_attention_over_an_int8_cache_is_no_dequantising_gemv():
    # the share is the weight's kernel's: core attention reading an int8 KV cache (its other
    # operand bf16) streams at the full bandwidth
    hw = hardware_from_dict(with_achievable(dequant_efficiency={"int8": 0.5}), "half-int8")
    cfg = config_from_dict(tiny_configs.LLAMA, "tiny")
    g = build_graph(cfg, Workload(batch=1, seq_len=1, past_len=64, kv_dtype="int8"))
    run(g, ["cost", "roofline"], attention="naive", hardware=hw)
    pv = g["model.layers.0.self_attn.core.pv"]
    assert "int8" in {g.type_of(r).dtype for r in pv.inputs}
    oc = meta_result(pv, "cost")
    t = meta_result(pv, "time").seconds
    assert t == pytest.approx(max(oc.flops / 1000e12, oc.bytes / 3e12) + 1 * US)
