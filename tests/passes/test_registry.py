"""Pass contracts: declared options, declared meta writes, loud reads of results not there."""

import pytest

from graphllm import Workload, build_graph, load_config
from graphllm.errors import PassError
from graphllm.ir import Dim, Graph, TensorType
from graphllm.models.hardware import load_hardware
from graphllm.passes import PASSES, Results, meta_result, register, run
from graphllm.passes.attention_region import core_attention_region
from graphllm.passes.parallel.partition import Strategy, partition, partition_report
from graphllm.passes.roofline import roofline_pass
from tests.support import tiny_configs

H100 = load_hardware("h100")


def tiny(**wl):
    cfg = load_config(tiny_configs.LLAMA)
    return build_graph(cfg, Workload(**({"batch": 2, "seq_len": 4, "dtype": "fp32"} | wl)))


@pytest.fixture
def scratch_passes():
    """Passes a test registers are gone after it."""
    before = dict(PASSES)
    yield
    PASSES.clear()
    PASSES.update(before)


# -- options ---------------------------------------------------------------------------------
def test_a_misspelt_option_is_an_error_naming_it():
    with pytest.raises(PassError, match=r"option 'atention': .*did you mean 'attention'\?"):
        run(tiny(), ["cost"], atention="naive")


def test_an_option_no_requested_pass_takes_is_an_error_listing_theirs():
    with pytest.raises(
        PassError, match=r"option 'hardware': none of the passes run \(params\) takes it"
    ):
        run(tiny(), ["params"], hardware=H100)
    with pytest.raises(PassError, match=r"'exact_sets': none of .* \(none\) .* take no options"):
        run(tiny(), [], exact_sets=True)


def test_an_option_reaches_the_required_passes_that_take_it():
    g = tiny()
    naive = run(g, ["roofline"], hardware=H100, attention="naive")  # cost takes attention
    assert naive["cost"].attention == "naive" and naive["roofline"].hardware == H100.name
    flash = run(g, ["roofline"], hardware=H100)
    assert flash["cost"].attention == "flash"
    assert naive["roofline"].seconds > flash["roofline"].seconds


def test_each_pass_gets_only_the_options_it_declares(scratch_passes):
    seen = {}

    @register("a", options=("x",))
    def a(graph, results, x=0):
        seen["a"] = x

    @register("b", requires=("a",), options=("y",))
    def b(graph, results, y=0):
        seen["b"] = y

    run(Graph(), ["b"], x=1, y=2)
    assert seen == {"a": 1, "b": 2}


def test_register_refuses_a_pass_that_swallows_options(scratch_passes):
    with pytest.raises(PassError, match=r"pass loose: declare its options instead of taking"):

        @register("loose")
        def loose(graph, results, **_):
            return None

    with pytest.raises(PassError, match=r"pass odd: declares options \['x'\], but odd takes"):

        @register("odd", options=("x",))
        def odd(graph, results, y=0):
            return None


def test_the_built_in_passes_declare_their_contracts():
    contracts = {
        name: (info.requires, info.options, info.writes, info.graph_writes)
        for name, info in PASSES.items()
    }
    assert contracts == {
        "verify": ((), (), (), ()),
        "params": ((), (), (), ()),
        "tokens": (("verify",), ("exact_sets",), (), ()),
        "cost": (("verify",), ("attention", "training"), ("cost",), ()),
        "memory": (("verify",), ("attention",), (), ()),
        "roofline": (("cost",), ("hardware",), ("time",), ()),
        "partition": (
            ("verify",),
            ("strategy", "hardware"),
            ("sharding", "stage", "stages"),
            ("partition",),
        ),
    }


# -- results ---------------------------------------------------------------------------------
def test_reading_a_pass_that_has_not_run_fails_loudly():
    with pytest.raises(PassError, match=r"pass cost has not run \(ran: none\)"):
        Results()["cost"]
    with pytest.raises(PassError, match="pass cost has not run"):
        roofline_pass(tiny(), Results(), H100)


def test_reading_a_missing_meta_result_names_the_pass():
    g = tiny()
    n = g["model.layers.0.mlp.down_proj"]
    with pytest.raises(PassError, match=r"down_proj: no 'cost' in its meta \(pass cost has not"):
        meta_result(n, "cost")
    with pytest.raises(PassError, match=r"no 'time' in its meta \(pass roofline has not run"):
        meta_result(n, "time")
    with pytest.raises(PassError, match=r"graph .*: no 'partition' in its meta \(pass partition"):
        partition_report(g)
    with pytest.raises(PassError, match="no 'x' in its meta \\(no pass writes it\\)"):
        meta_result(n, "x")
    run(g, ["cost"])
    assert meta_result(n, "cost").flops > 0


def test_cost_and_time_are_left_on_every_node_and_rerunning_drops_stale_ones():
    g = tiny()
    run(g, ["roofline"], hardware=H100)
    assert all("cost" in n.meta and "time" in n.meta for n in g.nodes())
    assert run(g, ["roofline"])["roofline"] is None  # no hardware: nothing timed
    assert not any("time" in n.meta for n in g.nodes())
    assert all("cost" in n.meta for n in g.nodes())


def test_a_pass_that_does_not_write_what_it_declares_fails(scratch_passes):
    @register("lazy", writes=("mark",))
    def lazy(graph, results):
        for n in graph.topo()[:1]:  # one node only
            n.meta["mark"] = 1
        return "done"

    @register("forgetful", graph_writes=("summary",))
    def forgetful(graph, results):
        return "done"

    g = tiny()
    with pytest.raises(PassError, match=r"pass lazy: declares node.meta\['mark'\] but did not"):
        run(g, ["lazy"])
    with pytest.raises(PassError, match=r"forgetful: declares graph.meta\['summary'\] but did"):
        run(g, ["forgetful"])
    assert run(Graph(), ["lazy"])["lazy"] == "done"  # the empty graph: every node has it


def test_empty_graph_and_no_passes():
    assert run(tiny(), []) == {}
    assert run(Graph(), ["verify"])["verify"] == {"nodes": 0, "edges": 0}


# -- transforms own their meta ----------------------------------------------------------------
def test_partition_writes_its_declared_meta_on_every_node():
    g = tiny()
    for s in (Strategy(tp=2), Strategy(tp=2, pp=2)):
        pg = run(g, ["partition"], strategy=s)["partition"]
        assert pg.meta["partition"].strategy == s
        assert all({"sharding", "stage", "stages"} <= set(n.meta) for n in pg.nodes())
        assert all(
            n.meta["stages"] == {n.meta["stage"]}
            for n in pg.nodes()
            if n.op not in ("param", "input")
        )


def test_a_partitioned_graph_shares_no_meta_with_its_source():
    g = tiny()
    run(g, ["cost"])
    pg = partition(g, Strategy(tp=2, pp=2))
    assert pg.meta is not g.meta and pg.meta["scopes"] is not g.meta["scopes"]
    assert pg.meta["scopes"] == g.meta["scopes"] and pg.meta["config"] is g.meta["config"]
    assert "partition" not in g.meta
    assert not any("stage" in n.meta or "sharding" in n.meta for n in g.nodes())
    # its pipeline was balanced on a cost taken before the sends existed: none of it is left
    assert not any("cost" in n.meta or "time" in n.meta for n in pg.nodes())
    shared = {id(n) for n in g.nodes()} & {id(n) for n in pg.nodes()}
    assert not shared
    whole = {n.name: n.meta["cost"] for n in g.nodes()}
    run(pg, ["cost"])
    assert {n.name: n.meta["cost"] for n in g.nodes()} == whole  # each graph its own results
    down = "model.layers.0.mlp.down_proj"
    assert pg[down].meta["cost"].flops == whole[down].flops / 2  # one of two tp ranks


def test_caches_are_keyed_by_the_graph_version():
    g = tiny()
    region = core_attention_region(g)
    assert core_attention_region(g) is region
    x = g["model.norm"]
    g.add("silu", "extra", (x,))  # any change: found again
    assert core_attention_region(g) is not region
    # a cache a copy of meta carries never matches the graph it is carried into
    other = Graph("other")
    other.meta["_attention_region"] = g.meta["_attention_region"]
    other.input("x", TensorType((Dim("B", "batch"),), "fp32"))
    assert core_attention_region(other).pairs == frozenset()


def test_analyses_after_a_transform_in_one_run_are_refused():
    with pytest.raises(
        PassError, match=r"pass cost would run on the graph given, not on partition"
    ):
        run(tiny(), ["partition", "cost"], strategy=Strategy(tp=2))
    pg = run(tiny(), ["partition"], strategy=Strategy(tp=2))["partition"]
    assert run(pg, ["cost"])["cost"].flops["total"] < run(tiny(), ["cost"])["cost"].flops["total"]


def test_rerunning_a_pass_drops_what_the_passes_built_on_it_left():
    g = tiny()
    run(g, ["roofline"], hardware=H100)
    assert all("time" in n.meta for n in g.nodes())
    run(g, ["cost"], training=True)  # the old times were computed from the old cost
    assert not any("time" in n.meta for n in g.nodes())
    with pytest.raises(PassError, match="pass roofline has not run"):
        meta_result(g.nodes().__next__(), "time")
