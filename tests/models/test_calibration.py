"""calibrate's tables: which read bandwidth a step's working set gets, GEMM rates interpolated
over M at the nearest measured (K, N), fused attention's rate by head shape and step,
validation, and local files from before the tables."""

import math

import pytest
import yaml

from graphllm.errors import ConfigError
from graphllm.models.calibration import attention_flops, calibration_from_dict
from graphllm.models.hardware import hardware_from_dict, load_hardware, local_path, rate_model
from tests.support.calibration import OLD_LOCAL, TABLE, GiB, MiB

CAL = calibration_from_dict(TABLE, "test")


def geo(a, b, w):
    return math.exp((1 - w) * math.log(a) + w * math.log(b))


@pytest.mark.parametrize(
    ("working_set", "bandwidth"),
    [
        (MiB, 100e9),  # a measured size: its figure
        (MiB // 4, 100e9),  # below the sweep: its smallest size's
        (4 * MiB, geo(100e9, 80e9, 0.5)),  # 4 MiB is halfway from 1 to 16 MiB in log
        (32 * MiB, geo(80e9, 20e9, 0.5)),  # the cache's edge: between the two sides
        (160e6, geo(20e9, 16e9, math.log(160e6 / (64 * MiB)) / math.log(16))),
        (8 * GiB, 16e9),  # past the sweep: the largest (DRAM) figure
    ],
)
def test_a_working_set_gets_the_bandwidth_measured_around_it(working_set, bandwidth):
    assert CAL.bandwidth_at(working_set) == pytest.approx(bandwidth, rel=1e-12)


@pytest.mark.parametrize(
    ("m", "n", "k", "rate"),
    [
        (1, 1408, 512, 10e9),
        (128, 1408, 512, 50e9),
        (16, 1408, 512, geo(10e9, 50e9, 4 / 7)),  # log2 16 / log2 128
        (512, 1408, 512, geo(50e9, 90e9, 0.5)),
        (8192, 1408, 512, 90e9),  # past the largest M: its rate
        (1, 512, 512, 10e9),  # nearest (K, N) in log distance: 512 x 1408, not 512 x 32000
        (1, 30000, 512, 3e9),  # an LM head: the 512 x 32000 row
        (64, 32000, 512, geo(3e9, 30e9, 6 / 11)),  # that row has no M=128: 1 to 2048
    ],
)
def test_a_gemm_gets_the_rate_of_its_shape(m, n, k, rate):
    assert CAL.gemm_rate(m, n, k) == pytest.approx(rate, rel=1e-12)


@pytest.mark.parametrize(
    ("heads", "seq", "past", "rate"),
    [
        ((4, 2, 16), 1, 3, 1e9),  # a measured step: its figure (4 keys)
        ((4, 2, 16), 1, 15, geo(1e9, 4e9, 0.5)),  # 16 keys: halfway from 4 to 64 in log
        ((4, 2, 16), 1, 500, 4e9),  # past the longest cache measured: its rate
        ((4, 2, 16), 2, 0, 1e9),  # 2 new tokens: nearer 1 than 128 in log, at 2 keys
        ((4, 2, 16), 100, 0, 20e9),  # a prefill: the prefill row
        ((32, 8, 64), 1, 2000, 9e9),  # another head shape: its own row
        ((4, 4, 16), 1, 3, None),  # a head shape not measured: no table rate
    ],
)
def test_attention_gets_the_rate_of_its_heads_and_step(heads, seq, past, rate):
    got = CAL.attention_rate(*heads, seq, past)
    assert got == (rate if rate is None else pytest.approx(rate, rel=1e-12))


def test_attention_flops_are_the_causal_pairs_the_cost_pass_counts():
    """The table's rate is over `attention_flops`; the roofline divides the FLOPs the cost pass
    gives core attention's matmuls under flash attention by it: the two must be the same count."""
    from graphllm import Workload, build_graph
    from graphllm.models.config import config_from_dict
    from graphllm.passes.cost import scopes_of
    from graphllm.passes.registry import meta_result, run
    from tests.support import tiny_configs

    cfg = config_from_dict(tiny_configs.LLAMA, "tiny")
    for seq, past in ((1, 7), (5, 3), (16, 0)):
        g = build_graph(cfg, Workload(batch=1, seq_len=seq, past_len=past))
        run(g, ["cost"], attention="flash")
        layer0 = 0
        for n in g.nodes():
            scopes = [s for s, k in scopes_of(g, n.name) if k == "core_attention"]
            if scopes and ".layers.0." in scopes[0]:
                layer0 += meta_result(n, "cost").matmul_causal
        assert layer0 == attention_flops(4, 16, seq, past) > 0


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"read_bandwidth": []}, "read_bandwidth must be a non-empty list"),
        ({"gemm": [{"m": 1, "k": 2, "n": 3}]}, r"gemm: each point must be a mapping of m, k, n"),
        ({"read_bandwidth": [{"bytes": MiB, "bandwidth": -1.0}]}, "bandwidth must be a number"),
        ({"read_bandwidth": [{"bytes": 1.5, "bandwidth": 1e9}]}, "bytes must be an integer"),
        (
            {
                "read_bandwidth": [
                    {"bytes": MiB, "bandwidth": 1e9},
                    {"bytes": MiB, "bandwidth": 2e9},
                ]
            },
            "measured twice",
        ),
        ({"speed": 1}, "unknown field 'speed'"),
        ({"attention": []}, "attention must be a non-empty list"),
        (
            {"attention": [TABLE["attention"][0] | {"past": -1}]},
            r"attention.past must be an integer in \[0, ",
        ),
        ({"attention": [TABLE["attention"][0] | {"seq": 0}]}, r"attention.seq must be"),
        ({"attention": [TABLE["attention"][0] | {"flops": 0.0}]}, r"attention.flops must be"),
        ({"attention": TABLE["attention"][:1] * 2}, "head shape and step is measured twice"),
        ({"runtime": None}, "runtime must be a line of text"),
    ],
)
def test_a_damaged_table_is_refused_in_one_line(change, match):
    with pytest.raises(ConfigError, match=match) as e:
        calibration_from_dict(TABLE | change, "local: calibration")
    assert "\n" not in str(e.value)


def test_an_old_local_file_loads_and_predicts_as_before(cache_dir):
    path = local_path()
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(OLD_LOCAL))
    hw = load_hardware("local")
    assert hw.calibration is None and hw.rate_model == "ideal"
    assert hw.bandwidth() == 17.4e9 and "calibration" not in hw.to_dict()


def test_tables_round_trip_through_the_local_file_and_ideal_drops_them(cache_dir):
    hw = hardware_from_dict(OLD_LOCAL | {"calibration": TABLE}, "local")
    assert hw.rate_model == "calibrated" and hw.calibration == CAL
    assert len(CAL.attention) == 4 and hw.to_dict()["calibration"]["attention"][0]["past"] == 3
    path = local_path()
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(hw.to_dict()))
    assert load_hardware("local") == hw
    with rate_model(ideal=True, cuda_graphs=None):
        ideal = load_hardware("local")
    assert ideal.calibration is None and ideal.rate_model == "ideal"
    assert ideal.bandwidth() == 17.4e9  # the peak model's one figure, as before the tables


def test_a_table_from_before_the_attention_table_loads_without_one():
    old = {k: v for k, v in TABLE.items() if k != "attention"}
    cal = calibration_from_dict(old, "local: calibration")
    assert cal.attention == () and cal.attention_rate(4, 2, 16, 1, 3) is None
    assert "attention" not in cal.to_dict() and cal.gemm == CAL.gemm


def test_gemm_table_cuts_shapes_to_the_memory_it_may_use():
    """A shape whose weight would not fit is timed with N cut to what fits, and an M whose
    activations would not fit is left out (405B's FFN in 1.5 GiB died of bad_alloc before)."""
    from graphllm.runtime.calibrate_tables import COPIES, gemm_table

    cap = 4 * COPIES * 64 * 512
    rows = gemm_table([(64, 4096), (64, 8192)], [1, 2, 128], 1, 1, 0.1, max_bytes=cap)
    assert {(m, k, n) for m, k, n, _ in rows} == {(1, 64, 512), (2, 64, 512)}
    assert all(rate > 0 for *_, rate in rows)


def test_attention_table_leaves_out_a_step_whose_cache_does_not_fit():
    from graphllm.runtime.calibrate_tables import COPIES, attention_table

    # a cache of 8 positions fits; one of 65536 (2 x 8 MiB of fp32 K and V, 8 copies) does not
    cap = 4 * COPIES * (2 * 16 * 64 + 2 * 16 * 4 + 64)
    rows = attention_table([(2, 1, 16)], [(1, 7), (1, 65535)], 1, 1, 10.0, max_bytes=cap)
    assert [p[:5] for p in rows] == [(2, 1, 16, 1, 7)] and rows[0][5] > 0
