"""NCCL's tuner model of a collective (graphllm/models/nccl_tuning.py), as `collective_seconds`
uses it for a link with a `tuning`: each expected time is NCCL's formula worked by hand from
its constants (src/graph/tuning.cc, NCCL 2.24-2.29)."""

import pytest

from graphllm.errors import ConfigError
from graphllm.models.hardware import hardware_from_dict, load_hardware
from graphllm.models.nccl_tuning import TUNINGS, Group, nccl_choice, nccl_table
from graphllm.ops import OPS
from graphllm.passes.parallel.figures import collective_seconds, gradient_seconds, nccl_group
from graphllm.passes.parallel.sharding import Mesh
from tests.support.achievable_spec import SPEC, with_achievable

US = 1e-6
H100 = load_hardware("h100")


def test_the_protocol_moves_with_the_size_inside_a_node():
    hopper = TUNINGS["nccl-nvlink-hopper"]
    four = Group("all_reduce", 4, 1, 6, 370e9, hopper, None)
    picks = [nccl_choice(four, b) for b in (8, 4 << 20, 1 << 30)]
    assert [(c.algorithm, c.protocol) for c in picks] == [
        ("ring", "LL"),
        ("ring", "LL128"),
        ("ring", "Simple"),
    ]
    # 8 bytes: LL's latency alone, 6.6 us + 6 hops of 0.6 us
    assert picks[0].seconds == pytest.approx(10.2 * US + 8 / (141e9 * 4 / 6))


def test_an_all_gather_takes_the_ring_of_n_minus_1_steps():
    hopper = TUNINGS["nccl-nvlink-hopper"]
    c = nccl_choice(Group("all_gather", 8, 1, 7, 370e9, hopper, None), 64 << 20)
    assert (c.algorithm, c.protocol) == ("ring", "Simple")
    assert c.seconds == pytest.approx(8.4 * US + 7 * 3.4 * US + (64 << 20) / (370e9 * 8 / 7))
    # through the partition's entry point: the wire bytes are (n-1)/n of the gathered tensor
    wire = OPS["all_gather"].wire(8) * (64 << 20)
    got = collective_seconds("all_gather", 8, wire, Mesh((("tp", 8),)), "tp", H100)
    assert got == pytest.approx(c.seconds)


def test_one_rank_a_node_takes_the_tree_and_the_networks_hops():
    """dp=4 over four nodes, one GPU of each: a small all-reduce's tree LL beats the ring."""
    mesh = Mesh((("dp", 4), ("tp", 8)))
    nbytes = 8192
    wire = OPS["all_reduce"].wire(4) * nbytes
    pick = nccl_choice(nccl_group("all_reduce", 4, mesh, "dp", H100), nbytes)
    assert (pick.algorithm, pick.protocol) == ("tree", "LL")
    # 6.8 us + 2 x log2(4) network hops of 5 us; LL at 0.92 x 40 GB/s / 3.8 (under the Intel
    # host's 20.4 GB/s cap for more than two nodes), halved for the tree, x 0.7 at 2^7 x 64 B
    bw = 0.92 * 40e9 / 3.8 * 0.5 * 0.7
    assert pick.seconds == pytest.approx(26.8 * US + nbytes / bw)
    assert collective_seconds("all_reduce", 4, wire, mesh, "dp", H100) == pick.seconds


def test_a_group_over_two_full_nodes_pays_intra_and_inter_hops():
    """tp=16 on 8-GPU nodes: 8 ranks a node. The ring's 30 steps: 2 across the network (LL:
    2.7 us), the other 28 inside the nodes at max(0.6 us, the host's 1 us post overhead)."""
    mesh = Mesh((("tp", 16),))
    nbytes = 16 << 10
    wire = OPS["all_reduce"].wire(16) * nbytes
    pick = nccl_choice(nccl_group("all_reduce", 16, mesh, "tp", H100), nbytes)
    ring = 6.6 * US + 28 * 1.0 * US + 2 * 2.7 * US + nbytes / (min(39e9, 20e9) * 16 / 30)
    tree = 6.8 * US + 2 * (7 * 0.6 + 1 * 5.0) * US  # NVLink hops inside, one network level
    # LL's tree share at 16 KiB = 2^8 x 64 B: 0.7
    tree += nbytes / (min(0.92 * 40e9 / 3.8, 39e9) * 0.5 * 0.7)
    assert pick.seconds == pytest.approx(min(ring, tree))
    assert pick.algorithm == ("tree" if tree < ring else "ring") and pick.protocol == "LL"
    assert collective_seconds("all_reduce", 16, wire, mesh, "tp", H100) == pick.seconds


def test_a_gradient_over_dp_and_cp_counts_the_ranks_that_share_a_node():
    """dp x cp = 4 x 4 over 16 GPUs in two nodes: cp innermost, so 8 of the 16 share a node."""
    mesh = Mesh((("dp", 4), ("cp", 4)))
    wire = OPS["reduce_scatter"].wire(16) * (256 << 20)
    c = {"mesh_axis": "dp+cp", "kind": "reduce_scatter", "group_size": 16}
    got = gradient_seconds(c | {"wire_bytes_per_device": wire}, mesh, H100)
    tuned = nccl_group("reduce_scatter", 16, mesh, "dp", H100, ranks_per_node=8)
    assert (tuned.nodes, tuned.ring_steps) == (2, 15)
    want = nccl_choice(tuned, 256 << 20)
    assert got == pytest.approx(want.seconds)
    # one network step (two nodes), the other 14 inside at max(3.4, 3 x the 1 us overhead)
    lat = (8.4 + 14 * 3.4 + 1 * 14.0) * US
    assert got == pytest.approx(lat + (256 << 20) / (40e9 * 16 / 15))


def test_kinds_the_tuner_does_not_price_keep_the_step_model():
    mesh = Mesh((("ep", 8),))
    wire = OPS["all_to_all"].wire(8) * (1 << 20)
    assert nccl_group("all_to_all", 8, mesh, "ep", H100) is None
    got = collective_seconds("all_to_all", 8, wire, mesh, "ep", H100)
    assert got == pytest.approx(7 * 3e-6 + wire / 370e9)
    # the ideal model: line rate, no latency, whatever the tuning
    ideal = H100.ideal()
    wire = OPS["all_reduce"].wire(8) * (1 << 20)
    assert nccl_group("all_reduce", 8, mesh, "ep", ideal) is None
    assert collective_seconds("all_reduce", 8, wire, mesh, "ep", ideal) == wire / 450e9


def test_a_link_without_a_tuning_keeps_the_step_model():
    hw = hardware_from_dict(SPEC, "test")
    mesh = Mesh((("tp", 8),))
    wire = OPS["all_reduce"].wire(8) * (1 << 20)
    assert nccl_group("all_reduce", 8, mesh, "tp", hw) is None
    assert collective_seconds("all_reduce", 8, wire, mesh, "tp", hw) == pytest.approx(
        6 * 2 * US + wire / 300e9
    )


@pytest.mark.parametrize("bad", ["nccl-nvlink-hoper", ["nccl"], 3])
def test_an_unknown_tuning_is_refused_with_the_known_ones(bad):
    link = {"bus_bandwidth": 300e9, "step_latency": 2 * US, "tuning": bad}
    with pytest.raises(ConfigError, match=r"interconnect\.tuning: unknown collective tuning") as e:
        hardware_from_dict(with_achievable(interconnect=link), "test")
    assert "nccl-nvlink-hopper" in str(e.value)


def test_every_nvidia_preset_with_links_names_its_tuning():
    for name, inside, across in (
        ("h100", "nccl-nvlink-hopper", "nccl-net-intel"),
        ("h200", "nccl-nvlink-hopper", "nccl-net-intel"),
        ("a100-sxm-80gb", "nccl-nvlink-ampere", "nccl-net-amd"),
    ):
        ach = load_hardware(name).achievable
        assert (ach.interconnect.tuning, ach.network.tuning) == (inside, across), name
        assert "tuning.cc" in ach.source
    # RCCL has a tuner of its own, with other constants: MI300X keeps the step model
    assert load_hardware("mi300x").achievable.interconnect.tuning is None


# NCCL 2.29.2's own tuning table, printed at init (NCCL_DEBUG_SUBSYS=TUNING) on 4 and 6 H100s of
# one HGX node: "latency us/algorithm bandwidth GB/s" for Tree (LL, LL128, Simple) then Ring.
# The Ring Simple broadcast's bandwidth is NCCL's bus bandwidth there (24 channels x 15 GB/s).
PRINTED = "https://github.com/waynehacking8/nccl-collectives-bench/blob/ec97f06204de7297d1b682a4c60f0924602c677d/results/scaling_attributed/"
TABLES = {
    4: (
        "g4_auto.log",
        "    Broadcast |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     7.2/ 141.0 |    15.9/ 331.2 |    11.8/ 360.0 |",
        "    AllGather |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     8.4/ 188.0 |    19.7/ 441.6 |    18.6/ 480.0 |",
        "    AllReduce |    10.4/  43.6 |    21.5/ 128.8 |    32.4/ 165.6 |    10.2/  94.0 |    25.4/ 220.8 |    28.8/ 240.0 |",
    ),
    6: (
        "g6_auto.log",
        "    Broadcast |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     7.2/ 141.0 |    15.9/ 331.2 |    11.8/ 360.0 |",
        "    AllGather |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     9.6/ 169.2 |    23.5/ 397.4 |    25.4/ 432.0 |",
        "    AllReduce |    12.8/  43.6 |    26.5/ 128.8 |    48.4/ 165.6 |    12.6/  84.6 |    33.0/ 198.7 |    42.4/ 216.0 |",
    ),
}  # fmt: skip


def _printed(line: str) -> dict[tuple[str, str], tuple[float, float]]:
    cells = [c.split("/") for c in line.split("|")[1:-1]]
    keys = [(a, p) for a in ("tree", "ring") for p in ("LL", "LL128", "Simple")]
    return {k: (float(lat), float(bw)) for k, (lat, bw) in zip(keys, cells) if float(bw)}


@pytest.mark.parametrize("ranks", sorted(TABLES))
def test_the_model_prints_nccls_own_tuning_table(ranks):
    """Every latency and bandwidth NCCL printed for the ring and the tree, to its 0.1."""
    log, broadcast, gather, reduce = TABLES[ranks]
    bus = _printed(broadcast)["ring", "Simple"][1] * 1e9
    hopper = TUNINGS["nccl-nvlink-hopper"]
    for kind, line, steps in (
        ("all_gather", gather, ranks - 1),
        ("all_reduce", reduce, 2 * (ranks - 1)),
    ):
        assert steps == OPS[kind].latency_steps(ranks)["ring"]
        ours = nccl_table(Group(kind, ranks, 1, steps, bus, hopper, None))
        want = _printed(line)
        assert set(ours) == set(want), (PRINTED + log, kind)
        for key, (lat, bw) in want.items():
            assert round(ours[key][0], 1) == lat, (PRINTED + log, kind, key)
            assert round(ours[key][1] / 1e9, 1) == bw, (PRINTED + log, kind, key)


def test_a_gradient_over_axes_that_are_not_adjacent_counts_each_axis_s_ranks_in_a_node():
    """dp=2, pp=4, cp=2 on 8-GPU nodes: a dp+cp gradient's 4 ranks sit 2 a node on 2 nodes."""
    mesh = Mesh((("dp", 2), ("pp", 4), ("cp", 2)))
    nbytes = 64 << 10
    wire = OPS["all_reduce"].wire(4) * nbytes
    c = {"mesh_axis": "dp+cp", "kind": "all_reduce", "group_size": 4}
    got = gradient_seconds(c | {"wire_bytes_per_device": wire}, mesh, H100)
    tuned = nccl_group("all_reduce", 4, mesh, "dp", H100, ranks_per_node=2)
    assert (tuned.nodes, tuned.ranks) == (2, 4)
    assert got == pytest.approx(nccl_choice(tuned, nbytes).seconds)


def test_a_ring_across_nodes_pays_the_hosts_overhead_and_simples_plateau():
    """A large all-reduce over 16 ranks on two nodes: the ring's Simple, its 28 steps inside the
    nodes at max(3.4, 3 x the Intel host's 1 us) and 2 network steps of 14 us, x 1.4."""
    g = Group(
        "all_reduce", 16, 2, 30, 40e9, TUNINGS["nccl-nvlink-hopper"], TUNINGS["nccl-net-intel"]
    )
    c = nccl_choice(g, 1 << 30)
    assert (c.algorithm, c.protocol) == ("ring", "Simple")
    lat = (8.4 + 28 * 3.4 + 2 * 14.0) * 1.4 * US
    assert c.seconds == pytest.approx(lat + (1 << 30) / (40e9 * 16 / 30))
    # the LL ring's latency: the host's 1 us overhead beats NVLink's 0.6 us hop
    assert nccl_table(g)["ring", "LL"][0] == pytest.approx(6.6 + 28 * 1.0 + 2 * 2.7)
    amd = Group(
        "all_reduce", 16, 2, 30, 40e9, TUNINGS["nccl-nvlink-hopper"], TUNINGS["nccl-net-amd"]
    )
    assert nccl_table(amd)["ring", "LL"][0] == pytest.approx(6.6 + 28 * 2.0 + 2 * 2.7)


@pytest.mark.parametrize(("nodes", "cap"), [(2, 39e9), (3, 20.4e9)])
def test_lls_cap_across_nodes_is_by_node_count(nodes, cap):
    net = TUNINGS["nccl-net-intel"]
    g = Group("all_gather", nodes, nodes, nodes - 1, 400e9, None, net)  # one rank a node
    assert nccl_table(g)["ring", "LL"][1] == pytest.approx(cap * nodes / (nodes - 1))


@pytest.mark.parametrize(
    ("nbytes", "share"), [(64 * 2**3, 1.0), (64 * 2**4, 0.9), (64 * 2**5, 0.8)]
)
def test_the_trees_share_is_indexed_by_log2_of_64_byte_chunks(nbytes, share):
    """LL's row of NCCL's treeCorrectionFactor: 1.0 at level 3, 0.9 at 4, 0.8 at 5 (small
    messages over four nodes of one rank each, where the tree wins)."""
    g = Group("all_reduce", 4, 4, 6, 40e9, None, TUNINGS["nccl-net-intel"])
    lat, bw = nccl_table(g)["tree", "LL"]
    tree = lat * 1e-6 + nbytes / (bw * share)
    got = nccl_choice(g, nbytes)
    assert (got.algorithm, got.protocol) == ("tree", "LL")
    assert got.seconds == pytest.approx(tree, rel=1e-12)
