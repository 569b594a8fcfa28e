"""Sharding propagation (passes/parallel/sharding.py) on hand-built graphs, and the SPMD
interpreter running what it partitions rank by rank against the single-device one."""

import numpy as np
import pytest

from graphllm.errors import GraphError
from graphllm.ir import Dim, Graph, TensorType
from graphllm.ops import OPS
from graphllm.passes.parallel.partition import PartitionPlan, Strategy
from graphllm.passes.parallel.sharding import Mesh, Sharding, local_dim, spmd
from graphllm.runtime.interpret import Interpreter
from graphllm.runtime.spmd import SPMDInterpreter

B, T = Dim("B", "batch"), Dim("T", "token")
D = Dim("d", "hidden", 8)
F = Dim("f", "ffn", 12)
TP = Mesh((("tp", 2),))


def test_local_dims_are_named_and_bound():
    bindings = {"T": 12}
    assert local_dim(D, 2, bindings, "x") == Dim("d/2", "hidden", 4)
    t = local_dim(T, 4, bindings, "x")
    assert t.name == "T/4" and bindings["T/4"] == 3
    with pytest.raises(GraphError, match="3 blocks do not divide d=8"):
        local_dim(D, 3, bindings, "x")


def mlp() -> Graph:
    """x -> up (f, d) -> silu -> down (d, f): the Megatron pair by hand."""
    g = Graph("mlp", {"B": 2, "T": 4})
    x = g.input("x", TensorType((B, T, D), "fp32"))
    w1 = g.param("up.weight", TensorType((F, D), "fp32"), kind="mlp")
    w2 = g.param("down.weight", TensorType((D, F), "fp32"), kind="mlp")
    h = g.add("silu", "act", (g.add("linear", "up", (x, w1)),))
    g.set_output("y", g.add("linear", "down", (h, w2)))
    return g


def test_column_then_row_parallel_needs_one_all_reduce():
    g = mlp()
    seeds = {
        "up.weight": Sharding(((("tp", 2),), ())),  # column: output features
        "down.weight": Sharding(((), (("tp", 2),))),  # row: input features
    }
    pg = spmd(g, TP, seeds)
    assert pg.print().splitlines()[-3:] == [
        "%down : B×T×8 = linear(act, down.weight)",
        "%down.all_reduce : B×T×8 = all_reduce(down, mesh='tp', group=2)",
        "output y = %down.all_reduce",
    ]
    assert pg["act"].out.format() == "B×T×6"
    assert pg["down"].meta["sharding"][0].partial == {"tp"}
    pg.verify()
    pg.meta["partition"] = PartitionPlan(Strategy(tp=2), TP, ((0, 0),), {})
    rng = np.random.default_rng(0)
    w = {"up.weight": rng.standard_normal((12, 8)), "down.weight": rng.standard_normal((8, 12))}
    x = rng.standard_normal((2, 4, 8)).astype(np.float32)
    ref = Interpreter(g, w).run({"x": x})["y"]
    out = SPMDInterpreter(pg, w).run({"x": x})["y"]
    assert np.abs(ref - out).max() < 1e-5


def test_a_reduced_axis_that_is_split_is_gathered_first():
    g = Graph("norm", {"B": 2, "T": 3})
    x = g.input("x", TensorType((B, T, D), "fp32"))
    w = g.param("w", TensorType((D,), "fp32"), kind="norms")
    x2 = g.add("silu", "act", (x,))
    g.set_output("y", g.add("rmsnorm", "norm", (x2, w), {"eps": 1e-6}))
    pg = spmd(g, TP, {"x": Sharding(((), (), (("tp", 2),)))})
    assert [n.op for n in pg.nodes()] == ["input", "silu", "all_gather", "param", "rmsnorm"]
    assert pg["act"].out.format() == "B×T×4" and pg["norm"].out.format() == "B×T×8"
    # a graph input or weight is simply loaded whole: no collective
    assert [n.op for n in spmd(g, TP, {}).nodes()] == ["input", "silu", "param", "rmsnorm"]


def test_token_split_stays_split_and_no_mesh_changes_nothing():
    g = mlp()
    pg = spmd(g, Mesh((("cp", 2),)), {"x": Sharding(((), (("cp", 2),), ()))})
    assert not any(OPS[n.op].collective or n.op.startswith("all_") for n in pg.nodes())
    assert pg["down"].out.format() == "B×T/2×8"  # graph outputs keep their token split
    same = spmd(g, Mesh(()), {})
    assert sorted(same.print().splitlines()) == sorted(g.print().splitlines())
