"""`graphllm run --hardware H --trace FILE`: one real 2-rank tp 2 run on gloo, its timings beside
the partition report's on a spec with measured links, in --json, as text and as a trace."""

import importlib.util
import json

import pytest
import yaml
from click.testing import CliRunner

from graphllm.cli import main
from tests.support.paths import EXAMPLES

HW = {
    "name": "here",
    "peak_flops": {"fp32": 1e11},
    "memory_bandwidth": 1e10,
    "memory_bytes": 1e10,
    "interconnect_bandwidth": 1e9,
    "network_bandwidth": None,
    "devices_per_node": 2,
    "links": {"all_reduce": {"bus_bandwidth": 1e9, "step_latency": 1e-4}},
}
TINY = str(EXAMPLES / "tiny.yaml")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_run_prints_measured_beside_predicted(tmp_path):
    hw = tmp_path / "here.yaml"
    hw.write_text(yaml.safe_dump(HW))
    out = tmp_path / "trace.json"
    args = ["run", "--config", TINY, "--tp", "2", "--new-tokens", "3", "--hardware", str(hw)]
    r = CliRunner().invoke(main, [*args, "--json", "--trace", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)["measured"]
    assert doc["ranks"] == 2 and doc["hardware"] == "here"
    # tiny at tp 2, T = 8, B = 1: five all-reduces of 8 x 64 fp32, each 2 x 100 us + 2048 B / 1 GB/s
    key = ("prefill", 0, "all_reduce")
    (ar,) = [x for x in doc["rows"] if (x["step"], x["rank"], x["kind"]) == key]
    assert ar["predicted"] == pytest.approx(5 * (2e-4 + 2048 / 1e9))
    assert ar["measured"] > 0 and ar["ratio"] == pytest.approx(ar["measured"] / ar["predicted"])
    assert set(doc["ratios"]) == {"prefill", "decode"}
    lanes = {
        e["args"]["name"]
        for e in json.loads(out.read_text())["traceEvents"]
        if e["name"] == "process_name"
    }
    assert {"measured rank 0: tp 0", "measured rank 1: tp 1"} <= lanes
    assert any(n.startswith("predicted device 1") for n in lanes)


def test_trace_without_hardware_is_refused_before_the_run(tmp_path):
    r = CliRunner().invoke(
        main, ["run", "--config", TINY, "--tp", "2", "--trace", str(tmp_path / "t.json")]
    )
    assert r.exit_code == 2 and "give --hardware" in r.stderr
    assert "Traceback" not in r.output and not (tmp_path / "t.json").exists()


def test_hardware_without_links_is_refused_before_the_run(tmp_path):
    hw = tmp_path / "one.yaml"
    hw.write_text(yaml.safe_dump(HW | {"interconnect_bandwidth": None, "links": {}}))
    r = CliRunner().invoke(main, ["run", "--config", TINY, "--tp", "2", "--hardware", str(hw)])
    assert r.exit_code == 2 and "no link between devices" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
