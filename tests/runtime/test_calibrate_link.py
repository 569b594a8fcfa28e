"""`graphllm calibrate --link`: nccl-tests' bus bandwidths, the alpha-beta fit, the links saved
as `local`'s and read by the collective model, and a tiny real sweep over two gloo ranks."""

import pytest

from graphllm.errors import ConfigError, GraphllmError
from graphllm.models.hardware import LINK_KINDS, Link, hardware_from_dict, load_hardware
from graphllm.ops import OPS
from graphllm.passes.parallel.figures import collective_seconds
from graphllm.passes.parallel.partition import Strategy, make_mesh
from graphllm.runtime.calibrate import calibrate, save_local
from graphllm.runtime.calibrate_link import Sample, bus_bandwidth, cores, fit, sweep, with_links


def test_bus_bandwidth_is_nccl_tests():
    # PERFORMANCE.md: busbw = S/t x 2(n-1)/n (all_reduce), x (n-1)/n (all_gather), x 1 (send)
    assert bus_bandwidth("all_reduce", 8e6, 1e-3, 4) == pytest.approx(8e9 * 1.5)
    assert bus_bandwidth("all_gather", 8e6, 1e-3, 4) == pytest.approx(8e9 * 0.75)
    assert bus_bandwidth("send", 8e6, 1e-3, 2) == pytest.approx(8e9)
    assert Sample("all_reduce", 1000, 1e-6, 2).algbw == pytest.approx(1e9)
    assert Sample("all_reduce", 1000, 1e-6, 2).busbw == pytest.approx(1e9)  # 2(2-1)/2 = 1


@pytest.mark.parametrize(
    ("kind", "ranks"), [("all_reduce", 2), ("all_gather", 2), ("send", 2), ("all_reduce", 4)]
)
def test_fit_recovers_alpha_and_beta(kind, ranks):
    alpha, busbw = 250e-6, 0.8e9
    wire = OPS[kind].wire(ranks)
    sizes = [4 * 4**k for k in range(13)]
    samples = [Sample(kind, s, alpha + s * wire / busbw, ranks) for s in sizes]
    link = fit(samples)
    steps = min(OPS[kind].latency_steps(ranks).values())
    assert link.bus_bandwidth == pytest.approx(busbw, rel=1e-9)
    assert link.step_latency * steps == pytest.approx(alpha, rel=1e-9)


def test_fit_keeps_positive_figures_on_noise():
    # times that fall with the size (noise at small sizes): no negative bandwidth or latency
    samples = [Sample("all_reduce", 4, 2e-3, 2), Sample("all_reduce", 4096, 1e-3, 2)]
    link = fit(samples)
    assert link.bus_bandwidth == pytest.approx(4096 / 1e-3)  # the best busbw seen
    assert link.step_latency > 0
    with pytest.raises(GraphllmError, match="two sizes"):
        fit(samples[:1])


def _local(cache_dir, links: dict[str, Link]):
    hw = calibrate(repeats=1, progress=False, matmul_size=32, buffer_bytes=1 << 20)
    samples = []
    for kind, link in links.items():
        steps = min(OPS[kind].latency_steps(2).values())
        for s in (4, 4 << 10, 4 << 20):
            t = steps * link.step_latency + s * OPS[kind].wire(2) / link.bus_bandwidth
            samples.append(Sample(kind, s, t, 2))
    save_local(with_links(hw, samples))
    return load_hardware("local")


def test_local_links_price_collectives(cache_dir):
    links = {
        "all_reduce": Link(bus_bandwidth=1e9, step_latency=100e-6),
        "send": Link(bus_bandwidth=2e9, step_latency=50e-6),
    }
    hw = _local(cache_dir, links)
    assert hw.devices_per_node == 2 and hw.interconnect_bandwidth == pytest.approx(2e9)
    assert hw.links["all_reduce"].bus_bandwidth == pytest.approx(1e9)
    mesh = make_mesh(Strategy(tp=2))
    # all_reduce of 1 MB over 2 ranks: 2 steps x 100 us + 2(1/2) x 1 MB / 1 GB/s
    got = collective_seconds("all_reduce", 2, 1e6 * OPS["all_reduce"].wire(2), mesh, "tp", hw)
    assert got == pytest.approx(200e-6 + 1e-3)
    # a kind not timed: the interconnect line rate (the best busbw), no latency
    got = collective_seconds("all_gather", 2, 1e6 * OPS["all_gather"].wire(2), mesh, "tp", hw)
    assert got == pytest.approx(0.5e6 / 2e9)


def test_local_without_links_still_loads(cache_dir):
    hw = calibrate(repeats=1, progress=False, matmul_size=32, buffer_bytes=1 << 20)
    assert "links" not in hw.to_dict()  # the file reads as it did before links existed
    save_local(hw)
    assert load_hardware("local").links == {}


def test_link_kinds_are_rows_with_latency():
    for kind in LINK_KINDS:
        assert OPS[kind].latency_steps is not None and OPS[kind].wire is not None


def test_links_refuse_unknown_kind():
    hw = load_hardware("h100").to_dict()
    hw["links"] = {"allreduce": {"bus_bandwidth": 1e9, "step_latency": 1e-5}}
    with pytest.raises(ConfigError, match="did you mean 'all_reduce'"):
        hardware_from_dict(hw, "x")


def test_sweep_refuses_more_ranks_than_cores():
    with pytest.raises(GraphllmError, match="cores"):
        sweep(ranks=cores() + 1)


def test_tiny_real_sweep():
    pytest.importorskip("torch")
    if cores() < 2:
        pytest.skip("two ranks need two cores")
    samples = sweep(ranks=2, sizes=(4, 4096, 1 << 16), repeats=2)
    assert {(s.kind, s.size) for s in samples} == {
        (k, s) for k in ("all_reduce", "all_gather", "send") for s in (4, 4096, 1 << 16)
    } - {("all_gather", 4)} | {("all_gather", 8)}  # 4 B over 2 ranks: one fp32 each
    assert all(s.seconds > 0 and s.ranks == 2 for s in samples)


def test_latency_bound_fit_is_refused_before_saving(cache_dir):
    hw = calibrate(repeats=1, progress=False, matmul_size=32, buffer_bytes=1 << 20)
    # 4 B and 16 B at 1 ms: a bus bandwidth of bytes per second, no device's
    samples = [Sample("all_reduce", s, 1e-3, 2) for s in (4, 16)]
    with pytest.raises(GraphllmError, match="latency-bound"):
        with_links(hw, samples)


def test_without_torch_or_two_cores_refused_in_one_line(monkeypatch):
    import graphllm.runtime.calibrate_link as cl

    monkeypatch.setattr(cl, "cores", lambda: 1)
    with pytest.raises(GraphllmError, match="needs two ranks"):
        cl.require_ranks()
    monkeypatch.setattr(cl, "cores", lambda: 2)
    real = cl.importlib.util.find_spec
    monkeypatch.setattr(
        cl.importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name)
    )
    with pytest.raises(GraphllmError, match="dist extra"):
        cl.sweep()
