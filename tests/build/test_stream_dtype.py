"""W8A8 activations (issue 20): with `act_dtype` fp8 or int8 the dtype is a GEMM's input, as
FP8 and int8 engines run it; the residual stream, the norms, the attention's inputs, the
matmuls' outputs and the tensor-parallel all-reduces stay 16-bit (`Workload.stream_dtype`),
and the matmuls still run at the fp8 or int8 GEMM rate."""

import pytest

from graphllm import Workload, build_graph
from graphllm.models.config import config_from_dict
from graphllm.models.hardware import hardware_from_dict
from graphllm.ops import OPS, SOURCE
from graphllm.passes.parallel.figures import comm_bytes
from graphllm.passes.parallel.partition import Strategy, partition
from graphllm.passes.registry import meta_result, run
from tests.support import tiny_configs
from tests.support.achievable_spec import SPEC

B, T = 2, 8


def _graph(act: str):
    cfg = config_from_dict(tiny_configs.LLAMA, "tiny")
    return build_graph(cfg, Workload(batch=B, seq_len=T, weight_dtype=act, act_dtype=act))


@pytest.mark.parametrize("act", ["fp8", "int8"])
def test_only_the_gemms_take_the_quantized_dtype(act):
    g = _graph(act)
    assert g.meta["act_dtype"] == act and g.meta["stream_dtype"] == "bf16"
    outs = {n.name: n.out.dtype for n in g.nodes() if OPS[n.op].category != SOURCE}
    assert act not in set(outs.values())  # no op writes it: only the weights are stored so
    for name in ("model.layers.0.input_layernorm", "model.layers.0.self_attn.q_proj"):
        assert outs[name] == "bf16", name
    q = g["model.layers.0.self_attn.q_proj"]
    assert [g.type_of(r).dtype for r in q.inputs] == ["bf16", act]


def test_a_bf16_graph_is_as_before():
    g = _graph("bf16")
    assert g.meta["stream_dtype"] == "bf16" == g.meta["act_dtype"]
    assert Workload(act_dtype="fp32").stream_dtype == "fp32"
    assert Workload(dtype="fp8").to_dict()["stream_dtype"] == "bf16"


def test_the_tensor_parallel_all_reduce_is_of_the_16_bit_stream():
    g = _graph("fp8")
    pg = partition(g, Strategy(tp=2))
    reduces = [n for n in pg.nodes() if n.op == "all_reduce"]
    assert reduces
    for n in reduces:
        payload, _ = comm_bytes(pg, n)
        assert pg.type_of(n.inputs[0]).dtype == "bf16"
        assert payload == B * T * 64 * 2  # the hidden state in bf16, not 1 byte an element


def test_the_matmuls_run_at_the_quantized_gemm_rate():
    spec = SPEC | {
        "peak_flops": SPEC["peak_flops"] | {"fp8": 2000e12},
        "achievable": SPEC["achievable"]
        | {"gemm_flops": {"bf16": 800e12, "fp8": 1600e12}, "memory_bandwidth": 1e15}
        | dict.fromkeys(("launch_seconds", "graph_launch_seconds", "graph_replay_seconds")),
    }
    hw = hardware_from_dict(spec, "fp8-test")
    g = _graph("fp8")
    run(g, ["cost", "roofline"], hardware=hw)
    q = g["model.layers.0.self_attn.q_proj"]
    flops = 2 * B * T * 64 * 64
    assert meta_result(q, "cost").flops == flops
    # compute-bound at 1e15 B/s, without launch costs: the FP8 GEMM rate, not bf16's
    assert meta_result(q, "time").seconds == pytest.approx(flops / 1600e12)


def test_the_attention_runs_at_the_streams_rate_and_w4a8_still_dequantises():
    spec = SPEC | {
        "peak_flops": SPEC["peak_flops"] | {"fp8": 2000e12},
        "achievable": SPEC["achievable"]
        | {
            "gemm_flops": {"bf16": 800e12, "fp8": 1600e12},
            "attention_flops": {"bf16": 600e12, "fp8": 1200e12},
            "memory_bandwidth": 1e15,
            "dequant_efficiency": {"int4g32": 0.5},
        }
        | dict.fromkeys(("launch_seconds", "graph_launch_seconds", "graph_replay_seconds")),
    }
    hw = hardware_from_dict(spec, "fp8-test")
    g = _graph("fp8")
    run(g, ["cost", "roofline"], attention="naive", hardware=hw)
    scores = g["model.layers.0.self_attn.core.scores"]
    flops = meta_result(scores, "cost").matmul
    assert flops and meta_result(scores, "time").seconds == pytest.approx(flops / 600e12)
    # W4A8: int4g32 weights under fp8 activations go through a dequantising kernel
    cfg = config_from_dict(tiny_configs.LLAMA, "tiny")
    wl = Workload(batch=1, seq_len=1, past_len=4, weight_dtype="int4g32", act_dtype="fp8")
    w4 = build_graph(cfg, wl)
    run(w4, ["cost", "roofline"], hardware=hw)
    q = w4["model.layers.0.self_attn.q_proj"]
    assert meta_result(q, "time").seconds == pytest.approx(
        meta_result(q, "cost").bytes / (0.5 * 1e15)
    )
