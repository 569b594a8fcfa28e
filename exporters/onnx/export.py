"""Graph -> a `.onnx` file: lowered by an op set, with its weights and the metadata graphllm reads
back (config, workload, lowering, how the graph was built). Written whole or not at all.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from graphllm.build.weights import checkpoint_tensors, random_tensors
from graphllm.echo import shown_path
from graphllm.errors import ConfigError, GraphllmError
from graphllm.exporters.onnx.fused import default_lowering
from graphllm.exporters.onnx.lowering import (
    ALIGN,
    EXPORT_DTYPES,
    LOWERINGS,
    NP_TYPES,
    PROTO_LIMIT,
    Initializer,
    lower,
    producer_version,
    static_shape,
)
from graphllm.exporters.onnx.nbits import Quantization
from graphllm.exporters.onnx.quantize import KEPT_METHODS, ZERO_POINTS, checkpoint_quantization
from graphllm.files import check_target, note_input, write_atomic
from graphllm.ir import Graph
from graphllm.models.model_config import ModelConfig, config_from_fields
from graphllm.models.parse import file_kind
from graphllm.models.workload import Workload

DATA_HEADER = b"graphllm external data "  # then the token its name and the model's metadata carry
_LARGEST_GRAPH = 256 << 20  # an external-data model's graph alone is far smaller


# -- metadata ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExportedModel:
    """What a `.onnx` file written by graphllm says about itself (its metadata_props)."""

    config: ModelConfig
    workload: Workload
    lowering: str
    weights: str
    build: dict[str, Any] = field(default_factory=dict)  # build_graph's mla= and mtp=
    quantization: Quantization | None = None  # MatMulNBits weights, or None: float
    # param -> its MatMulNBits weight's zero points (quantize.ZERO_POINTS), with quantization
    stored: dict[str, str] = field(default_factory=dict)
    # constant tables the lowering computed (the ort lowering's rotary caches): name -> bytes
    tables: dict[str, int] = field(default_factory=dict)


def _metadata(
    config: ModelConfig,
    wl: Workload,
    ops: str,
    weights: str,
    build: dict[str, Any],
    quantization: Quantization | None = None,
) -> dict[str, str]:
    out = {
        "graphllm.version": producer_version(),
        "graphllm.lowering": ops,
        "graphllm.config": json.dumps(asdict(config)),
        "graphllm.workload": json.dumps(asdict(wl)),
        "graphllm.weights": weights,
    }
    if config.is_mla:  # how the graph was built, beside the config it was built from
        out["graphllm.graph"] = json.dumps(build)
    if getattr(config, "frontend", "built") != "built":
        out["graphllm.frontend"] = config.frontend
    if quantization is not None:
        out["graphllm.quantization"] = json.dumps(quantization.to_dict())
    return out


def read_metadata(path: str | Path) -> ExportedModel:
    """The config, workload defaults, lowering and weights note of a graphllm `.onnx` file."""
    onnx_file(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf's DecodeError, OSError, ...
        raise GraphllmError(f"{path}: not a readable ONNX model ({_first_line(e)})") from None
    return metadata_from_props({p.key: p.value for p in model.metadata_props}, path)


def onnx_file(path: str | Path) -> Path:
    """`path` if it is a regular file (a symlink to one included): a FIFO would block the read,
    a device would never end, a folder is no model."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise GraphllmError(f"{shown_path(path)}: no such ONNX model") from None
    except (OSError, ValueError) as e:  # ValueError: a NUL in the name
        raise GraphllmError(f"{shown_path(path)}: cannot read it ({_reason(e)})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = file_kind(st.st_mode)
        raise GraphllmError(f"{shown_path(path)}: is {kind}, not an ONNX model")
    if st.st_size == 0:
        raise GraphllmError(f"{shown_path(path)}: is empty, not an ONNX model")
    note_input(path)
    return Path(path)


def _reason(e: Exception) -> str:
    return e.strerror if isinstance(e, OSError) and e.strerror else "an impossible file name"


def metadata_from_props(props: dict[str, str], path: str | Path) -> ExportedModel:
    """`read_metadata` from the properties themselves (as an onnxruntime session holds them,
    without reading the file again). Nothing in them is trusted: each property is parsed and
    validated as the config files are (ModelConfig's fields, Workload's), and what is wrong is
    one GraphllmError naming the file and the property."""
    if "graphllm.config" not in props:
        raise GraphllmError(f"{path}: no graphllm metadata (was it exported by graphllm?)")
    if props.get("graphllm.frontend") == "traced":
        raise GraphllmError(
            f"{path}: a model traced from transformers' code; graphllm reads back the exports "
            "of the families it builds only, for now (onnxruntime runs this one as it is)"
        )
    key = "graphllm.config"
    try:
        config = config_from_fields(_json(props, key))
        key = "graphllm.workload"
        workload = Workload(**_scalars(_mapping(_json(props, key), key)))
        key = "graphllm.graph"
        build = _build(_json(props, key, "{}"))
        key = "graphllm.lowering"
        lowering = _one_of(_prop(props, key), LOWERINGS)
        key = "graphllm.weights"
        weights = _prop(props, key)
        key = "graphllm.quantization"
        quantization = _quantization(_json(props, key, "null"))
        key = "graphllm.stored"
        stored = _stored(_json(props, key, "{}"))
        key = "graphllm.tables"
        tables = _tables(_json(props, key, "{}"))
    except (GraphllmError, ValueError, TypeError) as e:
        raise GraphllmError(
            f"{path}: unreadable graphllm metadata {key}: {_first_line(e)}"
        ) from None
    return ExportedModel(config, workload, lowering, weights, build, quantization, stored, tables)


def _tables(value: Any) -> dict[str, int]:
    """The `graphllm.tables` record: table names, each to its bytes."""
    record = _mapping(value, "graphllm.tables")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in record.values()):
        raise GraphllmError("each table's bytes must be a count")
    return dict(record)


def _stored(value: Any) -> dict[str, str]:
    """The `graphllm.stored` record: param names, each to one of quantize.ZERO_POINTS."""
    record = _mapping(value, "graphllm.stored")
    if not all(isinstance(k, str) and v in ZERO_POINTS for k, v in record.items()):
        raise GraphllmError(f"each param's zero points must be one of {', '.join(ZERO_POINTS)}")
    return dict(record)


def _quantization(value: Any) -> Quantization | None:
    """The `graphllm.quantization` record: its fields, each checked as the CLI checks them."""
    if value is None:
        return None
    record = _mapping(value, "graphllm.quantization")
    method, block, level, sym = (
        record.get(k) for k in ("method", "block_size", "accuracy_level", "symmetric")
    )
    if not isinstance(method, str) or not isinstance(sym, bool):
        raise GraphllmError("method must be a name and symmetric true or false")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (block, level)):
        raise GraphllmError("block_size and accuracy_level must be integers")
    return Quantization(method, block, level, sym)  # type: ignore[arg-type]


def _prop(props: dict[str, str], key: str, default: str | None = None) -> str:
    value = props.get(key, default)
    if value is None:
        raise GraphllmError("missing")
    if not isinstance(value, str):
        raise GraphllmError(f"not a string but a {type(value).__name__}")
    return value


def _json(props: dict[str, str], key: str, default: str | None = None) -> Any:
    try:
        return json.loads(_prop(props, key, default))
    except RecursionError:  # json's C parser counts its depth against the recursion limit
        raise GraphllmError("JSON nested too deep") from None


def _mapping(value: Any, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise GraphllmError(f"a mapping was expected, not a {type(value).__name__}")
    return value


def _scalars(fields: dict[str, Any]) -> dict[str, Any]:
    """A workload's fields are numbers and names; Workload checks which ones."""
    for name, value in fields.items():
        if not isinstance(value, (int, str)):
            raise GraphllmError(
                f"{name[:40]} must be a number or a name, not a {type(value).__name__}"
            )
    return fields


def _build(value: Any) -> dict[str, Any]:
    """build_graph's keyword arguments as an export recorded them (mla=, mtp=)."""
    build = _mapping(value, "graphllm.graph")
    unknown = sorted(set(build) - {"mla", "mtp"})
    if unknown:
        raise GraphllmError(f"unknown key {unknown[0][:40]!r}")
    if "mla" in build:
        _one_of(build["mla"], ("naive", "absorbed"))
    if not isinstance(build.get("mtp", False), bool):
        raise GraphllmError("mtp must be true or false")
    return build


def _one_of(value: Any, choices: Any) -> str:
    if not isinstance(value, str) or value not in choices:
        shown = repr(value)[:40]
        raise GraphllmError(f"{shown} is not one of {', '.join(choices)}")
    return value


def _first_line(e: BaseException) -> str:
    """An exception's message on one line, cut short: a parser may quote the hostile input."""
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    text = lines[0] if lines else type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."


# -- writing ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExportResult:
    """What `export_onnx` wrote."""

    path: Path
    data_path: Path | None  # the external data file, when there is one
    nodes: int  # ONNX nodes
    params: int  # weight values
    weight_bytes: int  # bytes of the initializers written (weights as the lowering stores them)
    weights: str  # where the weights came from
    lowering: str = "decomposed"  # the op set written


def export_onnx(
    graph: Graph,
    path: str | Path,
    *,
    weights: str | Path | None = None,
    seed: int = 0,
    no_weights: bool = False,
    workload: Workload | None = None,
    external_data: bool | None = None,
    check: bool = True,
    ops: str = "auto",
    device: str = "cpu",
    quantize: Quantization | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ExportResult:
    """Write `graph` as an ONNX model: weights from a checkpoint folder, seeded random ones, or
    (`no_weights`) none at all, the weights then being graph inputs.

    The graph is built by the caller (`graphllm.build.builder.build_export_graph` builds one that
    serves prefill and decode); its activation dtype is the model's. `ops` is the lowering
    (`decomposed`, `standard`, `ort`), or `auto`: the default for `device` and the model's family
    (`DEFAULT_LOWERINGS`). `workload` is recorded as the model's defaults for later analysis (by
    default the graph's own, with its dtypes). `external_data` None chooses by size: past
    protobuf's 2 GB limit the weights go to `<path>.<hex>.data`. The file (and its data file) is
    written whole or not at all, interrupted or not; with `check`,
    `onnx.checker.check_model(full_check=True)` runs on it before it is moved into place.
    `quantize` writes the linear weights as MatMulNBits (graphllm.exporters.onnx.quantize),
    quantized from the float weights (the workload recorded then has that weight dtype), or from
    a GPTQ/AWQ checkpoint the integers it stores, kept as they are (its group size is then the
    block size). `progress(done, total)` is told the weight bytes written after each tensor.
    """
    config, wl, ops = _checked(graph, workload, weights, no_weights, ops, device)
    path = check_export_target(path)  # before the work: what stops the write stops it now
    wl, quantize, stored_format = _quantized(graph, wl, weights, no_weights, quantize)
    model, plan = lower(graph, ops, no_weights, quantize, stored_format)
    source = _source(weights, seed, no_weights)
    build = {"mla": graph.meta.get("mla") or "naive", "mtp": bool(graph.meta.get("mtp"))}
    for k, v in _metadata(config, wl, ops, source, build, quantize).items():
        model.metadata_props.add(key=k, value=v)
    numel = sum(int(np.prod(static_shape(n))) for n in graph.params())
    written = [] if no_weights else plan
    dtype = wl.act_dtype
    nbytes = sum(
        int(np.prod(init.shape)) * np.dtype(NP_TYPES[init.dtype or dtype]).itemsize
        for init in written
    )
    tensors = _tensors(graph, written, weights, seed, dtype, no_weights)
    if progress is not None:
        tensors = _told(tensors, nbytes, progress)
    external = nbytes > PROTO_LIMIT if external_data is None else external_data
    # a name no other export uses: a model is never paired with another export's data file
    data_path = (
        path.with_name(f"{path.name}.{secrets.token_hex(4)}.data") if external and written else None
    )
    with _exclusive(path.parent):  # one export at a time per folder: none deletes another's data
        _write_in_place(
            path, data_path, lambda tmp: _write(model, tmp, data_path, tensors, nbytes, check)
        )
    return ExportResult(path, data_path, len(model.graph.node), numel, nbytes, source, ops)


def _quantized(
    graph: Graph,
    wl: Workload,
    weights: str | Path | None,
    no_weights: bool,
    quantize: Quantization | None,
) -> tuple[Workload, Quantization | None, Any]:
    """The workload recorded, the quantization written and the stored format a GPTQ/AWQ
    checkpoint's integers are kept in (None: quantized here, or float)."""
    if quantize is None:
        return wl, None, None
    if no_weights:
        raise ConfigError(
            "--quantize quantizes the weights it writes: give random weights or a "
            "checkpoint, not --no-weights"
        )
    wl = Workload.with_dtype(wl, weight_dtype=quantize.method)
    stored_format = _kept_formats(graph) if weights is not None else None
    if stored_format is not None:
        quant = graph.meta["checkpoint_quantization"]
        quantize = checkpoint_quantization(quantize, quant.weights)
    return wl, quantize, stored_format


def _source(weights: str | Path | None, seed: int, no_weights: bool) -> str:
    """Where the weights come from, as the model's metadata says it."""
    if no_weights:
        return "none: the weights are graph inputs"
    if weights is not None:
        return f"checkpoint {Path(weights).resolve().name}"
    return f"random, seed {seed}"


def _tensors(
    graph: Graph,
    plan: list[Initializer],
    weights: str | Path | None,
    seed: int,
    dtype: str,
    no_weights: bool,
) -> Iterator[tuple]:
    """(name, array) of each initializer written, read one at a time."""
    if no_weights:
        params: Iterator[tuple] = iter(())
    elif weights is not None:
        params = checkpoint_tensors(graph, weights, dtype, _kept(plan))
    else:
        params = random_tensors(graph, seed, dtype)
    return planned(plan, params, dtype)


def check_export_target(path: str | Path, inputs: tuple = ()) -> Path:
    """`path` as a place `export_onnx` can write a model to (`files.check_target`), with each
    weights file of an earlier export beside it (`NAME.<hex>.data`, `NAME.data`) one it can
    remove once its model is in place: a folder or a device under such a name is refused now,
    in one line, not after the weights are written."""
    path = check_target(path, inputs)
    for data in _data_files(path):
        try:
            mode = data.stat().st_mode
        except FileNotFoundError:  # a dangling symlink: removing it is harmless
            continue
        except OSError as e:
            raise GraphllmError(
                f"cannot write {shown_path(path)}: cannot look at {shown_path(data)} beside it "
                f"({e.strerror})"
            ) from None
        if not stat.S_ISREG(mode):
            raise GraphllmError(
                f"cannot write {shown_path(path)}: {shown_path(data)} is {file_kind(mode)}, "
                f"where an export to {shown_path(path.name)} removes an earlier export's weights "
                "file; move it away or write elsewhere"
            )
    return path


def _write_in_place(path: Path, data_path: Path | None, write: Callable[[Path], None]) -> None:
    """`write_atomic(path, write)`, then the data files no model at `path` names removed,
    whether it ended normally, with an error or with a signal: one arriving just after the data
    file's rename, or just after the model's, leaves no unnamed data file behind."""
    ours: list[tuple[int, int]] = []

    def write_and_note(tmp: Path) -> None:
        write(tmp)
        ours.append(_file_id(tmp))  # a rename keeps it: how to tell the model is in place

    try:
        write_atomic(path, write_and_note)
    finally:
        try:
            _settle(path, data_path, bool(ours) and _file_id(path) == ours[0])
        except BaseException:  # a signal in the middle (the CLI ignores a second one): finish
            _settle(path, data_path, bool(ours) and _file_id(path) == ours[0])
            raise


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _settle(path: Path, data_path: Path | None, placed: bool) -> None:
    """With this export's model in place (`placed`), the data files of earlier (or killed)
    exports to `path` are removed; without it, this export's own, which no model names."""
    if placed:
        doomed = [d for d in _data_files(path) if d != data_path]
    else:
        doomed = [data_path] if data_path is not None else []
    for data in doomed:
        # a folder put there since check_export_target is not ours to remove; the model is in
        # place either way
        with contextlib.suppress(IsADirectoryError, PermissionError):
            data.unlink(missing_ok=True)


def _told(
    tensors: Iterator[tuple], total: int, progress: Callable[[int, int], None]
) -> Iterator[tuple]:
    """`tensors` as they are, telling `progress` the bytes handed on so far (each is written
    before the next is read)."""
    done = 0
    progress(0, total)
    for name, arr in tensors:
        yield name, arr
        done += arr.nbytes
        progress(done, total)


def _kept_formats(graph: Graph) -> Any:
    """The GPTQ/AWQ format of each param a checkpoint stores so (None: float), or None when the
    checkpoint stores no weight in a form MatMulNBits keeps."""
    quant = graph.meta.get("checkpoint_quantization")
    if quant is None or quant.method not in KEPT_METHODS:
        return None
    return lambda name: quant.format_of(name, graph[name].attrs["kind"])


def _kept(plan: list[Initializer]) -> set[str]:
    """The params read as their integers: the sources of the initializers that take them."""
    kept = {s for init in plan if init.takes_stored for s in init.sources}
    other = {s for init in plan if not init.takes_stored for s in init.sources}
    if kept & other:  # a lowering reading one GPTQ/AWQ matrix two ways: a bug, said plainly
        raise GraphllmError(f"{sorted(kept & other)[0]}: read both packed and as floats")
    return kept


@contextmanager
def _exclusive(folder: Path) -> Iterator[None]:
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise GraphllmError(f"cannot write in {folder}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _data_files(path: Path) -> list[Path]:
    """The weights files exports to `path` write (`NAME.<8 hex>.data`; before, `NAME.data`)."""
    pattern = re.compile(re.escape(path.name) + r"(\.[0-9a-f]{8})?\.data")
    try:
        names = os.listdir(path.parent)
    except OSError:
        return []
    return [path.parent / n for n in names if pattern.fullmatch(n)]


def _checked(
    graph: Graph,
    workload: Workload | None,
    weights: str | Path | None,
    no_weights: bool,
    ops: str,
    device: str,
) -> tuple[ModelConfig, Workload, str]:
    """What the export records and lowers by: the graph's config, the workload (in the graph's
    activation dtype), the op set (`auto`: the default for the device); or a ConfigError."""
    config, built = graph.meta.get("config"), graph.meta.get("workload")
    if config is None or built is None:
        raise ConfigError(f"graph {graph.name} was not built from a config (build_export_graph)")
    dtype = built.act_dtype
    if dtype not in EXPORT_DTYPES:
        raise ConfigError(f"ONNX export runs in {' or '.join(EXPORT_DTYPES)}, not {dtype}")
    # a model that carries nothing to a next step (GPT-1 keeps no cache) has its prefill alone
    if built.past_len == 0 and graph.carried_outputs():
        raise ConfigError("the graph has no past K/V inputs: build it with past_len > 0")
    if "partition" in graph.meta:
        raise ConfigError(
            f"graph {graph.name} is one rank's program of a partition; export the whole model"
        )
    # the defaults recorded for later analysis: the caller's, else the usual workload (not the
    # export graph's placeholder lengths)
    wl = Workload.with_dtype(workload, dtype=dtype, logits=built.logits)
    if no_weights and weights is not None:
        raise ConfigError("give a weights folder or no_weights, not both")
    if ops == "auto":
        return config, wl, default_lowering(graph, device)
    if ops not in LOWERINGS:
        raise ConfigError(f"unknown ONNX op set {ops!r}; known: auto, {', '.join(LOWERINGS)}")
    return config, wl, ops


def _write(
    model: onnx.ModelProto,
    tmp: Path,
    data_path: Path | None,
    tensors: Iterator[tuple],
    nbytes: int,
    check: bool,
) -> None:
    """The model to `tmp`: its weights inside it, or in `data_path` beside it."""
    if data_path is not None:
        _write_external(model, tmp, data_path, tensors, nbytes, check)
        return
    for name, arr in tensors:
        model.graph.initializer.append(numpy_helper.from_array(arr, name))
    onnx.save_model(model, tmp)
    model.graph.ClearField("initializer")  # free the weights before the check reads them
    if check:
        _check(tmp)


def planned(plan: list[Initializer], params: Iterator[tuple], dtype: str) -> Iterator[tuple]:
    """(name, array) of each initializer in `plan`, from (param node, array) read one at a time,
    each as soon as its sources have been read. A param is held only until the last initializer
    made from it is written."""
    left: dict[str, int] = {}
    for init in plan:
        for src in init.sources:
            left[src] = left.get(src, 0) + 1
    pending = list(plan)
    held: dict[str, np.ndarray] = {}
    for node, arr in params:
        if not left.get(node.name):
            continue
        held[node.name] = arr
        ready = [init for init in pending if all(s in held for s in init.sources)]
        for init in ready:
            pending.remove(init)
            args = [held[s] for s in init.sources]
            want = NP_TYPES[init.dtype or dtype]
            out = np.ascontiguousarray(args[0] if init.make is None else init.make(*args), want)
            del args
            for src in init.sources:  # free the sources before the copy is written
                left[src] -= 1
                if not left[src]:
                    del held[src]
            yield init.name, out
            del out
    if pending:  # a source the graph does not hold: a bug in a lowering
        raise GraphllmError(f"initializer {pending[0].name}: sources {pending[0].sources} not read")


def _write_external(
    model: onnx.ModelProto,
    tmp: Path,
    data_path: Path,
    tensors: Iterator[tuple],
    nbytes: int,
    check: bool,
) -> None:
    """Weights to `data_path` one tensor at a time (page-aligned), the graph to `tmp`."""
    free = shutil.disk_usage(data_path.parent).free
    if free < nbytes:
        raise GraphllmError(
            f"{data_path.parent} has {free / 1e9:.1f} GB free; the weights need {nbytes / 1e9:.1f} GB"
        )
    token = data_path.name.rsplit(".", 2)[-2]

    def write_data(data_tmp: Path) -> None:
        with open(data_tmp, "wb") as f:
            f.write(DATA_HEADER + token.encode() + b"\n")  # which export this data file is
            for name, arr in tensors:
                f.write(b"\0" * (-f.tell() % ALIGN))
                offset = f.tell()
                f.write(memoryview(np.ascontiguousarray(arr)).cast("B"))
                t = TensorProto(name=name, dims=arr.shape, data_type=_dtype_of(arr))
                t.data_location = TensorProto.EXTERNAL
                for k, v in (
                    ("location", data_path.name),
                    ("offset", offset),
                    ("length", arr.nbytes),
                ):
                    t.external_data.add(key=k, value=str(v))
                model.graph.initializer.append(t)
                del arr

    # whole and synced before the model that names it; on any failure from here on, the
    # caller's _write_in_place removes it (no model names it)
    write_atomic(data_path, write_data)
    record = {"file": data_path.name, "bytes": data_path.stat().st_size, "token": token}
    model.metadata_props.add(key="graphllm.data", value=json.dumps(record))
    onnx.save_model(model, tmp)
    if check:
        _check(tmp)


def check_data_file(path: str | Path) -> None:
    """Refuse in one line a model whose external weights file is missing, or is not the one it
    was exported with (another export's, a copy, a truncated one): onnxruntime would run it
    with those weights, or fail on them with a long message."""
    path = Path(path)
    if path.stat().st_size > _LARGEST_GRAPH and not _data_files(path):
        return  # its weights are inside it: nothing beside it to pair
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # not a model: the loader says so in its own words
        return
    locations = {
        d.value for t in model.graph.initializer for d in t.external_data if d.key == "location"
    }
    if not locations:
        return
    props = {p.key: p.value for p in model.metadata_props}
    if "graphllm.data" not in props:
        for name in sorted(locations):
            _inside(path, name)
        return
    try:
        record = _json(props, "graphllm.data")
        name, size, token = record["file"], record["bytes"], record["token"]
        if not (isinstance(name, str) and isinstance(token, str)):
            raise TypeError
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise TypeError
    except (GraphllmError, ValueError, TypeError, KeyError, OverflowError):
        raise GraphllmError(f"{shown_path(path)}: unreadable graphllm.data metadata") from None
    if locations != {name}:
        raise GraphllmError(f"{path}: its weights are not all in {name}, as its metadata says")
    data = _inside(path, name)
    with open(data, "rb") as f:
        head = f.read(len(DATA_HEADER) + len(token) + 1)
    if data.stat().st_size != size or head != DATA_HEADER + token.encode() + b"\n":
        raise GraphllmError(
            f"{data} is not the weights file {path.name} was exported with (another export's, "
            "or changed since); export again"
        )


def _inside(path: Path, name: str) -> Path:
    """The data file `name` a model at `path` names: a regular file in the model's folder."""
    data = path.parent / name
    if Path(name).name != name or name in ("", ".", ".."):
        raise GraphllmError(f"{path}: its weights file {name[:80]!r} is outside its folder")
    if not data.is_file():
        raise GraphllmError(f"{path}: its weights file {name} is missing (it is written beside it)")
    return data


def _dtype_of(arr: np.ndarray) -> int:
    return {
        np.dtype(np.float32): TensorProto.FLOAT,
        np.dtype(np.float16): TensorProto.FLOAT16,
        np.dtype(np.uint8): TensorProto.UINT8,
        np.dtype(np.int32): TensorProto.INT32,
    }[arr.dtype]


def _check(path: Path) -> None:
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise GraphllmError(f"the exported model fails onnx.checker: {first}") from e
