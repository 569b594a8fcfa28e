"""issue 19: partitioning Qwen3-Next (Gated DeltaNet layers between attention layers, the MoE
with its gated shared expert), each strategy checked by execution against the single-device
graph, the carried states included; context parallelism refused in one line."""

import pytest
from click.testing import CliRunner

from graphllm.cli import main
from graphllm.errors import ConfigError
from graphllm.models.config import config_from_dict
from graphllm.passes.parallel.partition import Strategy, partition
from tests.support.mtp_partition import assert_partitioned_mtp_equals_single_device
from tests.support.stateful_partition import (
    assert_partition_equals_single_device,
    assert_verify_partition_command,
    tiny_graph,
)

TINY = {
    "model_type": "qwen3_next",
    "vocab_size": 97,
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 6,
    "full_attention_interval": 2,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 24,
    "partial_rotary_factor": 0.5,
}
CASES = [
    (Strategy(tp=2), {}),
    (Strategy(tp=2, sp=True), {}),
    (Strategy(pp=2), {}),
    (Strategy(ep=2), {}),
    (Strategy(dp=2), {}),
    (Strategy(tp=2, pp=2, ep=2), {}),
    (Strategy(tp=2), {"past_len": 5, "seq_len": 2}),  # several tokens after the states
    (Strategy(pp=2, ep=2), {"past_len": 5, "seq_len": 1}),  # a decode step
]


def _graph(**workload):
    return tiny_graph(TINY, "qwen3_next", **workload)


@pytest.mark.parametrize(("strategy", "workload"), CASES, ids=lambda v: str(v))
def test_partitioned_run_equals_single_device(strategy, workload):
    # conv and recurrent state of the two linear layers
    assert_partition_equals_single_device(_graph(**workload), strategy, states=2 * 2)


def test_tp_splits_the_linear_layers_over_their_key_head_groups():
    """Head-parallel TP: in_proj_qkvz/in_proj_ba by columns (whole key-head groups), the conv,
    the delta rule and the gated norm on the rank's groups, out_proj by rows and one
    all-reduce after it; the conv weight's regrouped rows cut to the rank's block."""
    part = partition(_graph(), Strategy(tp=2))
    p = "model.layers.0.linear_attn"
    assert part[f"{p}.in_proj_qkvz.weight"].out.shape()[0] == (2 * 16 + 2 * 24) // 2
    assert part[f"{p}.out_proj.weight"].out.shape()[1] == 24 // 2
    core = part[f"{p}.core"]
    assert core.out.shape()[2] == 4 // 2  # value heads on this rank
    assert part.type_of(core.inputs[0]).shape()[2] == 2 // 2  # key heads
    assert part[f"{p}.conv1d"].out.shape()[2] == (2 * 16 + 24) // 2
    inside = [n for n in part.scope(p) if n.op in ("all_gather", "all_reduce", "all_to_all")]
    # a rank keeps its block of the conv and recurrent states: nothing gathers them
    assert [n.name for n in inside] == [f"{p}.out_proj.all_reduce"]


@pytest.mark.parametrize("strategy", [Strategy(cp=2), Strategy(cp=2, tp=2)], ids=str)
def test_context_parallelism_of_a_recurrent_layer_is_refused_in_one_line(strategy):
    with pytest.raises(ConfigError, match="reads the tokens in order") as e:
        partition(_graph(), strategy)
    assert "\n" not in str(e.value)


def test_verify_partition_command(tmp_path):
    args = assert_verify_partition_command(tmp_path, TINY, "tiny-qwen3-next")
    r = CliRunner().invoke(main, args)  # batch 1: ep would cut the tokens
    assert r.exit_code == 2 and "give a batch that --ep 2 divides" in r.output


def test_tp_must_divide_the_key_head_groups():
    with pytest.raises(ConfigError, match="--tp 4 does not divide the 2 linear-attention key"):
        partition(_graph(), Strategy(tp=4))


@pytest.mark.parametrize(
    "strategy", [Strategy(tp=2), Strategy(tp=2, pp=2), Strategy(ep=2)], ids=str
)
def test_partitioned_mtp_equals_single_device(strategy):
    """With the MTP layer (--mtp): its logits and its own KV cache agree, it runs on the last
    pipeline stage, and the embedding and head it shares with the main model serve both."""
    cfg = config_from_dict(dict(TINY), "qwen3_next")
    assert_partitioned_mtp_equals_single_device(cfg, strategy, "present.4.key", "mtp")
