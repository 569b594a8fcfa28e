"""Hardware presets, spec files, and `local` before any calibration."""

import json

import pytest
import yaml

from graphllm.errors import ConfigError
from graphllm.models.hardware import Hardware, _presets, list_hardware, load_hardware
from tests.support.tiny_configs import HARDWARE_SPEC

# every test gets its own cache dir, so a real calibration never leaks in or out
pytestmark = pytest.mark.usefixtures("cache_dir")


def spec(**over):
    d = dict(HARDWARE_SPEC)
    d.update(over)
    return {k: v for k, v in d.items() if v != "DROP"}


def write(tmp_path, d, name="hw.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(d) if name.endswith(".yaml") else json.dumps(d))
    return path


def test_preset_figures():
    h100 = load_hardware("h100-sxm")
    assert h100.peak_flops["bf16"] == 989.4e12
    assert h100.peak("fp8") == 1978.9e12
    assert h100.peak("fp32") == 67e12  # the FP32 figure, not TF32
    assert h100.memory_bandwidth == 3.35e12
    assert h100.memory_bytes == 80e9
    assert h100.interconnect_bandwidth == 450e9
    assert h100.network_bandwidth == 50e9
    h200 = load_hardware("h200")
    assert (h200.memory_bandwidth, h200.memory_bytes) == (4.8e12, 141e9)
    a100 = load_hardware("a100")
    assert a100.peak("bf16") == 312e12
    assert a100.peak("fp8") == 312e12  # no FP8 on Ampere: computes in 16-bit
    assert a100.memory_bandwidth == 2.039e12
    assert load_hardware("mi300x").peak("fp16") == 1307.4e12
    l40s = load_hardware("l40s")
    assert (l40s.peak("bf16"), l40s.memory_bandwidth) == (362.05e12, 864e9)


def test_every_preset_complete():
    names = list(_presets())
    assert {"h100-sxm", "h200-sxm", "a100-sxm-80gb", "mi300x", "l40s"} <= set(names)
    for name in names:
        hw = load_hardware(name)
        assert hw.name == name
        assert hw.source.strip()
        assert hw.peak_flops["bf16"] > 0 and hw.peak_flops["fp32"] > 0
        assert hw.memory_bandwidth > 0 and hw.memory_bytes > 0
        assert hw.peak("bf16") >= hw.peak("fp32")
    listed = dict(list_hardware())
    assert set(names) <= set(listed) and "not calibrated" in listed["local"]
    # the data sheet's line rate, then the collectives' achievable bus bandwidth
    assert "link 32 GB/s/dir x8" in listed["l40s"] and "link busbw 24 GB/s" in listed["l40s"]
    assert "link busbw 370 GB/s" in listed["h100-sxm"]


@pytest.mark.parametrize("alias", ["H100", "h100-sxm5", "H100_SXM", " h100-80gb "])
def test_aliases(alias):
    assert load_hardware(alias).name == "h100-sxm"


def test_unknown_preset():
    with pytest.raises(ConfigError, match="unknown hardware 'h10'; did you mean"):
        load_hardware("h10")


def test_efficiency_scales_peak_and_bandwidth(tmp_path):
    hw = load_hardware(write(tmp_path, spec(compute_efficiency=0.5, memory_efficiency=0.8)))
    assert hw.peak("bf16") == 50e12 and hw.peak("fp16") == 50e12
    assert hw.bandwidth() == pytest.approx(0.8e12)
    with pytest.raises(ConfigError, match="no peak for fp32"):
        Hardware(**{**hw.to_dict(), "peak_flops": {"bf16": 1.0}}).peak("fp32")
    with pytest.raises(ConfigError, match="unknown compute dtype"):
        hw.peak("fp64")


@pytest.mark.parametrize("name", ["hw.yaml", "hw.json"])
def test_file_round_trip(tmp_path, name):
    hw = load_hardware(str(write(tmp_path, spec(), name)))
    assert hw.name == "mine" and hw.devices_per_node == 4 and hw.network_bandwidth is None
    assert load_hardware(write(tmp_path, hw.to_dict(), "again.yaml")) == hw


def test_yaml_exponent_without_sign(tmp_path):
    path = tmp_path / "hw.yaml"
    path.write_text(yaml.safe_dump(spec()).replace("100000000000000.0", "100e12"))
    assert load_hardware(path).peak_flops["bf16"] == 100e12


@pytest.mark.parametrize(
    "over, message",
    [
        (
            {"memory_bandwith": 1e12},
            "unknown field 'memory_bandwith'; did you mean 'memory_bandwidth'",
        ),
        ({"peak_flops": {"bf61": 1e12}}, "unknown field 'bf61'; did you mean 'bf16'"),
        ({"memory_bytes": -1}, "memory_bytes must be positive"),
        ({"peak_flops": {"bf16": 0}}, "peak_flops.bf16 must be positive"),
        ({"memory_bandwidth": "fast"}, "memory_bandwidth must be a positive number"),
        ({"devices_per_node": 2.5}, "devices_per_node must be a positive integer"),
        ({"compute_efficiency": 1.5}, r"compute_efficiency must be in \[0.001, 1\]"),
        ({"memory_bandwidth": 5e-324}, r"memory_bandwidth is 5e-324, outside the sane range"),
        ({"memory_efficiency": 0}, "memory_efficiency must be positive"),
        ({"memory_bandwidth": None}, "memory_bandwidth must be a positive number"),
        ({"memory_bytes": "DROP"}, "missing required field 'memory_bytes'"),
        ({"network_bandwidth": "DROP"}, "missing required field 'network_bandwidth'"),
    ],
)
def test_bad_files(tmp_path, over, message):
    path = write(tmp_path, spec(**over))
    with pytest.raises(ConfigError, match=message) as e:
        load_hardware(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_hardware(str(tmp_path / "nope.yaml"))


def test_local_without_calibration():
    with pytest.raises(
        ConfigError, match="no calibration for this machine; run `graphllm calibrate`"
    ):
        load_hardware("local")
