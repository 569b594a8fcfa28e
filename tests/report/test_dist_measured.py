"""Measured beside predicted, from synthetic timing records whose figures are set by hand: the
ratios per step kind and collective kind, the decode median, the notes and the trace lanes."""

import pytest

from graphllm.errors import GraphllmError
from graphllm.models.config import load_config
from graphllm.models.hardware import hardware_from_dict
from graphllm.report.dist_measured import (
    MEASURED_PID,
    compare,
    public,
    strategy_of,
    table_lines,
    trace,
)
from tests.support.paths import EXAMPLES

# all_reduce: 2 steps of 100 us + the bytes over 1 GB/s; send: 1 step of 50 us + bytes / 2 GB/s
HW = hardware_from_dict(
    {
        "name": "local",
        "peak_flops": {"fp32": 1e11},
        "memory_bandwidth": 1e10,
        "memory_bytes": 1e10,
        "interconnect_bandwidth": 2e9,
        "network_bandwidth": None,
        "devices_per_node": 2,
        "links": {
            "all_reduce": {"bus_bandwidth": 1e9, "step_latency": 1e-4},
            "send": {"bus_bandwidth": 2e9, "step_latency": 5e-5},
        },
    },
    "local",
)
CFG = load_config(EXAMPLES / "tiny.yaml")  # d = 64, 2 layers
# tp 2, B = 1, fp32: five all-reduces of B x T x 64 x 4 bytes (the vocab-parallel embedding's and
# two a layer), each 2 x 100 us + 2(1/2) x bytes / 1e9
AR_PREFILL = 5 * (2e-4 + 8 * 64 * 4 / 1e9)  # T = 8
AR_DECODE = 5 * (2e-4 + 1 * 64 * 4 / 1e9)  # T = 1
SEND_PREFILL = 5e-5 + 8 * 64 * 4 / 2e9  # pp 2: stage 0 sends B x T x d once


def _step(name, t, p, strategy, compute, collectives, start):
    cols, clock = [], start + compute
    for node, kind, seconds in collectives:
        cols.append(
            {
                "node": node,
                "kind": kind,
                "mesh_axis": "tp",
                "group_size": 2,
                "bytes": 4 * 64 * t,
                "microbatch": 0,
                "start": clock,
                "seconds": seconds,
                "peer": None,
            }
        )
        clock += seconds
    seg = {"segment": 0, "microbatch": 0, "start": start, "seconds": compute, "nodes": 10}
    return {
        "step": name,
        "seq_len": t,
        "past_len": p,
        "strategy": strategy,
        "compute_seconds": compute,
        "comm_seconds": clock - start - compute,
        "other_seconds": 0.0,
        "seconds": clock - start,
        "segments": [seg],
        "collectives": cols,
    }


def _tp_ranks():
    ranks = []
    for rank in range(2):
        steps = [
            _step(
                "prefill",
                8,
                0,
                "tp=2",
                1e-3,
                [(f"ar{i}", "all_reduce", 2.5 * AR_PREFILL / 5) for i in range(5)],
                0.0,
            )
        ]
        # decode's all_reduce at 1x, 3x and 2x the prediction: the median is 2x
        for i, k in enumerate((1.0, 3.0, 2.0)):
            steps.append(
                _step(
                    f"decode {i + 1}",
                    1,
                    8 + i,
                    "tp=2",
                    1e-4,
                    [(f"ar{j}", "all_reduce", k * AR_DECODE / 5) for j in range(5)],
                    0.1 + 0.01 * i,
                )
            )
        ranks.append(
            {
                "rank": rank,
                "coords": {"tp": rank},
                "backend": "gloo",
                "runtime": "numpy",
                "weight_bytes": 0,
                "load_seconds": 0.0,
                "steps": steps,
            }
        )
    return ranks


def _row(doc, step, rank, kind):
    (row,) = [r for r in doc["rows"] if (r["step"], r["rank"], r["kind"]) == (step, rank, kind)]
    return row


def test_ratios_per_step_and_kind():
    doc = compare(CFG, _tp_ranks(), HW, cores=2)
    row = _row(doc, "prefill", 0, "all_reduce")
    assert row["predicted"] == pytest.approx(AR_PREFILL)
    assert row["measured"] == pytest.approx(2.5 * AR_PREFILL)
    assert doc["ratios"]["prefill"]["all_reduce"] == pytest.approx(2.5)
    # decode: the median over decode steps (prefill's 2.5x is not among them)
    assert _row(doc, "decode", 1, "all_reduce")["predicted"] == pytest.approx(AR_DECODE)
    assert doc["ratios"]["decode"]["all_reduce"] == pytest.approx(2.0)
    # one call: 2 x 100 us + 2048 B / 1 GB/s predicted; the median of decode's 15 calls is 2x
    assert row["predicted_call"] == pytest.approx(2e-4 + 2048 / 1e9)
    assert doc["call_ratios"]["prefill"]["all_reduce"] == pytest.approx(2.5)
    assert doc["call_ratios"]["decode"]["all_reduce"] == pytest.approx(2.0)
    assert "compute" not in doc["call_ratios"]["decode"]
    # lm_head's all_gather is predicted but not in the synthetic records: measured 0, ratio 0
    assert _row(doc, "decode", 0, "all_gather")["measured"] == 0.0
    compute = _row(doc, "decode", 0, "compute")
    assert compute["measured"] == pytest.approx(1e-4) and compute["predicted"] > 0
    assert doc["notes"][0] == "2 ranks on 2 cores: one rank a core"
    text = "\n".join(table_lines(public(doc)))
    assert "decode measured/predicted per step (median over ranks): compute" in text
    assert "all_reduce 2.00" in text


def test_oversubscribed_run_says_so():
    doc = compare(CFG, _tp_ranks(), HW, cores=1)
    assert "oversubscribed" in doc["notes"][0] and "waiting" in doc["notes"][0]


def test_pipeline_recv_is_priced_at_its_send():
    ranks = []
    for rank in range(2):
        kind = "send" if rank == 0 else "recv"
        steps = [_step("prefill", 8, 0, "pp=2", 1e-3, [("x", kind, 3 * SEND_PREFILL)], 0.0)]
        ranks.append(
            {
                "rank": rank,
                "coords": {"pp": rank},
                "backend": "gloo",
                "runtime": "numpy",
                "weight_bytes": 0,
                "load_seconds": 0.0,
                "steps": steps,
            }
        )
    doc = compare(CFG, ranks, HW, cores=2)
    assert _row(doc, "prefill", 0, "send")["predicted"] == pytest.approx(SEND_PREFILL)
    assert _row(doc, "prefill", 1, "recv")["predicted"] == pytest.approx(SEND_PREFILL)
    assert doc["ratios"]["prefill"]["send"] == pytest.approx(3.0)
    assert "decode" not in doc["ratios"]
    assert any("pipeline stage's recv waits" in n for n in doc["notes"])


def test_trace_has_measured_lanes_beside_predicted():
    ranks = _tp_ranks()
    doc = compare(CFG, ranks, HW, cores=2)
    events = trace(doc, ranks, HW)["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names[MEASURED_PID + 1] == "measured rank 1: tp 1"
    assert names[0].startswith("predicted device 0")
    measured = [e for e in events if e["pid"] == MEASURED_PID and e["ph"] == "X"]
    ar = [
        e for e in measured if e["cat"] == "measured all_reduce" and e["args"]["step"] == "decode 3"
    ]
    assert len(ar) == 5 and ar[0]["ts"] == pytest.approx((0.12 + 1e-4) * 1e6)
    # the predicted decode lanes start where the measured decode did (decode 1 at 0.1 s)
    decode = [
        e for e in events if e["pid"] == 0 and e["ph"] == "X" and e["args"]["step"] == "decode"
    ]
    assert min(e["ts"] for e in decode) == pytest.approx(0.1e6)


def test_strategy_and_step_names_refused_in_one_line():
    assert strategy_of("pp=2 tp=2 sp microbatches=2").microbatches == 2
    assert strategy_of("one device").devices == 1
    with pytest.raises(GraphllmError, match="strategy"):
        strategy_of("tp2")
    ranks = _tp_ranks()
    ranks[0]["steps"][0]["step"] = "warmup"
    with pytest.raises(GraphllmError, match="unknown step"):
        compare(CFG, ranks, HW, cores=2)


def test_last_arriving_rank_times_the_call_without_the_wait():
    ranks = _tp_ranks()
    for c in ranks[0]["steps"][0]["collectives"]:
        c["seconds"] *= 4  # rank 0 came first and waited for rank 1 at every prefill call
    doc = compare(CFG, ranks, HW, cores=2)
    mine = _row(doc, "prefill", 0, "all_reduce")
    assert mine["call_ratio"] == pytest.approx(10.0)
    assert mine["last_ratio"] == pytest.approx(2.5)  # rank 1's calls, the last to arrive
    assert doc["last_ratios"]["prefill"]["all_reduce"] == pytest.approx(2.5)
