"""`graphllm serving` with --cp and --microbatches (issue 20): the figures computed by hand from
the partition report's programs and the hardware preset's link figures, so dropping the cache
shard, the cp combine of a layer, the cp prefill, a prompt chunk's past or the pipeline's fill
fails here."""

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
PROMPT, OUTPUT = 4096, 256
LAYERS, HEADS, HEAD_DIM = 32, 32, 128  # Llama-3-8B


def _stages(cfg, wl, s):
    return partition_report(partition(build_graph(cfg, wl), s, H100), H100).to_dict()["stages"]


def _combine(batch, heads, group, inside):
    """One layer's all-gather of `group` ranks' bf16 partial outputs and fp32 LSEs, by hand: the
    cheapest protocol of NCCL's ring (h100's tunings; tests/models/test_nccl_tuning.py), inside
    a node over NVLink hops, else over two nodes of one rank each (the network's tree hops)."""
    share = batch * heads * (HEAD_DIM * 2 + 4)  # bytes one rank holds
    steps = group - 1
    if inside:  # (latency us, bus bandwidth) of LL, LL128, Simple
        protocols = [(6.6 + steps * 0.6, 141e9), (14 + steps * 1.9, 0.92 * 370e9)]
        protocols.append((8.4 + steps * 3.4, 370e9))
    else:  # LL capped at half the 40 GB/s NIC share (under the Intel host's 39 GB/s)
        protocols = [(6.6 + 5.0, 20e9), (14 + 8.5, 0.92 * 40e9), (8.4 + 14.0, 40e9)]
    return min(lat * 1e-6 + group * share / (bw * group / steps) for lat, bw in protocols)


def _serve(cfg, s, batch):
    return serving_report(cfg, Workload(), s, H100, prompt=PROMPT, output=OUTPUT, batch=batch)


def _decode_seconds(cfg, batch, s):
    """Each stage's step on a microbatch of `batch` at the average context, without cp."""
    wl = Workload(batch=batch, seq_len=1, past_len=PROMPT + OUTPUT // 2, logits="last")
    return [st["seconds"] for st in _stages(cfg, wl, s)]


@pytest.fixture(scope="module")
def cfg():
    return load_config("llama3-8b")


def test_cp_prefill_decode_and_cache_by_hand(cfg):
    doc = _serve(cfg, Strategy(tp=2, cp=2), 8)
    # prefill: the partition report's cp program, its gathers of K and V included
    pre = _stages(cfg, Workload(seq_len=PROMPT, logits="last"), Strategy(tp=2, cp=2))[0]
    assert pre["comm_bytes"]["all_gather"] > 0
    assert doc["ttft_seconds"] == pre["seconds"]
    # decode: the step without cp over one rank's half of the cache, plus per layer the
    # all-gather of 16 local heads' partial outputs and LSEs (4 ranks: inside one node)
    keys = math.ceil((PROMPT + OUTPUT // 2 + 1) / 2)
    dec = _stages(
        cfg, Workload(batch=8, seq_len=1, past_len=keys - 1, logits="last"), Strategy(tp=2)
    )[0]
    combine = LAYERS * _combine(8, HEADS // 2, 2, inside=True)
    assert doc["stages"][0]["cp_combine_seconds"] == pytest.approx(combine, rel=1e-9)
    tpot = dec["seconds"] + combine + 8 / OUTPUT * pre["seconds"]
    assert doc["tpot_seconds"] == pytest.approx(tpot, rel=1e-12)
    assert doc["tokens_per_second"] == pytest.approx(8 / tpot, rel=1e-12)
    # each rank holds half of every sequence's cache: twice the sequences
    full = _stages(
        cfg,
        Workload(seq_len=1, past_len=(PROMPT + OUTPUT) // 2 - 1, logits="last"),
        Strategy(tp=2),
    )[0]
    room = 0.9 * 80e9 - full["weight_bytes"] - full["activation_bytes"]
    assert doc["kv_bytes_per_sequence_per_device"] == full["kv_cache_bytes"]
    assert doc["max_batch"] == math.floor(room / full["kv_cache_bytes"])
    alone = serving_report(cfg, Workload(), Strategy(tp=2), H100, prompt=PROMPT, output=OUTPUT)
    assert doc["kv_bytes_per_sequence_per_device"] == pytest.approx(
        alone["kv_bytes_per_sequence_per_device"] / 2, rel=1e-3
    )
    assert doc["context_parallel"] == 2 and doc["devices"] == 4


def test_a_cp_group_across_nodes_combines_over_the_network(cfg):
    # tp 8 fills a node of 8, so the two cp ranks of a group sit in two nodes
    doc = _serve(cfg, Strategy(tp=8, cp=2), 4)
    combine = LAYERS * _combine(4, HEADS // 8, 2, inside=False)
    assert doc["stages"][0]["cp_combine_seconds"] == pytest.approx(combine, rel=1e-9)


def test_cp_with_pp_combines_each_stage_s_own_layers(cfg):
    doc = _serve(cfg, Strategy(cp=2, pp=2), 4)
    for st in doc["stages"]:
        first, last = st["layers"]
        # 2 microbatches of 2 in flight: each stage's step is on a microbatch of 2 sequences
        layer = _combine(2, HEADS, 2, inside=True)
        assert st["cp_combine_seconds"] == pytest.approx((last - first + 1) * layer, rel=1e-9)


def test_microbatches_pipeline_the_prompt_and_keep_m_in_flight(cfg):
    doc = _serve(cfg, Strategy(pp=2, microbatches=4), 8)
    # the prompt in 4 chunks of 1024 tokens, chunk j over a past of j chunks; t[j][s]
    c = PROMPT // 4
    t = [
        [st["seconds"] for st in _stages(
            cfg, Workload(seq_len=c, past_len=j * c, logits="last"), Strategy(pp=2)
        )]
        for j in range(4)
    ]  # fmt: skip
    assert t[3][0] > t[0][0]  # a later chunk attends over more
    # stage 1 starts chunk j once stage 0 has sent it and it has finished chunk j-1
    s0 = [sum(t[i][0] for i in range(j + 1)) for j in range(4)]  # stage 0 never waits
    s1 = s0[0] + t[0][1]
    for j in range(1, 4):
        s1 = max(s1, s0[j]) + t[j][1]
    assert doc["ttft_seconds"] == pytest.approx(s1, rel=1e-12)
    whole = _stages(cfg, Workload(seq_len=PROMPT, logits="last"), Strategy(pp=2))
    assert doc["ttft_seconds"] < sum(st["seconds"] for st in whole)  # the fill overlaps
    # decode: 4 microbatches of 2 in flight: the slowest stage takes a turn on each
    secs = _decode_seconds(cfg, 2, Strategy(pp=2))
    turn = max(t[0][0] + t[1][0] + t[2][0] + t[3][0], t[0][1] + t[1][1] + t[2][1] + t[3][1])
    tpot = 4 * max(secs) + 8 / OUTPUT * turn
    assert doc["tpot_seconds"] == pytest.approx(tpot, rel=1e-12)
    assert doc["microbatches_in_flight"] == 4 and doc["prefill_chunks"] == 4


def test_fewer_microbatches_than_stages_wait_for_a_lap_of_the_ring(cfg):
    # 4 stages, 2 microbatches: each microbatch's token needs all 4 stages in turn
    doc = _serve(cfg, Strategy(pp=4, microbatches=2), 4)
    secs = _decode_seconds(cfg, 2, Strategy(pp=4))
    assert sum(secs) > 2 * max(secs)  # the lap, not two turns of the slowest stage
    turn = max(st["prefill_seconds"] for st in doc["stages"])
    assert doc["tpot_seconds"] == pytest.approx(sum(secs) + 4 / OUTPUT * turn, rel=1e-12)


@pytest.mark.parametrize(
    ("model", "s", "prompt", "says"),
    [
        ("llama3-8b", Strategy(microbatches=2), 512, "give --pp"),
        ("llama3-8b", Strategy(cp=2, pp=2, microbatches=2), 512, "--cp with --microbatches"),
        ("llama3-8b", Strategy(cp=2), 511, "--cp 2 does not divide the 511 prompt tokens"),
        ("llama3-8b", Strategy(pp=2, microbatches=3), 512, "--microbatches 3 does not divide"),
        ("gemma2-9b", Strategy(cp=2), 512, "sliding_attention layers"),
        ("llama3-8b", Strategy(pp=2, microbatches=4), 512, "multiple of --dp 1 x --microbatches 4"),
    ],
)
def test_what_serving_does_not_model_is_one_line(model, s, prompt, says):
    with pytest.raises(ConfigError, match=says) as e:
        serving_report(load_config(model), Workload(), s, H100, prompt=prompt, output=128, batch=6)
    assert "\n" not in str(e.value)


def test_the_command_takes_cp_and_microbatches():
    base = ["serving", "--config", "examples/tiny.yaml", "--prompt-len", "32", "--output-len", "8"]
    r = CliRunner().invoke(main, [*base, "--cp", "2", "-b", "2"])
    assert r.exit_code == 0, r.output
    assert "cp 2: the prompt's tokens split" in " ".join(r.output.split())  # however wrapped
    r = CliRunner().invoke(main, [*base, "--pp", "2", "--microbatches", "4", "-b", "4"])
    assert r.exit_code == 0, r.output
    assert "4 microbatches in flight" in " ".join(r.output.split())
    bad = CliRunner().invoke(main, [*base, "--microbatches", "2"])
    assert bad.exit_code == 2 and "give --pp" in bad.output
    assert bad.output.count("\n") == 1 and "Traceback" not in bad.output
