"""onnxruntime sessions for models exported by graphllm: provider choice, a forward step with KV
cache, greedy generation, and token mixing observed through onnxruntime.

onnxruntime is imported inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from graphllm.errors import GraphllmError
from graphllm.model_config import ModelConfig
from graphllm.observe import MixingCheck, mixing_case
from graphllm.workload import Workload

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
DEVICES = ("auto", "cpu", "cuda")
_NP = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
_ORT_ERRORS = ("Fail", "InvalidArgument", "InvalidGraph", "NotImplemented", "EPFail")


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

    if not Path(path).is_file():
        raise GraphllmError(f"{path}: no such ONNX model")
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
        lines = [x for x in str(e).strip().splitlines() if x.strip()]
        raise GraphllmError(f"{what}: {lines[-1].strip() if lines else e}") from None


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
        # token ids of DeepSeek's multi-token-prediction modules (`export --mtp`)
        self.mtp_names = [i.name for i in self.session.get_inputs() if i.name.startswith("mtp.")]
        self.output_names = [o.name for o in self.session.get_outputs()]
        meta = self.session.get_modelmeta().custom_metadata_map
        self.lowering = meta.get("graphllm.lowering")  # None: not exported by graphllm

    def empty_past(self, batch: int) -> dict[str, np.ndarray]:
        """Past K/V of length 0 (a prefill)."""
        out = {}
        for name, info in self._past.items():
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
        p = next(iter(feeds.values())).shape[2] if feeds else 0
        missing = [n for n in self.mtp_names if n not in (extra or {})]
        if missing:
            raise GraphllmError(f"{self.path}: give the token ids of {', '.join(missing)} (extra=)")
        if self.lowering in IN_PLACE_CACHE and b > 1 and t > 1 and p > 0:
            raise GraphllmError(
                f"{self.path}: the {self.lowering} lowering's GroupQueryAttention takes several "
                "new tokens after a past at batch 1 only (onnxruntime's rule); export this model "
                f"with --ops standard to run them at batch {b}"
            )
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
        The cache stays in onnxruntime, as `bench` keeps it (`_Bound`); an MTP export's draft
        inputs are fed the step's own tokens (their logits are not read)."""
        ids = np.atleast_2d(np.asarray(input_ids, dtype=np.int64))
        mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask)
        b = ids.shape[0]
        bound = _Bound(self, capacity=ids.shape[1] + max_new_tokens, batch=b)
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


class _Bound:
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
        self.in_place = capacity is not None and model.lowering in IN_PLACE_CACHE
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


@dataclass(frozen=True)
class Timings:
    """Seconds measured by `time_generation`: one entry per timed repeat."""

    prefill: list[float]  # one prefill of the prompt
    decode: list[float]  # mean seconds per decode step over the new tokens


def time_generation(
    model: OnnxModel,
    prompt_len: int,
    new_tokens: int,
    batch: int = 1,
    repeats: int = 5,
    warmup: int = 1,
    seed: int = 0,
    tick: Callable[[str], None] | None = None,
) -> Timings:
    """Prefill a random prompt of `prompt_len` tokens, then decode `new_tokens` greedily through
    the KV cache, `warmup` + `repeats` times; `tick(phase)` after each step (a progress bar).
    A step's time is the model's run and the argmax of its logits: the attention masks and
    positions of every step (no padding) are made before the clock starts."""
    if prompt_len < 1 or new_tokens < 1:
        raise GraphllmError("bench needs a prompt of at least 1 token and at least 1 new token")
    ids = np.random.default_rng(seed).integers(0, _vocab(model), (batch, prompt_len))
    bound = _Bound(model, capacity=prompt_len + new_tokens, batch=batch)
    masks = [np.ones((batch, prompt_len + i), np.int64) for i in range(new_tokens + 1)]
    prompt = bound.inputs(ids, masks[0])
    steps = [bound.inputs(np.zeros((batch, 1), np.int64), m) for m in masks[1:]]
    prefill, decode = [], []
    for r in range(warmup + repeats):
        t0 = time.perf_counter()
        outs = bound.step(prompt, None)
        nxt = outs[0].numpy()[:, -1].argmax(-1)[:, None].astype(np.int64)  # (B, 1)
        t1 = time.perf_counter()
        if tick:
            tick("prefill")
        spent = 0.0
        for inputs in steps:
            s0 = time.perf_counter()
            inputs = inputs | {"input_ids": bound.value(nxt)}
            outs = bound.step(inputs, outs)
            nxt = outs[0].numpy()[:, -1].argmax(-1)[:, None].astype(np.int64)
            spent += time.perf_counter() - s0
            if tick:
                tick("decode")
        if r >= warmup:
            prefill.append(t1 - t0)
            decode.append(spent / new_tokens)
    return Timings(prefill, decode)


def _vocab(model: OnnxModel) -> int:
    dims = model.session.get_outputs()[0].shape  # (batch, sequence_length, vocab)
    return int(dims[-1]) if isinstance(dims[-1], int) else 2


@dataclass(frozen=True)
class BenchReport:
    """Measured figures (medians over repeats) beside the roofline prediction."""

    model: str
    lowering: str
    provider: str
    threads: int
    batch: int
    prompt_len: int
    new_tokens: int
    repeats: int
    warmup: int
    prefill_s: float
    decode_s: float  # per decode step (each sequence gains one token)
    hardware: str | None = None
    predicted_prefill_s: float | None = None
    predicted_decode_s: float | None = None
    calibrated: bool = False  # the local hardware was calibrated for this run
    huge_page_bytes: int = 0  # of the process's memory, the weights among it, on huge pages

    def figures(self) -> list[tuple[str, str, float, float | None]]:
        """(figure, unit, measured, predicted) rows."""
        pre, dec = self.predicted_prefill_s, self.predicted_decode_s
        b, t = self.batch, self.prompt_len
        return [
            ("prefill", "ms", 1e3 * self.prefill_s, None if pre is None else 1e3 * pre),
            ("prefill", "tokens/s", b * t / self.prefill_s, None if pre is None else b * t / pre),
            ("decode", "ms/token", 1e3 * self.decode_s, None if dec is None else 1e3 * dec),
            ("decode", "tokens/s", b / self.decode_s, None if dec is None else b / dec),
        ]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        rows = self.figures()
        keys = [
            "prefill_ms",
            "prefill_tokens_per_second",
            "decode_ms_per_token",
            "tokens_per_second",
        ]
        d["measured"] = {k: m for k, (_, _, m, _) in zip(keys, rows)}
        d["predicted"] = {k: p for k, (_, _, _, p) in zip(keys, rows)} if self.hardware else None
        # measured time over predicted time: 1.0 is the roofline, 2.0 takes twice as long
        d["measured_over_predicted"] = (
            {"prefill": self.prefill_s / pre, "decode": self.decode_s / dec}
            if self.hardware
            and (pre := self.predicted_prefill_s)
            and (dec := self.predicted_decode_s)
            else None
        )
        return d


def predict(
    config: ModelConfig,
    lowering: str,
    dtype: str,
    logits: str,
    batch: int,
    prompt_len: int,
    new_tokens: int,
    hardware: Any,
    build: dict[str, Any] | None = None,
) -> tuple[float, float]:
    """Roofline seconds of the prefill and of one decode step, averaged over the decode steps
    (past P = prompt_len ... prompt_len + new_tokens - 1; decode cost is linear in P). The
    decomposed lowering materialises the scores (`naive` attention), the fused ones do not."""
    from graphllm.builder import build_graph
    from graphllm.passes import run

    attention = "naive" if lowering == "decomposed" else "flash"

    def seconds(seq: int, past: int) -> float:
        wl = Workload.with_dtype(
            batch=batch, seq_len=seq, past_len=past, dtype=dtype, logits=logits
        )
        graph = build_graph(config, wl, **(build or {}))  # an export's mla= and mtp=
        res = run(graph, ["cost", "roofline"], hardware=hardware, attention=attention)
        return res["roofline"].seconds

    first, last = prompt_len, prompt_len + new_tokens - 1
    decode = (seconds(1, first) + seconds(1, last)) / 2
    return seconds(prompt_len, 0), decode


def bench(
    path: str | Path,
    prompt_len: int = 128,
    new_tokens: int = 64,
    batch: int = 1,
    repeats: int = 5,
    warmup: int = 1,
    threads: int | None = None,
    device: str = "auto",
    hardware: str | None = "local",
    progress: bool = False,
    say: Callable[[str], None] | None = None,
    huge_pages: bool = True,
) -> BenchReport:
    """Time a graphllm `.onnx` model on onnxruntime and predict the same from its metadata.

    `hardware` None skips the prediction; `local` calibrates this machine first when it has no
    calibration yet (and says so through `say`). `huge_pages` moves the loaded weights onto
    transparent huge pages first, as numpy's buffers are (graphllm.hugepages).
    """
    from graphllm import hugepages
    from graphllm.exporters.onnx import metadata_from_props, read_metadata

    threads = threads or os.cpu_count() or 1
    try:
        model = OnnxModel(path, device, threads)
    except GraphllmError:
        if Path(path).is_file():
            read_metadata(path)  # a file graphllm did not write says so, before onnxruntime
        raise
    meta = metadata_from_props(model.session.get_modelmeta().custom_metadata_map, path)
    provider = model.session.get_providers()[0]
    if huge_pages and provider == PROVIDERS["cpu"]:
        hugepages.collapse()
    hw, calibrated = None, False
    if hardware is not None:
        hw, calibrated = _hardware(hardware, meta, threads, say)
    total = (warmup + repeats) * (1 + new_tokens)
    with _bar(progress, total) as tick:
        t = time_generation(model, prompt_len, new_tokens, batch, repeats, warmup, tick=tick)
    pre = dec = None
    if hw is not None:
        wl = meta.workload
        pre, dec = predict(
            meta.config,
            meta.lowering,
            wl.act_dtype,
            wl.logits,
            batch,
            prompt_len,
            new_tokens,
            hw,
            meta.build,
        )
    return BenchReport(
        model=meta.config.name,
        lowering=meta.lowering,
        provider=provider,
        threads=threads,
        batch=batch,
        prompt_len=prompt_len,
        new_tokens=new_tokens,
        repeats=repeats,
        warmup=warmup,
        prefill_s=statistics.median(t.prefill),
        decode_s=statistics.median(t.decode),
        hardware=None if hw is None else hw.name,
        predicted_prefill_s=pre,
        predicted_decode_s=dec,
        calibrated=calibrated,
        huge_page_bytes=hugepages.huge_bytes(),
    )


def _hardware(name: str, meta: Any, threads: int, say: Callable[[str], None] | None) -> tuple:
    """The Hardware to predict on; `local` without a calibration is calibrated (modest sizes:
    a 1024^3 matmul, a 512 MiB read and a read of the model's weights, 3 repeats each)."""
    from graphllm.hardware import load_hardware, local_path

    if name.strip().lower() != "local" or local_path().is_file():
        return load_hardware(name), False
    from graphllm.builder import build_graph
    from graphllm.calibrate import calibrate, save_local
    from graphllm.passes import run

    if say:
        say(f"no calibration for this machine: calibrating it first ({local_path()})")
    graph = build_graph(meta.config, meta.workload, **meta.build)
    weights = run(graph, ["memory"])["memory"].weights
    hw = calibrate(
        weights_bytes=weights,
        repeats=3,
        threads=threads,
        progress=say is not None,
        matmul_size=1024,
        buffer_bytes=512 << 20,
    )
    save_local(hw)
    return hw, True


@contextmanager
def _bar(show: bool, total: int) -> Iterator[Callable[[str], None] | None]:
    """A rich progress bar on stderr over the prefill and decode steps (or nothing)."""
    if not show:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    cols = (TextColumn("bench {task.fields[phase]}"), BarColumn(), MofNCompleteColumn())
    # a slow refresh: rich renders from its own thread, beside the runs being timed
    with Progress(
        *cols, console=Console(stderr=True), transient=True, refresh_per_second=2
    ) as bars:
        task = bars.add_task("bench", total=total, phase="")
        yield lambda phase: bars.update(task, advance=1, phase=phase)


def check_token_mixing_onnx(
    cfg: ModelConfig,
    seq_len: int = 12,
    seed: int = 0,
    shrink: bool = True,
    workload: Workload | None = None,
) -> MixingCheck:
    """`observe.check_token_mixing` observed through onnxruntime: the same small instance, random
    weights, token ids, past K/V and perturbations, run from an exported `.onnx` file."""
    from graphllm.exporters.onnx import export_onnx

    case = mixing_case(cfg, seq_len, seed, shrink, workload)
    with tempfile.TemporaryDirectory(prefix="graphllm-tokens-") as tmp:
        path = Path(tmp) / "model.onnx"
        export_onnx(
            case.small, path, seed=seed, workload=case.workload, check=False, ops="decomposed"
        )
        model = OnnxModel(path, device="cpu")
        return case.observe(lambda x: model.forward(x, past=case.past)["logits"][0])
