"""issue 18: partitioning Llama 4's MoE decoder (Llama4TextMoe interleaved with dense layers),
every strategy checked by execution against the single-device graph, and `verify partition`."""

import pytest
import yaml
from click.testing import CliRunner

from graphllm import Workload, build_graph
from graphllm.cli import main
from graphllm.models.config import config_from_dict
from graphllm.passes.parallel.partition import Strategy, partition
from graphllm.runtime.spmd import check_partition
from tests.support import tiny_configs

CASES = [
    (Strategy(tp=2), {}),
    (Strategy(ep=2), {}),
    (Strategy(ep=4), {"batch": 2}),
    (Strategy(ep=2, tp=2), {}),
    (Strategy(tp=2, sp=True), {}),
    (Strategy(tp=2, pp=2), {}),
    (Strategy(tp=2, pp=2, ep=2), {}),
    (Strategy(tp=2), {"past_len": 5, "seq_len": 2}),  # a cached step
    (Strategy(cp=2), {}),
]


@pytest.mark.parametrize(("strategy", "workload"), CASES, ids=lambda v: str(v))
def test_partitioned_run_equals_single_device(strategy, workload):
    cfg = config_from_dict(tiny_configs.LLAMA4_MOE, "llama4_text")
    wl = Workload(**({"batch": 4, "seq_len": 8, "dtype": "fp32"} | workload))
    g = build_graph(cfg, wl)
    check = check_partition(g, partition(g, strategy), seed=1)
    assert check.max_diff <= 1e-5, check.differences(3)
    assert all(v <= 1e-5 for v in check.others.values()), check.others  # the caches too


def test_verify_partition_command(tmp_path):
    f = tmp_path / "tiny-llama4.yaml"
    f.write_text(yaml.safe_dump(tiny_configs.LLAMA4_MOE))
    args = ["verify", "partition", "--config", str(f), "--tp", "2", "--ep", "2", "--pp", "2"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert "logits equal within 1e-5" in r.stdout
