"""The runtime's cost per op (issue 20 point 5): calibrate measures onnxruntime's dispatch of a
node, the calibration file holds it, and the calibrated roofline adds it to every op it times."""

import importlib.util

import pytest

from graphllm import Workload, build_graph
from graphllm.errors import ConfigError
from graphllm.models.calibration import calibration_from_dict
from graphllm.models.config import config_from_dict
from graphllm.models.hardware import hardware_from_dict
from graphllm.passes.registry import meta_result, run
from tests.support import tiny_configs
from tests.support.calibration import OLD_LOCAL, TABLE

DISPATCH = 2e-6


def _decode(hw):
    cfg = config_from_dict(tiny_configs.LLAMA, "tiny")
    g = build_graph(cfg, Workload(batch=1, seq_len=1, past_len=7))
    return g, run(g, ["cost", "roofline"], hardware=hw, attention="flash")["roofline"]


def test_every_op_timed_adds_the_dispatch_a_flash_region_once():
    plain = hardware_from_dict(OLD_LOCAL | {"calibration": TABLE}, "local")
    with_dispatch = hardware_from_dict(
        OLD_LOCAL | {"calibration": TABLE | {"dispatch": DISPATCH}}, "local"
    )
    _, before = _decode(plain)
    g1, after = _decode(with_dispatch)
    assert before.launch_seconds == 0 and before.kernels == 0
    timed = [n for n in g1.nodes() if meta_result(n, "time").seconds > 0]
    regions = {n.name.split(".core.")[0] for n in timed if ".core." in n.name}
    ops = [n for n in timed if ".core." not in n.name]
    assert after.kernels == len(ops) + len(regions) > len(regions) > 0
    assert after.launch_seconds == pytest.approx(after.kernels * DISPATCH)
    assert after.seconds == pytest.approx(before.seconds + after.kernels * DISPATCH)
    assert after.rate_model == "calibrated"


def test_the_figure_round_trips_and_a_file_without_it_reads_as_before():
    cal = calibration_from_dict(TABLE | {"dispatch": DISPATCH}, "local: calibration")
    assert cal.dispatch == DISPATCH and cal.to_dict()["dispatch"] == DISPATCH
    assert calibration_from_dict(cal.to_dict(), "again") == cal
    old = calibration_from_dict(TABLE, "local: calibration")
    assert old.dispatch is None and "dispatch" not in old.to_dict()


@pytest.mark.parametrize("bad", [-1e-6, 0.0, 1.0, "fast", True])
def test_a_damaged_dispatch_is_refused_in_one_line(bad):
    with pytest.raises(ConfigError, match=r"calibration.dispatch must be a number") as e:
        calibration_from_dict(TABLE | {"dispatch": bad}, "local: calibration")
    assert "\n" not in str(e.value)


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None, reason="no onnxruntime")
def test_calibrate_measures_it_and_says_so():
    from graphllm.runtime.calibrate import QUICK, calibrate

    hw = calibrate(repeats=2, progress=False, **QUICK)
    d = hw.calibration.dispatch
    assert d is not None and 1e-8 < d < 1e-3  # onnxruntime's per-node cost: about 0.5 us here
    assert "us a node (a chain of 64 Adds)" in hw.source
