"""The partition check every model with an MTP layer runs (DeepSeek-V3, GLM-4.5, Qwen3-Next)."""

from __future__ import annotations

from graphllm import Workload, build_graph
from graphllm.models.model_config import ModelConfig
from graphllm.passes.parallel.partition import Strategy, partition
from graphllm.runtime.spmd import check_partition


def assert_partitioned_mtp_equals_single_device(
    cfg: ModelConfig, strategy: Strategy, cache: str, scope: str
) -> None:
    """`cfg` with its MTP layer (batch 4 of 8 tokens, fp32) partitioned by `strategy` == one
    device: the logits, the MTP logits and the MTP layer's own cache output `cache` within
    1e-5, and every node under `scope` (the MTP layer) but its params on the last stage."""
    g = build_graph(cfg, Workload(batch=4, seq_len=8, dtype="fp32"), mtp=True)
    local = partition(g, strategy)
    check = check_partition(g, local, seed=1)
    assert check.max_diff <= 1e-5, check.differences(3)
    assert check.others["mtp.1.logits"] <= 1e-5 and check.others[cache] <= 1e-5
    last = strategy.pp - 1
    assert {n.meta["stage"] for n in local.scope(scope) if n.op != "param"} == {last}
