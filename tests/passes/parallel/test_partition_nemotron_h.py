"""issue 19: partitioning Nemotron-H (Mamba2, NoPE attention, relu^2 MLP and MoE layers, each one
sub-layer), each strategy checked by execution against the single-device graph, the carried conv
and SSM states included; context parallelism of a Mamba2 layer refused in one line.

Under tp the Mamba2 mixer's fused in_proj is cut by columns and its output gathered (z, xBC and
dt are picked from it whole), the conv and the scan run whole on every rank, and out_proj is
cut by rows and reduced, as for Qwen3-Next's fused projections (tests/passes/parallel/
test_partition_qwen3_next.py): tp over the Mamba heads themselves (Megatron's per-rank z, x, B,
C and dt blocks) is not modelled."""

import pytest

from graphllm.errors import ConfigError
from graphllm.passes.parallel.partition import Strategy, partition
from tests.support.stateful_partition import (
    assert_partition_equals_single_device,
    assert_verify_partition_command,
    tiny_graph,
)
from tests.support.tiny_nemotron import SMALL

TINY = dict(SMALL, model_type="nemotron_h", hybrid_override_pattern="M*-EM")
CASES = [
    (Strategy(tp=2), {}),
    (Strategy(tp=2, sp=True), {}),
    (Strategy(tp=4), {}),
    (Strategy(pp=2), {}),
    (Strategy(ep=2), {}),
    (Strategy(dp=2), {}),
    (Strategy(tp=2, pp=2, ep=2), {}),
    (Strategy(tp=2), {"past_len": 5, "seq_len": 2}),  # several tokens after the states
    (Strategy(pp=2, ep=2), {"past_len": 5, "seq_len": 1}),  # a decode step: the recurrent form
]


def _graph(**workload):
    return tiny_graph(TINY, "nemotron_h", **workload)


@pytest.mark.parametrize(("strategy", "workload"), CASES, ids=lambda v: str(v))
def test_partitioned_run_equals_single_device(strategy, workload):
    # conv and SSM state of the two Mamba2 layers
    assert_partition_equals_single_device(_graph(**workload), strategy, states=2 * 2)


def test_tp_cuts_in_proj_by_columns_and_out_proj_by_rows():
    part = partition(_graph(), Strategy(tp=2))
    p = "backbone.layers.0.mixer"
    inner, conv, heads = 8 * 4, 8 * 4 + 2 * 2 * 8, 8
    assert part[f"{p}.in_proj.weight"].out.shape()[0] == (inner + conv + heads) // 2
    assert part[f"{p}.out_proj.weight"].out.shape()[1] == inner // 2
    assert {"all_gather", "all_reduce"} <= {n.op for n in part.scope(p)}


@pytest.mark.parametrize("strategy", [Strategy(cp=2), Strategy(cp=2, tp=2)], ids=str)
def test_context_parallelism_of_a_mamba_layer_is_refused_in_one_line(strategy):
    with pytest.raises(ConfigError, match=r"conv1d .* reads the tokens in order") as e:
        partition(_graph(), strategy)
    assert "\n" not in str(e.value)


def test_verify_partition_command(tmp_path):
    assert_verify_partition_command(tmp_path, TINY, "tiny-nemotron-h")
