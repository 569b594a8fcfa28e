"""`graphllm serving` with --pp and --dp (issue 20): the figures computed by hand from the
partition report's per-stage figures, so dropping the pipeline's turn through every stage or the
replicas' multiplication fails here."""

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
PROMPT, OUTPUT = 512, 128


def _stages(cfg, wl, s):
    return partition_report(partition(build_graph(cfg, wl), s, H100), H100).to_dict()["stages"]


@pytest.fixture(scope="module")
def cfg():
    return load_config("llama3-8b")


@pytest.fixture(scope="module")
def doc(cfg):
    # 2 replicas of 2 stages; 8 sequences: 4 a replica, in 2 microbatches of 2
    s = Strategy(pp=2, dp=2)
    return serving_report(cfg, Workload(), s, H100, prompt=PROMPT, output=OUTPUT, batch=8)


def test_pipeline_and_replicas_by_hand(cfg, doc):
    stage = Strategy(pp=2)  # one replica's program
    prefill = _stages(cfg, Workload(seq_len=PROMPT, logits="last"), stage)
    assert len(prefill) == 2 and prefill[0]["comm_seconds"] > 0  # stage 0 sends to stage 1
    # the prompt passes both stages in turn (the send included in stage 0's time)
    assert doc["ttft_seconds"] == prefill[0]["seconds"] + prefill[1]["seconds"]
    # decode: 2 microbatches of 2 sequences in flight; the slowest stage paces the ring, and
    # the 4 / 128 prompts that replace finished sequences each take a turn of the slowest
    # stage's prefill
    dec = _stages(
        cfg, Workload(batch=2, seq_len=1, past_len=PROMPT + OUTPUT // 2, logits="last"), stage
    )
    slowest = max(st["seconds"] for st in dec)
    tpot = 2 * slowest + 4 / OUTPUT * max(st["seconds"] for st in prefill)
    assert doc["tpot_seconds"] == pytest.approx(tpot, rel=1e-12)
    assert doc["tokens_per_second_per_user"] == pytest.approx(1 / tpot, rel=1e-12)
    assert doc["tokens_per_second"] == pytest.approx(2 * 4 / tpot, rel=1e-12)  # two replicas
    # each stage's cache holds its own layers' of every sequence in what its weights leave
    full = _stages(cfg, Workload(seq_len=1, past_len=PROMPT + OUTPUT - 1, logits="last"), stage)
    held = [
        math.floor(
            (0.9 * 80e9 - st["weight_bytes"] - st["activation_bytes"]) / st["kv_cache_bytes"]
        )
        for st in full
    ]
    assert [st["sequences_held"] for st in doc["stages"]] == held
    assert doc["max_batch"] == 2 * (min(held) // 2 * 2)
    assert (doc["replicas"], doc["pipeline_stages"], doc["devices"]) == (2, 2, 4)


def test_replicas_multiply_throughput_and_leave_latency(cfg, doc):
    one = serving_report(
        cfg, Workload(), Strategy(pp=2), H100, prompt=PROMPT, output=OUTPUT, batch=4
    )
    assert one["tpot_seconds"] == doc["tpot_seconds"]
    assert one["ttft_seconds"] == doc["ttft_seconds"]
    assert doc["tokens_per_second"] == pytest.approx(2 * one["tokens_per_second"], rel=1e-12)
    assert doc["max_batch"] == 2 * one["max_batch"]
    assert [p["batch"] for p in doc["curve"]] == [2 * p["batch"] for p in one["curve"]]


def test_a_batch_the_microbatches_cannot_share_is_one_line(cfg):
    with pytest.raises(ConfigError, match="multiple of --dp 2 x --pp 2") as e:
        serving_report(
            cfg, Workload(), Strategy(pp=2, dp=2), H100, prompt=PROMPT, output=OUTPUT, batch=6
        )
    assert "\n" not in str(e.value)


def test_the_command_takes_pp_and_dp():
    r = CliRunner().invoke(
        main,
        ["serving", "--config", "examples/tiny.yaml", "--pp", "2", "--dp", "2", "-b", "4",
         "--prompt-len", "32", "--output-len", "8"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "2 replica(s) of 2 stage(s)" in r.output and "over 2 replicas" in r.output
