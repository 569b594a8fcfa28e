"""Segments of a rank's program on onnxruntime (`graphllm run --runtime onnxruntime`).

Each distinct segment is exported once per process (graphllm.exporters.onnx.segment: the rank's
program, its mesh coordinates, on CUDA its weights as inputs) and gets one InferenceSession, kept for
the rest of the run: a decode step's program is rebuilt each step, but its segments print the
same (the lengths are symbolic), so every step after the first decode reuses the first one's
sessions. A segment the export cannot express (longrope on a block of the tokens, a block of
the keys) runs on the numpy interpreter instead, said once on stderr.

Weights on CUDA (or with `weights_once`): one OrtValue a weight and device for the rank (over
its own array on the CPU, one copy on a GPU), bound once to every runner that reads it: the
models' bytes and the sessions hold none. On the CPU they stay initializers by default: a
weight that is an input is not prepacked, and decode ran 1.5-1.7x slower so (docs/run.md).

Values: `run_device` (what a rank of a multi-rank run calls) binds torch tensors by pointer and
hands onnxruntime's outputs, allocated on the device, to torch through DLPack, so a collective
works on the buffer onnxruntime wrote; `run` takes and gives numpy arrays (a one-rank run).
CPU: the CPU provider, with the machine's cores shared between the ranks on it (intra-op
threads = usable cores / local ranks, from torchrun's LOCAL_WORLD_SIZE or the launcher's
WORLD_SIZE). CUDA (`device="cuda"`, onnxruntime-gpu): the CUDA provider on the rank's
LOCAL_RANK device, the same calls. The CUDA path is written but has not run: no GPU was at hand
(docs/run.md says what ran where).

torch is never imported here: the values reach it only through the tensors handed in.
"""

from __future__ import annotations

import os
import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from graphllm.errors import ConfigError, GraphllmError
from graphllm.exporters.onnx import LoweringError
from graphllm.exporters.onnx.segment import SegmentCache, tensor_name
from graphllm.runtime.dist.segments import NumpyRunner, Segment

_EXPORTS = SegmentCache()
# sessions by the exported model's bytes' identity (the cache hands back the same object): a
# few hundred segments at most per rank and run; bounded so that a test process running many
# configs one after another does not keep every one's sessions
_SESSIONS: OrderedDict[int, tuple[bytes, Any]] = OrderedDict()
_MAX_SESSIONS = 512
_SAID: set[str] = set()


def threads_per_rank() -> int:
    """The cores this process may use, shared evenly between the ranks of this machine."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    local = os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("WORLD_SIZE") or "1"
    try:
        ranks = max(1, int(local))
    except ValueError:
        ranks = 1
    return max(1, (cores or 1) // ranks)


def _session(model: bytes, device: str) -> Any:
    import onnxruntime as ort  # an optional extra: only when a segment runs on it

    key = id(model)
    hit = _SESSIONS.get(key)
    if hit is not None and hit[0] is model:
        _SESSIONS.move_to_end(key)
        return hit[1]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads_per_rank()
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3  # warnings about unused initializers are not the user's
    if device == "cuda":
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise GraphllmError(
                "--device cuda: this onnxruntime has no CUDA provider (install onnxruntime-gpu)"
            )
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        providers: list[Any] = [("CUDAExecutionProvider", {"device_id": local_rank})]
    else:
        providers = ["CPUExecutionProvider"]
    sess = ort.InferenceSession(model, opts, providers=providers)
    _SESSIONS[key] = (model, sess)  # the bytes held with it: their id is not reused meanwhile
    while len(_SESSIONS) > _MAX_SESSIONS:
        _SESSIONS.popitem(last=False)
    return sess


class OrtRunner:
    """A segment on onnxruntime, behind dist-run's SegmentRunner protocol: boundary values in
    by `Segment.inputs` name, `Segment.outputs` out.

    With `weights_once` (the default on CUDA) its model reads the weights as inputs
    (export_segment's `weights_as_inputs`), and one IO binding, kept for the runner's life,
    binds the rank's own buffer of each weight once (`rank_weight_values`): the model's bytes
    and the session hold no copy of them. On the CPU the default keeps them as initializers:
    onnxruntime prepacks only constant MatMul weights, and without that a decode step ran
    1.5-1.7x slower here (docs/run.md), for a copy the CPU's memory can usually afford. Each
    run binds the boundary values and lets onnxruntime allocate the outputs on the device."""

    # the rank may keep it for the next decode step with P and S moved on (rank._rebind): the
    # model's past and total lengths are symbolic, the positions are fed, and its mask reads
    # the cache index from the shapes, never the baked `origin` attrs that the rebind updates
    rebindable = True

    def __init__(
        self,
        segment: Segment,
        weights: dict[str, np.ndarray],
        device: str = "cpu",
        ops: str = "decomposed",
        weights_once: bool | None = None,
    ) -> None:
        if segment.program is None:
            raise GraphllmError(f"segment {segment.index} carries no rank program to export")
        self.segment = segment
        self.device = device
        self._fallback: NumpyRunner | None = None
        once = device != "cpu" if weights_once is None else weights_once
        self.model: bytes | None = None  # the exported model (the cache's, not a copy)
        program = segment.program
        try:
            model = _EXPORTS.get(
                program,
                segment.nodes,
                segment.in_refs,
                segment.out_refs,
                weights=weights,
                coords=segment.coords,
                ops=ops,
                weights_as_inputs=once,
            )
        except (ConfigError, LoweringError) as e:  # what it cannot express yet runs on numpy
            if not _SAID:  # once a process: every rank and step would say the same
                _SAID.add(str(e))
                why = str(e).split("; ")[0]
                print(f"note: {why}: such segments run on numpy", file=sys.stderr)
            self._fallback = NumpyRunner(segment, weights)
            return
        self.model = model
        self._session = _session(model, device)
        # ONNX names <-> the protocol's value names (they differ for graph outputs: `logits`)
        self._in = {tensor_name(program, r): v for r, v in zip(segment.in_refs, segment.inputs)}
        self._out = [tensor_name(program, r) for r in segment.out_refs]
        names = [i.name for i in self._session.get_inputs()]
        params = set(segment.params) if once else set()
        self._wanted = [k for k in names if k not in params]
        unfed = [k for k in self._wanted if k not in self._in]
        if unfed:  # a model input its lowering reads that the segment has no value for
            raise GraphllmError(
                f"segment {segment.index} of {program.name}: its ONNX model reads {unfed[0]}, "
                "which is not among the segment's inputs"
            )
        self._binding = self._session.io_binding()
        if params:
            values = rank_weight_values(weights, device)
            for k in names:
                if k in params:
                    self._binding.bind_ortvalue_input(k, values(k))

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The segment's outputs for its boundary values (numpy arrays, on the host)."""
        if self._fallback is not None:
            return self._fallback.run(feeds)
        held = [np.ascontiguousarray(feeds[self._in[k]]) for k in self._wanted]
        for k, v in zip(self._wanted, held):
            self._binding.bind_cpu_input(k, v)
        self._run()
        got = self._binding.copy_outputs_to_cpu()
        self._binding.clear_binding_outputs()
        return dict(zip(self.segment.outputs, got))

    def run_device(self, feeds: dict[str, Any]) -> dict[str, Any]:
        """Boundary values as torch tensors on the runner's device in, torch tensors on it out,
        never through the host (on CUDA: what the NCCL collectives take). Inputs are bound by
        their data pointers; outputs are bound on the device, onnxruntime allocates them, and
        each goes to torch through DLPack (an OrtValue has `__dlpack__`), so the next
        collective reads onnxruntime's buffer in place. Run here on the CPU with CPU tensors
        (tests/runtime/dist/test_ort.py, test_device_path.py); on CUDA it has not run (no GPU
        at hand)."""
        if self._fallback is not None:
            return self._fallback.run_device(feeds)
        # a binding holds a pointer, not the tensor: a strided input's contiguous copy must
        # outlive the run (seen: freed copies read as garbage when only the pointer was kept)
        held = [feeds[self._in[k]].contiguous() for k in self._wanted]
        for k, x in zip(self._wanted, held):
            np_type = _NP_OF_TORCH[str(x.dtype)]
            index = x.device.index or 0
            self._binding.bind_input(k, self.device, index, np_type, tuple(x.shape), x.data_ptr())
        self._run()
        got = self._binding.get_outputs()
        self._binding.clear_binding_outputs()
        del held
        from_dlpack = _from_dlpack(next(iter(feeds.values())))
        return {v: from_dlpack(o) for v, o in zip(self.segment.outputs, got)}

    def _run(self) -> None:
        for k in self._out:  # allocated by onnxruntime each run: the last run's are handed on
            self._binding.bind_output(k, self.device)
        self._session.run_with_iobinding(self._binding)


# the weights of the last few ranks' runs this process made (a test process runs many), held
# with the OrtValues over their buffers: one per weight and device, for every session of a rank
_VALUES: OrderedDict[tuple[int, str], tuple[dict[str, np.ndarray], dict[str, Any]]] = OrderedDict()
_MAX_VALUES = 4


def rank_weight_values(weights: dict[str, np.ndarray], device: str) -> Callable[[str], Any]:
    """The OrtValue of each of the rank's weights on `device`, made once per weight: on the
    CPU over the rank's own array (no copy), on CUDA one copy on the rank's device."""
    import onnxruntime as ort

    key = (id(weights), device)
    hit = _VALUES.get(key)
    if hit is None or hit[0] is not weights:
        hit = _VALUES[key] = (weights, {})
        while len(_VALUES) > _MAX_VALUES:
            _VALUES.popitem(last=False)
    _VALUES.move_to_end(key)
    made = hit[1]
    index = int(os.environ.get("LOCAL_RANK", "0")) if device == "cuda" else 0

    def value(name: str) -> Any:
        if name not in made:
            arr = np.ascontiguousarray(weights[name], dtype=np.float32)
            made[name] = ort.OrtValue.ortvalue_from_numpy(arr, device, index)
        return made[name]

    return value


# the dtypes a segment's boundary holds
_NP_OF_TORCH = {"torch.float32": np.float32, "torch.float16": np.float16, "torch.int64": np.int64}


def _from_dlpack(like: Any) -> Any:
    """torch.from_dlpack, reached through the module of a tensor the caller handed in (so this
    module never imports torch)."""
    return sys.modules[type(like).__module__.split(".")[0]].from_dlpack
