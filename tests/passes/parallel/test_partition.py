"""The partition pass: textbook communication volumes, per-device figures, bad input, and every
strategy checked by execution against the single-device graph."""

import itertools
import json
from collections import Counter

import pytest
from click.testing import CliRunner

from graphllm import Workload, build_graph, load_config
from graphllm.cli import main
from graphllm.errors import ConfigError
from graphllm.models.config import config_from_dict
from graphllm.models.hardware import load_hardware
from graphllm.ops import COMMUNICATION, OPS
from graphllm.passes import run
from graphllm.passes.parallel.partition import Strategy, balance, partition, partition_report
from graphllm.report.dist_measured import strategy_of
from graphllm.runtime.spmd import check_partition
from tests.support import tiny_configs
from tests.support.paths import EXAMPLES

TINY = tiny_configs.LLAMA
CONFIGS = {
    "llama": TINY,
    "mixtral": {**TINY, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2_moe": {
        **TINY,
        "model_type": "qwen2_moe",
        "num_hidden_layers": 3,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
        "mlp_only_layers": [1],
    },
    "qwen2": {**TINY, "model_type": "qwen2", "num_hidden_layers": 4},  # q/k/v biases
    "phi3": {**TINY, "model_type": "phi3", "pad_token_id": 0},  # fused qkv and gate_up
    "mistral": {**TINY, "model_type": "mistral", "sliding_window": 5},
    # issue 16: post-norms only, q/k norms over all heads (a TP split of heads must gather them)
    "olmo2": {**TINY, "model_type": "olmo2"},
    # LayerNorms, attention beside the MLP, per-head q/k norms with their own weights
    "cohere": {**TINY, "model_type": "cohere", "use_qk_norm": True, "logit_scale": 0.5},
    # a window on layers 0-2, a global NoPE layer 3
    "cohere2": {**TINY, "model_type": "cohere2", "num_hidden_layers": 4, "sliding_window": 5},
    # issue 16: Gemma 2, four norms, soft-capped scores and logits, layers 0 and 2 a window of 5
    "gemma2": {
        **TINY,
        "model_type": "gemma2",
        "num_hidden_layers": 4,
        "sliding_window": 5,
        "attn_logit_softcapping": 0.5,
        "final_logit_softcapping": 1.5,
    },
    # issue 16: Gemma 3, layers 0, 1 and 3 a window of 5 with their own RoPE base, layer 2 global
    # with a linearly scaled one; per-head q/k norms
    "gemma3": {
        **TINY,
        "model_type": "gemma3_text",
        "num_hidden_layers": 4,
        "sliding_window": 5,
        "sliding_window_pattern": 3,
        "rope_local_base_freq": 100.0,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
    },
    # issue 16: Llama 4, layers 0 and 2 chunked by 3 with RoPE and the L2 QK-norm, 1 and 3
    # global NoPE layers whose query temperature changes inside the 8 tokens (floor_scale 2)
    "llama4": {
        **TINY,
        "model_type": "llama4_text",
        "num_hidden_layers": 4,
        "head_dim": 8,
        "moe_layers": [],
        "intermediate_size_mlp": 40,
        "no_rope_layer_interval": 2,
        "attention_chunk_size": 3,
        "floor_scale": 2,
        "attn_scale": 0.5,
    },
}
# issue 16 audit: Granite's muP multipliers (embedding, score, residual, logits) and SmolLM3's
# NoPE layers (1 and 3) with their sliding window of 5, under the same strategies
CONFIGS["granite"] = {
    **TINY,
    "model_type": "granite",
    "embedding_multiplier": 3.0,
    "attention_multiplier": 0.2,
    "residual_multiplier": 0.7,
    "logits_scaling": 3.0,
}
CONFIGS["smollm3"] = {
    **TINY,
    "model_type": "smollm3",
    "num_hidden_layers": 4,
    "no_rope_layer_interval": 2,
    "use_sliding_window": True,
    "sliding_window": 5,
}
# Phi-4-mini's attention: RoPE on half of each head, and longrope switching to its long factors
# inside the 8-token call (original context 6)
CONFIGS["phi3-partial"] = {**CONFIGS["phi3"], "partial_rotary_factor": 0.5}
_ROT_PAIRS = config_from_dict(CONFIGS["phi3"], "phi3").head_dim // 4
CONFIGS["phi3-longrope"] = {
    **CONFIGS["phi3-partial"],
    "original_max_position_embeddings": 6,
    "rope_scaling": {
        "type": "longrope",
        "short_factor": [1.0 + 0.1 * i for i in range(_ROT_PAIRS)],
        "long_factor": [2.0 + 3.0 * i for i in range(_ROT_PAIRS)],
    },
}


def tiny_graph(family="llama", **wl):
    cfg = config_from_dict(CONFIGS[family], family)
    return build_graph(cfg, Workload(**({"batch": 4, "seq_len": 8, "dtype": "fp32"} | wl)))


def collectives(graph, strategy, hw="h100"):
    hardware = load_hardware(hw) if hw else None
    pg = partition(graph, strategy, hardware)
    return pg, partition_report(pg, hardware).to_dict()


def by_kind(report):
    return Counter(c["kind"] for c in report["collectives"])


# -- textbook volumes ------------------------------------------------------------------------------
def test_tp_two_all_reduces_per_layer_plus_embedding_and_lm_head():
    g = build_graph(load_config("llama3-70b"), Workload(seq_len=2048))
    _, r = collectives(g, Strategy(tp=8))
    assert by_kind(r) == {"all_reduce": 2 * 80 + 1, "all_gather": 1}
    act = 1 * 2048 * 8192 * 2  # B*T*d in bf16
    for c in r["collectives"]:
        if c["kind"] == "all_reduce":
            assert c["bytes"] == act and c["group_size"] == 8
            assert c["wire_bytes_per_device"] == 2 * 7 / 8 * act  # ring
        else:
            assert c["name"] == "lm_head.all_gather"
            assert c["bytes"] == 2048 * 128256 * 2
            assert c["wire_bytes_per_device"] == 7 / 8 * c["bytes"]
    names = {c["name"] for c in r["collectives"]}
    assert "model.layers.5.self_attn.o_proj.all_reduce" in names
    assert "model.layers.5.mlp.down_proj.all_reduce" in names
    assert "model.embed_tokens.all_reduce" in names
    dev = r["devices"]
    assert len(dev) == 8 and all(d["fits"] for d in dev)
    total = run(g, ["params"])["params"].total
    norms = 8192 * (2 * 80 + 1)  # the only tensors every rank holds whole
    assert dev[0]["params"] == (total - norms) / 8 + norms


def test_whole_vocab_keeps_the_embedding_and_lm_head_on_every_rank():
    # issue 20: gpt-fast's tp.py shards the layers only; every rank reads the whole LM head
    # and needs neither the embedding's all-reduce nor the logits' all-gather
    g = build_graph(load_config("llama3-8b"), Workload(seq_len=1, past_len=100))
    _, cut = collectives(g, Strategy(tp=8))
    _, whole = collectives(g, Strategy(tp=8, whole_vocab=True))
    assert by_kind(whole) == {"all_reduce": 2 * 32}
    assert by_kind(cut) == {"all_reduce": 2 * 32 + 1, "all_gather": 1}
    vocab = 128256 * 4096  # the embedding table and the (untied) LM head, each
    assert whole["devices"][0]["params"] - cut["devices"][0]["params"] == 2 * vocab * 7 / 8
    assert Strategy(tp=8, whole_vocab=True).describe() == "tp=8 whole_vocab"
    assert strategy_of("tp=8 whole_vocab") == Strategy(tp=8, whole_vocab=True)  # reads it back
    with pytest.raises(ConfigError, match="whole_vocab must be true or false, got 'yes'"):
        partition(g, Strategy(tp=8, whole_vocab="yes"))
    assert "whole_vocab" not in Strategy(tp=8).to_dict()  # default reports read as before
    # the step reads the whole bf16 LM head, not an eighth, less the two collectives' latency
    lm_head = 2 * vocab * 7 / 8 / load_hardware("h100").bandwidth()
    slower = whole["stages"][0]["seconds"] - cut["stages"][0]["seconds"]
    assert 0.8 * lm_head < slower < lm_head


def test_sp_turns_each_all_reduce_into_reduce_scatter_and_all_gather():
    g = build_graph(load_config("llama3-70b"), Workload(seq_len=2048))
    _, r = collectives(g, Strategy(tp=8, sp=True))
    act = 2048 * 8192 * 2
    per_layer: dict = Counter()
    for c in r["collectives"]:
        if c["name"].startswith("model.layers.7."):
            per_layer[c["kind"]] += 1
            assert c["bytes"] == act
    assert per_layer == {"all_gather": 2, "reduce_scatter": 2}
    # the embedding's reduce-scatter; the LM head gathers its input and its logits
    assert by_kind(r) == {"reduce_scatter": 2 * 80 + 1, "all_gather": 2 * 80 + 2}
    rs = [c for c in r["collectives"] if c["kind"] == "reduce_scatter"]
    assert {c["wire_bytes_per_device"] for c in rs} == {7 / 8 * act}


def test_ep_two_all_to_alls_of_routed_tokens_per_moe_layer():
    cfg = load_config("mixtral-8x7b")
    g = build_graph(cfg, Workload(batch=8, seq_len=128))
    _, r = collectives(g, Strategy(ep=8))
    a2a = [c for c in r["collectives"] if c["kind"] == "all_to_all"]
    assert by_kind(r) == {"all_to_all": 2 * 32}  # tokens cut on B: attention needs nothing
    payload = 8 * 128 * 2 * 4096 * 2  # B*T*k*d in bf16
    assert {c["bytes"] for c in a2a} == {payload}
    assert {c["wire_bytes_per_device"] for c in a2a} == {7 / 8 * payload / 8}
    layer0 = sorted(c["name"] for c in a2a if ".layers.0." in c["name"])
    assert layer0 == [
        "model.layers.0.block_sparse_moe.experts.dispatch.all_to_all",
        "model.layers.0.block_sparse_moe.experts.w2.all_to_all",
    ]
    p = run(g, ["params"])["params"]
    experts = p.by_kind["moe_experts"]
    assert r["devices"][0]["params"] == p.total - experts + experts / 8


def test_pp_sends_one_microbatch_of_activations_per_boundary():
    g = build_graph(load_config("llama3-70b"), Workload(batch=8, seq_len=512))
    _, r = collectives(g, Strategy(pp=4, microbatches=4))
    sends = [c for c in r["collectives"] if c["kind"] == "send/recv"]
    assert by_kind(r) == {"send/recv": 3}
    assert all(c["bytes"] == 8 // 4 * 512 * 8192 * 2 and c["count"] == 4 for c in sends)
    assert r["pipeline"]["bubble"] == pytest.approx(3 / 7)
    layers = [s["layers"] for s in r["stages"]]
    assert layers[0][0] == 0 and layers[-1][1] == 79
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(layers))  # contiguous
    assert all(15 <= b - a + 1 <= 25 for a, b in layers)  # balanced: ~20 layers each
    # the first microbatch through the four stages, the other three a turn of the slowest each
    step = r["pipeline"]["step_seconds"]
    per_mb = [s["seconds_per_microbatch"] for s in r["stages"]]
    assert step == pytest.approx(sum(per_mb) + 3 * max(per_mb))
    assert sum(per_mb) + 3 * max(per_mb) < (4 + 4 - 1) * max(per_mb)  # the stages differ


def test_cp_gathers_only_keys_and_values_before_the_kv_head_copy():
    g = build_graph(load_config("llama3-8b"), Workload(seq_len=4096))
    pg, r = collectives(g, Strategy(cp=4))
    names = {c["name"] for c in r["collectives"]}
    assert by_kind(r) == {"all_gather": 2 * 32}
    assert "model.layers.3.self_attn.k_rope.all_gather" in names
    assert "model.layers.3.self_attn.v_heads.all_gather" in names
    kv = 4096 * 8 * 128 * 2  # the whole K (B*T*kv_heads*head_dim), before the GQA copy
    assert {c["bytes"] for c in r["collectives"]} == {kv}
    # the tokens pass's mixing ops are the only ones that read other ranks' data
    mixing = {n.name for n in pg.nodes() if n.op in ("scores", "pv")}
    readers = {u.name for n in pg.nodes("all_gather") for u in pg.users(n)}
    assert {pg[r].op for r in readers} == {"repeat_kv"}
    assert all(pg.users(pg[r])[0].name in mixing for r in readers)


def test_gqa_with_more_ranks_than_kv_heads_replicates_them_and_says_so():
    g = build_graph(load_config("llama3-8b"), Workload(seq_len=128))
    pg, r = collectives(g, Strategy(tp=16), hw=None)
    assert any("8 KV heads" in n for n in r["notes"])
    k = pg["model.layers.0.self_attn.k_proj.weight"]
    assert k.out.format() == "128×4096"  # one KV head per rank, each held by two ranks
    assert pg["model.layers.0.self_attn.k_repeat"].out.format() == "B×2×T×128"  # 32 / 16 heads


def test_partitioned_graph_feeds_the_other_passes():
    pg = partition(tiny_graph(), Strategy(tp=2, sp=True))
    res = run(pg, ["verify", "params", "cost", "memory", "tokens"])
    assert res["cost"].flops["total"] > 0
    comm = [n for n in pg.nodes() if OPS[n.op].category == COMMUNICATION]
    assert comm and all(n.meta["cost"].flops == 0 for n in comm)
    assert run(tiny_graph(), ["partition"], strategy=Strategy(tp=2))["partition"].verify() is None


def test_one_device_changes_nothing():
    g = tiny_graph()
    pg = partition(g, Strategy())
    assert sorted(n.name for n in pg.nodes()) == sorted(n.name for n in g.nodes())
    assert all(n.outputs == g[n.name].outputs for n in pg.nodes())
    assert check_partition(g, pg).max_diff == 0.0


def test_balance_minimises_the_slowest_stage():
    assert balance([1, 1, 1, 1], 2) == [(0, 1), (2, 3)]
    assert balance([5, 1, 1, 1, 1, 1], 2) == [(0, 0), (1, 5)]
    assert balance([1, 2, 3], 3) == [(0, 0), (1, 1), (2, 2)]


# -- correct by execution --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("family", "strategy", "workload"),
    [
        ("llama", Strategy(tp=2), {}),
        ("llama", Strategy(tp=4), {}),  # more ranks than KV heads
        ("llama", Strategy(tp=2, sp=True), {}),
        ("llama", Strategy(cp=2), {}),
        ("llama", Strategy(pp=2, microbatches=2), {}),
        ("llama", Strategy(dp=2, cp=2, tp=2, sp=True), {}),
        ("llama", Strategy(tp=2, cp=2), {"past_len": 5, "seq_len": 4}),  # decode with a cache
        ("qwen2", Strategy(tp=2, pp=2, sp=True), {}),  # biases, column-parallel
        ("phi3", Strategy(tp=2), {}),  # fused projections stay whole
        ("mistral", Strategy(cp=4, tp=2), {"past_len": 6, "seq_len": 4}),  # rolling window
        ("phi3-partial", Strategy(tp=2, sp=True), {}),
        ("phi3-partial", Strategy(cp=2, pp=2), {}),
        ("phi3-longrope", Strategy(tp=2, pp=2), {}),
        ("phi3-longrope", Strategy(dp=2, tp=2), {}),
        ("mixtral", Strategy(tp=2), {}),
        ("mixtral", Strategy(ep=2), {}),  # tokens cut on B
        ("mixtral", Strategy(ep=4), {"batch": 2}),  # tokens cut on T
        ("mixtral", Strategy(ep=2, tp=2, sp=True), {}),
        ("mixtral", Strategy(tp=2, pp=2, ep=2), {}),
        ("qwen2_moe", Strategy(tp=2, pp=3, ep=2, microbatches=2), {}),  # shared expert, dense layer
        ("qwen2_moe", Strategy(cp=2, ep=2, dp=2), {}),
        # issue 16
        ("olmo2", Strategy(tp=2), {}),
        ("olmo2", Strategy(tp=2, sp=True, pp=2), {}),
        ("olmo2", Strategy(tp=2, cp=2), {"past_len": 5, "seq_len": 4}),
        ("cohere", Strategy(tp=2), {}),
        ("cohere", Strategy(tp=2, sp=True, pp=2), {}),
        ("cohere", Strategy(tp=2, cp=2), {"past_len": 5, "seq_len": 4}),
        ("cohere2", Strategy(tp=2, pp=2), {}),
        ("cohere2", Strategy(cp=4, tp=2), {"past_len": 6, "seq_len": 4}),  # rolling window
        ("gemma2", Strategy(tp=2), {}),
        ("gemma2", Strategy(tp=2, sp=True, pp=2), {}),
        ("gemma2", Strategy(cp=4, tp=2), {"past_len": 6, "seq_len": 4}),  # rolling window
        ("gemma3", Strategy(tp=2), {}),
        ("gemma3", Strategy(tp=2, sp=True, pp=2), {}),
        ("gemma3", Strategy(cp=4, tp=2), {"past_len": 6, "seq_len": 4}),  # rolling window
        # issue 16: the chunk and the temperature on token shards, from absolute positions
        ("llama4", Strategy(tp=2), {}),
        ("llama4", Strategy(tp=2, sp=True, pp=2), {}),
        ("llama4", Strategy(cp=2), {}),
        ("llama4", Strategy(cp=4, tp=2), {"past_len": 6, "seq_len": 4}),  # rolled chunk cache
        ("llama4", Strategy(dp=2, pp=2), {"past_len": 5, "seq_len": 3}),
        # issue 16 audit: the families that had no partitioned run
        ("granite", Strategy(tp=2, sp=True, pp=2), {}),
        ("granite", Strategy(tp=2, cp=2), {"past_len": 5, "seq_len": 4}),
        ("smollm3", Strategy(tp=2, sp=True, pp=2), {}),
        ("smollm3", Strategy(cp=4, tp=2), {"past_len": 6, "seq_len": 4}),  # rolling window
        ("cohere2", Strategy(tp=2, sp=True), {}),
        ("cohere2", Strategy(cp=2), {}),
        ("llama", Strategy(tp=2, whole_vocab=True), {}),  # issue 20: gpt-fast's tp
    ],
    ids=lambda v: v.describe().replace(" ", ",") if isinstance(v, Strategy) else None,
)
def test_partitioned_run_equals_single_device(family, strategy, workload):
    g = tiny_graph(family, **workload)
    pg = partition(g, strategy)
    check = check_partition(g, pg, seed=1)
    assert check.max_diff <= 1e-5, check.differences(3)
    assert all(v <= 1e-5 for v in check.others.values()), check.others  # present K/V too
    assert check.ranks == strategy.devices


@pytest.mark.parametrize(
    ("strategy", "workload"),
    [
        (Strategy(cp=2), {}),  # the first rank's positions alone stay below long_from (6)
        (Strategy(tp=2, sp=True), {}),
        (Strategy(cp=2, tp=2), {"past_len": 2, "seq_len": 4}),  # the call crosses long_from
        (Strategy(cp=2), {"past_len": 1, "seq_len": 4}),  # the short factors on every rank
    ],
)
def test_longrope_on_a_token_shard_picks_the_whole_calls_frequencies(strategy, workload):
    # issue 16 audit: a rank holding a block of the tokens picks the table from the call's
    # largest position (the token axis's end), as the unpartitioned run does
    g = tiny_graph("phi3-longrope", **workload)
    check = check_partition(g, partition(g, strategy), seed=1)
    assert check.max_diff <= 1e-5, check.differences(3)


# -- the command line ------------------------------------------------------------------------------
def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_partition_json_devices_and_collectives():
    r = invoke("partition", "--config", EXAMPLES / "tiny.yaml", "--tp", "2", "--pp", "2", "--json")
    assert r.exit_code == 0, r.output
    p = json.loads(r.stdout)["partition"]
    assert isinstance(p["devices"], list) and len(p["devices"]) == 4
    keys = {"name", "kind", "bytes", "group_size", "wire_bytes_per_device"}
    assert p["collectives"] and all(keys <= set(c) for c in p["collectives"])
    d = p["devices"][0]
    for k in ("params", "weight_bytes", "kv_cache_bytes", "activation_bytes", "flops", "bytes"):
        assert d[k] > 0
    assert set(d["comm_bytes"]) == {"all_reduce", "send/recv"}
    assert d["fits"] is True and d["seconds"] > d["comm_seconds"] > 0


def test_partition_summary_and_verify_partition():
    r = invoke("partition", "--model", "mixtral-8x7b", "--ep", "8", "--tp", "2", "--pp", "2")
    assert r.exit_code == 0, r.output
    out = " ".join(r.stdout.split())
    assert "all_to_all" in out and "send/recv" in out and "bubble 50.0%" in out
    r = invoke("verify", "partition", "--config", EXAMPLES / "tiny.yaml", "--tp", "2", "--sp")
    assert r.exit_code == 0, r.output
    assert "logits equal within 1e-5" in r.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tp", "3"], "--tp 3 does not divide the 4 attention heads"),
        (["--cp", "3"], "--cp 3 does not divide the 8 new tokens"),
        (["--pp", "3"], "--pp 3 is more than the 2 layers"),
        (["--ep", "2"], "--ep needs a mixture-of-experts model"),
        (["--sp"], "--sp shards the tensor-parallel group"),
        (["--dp", "3"], "--dp 3 does not divide the batch 2"),
    ],
)
def test_bad_strategies_are_one_line_and_exit_2(args, message):
    for cmd in (["partition"], ["verify", "partition"]):
        r = invoke(*cmd, "--config", EXAMPLES / "tiny.yaml", *args)
        assert r.exit_code == 2, r.output
        assert message in r.output and len(r.output.strip().splitlines()) == 1


def test_bad_ffn_and_expert_counts(tmp_path):
    wide = tmp_path / "odd.yaml"
    wide.write_text(json.dumps({**TINY, "intermediate_size": 130}))
    r = invoke("partition", "--config", wide, "--tp", "4")
    assert r.exit_code == 2 and "--tp 4 does not divide the ffn width" in r.output
    r = invoke("partition", "--config", EXAMPLES / "mixtral.yaml", "--ep", "3")
    assert r.exit_code == 2 and "--ep 3 does not divide the 8 experts" in r.output


def test_more_than_one_device_needs_an_interconnect():
    cpu = load_hardware("h100").__class__(
        **{**load_hardware("h100").to_dict(), "interconnect_bandwidth": None, "name": "cpu"}
    )
    with pytest.raises(ConfigError, match="no interconnect"):
        partition(tiny_graph(), Strategy(tp=2), cpu)


def test_data_parallel_rank_reads_the_experts_its_own_tokens_touch():
    # a dp rank routes its own B/dp sequences: it reads the experts those tokens touch, exactly as
    # the unpartitioned model with that batch does
    from graphllm import Workload, build_graph, load_config
    from graphllm.passes import run as run_passes
    from graphllm.passes.parallel.partition import Strategy, partition

    cfg = load_config("mixtral-8x7b")
    big = build_graph(cfg, Workload(batch=16, seq_len=1, past_len=64))
    rank = partition(big, Strategy(dp=8))
    one = build_graph(cfg, Workload(batch=2, seq_len=1, past_len=64))
    w_rank = run_passes(rank, ["cost"])["cost"].bytes["weights"]
    w_one = run_passes(one, ["cost"])["cost"].bytes["weights"]
    assert w_rank == pytest.approx(w_one, rel=1e-9)
