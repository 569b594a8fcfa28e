"""A pipeline send runs on the link between its two devices: inside a node over the interconnect,
across nodes over the network, stage pair by stage pair (a pp axis longer than a node sends
most of its activations over NVLink). The rule is checked against every device of the mesh,
enumerated by rank, and `partition` and `plan` price each send by it."""

import itertools

import pytest

from graphllm import Workload, build_graph
from graphllm.models.config import load_config
from graphllm.models.hardware import load_hardware
from graphllm.passes.parallel.figures import _inside_node, collective_seconds
from graphllm.passes.parallel.partition import (
    MESH_ORDER,
    Strategy,
    partition,
    partition_report,
)
from graphllm.passes.parallel.plan import plan
from graphllm.passes.parallel.sharding import Mesh

H100 = load_hardware("h100")  # 8 GPUs a node


def _mesh(**sizes: int) -> Mesh:
    return Mesh(tuple((k, sizes[k]) for k in MESH_ORDER if sizes.get(k, 1) > 1))


def _brute(mesh: Mesh, a: int, b: int, per_node: int) -> bool:
    """Every device at pp coordinate `a` and its peer at `b` (the other coordinates equal) on one
    node, by each device's rank (row-major over the device axes)."""
    axes = [(n, s) for n, s in mesh.axes if n != "mb"]
    names = [n for n, _ in axes]

    def rank(c: dict[str, int]) -> int:
        r = 0
        for n, s in axes:
            r = r * s + c[n]
        return r

    for c in itertools.product(*(range(s) for _, s in axes)):
        here = dict(zip(names, c))
        if here["pp"] != a:
            continue
        peer = here | {"pp": b}
        if rank(here) // per_node != rank(peer) // per_node:
            return False
    return True


MESHES = [
    dict(pp=9),
    dict(pp=16),
    dict(pp=4, tp=2),
    dict(pp=6, tp=2),
    dict(pp=3, tp=4),
    dict(dp=3, pp=4),
    dict(dp=2, pp=3, tp=2),
    dict(pp=5, ep=3),
    dict(pp=2, tp=8),
]


@pytest.mark.parametrize("sizes", MESHES, ids=str)
def test_a_send_is_inside_a_node_exactly_where_its_devices_are(sizes):
    mesh = _mesh(**sizes)
    pp = sizes["pp"]
    for a, b in [(s, s + 1) for s in range(pp - 1)] + [(0, pp - 1)]:
        assert _inside_node(mesh, "pp", H100, (a, b)) == _brute(mesh, a, b, 8), (a, b)


def test_partition_prices_each_send_on_its_own_link():
    cfg = load_config("llama3-8b")
    graph = partition(build_graph(cfg, Workload(seq_len=1024, logits="last")), Strategy(pp=9), H100)
    sends = [c for c in partition_report(graph, H100).collectives if c["kind"].startswith("send")]
    assert [c["stage"] for c in sends] == list(range(8))
    wire = sends[0]["wire_bytes_per_device"]
    mesh = _mesh(pp=9)
    inside = collective_seconds("send", 2, wire, mesh, "pp", H100, pair=(0, 1))
    across = collective_seconds("send", 2, wire, mesh, "pp", H100, pair=(7, 8))
    assert across > 5 * inside  # 40 GB/s of network against 370 of NVLink
    assert [c["seconds"] for c in sends] == [inside] * 7 + [across]


def test_plan_prices_the_stage_sends_as_partition_does():
    cfg = load_config("llama3-8b")
    wl = Workload(seq_len=1024, logits="last")
    report = plan(cfg, wl, 9, H100, pinned={"pp": 9})
    (best,) = [c for c in report.candidates if c["strategy"]["pp"] == 9]
    graph = partition(build_graph(cfg, wl), Strategy(pp=9), H100)
    whole = partition_report(graph, H100)
    assert best["seconds"] == pytest.approx(whole.pipeline["step_seconds"], rel=1e-6)
