"""The achievable rate model: measured GEMM / attention / HBM rates in the roofline, the launch
overhead of every kernel (with and without CUDA graphs), and the alpha-beta time of every
collective. Expected values are computed by hand from the figures of a small device spec."""

from dataclasses import replace

import pytest

from graphllm import Workload, build_graph
from graphllm.errors import ConfigError
from graphllm.models.config import config_from_dict
from graphllm.models.hardware import hardware_from_dict, load_hardware, rate_model
from graphllm.ops import OPS, SOURCE
from graphllm.passes.parallel.figures import collective_seconds, link_bandwidth
from graphllm.passes.parallel.sharding import Mesh
from graphllm.passes.registry import meta_result, run
from tests.support import tiny_configs
from tests.support.achievable_spec import SPEC, US, with_achievable

HW = hardware_from_dict(SPEC, "test")
MB = 1e6


def tiny(**wl):
    cfg = config_from_dict(tiny_configs.LLAMA, "tiny")
    return build_graph(cfg, Workload(**({"batch": 1, "seq_len": 8} | wl)))


# -- collectives: latency steps x step latency + wire bytes / bus bandwidth ---------------------
@pytest.mark.parametrize(
    ("kind", "n", "steps"),
    [
        ("all_reduce", 8, 6),  # tree 2 log2(8) = 6 beats ring 2(8-1) = 14
        ("all_reduce", 2, 2),  # ring 2 = tree 2
        ("all_reduce", 3, 4),  # ring 4 = tree 2 ceil(log2 3) = 4
        ("all_gather", 8, 7),  # ring n-1
        ("reduce_scatter", 4, 3),
        ("all_to_all", 8, 7),  # pairwise n-1
        ("send", 2, 1),
    ],
)
def test_a_collective_inside_a_node_is_its_steps_latency_plus_bytes_over_busbw(kind, n, steps):
    mesh = Mesh((("tp", n),))
    wire = OPS[kind].wire(n) * 64 * MB
    expected = steps * 2 * US + wire / 300e9
    assert collective_seconds(kind, n, wire, mesh, "tp", HW) == pytest.approx(expected)


def test_a_collective_across_nodes_takes_the_network_figures():
    mesh = Mesh((("dp", 4), ("tp", 8)))  # dp groups span 32 devices: four nodes
    wire = OPS["all_reduce"].wire(4) * 100 * MB
    expected = 4 * 5 * US + wire / 40e9  # tree 2 log2(4) = 4 beats ring 2(4-1) = 6
    assert collective_seconds("all_reduce", 4, wire, mesh, "dp", HW) == pytest.approx(expected)
    assert link_bandwidth(mesh, "dp", HW) == 40e9 and link_bandwidth(mesh, "tp", HW) == 300e9


def test_a_gradient_reduction_is_timed_like_any_collective():
    from graphllm.passes.parallel.figures import gradient_seconds

    mesh = Mesh((("dp", 8),))
    wire = OPS["reduce_scatter"].wire(8) * 1e9
    c = {
        "mesh_axis": "dp",
        "kind": "reduce_scatter",
        "group_size": 8,
        "wire_bytes_per_device": wire,
    }
    assert gradient_seconds(c, mesh, HW) == pytest.approx(7 * 2 * US + wire / 300e9)
    assert gradient_seconds(c, mesh, HW.ideal()) == pytest.approx(wire / 450e9)


def test_the_ideal_model_has_no_latency_and_the_line_rate():
    mesh = Mesh((("tp", 8),))
    wire = OPS["all_reduce"].wire(8) * 64 * MB
    assert collective_seconds("all_reduce", 8, wire, mesh, "tp", HW.ideal()) == wire / 450e9
    assert collective_seconds("all_reduce", 8, 0.0, mesh, "tp", HW) == 0.0


def test_small_all_reduces_are_latency_bound():
    """The issue's case: 160 all-reduces of one token's 8192 bf16 values over TP=2."""
    h100, mesh = load_hardware("h100"), Mesh((("tp", 2),))
    wire = OPS["all_reduce"].wire(2) * 8192 * 2
    each = collective_seconds("all_reduce", 2, wire, mesh, "tp", h100)
    # NCCL's tuner (h100's nccl-nvlink-hopper): the ring's LL, 6.6 us + 2 hops of 0.6 us, at
    # LL's 141 GB/s (tests/models/test_nccl_tuning.py works the other cases)
    assert each == pytest.approx(7.8 * US + 8192 * 2 / 141e9)
    assert 160 * each > 0.9e-3  # about a millisecond, where the ideal model gives 6 us
    assert 160 * collective_seconds("all_reduce", 2, wire, mesh, "tp", h100.ideal()) < 10 * US


def test_partition_times_its_all_reduces_with_the_alpha_beta_model():
    from graphllm.passes.parallel.figures import comm_bytes
    from graphllm.passes.parallel.partition import Strategy, partition

    pg = partition(tiny(seq_len=1, past_len=4), Strategy(tp=2), HW)
    mesh = meta_result(pg, "partition").mesh
    reduces = [n for n in pg.nodes() if OPS[n.op].latency_steps and OPS[n.op].collective]
    assert reduces
    for n in reduces:
        _, wire = comm_bytes(pg, n)
        steps = min(OPS[n.op].latency_steps(n.attrs["group"]).values())
        expect = steps * 2 * US + wire / 300e9
        assert collective_seconds(n.op, n.attrs["group"], wire, mesh, "tp", HW) == expect


# -- the roofline's rates and launches ---------------------------------------------------------
def _kernels(g) -> list:
    return [n for n in g.nodes() if OPS[n.op].category != SOURCE and meta_result(n, "time").seconds]


def _own(n) -> float:
    """An op's time before its launch on HW: a matmul at the GEMM rate, core attention's at the
    attention rate (over the causal FLOPs), the rest at the peak; bytes at 3 TB/s."""
    oc = meta_result(n, "cost")
    if ".core." in n.name:
        return max((oc.flops - oc.matmul + oc.matmul_causal) / (600e12 if oc.matmul else 1000e12),
                   oc.bytes / 3e12)  # fmt: skip
    return max(oc.flops / (800e12 if oc.matmul else 1000e12), oc.bytes / 3e12)


def test_matmuls_run_at_the_gemm_rate_and_core_attention_at_the_attention_rate():
    g = tiny(seq_len=4096)
    res = run(g, ["cost", "roofline"], hardware=replace(HW, cuda_graphs=False))
    q = g["model.layers.0.self_attn.q_proj"]
    t = _own(q)
    assert meta_result(q, "time").seconds == pytest.approx(t + max(0.0, 4 * US - t))
    # the flash attention region is one kernel: its ops share its launch by their times
    core = [n for n in _kernels(g) if n.name.startswith("model.layers.0.self_attn.core.")]
    total = sum(_own(n) for n in core)
    scores = g["model.layers.0.self_attn.core.scores"]
    assert {n.op for n in core} >= {"scores", "softmax", "pv"}
    assert meta_result(scores, "time").seconds == pytest.approx(
        _own(scores) * max(1.0, 4 * US / total)
    )
    assert res["roofline"].rate_model == "achievable"


@pytest.mark.parametrize(
    ("mnk", "efficiency"),
    [
        ((2048, 4096, 4096), 2048 * 4096 / (4 * 132 * 128 * 128)),  # 512 tiles: 4 waves
        ((128, 4096, 4096), 128 * 4096 * 4 / (132 * 128 * 128)),  # 32 tiles, K split 4 ways
        ((1, 4096, 4096), 4096 * 4 / (132 * 16 * 128)),  # rows rounded up to 16
        ((128, 11008, 4096), 128 * 11008 / (132 * 128 * 128)),  # 86 tiles: one part-empty wave
        ((16, 256, 256), 16 * 256 * 2 / (132 * 16 * 128)),  # split-K stops at K's 2 tiles
    ],
)
def test_tile_and_wave_quantisation_by_hand(mnk, efficiency):
    ach = load_hardware("h100").achievable
    assert ach.gemm_efficiency(*mnk) == pytest.approx(efficiency)


def test_a_prefill_gemm_is_timed_at_its_quantised_rate():
    h100 = replace(load_hardware("h100"), cuda_graphs=False)
    cfg = config_from_dict(tiny_configs.LLAMA, "tiny")
    g = build_graph(cfg, Workload(batch=1, seq_len=512))
    run(g, ["cost", "roofline"], hardware=h100)
    q = g["model.layers.0.self_attn.q_proj"]
    oc = meta_result(q, "cost")
    n = q.out.shape(g.bindings)[-1]
    eff = h100.achievable.gemm_efficiency(512, n, oc.matmul / (2 * 512 * n))
    t = max(oc.matmul / (794.5e12 * eff), oc.bytes / 2.84e12)
    # it streams its weight: gpu-small-kernels' H200 fixed cost outside a graph, 3.43 us
    assert meta_result(q, "time").seconds == pytest.approx(t + max(2.43 * US - t, 3.43 * US))


# a Llama layer's kernels, by the op table's categories: each GEMM its own, the elementwise,
# reduction and movement ops between two of them one kernel, the flash attention region one
LLAMA_LAYER_KERNELS = [
    ["rmsnorm"],
    ["linear"],
    ["linear"],
    ["linear"],
    ["rope", "rope", "kv_concat", "kv_concat"],
    ["scores", "mul_const", "mask", "softmax", "pv"],
    ["linear"],
    ["add", "rmsnorm"],
    ["linear"],
    ["linear"],
    ["silu", "mul"],
    ["linear"],
    ["add"],  # the next layer's norm is in the next layer: a kernel never spans two
]


def _expected_kernels(g) -> list[list]:
    """The kernels of LLAMA_LAYER_KERNELS, matched to the graph's timed ops in order."""
    ops = _kernels(g)
    out, i = [[ops[0]]], 1  # the embedding
    for _ in range(2):  # the tiny Llama's layers
        for kinds in LLAMA_LAYER_KERNELS:
            out.append(ops[i : i + len(kinds)])
            assert [n.op for n in out[-1]] == kinds
            i += len(kinds)
    out += [[n] for n in ops[i:]]  # the final norm, then the LM head
    assert [n.op for n in ops[i:]] == ["rmsnorm", "linear"]
    return out


def test_eager_launches_floor_each_fused_kernel_at_the_enqueue_time():
    g = tiny(seq_len=1, past_len=4)
    eager = run(g, ["cost", "roofline"], hardware=replace(HW, cuda_graphs=False))["roofline"]
    ideal = run(tiny(seq_len=1, past_len=4), ["cost", "roofline"], hardware=HW.ideal())
    kernels = _expected_kernels(g)
    assert eager.kernels == len(kernels) == 1 + 2 * 13 + 2 and not eager.cuda_graphs
    # a tiny model's kernels are all shorter than 4 us: each takes the enqueue's 4 us, shared by
    # its ops in proportion to their own times
    for ops in kernels:
        total = sum(_own(n) for n in ops)
        assert total < 4 * US
        assert sum(meta_result(n, "time").seconds for n in ops) == pytest.approx(4 * US)
        for n in ops:
            assert meta_result(n, "time").seconds == pytest.approx(_own(n) * 4 * US / total)
    assert eager.launch_seconds == pytest.approx(
        sum(4 * US - sum(_own(n) for n in ops) for ops in kernels)
    )
    assert ideal["roofline"].kernels == 0 and ideal["roofline"].launch_seconds == 0


def test_a_long_fused_kernel_hides_its_launch():
    # three 4096-token sequences: the SiLU and its gate are each shorter than the 4 us enqueue,
    # which each op launched on its own would wait for; fused, their kernel outlasts it
    g = tiny(batch=3, seq_len=4096)
    run(g, ["cost", "roofline"], hardware=replace(HW, cuda_graphs=False))
    act, mul = g["model.layers.0.mlp.act_fn"], g["model.layers.0.mlp.mul"]
    assert max(_own(act), _own(mul)) < 4 * US < _own(act) + _own(mul)
    for n in (act, mul):
        assert meta_result(n, "time").seconds == pytest.approx(_own(n))


def test_cuda_graphs_add_a_gap_per_kernel_and_one_replay_per_step():
    g = tiny(seq_len=1, past_len=4)
    r = run(g, ["cost", "roofline"], hardware=HW)["roofline"]  # decode: graphs by default
    ideal = run(tiny(seq_len=1, past_len=4), ["cost", "roofline"], hardware=HW.ideal())
    own = sum(
        max(meta_result(n, "cost").flops / 1000e12, meta_result(n, "cost").bytes / 3e12)
        for n in _kernels(g)
    )
    assert r.cuda_graphs and not ideal["roofline"].cuda_graphs
    assert r.launch_seconds == pytest.approx(r.kernels * 1 * US + 10 * US)
    assert r.seconds == pytest.approx(own + r.launch_seconds, rel=1e-3)


STREAMING = with_achievable(stream_launch_seconds=7 * US, graph_stream_launch_seconds=3 * US)


@pytest.mark.parametrize("graphs", [True, False])
def test_a_kernel_streaming_a_weight_or_the_cache_pays_the_streaming_fixed_cost(graphs):
    hw = replace(hardware_from_dict(STREAMING, "streaming"), cuda_graphs=graphs)
    g = tiny(seq_len=1, past_len=4)
    r = run(g, ["cost", "roofline"], hardware=hw)["roofline"]

    def extra(name: str) -> float:
        """What the launch adds to the kernel of op `name` (core: the flash attention region)."""
        ops = (
            [g[name]]
            if name != "core"
            else [n for n in _kernels(g) if ".0.self_attn.core." in n.name]
        )
        return sum(meta_result(n, "time").seconds - _own(n) for n in ops)

    weight, small = "model.layers.0.mlp.down_proj", "model.layers.0.mlp_residual"
    norm = "model.layers.0.input_layernorm"  # reads a weight, but is no matmul: stays in L2
    core = "core"
    if graphs:
        assert extra(weight) == pytest.approx(3 * US)
        assert extra(core) == pytest.approx(3 * US)
        assert extra(small) == pytest.approx(1 * US)
        assert extra(norm) == pytest.approx(1 * US)
    else:
        assert extra(weight) == pytest.approx(7 * US)  # more than the 4 us enqueue floor
        assert extra(core) == pytest.approx(7 * US)
        assert extra(small) == pytest.approx(4 * US - _own(g[small]))
        assert extra(norm) == pytest.approx(4 * US - _own(g[norm]))
    plain = run(tiny(seq_len=1, past_len=4), ["cost", "roofline"],
                hardware=replace(HW, cuda_graphs=graphs))["roofline"]  # fmt: skip
    assert r.launch_seconds > plain.launch_seconds  # the streaming figures are what moved it


def test_presets_carry_gpu_small_kernels_launch_figures():
    for name, figures in (
        ("a100", (2.62e-6, 1.34e-6, 4.99e-6, 3.33e-6)),
        ("h100", (2.43e-6, 1.26e-6, 3.43e-6, 1.78e-6)),
        ("h200", (2.43e-6, 1.26e-6, 3.43e-6, 1.78e-6)),
    ):
        ach = load_hardware(name).achievable
        got = (
            ach.launch_seconds,
            ach.graph_launch_seconds,
            ach.stream_launch_seconds,
            ach.graph_stream_launch_seconds,
        )
        assert got == figures, name
        assert "gpu-small-kernels" in ach.source and "1038c5d" in ach.source


def test_prefill_launches_eagerly_by_default_and_the_flag_overrides():
    assert not HW.graphs_for("prefill") and HW.graphs_for("decode")
    g = tiny(seq_len=8)
    assert not run(g, ["cost", "roofline"], hardware=HW)["roofline"].cuda_graphs
    forced = replace(HW, cuda_graphs=True)
    assert run(tiny(seq_len=8), ["cost", "roofline"], hardware=forced)["roofline"].cuda_graphs


def test_rate_model_context_gives_the_ideal_device_and_the_graph_choice():
    with rate_model(ideal=True, cuda_graphs=None):
        assert load_hardware("h100").rate_model == "ideal"
    with rate_model(ideal=False, cuda_graphs=False):
        h = load_hardware("h100")
        assert h.rate_model == "achievable" and not h.graphs_for("decode")
    assert load_hardware("h100").rate_model == "achievable"


def test_every_nvidia_preset_with_achievable_figures_names_its_sources():
    for name in ("h100-sxm", "h200-sxm", "a100-sxm-80gb"):
        ach = load_hardware(name).achievable
        assert ach is not None
        for word in ("GEMM", "Attention", "HBM", "NVLink", "Network", "Launch"):
            assert word in ach.source, (name, word)
    assert load_hardware("h100").gemm_rate("bf16") == 794.5e12
    assert load_hardware("h100").gemm_rate("fp8") == 1402.6e12
    assert load_hardware("a100").gemm_rate("fp8") == 271.2e12  # no FP8: BF16 as the peaks do
    assert load_hardware("h100").gemm_rate("fp32") == 67e12  # unmeasured: the peak


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"launch_seconds": 5.0}, "launch_seconds"),
        ({"interconnect": {"bus_bandwidth": 1e9}}, "step_latency"),
        ({"gemm_flops": {"bf17": 1e12}}, "bf17"),
        ({"memory_bandwidth": 5e-324}, "memory_bandwidth"),
        ({"colour": 1}, "colour"),
        ({"gemm_tile": [128]}, "gemm_tile"),
        ({"sm_count": 0}, "sm_count"),
    ],
)
def test_a_bad_achievable_figure_is_one_line_naming_it(change, says):
    spec = with_achievable(**change)
    with pytest.raises(ConfigError, match=says) as e:
        hardware_from_dict(spec, "bad")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("ideal", [False, True])
def test_the_perfetto_trace_times_collectives_with_their_latency(tmp_path, ideal):
    import json

    from click.testing import CliRunner

    from graphllm.cli import main

    out = tmp_path / "trace.json"
    args = ["partition", "--config", "examples/tiny.yaml", "--tp", "2", "-t", "1", "--past-len"]
    args += ["8", "--hardware", "h100", "--trace", str(out)] + (["--ideal"] if ideal else [])
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    ev = json.loads(out.read_text())["traceEvents"]
    reduces = [e["dur"] for e in ev if e["ph"] == "X" and e["name"].endswith("all_reduce")]
    assert reduces
    if ideal:  # a few kB at 450 GB/s
        assert all(d < 1 for d in reduces)
    else:  # NCCL's ring LL: 6.6 us + 2 NVLink hops of 0.6 us, plus the bytes at 141 GB/s
        assert all(7.8 <= d < 8.5 for d in reduces)


@pytest.mark.parametrize("command", ["partition", "plan"])
def test_partition_and_plan_json_say_which_model_timed_them(command):
    import json

    from click.testing import CliRunner

    from graphllm.cli import main

    size = ["--tp", "2"] if command == "partition" else ["--devices", "2"]
    base = [command, "--config", "examples/tiny.yaml", *size, "-t", "1", "--past-len", "8"]
    for extra, model in (([], "achievable"), (["--ideal"], "ideal")):
        r = CliRunner().invoke(main, [*base, "--hardware", "h100", "--json", *extra])
        assert r.exit_code == 0, r.output
        doc = json.loads(r.output)
        assert doc["rate_model"] == model
        assert (doc["hardware"]["achievable"] is None) == (model == "ideal")
