"""graphllm/report/serving.py and `graphllm serving`: TTFT, time per output token, tokens/s, the
largest batch the KV cache holds and the curve, from one replica's partition reports."""

import math

import pytest
from click.testing import CliRunner

from graphllm import Workload, build_graph
from graphllm.cli.main import main
from graphllm.errors import ConfigError
from graphllm.models.config import load_config
from graphllm.models.hardware import load_hardware
from graphllm.passes.parallel.partition import Strategy, partition, partition_report
from graphllm.report.serving import serving_report

H100 = load_hardware("h100")


def _stage(cfg, wl, s):
    return partition_report(partition(build_graph(cfg, wl), s, H100), H100).to_dict()["stages"][0]


@pytest.fixture(scope="module")
def doc():
    cfg = load_config("llama3-8b")
    return serving_report(cfg, Workload(), Strategy(tp=2), H100, prompt=512, output=128, batch=8)


def test_the_figures_are_the_steps_of_the_partition_report(doc):
    cfg, s = load_config("llama3-8b"), Strategy(tp=2)
    prefill = _stage(cfg, Workload(seq_len=512, logits="last"), s)
    assert doc["ttft_seconds"] == prefill["seconds"]
    step = _stage(cfg, Workload(batch=8, seq_len=1, past_len=512 + 64, logits="last"), s)
    # a decode step of the batch plus its share of the prompts that replace finished sequences
    tpot = step["seconds"] + 8 / 128 * prefill["seconds"]
    assert doc["tpot_seconds"] == pytest.approx(tpot)
    assert doc["tokens_per_second"] == pytest.approx(8 / tpot)
    assert doc["tokens_per_second_per_user"] == pytest.approx(1 / tpot)
    full = _stage(cfg, Workload(seq_len=1, past_len=512 + 127, logits="last"), s)
    room = 0.9 * 80e9 - full["weight_bytes"] - full["activation_bytes"]
    assert doc["max_batch"] == math.floor(room / full["kv_cache_bytes"])
    assert doc["rate_model"] == "achievable" and doc["devices"] == 2


def test_the_curve_covers_powers_of_two_up_to_the_largest_batch(doc):
    sizes = [p["batch"] for p in doc["curve"]]
    assert sizes[0] == 1 and sizes[-1] == doc["max_batch"] and 8 in sizes
    assert sizes == sorted(set(sizes))
    per_user = [p["tokens_per_second_per_user"] for p in doc["curve"]]
    assert per_user == sorted(per_user, reverse=True)  # larger batches: slower per user


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"strategy": Strategy(microbatches=2)}, "give --pp"),
        ({"batch": 10**6}, "does not fit"),
        ({"memory_fraction": 0.001}, "no room"),
    ],
)
def test_what_it_cannot_serve_is_one_line(kw, says):
    args = {"strategy": Strategy(), "batch": None} | kw
    with pytest.raises(ConfigError, match=says) as e:
        serving_report(
            load_config("llama3-8b"),
            Workload(),
            args.pop("strategy"),
            H100,
            prompt=512,
            output=128,
            **args,
        )
    assert "\n" not in str(e.value)


def test_the_command_prints_the_figures_and_the_model(tmp_path):
    r = CliRunner().invoke(
        main,
        [
            "serving",
            "--config",
            "examples/tiny.yaml",
            "--prompt-len",
            "64",
            "--output-len",
            "16",
            "--plot",
            str(tmp_path / "curve.png"),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "time to first token" in r.output and "tokens/s in all" in r.output
    assert "times: achievable model" in r.output
    assert (tmp_path / "curve.png").stat().st_size > 1000
    ideal = CliRunner().invoke(
        main,
        [
            "serving",
            *("--config", "examples/tiny.yaml", "--prompt-len", "64", "--output-len", "16"),
            *("--ideal", "--json", "-b", "2"),
        ],
    )
    assert ideal.exit_code == 0 and '"rate_model": "ideal"' in ideal.output


def test_the_command_refuses_a_seq_len_in_one_line():
    r = CliRunner().invoke(main, ["serving", "--config", "examples/tiny.yaml", "-t", "8"])
    assert r.exit_code == 2 and "--prompt-len" in r.output
