"""issue 19: partitioning Nemotron-H (Mamba2, NoPE attention, relu^2 MLP and MoE layers, each one
sub-layer), each strategy checked by execution against the single-device graph, the carried conv
and SSM states included; context parallelism of a Mamba2 layer refused in one line.

Under tp the Mamba2 mixer is split over its heads: in_proj's rows are read per group (z, x,
B, C and dt of each group's heads), so a rank projects, convolves and scans its own heads with
its groups' B and C, and out_proj (cut by rows) is followed by one all-reduce, as vLLM's
mamba_mixer2 does. A tp that does not divide n_groups leaves the mixer whole up to out_proj."""

import pytest

from graphllm import Workload, build_graph
from graphllm.errors import ConfigError
from graphllm.models.config import config_from_dict
from graphllm.ops import COMMUNICATION, OPS, node_flops
from graphllm.passes.parallel.partition import Strategy, partition
from graphllm.runtime.spmd import check_partition
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


def _mamba_collectives(part, p):
    """The collectives inside Mamba2 mixer `p` (a rank keeps its block of the states: no gather)."""
    return [n.name for n in part.scope(p) if OPS[n.op].category == COMMUNICATION]


@pytest.mark.parametrize(("tp", "groups"), [(2, 2), (4, 4)])
def test_tp_splits_the_mamba_layers_over_their_heads(tp, groups):
    """Head-parallel TP: each rank projects z, x, B, C and dt of its heads' groups (in_proj's
    rows read per group), convolves and scans only those, and out_proj (cut by rows) is followed
    by one all-reduce; the scan's FLOPs divide by tp."""
    cfg = config_from_dict(dict(TINY, n_groups=groups), "nemotron_h")
    g = build_graph(cfg, Workload(batch=4, seq_len=8, dtype="fp32"))
    part = partition(g, Strategy(tp=tp))
    check = check_partition(g, part, seed=1)
    assert check.max_diff <= 1e-5, check.differences(3)
    states = {k: v for k, v in check.others.items() if k.endswith("_state")}
    assert len(states) == 2 * 2 and all(v <= 1e-5 for v in states.values()), states
    p = "backbone.layers.0.mixer"
    inner, conv, heads = 8 * 4, 8 * 4 + 2 * groups * 8, 8
    assert part[f"{p}.in_proj"].out.shape()[2] == (inner + conv + heads) // tp
    assert part[f"{p}.in_proj.weight"].out.shape()[0] == (inner + conv + heads) // tp  # loaded so
    assert part[f"{p}.conv1d"].out.shape()[2] == conv // tp
    scan = part[f"{p}.scan"]
    assert scan.out.shape()[2] == heads // tp
    assert part.type_of(scan.inputs[3]).shape()[2] == groups // tp  # B: the rank's groups
    assert part[f"{p}.out_proj.weight"].out.shape()[1] == inner // tp
    whole, local = node_flops(g, g[f"{p}.scan"]), node_flops(part, scan)
    assert local[0] * tp == whole[0] and local[1] * tp == whole[1]
    assert _mamba_collectives(part, p) == [f"{p}.out_proj.all_reduce"]


def test_tp_that_does_not_divide_the_groups_runs_the_mixer_whole():
    """--tp 4 over 2 groups: B and C per rank are not modelled, so the mixer runs whole on
    every rank up to out_proj (noted), which still equals one device."""
    g = _graph()
    part = partition(g, Strategy(tp=4))
    assert check_partition(g, part, seed=1).max_diff <= 1e-5
    assert part["backbone.layers.0.mixer.scan"].out.shape()[2] == 8
    assert any("does not divide its 2 groups" in n for n in part.meta["partition"].notes)


def test_tp_must_divide_the_mamba_heads():
    cfg = config_from_dict(dict(TINY, mamba_num_heads=6), "nemotron_h")
    g = build_graph(cfg, Workload(batch=4, seq_len=8, dtype="fp32"))
    with pytest.raises(ConfigError, match="--tp 4 does not divide the 6 Mamba heads") as e:
        partition(g, Strategy(tp=4))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("strategy", [Strategy(cp=2), Strategy(cp=2, tp=2)], ids=str)
def test_context_parallelism_of_a_mamba_layer_is_refused_in_one_line(strategy):
    with pytest.raises(ConfigError, match=r"conv1d .* reads the tokens in order") as e:
        partition(_graph(), strategy)
    assert "\n" not in str(e.value)


def test_verify_partition_command(tmp_path):
    assert_verify_partition_command(tmp_path, TINY, "tiny-nemotron-h")
