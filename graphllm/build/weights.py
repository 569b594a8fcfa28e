"""Weights for a graph's param nodes: seeded random ones, or read from a safetensors checkpoint.

The reader parses the safetensors header itself and views the data with numpy (bf16 and FP8
through ml_dtypes), so bf16, fp16 and fp32 checkpoints load the same way, quantized ones
(FP8, MXFP4, GPTQ, AWQ) dequantized matrix by matrix, and nothing is ever unpickled.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import ml_dtypes
import numpy as np

from graphllm.build.quantized import Read, check_int_groups, check_quantized, stored_names
from graphllm.echo import shown
from graphllm.errors import WeightsError
from graphllm.files import note_input
from graphllm.ir import Graph, Node
from graphllm.models.families import MULTIMODAL
from graphllm.models.folder import folder_member

if TYPE_CHECKING:
    from graphllm.models.quantization import QuantFormat

_DTYPES = {"fp32": np.float32, "fp16": np.float16}
_CHUNK = 1 << 22  # random weights are drawn this many values at a time


def _shape(node: Node) -> tuple[int, ...]:
    return tuple(int(d.size) for d in node.out.dims)  # type: ignore[arg-type]


def random_tensors(
    graph: Graph, seed: int = 0, dtype: str = "fp32", scale: float = 0.02
) -> Iterator[tuple[Node, np.ndarray]]:
    """(param node, array) one at a time, seeded: normal(0, scale) matrices, norm weights near
    their identity value. Drawn a chunk at a time straight into `dtype`, so a large model never
    holds a float64 copy of a whole tensor; the values do not depend on the chunking."""
    rng = np.random.default_rng(seed)
    offset = graph.meta["config"].norm_weight_offset if "config" in graph.meta else 0.0
    for n in graph.params():
        shape = _shape(n)
        out = np.empty(shape, _DTYPES[dtype])
        flat = out.reshape(-1)
        norm = len(shape) == 1 and n.attrs["kind"] == "norms"
        for start in range(0, flat.size, _CHUNK):
            z = rng.standard_normal(min(_CHUNK, flat.size - start))
            v = (1.0 - offset) + 0.1 * z if norm else scale * z
            flat[start : start + z.size] = v.astype(np.float32)
        yield n, out


def random_weights(graph: Graph, seed: int = 0, scale: float = 0.02) -> dict[str, np.ndarray]:
    """Every param of `graph` as `random_tensors` draws it, in float32, by name."""
    return {n.name: arr for n, arr in random_tensors(graph, seed, "fp32", scale)}


class SafetensorsFolder:
    """The tensors of a checkpoint folder (one file or sharded with an index), read lazily.

    Nothing in the folder is trusted: every file it reads is a regular file inside the folder
    (`graphllm.models.folder`), and every header is validated whole before any tensor is read
    (`_read_header`), so a damaged or hostile checkpoint is one WeightsError line naming the file
    and the tensor, never a read outside a file's data section or of another file.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise WeightsError(f"weights folder {self.folder} does not exist")
        note_input(self.folder)  # no output of this run may replace a file in it
        self._where: dict[str, _Tensor] = {}
        if os.path.lexists(self.folder / INDEX):
            self._read_sharded()
        else:
            self._read_unsharded()

    def _read_unsharded(self) -> None:
        names = sorted(p.name for p in self.folder.glob("*.safetensors"))
        if not names:
            raise WeightsError(f"no .safetensors files in {self.folder}")
        for rel in names:
            path = folder_member(self.folder, rel, str(self.folder), WeightsError)
            for name, tensor in _read_header(path, rel).items():
                if name in self._where:
                    other = self._where[name].rel
                    raise WeightsError(f"tensor {shown(name)} is in both {other} and {rel}")
                self._where[name] = tensor

    def _read_sharded(self) -> None:
        """The shards the index names, each holding exactly the tensors the index maps to it."""
        wmap = _weight_map(folder_member(self.folder, INDEX, INDEX, WeightsError))
        shards: dict[Path, str] = {}  # resolved file -> its name in the index
        where: dict[str, Path] = {}  # tensor -> its resolved file
        checked: dict[str, Path] = {}  # the index's file name -> its resolved file
        for name, rel in wmap.items():
            if rel not in checked:  # a large index names a few shards many thousand times
                what = f"{INDEX}: weight_map[{shown(name)}]"
                checked[rel] = folder_member(self.folder, rel, what, WeightsError)
            where[name] = checked[rel]
            shards.setdefault(checked[rel], rel)
        for path, rel in shards.items():
            for name, tensor in _read_header(path, rel).items():
                if where.get(name) != path:
                    mapped = shards[where[name]] if name in where else None
                    says = f"maps it to {mapped}" if mapped else "does not list it"
                    raise WeightsError(f"{rel}: holds tensor {shown(name)}, but {INDEX} {says}")
                self._where[name] = tensor
        for name, path in where.items():
            if name not in self._where:
                raise WeightsError(
                    f"{INDEX} maps tensor {shown(name)} to {shards[path]}, which does not hold it"
                )

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def names(self) -> list[str]:
        return list(self._where)

    def read(self, name: str) -> np.ndarray:
        """One tensor as float32."""
        if name not in self._where:
            raise WeightsError(f"checkpoint {self.folder} has no tensor {name}")
        t = self._where[name]
        if t.dtype not in _READ:
            raise WeightsError(
                f"{t.rel}: tensor {shown(name)} is {t.dtype}, a quantized form that means "
                "nothing without the scales a quantization_config declares, and config.json "
                "declares none for it"
            )
        return self.stored(name).astype(np.float32)

    def dtype_shape(self, name: str) -> tuple[str, tuple[int, ...]]:
        """A tensor's safetensors dtype and shape, from its validated header entry."""
        t = self._where[name]
        return t.dtype, t.shape

    def stored(self, name: str) -> np.ndarray:
        """One tensor as the file stores it (a read-only view of its bytes): the quantized
        dtypes as uint8 codes (U8, F8_E8M0) or ml_dtypes' float8_e4m3fn (F8_E4M3)."""
        t = self._where[name]
        try:
            size = os.stat(t.path).st_size
        except OSError as e:
            raise WeightsError(f"{t.rel}: cannot be read: {e.strerror}") from None
        if size != t.file_size:  # a mapping past the end of a file would kill the process
            raise WeightsError(f"{t.rel}: changed size while it was being read")
        dt = _STORED[t.dtype]
        if t.nbytes == 0:
            return np.zeros(t.shape, dt)
        mm = np.memmap(t.path, dtype=np.uint8, mode="r", offset=t.start, shape=(t.nbytes,))
        return mm.view(dt).reshape(t.shape)


INDEX = "model.safetensors.index.json"

# The safetensors format's dtypes: the Dtype enum of huggingface/safetensors
# (safetensors/src/tensor.rs). graphllm reads the plain floating-point and integer ones below as
# values; the others hold quantized or packed data that only means something with scales beside
# it (FP8, FP4, FP6, MX), or are not weights (BOOL, complex): refused by name, not misread.
# The quantized ones a quantization_config explains (FP8 values and E8M0 scales, MXFP4's
# packed bytes) are read as stored (`SafetensorsFolder.stored`) for graphllm.build.quantized.
_READ = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F64": np.dtype("<f8"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
}
_QUANTIZED = {
    "U8": np.dtype(np.uint8),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E8M0": np.dtype(np.uint8),  # exponent codes, turned into powers of two by dequantize
}
_STORED = _READ | _QUANTIZED
_NOT_READ = {
    "BOOL", "I8", "I16", "U16", "U32", "U64", "C64",
    "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F4", "F6_E2M3", "F6_E3M2",
}  # fmt: skip

# The safetensors library's own cap on a header (MAX_HEADER_SIZE, 100 MB): a header takes about
# 100 bytes a tensor, so the largest real checkpoints stay far below it, and parsing more JSON
# than that is a memory and time sink, not a checkpoint.
MAX_HEADER_BYTES = 100_000_000
# numpy's limit on an array's dimensions (NPY_MAXDIMS in numpy 2)
MAX_DIMS = 64
_FIELDS = ("dtype", "shape", "data_offsets")


@dataclass(frozen=True)
class _Tensor:
    """Where a validated tensor lies: its file (resolved), the file's name in the folder, the
    file's size when validated, the absolute offset of its bytes, and what they hold."""

    path: Path
    rel: str
    file_size: int
    start: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {shown(key)}")  # the format disallows them
        out[key] = value
    return out


def _parse_json(raw: bytes, what: str) -> object:
    """UTF-8 JSON without duplicate keys; every failure, deep nesting included, one line."""
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except UnicodeDecodeError:
        raise WeightsError(f"{what} is not UTF-8 text") from None
    except RecursionError:
        raise WeightsError(f"{what} is JSON nested too deeply") from None
    except MemoryError:  # its size is capped, but the objects JSON makes of it may not fit
        raise WeightsError(f"{what} ({len(raw):,} bytes) does not fit in memory as JSON") from None
    except ValueError as e:
        raise WeightsError(f"{what} is not valid JSON: {shown(str(e), 120)}") from None


def _open_regular(path: Path, rel: str) -> BinaryIO:
    """`path` opened for reading; refused when it is not (or no longer) a regular file. Opened
    without blocking, so that a FIFO swapped in after the check cannot hang the run."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise WeightsError(f"{rel}: cannot be read: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise WeightsError(f"{rel}: is not a regular file")
    return os.fdopen(fd, "rb")


def _weight_map(path: Path) -> dict[str, str]:
    """The index's weight_map (tensor name -> shard file name), validated as such."""
    with _open_regular(path, INDEX) as f:
        raw = f.read(MAX_HEADER_BYTES + 1)
    if len(raw) > MAX_HEADER_BYTES:
        raise WeightsError(f"{INDEX} is larger than {MAX_HEADER_BYTES:,} bytes")
    index = _parse_json(raw, INDEX)
    if not isinstance(index, dict) or "weight_map" not in index:
        raise WeightsError(f"{INDEX}: not a safetensors index (a mapping with a weight_map)")
    wmap = index["weight_map"]
    if not isinstance(wmap, dict) or not wmap:
        raise WeightsError(f"{INDEX}: weight_map must be a non-empty mapping of tensor to file")
    for name, rel in wmap.items():
        if not isinstance(rel, str):
            raise WeightsError(
                f"{INDEX}: weight_map[{shown(name)}] is {shown(rel)}, not a file name"
            )
    return wmap


def _read_header(path: Path, rel: str) -> dict[str, _Tensor]:
    """Every tensor of one safetensors file, validated against the format before any is read:
    an 8-byte little-endian header length, that many bytes of JSON, then the data section."""
    with _open_regular(path, rel) as f:
        file_size = os.fstat(f.fileno()).st_size
        prefix = f.read(8)
        if len(prefix) != 8:
            raise WeightsError(
                f"{rel}: not a safetensors file (shorter than its 8-byte header length)"
            )
        n = struct.unpack("<Q", prefix)[0]
        if n > MAX_HEADER_BYTES:
            raise WeightsError(
                f"{rel}: header length {n:,} is past the format's cap of {MAX_HEADER_BYTES:,} bytes"
            )
        if 8 + n > file_size:
            raise WeightsError(
                f"{rel}: header length {n:,} is past the end of the file ({file_size:,} bytes)"
            )
        raw = f.read(n)
    header = _parse_json(raw, f"{rel}: header")
    if not isinstance(header, dict):
        raise WeightsError(f"{rel}: header is a JSON {_kind(header)}, not a mapping of tensors")
    _check_metadata(header.pop("__metadata__", {}), rel)
    base, data_size = 8 + n, file_size - 8 - n
    tensors = {
        name: _tensor(path, rel, file_size, base, data_size, name, info)
        for name, info in header.items()
    }
    _check_layout(rel, tensors, base, data_size)
    return tensors


def _kind(value: object) -> str:
    names = {dict: "mapping", list: "list", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def _check_metadata(meta: object, rel: str) -> None:
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise WeightsError(f"{rel}: __metadata__ must be a mapping of strings to strings")


def _tensor(
    path: Path, rel: str, file_size: int, base: int, data_size: int, name: str, info: object
) -> _Tensor:
    """One header entry, checked: exactly dtype, shape and data_offsets; a dtype graphllm reads;
    a shape of non-negative ints; offsets inside the data section that size dtype x shape."""
    where = f"{rel}: tensor {shown(name)}"
    if not isinstance(info, dict):
        raise WeightsError(f"{where}: entry is a JSON {_kind(info)}, not a mapping")
    for key in _FIELDS:
        if key not in info:
            raise WeightsError(f"{where}: entry has no {key}")
    extra = [k for k in info if k not in _FIELDS]
    if extra:
        raise WeightsError(f"{where}: unexpected field {shown(extra[0])} in its entry")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    _check_dtype(where, dtype)
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(map(_is_count, shape)):
        raise WeightsError(
            f"{where}: shape {shown(shape)} is not a list of at most {MAX_DIMS} non-negative ints"
        )
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_count, offsets)):
        raise WeightsError(f"{where}: data_offsets {shown(offsets)} are not two non-negative ints")
    begin, end = offsets
    if not begin <= end <= data_size:
        raise WeightsError(
            f"{where}: data_offsets {shown(offsets)} are not inside the data section "
            f"({data_size:,} bytes; is the file truncated?)"
        )
    nbytes = math.prod(shape) * _STORED[dtype].itemsize
    if end - begin != nbytes:
        # a JSON int may have thousands of digits: a size past the data section is not printed
        need = f"{nbytes:,} bytes" if nbytes <= data_size else "more than the data section"
        raise WeightsError(
            f"{where}: data_offsets span {end - begin:,} bytes; {dtype} x {shown(shape)} "
            f"needs {need}"
        )
    return _Tensor(path, rel, file_size, base + begin, nbytes, dtype, tuple(shape))


def _is_count(x: object) -> bool:
    return type(x) is int and x >= 0  # not bool, not float


def _check_dtype(where: str, dtype: object) -> None:
    if isinstance(dtype, str) and dtype in _STORED:
        return
    reads = ", ".join(_STORED)
    if isinstance(dtype, str) and dtype in _NOT_READ:
        raise WeightsError(f"{where}: dtype {dtype} is not read by graphllm (it reads {reads})")
    raise WeightsError(f"{where}: dtype {shown(dtype)} is not a safetensors dtype ({reads})")


def _check_layout(rel: str, tensors: dict[str, _Tensor], base: int, data_size: int) -> None:
    """No two tensors share a byte, and the data section has no byte outside a tensor: the
    format's rule "the byte buffer needs to be entirely indexed, and cannot contain holes"
    (huggingface/safetensors README, Format notes), which the reference reader enforces."""
    pos, last = 0, None
    for name, t in sorted(tensors.items(), key=lambda kv: (kv[1].start, kv[1].nbytes)):
        begin = t.start - base
        if begin < pos:
            raise WeightsError(
                f"{rel}: tensor {shown(name)} overlaps tensor {shown(last)} (bytes {begin:,} "
                f"to {pos:,} of the data section)"
            )
        if begin > pos:
            raise WeightsError(
                f"{rel}: bytes {pos:,} to {begin:,} of the data section belong to no tensor"
            )
        pos, last = begin + t.nbytes, name
    if pos != data_size:
        raise WeightsError(
            f"{rel}: the data section has {data_size - pos:,} bytes past its last tensor"
        )


# the methods whose stored tensors a traced graph reads (tested on tiny checkpoints); MXFP4's
# experts transformers holds transposed from the stored rows, which the reader does not undo
TRACED_READS = ("fp8", "gptq", "awq")


def checkpoint_tensors(
    graph: Graph, folder: str | Path, dtype: str = "fp32", packed: Collection[str] = ()
) -> Iterator[tuple[Node, Any]]:
    """(param node, array) one at a time, read from a safetensors folder by the graph's names;
    stacked experts gathered per expert; a param the config's quantization_config stores
    quantized read from its stored tensors and dequantized (graphllm.build.quantized). The
    folder is validated and every tensor looked up and checked (dtype, shape, the scales and
    zero points beside it) when this is called, before the caller starts writing anything; the
    tensors are read as the iterator is consumed. The GPTQ/AWQ matrices named in `packed` come
    as their integers (`graphllm.build.quantized.IntGroups`), not dequantized."""
    ckpt = SafetensorsFolder(folder)
    cfg = graph.meta.get("config")
    text_decoder = cfg is not None and bool(cfg.text_decoder_of)
    # an export graph computes dequantized (no quantization in its config) but keeps how the
    # checkpoint stores its weights
    if "checkpoint_quantization" in graph.meta:
        quant = graph.meta["checkpoint_quantization"]
    else:
        quant = cfg.quantization if cfg is not None else None
    if text_decoder:
        unmodelled_tensors(ckpt, cfg.text_decoder_of)  # type: ignore[union-attr]
    reads: dict[str, list[Read]] = {}
    # a traced graph's: each param's format, read from what transformers' quantizer converts
    # (graphllm.trace.stored), and the pieces a stack is stored as
    formats = graph.meta.get("checkpoint_formats")
    for n in graph.params():
        fmt, parts = (
            (None, None) if quant is None else (quant.format_of(n.name, n.attrs["kind"]), None)
        )
        if formats is not None:
            fmt, parts = formats.get(n.name, (None, None))
            if fmt is not None and fmt.method not in TRACED_READS:
                raise WeightsError(
                    f"{n.name}: a traced model's {fmt.method} weights are not read from a "
                    f"checkpoint yet ({', '.join(TRACED_READS)} are); its analysis needs none"
                )
        want = _shape(n)[1:] if _per_expert(n) else _piece(n, parts)
        if n.name in packed:
            if fmt is None or n.attrs.get("stacked") == "expert":
                raise WeightsError(f"{n.name}: not a GPTQ/AWQ matrix of the checkpoint")
            home = _quantized_home(n.name, fmt, ckpt, text_decoder)
            reads[n.name] = [check_int_groups(ckpt, home, fmt, want)]  # type: ignore[list-item]
            continue
        if _sliced(n):
            reads[n.name] = [_slice_read(ckpt, n, text_decoder)]
            continue
        if _transposed(n):
            reads[n.name] = [_transposed_read(ckpt, n, text_decoder)]
            continue
        reads[n.name] = [
            _plain_read(ckpt, _stored_name(name, ckpt, text_decoder), name)
            if fmt is None
            else check_quantized(ckpt, _quantized_home(name, fmt, ckpt, text_decoder), fmt, want)
            for name in _checkpoint_names(n)
        ]
    return _read_params(graph, reads, dtype, packed)


# where a multimodal checkpoint keeps its text decoder's tensors, by the graph's name prefix:
# transformers 5 saves model.language_model.*, transformers 4 language_model.model.* (and the
# LM head as language_model.lm_head.*)
TEXT_DECODER_HOMES = (
    ("model.", ("model.language_model.", "language_model.model.")),
    ("lm_head.", ("language_model.lm_head.",)),
)


def unmodelled_tensors(ckpt: SafetensorsFolder | str | Path, model_type: str) -> list[str]:
    """The tensors of a multimodal checkpoint (`model_type`, e.g. llama4) that belong to the
    parts graphllm does not model (its vision tower and projector, MULTIMODAL[model_type].unused):
    known, and left unread. A tensor of neither those parts nor the text decoder (which the
    graph's names and TEXT_DECODER_HOMES place) is a part graphllm does not know: refused, so
    that no tensor of such a checkpoint goes unread without a reason."""
    if not isinstance(ckpt, SafetensorsFolder):
        ckpt = SafetensorsFolder(ckpt)
    parts = MULTIMODAL[model_type].unused if model_type in MULTIMODAL else ()
    decoder = ("model.", "lm_head.", *(home for _, homes in TEXT_DECODER_HOMES for home in homes))
    unused, unknown = [], []
    for name in ckpt.names():
        if name.startswith(parts):
            unused.append(name)
        elif not name.startswith(decoder):
            unknown.append(name)
    if unknown:
        more = f" and {len(unknown) - 1:,} more" if len(unknown) > 1 else ""
        known = ", ".join(f"{p}*" for p in parts)
        raise WeightsError(
            f"{ckpt.folder}: tensor {shown(sorted(unknown)[0])}{more} belongs to no part of a "
            f"{model_type} model graphllm knows (its text decoder, or the unmodelled {known})"
        )
    return sorted(unused)


def _stored_name(
    name: str, ckpt: SafetensorsFolder, text_decoder: bool, probe: str | None = None
) -> str:
    """The checkpoint's name of the graph's tensor `name`: itself, or for the text decoder of a
    multimodal model the same tensor where that model keeps it. `probe` is the stored tensor
    looked for when it is not `name` itself (a quantized matrix's first stored tensor)."""
    look = probe if probe is not None else name
    if look in ckpt or not text_decoder:
        return name
    for prefix, homes in TEXT_DECODER_HOMES:
        if name.startswith(prefix):
            for home in homes:
                moved = home + name[len(prefix) :]
                if home + look[len(prefix) :] in ckpt:
                    return moved
    return name


def _quantized_home(
    name: str, fmt: QuantFormat, ckpt: SafetensorsFolder, text_decoder: bool
) -> str:
    return _stored_name(name, ckpt, text_decoder, stored_names(name, fmt)[0])


def _plain_read(ckpt: SafetensorsFolder, stored: str, name: str) -> Read:
    if stored not in ckpt:
        raise WeightsError(f"checkpoint {ckpt.folder} has no tensor {name}")
    if ckpt.dtype_shape(stored)[0] not in _READ:
        ckpt.read(stored)  # its refusal names the quantized dtype
    return lambda: ckpt.read(stored)


def _sliced(n: Node) -> bool:
    """A traced model's tensor its checkpoint keeps joined with others (graphllm.trace.hf's
    `slices`), or through a conversion graphllm does not read (refused here, by name)."""
    how = n.attrs.get("stored_as")
    if isinstance(how, dict) and "unread" in how:
        raise WeightsError(
            f"{n.name}: its checkpoint stores it through transformers' {how['unread']} "
            "conversion, which graphllm does not read"
        )
    return isinstance(how, dict) and "slice_of" in how


def _transposed(n: Node) -> bool:
    """A traced model's tensor its checkpoint stores transposed (graphllm.trace.hf's
    `transposed`)."""
    how = n.attrs.get("stored_as")
    return isinstance(how, dict) and "transpose_of" in how


def _transposed_read(ckpt: SafetensorsFolder, n: Node, text_decoder: bool) -> Read:
    """The stored tensor with its two axes swapped back, as transformers' Transpose does on
    loading; its shape checked first."""
    how = n.attrs["stored_as"]
    stored, (a, b) = _stored_name(how["transpose_of"], ckpt, text_decoder), how["axes"]
    _plain_read(ckpt, stored, how["transpose_of"])  # there, and of a dtype read as values
    have, want = ckpt.dtype_shape(stored)[1], list(_shape(n))
    want[a], want[b] = want[b], want[a]
    if tuple(have) != tuple(want):
        raise WeightsError(
            f"{shown(stored)}: checkpoint shape {tuple(have)}, where {n.name} transposed on "
            f"axes {a} and {b} is {tuple(want)}"
        )
    return lambda: np.ascontiguousarray(np.swapaxes(ckpt.stored(stored), a, b), np.float32)


def _slice_read(ckpt: SafetensorsFolder, n: Node, text_decoder: bool) -> Read:
    """The slice of a joined tensor (q, k and v in one query_key_value) that transformers'
    converter splits off for `n` on loading; the joined tensor's shape checked first."""
    how = n.attrs["stored_as"]
    stored, axis = _stored_name(how["slice_of"], ckpt, text_decoder), how["axis"]
    _plain_read(ckpt, stored, how["slice_of"])  # there, and of a dtype read as values
    have = ckpt.dtype_shape(stored)[1]
    want = list(_shape(n))
    want[axis] = how["size"]
    if tuple(have) != tuple(want):
        raise WeightsError(
            f"{shown(stored)}: checkpoint shape {tuple(have)}, where the tensors transformers "
            f"splits it into on axis {axis} ({n.name} among them) make {tuple(want)}"
        )
    part = (slice(None),) * axis + (slice(how["start"], how["stop"]),)
    return lambda: ckpt.stored(stored)[part].astype(np.float32)


def _read_params(
    graph: Graph, reads: dict[str, list[Read]], dtype: str, packed: Collection[str]
) -> Iterator[tuple[Node, Any]]:
    for n in graph.params():
        if n.name in packed:
            yield n, reads[n.name][0]()
            continue
        shape, names = _shape(n), _checkpoint_names(n)
        if isinstance(n.attrs.get("stored_as"), dict) and "parts" in n.attrs["stored_as"]:
            yield n, _assembled(n, shape, reads[n.name], _DTYPES[dtype])
            continue
        stacked = _per_expert(n)
        want = shape[1:] if stacked else shape
        out = np.empty(shape, _DTYPES[dtype]) if stacked else None
        for e, (name, read) in enumerate(zip(names, reads[n.name], strict=True)):
            arr = read()
            if arr.shape != want:
                raise WeightsError(f"{name}: checkpoint shape {arr.shape}, graph expects {want}")
            if stacked:
                out[e] = arr  # type: ignore[index]
            else:  # the read made a fresh float32 array: no second copy in fp32
                out = arr.astype(_DTYPES[dtype], copy=False)
            del arr
        yield n, out


def _assembled(n: Node, shape: tuple[int, ...], reads: list[Read], dtype: Any) -> np.ndarray:
    """A traced model's tensor its checkpoint stores in pieces (`stored_as`: the pieces of each
    source pattern, stacked on one axis, the stacks concatenated on another), put together as
    transformers' converter does on loading."""
    how = n.attrs["stored_as"]
    it = iter(reads)
    if how["stack"] is None:  # one piece a part (OLMo-Hybrid's q, k and v convs)
        stacks = [next(it)() for _ in how["parts"]]
    else:
        stacks = [np.stack([next(it)() for _ in g], axis=how["stack"]) for g in how["parts"]]
    out = stacks[0] if how["concat"] is None else np.concatenate(stacks, axis=how["concat"])
    if out.shape != shape:
        raise WeightsError(
            f"{n.name}: its checkpoint pieces make {out.shape}, graph expects {shape}"
        )
    return out.astype(dtype, copy=False)


def _piece(n: Node, parts: tuple[int, int] | None) -> tuple[int, ...]:
    """The shape of one stored piece of a traced param (`stored_as`'s: its stack axis gone,
    its concat axis cut in `parts`' equal pieces); the param's own shape where it is stored
    whole."""
    shape = list(_shape(n))
    how = n.attrs.get("stored_as")
    if not isinstance(how, dict) or "parts" not in how:
        return tuple(shape)
    if parts is not None:
        axis, count = parts
        shape[axis] //= count
    if how.get("stack") is not None:
        del shape[how["stack"]]
    return tuple(shape)


def _per_expert(n: Node) -> bool:
    """Stacked experts the checkpoint keeps one tensor per expert (`*` in the name); gpt-oss's
    hold every expert in one tensor, read whole."""
    return n.attrs.get("stacked") == "expert" and "*" in n.name


def _checkpoint_names(n: Node) -> list[str]:
    stored = n.attrs.get("stored_as")
    if isinstance(stored, dict) and "slice_of" in stored:  # ... or joined with others
        return [stored["slice_of"]]
    if isinstance(stored, dict) and "transpose_of" in stored:  # ... or transposed
        return [stored["transpose_of"]]
    if isinstance(stored, dict):  # a traced model's tensor its checkpoints store in pieces
        return [name for group in stored["parts"] for name in group]
    if stored is not None:  # ... or renamed
        return [stored]
    if _per_expert(n):
        return [n.name.replace("*", str(e)) for e in range(_shape(n)[0])]
    return [n.name]


def load_weights(graph: Graph, folder: str | Path) -> dict[str, np.ndarray]:
    """Every param of `graph` as `checkpoint_tensors` reads it, in float32, by name."""
    return dict((n.name, arr) for n, arr in checkpoint_tensors(graph, folder))
