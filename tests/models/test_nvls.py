"""NVLS (NVLink SHARP) all-reduces inside an NVSwitch node: the interconnect's measured `nvls`
(graphllm/models/hardware.py) against the ring and tree of NCCL's tuner model, as
`collective_seconds` prices them for partition, plan and the trace."""

from dataclasses import replace

import pytest

from graphllm import Workload, build_graph, load_config
from graphllm.errors import ConfigError
from graphllm.models.hardware import Nvls, hardware_from_dict, load_hardware
from graphllm.ops import OPS
from graphllm.passes.parallel.figures import collective_seconds, nvls_seconds
from graphllm.passes.parallel.partition import Strategy, partition, partition_report
from graphllm.passes.parallel.sharding import Mesh
from tests.support.achievable_spec import SPEC, US, with_achievable

H100 = load_hardware("h100")
NVLS = {"latency": 80 * US, "bandwidth": {6: 260e9, 8: 280e9}}


def _all_reduce(nbytes: float, ranks: int, hw=H100, mesh=None) -> float:
    mesh = mesh or Mesh((("tp", ranks),))
    wire = OPS["all_reduce"].wire(ranks) * nbytes
    return collective_seconds("all_reduce", ranks, wire, mesh, "tp", hw)


def test_the_hopper_nvswitch_presets_carry_nvls_at_six_and_eight_gpus():
    for name in ("h100", "h200"):
        nvls = load_hardware(name).achievable.interconnect.nvls
        assert nvls == Nvls(latency=80.8e-6, bandwidth={6: 265.88e9, 8: 274.13e9}), name
        assert "g6_NVLS.log" in load_hardware(name).achievable.source
    for name in ("a100-sxm-80gb", "l40s", "mi300x"):
        link = load_hardware(name).achievable.interconnect
        assert link is None or link.nvls is None, name


def test_a_group_between_two_measured_sizes_takes_the_line_between_them():
    nvls = Nvls(latency=80 * US, bandwidth={6: 260e9, 8: 280e9})
    assert nvls.seconds(8, 1e9) == pytest.approx(80 * US + 1e9 / 280e9)
    assert nvls.seconds(7, 1e9) == pytest.approx(80 * US + 1e9 / 270e9)
    # outside the measured sizes NVLS is not priced: NCCL runs the ring there
    assert nvls.seconds(4, 1e9) is None and nvls.seconds(9, 1e9) is None


def test_a_large_all_reduce_over_eight_h100s_runs_nvls_a_small_one_the_ring():
    # 1 GiB: NVLS's 80.8 us + 1 GiB / 274.13 GB/s against the ring Simple's 56 us + 1 GiB over
    # 370 GB/s x 8 / 14
    assert _all_reduce(1 << 30, 8) == pytest.approx(80.8 * US + (1 << 30) / 274.13e9)
    ring = 56.0 * US + (1 << 30) / (370e9 * 8 / 14)
    assert _all_reduce(1 << 30, 8) < 0.8 * ring
    # 2 MiB: the ring's LL (6.6 us + 14 hops of 0.6 us, at min(141, 370 / 2) GB/s x 8 / 14)
    assert _all_reduce(2 << 20, 8) == pytest.approx(15.0 * US + (2 << 20) / (141e9 * 8 / 14))
    # four GPUs: no NVLS (NCCL's tuner keeps the ring there)
    wire = OPS["all_reduce"].wire(4) * (1 << 30)
    assert nvls_seconds("all_reduce", 4, wire, Mesh((("tp", 4),)), "tp", H100) is None


def test_nvls_is_an_all_reduce_inside_one_node_on_the_achievable_model_only():
    mesh = Mesh((("tp", 8),))
    wire = OPS["all_gather"].wire(8) * (1 << 30)
    assert nvls_seconds("all_gather", 8, wire, mesh, "tp", H100) is None
    wire = OPS["all_reduce"].wire(8) * (1 << 30)
    assert nvls_seconds("all_reduce", 8, wire, mesh, "tp", H100.ideal()) is None
    # tp=16 spans two 8-GPU nodes: NVLS tree, not modelled; the ring and tree price it
    two = Mesh((("tp", 16),))
    wire16 = OPS["all_reduce"].wire(16) * (1 << 30)
    assert nvls_seconds("all_reduce", 16, wire16, two, "tp", H100) is None
    # dp=2 x tp=8: a tp group is one node's 8 GPUs
    inner = Mesh((("dp", 2), ("tp", 8)))
    assert nvls_seconds("all_reduce", 8, wire, inner, "tp", H100) == pytest.approx(
        80.8 * US + (1 << 30) / 274.13e9
    )


def test_a_spec_files_nvls_is_read_and_checked():
    hw = hardware_from_dict(
        with_achievable(interconnect=SPEC["achievable"]["interconnect"] | {"nvls": NVLS}), "t"
    )
    assert hw.achievable.interconnect.nvls == Nvls(latency=80 * US, bandwidth={6: 260e9, 8: 280e9})
    # JSON keys are strings
    text_keys = NVLS | {"bandwidth": {"8": 280e9}}
    link = SPEC["achievable"]["interconnect"] | {"nvls": text_keys}
    assert hardware_from_dict(with_achievable(interconnect=link), "t").achievable.interconnect.nvls


@pytest.mark.parametrize(
    "nvls, message",
    [
        ({"latency": 80 * US}, r"interconnect\.nvls: missing bandwidth"),
        (NVLS | {"bandwidth": {}}, r"nvls\.bandwidth must be a mapping of group size"),
        (NVLS | {"bandwidth": {"eight": 280e9}}, r"group size 'eight' is not an integer"),
        (NVLS | {"bandwidth": {1: 280e9}}, r"group size 1 is outside \[2, 32\]"),
        (NVLS | {"bandwidth": {8: -1.0}}, r"nvls\.bandwidth\.8"),
        (NVLS | {"latency": 5.0}, r"nvls\.latency is 5"),
        (NVLS | {"speed": 1}, r"speed"),
    ],
)
def test_a_bad_nvls_is_refused_by_name(nvls, message):
    link = SPEC["achievable"]["interconnect"] | {"nvls": nvls}
    with pytest.raises(ConfigError, match=message):
        hardware_from_dict(with_achievable(interconnect=link), "t")


def test_nvls_across_nodes_or_on_a_calibrated_link_is_refused():
    net = SPEC["achievable"]["network"] | {"nvls": NVLS}
    with pytest.raises(ConfigError, match=r"network\.nvls: NVLS is given on the achievable"):
        hardware_from_dict(with_achievable(network=net), "t")
    link = {"bus_bandwidth": 300e9, "step_latency": 2 * US, "nvls": NVLS}
    with pytest.raises(ConfigError, match=r"links\.all_reduce\.nvls"):
        hardware_from_dict(SPEC | {"links": {"all_reduce": link}}, "t")


def test_a_tp8_prefill_on_h100s_is_faster_with_nvls_by_its_all_reduces():
    """Llama-3-70B, 8192 tokens at TP 8: every all-reduce is 128 MiB, where NVLS runs."""
    graph = build_graph(load_config("llama3-70b"), Workload(batch=1, seq_len=8192))
    ring = replace(H100.achievable, interconnect=replace(H100.achievable.interconnect, nvls=None))
    without = replace(H100, achievable=ring)
    fast, slow = (
        partition_report(partition(graph, Strategy(tp=8), hw), hw).to_dict()
        for hw in (H100, without)
    )
    reduces = [c for c in fast["collectives"] if c["kind"] == "all_reduce"]
    assert len(reduces) == 2 * 80 + 1  # two a layer, and the vocab-parallel embedding's
    per_call = 80.8 * US + (128 << 20) / 274.13e9
    assert all(c["seconds"] == pytest.approx(per_call) for c in reduces)
    # the ring's Simple: 8.4 us + 14 hops of 3.4 us, 128 MiB over 370 GB/s x 8 / 14
    ring_call = 56.0 * US + (128 << 20) / (370e9 * 8 / 14)
    saved = slow["stages"][0]["comm_seconds"] - fast["stages"][0]["comm_seconds"]
    assert saved == pytest.approx(len(reduces) * (ring_call - per_call))
