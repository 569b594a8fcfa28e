"""`graphllm serving` with --ep: partition cuts a decode batch over the ep ranks, so each rank's
cache holds its own sequences; the figures computed by hand from the partition report."""

import math

import pytest

from graphllm import Workload, build_graph
from graphllm.errors import ConfigError
from graphllm.models.config import load_config
from graphllm.models.hardware import load_hardware
from graphllm.passes.parallel.partition import Strategy, partition, partition_report
from graphllm.report.serving import serving_report

H100 = load_hardware("h100")
PROMPT, OUTPUT = 1024, 128


def _stage(cfg, wl, s):
    return partition_report(partition(build_graph(cfg, wl), s, H100), H100).to_dict()["stages"][0]


@pytest.fixture(scope="module")
def cfg():
    return load_config("mixtral-8x7b")


def test_ep_ranks_hold_their_own_sequences_by_hand(cfg):
    s = Strategy(ep=2)
    doc = serving_report(cfg, Workload(), s, H100, prompt=PROMPT, output=OUTPUT, batch=8)
    # two sequences at their full length: one in each ep rank's cache
    full = _stage(cfg, Workload(batch=2, seq_len=1, past_len=PROMPT + OUTPUT - 1), s)
    room = 0.9 * 80e9 - full["weight_bytes"] - full["activation_bytes"]
    assert doc["kv_bytes_per_sequence_per_device"] == full["kv_cache_bytes"]
    assert doc["max_batch"] == 2 * math.floor(room / full["kv_cache_bytes"])
    pre = _stage(cfg, Workload(seq_len=PROMPT, logits="last"), s)  # ep cuts the prompt's tokens
    dec = _stage(cfg, Workload(batch=8, seq_len=1, past_len=PROMPT + OUTPUT // 2, logits="last"), s)
    assert doc["ttft_seconds"] == pre["seconds"]
    assert doc["tpot_seconds"] == pytest.approx(dec["seconds"] + 8 / OUTPUT * pre["seconds"])
    assert all(p["batch"] % 2 == 0 for p in doc["curve"])


def test_a_batch_the_ep_ranks_cannot_share_is_one_line(cfg):
    with pytest.raises(ConfigError, match="multiple of --dp 1 x --pp 1 x --ep 2") as e:
        serving_report(cfg, Workload(), Strategy(ep=2), H100, prompt=PROMPT, output=OUTPUT, batch=7)
    assert "\n" not in str(e.value)
