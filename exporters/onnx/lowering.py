"""The lowering context: what turns one Graph into ONNX nodes, constants and weight initializers.

An op set (`OpSet`) is a lowering per op-table row, keyed by the row's name (the decomposed rows
in graphllm.exporters.onnx.decomposed, registered with `lowers`), plus fused regions it finds
first. `lower` walks the graph once and returns the ModelProto without weight data, and the
initializers it reads.
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graphllm.errors import ConfigError, GraphllmError
from graphllm.exporters.onnx.nbits import MS_DOMAIN, Quantization
from graphllm.ir import Dim, Graph, Node, Ref, TensorType
from graphllm.models.quantization import QuantFormat

OPSET = 23
EXPORT_DTYPES = ("fp32", "fp16")
# the IR's symbolic dims -> ONNX dim names (onnxruntime-genai's spelling)
DIM_NAMES = {
    "B": "batch",
    "T": "sequence_length",
    "P": "past_sequence_length",
    "S": "total_sequence_length",
    "C": "expert_slots",
}
ONNX_TYPES = {
    "fp64": TensorProto.DOUBLE,
    "fp32": TensorProto.FLOAT,
    "fp16": TensorProto.FLOAT16,
    "int64": TensorProto.INT64,
    "int32": TensorProto.INT32,
    "uint8": TensorProto.UINT8,
    "bool": TensorProto.BOOL,
}
NP_TYPES = {
    "fp64": np.float64,
    "fp32": np.float32,
    "fp16": np.float16,
    "int64": np.int64,
    "int32": np.int32,
    "uint8": np.uint8,
    "bool": np.bool_,
}
# protobuf cannot serialise a message of 2 GiB; leave room for the graph itself
PROTO_LIMIT = 2**31 - 2**26
ALIGN = 4096  # external tensors start on page boundaries, so onnxruntime can map them
INT64_MAX = np.iinfo(np.int64).max


# -- what a lowering produces besides nodes --------------------------------------------------
@dataclass(frozen=True)
class Initializer:
    """A weight of the exported model: a checkpoint tensor as it is (`make` None), or one made
    from some (transposed, packed, offset)."""

    name: str
    sources: tuple[str, ...]  # param names; none for a table computed at export
    shape: tuple[int, ...]
    make: Callable[..., np.ndarray] | None = None
    dtype: str | None = None  # None: the export's float dtype; "uint8": quantized values
    # made by MatMulNBits from a GPTQ/AWQ source's integers as they are (IntGroups), not floats
    takes_stored: bool = False


@dataclass(frozen=True)
class Region:
    """IR nodes that one fused lowering replaces together, in any order; the region is emitted
    where its last node in graph order is. Only `outputs` may be read outside the region."""

    nodes: tuple[str, ...]
    outputs: tuple[Ref, ...]
    emit: Callable[[Lowering, dict[Ref, str]], None]


class LoweringError(GraphllmError):
    """A model that an op set cannot express (said in one line)."""


StoredFormat = Callable[[str], QuantFormat | None]


# -- the lowering context -------------------------------------------------------------------
class Lowering:
    """ONNX nodes and constants for one Graph; what each op lowering writes into."""

    def __init__(
        self,
        graph: Graph,
        dtype: str,
        quantization: Quantization | None = None,
        stored_format: StoredFormat | None = None,
    ) -> None:
        self.graph = graph
        self.dtype = dtype  # activations and KV cache
        self.quantization = quantization  # linear weights as MatMulNBits, or None: float
        # a param's GPTQ/AWQ format where MatMulNBits takes the checkpoint's integers as stored
        self.stored_format: StoredFormat = stored_format or (lambda param: None)
        # param -> the zero points of the MatMulNBits weight made from it (quantize.ZERO_POINTS)
        self.nbits_stored: dict[str, str] = {}
        self.nodes: list[onnx.NodeProto] = []
        self.constants: list[TensorProto] = []
        self._const_names: dict[tuple, str] = {}
        self._node_names: set[str] = set()
        self._shared: dict[Any, Any] = {}
        self.initializers: dict[str, Initializer] = {}  # weights made from params, or computed
        # constant tables computed at export (the ort lowering's rotary caches): name -> bytes,
        # and the positions they cover (a run past them is refused before onnxruntime sees it)
        self.tables: dict[str, int] = {}
        self.table_positions: int | None = None
        # a segment of one rank's program (graphllm.exporters.onnx.segment) gives each
        # node the rank's block offsets of its split axes, as the SPMD interpreter gives the
        # numpy impls attrs['shard']: letter -> (first index held, the whole axis's size)
        self.offsets: Callable[[Node], dict[str, tuple[int, int]]] = lambda node: {}
        # and a value of its own with the same axis, where it has no model input to ask the
        # batch or a length of: (model input, axis) -> (tensor, axis)
        self.dim_sources: dict[tuple[str, int], tuple[str, int]] = {}
        # a rank holding block k of `blocks` of the new tokens (cp, ep on the tokens): the
        # queries' cache index starts k blocks into the call's, not at its first position
        self.query_block: tuple[int, int] = (0, 1)

    # emitting
    def _unique(self, name: str) -> str:
        out, i = name, 1
        while out in self._node_names:
            i += 1
            out = f"{name}_{i}"
        self._node_names.add(out)
        return out

    def op(self, op_type: str, inputs: list[str], scope: str, n_out: int = 1, **attrs: Any) -> Any:
        """A helper node `<scope>/<op_type>`; returns its output name (or names, n_out > 1)."""
        name = self._unique(f"{scope}/{op_type}")
        outs = [name if i == 0 else f"{name}:{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    def final(self, op_type: str, inputs: list[str], node: Node, outs: list[str], **attrs) -> None:
        """The node that produces the IR node's value(s): it carries the IR node's name."""
        self.nodes.append(
            helper.make_node(op_type, inputs, outs, name=self._unique(node.name), **attrs)
        )

    def final_from_fp32(self, y: str, node: Node, outs: list[str]) -> None:
        """y, computed in fp32, as the IR node's output at the export's dtype."""
        if self.dtype == "fp32":
            self.final("Identity", [y], node, outs)
        else:
            self.final("Cast", [y], node, outs, to=ONNX_TYPES[self.dtype])

    def named(self, op_type: str, inputs: list[str], outs: list[str], name: str, **attrs) -> None:
        """A node that a fused region emits, named after the region's scope."""
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self._unique(name), **attrs))

    def const(self, value: Any, dtype: str = "int64", hint: str = "const") -> str:
        """A small constant initializer, shared between all users of the same value."""
        arr = np.asarray(value, dtype=NP_TYPES.get(dtype, dtype))
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._const_names:
            name = f"const.{hint}.{len(self._const_names)}"
            self.constants.append(numpy_helper.from_array(arr, name))
            self._const_names[key] = name
        return self._const_names[key]

    def table(self, name: str, value: np.ndarray, positions: int) -> str:
        """A named table computed at export, one row per position below `positions`: written
        with the weights (a graph input like them under `weights_as_inputs`) and recorded
        (graphllm.tables), so what predicts the file's storage counts it."""
        if name not in self.initializers:
            self.initializers[name] = Initializer(name, (), value.shape, lambda: value)
            self.tables[name] = int(value.nbytes)
            prev = self.table_positions
            self.table_positions = positions if prev is None else min(prev, positions)
        return name

    def cast(self, x: str, src: str, dst: str, scope: str) -> str:
        return x if src == dst else self.op("Cast", [x], scope, to=ONNX_TYPES[dst])

    def shared(self, key: Any, make: Callable[[], Any]) -> Any:
        """Values several nodes use (rotary tables, masks, MoE slots) are computed once."""
        if key not in self._shared:
            self._shared[key] = make()
        return self._shared[key]

    def dim(self, tensor: str, axis: int, scope: str) -> str:
        """Size of one axis of a tensor, as a 1-element int64 vector."""
        tensor, axis = self.dim_sources.get((tensor, axis), (tensor, axis))
        return self.shared(
            ("dim", tensor, axis),
            lambda: self.op("Shape", [tensor], scope, start=axis, end=axis + 1),
        )

    def scalar(self, vec: str, scope: str) -> str:
        return self.shared(("scalar", vec), lambda: self.op("Squeeze", [vec], scope))

    # weights the lowering stores otherwise than the checkpoint does
    def initializer(
        self,
        name: str,
        sources: tuple[str, ...],
        shape: tuple[int, ...],
        make: Callable[..., np.ndarray],
        dtype: str | None = None,
        takes_stored: bool = False,
    ) -> str:
        """A weight initializer made by `make` from the named params."""
        if name not in self.initializers:
            init = Initializer(name, sources, tuple(shape), make, dtype, takes_stored)
            self.initializers[name] = init
        return name

    def param_shape(self, param: str) -> tuple[int, ...]:
        return static_shape(self.graph[param])

    def transposed(self, param: str) -> str:
        """A weight (out, in), or stacked experts (E, out, in), stored as (in, out)."""
        shape = self.param_shape(param)
        perm = (*range(len(shape) - 2), len(shape) - 1, len(shape) - 2)
        t_shape = tuple(shape[i] for i in perm)
        return self.initializer(f"{param}.T", (param,), t_shape, lambda w: w.transpose(perm))


Lower = Callable[[Lowering, Node, list[str], list[str]], None]
DECOMPOSED: dict[str, Lower] = {}
# op name -> its lowering, for rows no fixed name lists (graphllm.exporters.onnx.traced)
FALLBACKS: list[Callable[[str], Lower | None]] = []


def lowers(*ops: str) -> Callable[[Lower], Lower]:
    """Register a function as the decomposed lowering of the named op-table rows."""

    def deco(fn: Lower) -> Lower:
        for op in ops:
            DECOMPOSED[op] = fn
        return fn

    return deco


def axis_size(node: Node, letter: str) -> int:
    """The size of the axis that attrs['axes'] gives `letter` (a concrete dim)."""
    return int(node.attrs["axes"][letter].size)


@dataclass(frozen=True)
class OpSet:
    """One ONNX lowering: a lowering per op row (the decomposed one where it has none) and the
    fused regions it finds first; `regions` raises LoweringError for a model it cannot express."""

    name: str
    rows: dict[str, Lower]
    regions: Callable[[Graph], list[Region]] = lambda graph: []
    domains: tuple[tuple[str, int], ...] = (("", OPSET),)

    def row(self, op: str) -> Lower | None:
        found = self.rows.get(op, DECOMPOSED.get(op))
        for fallback in FALLBACKS:  # rows named by pattern (a traced model's generic rows)
            if found is not None:
                break
            found = fallback(op)
        return found


LOWERINGS: dict[str, OpSet] = {"decomposed": OpSet("decomposed", DECOMPOSED)}


# -- graph -> ModelProto ---------------------------------------------------------------------
def _onnx_dims(t: TensorType) -> list[int | str]:
    return [int(d.size) if d.size is not None else DIM_NAMES.get(d.name, d.name) for d in t.dims]


def _value_info(name: str, t: TensorType) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, ONNX_TYPES[t.dtype], _onnx_dims(t))


def static_shape(node: Node) -> tuple[int, ...]:
    return tuple(int(d.size) for d in node.out.dims)  # type: ignore[arg-type]


def lower(
    graph: Graph,
    ops: str = "decomposed",
    weights_as_inputs: bool = False,
    quantize: Quantization | None = None,
    stored_format: StoredFormat | None = None,
) -> tuple[onnx.ModelProto, list[Initializer]]:
    """The graph as a ModelProto without weight data, and the weight initializers it reads
    (graph inputs with `weights_as_inputs`), in the order the params are read; with `quantize`,
    its 2-D linear weights as MatMulNBits (graphllm.exporters.onnx.quantize), made from the
    checkpoint's packed integers for the params `stored_format` gives a GPTQ/AWQ format."""
    opset = LOWERINGS[ops]
    dtype = graph.meta.get("act_dtype", "fp32")
    if dtype not in EXPORT_DTYPES:
        raise ConfigError(f"ONNX export runs in {' or '.join(EXPORT_DTYPES)}, not {dtype}")
    names = _tensor_names(graph)
    try:
        regions = placed(graph, opset.regions(graph))
    except LoweringError as e:
        raise LoweringError(f"the {ops} lowering cannot express {graph.name}: {e}") from None
    c = Lowering(graph, dtype, quantize, stored_format)
    inputs = [info for n in graph.nodes() if n.op == "input" for info in _input_infos(n)]
    value_info = lower_nodes(c, opset, graph.nodes(), names, regions)
    _drop_unread_weight_reads(c, set(graph.outputs))
    plan = _plan(graph, c)
    if weights_as_inputs:
        for init in plan:
            shape = list(init.shape)
            kind = ONNX_TYPES[init.dtype or dtype]
            inputs.append(helper.make_tensor_value_info(init.name, kind, shape))
    order = ["logits", *(k for k in graph.outputs if k != "logits")]
    outputs = [_value_info(k, graph.type_of(graph.outputs[k])) for k in order]
    g = helper.make_graph(
        c.nodes, graph.name, inputs, outputs, initializer=c.constants, value_info=value_info
    )
    domains = dict(opset.domains)
    if quantize is not None:
        domains.setdefault(MS_DOMAIN, 1)
    model = helper.make_model(
        g,
        opset_imports=[helper.make_opsetid(d, v) for d, v in domains.items()],
        producer_name="graphllm",
        producer_version=producer_version(),
        doc_string=__doc__.split("\n\n")[1],  # the I/O paragraph of this module's docstring
    )
    model.ir_version = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    if c.tables:  # constant tables the lowering computed: their bytes and the positions they hold
        model.metadata_props.add(key="graphllm.tables", value=json.dumps(c.tables))
        model.metadata_props.add(key="graphllm.positions", value=str(c.table_positions))
    if quantize is not None:  # what the bench's prediction prices: the params stored as MatMulNBits
        plain = {init.sources[0] for init in plan if init.make is None}
        stored = {k: v for k, v in c.nbits_stored.items() if k not in plain}  # not a tied table
        model.metadata_props.add(key="graphllm.stored", value=json.dumps(stored))
    return model, plan


def lower_nodes(
    c: Lowering,
    opset: OpSet,
    nodes: Iterable[Node],
    names: dict[Ref, str],
    regions: dict[str, Region | None],
) -> list[onnx.ValueInfoProto]:
    """Emit `nodes` (in graph order; sources are skipped) into `c`, a fused region where its last
    node is; the types of the values that are not graph outputs."""
    value_info = []
    for n in nodes:
        if n.op in ("input", "param"):
            continue
        if n.name not in regions:
            value_info += _lower_node(c, opset, n, names)
            continue
        region = regions[n.name]
        if region is not None:  # the region's last node: emit it here
            region.emit(c, names)
    return value_info


def _drop_unread_weight_reads(c: Lowering, outputs: set[str]) -> None:
    """Drop the Gathers of a weight that nothing reads: a view of a weight's rows that the
    linear reading it stored in the viewed order (so the checkpoint's weight is not stored
    twice)."""
    params = {p.name for p in c.graph.params()}
    read = {i for node in c.nodes for i in node.input} | outputs
    dead = [
        node
        for node in c.nodes
        if node.op_type == "Gather"
        and node.input[0] in params
        and not any(o in read for o in node.output)
    ]
    for node in dead:
        c.nodes.remove(node)


def _tensor_names(graph: Graph) -> dict[Ref, str]:
    """The ONNX name of every IR value: a graph output's name, else the node's (`:k` for its
    k-th output)."""
    out_of: dict[Ref, str] = {ref: name for name, ref in graph.outputs.items()}
    names: dict[Ref, str] = {}
    for n in graph.nodes():
        for k in range(len(n.outputs)):
            ref = Ref(n.name, k)
            names[ref] = out_of.get(ref, n.name if k == 0 else f"{n.name}:{k}")
    return names


def _input_infos(n: Node) -> list[onnx.ValueInfoProto]:
    """A graph input; `input_ids` brings the attention mask with it (so a graph that reads the
    mask itself, the hybrid layers' zeroing of padded positions, declares it once)."""
    if n.name == "attention_mask":
        return []
    odd = [d.name for d in n.out.dims if d.size is None and d.name not in DIM_NAMES]
    if odd:  # e.g. a rolled window cache (P_w) of a graph built for a long past
        raise GraphllmError(
            f"{n.name}: dims {', '.join(odd)} are not ONNX I/O dims; export a graph from "
            "build_export_graph, whose lengths stay symbolic"
        )
    out = [_value_info(n.name, n.out)]
    if n.name == "input_ids":
        mask = TensorType((n.out.dims[0], Dim("S", "key_token")), "int64")
        out.append(_value_info("attention_mask", mask))
    return out


def _lower_node(
    c: Lowering, opset: OpSet, n: Node, names: dict[Ref, str]
) -> list[onnx.ValueInfoProto]:
    """One IR node through its op set's row; the types of its outputs that are not graph
    outputs."""
    lower_fn = opset.row(n.op)
    if lower_fn is None:
        raise GraphllmError(f"{n.name}: op {n.op!r} has no {opset.name} ONNX lowering")
    outs = [names[Ref(n.name, k)] for k in range(len(n.outputs))]
    lower_fn(c, n, [names[r] for r in n.inputs], outs)
    return [_value_info(name, t) for name, t in zip(outs, n.outputs) if name not in c.graph.outputs]


def placed(graph: Graph, regions: list[Region]) -> dict[str, Region | None]:
    """Node name -> its region where that is its last node, None for its other nodes; checks
    that nothing outside a region reads a value it keeps to itself, or reads an output of the
    region before the region is emitted."""
    at = {n.name: i for i, n in enumerate(graph.nodes())}
    out: dict[str, Region | None] = {}
    for r in regions:
        inside = set(r.nodes)
        last_node = max(r.nodes, key=at.__getitem__)
        last = at[last_node]
        for name in r.nodes:
            if name in out:
                raise GraphllmError(f"{name}: in two fused regions")
            for user in graph.users(name):
                if user.name in inside:
                    continue
                read = [ref for ref in user.inputs if ref.node == name]
                if any(ref not in r.outputs for ref in read) or at[user.name] < last:
                    raise LoweringError(f"{user.name} reads {name}, inside a fused region")
            out[name] = None
        out[last_node] = r
    return out


def _plan(graph: Graph, c: Lowering) -> list[Initializer]:
    """Every initializer the nodes read: made ones, then params read as they are, in graph
    order (the order weights are read in, so a made one waits for few sources)."""
    read = {i for node in c.nodes for i in node.input}
    plan = [init for init in c.initializers.values() if init.name in read]
    plan += [
        Initializer(p.name, (p.name,), static_shape(p))
        for p in graph.params()
        if p.name in read and p.name not in c.initializers
    ]
    at = {p.name: i for i, p in enumerate(graph.params())}
    return sorted(plan, key=lambda init: max((at[s] for s in init.sources), default=-1))


def producer_version() -> str:
    """The installed graphllm's version, written into every model."""
    try:
        return importlib.metadata.version("graphllm")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return "0.0.0+source"
