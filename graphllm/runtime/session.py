"""onnxruntime sessions for models exported by graphllm: provider choice, a forward step with KV
cache, and greedy generation with the cache kept in onnxruntime.

onnxruntime is imported inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from graphllm.errors import GraphllmError
from graphllm.exporters.onnx.export import check_data_file, onnx_file

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
DEVICES = ("auto", "cpu", "cuda")
_NP = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
# what onnxruntime 1.32's binding raises (onnxruntime.capi.onnxruntime_pybind11_state): a
# damaged file is InvalidProtobuf, a missing external data file NoSuchFile, and so on
_ORT_ERRORS = (
    "Fail",
    "InvalidArgument",
    "NoSuchFile",
    "NoModel",
    "EngineError",
    "RuntimeException",
    "InvalidProtobuf",
    "ModelLoaded",
    "NotImplemented",
    "InvalidGraph",
    "EPFail",
    "ModelLoadCanceled",
    "ModelRequiresCompilation",
    "NotFound",
)


def providers(device: str = "auto") -> list[str]:
    """onnxruntime providers for `device`: 'cpu', 'cuda' (onnxruntime-gpu), or 'auto' (CUDA if
    this onnxruntime has it, else CPU)."""
    import onnxruntime as ort

    if device not in DEVICES:
        raise GraphllmError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    have = ort.get_available_providers()
    if device == "cuda" and PROVIDERS["cuda"] not in have:
        raise GraphllmError(
            "onnxruntime here has no CUDA provider (install the gpu extra: onnxruntime-gpu)"
        )
    if device == "cuda" or (device == "auto" and PROVIDERS["cuda"] in have):
        return [PROVIDERS["cuda"], PROVIDERS["cpu"]]
    return [PROVIDERS["cpu"]]


def session(path: str | Path, device: str = "auto", threads: int | None = None) -> Any:
    """An onnxruntime InferenceSession on `path` (external data is found beside it); a model
    this onnxruntime cannot load (an op its providers lack) is one line."""
    import onnxruntime as ort

    onnx_file(path)
    check_data_file(path)  # a model beside another export's weights file is not run
    opts = ort.SessionOptions()
    opts.log_severity_level = 4  # its errors reach the user as our one line (_one_line), once
    if threads:
        opts.intra_op_num_threads = threads
    with _one_line(f"{path}: onnxruntime cannot load it"):
        return ort.InferenceSession(str(path), sess_options=opts, providers=providers(device))


@contextmanager
def _one_line(what: str) -> Iterator[None]:
    """onnxruntime's errors (a C++ trace in a Python exception) as one GraphllmError line."""
    import onnxruntime as ort

    state = ort.capi.onnxruntime_pybind11_state
    # run_with_iobinding raises a plain RuntimeError
    errors = (RuntimeError, *(getattr(state, k) for k in _ORT_ERRORS if hasattr(state, k)))
    try:
        yield
    except errors as e:
        lines = [x.strip() for x in str(e).strip().splitlines() if x.strip()]
        last = lines[-1] if lines else type(e).__name__
        raise GraphllmError(f"{what}: {last[:300]}") from None


def positions(attention_mask: np.ndarray, new: int) -> np.ndarray:
    """Position ids of the last `new` columns: tokens counted from the first real one (padding
    gets 1), as transformers' generate computes them."""
    pos = np.cumsum(attention_mask, axis=1) - 1
    pos[attention_mask == 0] = 1
    return pos[:, -new:].astype(np.int64)


class OnnxModel:
    """A graphllm `.onnx` model on onnxruntime: one forward step, and greedy generation."""

    def __init__(self, path: str | Path, device: str = "auto", threads: int | None = None) -> None:
        self.path = Path(path)
        self.session = session(path, device, threads)
        self.past_names = [i.name for i in self.session.get_inputs() if i.name.startswith("past")]
        self._past = {i.name: i for i in self.session.get_inputs() if i.name.startswith("past")}
        # a layer's conv or recurrent state: fixed in size (every axis but the batch
        # a number), fed whole and replaced each step rather than appended to
        self.state_names = [
            n for n, i in self._past.items() if all(isinstance(d, int) for d in i.shape[1:])
        ]
        # token ids of DeepSeek's multi-token-prediction modules (`export --mtp`)
        self.mtp_names = [i.name for i in self.session.get_inputs() if i.name.startswith("mtp.")]
        self.output_names = [o.name for o in self.session.get_outputs()]
        meta = self.session.get_modelmeta().custom_metadata_map
        self.lowering = meta.get("graphllm.lowering")  # None: not exported by graphllm
        # the positions the file's constant rotary caches hold (the ort lowering's), or None
        rows = meta.get("graphllm.positions", "")
        self.max_positions = int(rows) if rows.isdigit() else None

    def require_positions(self, n: int, what: str) -> None:
        """Refuse a run of `n` positions past those the model's rotary caches hold (onnxruntime
        would fail inside GroupQueryAttention, or read past RotaryEmbedding's table)."""
        if self.max_positions is not None and n > self.max_positions:
            raise GraphllmError(
                f"{self.path}: {what} spans {n:,} positions, past the {self.max_positions:,} its "
                f"{self.lowering} lowering's rotary tables hold (max_position_embeddings, at least "
                "4,096, at most 131,072); export it with --ops standard for longer runs"
            )

    def empty_past(self, batch: int) -> dict[str, np.ndarray]:
        """Past K/V of length 0 (a prefill)."""
        out = {}
        for name, info in self._past.items():
            if name in self.state_names:  # a state starts at zero, at its full size
                out[name] = np.zeros((batch, *info.shape[1:]), _NP[info.type])
                continue
            heads, head_dim = info.shape[1], info.shape[3]
            out[name] = np.zeros((batch, heads, 0, head_dim), _NP[info.type])
        return out

    def forward(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray | None = None,
        position_ids: np.ndarray | None = None,
        past: dict[str, np.ndarray] | None = None,
        extra: dict[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """Logits and present K/V for new tokens (B, T) after `past` (`present.*` or
        `past_key_values.*` keys; none: a prefill). The mask defaults to all ones over past and
        new tokens, positions to the mask's running count. `extra`: the other inputs by name
        (an MTP export's `mtp.{k}.input_ids`)."""
        ids = np.atleast_2d(np.asarray(input_ids, dtype=np.int64))
        b, t = ids.shape
        feeds = self.empty_past(b)
        for k, v in (past or {}).items():
            feeds[k.replace("present.", "past_key_values.")] = v
        kv = [v for k, v in feeds.items() if k not in self.state_names]
        p = kv[0].shape[2] if kv else 0  # a state says nothing of the past's length
        missing = [n for n in self.mtp_names if n not in (extra or {})]
        if missing:
            raise GraphllmError(f"{self.path}: give the token ids of {', '.join(missing)} (extra=)")
        if self.lowering in IN_PLACE_CACHE and b > 1 and t > 1 and p > 0:
            raise GraphllmError(
                f"{self.path}: the {self.lowering} lowering's GroupQueryAttention takes several "
                "new tokens after a past at batch 1 only (onnxruntime's rule); export this model "
                f"with --ops standard to run them at batch {b}"
            )
        self.require_positions(p + t, "the run")
        feeds |= {k: np.asarray(v, dtype=np.int64) for k, v in (extra or {}).items()}
        mask = np.ones((b, p + t), np.int64) if attention_mask is None else attention_mask
        feeds["attention_mask"] = np.asarray(mask, dtype=np.int64)
        feeds["input_ids"] = ids
        pos = positions(feeds["attention_mask"], t) if position_ids is None else position_ids
        feeds["position_ids"] = np.asarray(pos, dtype=np.int64)
        with _one_line(f"{self.path}: onnxruntime failed"):
            outs = self.session.run(self.output_names, feeds)
        return dict(zip(self.output_names, outs))

    def generate(
        self,
        input_ids: np.ndarray,
        max_new_tokens: int,
        attention_mask: np.ndarray | None = None,
    ) -> np.ndarray:
        """Greedy decoding through the KV cache: (B, max_new_tokens) new token ids. A batch of
        prompts of different lengths is left-padded, with `attention_mask` 0 on the padding.
        The cache stays in onnxruntime, as `bench` keeps it (`BoundCache`); an MTP export's draft
        inputs are fed the step's own tokens (their logits are not read)."""
        ids = np.atleast_2d(np.asarray(input_ids, dtype=np.int64))
        mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask)
        b = ids.shape[0]
        self.require_positions(ids.shape[1] + max_new_tokens, "the generation")
        bound = BoundCache(self, capacity=ids.shape[1] + max_new_tokens, batch=b)
        outs = bound.step(bound.inputs(ids, mask), None)
        new = []
        for step in range(max_new_tokens):
            nxt = outs[0].numpy()[:, -1].argmax(-1)[:, None].astype(np.int64)  # (B, 1)
            new.append(nxt)
            if step == max_new_tokens - 1:
                break
            mask = np.concatenate([mask, np.ones_like(nxt)], axis=1)
            outs = bound.step(bound.inputs(nxt, mask), outs)
        return np.concatenate(new, axis=1) if new else np.zeros((b, 0), np.int64)


# -- bench ------------------------------------------------------------------------------------
# Lowerings whose attention writes each step's keys and values into a past buffer bound as its
# own present (GroupQueryAttention's shared-buffer mode: it sees past and present at the same
# address and appends in place, attending to the first `seqlens_k + 1` rows).
IN_PLACE_CACHE = ("ort",)


class BoundCache:
    """Forward steps whose K/V cache never goes through numpy; only the logits come back.

    With `capacity` and a lowering in IN_PLACE_CACHE, each layer's cache is one buffer of
    `capacity` positions, bound as both the past input and the present output, so a step
    appends to it in place and copies nothing. Otherwise each step's present K/V stay OrtValues
    fed back as the next step's past (its attention copies the cache into the new present): on
    CUDA through IO binding with the outputs on the device, on CPU through `run_with_ort_values`
    (the same OrtValues, with a fraction of the per-step cost of binding some 4 L + 4 values).
    """

    def __init__(self, model: OnnxModel, capacity: int | None = None, batch: int = 1) -> None:
        import onnxruntime as ort

        self.model = model
        self.session = model.session
        self.on_gpu = model.session.get_providers()[0] == PROVIDERS["cuda"]
        self.device = "cuda" if self.on_gpu else "cpu"
        self.value = ort.OrtValue.ortvalue_from_numpy
        outs = model.output_names
        self.present_of = [
            outs.index(n.replace("past_key_values.", "present.")) for n in model.past_names
        ]
        # a state is replaced each step, never appended to: a model with states feeds its
        # presents back (no lowering that appends in place takes one)
        self.in_place = (
            capacity is not None and model.lowering in IN_PLACE_CACHE and not model.state_names
        )
        self.io = model.session.io_binding() if self.on_gpu or self.in_place else None
        if self.in_place:
            assert self.io is not None and capacity is not None
            self.io.bind_output("logits", self.device)  # first bound: first among the outputs
            for name, info in model._past.items():
                shape = [batch, info.shape[1], capacity, info.shape[3]]
                buf = ort.OrtValue.ortvalue_from_shape_and_type(
                    shape, _NP[info.type], self.device, 0
                )
                self.io.bind_ortvalue_input(name, buf)
                self.io.bind_ortvalue_output(name.replace("past_key_values.", "present."), buf)

    def inputs(self, ids: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
        """The inputs of a step besides the past, as OrtValues (positions from the mask; an MTP
        module's draft tokens the step's own: the same work, whatever the ids)."""
        pos = positions(mask, ids.shape[1])
        arrays = {"input_ids": ids, "attention_mask": mask, "position_ids": pos}
        arrays |= {name: ids for name in self.model.mtp_names}
        return {k: self.value(np.ascontiguousarray(v, np.int64)) for k, v in arrays.items()}

    def step(self, inputs: dict[str, Any], past: list[Any] | None) -> list[Any]:
        """Run one step on `inputs` (from `inputs()`) after `past` (the previous step's outputs,
        or None: a prefill); returns the outputs as OrtValues, logits first. In place, the past
        is the bound cache and a prefill starts it again from position 0."""
        with _one_line(f"{self.model.path}: onnxruntime failed"):
            return self._step(inputs, past)

    def _step(self, inputs: dict[str, Any], past: list[Any] | None) -> list[Any]:
        m, io = self.model, self.io
        if self.in_place:
            assert io is not None
            for name, value in inputs.items():
                io.bind_ortvalue_input(name, value)
            # bound again, not to the last run's logits: their shape follows the step's tokens
            io.bind_output("logits", self.device)
            self.session.run_with_iobinding(io)
            return io.get_outputs()
        if past is None:
            b = inputs["input_ids"].shape()[0]
            feeds = {k: self.value(v) for k, v in m.empty_past(b).items()}
        else:
            feeds = {name: past[i] for name, i in zip(m.past_names, self.present_of)}
        feeds |= inputs
        if io is None:
            return self.session.run_with_ort_values(m.output_names, feeds)
        io.clear_binding_inputs()
        io.clear_binding_outputs()
        for name, value in feeds.items():
            io.bind_ortvalue_input(name, value)
        for name in m.output_names:
            io.bind_output(name, self.device)
        self.session.run_with_iobinding(io)
        return io.get_outputs()
