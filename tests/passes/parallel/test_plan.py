"""`graphllm plan`: legal layouts, memory fit, ranking, and agreement with the partition report."""

import json
import time

import pytest
from click.testing import CliRunner

from graphllm import Workload, build_graph, load_config
from graphllm.cli import main
from graphllm.errors import ConfigError
from graphllm.models.config import config_from_dict
from graphllm.models.hardware import load_hardware
from graphllm.passes.parallel.partition import Strategy, partition, partition_report
from graphllm.passes.parallel.plan import factorisations, plan, reduced_config
from graphllm.passes.training import TrainingOptions
from tests.support import tiny_configs

H100 = load_hardware("h100")
TINY = tiny_configs.LLAMA


def test_factorisations_cover_every_product():
    got = factorisations(8, {}, moe=False)
    assert all(f["ep"] == 1 and f["tp"] * f["cp"] * f["pp"] * f["dp"] == 8 for f in got)
    assert len(got) == 20  # ordered factorisations of 2^3 into 4 factors: C(6, 3)
    assert len(factorisations(8, {}, moe=True)) == 35
    assert all(f["tp"] == 2 for f in factorisations(8, {"tp": 2}, moe=True))


def test_reduced_config_keeps_one_layer_per_kind():
    cfg = load_config("qwen1.5-moe-a2.7b")
    small, kinds = reduced_config(cfg)
    assert len(kinds) == cfg.num_hidden_layers and max(kinds) == small.num_hidden_layers - 1
    assert load_config("llama3-70b").num_hidden_layers == 80
    assert reduced_config(load_config("llama3-70b"))[0].num_hidden_layers == 1


@pytest.mark.parametrize(
    "model, wl, n, training",
    [
        ("llama3-70b", Workload(seq_len=4096, batch=16), 16, TrainingOptions("full", 3)),
        ("mixtral-8x7b", Workload(seq_len=1, past_len=4096, batch=16), 8, None),
        ("llama3-8b", Workload(seq_len=2048, batch=8), 8, None),
    ],
)
def test_candidates_agree_with_the_partition_report(model, wl, n, training):
    cfg = load_config(model)
    r = plan(cfg, wl, n, H100, training)
    assert r.candidates and all(c["fits"] for c in r.candidates)
    secs = [c["seconds"] for c in r.candidates]
    assert secs == sorted(secs)
    g = build_graph(cfg, wl)
    for c in r.candidates[:3]:
        s = Strategy(**c["strategy"])
        rep = partition_report(partition(g, s, H100), H100, "flash", training).to_dict()
        mem = max(st["memory_bytes"] for st in rep["stages"])
        assert c["memory_bytes"] == pytest.approx(mem, rel=1e-6)
        assert c["seconds"] == pytest.approx(rep["pipeline"]["step_seconds"], rel=1e-6)


def test_too_big_layouts_are_dropped_with_their_memory():
    r = plan(load_config("llama3-70b"), Workload(seq_len=4096, batch=8), 8, H100, TrainingOptions())
    assert not r.candidates  # 70B x 16 bytes of state over 8 devices: 140 GB each
    assert all(c["memory_bytes"] > H100.memory_bytes for c in r.too_big)


def test_plan_is_fast_for_64_devices():
    t = time.perf_counter()
    r = plan(
        load_config("llama3-70b"),
        Workload(seq_len=4096, batch=64),
        64,
        H100,
        TrainingOptions("selective"),
    )
    assert time.perf_counter() - t < 5
    assert len(r.candidates) + len(r.too_big) + len(r.illegal) == 84


def test_no_legal_layout_is_an_error():
    cfg = config_from_dict(TINY, "tiny")
    with pytest.raises(ConfigError, match="no layout of 6 devices"):
        plan(cfg, Workload(batch=4, seq_len=8), 6, H100)


def cli(*args):
    return CliRunner().invoke(main, ["plan", *args])


def test_cli_table_and_json(tmp_path):
    r = cli(
        "--model", "llama3-8b", "--devices", "8", "--seq-len", "2048", "--batch", "8", "--top", "3"
    )
    assert r.exit_code == 0, r.output
    assert "20 layouts fit" in r.output and "time per" in r.output
    r = cli(
        "--model",
        "mixtral-8x7b",
        "--devices",
        "8",
        "--seq-len",
        "1",
        "--past-len",
        "4096",
        "--batch",
        "16",
        "--json",
    )
    doc = json.loads(r.output)
    assert doc["plan"]["phase"] == "decode" and doc["plan"]["candidates"]


def test_cli_bad_input_is_one_line(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(json.dumps(TINY))
    cases = [
        (("--config", str(path), "--devices", "6", "--seq-len", "8", "--batch", "4"), "no layout"),
        (("--model", "llama3-8b", "--devices", "0"), "--devices"),
        (("--model", "llama3-8b", "--devices", "8", "--tp", "3"), "does not divide"),
        (("--model", "llama3-8b", "--devices", "8", "--zero", "1"), "--training"),
        (
            ("--model", "llama3-8b", "--devices", "8", "--training", "--zero", "1", "--dp", "1"),
            "--zero",
        ),
    ]
    for args, msg in cases:
        r = cli(*args)
        assert r.exit_code == 2, r.output
        assert msg in r.output and len(r.output.strip().splitlines()) == 1, r.output


@pytest.mark.parametrize(
    ("args", "fewest"),
    [
        (("--model", "llama3.1-405b", "--devices", "4"), 11),  # trace's count too (test_fit)
        (("--model", "llama3-70b", "--devices", "8", "-t", "4096", "-b", "8", "--training"), 16),
    ],
)
def test_no_layout_that_fits_is_one_line_with_the_fewest_devices(args, fewest):
    """A plan none of whose layouts fits is a workload too large for the devices: one line and
    exit 2, naming the smallest layout's memory and the fewest devices that hold the model (the
    first count whose plan keeps a layout)."""
    r = cli(*args)
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1 and "needs" in r.output, r.output
    assert f"; {fewest} devices are the fewest that hold it (" in r.output
    n = dict(zip(args[::2], args[1::2]))["--devices"]
    for fewer in range(int(n), fewest):
        assert cli(*args[:3], str(fewer), *args[4:]).exit_code == 2
    assert cli(*args[:3], str(fewest), *args[4:]).exit_code == 0
