"""A segment of one rank's program (exporters/onnx/segment.py) on onnxruntime equals the numpy
run of the same nodes on that rank, for every segment of every rank: TP (with SP, PP), EP MoE
and DeepSeek's latent attention, a prefill and a cached decode step."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import graphllm
from graphllm.build.weights import random_weights
from graphllm.errors import ConfigError, GraphllmError
from graphllm.exporters.onnx.segment import (
    SegmentCache,
    cut_point,
    export_segment,
    rank_offsets,
    tensor_name,
)
from graphllm.ir import Ref
from graphllm.models.config import config_from_dict
from graphllm.ops import OPS, SOURCE
from graphllm.passes.parallel.partition import Strategy, partition
from graphllm.runtime.spmd import SPMDInterpreter
from tests.support import tiny_configs

TINY = "examples/tiny.yaml"
MOE = config_from_dict(
    {
        **tiny_configs.LLAMA,
        "model_type": "mixtral",
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
    },
    "mixtral",
)


class _Recording(SPMDInterpreter):
    """The SPMD interpreter, keeping every rank's values: the numpy side of each segment."""

    def _run_node(self, node, ranks, env, feeds):
        self.env = env
        return super()._run_node(node, ranks, env, feeds)


def _segments(g):
    """Runs of compute between cut points, with the values each reads and hands on."""
    runs, cur = [], []
    for n in g.nodes():
        if OPS[n.op].category == SOURCE:
            continue
        if cut_point(n):
            runs, cur = runs + [cur] * bool(cur), []
        else:
            cur.append(n.name)
    runs += [cur] * bool(cur)
    kept = set(g.outputs.values())
    out = []
    for names in runs:
        inside = set(names)
        reads = [r for x in names for r in g[x].inputs]
        ins = [r for r in dict.fromkeys(reads) if r.node not in inside and g[r.node].op != "param"]
        made = [Ref(x, k) for x in names for k in range(len(g[x].outputs))]
        outer = {r for u in g.nodes() if u.name not in inside for r in u.inputs}
        out.append((names, ins, [r for r in made if r in kept or r in outer]))
    return out


def _graph(config, workload, strategy, **build):
    cfg = graphllm.load_config(config) if isinstance(config, str) else config
    g = graphllm.build_graph(cfg, graphllm.Workload(dtype="fp32", **workload), **build)
    return g, partition(g, strategy)


def _feeds(g, seed=0):
    rng = np.random.default_rng(seed)
    b, t, p = (int(g.bindings.get(k, 0)) for k in ("B", "T", "P"))
    vocab = int(g["model.embed_tokens.weight"].out.dims[0].size)
    feeds = {
        "input_ids": rng.integers(0, vocab, (b, t)),
        "position_ids": np.broadcast_to(np.arange(p, p + t), (b, t)).copy(),
    }
    for n in g.nodes("input"):
        if n.name not in feeds:
            shape = tuple(int(d.size or g.bindings[d.name]) for d in n.out.dims)
            feeds[n.name] = (0.5 * rng.standard_normal(shape)).astype(np.float32)
    return feeds


def _compare(g, local, ops="decomposed"):
    """Worst difference over every output of every segment of every rank, and the count."""
    rec = _Recording(local, random_weights(g, seed=0))
    rec.run(_feeds(g))
    worst, runs, cache = 0.0, 0, SegmentCache()
    for r in rec.ranks:
        env = rec.env[r]

        def value(ref, env=env):
            v = env[ref.node]
            return v[ref.index] if isinstance(v, tuple) else v

        weights = {p.name: env[p.name] for p in local.params() if p.name in env}
        for names, ins, outs in _segments(local):
            if not all(x in env for x in names):
                continue  # another pipeline stage's
            model = cache.get(
                local, names, ins, outs, weights=weights, coords=rec.coords[r], ops=ops
            )
            sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
            by_name = {tensor_name(local, x): x for x in ins}
            feeds = {i.name: np.asarray(value(by_name[i.name])) for i in sess.get_inputs()}
            got = sess.run([tensor_name(local, o) for o in outs], feeds)
            for o, y in zip(outs, got):
                assert y.shape == np.shape(value(o)), o
                if y.size:
                    worst = max(worst, float(np.max(np.abs(y - value(o)))))
            runs += 1
    return worst, runs


PREFILL = {"batch": 2, "seq_len": 6}
DECODE = {"batch": 2, "seq_len": 1, "past_len": 5}
DEEPSEEK = config_from_dict(tiny_configs.DEEPSEEK_V3, "deepseek_v3")


@pytest.mark.parametrize("workload", [PREFILL, DECODE], ids=["prefill", "decode"])
@pytest.mark.parametrize(
    ("config", "strategy", "build"),
    [
        (TINY, Strategy(tp=2), {}),
        (TINY, Strategy(tp=2, sp=True), {}),
        (TINY, Strategy(tp=2, pp=2), {}),
        (MOE, Strategy(ep=2), {}),
        (MOE, Strategy(ep=2, tp=2), {}),
        (DEEPSEEK, Strategy(tp=2), {"mla": "naive"}),
        (DEEPSEEK, Strategy(ep=2), {"mla": "absorbed"}),
    ],
    ids=["tp", "tp-sp", "tp-pp", "moe-ep", "moe-ep-tp", "mla-tp", "mla-absorbed-ep"],
)
def test_segments_on_onnxruntime_equal_numpy(config, strategy, build, workload):
    if strategy.sp and workload is DECODE:  # sp cuts the step's tokens: two of them
        workload = DECODE | {"seq_len": 2}
    g, local = _graph(config, workload, strategy, **build)
    worst, runs = _compare(g, local)
    assert runs >= strategy.devices  # every rank ran at least one segment
    assert worst < 1e-5


def test_vocab_parallel_embedding_reads_the_ranks_rows():
    """Rank 1 of tp 2 holds the table's second half: without its offset it would read rows
    0..127 for ids 128..255, and the segment would differ from numpy."""
    _, local = _graph(TINY, PREFILL, Strategy(tp=2))
    first = next(s for s in _segments(local) if "model.embed_tokens" in s[0])
    w = {"model.embed_tokens.weight": np.arange(128 * 64, dtype=np.float32).reshape(128, 64)}
    ids = np.array([[0, 127, 128, 255, 3, 200]] * 2)
    got = {}
    for rank in (0, 1):
        m = export_segment(local, *first, weights=w, coords={"tp": rank})
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        got[rank] = sess.run(None, {"input_ids": ids})[0]
    rows = w["model.embed_tokens.weight"]
    assert (got[0][0, 1] == rows[127]).all() and (got[0][0, 2] == 0).all()
    assert (got[1][0, 2] == rows[0]).all() and (got[1][0, 3] == rows[127]).all()
    assert (got[1][0, 1] == 0).all()


def test_one_model_serves_prefill_and_decode():
    """Symbolic lengths: the decode graph's segment model runs the prefill's lengths too, and a
    second ask of the same segment is not exported again."""
    g, local = _graph(TINY, DECODE, Strategy(tp=2))
    names, ins, outs = _segments(local)[1]  # the first layer's attention: it reads past K/V
    rec = _Recording(local, random_weights(g, seed=0))
    rec.run(_feeds(g))
    weights = {p.name: rec.env[(0,)][p.name] for p in local.params() if p.name in rec.env[(0,)]}
    cache = SegmentCache()
    model = cache.get(local, names, ins, outs, weights=weights, coords={"tp": 0})
    again = cache.get(local, names, ins, outs, weights=weights, coords={"tp": 0})
    assert again is model and len(cache) == 1
    cache.get(local, names, ins, outs, weights=weights, coords={"tp": 1})
    assert len(cache) == 2  # another rank's offsets: another model
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    feeds = {}
    for i in sess.get_inputs():  # a prefill of 4 tokens: past of length 0
        shape = [4 if d == "sequence_length" else 2 if d == "batch" else d for d in i.shape]
        shape = [0 if d == "past_sequence_length" else d for d in shape]
        dtype = np.int64 if i.type == "tensor(int64)" else np.float32
        feeds[i.name] = np.ones(shape, dtype) if dtype == np.int64 else np.zeros(shape, dtype)
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    assert got["model.layers.0.self_attn.o_proj"].shape == (2, 4, 64)
    assert got["present.0.key"].shape == (2, 1, 4, 16)  # no past: the 4 new keys


def test_a_cut_point_inside_a_segment_is_refused():
    _, local = _graph(TINY, PREFILL, Strategy(tp=2))
    (a, ins, _), (b, _, outs) = _segments(local)[:2]
    cut = next(n.name for n in local.nodes() if cut_point(n))
    with pytest.raises(GraphllmError, match="cut point of the program"):
        export_segment(local, [*a, cut, *b], ins, outs, weights={})


def test_a_value_from_outside_that_is_not_an_input_is_refused():
    _, local = _graph(TINY, PREFILL, Strategy(tp=2))
    names, ins, outs = _segments(local)[1]
    with pytest.raises(GraphllmError, match="not an input of the segment"):
        export_segment(local, names, ins[1:], outs, weights={})


def test_a_missing_or_misshapen_weight_is_one_line():
    g, local = _graph(TINY, PREFILL, Strategy(tp=2))
    first = _segments(local)[0]
    with pytest.raises(GraphllmError, match=r"no weight given for model\.embed_tokens\.weight"):
        export_segment(local, *first, weights={}, coords={"tp": 0})
    whole = random_weights(g, seed=0)  # the unpartitioned table: 256 rows, not the rank's 128
    with pytest.raises(GraphllmError, match="the rank's block is 128x64, not 256x64"):
        export_segment(local, *first, weights=whole, coords={"tp": 0})


def test_weights_as_inputs_hold_no_weight_bytes_and_compute_the_same():
    """`weights_as_inputs`: the params become graph inputs (fed by the caller, as dist-run binds
    the rank's arrays), the model carries none of their bytes, and the outputs are those of the
    export with initializers; a misshapen weight is still one line."""
    g, local = _graph(TINY, DECODE, Strategy(tp=2))
    names, ins, outs = _segments(local)[1]  # the first layer's attention
    rec = _Recording(local, random_weights(g, seed=0))
    rec.run(_feeds(g))
    env = rec.env[(0,)]
    weights = {p.name: env[p.name] for p in local.params() if p.name in env}
    inits = export_segment(local, names, ins, outs, weights=weights, coords={"tp": 0})
    fed = export_segment(
        local, names, ins, outs, weights=weights, coords={"tp": 0}, weights_as_inputs=True
    )
    params = {p.name for p in local.params()}
    read = {i.name for i in inits.graph.initializer} & params
    assert read and not {i.name for i in fed.graph.initializer} & params
    assert read <= {i.name for i in fed.graph.input}
    assert fed.ByteSize() < inits.ByteSize() - sum(weights[k].nbytes for k in read) + 4096
    got = []
    for model in (inits, fed):
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        by_name = {tensor_name(local, x): x for x in ins}
        feeds = {}
        for i in sess.get_inputs():
            v = weights[i.name] if i.name in read else env[by_name[i.name].node]
            feeds[i.name] = np.asarray(v[by_name[i.name].index] if isinstance(v, tuple) else v)
        got.append(sess.run(None, feeds))
    assert all(np.array_equal(a, b) for a, b in zip(*got))
    bad = dict(weights) | {k: weights[k][:1] for k in read}
    with pytest.raises(GraphllmError, match="the rank's block is"):
        export_segment(
            local, names, ins, outs, weights=bad, coords={"tp": 0}, weights_as_inputs=True
        )


@pytest.mark.parametrize("workload", [PREFILL, DECODE | {"seq_len": 2}], ids=["prefill", "decode"])
@pytest.mark.parametrize(
    ("config", "strategy"),
    [
        (TINY, Strategy(cp=2)),
        (TINY, Strategy(cp=2, tp=2)),
        (DEEPSEEK, Strategy(cp=2)),
        (MOE, Strategy(ep=4)),  # batch 2: ep cuts the tokens
    ],
    ids=["cp", "cp-tp", "mla-cp", "moe-ep-on-tokens"],
)
def test_a_ranks_block_of_the_tokens_masks_from_its_own_queries(config, strategy, workload):
    """cp (and ep on the tokens): each rank's queries are a block of the call's, K/V whole; its
    mask starts its cache index that many blocks in (Lowering.query_block), as the numpy mask's
    `shard` does."""
    if strategy.ep > 1:
        workload = workload | {"seq_len": 8 if workload is PREFILL else 4}
    g, local = _graph(config, workload, strategy)
    worst, runs = _compare(g, local)
    assert runs >= strategy.devices
    assert worst < 1e-5


def test_a_block_of_the_keys_is_refused():
    _, local = _graph(TINY, PREFILL, Strategy(cp=2))
    mask = next(n for n in local.nodes() if n.op == "mask")
    offsets = rank_offsets(local, {"cp": 0})
    offsets.query_block = (1, 2)  # another block than this rank's: one rank, two blocks
    with pytest.raises(ConfigError, match="--runtime numpy"):
        offsets(mask)


@pytest.mark.parametrize("ops", ["standard", "ort"])
def test_the_fused_lowerings_are_refused_in_one_line(ops):
    """Their regions read a whole model (all the vocab's rows, a layer's past K input): tried,
    they fail or read out of bounds on a rank's program, so they are refused up front."""
    _, local = _graph(TINY, DECODE, Strategy(tp=2))
    seg = _segments(local)[1]
    with pytest.raises(ConfigError, match="fused regions assume a whole model"):
        export_segment(local, *seg, weights={}, ops=ops)
