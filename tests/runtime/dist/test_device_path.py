"""A rank's data path (runtime/dist/tensors.py, ort.py, comm.py): between its segments and its
collectives a rank holds torch tensors on its device. onnxruntime's segments bind them by
pointer and hand theirs back through DLPack, an all_reduce sums into the segment's output in
place, and the next segment binds that same buffer; nothing crosses to numpy on the way (the
CUDA path's code, run here on the CPU provider with CPU tensors, on gloo). Each weight is held
once per rank: the segment models read the weights as inputs, bound over the rank's own arrays."""

from __future__ import annotations

import importlib.util
import json
import os
from datetime import timedelta
from pathlib import Path

import numpy as np
import onnx
import pytest

from graphllm import Workload, build_graph
from graphllm.models.config import config_from_dict
from graphllm.passes.parallel.partition import Strategy, partition
from graphllm.runtime.dist.ort import OrtRunner, rank_weight_values
from graphllm.runtime.dist.segments import NumpyRunner, Segment, cut
from tests.runtime.dist.support import CONFIGS, write_configs

HAS_TORCH = importlib.util.find_spec("torch") is not None


def _rank_program(strategy: Strategy):
    cfg = config_from_dict(dict(CONFIGS["dense"]), "dense")
    g = build_graph(cfg, Workload.with_dtype(batch=2, seq_len=4, dtype="fp32"))
    program = partition(g, strategy)
    rng = np.random.default_rng(0)
    weights = {
        p.name: (0.1 * rng.standard_normal(p.out.shape(g.bindings))).astype(np.float32)
        for p in program.params()
    }
    return g, program, weights


def _feeds(g, st: Segment, rng) -> dict[str, np.ndarray]:
    out = {}
    for name, ref in zip(st.inputs, st.in_refs):
        t = st.program.type_of(ref)
        shape = tuple(int(s) for s in t.shape(g.bindings))
        if t.dtype.startswith("int"):
            out[name] = np.broadcast_to(np.arange(shape[-1]), shape).copy()
        else:
            out[name] = rng.standard_normal(shape).astype(np.float32)
    return out


def test_each_weight_is_held_once_per_rank():
    """The segment models hold no weight bytes, the sessions read the rank's own arrays: a
    weight changed in place changes what the same session computes."""
    g, program, weights = _rank_program(Strategy(tp=2))
    segments = [s for s in cut(program, {"tp": 0}) if isinstance(s, Segment)]
    values = rank_weight_values(weights, "cpu")
    rng = np.random.default_rng(1)
    read = 0
    for st in segments:
        runner = OrtRunner(st, weights, weights_once=True)
        model = onnx.load_from_string(runner.model)
        inits = {t.name for t in model.graph.initializer}
        assert not inits & set(st.params), inits & set(st.params)
        assert set(st.params) <= {i.name for i in model.graph.input}
        for p in st.params:  # the OrtValue over the rank's array, not a copy of it
            assert values(p).data_ptr() == weights[p].ctypes.data, p
        read += len(st.params)
        if not st.params:
            continue
        feeds = _feeds(g, st, rng)
        before = runner.run(feeds)
        for p in st.params:
            weights[p] *= 2.0  # in place: the buffer the session was bound to
        after = runner.run(feeds)
        want = NumpyRunner(st, weights).run(feeds)
        for k in want:
            assert np.max(np.abs(after[k] - want[k]), initial=0.0) < 1e-5, k
        assert any(not np.allclose(before[k], after[k]) for k in want)
    assert read >= len(weights) // 2  # the segments of rank 0 read its weights


# -- two gloo ranks, each in its own process -------------------------------------------------
CASES = [  # (case, strategy, runtime)
    ("tp", {"tp": 2}, "onnxruntime"),
    ("tp sp", {"tp": 2, "sp": True}, "onnxruntime"),
    ("pp", {"pp": 2}, "onnxruntime"),
    ("tp numpy", {"tp": 2}, "numpy"),
]


class _Probe:
    """Counts numpy <-> torch crossings while a segment or a cut point runs, and records the
    data pointers each hands on."""

    def __init__(self) -> None:
        self.inside = 0
        self.crossings = 0
        self.seg_in: set[int] = set()
        self.seg_out: set[int] = set()
        self.calls: list[dict] = []

    def install(self) -> None:
        import torch

        from graphllm.runtime.dist import comm, ort, segments

        probe = self

        def counted(fn):
            def wrapper(*a, **k):
                probe.crossings += probe.inside > 0
                return fn(*a, **k)

            return wrapper

        torch.from_numpy = counted(torch.from_numpy)
        torch.Tensor.numpy = counted(torch.Tensor.numpy)

        def segment(fn):
            def wrapper(self, feeds):
                probe.seg_in |= {t.data_ptr() for t in feeds.values()}
                probe.inside += 1
                try:
                    out = fn(self, feeds)
                finally:
                    probe.inside -= 1
                probe.seg_out |= {t.data_ptr() for t in out.values()}
                return out

            return wrapper

        ort.OrtRunner.run_device = segment(ort.OrtRunner.run_device)
        segments.NumpyRunner.run_device = segment(segments.NumpyRunner.run_device)
        run = comm.Comm.run

        def cut_point(self, program, node, x, mb, clock, kept=False):
            before = None if x is None else x.data_ptr()
            probe.inside += 1
            try:
                y, rec = run(self, program, node, x, mb, clock, kept)
            finally:
                probe.inside -= 1
            probe.calls.append({"op": node.op, "kept": kept, "x": before, "y": y.data_ptr()})
            return y, rec

        comm.Comm.run = cut_point

    def summary(self) -> dict:
        return {
            "crossings": self.crossings,
            "seg_in": sorted(self.seg_in),
            "seg_out": sorted(self.seg_out),
            "calls": self.calls,
        }


def _rank(rank: int, port: int, source: str, out: str) -> None:
    """One rank: every case, one after another, in the same process group."""
    import torch.distributed as dist

    from graphllm.passes.parallel.partition import make_mesh
    from graphllm.runtime.dist.comm import Comm, device_mesh
    from graphllm.runtime.dist.rank import Job, generate

    os.environ |= {"LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2", "RANK": str(rank)}
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=60),
    )
    results = {}
    probe = _Probe()
    probe.install()
    for name, strategy, runtime in CASES:
        probe.__init__()  # counts and pointers of this case alone
        job = Job(source, strategy, batch=2, seq_len=4, new_tokens=3, runtime=runtime)
        job = Job(**(job.to_dict() | {"keep_logits": True}))
        comm = Comm(device_mesh(make_mesh(Strategy(**strategy))), rank, 60.0)
        gen = generate(job, comm)
        results[name] = probe.summary() | {"logits": [x.tolist() for x in gen.logits]}
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


@pytest.mark.skipif(not HAS_TORCH, reason="torch (the dist extra) is not installed")
def test_segment_outputs_go_through_the_collectives_in_place(tmp_path):
    import torch.multiprocessing as mp

    from graphllm.runtime.dist.launch import free_port

    source = write_configs(tmp_path)["dense"]
    mp.start_processes(
        _rank, args=(free_port(), source, str(tmp_path)), nprocs=2, start_method="spawn"
    )
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        plain = got["tp numpy"]
        assert plain["crossings"] > 0  # the numpy runner crosses, and the probe sees it
        for name, _, runtime in CASES:
            case = got[name]
            assert len(case["logits"]) == len(plain["logits"]) == 3
            for a, b in zip(case["logits"], plain["logits"]):  # prefill, 2 decode steps
                assert np.max(np.abs(np.asarray(a) - np.asarray(b))) < 1e-5, name
            if runtime != "onnxruntime":
                continue
            assert case["crossings"] == 0, name  # no numpy between segments and collectives
            kinds = {c["op"] for c in case["calls"]}
            for c in case["calls"]:
                if c["op"] == "all_reduce" and not c["kept"]:
                    # onnxruntime's output, summed in place, bound as the next segment's input
                    assert c["x"] == c["y"] and c["x"] in case["seg_out"], c
                    assert c["y"] in case["seg_in"], c
                if c["op"] == "recv":  # the buffer it filled, bound as the next input
                    assert c["y"] in case["seg_in"], c
            stage = {"send"} if rank == 0 else {"recv"}
            want_kinds = {"tp": {"all_reduce"}, "tp sp": {"reduce_scatter", "all_gather"}}
            assert want_kinds.get(name, stage) <= kinds, (name, kinds)
