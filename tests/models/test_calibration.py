"""calibrate's tables: which read bandwidth a step's working set gets, GEMM rates interpolated
over M at the nearest measured (K, N), validation, and local files from before the tables."""

import math

import pytest
import yaml

from graphllm.errors import ConfigError
from graphllm.models.calibration import calibration_from_dict
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
    path = local_path()
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(hw.to_dict()))
    assert load_hardware("local") == hw
    with rate_model(ideal=True, cuda_graphs=None):
        ideal = load_hardware("local")
    assert ideal.calibration is None and ideal.rate_model == "ideal"
    assert ideal.bandwidth() == 17.4e9  # the peak model's one figure, as before the tables


def test_gemm_table_cuts_shapes_to_the_memory_it_may_use():
    """A shape whose weight would not fit is timed with N cut to what fits, and an M whose
    activations would not fit is left out (405B's FFN in 1.5 GiB died of bad_alloc before)."""
    from graphllm.runtime.calibrate_tables import COPIES, gemm_table

    cap = 4 * COPIES * 64 * 512
    rows = gemm_table([(64, 4096), (64, 8192)], [1, 2, 128], 1, 1, 0.1, max_bytes=cap)
    assert {(m, k, n) for m, k, n, _ in rows} == {(1, 64, 512), (2, 64, 512)}
    assert all(rate > 0 for *_, rate in rows)
