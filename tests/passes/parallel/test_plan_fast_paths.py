"""The shortcuts plan takes on its hundreds of rank programs (issue 20) give what the checked
paths give: a program verified once, its nodes costed and timed without the passes' totals, its
nodes added with the layout's types, names' scopes shared by graphs of one scopes table."""

import dataclasses

import pytest

from graphllm import Workload, build_graph
from graphllm.build.kinds import LAYER
from graphllm.models.config import config_from_dict
from graphllm.models.hardware import load_hardware
from graphllm.passes.cost import layer_of, scopes_of
from graphllm.passes.parallel.figures import Figures, tally
from graphllm.passes.parallel.partition import Strategy, make_mesh, partition, seeds, validate
from graphllm.passes.parallel.sharding import spmd
from tests.support import tiny_configs

H100 = load_hardware("h100")
MOE = {**tiny_configs.LLAMA, "model_type": "mixtral", "num_local_experts": 4,
       "num_experts_per_tok": 2}  # fmt: skip


@pytest.fixture(scope="module")
def graph():
    return build_graph(config_from_dict(MOE, "moe"), Workload(batch=4, seq_len=8))


def _figures(pg, training, verified):
    f = Figures()
    timed = tally(pg, H100, "flash", training, lambda n: [f], verified=verified)
    costs = {n.name: n.meta["cost"] for n in pg.nodes()}
    times = {n.name: n.meta["time"] for n in pg.nodes()}
    return dataclasses.asdict(f), timed, costs, times


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("s", [Strategy(tp=2), Strategy(ep=2, cp=2), Strategy(tp=2, sp=True)])
def test_tally_of_a_verified_program_is_the_passes(graph, s, training):
    pg = partition(graph, s, H100)
    fast = _figures(pg, training, verified=True)
    assert fast == _figures(pg, training, verified=False)  # exact: same floats, same order
    assert fast[0]["compute_seconds"] > 0 and fast[1]


def test_a_verified_input_is_partitioned_alike(graph):
    for s in (Strategy(tp=2), Strategy(ep=2), Strategy(tp=2, cp=2)):
        a, b = partition(graph, s, H100), partition(graph, s, H100, verified=True)
        assert a.print(bound=True) == b.print(bound=True)
        assert [n.meta["sharding"] for n in a.nodes()] == [n.meta["sharding"] for n in b.nodes()]


def test_spmd_unchecked_builds_the_checked_program(graph):
    s = Strategy(tp=2, ep=2)
    seeded, _ = seeds(graph, s, validate(graph.meta["config"], graph.meta["workload"], s))
    a = spmd(graph, make_mesh(s), seeded)
    b = spmd(graph, make_mesh(s), seeded, checked=False)
    assert a.print(bound=True) == b.print(bound=True)
    b.verify()  # what partition runs after it


def test_scopes_are_shared_by_a_table_not_across_tables(graph):
    pg = partition(graph, Strategy(tp=2), H100)
    for n in graph.nodes():
        assert scopes_of(pg, n.name) == scopes_of(graph, n.name)
        assert layer_of(pg, n.name) == layer_of(graph, n.name)
    other = build_graph(config_from_dict(MOE, "moe"), Workload(batch=4, seq_len=8))
    other.meta["scopes"] = {k: ("x" if v == LAYER else v) for k, v in other.meta["scopes"].items()}
    lay = next(n.name for n in graph.nodes() if layer_of(graph, n.name))
    assert layer_of(graph, lay) and layer_of(other, lay) == ""  # its own table, not the first's
    assert all(k != LAYER for _, k in scopes_of(other, lay))
