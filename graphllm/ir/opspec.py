"""What an op row is, and the generic rules over the table of rows.

An `OpSpec` declares one op as data: its axis signature (graphllm.ir.signature), which axes each
output value reads in full (`reduce`), which letters index the same absolute token position
(`same_position`), its FLOP rule, output dtypes, and a numpy reference implementation. The rows
themselves live in graphllm.ops, one module per family of ops, and `register` here; shape
inference, token mixing, FLOPs and sharding are derived from the rows by generic code, and no
pass lists ops by name.

FLOP conventions (per DESIGN.md): a contraction costs 2 x the product of all its distinct axis
sizes (one multiply and one add per term); other ops cost `flops_per_elem` per output element,
the constants documented per row; data movement (reshapes, concat, gather, dispatch) is 0. A row
whose count depends on its attrs as well as its sizes says so with `flops_attrs_fn` (RoPE under
partial rotary: only the rotated channels cost anything).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphllm.errors import GraphError
from graphllm.ir.dims import TOKEN_ROLES, Dim, TensorType
from graphllm.ir.node import GraphView, Node
from graphllm.ir.signature import Signature, bind, output_dims, parse
from graphllm.models.workload import stream_of

Impl = Callable[[list[np.ndarray], dict[str, Any]], Any]


# categories: sets tested by membership, never by op name
SOURCE = "source"  # graph inputs and weights


CONTRACTION = "contraction"  # sums products over an axis absent from the output


ELEMENTWISE = "elementwise"


REDUCTION = "reduction"  # each output reads a whole axis (norms, softmax)


MOVEMENT = "movement"  # copies values: reshapes, concat, repeat, gather, routing


COMMUNICATION = "communication"  # moves values between devices: collectives, send/recv
CATEGORIES = (SOURCE, CONTRACTION, ELEMENTWISE, REDUCTION, MOVEMENT, COMMUNICATION)


@dataclass(frozen=True)
class OpSpec:
    """One op kind. `sig` is parsed once into `signature`."""

    name: str
    sig: str
    category: str
    impl: Impl | None
    doc: str
    reduce: tuple[str, ...] = ()
    same_position: tuple[tuple[str, ...], ...] = ()
    flops_per_elem: int = 0  # an int: FLOP counts are exact (node_flops)
    flops_fn: Callable[[dict[str, float]], float] | None = None
    # the FLOPs from the bound letter sizes and the node's attrs, for a rule the sizes alone
    # do not fix (RoPE: 3 per rotated element, its rotated width 2 * len(inv_freq) of e)
    flops_attrs_fn: Callable[[dict[str, float], dict[str, Any]], float] | None = None
    # per output: 'same' (input 0's), 'act', a dtype name, or 'attr' (attrs['dtypes'][i])
    out_dtypes: tuple[str, ...] = ("same",)
    check: Callable[[Node, dict[str, Dim]], str | None] | None = None
    # which (query, key) position pairs the op lets through, from its attrs: for query
    # positions t (absolute), the interval [lo(t), hi(t)] of key positions; None: all
    relation: Callable[[dict[str, Any], np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None
    # the impl reads the absolute position index of its output's position axes: the runtimes
    # give it attrs['origin'] (letter -> the axis's first absolute position; `position_origins`),
    # as they do for an op with a `relation`
    positional: bool = False
    # the contraction is a matrix multiply (what GEMM kernels run and FLOP counters count)
    matmul: bool = False
    # the output is a view of the input: no memory is read or written
    view: bool = False
    # inputs the op appends to where they lie (a KV cache): not read, and not written again
    in_place: tuple[int, ...] = ()
    # groups of inputs in which the output is jointly linear, the other inputs held fixed: a
    # pending sum over devices (a partial) passes through such a group unreduced. None derives
    # them from the category (`linear_groups`); () declares the op nonlinear in every input
    linear: tuple[tuple[int, ...], ...] | None = None
    # pairs of letters cut by one split: a block of one holds a block of the other (the GQA
    # copy's query heads come from their KV heads; MoE slots hold a block of tokens)
    carries: tuple[tuple[str, str], ...] = ()
    # the impl takes the input of every rank of a device group, in rank order, and returns
    # every rank's output (attrs: `mesh`, the mesh axis the group runs along)
    collective: bool = False
    # rewrites the signature's output dims from attrs (a collective changes one axis's size)
    retype: Callable[[Node, tuple[Dim, ...]], tuple[Dim, ...]] | None = None
    # what the backward pass reads, so a training step keeps it: "inputs" or "output"; None:
    # a contraction reads its inputs, any other op nothing (linear in its inputs)
    backward_reads: str | None = None
    # a copy the backward pass redoes from its input rather than keeps (GQA's repeat, a gather)
    backward_redoes: bool = False
    # fp32 values per row of the reduced axes that the backward pass keeps when a fused kernel
    # never writes the output (softmax's log-sum-exp: 1); 0: nothing beyond `backward_reads`
    backward_stats: int = 0
    # a collective's payload, the whole tensor it moves, from one device's tensors: "input"
    # (all-reduce, reduce-scatter, send), "output" (an all-gather's gathered tensor) or "group"
    # (every rank's input together: the blocks an all-to-all exchanges)
    payload: str = "input"
    # a collective's bytes one device sends, as a fraction of what it holds of the payload (the
    # payload itself; one rank's input for "group"), for a group of n (ring all-reduce
    # 2(n-1)/n; ring gather/scatter and pairwise all-to-all (n-1)/n; a send the whole)
    wire: Callable[[int], float] | None = None
    # the output joins every rank's block of axis attrs['axis'] (an all-gather), so it commutes
    # with a copy that passes that axis through
    gathers: bool = False
    # one half of a point-to-point transfer whose time and bytes are counted on the other half
    # (a recv, on its send)
    timed_on_peer: bool = False
    # the kind reports file the op's traffic under; None: its own name (a send: "send/recv")
    comm_kind: str | None = None
    # inputs that carry a state summing up every position before the op's first one
    # (a recurrence's past state): the tokens pass makes the output depend on all of them
    state_inputs: tuple[int, ...] = ()
    # the part of the row's FLOPs (from the sizes and attrs) that are matrix
    # multiplies, where an op is a whole algorithm (a recurrence's chunked form: its matmuls
    # beside its elementwise work, which `flops_attrs_fn` gives)
    matmul_flops_fn: Callable[[dict[str, float], dict[str, Any]], float] | None = None
    # a collective's latency steps per algorithm for a group of n (the alpha of the alpha-beta
    # model: each step is one hop's latency; the time takes the algorithm with fewest), e.g. a
    # ring all-reduce's 2(n-1) against a tree's 2 log2(n); None: not timed on a link
    latency_steps: Callable[[int], dict[str, int]] | None = None

    @property
    def signature(self) -> Signature:
        return parse(self.sig)

    @property
    def is_contraction(self) -> bool:
        return self.category == CONTRACTION


OPS: dict[str, OpSpec] = {}


PAYLOADS = ("input", "output", "group")


def register(*specs: OpSpec) -> None:
    """Add rows to the table; a malformed signature or a second row of one name fails at import."""
    for spec in specs:
        parse(spec.sig)
        if spec.payload not in PAYLOADS:
            raise GraphError(f"op {spec.name!r}: payload must be one of {PAYLOADS}")
        if spec.name in OPS:
            raise GraphError(f"op {spec.name!r} is declared twice")
        OPS[spec.name] = spec


# -- generic rules over the table --------------------------------------------------------------
def position_origins(graph: GraphView, node: Node) -> dict[str, int]:
    """Letter -> the first absolute position (Dim.position_range) of each position axis of the
    node's first output; a shard of an axis keeps the whole axis's origin."""
    operand = OPS[node.op].signature.outputs[0]
    dims = node.out.dims
    out: dict[str, int] = {}
    for ax, d in zip(reversed(operand), reversed(dims)):  # `...` leads, if anywhere
        if isinstance(ax, str) and d.role in TOKEN_ROLES and ax != "...":
            out[ax] = d.position_range(graph.bindings)[0]
    return out


def needs_positions(spec: OpSpec) -> bool:
    """Whether the runtimes give the op's impl its position axes' origins."""
    return spec.relation is not None or spec.positional


def bind_node(graph: GraphView, node: Node) -> tuple[dict[str, Dim], tuple[Dim, ...]]:
    """Letter -> Dim for a node's signature, and the dims that `...` stands for."""
    spec = OPS[node.op]
    dims_in = [t.dims for t in graph.input_types(node)]
    where = f"{node.name} ({node.op})"
    return bind(spec.signature, dims_in, node.attrs.get("axes", {}), where)


_INFER_CACHE: dict[tuple, tuple[TensorType, ...]] = {}


def infer(graph: GraphView, node: Node) -> tuple[TensorType, ...]:
    """Output types of `node` from its op's signature, its inputs and its attrs."""
    spec = OPS.get(node.op)
    if spec is None:
        raise GraphError(f"{node.name}: unknown op {node.op!r}")
    if spec.category == SOURCE:
        t = node.attrs.get("type")
        if not isinstance(t, TensorType):
            raise GraphError(f"{node.name} ({node.op}): needs attrs['type'], a TensorType")
        return (t,)
    # a block's ops repeat N times with the same types: the key holds everything inference reads
    a = node.attrs
    key = (
        node.op,
        tuple(graph.input_types(node)),
        tuple(sorted(a.get("axes", {}).items())),
        tuple(a.get("sizes", ())),
        a.get("dtype"),
        tuple(a.get("dtypes", ())),
        graph.meta.get("act_dtype"),
        graph.meta.get("stream_dtype"),
    )
    hit = _INFER_CACHE.get(key)
    if hit is not None:
        return hit
    if len(_INFER_CACHE) > 50_000:
        _INFER_CACHE.clear()
    _INFER_CACHE[key] = out = _infer(graph, node, spec)
    return out


def _infer(graph: GraphView, node: Node, spec: OpSpec) -> tuple[TensorType, ...]:
    where = f"{node.name} ({node.op})"
    env, ell = bind_node(graph, node)
    if spec.check is not None:
        msg = spec.check(node, env)
        if msg:
            raise GraphError(f"{where}: {msg}")
    axes = node.attrs.get("axes", {})
    in_types = graph.input_types(node)
    out = []
    outs = output_dims(spec.signature, env, ell, axes, where)
    for i, (dims, rule) in enumerate(zip(outs, spec.out_dtypes)):
        if rule == "attr":  # one per output, from the node (a traced op's, as torch gave it)
            dt = node.attrs["dtypes"][i]
        elif rule == "same":
            dt = in_types[0].dtype
        elif rule == "act":  # the stream's: a W8A8 graph's fp8 is its GEMMs' inputs alone
            dt = graph.meta.get("stream_dtype") or stream_of(graph.meta.get("act_dtype", "fp32"))
        else:
            dt = rule
        if spec.retype is not None:
            dims = spec.retype(node, dims)
        out.append(TensorType(dims, node.attrs.get("dtype", dt)))
    return tuple(out)


def linear_groups(spec: OpSpec, integer: list[bool]) -> tuple[tuple[int, ...], ...]:
    """Groups of inputs in which the op's output is jointly linear (see OpSpec.linear).

    Derived unless the row says: a contraction is linear in each input that has a contracted
    axis, together with the inputs none of whose axes is contracted (a bias is added once);
    a movement op in all its non-integer inputs together; other ops in none.
    """
    if spec.linear is not None:
        return spec.linear
    sig = spec.signature
    floats = [i for i in range(len(sig.inputs)) if not integer[i]]
    if spec.category == MOVEMENT:
        return (tuple(floats),) if floats else ()
    if spec.category != CONTRACTION:
        return ()
    out = sig.output_letters()
    letters = [
        {x for ax in op for x in (ax if isinstance(ax, tuple) else (ax,))} for op in sig.inputs
    ]
    summands = tuple(i for i in floats if letters[i] <= out)
    return tuple((i, *summands) for i in floats if i not in summands)


def letter_sizes(graph: GraphView, node: Node) -> dict[str, float]:
    """Bound size of every letter of the node's signature; `...` dims appear under their names."""
    env, ell = bind_node(graph, node)
    b = graph.bindings
    sizes = {k: (d.size if d.size is not None else b[d.name]) for k, d in env.items()}
    for d in ell:
        sizes["..." + d.name] = d.size if d.size is not None else b[d.name]
    for k, d in node.attrs.get("axes", {}).items():
        if k not in sizes and not k.startswith("("):
            sizes[k] = d.size if d.size is not None else b[d.name]
    return sizes


def node_flops(graph: GraphView, node: Node) -> tuple[Any, Any]:
    """(matmul FLOPs, other FLOPs) of one node under the table's conventions (module docstring)."""
    spec = OPS[node.op]
    # exact: Python ints (a Fraction where a size is balanced routing's B*T*k/E), never floats,
    # which lose counts above 2**53
    if spec.category == SOURCE:
        return 0, 0
    if spec.matmul_flops_fn is not None:
        sizes = letter_sizes(graph, node)
        rest = spec.flops_attrs_fn(sizes, node.attrs) if spec.flops_attrs_fn else 0
        return spec.matmul_flops_fn(sizes, node.attrs), rest
    if spec.flops_fn is not None:
        return 0, spec.flops_fn(letter_sizes(graph, node))
    if spec.flops_attrs_fn is not None:
        return 0, spec.flops_attrs_fn(letter_sizes(graph, node), node.attrs)
    contraction = 2 * math.prod(letter_sizes(graph, node).values()) if spec.is_contraction else 0
    other = spec.flops_per_elem * sum(t.numel(graph.bindings) for t in node.outputs)
    if spec.matmul:
        return contraction, other
    return 0, contraction + other
