"""Bad `--hardware FILE` specs, each answered in one line: a figure no device has (a subnormal
FLOP/s or bandwidth printed "inf s, nan%" and wrote NaN into --json) is refused naming the
field, and a spec file is read as carefully as a config."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.hostile import Case, cases_params, check_case
from tests.support.paths import EXAMPLES
from tests.support.sandbox_files import fifo, text
from tests.support.tiny_configs import HARDWARE_SPEC

SPEC = HARDWARE_SPEC


def trace(spec: str) -> list[str]:
    return ["trace", "--config", str(EXAMPLES / "tiny.yaml"), "--hardware", spec]


def spec(**over) -> Callable[[Path], None]:
    def make(root: Path) -> None:
        (root / "hw.json").write_text(json.dumps({**SPEC, **over}))

    return make


def figure(id: str, expect: str, **over) -> Case:
    return Case(id, trace("hw.json"), make=spec(**over), expect=expect)


CASES = [
    figure("peak-subnormal", "peak_flops.bf16 is 5e-324", peak_flops={"bf16": 5e-324}),
    figure("peak-fp32-subnormal", "peak_flops.fp32", peak_flops={"bf16": 1e14, "fp32": 1e-310}),
    figure("peak-1e30", "peak_flops.bf16", peak_flops={"bf16": 1e30}),
    figure("peak-zero", "peak_flops.bf16", peak_flops={"bf16": 0}),
    figure("peak-string", "peak_flops.bf16", peak_flops={"bf16": "fast"}),
    figure("peak-bool", "peak_flops.bf16", peak_flops={"bf16": True}),
    figure("bandwidth-subnormal", "memory_bandwidth is 5e-324", memory_bandwidth=5e-324),
    figure("bandwidth-negative", "memory_bandwidth", memory_bandwidth=-1e12),
    figure("bandwidth-1e300", "memory_bandwidth", memory_bandwidth=1e300),
    figure("memory-bytes-subnormal", "memory_bytes", memory_bytes=1e-320),
    figure("memory-bytes-zero", "memory_bytes", memory_bytes=0),
    figure("interconnect-subnormal", "interconnect_bandwidth", interconnect_bandwidth=4e-323),
    figure("network-huge", "network_bandwidth", network_bandwidth=1e200),
    figure("devices-1e9", "devices_per_node", devices_per_node=10**9),
    figure("devices-fraction", "devices_per_node", devices_per_node=2.5),
    figure("devices-zero", "devices_per_node", devices_per_node=0),
    figure("efficiency-subnormal", "compute_efficiency", compute_efficiency=5e-324),
    figure("efficiency-above-1", "memory_efficiency", memory_efficiency=1.5),
    figure(
        "extra-subnormal", "extra.memory_bandwidth_model", extra={"memory_bandwidth_model": 5e-324}
    ),
    figure("name-10-mb", "name must be a line of text", name="x" * 10_000_000),
    figure("name-newline", "name must be a line of text", name="two\nlines"),
    figure("unknown-key-1-mb", "unknown field", **{"k" * 10**6: 1}),
    Case(
        "yaml-nan",
        trace("hw.yaml"),
        make=text("hw.yaml", "memory_bandwidth: .nan\n"),
        expect="not a finite",
    ),
    Case(
        "json-infinity",
        trace("hw.json"),
        make=text("hw.json", '{"memory_bytes": Infinity}'),
        expect="Infinity",
    ),
    Case(
        "yaml-alias-bomb",
        trace("hw.yaml"),
        make=text("hw.yaml", 'a: &a ["x", "x"]\nb: [*a, *a]\n'),
        expect="anchors are not accepted",
    ),
    Case("fifo", trace("hw.yaml"), make=fifo("hw.yaml"), expect="is a FIFO"),
    Case("dev-zero", trace("/dev/zero"), expect="character device"),
    Case("name-5000", trace("h" * 5000), expect="unknown hardware"),
    Case("file-name-too-long", trace("h" * 5000 + ".yaml"), expect="file name too long"),
    Case("folder", trace("./"), expect="is a folder"),
    Case("top-level-list", trace("hw.yaml"), make=text("hw.yaml", "- 1\n"), expect="a mapping"),
]


@pytest.mark.parametrize("case", cases_params(CASES))
def test_refused(case, tmp_path):
    result = check_case(case, tmp_path)
    assert len(result.stderr) < 400, result.stderr[:400]
