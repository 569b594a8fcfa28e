"""Sharding propagation on hand-built graphs, the collectives' numpy impls, and the SPMD
interpreter that runs a partitioned graph rank by rank."""

import numpy as np
import pytest

from graphllm.errors import GraphError
from graphllm.ir import Dim, Graph, TensorType
from graphllm.ops import OPS
from graphllm.passes.parallel.partition import PartitionPlan, Strategy
from graphllm.passes.parallel.sharding import Mesh, Sharding, local_dim, spmd
from graphllm.runtime.interpret import Interpreter
from graphllm.runtime.spmd import SPMDInterpreter, assemble, shard

B, T = Dim("B", "batch"), Dim("T", "token")
D = Dim("d", "hidden", 8)
F = Dim("f", "ffn", 12)
TP = Mesh((("tp", 2),))


def impl(op, xs, **attrs):
    return OPS[op].impl(list(xs), attrs)


def test_collectives_combine_the_ranks_inputs():
    a, b = np.arange(6.0).reshape(2, 3), np.ones((2, 3))
    s = impl("all_reduce", [a, b])
    assert len(s) == 2 and (s[0] == a + b).all() and (s[1] == a + b).all()
    g = impl("all_gather", [a, b], axis=1)
    assert g[0].shape == (2, 6) and (g[1][:, 3:] == b).all()
    rs = impl("reduce_scatter", [a, b], axis=0)
    assert (rs[0] == (a + b)[:1]).all() and (rs[1] == (a + b)[1:]).all()
    assert (impl("recv", [a, None], src=0)[1] == a).all()
    sl = impl("shard_slice", [a, a], axis=0)
    assert (sl[1] == a[1:]).all() and sl[0].shape == (1, 3)


def test_all_to_all_moves_a_split_and_back():
    rng = np.random.default_rng(0)
    whole = rng.standard_normal((4, 6))  # (experts, slots)
    ranks = np.split(whole, 2, axis=1)  # each rank holds its slots of every expert
    there = impl("all_to_all", ranks, split_axis=0, concat_axis=1)
    assert [x.shape for x in there] == [(2, 6), (2, 6)]  # its experts, every slot
    assert (there[1] == whole[2:]).all()
    back = impl("all_to_all", there, split_axis=1, concat_axis=0)
    assert all((x == y).all() for x, y in zip(back, ranks))


def test_shard_and_assemble_are_inverse_with_nested_splits():
    mesh = Mesh((("cp", 2), ("tp", 2)))
    full = np.arange(2 * 8 * 4).reshape(2, 8, 4)
    sh = Sharding(((), (("cp", 2), ("tp", 2)), ()))
    coords = {tuple(c.values()): c for c in mesh.coords()}
    parts = {r: shard(full, sh, mesh, c) for r, c in coords.items()}
    assert parts[(1, 0)].tolist() == full[:, 4:6].tolist()  # cp outer, tp inner
    assert (assemble(parts, sh, mesh, coords) == full).all()
    held_once = Sharding(((),), frozenset({"tp"}))
    assert shard(np.ones(3), held_once, mesh, {"cp": 0, "tp": 1}).sum() == 0


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
    x = g.add("input", "x", (), {"type": TensorType((B, T, D), "fp32")})
    w1 = g.add("param", "up.weight", (), {"type": TensorType((F, D), "fp32"), "kind": "mlp"})
    w2 = g.add("param", "down.weight", (), {"type": TensorType((D, F), "fp32"), "kind": "mlp"})
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
    x = g.add("input", "x", (), {"type": TensorType((B, T, D), "fp32")})
    w = g.add("param", "w", (), {"type": TensorType((D,), "fp32"), "kind": "norms"})
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
