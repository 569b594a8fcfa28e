"""The cost and roofline tallies sum their floats correctly rounded (math.fsum), so a report does
not depend on the order of its ops: what lets trace tally one layer of each kind and add it for
every layer (report/reuse.py). A MoE decode's (Qwen1.5-MoE's 60 experts) expected expert reads and a step's seconds are
floats no order of plain additions would sum alike."""

import random

import graphllm
from graphllm.models.hardware import load_hardware
from graphllm.passes.cost import CostTally, scopes_of
from graphllm.passes.registry import run
from graphllm.passes.roofline import Timer, TimeTally, _core


def _graph():
    g = graphllm.build_graph(
        graphllm.load_config("qwen1.5-moe-a2.7b"),
        graphllm.Workload(batch=3, seq_len=1, past_len=77),
    )
    run(g, ["cost", "roofline"], hardware=load_hardware("h100"))
    return g


def test_a_cost_tally_is_the_same_in_any_order_and_split_anywhere():
    g = _graph()
    rows = [(n.op, n.meta["cost"], scopes_of(g, n.name)) for n in g.nodes()]
    whole = CostTally()
    for row in rows:
        whole.add(*row)
    shuffled = rows[:]
    random.Random(0).shuffle(shuffled)
    parts = [CostTally(), CostTally()]
    for k, row in enumerate(shuffled):
        parts[k % 2].add(*row)
    joined = CostTally()
    joined.extend(parts[1])
    joined.extend(parts[0])
    got, want = joined.report("flash", False).to_dict(), whole.report("flash", False).to_dict()
    assert got["bytes"] == want["bytes"] and got["flops"]["by_scope"] == want["flops"]["by_scope"]
    # 60 experts, 4 a token: the touched share is no binary fraction, and the plain sum of the
    # same floats in the two orders differs: the test can tell
    moved = [oc.bytes for _, oc, _ in rows if oc.bytes % 1]
    assert moved, "expected fractional expert reads"
    assert sum(oc.bytes for _, oc, _ in rows) != sum(oc.bytes for _, oc, _ in shuffled)


def test_a_time_tally_is_the_same_with_its_layers_in_any_order():
    g = _graph()
    hw = load_hardware("h100")
    timer = Timer(g, hw, True)
    runs: dict[str | None, list] = {}  # by layer (None: before or after the layers)
    for n in g.nodes():
        sc = scopes_of(g, n.name)
        lay = next((p for p, k in sc if k == "layer"), None)
        runs.setdefault(lay, []).append(
            (n.name, n.op, *timer.base(n, n.meta["cost"], sc), _core(sc), sc)
        )
    rows = [r for run in runs.values() for r in run]
    wl, bw = g.meta["workload"], timer.bw
    whole = TimeTally()
    whole.add(rows, timer, wl, False, bw, None)
    order = list(runs)
    random.Random(3).shuffle(order)  # an order whose plain sum differs (below)
    joined = TimeTally()
    for lay in order:  # each layer's run tallied on its own, then added in another order
        part = TimeTally()
        part.add(runs[lay], timer, wl, False, bw, None)
        joined.extend(part)
    got, want = joined.report(timer, wl, False, bw), whole.report(timer, wl, False, bw)
    assert got.seconds == want.seconds and got.by_scope == want.by_scope
    assert got.launch_seconds == want.launch_seconds and got.kernels == want.kernels
    assert got.by_op == want.by_op
    # the plain sum of the ops' seconds in the order joined differs: the test can tell
    plain = [t for lay in order for t in _times(runs[lay], timer, wl, bw)]
    assert sum(whole.total) != sum(plain)


def _times(rows: list, timer: Timer, wl, bw: float) -> list[float]:
    t = TimeTally()
    t.add(rows, timer, wl, False, bw, None)
    return t.total
