"""`partition --trace`: a Chrome/Perfetto trace of the predicted pipeline schedule."""

import itertools
import json
from collections import defaultdict

import pytest
from click.testing import CliRunner

from graphllm.cli import main
from graphllm.exporters.trace import schedule, timeline

TINY = {
    "model_type": "llama",
    "vocab_size": 256,
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
}


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("pp, m", [(2, 4), (4, 4), (3, 1)])
def test_schedule_length_is_m_plus_p_minus_one_slots(pp, m, training):
    f, b = 1.0, 2.0 if training else 0.0
    start = timeline(pp, m, f, b, training)
    end = max(t + (f if k == "F" else b) for (k, _, _), t in start.items())
    assert end == pytest.approx((m + pp - 1) * (f + b))
    if training:  # 1F1B: stage s holds at most pp - s microbatches between forward and backward
        for s, ops in enumerate(schedule(pp, m, True)):
            live = peak = 0
            for k, _, _ in ops:
                live += 1 if k == "F" else -1
                peak = max(peak, live)
            assert peak == min(pp - s, m)


@pytest.mark.parametrize("training", [False, True])
def test_trace_tracks_lanes_and_bubble(tmp_path, training):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(json.dumps(TINY))
    out = tmp_path / "trace.json"
    args = [
        "partition",
        "--config",
        str(cfg),
        "--batch",
        "8",
        "--seq-len",
        "16",
        "--tp",
        "2",
        "--pp",
        "2",
        "--dp",
        "2",
        "--microbatches",
        "4",
        "--trace",
        str(out),
        "--json",
    ]
    if training:
        args += ["--training", "--zero", "1"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)["partition"]
    doc = json.loads(out.read_text())
    ev = doc["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in ev if e["name"] == "process_name"}
    assert sorted(names) == list(range(8))  # one track per device
    assert all("stage" in n for n in names.values())
    lanes = {(e["pid"], e["tid"], e["args"]["name"]) for e in ev if e["name"] == "thread_name"}
    assert {(0, 0, "compute"), (0, 1, "communication")} <= lanes
    xs = [e for e in ev if e["ph"] == "X"]
    assert {e["tid"] for e in xs} == {0, 1}
    assert any(e["name"].endswith("all_reduce") for e in xs if e["tid"] == 1)
    assert any(e["name"].endswith("o_proj") for e in xs if e["tid"] == 0)
    other = doc["otherData"]
    assert other["schedule"] == ("1F1B" if training else "GPipe (forward only)")
    bubble = defaultdict(float)
    for e in xs:
        if e["name"] == "bubble":
            bubble[e["pid"]] += e["dur"]
    frac = report["pipeline"]["bubble"]
    assert frac == pytest.approx(1 / 5)
    for pid in range(8):
        assert bubble[pid] == pytest.approx(frac * other["pipeline_us"])
    # the events of a device never overlap on a lane
    by_lane = defaultdict(list)
    for e in xs:
        by_lane[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_lane.values():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-6 for a, b in itertools.pairwise(spans))
    if training:
        assert any(e["cat"] == "gradient reduction" for e in xs)
        # the step of the report: the pipeline and the gradient reduction after it
        end = max(e["ts"] + e["dur"] for e in xs)
        assert end / 1e6 == pytest.approx(report["pipeline"]["step_seconds"], rel=0.05)


def test_trace_needs_hardware_and_a_folder(tmp_path):
    r = CliRunner().invoke(
        main,
        [
            "partition",
            "--model",
            "llama3.2-1b",
            "--seq-len",
            "64",
            "--trace",
            str(tmp_path / "no" / "t.json"),
        ],
    )
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
