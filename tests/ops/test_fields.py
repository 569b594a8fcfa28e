"""A pass reads what it needs from an op's row: a new row with the same fields gets the same
treatment without any pass knowing its name, and changing the field changes the answer."""

from dataclasses import replace

import pytest

from graphllm import Workload, build_graph
from graphllm.models.config import config_from_dict
from graphllm.ops import COMMUNICATION, OPS
from graphllm.passes.parallel.figures import comm_bytes
from graphllm.passes.parallel.partition import (
    Strategy,
    make_mesh,
    partition,
    partition_report,
    seeds,
    validate,
)
from graphllm.passes.parallel.sharding import hoist_gathers, spmd
from graphllm.passes.training import saved_activations
from tests.support import tiny_configs


def tiny(**wl):
    cfg = config_from_dict(tiny_configs.LLAMA, "tiny")
    return build_graph(cfg, Workload(**({"batch": 4, "seq_len": 8} | wl)))


@pytest.fixture
def clone(monkeypatch):
    """Register a copy of an op's row under a new name (for this test), with fields changed."""

    def make(op, **fields):
        name = f"{op}_clone"
        monkeypatch.setitem(OPS, name, replace(OPS[op], name=name, **fields))
        return name

    return make


def _rename(graph, op, new):
    for n in graph.nodes():
        if n.op == op:  # a test's own graph surgery, not a pass
            n.op = new


def test_flash_attention_keeps_the_row_statistics_its_row_declares(clone):
    g = tiny()
    flash = saved_activations(g, attention="flash").saved
    _rename(g, "softmax", clone("softmax"))
    assert saved_activations(g, attention="flash").saved == flash
    _rename(g, "softmax_clone", clone("softmax", backward_stats=0))
    # B x H x T fp32 log-sum-exps per layer, gone
    assert saved_activations(g, attention="flash").saved == flash - 2 * 4 * (4 * 4 * 8)


def test_collectives_and_send_recv_are_reported_from_their_rows(clone):
    g = tiny()
    pg = partition(g, Strategy(tp=2, sp=True, pp=2))
    before = partition_report(pg).to_dict()["collectives"]
    for n in list(pg.nodes()):
        if OPS[n.op].category == COMMUNICATION and not n.op.endswith("_clone"):
            _rename(pg, n.op, clone(n.op))
    after = partition_report(pg).to_dict()["collectives"]
    assert {c["kind"] for c in after} == {
        "all_gather_clone",
        "reduce_scatter_clone",
        "send/recv",  # the send's comm_kind; the recv is timed on its peer and not listed
    }
    strip = [{**c, "kind": c["kind"].removesuffix("_clone")} for c in after]
    assert strip == [{**c, "kind": c["kind"]} for c in before]


def test_a_collectives_payload_is_its_rows_rule(clone):
    g = tiny()
    pg = partition(g, Strategy(tp=2, sp=True))
    gather = next(n for n in pg.nodes() if OPS[n.op].gathers)
    whole, wire = comm_bytes(pg, gather)
    gather.op = clone("all_gather", payload="input")
    assert comm_bytes(pg, gather) == (whole / 2, wire / 2)  # one rank's block, not the whole
    gather.op = clone("all_gather", payload="group")
    assert comm_bytes(pg, gather)[0] == whole  # two ranks' blocks: the whole again


@pytest.mark.parametrize("gathers", [True, False])
def test_gathers_move_before_the_kv_head_copy_by_their_row(clone, gathers):
    g = tiny()
    s = Strategy(cp=2)
    seeded, _ = seeds(g, s, validate(g.meta["config"], g.meta["workload"], s))
    local = spmd(g, make_mesh(s), seeded)
    name = clone("all_gather", gathers=gathers)
    _rename(local, "all_gather", name)
    hoisted = hoist_gathers(local)
    readers = {u.op for n in hoisted.nodes() if n.op == name for u in hoisted.users(n)}
    assert readers == ({"repeat_kv"} if gathers else {"scores", "pv"})
