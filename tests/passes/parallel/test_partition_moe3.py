"""issue 18: partitioning GLM-4.5, MiniMax-M2 and Kimi-K2 (and GLM-4.5's MTP layer), every
strategy checked by execution against the single-device graph, and `verify partition`."""

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

CONFIGS = {
    "glm4_moe": tiny_configs.GLM4_MOE,
    "minimax_m2": tiny_configs.MINIMAX_M2,
    "kimi_k2": tiny_configs.KIMI_K2,
    "gpt_oss": tiny_configs.GPT_OSS,  # issue 18: sinks cut with the heads, experts (E, in, out)
}
CASES = [
    (Strategy(tp=2), {}),
    (Strategy(ep=2), {}),
    (Strategy(ep=2, tp=2), {}),
    (Strategy(tp=2, sp=True), {}),
    (Strategy(tp=2, pp=2), {}),
    (Strategy(tp=2), {"past_len": 5, "seq_len": 2}),  # a cached step
    (Strategy(cp=2), {}),
]


@pytest.mark.parametrize(("strategy", "workload"), CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("family", CONFIGS)
def test_partitioned_run_equals_single_device(family, strategy, workload):
    cfg = config_from_dict(CONFIGS[family], family)
    wl = Workload(**({"batch": 4, "seq_len": 8, "dtype": "fp32"} | workload))
    g = build_graph(cfg, wl)
    check = check_partition(g, partition(g, strategy), seed=1)
    assert check.max_diff <= 1e-5, check.differences(3)
    assert all(v <= 1e-5 for v in check.others.values()), check.others  # the caches too


@pytest.mark.parametrize(
    "strategy", [Strategy(tp=2), Strategy(tp=2, pp=2), Strategy(ep=2)], ids=str
)
def test_partitioned_glm_mtp_equals_single_device(strategy):
    """GLM-4.5's MTP layer (--mtp): its logits and cache agree too, on the last stage."""
    cfg = config_from_dict(tiny_configs.GLM4_MOE, "glm4_moe")
    assert_partitioned_mtp_equals_single_device(cfg, strategy, "present.2.key", "model.layers.2")


@pytest.mark.parametrize("family", CONFIGS)
def test_verify_partition_command(tmp_path, family):
    f = tmp_path / f"tiny-{family}.yaml"
    f.write_text(yaml.safe_dump(CONFIGS[family]))
    args = ["verify", "partition", "--config", str(f), "--tp", "2", "--ep", "2", "--pp", "2"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert "logits equal within 1e-5" in r.stdout


# issue 18 audit: `verify partition --model` on a published MoE model runs a small instance of
# it, as `verify tokens` does, where it stopped with a pointer to a Llama example
@pytest.mark.parametrize(
    ("preset", "extra"),
    [("gpt-oss-20b", []), ("llama4-maverick", []), ("glm4.5", ["--mtp"]), ("minimax-m2", [])],
)
def test_verify_partition_of_a_published_model_runs_its_small_instance(preset, extra):
    args = ["verify", "partition", "--model", preset, "--tp", "2", "--ep", "2", "--pp", "2"]
    r = CliRunner().invoke(main, [*args, "-t", "12", *extra])
    assert r.exit_code == 0, r.output
    assert "verifying a small instance of it" in r.stderr
    assert f"{preset} (small instance)" in r.stdout and "logits equal within 1e-5" in r.stdout
    if extra:
        assert "MTP logits" in r.stdout
