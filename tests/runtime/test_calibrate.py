"""`graphllm calibrate` at tiny sizes: the measured spec saved as `local` and loaded back."""

from graphllm.models.hardware import list_hardware, load_hardware
from graphllm.runtime.calibrate import QUICK, calibrate, save_local


def test_calibrate_round_trip(cache_dir):
    hw = calibrate(weights_bytes=2 << 20, repeats=2, progress=False, **QUICK)
    assert hw.name == "local" and hw.devices_per_node == 1
    assert hw.peak("fp32") > 0 and hw.peak("bf16") == hw.peak("fp32")
    assert hw.memory_bandwidth > 0 and hw.memory_bytes > 0
    assert hw.extra["memory_bandwidth_model"] > 0 and hw.extra["model_buffer_bytes"] == 2 << 20
    assert hw.interconnect_bandwidth is None and hw.network_bandwidth is None
    # GroupQueryAttention at --quick's heads, a decode step and a prefill, each timed
    att = hw.calibration.attention
    assert [p[:5] for p in att] == [(2, 1, 16, 1, 8), (2, 1, 16, 8, 0)]
    assert all(rate > 0 for *_, rate in att)
    path = save_local(hw)
    assert path == cache_dir / "graphllm" / "hardware-local.yaml"
    assert load_hardware("local") == hw
    assert "local" in dict(list_hardware())
    assert list(path.parent.iterdir()) == [path]  # no temp file left behind
