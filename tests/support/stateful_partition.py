"""The partition checks every model with carried states (conv and recurrent/SSM states beside the
KV cache: Nemotron-H, Qwen3-Next) runs: each strategy executed against the single-device graph,
the states included, and `graphllm verify partition` on a tiny config, context parallelism
refused."""

from __future__ import annotations

from pathlib import Path

import yaml
from click.testing import CliRunner

from graphllm import Workload, build_graph
from graphllm.cli import main
from graphllm.ir import Graph
from graphllm.models.config import config_from_dict
from graphllm.passes.parallel.partition import Strategy, partition
from graphllm.runtime.spmd import check_partition


def tiny_graph(tiny: dict, family: str, **workload) -> Graph:
    """The tiny config's graph, batch 4 of 8 tokens in fp32 unless workload says otherwise."""
    cfg = config_from_dict(dict(tiny), family)
    return build_graph(cfg, Workload(**({"batch": 4, "seq_len": 8, "dtype": "fp32"} | workload)))


def assert_partition_equals_single_device(g: Graph, strategy: Strategy, states: int) -> None:
    """The logits and every other output within 1e-5 of the single-device run, and `states` of
    those outputs carried states (names ending in _state)."""
    check = check_partition(g, partition(g, strategy), seed=1)
    assert check.max_diff <= 1e-5, check.differences(3)
    assert len([k for k in check.others if k.endswith("_state")]) == states
    assert all(v <= 1e-5 for v in check.others.values()), check.others


def assert_verify_partition_command(tmp_path: Path, tiny: dict, name: str) -> list[str]:
    """`verify partition` passes tp x ep x pp at batch 2 and refuses --cp 2 (exit 2); returns
    the tp x ep x pp arguments, for a family's further checks."""
    f = tmp_path / f"{name}.yaml"
    # graphllm's YAML refuses .inf; an infinite time_step_limit is spelt as transformers writes it
    spelt = {
        k: [{"__float__": "Infinity"} if x == float("inf") else x for x in v]
        if isinstance(v, list)
        else v
        for k, v in tiny.items()
    }
    f.write_text(yaml.safe_dump(spelt))
    args = ["verify", "partition", "--config", str(f), "--tp", "2", "--ep", "2", "--pp", "2"]
    r = CliRunner().invoke(main, [*args, "-b", "2"])
    assert r.exit_code == 0, r.output
    assert "logits equal within 1e-5" in r.stdout
    r = CliRunner().invoke(main, ["verify", "partition", "--config", str(f), "--cp", "2"])
    assert r.exit_code == 2 and "reads the tokens in order" in r.output
    return args
