"""mi300x's and l40s's achievable figures (issue 20), each sourced; the figures no measurement was
found for left at the fallback rule and named in the preset's _note."""

import pytest

from graphllm import Workload, build_graph
from graphllm.models.config import config_from_dict
from graphllm.models.hardware import PRESETS_PATH, hardware_from_dict, load_hardware
from graphllm.models.parse import read_mapping
from graphllm.passes.parallel.figures import collective_seconds, link_bandwidth
from graphllm.passes.parallel.sharding import Mesh
from graphllm.passes.registry import run
from tests.support import tiny_configs
from tests.support.achievable_spec import with_achievable

MI300X = load_hardware("mi300x")


def test_mi300x_carries_measured_rates_with_their_sources():
    ach = MI300X.achievable
    assert ach is not None and MI300X.rate_model == "achievable"
    for word in ("GEMM", "Attention", "HBM", "Infinity Fabric", "ml-engineering", "Azure"):
        assert word in ach.source, word
    assert MI300X.gemm_rate("bf16") == MI300X.gemm_rate("fp16") == 668.4e12
    assert MI300X.gemm_rate("fp8") == 1159.2e12
    assert MI300X.attention_rate("bf16") == 328.6e12
    assert MI300X.bandwidth() == 4.09e12
    assert MI300X.ideal().bandwidth() == 5.3e12  # --ideal: the data sheet's


def test_mi300x_unmeasured_figures_fall_back_and_the_note_names_them():
    note = read_mapping(PRESETS_PATH)["mi300x"]["_note"]
    for word in ("FP8 attention", "network", "launch"):
        assert word in note, word
    assert "tile" in note and "MT256x256" in note  # why no fixed tile
    assert MI300X.attention_rate("fp8") == MI300X.peak("fp8") == 2614.9e12  # no measurement
    ach = MI300X.achievable
    assert ach.gemm_efficiency(1, 8192, 8192) == 1.0  # no tile: no quantisation of a skinny GEMM
    assert load_hardware("h100").achievable.gemm_efficiency(1, 8192, 8192) < 0.2  # which h100 has


def test_mi300x_collectives_by_hand():
    mesh = Mesh((("dp", 2), ("tp", 8)))  # tp inside a node of 8, dp across nodes
    wire = 2 * 7 / 8 * 64e6  # a 64 MB all-reduce over 8 ranks
    # inside: the 6 steps of a tree over 8 ranks at 7.5 us, plus the bytes at RCCL's 316.8 GB/s
    got = collective_seconds("all_reduce", 8, wire, mesh, "tp", MI300X)
    assert got == pytest.approx(6 * 7.5e-6 + wire / 316.8e9, rel=1e-12)
    # across nodes no measurement: the 50 GB/s line rate and no latency
    assert link_bandwidth(mesh, "dp", MI300X) == 50e9
    assert collective_seconds("all_reduce", 2, 1e6, mesh, "dp", MI300X) == 1e6 / 50e9


def test_null_launch_costs_add_no_launch_time():
    cfg = config_from_dict(tiny_configs.LLAMA, "tiny")
    g = build_graph(cfg, Workload(batch=1, seq_len=1, past_len=8))
    r = run(g, ["roofline"], hardware=MI300X)["roofline"]
    assert r.kernels > 0 and r.launch_seconds == 0.0
    h100 = run(build_graph(cfg, Workload(batch=1, seq_len=1, past_len=8)), ["roofline"],
               hardware=load_hardware("h100"))["roofline"]  # fmt: skip
    assert h100.launch_seconds > 0  # measured there: the same graph pays its launches


def test_a_spec_file_may_leave_a_figure_null():
    spec = with_achievable(
        interconnect=None,
        network=None,
        launch_seconds=None,
        graph_launch_seconds=None,
        graph_replay_seconds=None,
        sm_count=None,
        gemm_tile=None,
    )
    ach = hardware_from_dict(spec, "t").achievable
    assert (ach.launch_seconds, ach.sm_count, ach.gemm_tile) == (None, None, None)


def test_l40s_carries_measured_rates_with_their_sources():
    l40s = load_hardware("l40s")
    ach = l40s.achievable
    assert ach is not None and l40s.rate_model == "achievable"
    for word in ("GEMM", "Memory", "torch-performance-test-data", "issue 43", "gpu-benches"):
        assert word in ach.source, word
    assert (l40s.gemm_rate("bf16"), l40s.gemm_rate("fp16")) == (269.15e12, 264.02e12)
    assert l40s.bandwidth() == 830e9
    assert l40s.ideal().bandwidth() == 864e9  # --ideal: the data sheet's
    # gpu-small-kernels' L40 (the same AD102): its smallest kernel, launched and in a graph
    assert (ach.launch_seconds, ach.graph_launch_seconds) == (1.64e-6, 0.94e-6)
    assert "gpu-small-kernels" in ach.source
    assert ach.graph_stream_launch_seconds is None  # its runs past the L2 give no fit


def test_l40s_unmeasured_figures_fall_back_and_the_note_names_them():
    note = read_mapping(PRESETS_PATH)["l40s"]["_note"]
    for word in ("attention", "nccl-tests over PCIe", "network", "replay"):
        assert word in note, word
    assert "FP8 GEMM" not in note  # measured now (below)
    l40s = load_hardware("l40s")
    assert l40s.attention_rate("bf16") == l40s.peak("bf16") == 362.05e12  # no measurement


def test_l40s_fp8_gemm_is_sgl_kernels_measured_rate_not_the_peak():
    l40s = load_hardware("l40s")
    # sglang#6756's L40S table: '1.448570e+06' in its script's unit, 4 x FLOP/s / 1e9
    assert l40s.gemm_rate("fp8") == 362.1e12 == pytest.approx(1.448570e6 * 1e9 / 4, rel=1e-3)
    assert l40s.peak("fp8") == 733.0e12  # --ideal keeps the data sheet's
    assert "pull request 6756" in l40s.achievable.source


def test_l40s_pcie_all_reduce_is_priced_by_nccls_tuner_over_its_pci_hops():
    l40s = load_hardware("l40s")
    link = l40s.achievable.interconnect
    assert (link.bus_bandwidth, link.step_latency, link.tuning) == (24e9, 5.7e-6, "nccl-pci-ampere")
    assert "topo.cc" in l40s.achievable.source  # NCCL's own 24 GB/s for a Gen4 x16 link
    # the 2 MiB all-reduce of Llama-2-70B's 128-token prefill over 8 ranks, by hand from
    # tuning.cc: ring Simple, 8.4 + 14 hops x 5.7 us + 2 MiB / (24 GB/s x 8 / 14), beats ring LL
    # (6.6 + 14 x 1.0 us, at half the bus bandwidth) and the tree (its 0.6 correction at 2 MiB)
    tensor = 2 * 2**20
    wire = tensor * 14 / 8  # the bytes one device sends
    mesh = Mesh((("tp", 8),))
    ring_simple = (8.4 + 14 * 5.7) * 1e-6 + tensor / (24e9 * 8 / 14)
    ring_ll = (6.6 + 14 * 1.0) * 1e-6 + tensor / (12e9 * 8 / 14)
    got = collective_seconds("all_reduce", 8, wire, mesh, "tp", l40s)
    tree_simple = (8.4 + 2 * 7 * 4.0) * 1e-6 + tensor / (24e9 * 0.92 * 0.5 * 0.6)
    assert got == pytest.approx(ring_simple) and ring_simple < min(ring_ll, tree_simple)
    assert got > 2 * wire / 32e9  # the old line rate with no latency: 2.1x too fast here


def test_l40s_small_gemms_lose_part_empty_tiles_over_its_142_sms():
    ach = load_hardware("l40s").achievable
    assert (ach.sm_count, ach.gemm_tile) == (142, (128, 128))
    assert "18,176 CUDA cores" in ach.source
    # 128 x 4096 output: 32 tiles, K split 4 ways (128 of 142 SMs), one wave
    assert ach.gemm_efficiency(128, 4096, 4096) == pytest.approx(128 * 4096 * 4 / (142 * 128**2))
