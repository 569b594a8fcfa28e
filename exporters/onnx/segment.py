"""One segment of a rank's program as an ONNX model: the nodes between two cut points.

A rank's partitioned program (graphllm.passes.parallel.partition) is cut at its collectives and
send/recv nodes, which the distributed runtime carries out itself; what lies between two cuts is
plain compute, which runs on onnxruntime through the lowerings of the whole-model export.

- Inputs: each value a node of the segment reads from outside it, typed as the node that makes
  it (symbolic batch and lengths stay symbolic, so one model serves every step of a run); the
  program's own inputs keep their names (`input_ids`, `position_ids`, `past_key_values.*`). A
  mask reads `attention_mask` (batch, total_sequence_length) and `input_ids`, as in the
  whole-model export: they are inputs of every segment whose lowering reads them.
- Outputs: the values asked for, named by `tensor_name` (a graph output's name, `present.0.key`;
  else the node's name, `name:k` for its k-th output).
- Weights: the rank's own blocks, given by the caller, as initializers (made as the lowering
  stores them: transposed, packed); or, `weights_as_inputs`, each param the lowering reads as
  it is becomes a graph input of its own name, and the model holds none of the weights' bytes:
  the distributed runtime binds the rank's one copy of each weight to every session that reads
  it (tables the lowering computes at export stay initializers).
- A node whose op needs the rank's offset into a split axis (the vocab-parallel embedding) gets
  it from the rank's mesh coordinates, as the numpy impls get `shard` in the SPMD interpreter;
  a rank holding a block of the new tokens (cp, ep on T) gives the mask its block
  (`Lowering.query_block`). longrope on a block of the tokens and a block of the keys are
  refused (ConfigError), as are the fused lowerings.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper

from graphllm.errors import ConfigError, GraphllmError
from graphllm.exporters.onnx.export import planned
from graphllm.exporters.onnx.lowering import (
    EXPORT_DTYPES,
    LOWERINGS,
    ONNX_TYPES,
    PROTO_LIMIT,
    Initializer,
    Lowering,
    LoweringError,
    OpSet,
    _drop_unread_weight_reads,
    _plan,
    _value_info,
    lower_nodes,
    placed,
    producer_version,
    static_shape,
)
from graphllm.exporters.onnx.nbits import MS_DOMAIN
from graphllm.ir import TOKEN_ROLES, Dim, Graph, Node, Ref, TensorType
from graphllm.ir.opspec import bind_node, needs_positions
from graphllm.ops import COMMUNICATION, OPS
from graphllm.passes.parallel.sharding import Mesh, block_index, operand_letters
from graphllm.passes.registry import meta_result

# the lowerings a segment exports with (their rows honour Lowering.offsets)
SEGMENT_LOWERINGS = ("decomposed",)
# the names the whole-model lowerings read without an IR node in the segment reading them
_MODEL_INPUTS = ("input_ids", "attention_mask")


def tensor_name(graph: Graph, ref: Ref) -> str:
    """The ONNX name of a value at a segment's boundary: a graph output's name where it is one,
    else the node's name (`name:k` for its k-th output), as the whole-model export names it."""
    for name, out in graph.outputs.items():
        if out == ref:
            return name
    return ref.node if ref.index == 0 else f"{ref.node}:{ref.index}"


def cut_point(node: Node) -> bool:
    """Whether a node is one the distributed runtime carries out itself, never inside a
    segment: a collective, a point-to-point half (send/recv), or a rank's cut of a value its
    group holds whole (its impl, like theirs, takes the whole group's inputs)."""
    spec = OPS[node.op]
    return spec.collective or spec.category == COMMUNICATION


def rank_offsets(graph: Graph, coords: Mapping[str, int] | None) -> _Offsets:
    """The rank's block offsets, node by node, for the lowerings (`Lowering.offsets`)."""
    return _Offsets(graph, dict(coords or {}))


@dataclass
class _Offsets:
    graph: Graph
    coords: dict[str, int]
    _seen: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)
    query_block: tuple[int, int] | None = None  # (block, blocks) of a cut token axis
    query_dim: str | None = None

    def __call__(self, node: Node) -> dict[str, tuple[int, int]]:
        hit = self._seen.get(node.name)
        if hit is None:
            hit = self._seen[node.name] = self._compute(node)
        return hit

    def _token_block(self, node: Node, dim: Dim, splits: Any, blocks: int, mesh: Mesh) -> None:
        """A position-dependent op on a block of the new tokens: the lowerings read the
        queries' cache index (`Lowering.query_block`), the same block for every such op of a
        rank; a block of the keys, or longrope's whole-call choice, they cannot express."""
        block, role = (block_index(splits, mesh, self.coords), blocks), dim.role
        # the queries come first among an op's position axes (b h t s): a later one cut is a
        # block of the keys (sp's MLA prefill cuts its keys, where queries and keys are both T)
        queries = next((d for d in node.out.dims if d.role in TOKEN_ROLES), None)
        if (
            role != "token"
            or dim != queries
            or "long_inv_freq" in node.attrs
            or self.query_block not in (None, block)
        ):
            raise ConfigError(
                f"{node.name} ({node.op}) reads absolute positions on a {role} axis cut over "
                "ranks, which the onnxruntime segments do not express yet; run it with "
                "--runtime numpy"
            )
        self.query_block = block
        self.query_dim = dim.name  # the block's own axis (`T/2`), which the mask counts

    def _compute(self, node: Node) -> dict[str, tuple[int, int]]:
        plan = self.graph.meta.get("partition")
        if plan is None or not node.inputs:
            return {}
        mesh: Mesh = plan.mesh
        sig = OPS[node.op].signature
        bind_node(self.graph, node)
        out: dict[str, tuple[int, int]] = {}
        for op, r in zip(sig.inputs, node.inputs):
            sh = self.graph[r.node].meta["sharding"][r.index]
            dims = self.graph.type_of(r).dims
            for j, x in enumerate(operand_letters(op, len(sh.axes))):
                if not sh.axes[j] or x in out:
                    continue
                size = dims[j].size
                if size is None:  # a cut batch or token axis: its offset depends on the run
                    if dims[j].role in TOKEN_ROLES and needs_positions(OPS[node.op]):
                        self._token_block(node, dims[j], sh.axes[j], sh.blocks(j), mesh)
                    continue
                k = block_index(sh.axes[j], mesh, self.coords)
                out[x] = (k * int(size), int(size) * sh.blocks(j))
        return out


def export_segment(
    graph: Graph,
    nodes: Iterable[str],
    inputs: Iterable[Ref],
    outputs: Iterable[Ref],
    *,
    weights: Mapping[str, np.ndarray],
    coords: Mapping[str, int] | None = None,
    ops: str = "decomposed",
    dtype: str = "fp32",
    weights_as_inputs: bool = False,
) -> onnx.ModelProto:
    """The nodes `nodes` of `graph` (one rank's program, or any graph) as an ONNX model.

    `inputs` are the values the nodes read from outside the segment (the program's inputs
    among them), `outputs` the values it hands on; `weights` holds the rank's block of every
    param the nodes read (each of the param's shape in `graph`), `coords` the rank's mesh
    coordinates (`{"tp": 1}`), which fix its offsets into split axes. `ops` is the lowering:
    decomposed (SEGMENT_LOWERINGS); a fused region that a segment cuts would be lowered node by
    node, but the fused op sets are refused until their regions take a rank's program.
    `weights_as_inputs`: the params read as they are become graph inputs (after the boundary
    values), their blocks in `weights` checked for shape only.
    """
    _check_lowering(ops, dtype)
    members = [graph[name] for name in dict.fromkeys(nodes)]
    inside = {n.name for n in members}
    ins, outs = list(dict.fromkeys(inputs)), list(dict.fromkeys(outputs))
    _check_boundary(graph, members, inside, ins, outs)
    at = {n.name: i for i, n in enumerate(graph.nodes())}
    members.sort(key=lambda n: at[n.name])
    opset = LOWERINGS[ops]
    names = {ref: tensor_name(graph, ref) for n in members for ref in (*n.inputs, *_refs(n))}
    regions = _whole_regions(graph, opset, inside, set(outs))
    c = _rank_lowering(graph, dtype, members, ins, names, coords)
    value_info = lower_nodes(c, opset, members, names, regions)
    out_names = {names[r] for r in outs}
    _drop_unread_weight_reads(c, out_names)
    _all_keys_held(c, ins, names)
    inputs_info = _inputs(graph, c, ins, names)
    value_info = [v for v in value_info if v.name not in out_names]
    plan = _plan(graph, c)
    if weights_as_inputs:  # a param read as it is: an input; what is made from one stays made
        fed = [i for i in plan if i.make is None and i.sources == (i.name,)]
        inputs_info += _fed_weights(graph, fed, weights, dtype)
        plan = [i for i in plan if i not in fed]
    tensors = _weight_tensors(graph, plan, weights, dtype)
    outputs_info = [_value_info(names[r], graph.type_of(r)) for r in outs]
    g = helper.make_graph(
        c.nodes,
        f"{graph.name} segment",
        inputs_info,
        outputs_info,
        initializer=[*c.constants, *tensors],
        value_info=value_info,
    )
    return _model(g, c, opset)


def _check_lowering(ops: str, dtype: str) -> None:
    """Refuse a dtype or an op set a segment does not export with."""
    if dtype not in EXPORT_DTYPES:
        raise ConfigError(f"ONNX export runs in {' or '.join(EXPORT_DTYPES)}, not {dtype}")
    if ops not in LOWERINGS:
        raise ConfigError(f"unknown ONNX op set {ops!r}; known: {', '.join(LOWERINGS)}")
    if ops not in SEGMENT_LOWERINGS:
        # tried on onnxruntime 1.32: the fused regions want a whole layer's past K input, find
        # an all_to_all where their expert pattern expects a linear, and read the whole vocab
        raise ConfigError(
            f"a segment exports with the {' or '.join(SEGMENT_LOWERINGS)} lowering; the {ops} "
            "one's fused regions assume a whole model, not one rank's cut of it"
        )


def _rank_lowering(
    graph: Graph,
    dtype: str,
    members: list[Node],
    ins: list[Ref],
    names: dict[Ref, str],
    coords: Mapping[str, int] | None,
) -> Lowering:
    """The lowering context of one rank's segment: its offsets into split axes (checked on every
    member, not only those a lowering asks: what cannot run is refused) and where its dims
    come from."""
    c = Lowering(graph, dtype)
    offsets = rank_offsets(graph, coords)
    c.offsets = offsets
    for n in members:
        offsets(n)
    c.query_block = offsets.query_block or (0, 1)
    c.dim_sources = _dim_sources(graph, members, ins, names, offsets.query_dim)
    return c


def _fed_weights(
    graph: Graph, fed: list[Initializer], weights: Mapping[str, np.ndarray], dtype: str
) -> list[onnx.ValueInfoProto]:
    """The graph inputs of the params fed as they are, their blocks in `weights` checked for
    shape."""
    infos = []
    for init in fed:
        _weight(graph[init.name], weights)
        kind = ONNX_TYPES[init.dtype or dtype]
        infos.append(helper.make_tensor_value_info(init.name, kind, list(init.shape)))
    return infos


def _weight_tensors(
    graph: Graph, plan: list[Initializer], weights: Mapping[str, np.ndarray], dtype: str
) -> list[onnx.TensorProto]:
    """The initializers `plan` makes from the rank's weight blocks, within one ONNX message."""
    params = [
        (p, _weight(p, weights)) for p in graph.params() if any(p.name in i.sources for i in plan)
    ]
    tensors = [onnx.numpy_helper.from_array(a, k) for k, a in planned(plan, iter(params), dtype)]
    if sum(t.ByteSize() for t in tensors) > PROTO_LIMIT:
        raise GraphllmError(
            f"a segment of {graph.name} holds over 2 GB of weights, past what one ONNX message "
            "holds; run it with --runtime numpy, or on more ranks"
        )
    return tensors


def _model(g: onnx.GraphProto, c: Lowering, opset: OpSet) -> onnx.ModelProto:
    """The segment's graph as a model, importing the op set's domains and com.microsoft where a
    node is in it."""
    domains = dict(opset.domains)
    if any(node.domain == MS_DOMAIN for node in c.nodes):
        domains.setdefault(MS_DOMAIN, 1)
    model = helper.make_model(
        g,
        opset_imports=[helper.make_opsetid(d, v) for d, v in domains.items()],
        producer_name="graphllm",
        producer_version=producer_version(),
    )
    model.ir_version = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    return model


def _refs(n: Node) -> list[Ref]:
    return [Ref(n.name, k) for k in range(len(n.outputs))]


def _check_boundary(
    graph: Graph, members: list[Node], inside: set[str], ins: list[Ref], outs: list[Ref]
) -> None:
    """One line for a segment that is not one: a cut point inside it, a value read from
    outside that is not among its inputs, an output it does not make."""
    given = set(ins)
    for n in members:
        if cut_point(n):
            raise GraphllmError(
                f"{n.name} ({n.op}) is a cut point of the program: it runs between segments, "
                "not inside one"
            )
        for r in n.inputs:
            src = graph[r.node]
            if r.node in inside or src.op == "param" or r in given:
                continue
            raise GraphllmError(
                f"{n.name} reads {tensor_name(graph, r)}, which is not an input of the segment"
            )
    for r in outs:
        if r.node not in inside:
            raise GraphllmError(f"output {tensor_name(graph, r)} is not made by the segment")


def _whole_regions(graph: Graph, opset, inside: set[str], outs: set[Ref]) -> dict:
    """The op set's fused regions that lie wholly inside the segment and keep none of its
    outputs to themselves; the others' nodes are lowered one by one (every op set falls back
    to the decomposed rows)."""
    try:
        found = opset.regions(graph)
    except LoweringError as e:
        raise LoweringError(f"the {opset.name} lowering cannot express {graph.name}: {e}") from None
    keep = [
        r
        for r in found
        if set(r.nodes) <= inside
        and not any(ref.node in r.nodes and ref not in r.outputs for ref in outs)
    ]
    return placed(graph, keep)


def _dim_sources(
    graph: Graph,
    members: list[Node],
    ins: list[Ref],
    names: dict[Ref, str],
    query_dim: str | None = None,
) -> dict[tuple[str, int], tuple[str, int]]:
    """Where the segment reads the batch, the new tokens' count and the keys' count that the
    mask's lowering asks `input_ids` and `attention_mask` for, when they are not its inputs:
    the first of its values (boundary inputs, then its nodes' outputs) that has that axis whole."""
    if "input_ids" not in graph:
        return {}
    batch, tokens = graph["input_ids"].out.dims
    held = {graph[r.node].name for r in ins if graph[r.node].op == "input"}
    refs = [*ins, *(ref for n in members for ref in _refs(n))]
    # the keys: S, or in a graph without a past (a prefill's) the new tokens themselves
    wanted = {
        # the queries a position-dependent op holds: a block of them where the segment's are
        # cut (sp cuts them where the program's ids are whole, cp where they are cut too)
        ("input_ids", 1): (query_dim or tokens.name,),
        ("attention_mask", 0): (batch.name,),
        # a rank's block of the tokens is `T/k` (the partition's name for a block); the keys of
        # a prefill are the whole call's
        ("attention_mask", 1): ("S", tokens.name.split("/")[0]),
    }
    out = {}
    for (model_input, axis), dim_names in wanted.items():
        if model_input in held and query_dim is None:
            continue
        found = [
            (names[r], dims.index(d))
            for d in dim_names
            for r in refs
            if d in (dims := [x.name if x.size is None else None for x in graph.type_of(r).dims])
        ]
        if found:
            out[(model_input, axis)] = found[0]
    return out


def _all_keys_held(c: Lowering, ins: list[Ref], names: dict[Ref, str]) -> None:
    """A segment that reads `attention_mask` without it as an input: every key is held (the
    distributed runs pad no prompt), a ones tensor of (batch, keys), made just before its
    first reader."""
    if "attention_mask" in {names[r] for r in ins}:
        return
    readers = [i for i, node in enumerate(c.nodes) if "attention_mask" in node.input]
    sources = [c.dim_sources.get(("attention_mask", a)) for a in (0, 1)]
    if not readers or None in sources:
        return  # read as a graph input (_inputs), or not at all
    s = "segment.attention_mask"
    made = []
    for tensor, axis in sources:  # type: ignore[misc]
        out = f"{s}/Shape.{len(made)}"
        made.append(helper.make_node("Shape", [tensor], [out], name=out, start=axis, end=axis + 1))
    shape = f"{s}/Concat"
    made.append(
        helper.make_node(
            "Concat", [made[0].output[0], made[1].output[0]], [shape], name=shape, axis=0
        )
    )
    one = onnx.numpy_helper.from_array(np.ones(1, np.int64))
    made.append(helper.make_node("ConstantOfShape", [shape], ["attention_mask"], name=s, value=one))
    c.nodes[readers[0] : readers[0]] = made


def _inputs(graph: Graph, c: Lowering, ins: list[Ref], names: dict[Ref, str]) -> list:
    """The segment's ONNX inputs: its boundary values, then the model inputs its lowerings
    read (the mask's `attention_mask` and `input_ids`)."""
    out = []
    for r in ins:
        out.append(_value_info(names[r], graph.type_of(r)))
    declared = {v.name for v in out}
    read = {i for node in c.nodes for i in node.input}
    made = {o for node in c.nodes for o in node.output} | {t.name for t in c.constants}
    for name in _MODEL_INPUTS:
        if name in read and name not in made and name not in declared:
            ids = graph["input_ids"].out if "input_ids" in graph else None
            if ids is None:
                raise GraphllmError(
                    f"the segment reads {name}, which {graph.name} has no input for"
                )
            if name == "input_ids":
                out.append(_value_info(name, ids))
            else:
                mask = TensorType((ids.dims[0], Dim("S", "key_token")), "int64")
                out.append(_value_info(name, mask))
    return out


def _weight(p: Node, weights: Mapping[str, np.ndarray]) -> np.ndarray:
    if p.name not in weights:
        raise GraphllmError(f"no weight given for {p.name}")
    arr = np.asarray(weights[p.name])
    want = static_shape(p)
    if tuple(arr.shape) != want:
        raise GraphllmError(
            f"{p.name}: the rank's block is {'x'.join(map(str, want))}, not "
            f"{'x'.join(map(str, arr.shape))}"
        )
    return arr


# -- one export per distinct segment ---------------------------------------------------------
class SegmentCache:
    """Exports each distinct segment once: keyed by what fixes the model (the nodes as they
    print, symbolic dims and all, the boundary, the lowering, the rank's offsets, and which
    weights), so a prefill graph and a decode graph of the same program share their segments
    where those read no length-specific value."""

    def __init__(self) -> None:
        # key -> (the weights it was made from, held so that their id is not reused; the model)
        self._models: dict[str, tuple[Mapping[str, np.ndarray], bytes]] = {}

    def __len__(self) -> int:
        return len(self._models)

    def get(
        self,
        graph: Graph,
        nodes: Iterable[str],
        inputs: Iterable[Ref],
        outputs: Iterable[Ref],
        *,
        weights: Mapping[str, np.ndarray],
        coords: Mapping[str, int] | None = None,
        ops: str = "decomposed",
        dtype: str = "fp32",
        weights_as_inputs: bool = False,
    ) -> bytes:
        """The serialised model of the segment, exported the first time it is asked for."""
        nodes, inputs, outputs = list(nodes), list(inputs), list(outputs)
        # the weights' identity stands for the run they belong to, whose sharding the nodes'
        # printout does not show (with weights as inputs the model holds none of their bytes)
        key = segment_key(
            graph, nodes, inputs, outputs, coords, ops, dtype, id(weights), weights_as_inputs
        )
        hit = self._models.get(key)
        if hit is None:
            model = export_segment(
                graph,
                nodes,
                inputs,
                outputs,
                weights=weights,
                coords=coords,
                ops=ops,
                dtype=dtype,
                weights_as_inputs=weights_as_inputs,
            )
            hit = self._models[key] = (weights, model.SerializeToString())
        return hit[1]


def segment_key(
    graph: Graph,
    nodes: list[str],
    inputs: list[Ref],
    outputs: list[Ref],
    coords: Mapping[str, int] | None,
    ops: str,
    dtype: str,
    weights_id: int,
    weights_as_inputs: bool = False,
) -> str:
    """A digest of what the exported model depends on."""
    h = hashlib.sha256()
    for name in nodes:
        h.update(graph.format_node(graph[name]).encode() + b"\n")
    for ref in inputs:
        h.update(f"in {tensor_name(graph, ref)} {graph.type_of(ref)}\n".encode())
    for ref in outputs:
        h.update(f"out {tensor_name(graph, ref)} {graph.type_of(ref)}\n".encode())
    plan = graph.meta.get("partition")
    mesh = meta_result(graph, "partition").mesh.axes if plan is not None else ()
    what = (sorted((coords or {}).items()), mesh, ops, dtype, weights_id, weights_as_inputs)
    h.update(repr(what).encode())
    return h.hexdigest()
