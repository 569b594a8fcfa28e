"""`graphllm bench`: time a graphllm `.onnx` model on onnxruntime (prefill latency, decode ms per
token) and predict the same from the graph it was exported from, on a hardware spec.

onnxruntime is imported inside the functions (through the session), so importing this costs nothing.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from graphllm.build.builder import build_graph
from graphllm.errors import GraphllmError
from graphllm.exporters.onnx import ExportedModel, metadata_from_props, read_metadata
from graphllm.exporters.onnx.quantize import nbits_format
from graphllm.models.hardware import load_hardware, local_path
from graphllm.models.model_config import ModelConfig
from graphllm.models.quantization import QuantFormat
from graphllm.models.workload import Workload
from graphllm.passes import run
from graphllm.runtime import hugepages
from graphllm.runtime.budget import require_bench, require_threads
from graphllm.runtime.calibrate import (
    attention_heads_of,
    calibrate,
    gemm_shapes_of,
    save_local,
)
from graphllm.runtime.session import PROVIDERS, BoundCache, OnnxModel


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
    bound = BoundCache(model, capacity=prompt_len + new_tokens, batch=batch)
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
    stored: Mapping[str, QuantFormat] | None = None,
) -> tuple[float, float]:
    """Roofline seconds of the prefill and of one decode step, averaged over the decode steps
    (past P = prompt_len ... prompt_len + new_tokens - 1; decode cost is linear in P). The
    decomposed lowering materialises the scores (`naive` attention), the fused ones do not.
    The weights are at `dtype` but for those `stored` gives a form (a quantized export's)."""

    attention = "naive" if lowering == "decomposed" else "flash"

    def seconds(seq: int, past: int) -> float:
        wl = Workload.with_dtype(
            batch=batch, seq_len=seq, past_len=past, dtype=dtype, logits=logits
        )
        graph = predicted_graph(config, wl, build, stored)
        res = run(graph, ["cost", "roofline"], hardware=hardware, attention=attention)
        return res["roofline"].seconds

    first, last = prompt_len, prompt_len + new_tokens - 1
    decode = (seconds(1, first) + seconds(1, last)) / 2
    return seconds(prompt_len, 0), decode


def predicted_graph(
    config: ModelConfig,
    wl: Workload,
    build: dict[str, Any] | None = None,
    stored: Mapping[str, QuantFormat] | None = None,
) -> Any:
    """The graph a prediction prices: an export's mla= and mtp=, its params stored as `stored`
    says (MatMulNBits weights) and the others at the workload's dtype."""
    return build_graph(config, wl, stored=stored, **(build or {}))


def predicted_stored_bytes(meta: ExportedModel) -> float:
    """The bytes an export stores, predicted from its metadata: its params in the form it stores
    them (the memory pass on `predicted_graph`) and the constant tables its lowering computed
    (the ort lowering's rotary caches, `graphllm.tables`). A decode step reads one row of
    those, so they weigh on the storage, not on the roofline's bytes moved."""
    wl = Workload.with_dtype(batch=1, seq_len=1, past_len=1, dtype=meta.workload.act_dtype)
    graph = predicted_graph(meta.config, wl, meta.build, export_storage(meta))
    return run(graph, ["memory"])["memory"].weights + sum(meta.tables.values())


def export_storage(meta: ExportedModel) -> dict[str, QuantFormat]:
    """Each param a quantized export stores as MatMulNBits, in that form (its metadata's
    `graphllm.stored`); embeddings, norms and routed experts are float at the export's dtype."""
    q = meta.quantization
    if q is None:
        return {}
    return {n: nbits_format(q, zp, meta.workload.act_dtype) for n, zp in meta.stored.items()}


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

    threads = threads or os.cpu_count() or 1
    require_threads(threads, "bench")
    model, meta = _open(path, device, threads)
    require_bench(model, meta.config.num_attention_heads, batch, prompt_len, new_tokens)
    provider = model.session.get_providers()[0]
    if huge_pages and provider == PROVIDERS["cpu"]:
        hugepages.collapse()
    hw, calibrated = None, False
    if hardware is not None:
        hw, calibrated = _hardware(hardware, meta, threads, say, prompt_len, new_tokens)
    total = (warmup + repeats) * (1 + new_tokens)
    with _bar(progress, total) as tick:
        t = time_generation(model, prompt_len, new_tokens, batch, repeats, warmup, tick=tick)
    pre, dec = (None, None) if hw is None else _predicted(meta, hw, batch, prompt_len, new_tokens)
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


def _predicted(
    meta: ExportedModel, hw: Any, batch: int, prompt_len: int, new_tokens: int
) -> tuple[float, float]:
    """`predict` for the model as it was exported (its config, lowering, dtype and build)."""
    wl = meta.workload
    return predict(
        meta.config,
        meta.lowering,
        wl.act_dtype,
        wl.logits,
        batch,
        prompt_len,
        new_tokens,
        hw,
        meta.build,
        export_storage(meta),
    )


def _open(path: str | Path, device: str, threads: int) -> tuple[OnnxModel, ExportedModel]:
    """The model's session and what its metadata says it is (a file graphllm did not write
    says so, before onnxruntime's own error)."""
    try:
        model = OnnxModel(path, device, threads)
    except GraphllmError:
        if Path(path).is_file():
            read_metadata(path)
        raise
    meta = metadata_from_props(model.session.get_modelmeta().custom_metadata_map, path)
    return model, meta


def _hardware(
    name: str,
    meta: Any,
    threads: int,
    say: Callable[[str], None] | None,
    prompt_len: int,
    new_tokens: int,
) -> tuple:
    """The Hardware to predict on; `local` without a calibration is calibrated (modest sizes:
    a 1024^3 matmul, a 512 MiB read and a read of the model's weights, 3 repeats each; the
    read sweep, the GEMM table at the model's shapes and the attention table at its heads and
    this run's steps, 30 s each at most)."""

    if name.strip().lower() != "local" or local_path().is_file():
        return load_hardware(name), False

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
        gemm_shapes=gemm_shapes_of(meta.config),
        attention_heads=attention_heads_of(meta.config),
        attention_steps=((1, prompt_len), (1, prompt_len + new_tokens), (prompt_len, 0)),
        budget=30.0,
    )
    save_local(hw)
    return hw, True


@contextmanager
def _bar(show: bool, total: int) -> Iterator[Callable[[str], None] | None]:
    """A rich progress bar on stderr over the prefill and decode steps (or nothing)."""
    if not show:
        yield None
        return

    cols = (TextColumn("bench {task.fields[phase]}"), BarColumn(), MofNCompleteColumn())
    # a slow refresh: rich renders from its own thread, beside the runs being timed
    with Progress(
        *cols, console=Console(stderr=True), transient=True, refresh_per_second=2
    ) as bars:
        task = bars.add_task("bench", total=total, phase="")
        yield lambda phase: bars.update(task, advance=1, phase=phase)
