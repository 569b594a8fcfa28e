"""Partitioning DeepSeek (MLA + routed, shared and dense FFNs): every strategy checked by
execution against the single-device graph, in both MLA forms, and `verify partition` on it."""

import pytest
import yaml
from click.testing import CliRunner

from graphllm import Workload, build_graph
from graphllm.cli import main
from graphllm.models.config import config_from_dict
from graphllm.passes.parallel.partition import Strategy, partition
from graphllm.runtime.spmd import check_partition
from tests.support import tiny_configs
from tests.support.mtp_partition import assert_partitioned_mtp_equals_single_device

V3 = tiny_configs.DEEPSEEK_V3
V2 = {
    **V3,
    "model_type": "deepseek_v2",
    "q_lora_rank": None,
    "topk_method": "group_limited_greedy",
    "n_shared_experts": 2,
}
CASES = [
    (Strategy(tp=2), {}),
    (Strategy(ep=2), {}),
    (Strategy(ep=2, tp=2), {}),
    (Strategy(tp=2, sp=True), {}),
    (Strategy(tp=2, pp=2), {}),
    (Strategy(tp=2), {"past_len": 5, "seq_len": 2}),  # a cached step: the latent cache
    (Strategy(cp=2), {}),
]


@pytest.mark.parametrize("mla", ["naive", "absorbed"])
@pytest.mark.parametrize(("strategy", "workload"), CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("config", [V2, V3], ids=["v2", "v3"])
def test_partitioned_run_equals_single_device(config, strategy, workload, mla):
    cfg = config_from_dict(config, config["model_type"])
    wl = Workload(**({"batch": 4, "seq_len": 8, "dtype": "fp32"} | workload))
    g = build_graph(cfg, wl, mla=mla)
    check = check_partition(g, partition(g, strategy), seed=1)
    assert check.max_diff <= 1e-5, check.differences(3)
    assert all(v <= 1e-5 for v in check.others.values()), check.others  # the latent cache too


def test_verify_partition_command(tmp_path):
    f = tmp_path / "tiny-deepseek.yaml"
    f.write_text(yaml.safe_dump(V3))
    r = CliRunner().invoke(
        main, ["verify", "partition", "--config", str(f), "--tp", "2", "--ep", "2"]
    )
    assert r.exit_code == 0, r.output
    assert "logits equal within 1e-5" in r.stdout


@pytest.mark.parametrize(
    "strategy",
    [Strategy(tp=2), Strategy(tp=2, pp=2), Strategy(ep=2)],
    ids=str,
)
def test_partitioned_mtp_equals_single_device(strategy):
    """With the MTP module (--mtp): its logits and cache agree too, and it runs on the last
    pipeline stage."""
    cfg = config_from_dict(V3, "deepseek_v3")
    assert_partitioned_mtp_equals_single_device(cfg, strategy, "present.2.key", "model.layers.2")


def test_verify_partition_command_with_mtp(tmp_path):
    f = tmp_path / "tiny-deepseek.yaml"
    f.write_text(yaml.safe_dump(V3))
    args = ["verify", "partition", "--config", str(f), "--tp", "2", "--pp", "2", "--mtp", "-t", "8"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert "logits equal within 1e-5" in r.stdout and "MTP logits" in r.stdout
