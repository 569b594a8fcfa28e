"""issue 19: partitioning Nemotron-H (Mamba2, NoPE attention, relu^2 MLP and MoE layers, each one
sub-layer), each strategy checked by execution against the single-device graph, the carried conv
and SSM states included; context parallelism of a Mamba2 layer refused in one line.

Under tp the Mamba2 mixer's fused in_proj is cut by columns and its output gathered (z, xBC and
dt are picked from it whole), the conv and the scan run whole on every rank, and out_proj is
cut by rows and reduced, as for Qwen3-Next's fused projections (tests/passes/parallel/
test_partition_qwen3_next.py): tp over the Mamba heads themselves (Megatron's per-rank z, x, B,
C and dt blocks) is not modelled."""

import pytest
import yaml
from click.testing import CliRunner

from graphllm import Workload, build_graph
from graphllm.cli import main
from graphllm.errors import ConfigError
from graphllm.models.config import config_from_dict
from graphllm.passes.parallel.partition import Strategy, partition
from graphllm.runtime.spmd import check_partition
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
    cfg = config_from_dict(dict(TINY), "nemotron_h")
    return build_graph(cfg, Workload(**({"batch": 4, "seq_len": 8, "dtype": "fp32"} | workload)))


@pytest.mark.parametrize(("strategy", "workload"), CASES, ids=lambda v: str(v))
def test_partitioned_run_equals_single_device(strategy, workload):
    g = _graph(**workload)
    check = check_partition(g, partition(g, strategy), seed=1)
    assert check.max_diff <= 1e-5, check.differences(3)
    states = [k for k in check.others if k.endswith("_state")]
    assert len(states) == 2 * 2  # conv and SSM state of the two Mamba2 layers
    assert all(v <= 1e-5 for v in check.others.values()), check.others


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
    f = tmp_path / "tiny-nemotron-h.yaml"
    f.write_text(yaml.safe_dump(TINY))
    args = ["verify", "partition", "--config", str(f), "--tp", "2", "--ep", "2", "--pp", "2"]
    r = CliRunner().invoke(main, [*args, "-b", "2"])
    assert r.exit_code == 0, r.output
    assert "logits equal within 1e-5" in r.stdout
    r = CliRunner().invoke(main, ["verify", "partition", "--config", str(f), "--cp", "2"])
    assert r.exit_code == 2 and "reads the tokens in order" in r.output
