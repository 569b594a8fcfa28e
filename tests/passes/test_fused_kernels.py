"""The kernels the achievable model launches (passes/roofline.py `fused_kernels`): a run of
elementwise, reduction and movement ops between two GEMMs is one kernel, a flash attention region
one, every GEMM and collective its own, and no kernel spans two layers. Rows are written by hand:
(name, op, compute s, bytes, streams, flash region, scopes), an `add` standing for any fusible
op and a `linear` for any kernel of its own."""

import pytest

import graphllm
from graphllm.models.hardware import load_hardware
from graphllm.passes.cost import scopes_of
from graphllm.passes.registry import run
from graphllm.passes.roofline import FUSED, OWN, Timer, _core, fused_kernels, kernel_key

A = [("a", "layer")]
B = [("b", "layer")]
CORE = [("a", "layer"), ("a.core", "core_attention")]


def _row(key, scopes, core=None):
    return ("op", {FUSED: "add", OWN: "linear"}[key], 0.0, 0.0, False, core, scopes)


def test_a_run_between_two_gemms_is_one_kernel_and_a_zero_time_op_breaks_no_run():
    rows = [_row(FUSED, A), _row(OWN, A), _row(FUSED, A), _row(FUSED, A), _row(FUSED, A)]
    rows += [_row(OWN, A), _row(FUSED, A)]
    seconds = [1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]  # the view (index 3) takes no time
    assert fused_kernels(rows, seconds, flash=True) == [[0], [1], [2, 4], [5], [6]]


def test_a_run_ends_at_a_layer_and_at_a_flash_region():
    rows = [_row(FUSED, A), _row(FUSED, B)]  # the last add of a layer, the next one's norm
    assert fused_kernels(rows, [1.0, 1.0], flash=True) == [[0], [1]]
    # a fused op right after attention (qwen3-next's output gate) is a kernel of its own
    rows = [_row(FUSED, A), _row(OWN, CORE, "a.core"), _row(FUSED, CORE, "a.core")]
    rows += [_row(FUSED, A), _row(FUSED, A)]
    assert fused_kernels(rows, [1.0] * 5, flash=True) == [[0], [1, 2], [3, 4]]
    # without flash attention the region's ops are kernels like any other
    assert fused_kernels(rows, [1.0] * 5, flash=False) == [[0], [1], [2, 3, 4]]


def test_a_flash_region_is_one_kernel_even_where_its_ops_are_apart():
    rows = [_row(OWN, CORE, "a.core"), _row(FUSED, A), _row(FUSED, CORE, "a.core")]
    assert fused_kernels(rows, [1.0] * 3, flash=True) == [[0, 2], [1]]


def test_kernel_keys_come_from_the_op_table_categories():
    g = graphllm.build_graph(
        graphllm.load_config("llama3.2-1b"), graphllm.Workload(batch=1, seq_len=4)
    )
    keys = {n.op: kernel_key(n.op) for n in g.nodes()}
    assert keys["linear"] == keys["scores"] == OWN
    assert keys["rmsnorm"] == keys["add"] == keys["silu"] == keys["rope"] == FUSED
    assert keys["split_heads"] == keys["embedding"] == FUSED


def test_qwen3_next_output_gate_is_not_in_the_attention_kernel():
    g = graphllm.build_graph(
        graphllm.load_config("qwen3-next-80b-a3b"),
        graphllm.Workload(batch=1, seq_len=1, past_len=64),
    )
    hw = load_hardware("h100")
    run(g, ["cost", "roofline"], hardware=hw)
    timer = Timer(g, hw, True)
    rows, names = [], []
    for n in g.nodes():
        sc = scopes_of(g, n.name)
        rows.append((n.name, n.op, *timer.base(n, n.meta["cost"], sc), _core(sc), sc))
        names.append(n.name)
    seconds = [max(r[2], r[3] / timer.bw) for r in rows]
    kernels = fused_kernels(rows, seconds, flash=True)
    attention = next(k for k in kernels if ".self_attn.core." in names[k[0]])
    layer = names[attention[0]].split(".self_attn.")[0]
    assert all(".self_attn.core." in names[i] for i in attention)
    after = kernels[kernels.index(attention) + 1]
    assert names[after[0]].startswith(f"{layer}.self_attn.")
    assert not any(".core." in names[i] for i in after)


@pytest.mark.parametrize("preset", ["llama3.2-1b", "mixtral-8x7b"])
def test_every_timed_op_is_in_exactly_one_kernel(preset):
    g = graphllm.build_graph(
        graphllm.load_config(preset), graphllm.Workload(batch=1, seq_len=1, past_len=8)
    )
    hw = load_hardware("h100")
    rep = run(g, ["cost", "roofline"], hardware=hw)["roofline"]
    timer = Timer(g, hw, True)
    rows = []
    for n in g.nodes():
        sc = scopes_of(g, n.name)
        rows.append((n.name, n.op, *timer.base(n, n.meta["cost"], sc), _core(sc), sc))
    seconds = [max(r[2], r[3] / timer.bw) for r in rows]
    kernels = fused_kernels(rows, seconds, flash=True)
    flat = sorted(i for k in kernels for i in k)
    assert flat == [i for i, t in enumerate(seconds) if t > 0]
    assert rep.kernels == len(kernels)
