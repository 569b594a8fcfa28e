"""Traced models kept on disk, by what they were traced from, so the second trace of a model is a
read and a lowering (as fast as a built family's graph to within the lowering).

The key hashes the config's fields, the phase's probes, the compute dtype, the versions of
torch and transformers and the source of the tracing code itself; the value is the fitted recording (its events,
sizes as functions of B, T and P, constants' values), pickled. The folder is graphllm's cache
($XDG_CACHE_HOME/graphllm/traced, else ~/.cache/graphllm/traced); GRAPHLLM_TRACE_CACHE=0 turns it
off. A file that does not read back is traced again and replaced, never trusted in part.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import json
import os
import pickle
from importlib import metadata
from pathlib import Path
from typing import Any

from graphllm.errors import GraphllmError
from graphllm.files import write_atomic

FORMAT = 1  # bump when what is stored changes
KEEP_GRAPH_BYTES = 512 << 20  # lowered graphs kept: Llama-3.1-405B's is 1.3 MB a workload


def cache_folder() -> Path | None:
    if os.environ.get("GRAPHLLM_TRACE_CACHE", "1") == "0":
        return None
    cache = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(cache):  # the XDG spec: a relative path is invalid and ignored
        cache = str(Path.home() / ".cache")
    return Path(cache) / "graphllm" / "traced"


def stored_key(raw: dict[str, Any], points: tuple, dtype: str, values: bool) -> str:
    text = json.dumps(
        [raw, points, dtype, values, _versions(), FORMAT, _code()],
        sort_keys=True,
        default=repr,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@functools.cache
def _versions() -> tuple[str | None, ...]:
    """torch's and transformers' versions, read from the installed metadata (importing them
    costs seconds) once a process: a command keys several traces."""
    versions = []
    for package in ("torch", "transformers"):
        try:
            versions.append(metadata.version(package))
        except metadata.PackageNotFoundError:
            versions.append(None)
    return tuple(versions)


@functools.cache
def _code() -> str:
    """A hash of the code that records, fits and lowers a trace, and of the IR, op rows and
    quantization rules a lowered graph is made of: a cached recording or graph of other code is
    never read back."""
    root = Path(__file__).parent.parent
    paths = [*(root / "trace").glob("*.py"), *(root / "ops").glob("*.py")]
    paths += [*(root / "ir").glob("*.py"), root / "build" / "kinds.py"]
    paths.append(root / "models" / "quantization.py")  # a param's stored format
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def load(name: str) -> Any | None:
    folder = cache_folder()
    if folder is None:
        return None
    path = folder / f"{name}.pkl"
    with contextlib.suppress(OSError):
        os.utime(path)  # read lately: the last a trim removes
    try:
        with open(path, "rb") as f, _collector_paused():
            return pickle.load(f)
    except (
        OSError,
        pickle.UnpicklingError,
        EOFError,
        AttributeError,
        ImportError,
        ValueError,
        TypeError,
    ):
        return None


@contextlib.contextmanager
def _collector_paused():
    """Unpickling a graph makes tens of thousands of objects, each allocation counting toward a
    full collection that walks every object alive (torch's and transformers' included): paused,
    a read of Llama-3.1-405B's graph takes a fifth of the time."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def save(name: str, fitted: Any) -> None:
    folder = cache_folder()
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / f"{name}.pkl", lambda p: p.write_bytes(pickle.dumps(fitted, 5)))
        _trim(folder)
    except (OSError, GraphllmError):
        pass  # a cache that cannot be written costs the next run a trace, nothing more


def lowered_key(stored: str, workload: dict[str, Any], name: str) -> str:
    """The key of a recording's graph lowered at one workload, under one name."""
    text = json.dumps([stored, workload, name], sort_keys=True, default=repr)
    return "graph-" + hashlib.sha256(text.encode()).hexdigest()[:32]


def _trim(folder: Path) -> None:
    """Keep the lowered graphs (one a workload a model is traced at: a serving curve writes
    tens) within KEEP_GRAPH_BYTES, the least lately read removed first; recordings stay."""
    graphs = [(p.stat().st_mtime, p.stat().st_size, p) for p in folder.glob("graph-*.pkl")]
    total = sum(size for _, size, _ in graphs)
    for _, size, path in sorted(graphs):
        if total <= KEEP_GRAPH_BYTES:
            break
        with contextlib.suppress(OSError):
            path.unlink()
            total -= size
