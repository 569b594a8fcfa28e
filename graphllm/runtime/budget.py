"""What a run would allocate, priced before it starts: numpy interpreter runs, bench's KV cache
and per-step inputs, and the threads onnxruntime and calibrate start. A run that would not fit
in what this process may use (graphllm.limits.memory_available: free memory, the cgroup's room
and RLIMIT_AS's) is refused in one line saying what it needs, instead of dying of MemoryError
or the OOM killer halfway.
"""

from __future__ import annotations

import os
import resource
from typing import Any

from graphllm.errors import GraphllmError
from graphllm.ir import STATE, Graph
from graphllm.limits import require_memory

# bytes per element as the interpreter holds them: it computes in fp32, token ids are int64
_INTERPRETED = {"int64": 8}
_FP32 = 4
# onnxruntime starts one OS thread per intra-op thread; past a few per CPU they only contend,
# and 100000 of them exhaust the address space (each reserves a stack) and crash onnxruntime
THREADS_PER_CPU = 4


def interpreted_bytes(graph: Graph) -> float:
    """Bytes a numpy run of `graph` holds at its peak: the interpreter keeps every node's outputs
    (weights and activations) until the run ends, and an op (or a weight's float64 draw) may
    allocate temporaries of twice the largest output beside them."""
    sizes = [
        out.numel(graph.bindings) * _INTERPRETED.get(out.dtype, _FP32)
        for node in graph.nodes()
        for out in node.outputs
    ]
    return sum(sizes) + 2 * max(sizes, default=0)


def require_interpreted(graph: Graph, what: str, runs: int = 1) -> None:
    """Refuse `runs` numpy runs of `graph` held at once when they would not fit in memory."""
    require_memory(runs * interpreted_bytes(graph), what)


def max_threads() -> int:
    return THREADS_PER_CPU * (os.cpu_count() or 1)


def require_threads(threads: int, what: str) -> None:
    """Refuse a thread count past THREADS_PER_CPU per CPU, or whose stacks would not fit."""
    limit = max_threads()
    if threads > limit:
        raise GraphllmError(
            f"{what}: --threads {threads:,} is more than {limit} ({THREADS_PER_CPU} per CPU of "
            f"{os.cpu_count() or 1}); more threads than that only contend for the CPUs"
        )
    stack, _ = resource.getrlimit(resource.RLIMIT_STACK)
    if stack != resource.RLIM_INFINITY:
        require_memory(threads * stack, f"{what} with {threads} threads (their stacks)")


def bench_bytes(
    past: list[tuple[int, int, int]],
    vocab: int,
    heads: int,
    batch: int,
    prompt_len: int,
    new_tokens: int,
) -> int:
    """Bytes `bench` allocates beyond the loaded model: the KV cache at its full length (past
    inputs as (heads, head_dim, itemsize); bound as past and present, or fed back, two copies at
    most), the prefill's logits and one layer's attention scores and their softmax (onnxruntime's
    CPU kernels materialise them, fused or not), and every step's attention mask made before the clock
    starts (as numpy arrays and as OrtValues: two int64 copies)."""
    capacity = prompt_len + new_tokens
    cache = 2 * sum(batch * kv_heads * capacity * dim * size for kv_heads, dim, size in past)
    logits = batch * prompt_len * vocab * _FP32
    # the scores and their softmax are alive together (a 17,500-token prompt at 4 heads failed in
    # onnxruntime's arena when counted once)
    scores = 2 * batch * heads * prompt_len * prompt_len * _FP32
    steps = new_tokens + 1
    masks = 2 * 8 * batch * (steps * prompt_len + steps * (steps - 1) // 2)
    return cache + logits + scores + masks


def require_bench(model: Any, heads: int, batch: int, prompt_len: int, new_tokens: int) -> None:
    """Refuse a bench whose cache, logits and masks would not fit beside the loaded model, or
    whose run is longer than the model's rotary tables."""
    model.require_positions(prompt_len + new_tokens, "the bench")
    # a layer's conv or recurrent state (fixed in size: OnnxModel.state_names) is not
    # a cache that grows with the tokens; at most tens of MB beside the model, it is left out
    states = set(getattr(model, "state_names", ()))
    past = [
        (_static(i.shape[1]), _static(i.shape[3]), 2 if i.type == "tensor(float16)" else 4)
        for i in model.session.get_inputs()
        if i.name.startswith("past") and i.name not in states
    ]
    vocab = _static(model.session.get_outputs()[0].shape[-1])
    _require_bench(past, vocab, heads, batch, prompt_len, new_tokens)


def require_bench_export(
    graph: Graph, vocab: int, heads: int, batch: int, prompt_len: int, new_tokens: int
) -> None:
    """`require_bench` for the export graph of a config, before it is exported to be benched."""
    past = [
        (
            _static(n.out.dims[1].size),
            _static(n.out.dims[3].size),
            2 if n.out.dtype == "fp16" else 4,
        )
        for n in graph.nodes("input")
        if n.name.startswith("past")
        and graph.output_role(n.name.replace("past_key_values.", "present.", 1)) != STATE
    ]
    _require_bench(past, vocab, heads, batch, prompt_len, new_tokens)


def _require_bench(
    past: list[tuple[int, int, int]],
    vocab: int,
    heads: int,
    batch: int,
    prompt_len: int,
    new_tokens: int,
) -> None:
    require_memory(
        bench_bytes(past, vocab, heads, batch, prompt_len, new_tokens),
        f"bench at batch {batch:,}, a prompt of {prompt_len:,} tokens and {new_tokens:,} new "
        "(its KV cache, logits, attention scores and masks, beside the model)",
    )


def _static(dim: Any) -> int:
    """A dim onnxruntime or the IR reports: a size, or a name (dynamic) counted as 1."""
    return dim if isinstance(dim, int) and dim > 0 else 1
