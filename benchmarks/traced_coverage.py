"""Coverage of the traced frontend: every decoder-only causal LM of the installed transformers.

For each model type of MODEL_FOR_CAUSAL_LM_MAPPING_NAMES (less the encoder-decoder and
remote-code ones, listed with why), a tiny random model is made from transformers' own config
class (its defaults with the sizes cut down), and the traced frontend is checked against it:
- trace: prefill and a cached decode step trace and lower to a verified Graph;
- params: the graph's parameter count equals the model's;
- flops: the graph's matmul FLOPs equal torch's FlopCounterMode on the same forward, and its
  causal convs' work equals FlopCounterMode's convolution count once transformers' padding is
  counted (its torch code computes K-1 outputs a conv it then drops);
- logits: the numpy interpreter's logits equal transformers' (eager attention, fp32), prefill
  and decode, within 1e-4;
- onnx: exported (the decomposed lowering, the model's tensors in a safetensors file), onnxruntime's
  logits after a cached past equal transformers' within 1e-4.
Each type runs in its own process with a time limit; a failure is one line naming its cause.

    python benchmarks/traced_coverage.py [--only llama,qwen3] [--jobs 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import traceback
from collections import Counter
from typing import Any

TINY = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 128,
    "max_position_embeddings": 512,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 48,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": 24,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "n_group": 1,
    "topk_group": 1,
    "sliding_window": 64,
    "attention_chunk_size": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "mamba_num_heads": 4,
    "mamba_head_dim": 16,
    "ssm_state_size": 8,
    "n_groups": 1,
    "num_heads": 4,
    "d_model": 64,
    "n_embd": 64,
    "n_head": 4,
    "n_layer": 2,
    "rotary_dim": 8,
    "n_positions": 512,
    "ffn_dim": 96,
    "d_ff": 96,
    "num_layers": 2,
    "n_inner": 96,
}
# causal-LM types that are not decoder-only language models, and why they are left out
EXCLUDED = {
    "encoder": "an encoder (BERT-like, or a seq2seq model's half): bidirectional unless used as "
    "a decoder, not a decoder-only LM",
    "not causal": "a bidirectional encoder by default (its config's causal is False, XLM's "
    "masked LM): not a decoder-only LM",
}


def _encoder(cls: Any) -> str | None:
    """Why the default model of config class `cls` is no decoder-only LM (a key of
    EXCLUDED), or None."""
    try:
        cfg = cls()
    except Exception:  # a default config that does not validate: judged by its fields
        return "encoder" if getattr(cls, "is_encoder_decoder", False) else None
    seq2seq = getattr(cfg, "is_encoder_decoder", False)
    if seq2seq or (
        getattr(cfg, "is_decoder", None) is False and hasattr(cfg, "add_cross_attention")
    ):
        return "encoder"
    # a field that says the attention is not causal (XLM's `causal`, as graphllm.trace.hf reads
    # it): every position attends to every other
    return "not causal" if getattr(cfg, "causal", None) is False else None


def decoder_types() -> tuple[list[str], dict[str, str]]:
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    keep, skipped = [], {}
    for mt in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        if mt not in CONFIG_MAPPING:  # a lazy mapping, whose .get finds nothing
            skipped[mt] = "no config class"
            continue
        cls = CONFIG_MAPPING[mt]
        if cls is None:
            skipped[mt] = "no config class"
        elif why := _encoder(cls):
            skipped[mt] = EXCLUDED[why]
        else:
            keep.append(mt)
    return keep, skipped


# what the shared tiny sizes leave inconsistent in a type's own rules (a layer pattern by
# period and offset, a width derived from others)
TINY_FOR = {
    "mamba2": {"head_dim": 32},  # heads x head_dim = hidden x expand
    "bamba": {"attn_layer_indices": [1]},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1},
    # two hybrid layers: their shared transformer block is one module that both run (a single
    # hybrid layer leaves transformers' weight tying with nothing to tie)
    "zamba": {"layers_block_type": ["linear_attention", "hybrid"] * 2},
    "zamba2": {"layers_block_type": ["linear_attention", "hybrid"] * 2},
    "granitemoehybrid": {"layer_types": ["mamba", "attention", "mamba", "mamba"]},
    # (and its vision and audio adapters' output width, which it checks against the text's)
    "dots3_note": {
        "num_key_value_heads": 4,
        "vision_config": {"adapter_out_dim": 64},
        "audio_config": {"adapter_out_dim": 64},
    },
    "dots3_note_text": {"num_key_value_heads": 4},
    "zaya": {"num_experts_per_tok": 1},
    "lfm2_moe": {"layer_types": ["conv", "full_attention", "conv", "full_attention"]},
    "gemma3n": {"num_kv_shared_layers": 0},
    "gemma3n_text": {"num_kv_shared_layers": 0},
    # the class's defaults leave rope_parameters empty, which its rotary module reads per layer type
    "cohere_compass_text": {
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    },
    # its causal LM refuses a config that is not a decoder's (the class's default is not)
    # (and its axial position embeddings' widths sum to the hidden size)
    "reformer": {"is_decoder": True, "axial_pos_embds_dim": [16, 48]},
    # nested sub-configs the shared sizes do not reach (the defaults' hash embeddings alone
    # hold 3e9 parameters)
    "blt": {
        "encoder_hash_byte_group_vocab": 64,
        **{
            f"{part}_config": {"num_attention_heads": 4, "head_dim": 16, "intermediate_size": 96}
            | {"hidden_size": 64, "num_hidden_layers": 2}
            | ({"hidden_size_global": 64} if part in ("encoder", "decoder") else {})
            for part in ("patcher", "encoder", "decoder", "global")
        },
    },
    # the defaults serialize each layer as an attention and an "mlp" entry, which the config
    # halves (layers and section sizes alike): four layers given directly, one before and one
    # after its two looped layers (the defaults' 8 + 20 + 8 in 36)
    "dory": {
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
        "n_input_layers": 1,
        "n_output_layers": 1,
    },
    # its cache's state shapes round the q/k and v widths up to multiples of 64, its layers
    # do not: a hidden size whose widths (x 0.5, x 1) are multiples of 64 as published ones are
    "xlstm": {"hidden_size": 128},
    # its weights' initial spread (1.0 by default, where the other types' is about 0.02) makes
    # logits of ~30, whose fp32 rounding alone (torch's own against float64: ~1e-4) is the
    # comparison's tolerance: the spread of the others
    "cpmant": {"init_std": 0.02},
    # its indexer's heads: at most the query heads a key head serves (4 / 2)
    "kolibri1_1": {"index_num_heads": 2},
    # its full-attention layers are always indexed (QSA), whose sizes have no defaults
    "qwen4_exp_text": {
        "indexer_n_heads": 2,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 16,
        "indexer_budget": 32,
        "indexer_compress_ratio": 4,
    },
    # the head's rows (the checkpoint's unpadded vocabulary), fewer than the embedding's
    "inkling2_text": {"unpadded_vocab_size": 120},
    # (and a layer before, two in and one after its loop, as the published 6 / 12 / 6 in blocks
    # of six, here in blocks of one: the defaults' loop starts past a tiny model's last layer)
    "inkling2_loop_text": {
        "unpadded_vocab_size": 120,
        "n_layers_per_attn_res_block": 1,
        "loop_layer_index_start": 1,
        "loop_layer_index_end": 3,
    },
    # its rotary tables' width, a field of its own that published configs set to qk_rope_head_dim
    "longcat_flash": {"head_dim": 8},
    # nested sub-configs, which the shared sizes do not reach; the attention reads rope_theta
    # from attn_config, where the published configs (dbrx-instruct) hold it
    "dbrx": {
        "attn_config": {"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 500000.0},
        "ffn_config": {"ffn_hidden_size": 96, "moe_num_experts": 4, "moe_top_k": 2},
    },
}


# what a config class needs beside its defaults to validate at all
REQUIRED_FOR = {
    "gemma4_assistant": {
        "text_config": {
            "hidden_size_per_layer_input": 0,
            "vocab_size_per_layer_input": 0,
            "enable_moe_block": False,
            "use_double_wide_mlp": False,
        }
    },
}


def _layer_pattern(values: list[Any], n: int) -> list[Any]:
    """A per-layer list cut to n layers that keeps one of each kind it has (a hybrid's
    attention layer among its recurrent ones), in their order."""
    firsts = sorted({values.index(v) for v in values})[:n]
    rest = [i for i in range(len(values)) if i not in firsts]
    return [values[i] for i in sorted(firsts + rest[: n - len(firsts)])]


def tiny_config(model_type: str) -> dict[str, Any]:
    """A config.json dict of `model_type` with transformers' defaults and tiny sizes."""
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    # the class's defaults, with what its own rules need beside them where its defaults alone
    # do not validate (Gemma 4's assistant: a text decoder without per-layer inputs)
    default = cls(**REQUIRED_FOR.get(model_type, {})).to_dict()
    stored = getattr(cls, "attribute_map", {})  # hidden_size -> n_embd, ...
    raw = {stored.get(k, k): v for k, v in TINY.items() if stored.get(k, k) in default}
    if "qk_rope_head_dim" in default:  # MLA: the head width is its parts', every head its KV
        raw.pop("head_dim", None)
        raw["num_key_value_heads"] = raw.get("num_attention_heads", TINY["num_attention_heads"])
    layers = default.get("num_hidden_layers", default.get(stored.get("num_hidden_layers", "")))
    n = raw.get(stored.get("num_hidden_layers", "num_hidden_layers"))
    for k, v in default.items():  # per-layer lists of kinds, cut to the tiny depth
        if isinstance(v, list) and len(v) == layers and n and all(isinstance(x, str) for x in v):
            raw[k] = _layer_pattern(v, n)
    raw |= {k: v for k, v in TINY_FOR.get(model_type, {}).items()}
    for k in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(default.get(k), int):
            raw[k] = 0
    text = default.get("text_config")
    if isinstance(text, dict):
        raw["text_config"] = {k: v for k, v in TINY.items() if k in text}
        for k in ("pad_token_id", "bos_token_id", "eos_token_id"):
            if isinstance(text.get(k), int):
                raw["text_config"][k] = 0
        raw["text_config"] |= TINY_FOR.get(text.get("model_type", ""), {})
    for k, v in REQUIRED_FOR.get(model_type, {}).items():
        raw[k] = raw[k] | v if isinstance(v, dict) and isinstance(raw.get(k), dict) else v
    raw["model_type"] = model_type
    return raw


def check(model_type: str) -> dict[str, Any]:
    import numpy as np

    row: dict[str, Any] = {"model_type": model_type}
    raw = tiny_config(model_type)
    ref = _reference(raw)
    # the state dict: parameters and the persistent buffers a checkpoint holds beside them
    weights = {k: v.detach().float().numpy() for k, v in ref.state_dict().items()}
    vocab = ref.get_output_embeddings().weight.shape[0]
    b, t, p = 2, 5, 4
    rng = np.random.default_rng(0)
    ids, past_ids = rng.integers(0, vocab, (b, t)), rng.integers(0, vocab, (b, p))
    for phase, past in (("prefill", 0), ("decode", p)):
        if past and _keeps_no_cache(ref, past_ids):  # GPT-1: no cached step to check
            row |= dict.fromkeys(("decode_trace", "decode_flops", "decode_logits"), NO_CACHE)
            past_ids = past_ids[:, :0]
            break
        row |= _check_phase(raw, ref, weights, phase, ids, past_ids if past else None)
    row["onnx"] = _onnx(raw, ref, ids, past_ids)
    return row


def _reference(raw: dict[str, Any]) -> Any:
    """transformers' model of the tiny config, eager attention, random values."""
    import torch
    import transformers

    from graphllm.trace.hf import hf_config

    torch.manual_seed(0)
    cfg = hf_config(raw)  # the text decoder of a multimodal wrapper, as the trace takes it
    if hasattr(cfg, "_experts_implementation"):  # the traced one's: FlopCounterMode counts it
        cfg._experts_implementation = "batched_mm"
    ref = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    # FlopCounterMode's module tracker fails on a parameter handed to a kernel-tagged function
    # (itself a module) that still asks for a gradient
    ref.requires_grad_(False)
    # a tensor transformers starts at zero (a router's weight, a bias) ties every choice a
    # router makes, which torch and numpy break differently: random values instead
    with torch.no_grad():
        for t in ref.parameters():
            if t.is_floating_point() and not t.any():
                t.normal_(0.0, 0.02)
    return ref


def _check_phase(
    raw: dict[str, Any], ref: Any, weights: dict, phase: str, ids: Any, past_ids: Any
) -> dict[str, Any]:
    """One phase (prefill, or a cached step after `past_ids`): trace, params, FLOPs, logits."""
    import numpy as np
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from graphllm.models.workload import Workload
    from graphllm.passes import run
    from graphllm.runtime.interpret import Interpreter
    from graphllm.trace import traced_graph
    from graphllm.trace.forward import cache_argument
    from graphllm.trace.recurrences import reference_conv_flops

    (b, t), past = ids.shape, 0 if past_ids is None else past_ids.shape[1]
    start = time.perf_counter()
    g = traced_graph(raw, Workload(batch=b, seq_len=t, past_len=past, dtype="fp32"), values=True)
    row: dict[str, Any] = {f"{phase}_s": time.perf_counter() - start, f"{phase}_trace": True}
    res = run(g, ["verify", "params", "tokens", "cost"])
    with torch.no_grad():
        cache = _past_cache(ref, past_ids) if past else None
        feeds = _feeds(g, ids, past, cache, ref)
        kw = _positions(feeds)
        with FlopCounterMode(display=False) as fc:
            out = ref(torch.tensor(ids), **{cache_argument(ref): cache}, **kw)
    row["params"] = res["params"].total == _stored_numel(ref)
    counts = {str(k): v for k, v in fc.get_flop_counts()["Global"].items()}
    conv = counts.pop("aten.convolution", 0)
    row[f"{phase}_flops"] = res["cost"].flops["matmul"] == sum(counts.values()) and (
        conv == reference_conv_flops(g)
    )
    got = Interpreter(g, weights).run(feeds)["logits"]
    row[f"{phase}_logits"] = bool(np.abs(got - out.logits.float().numpy()).max() < 1e-4)
    return row


NO_CACHE = "no cache"  # a model that keeps none: its cached step is not a check


def _past_cache(ref: Any, past_ids: Any) -> Any:
    """transformers' cache after `past_ids`: the one its output carries, or the one it was
    handed, for a model that returns none (RecurrentGemma, whose modules keep its recurrent
    states beside it)."""
    import torch

    from graphllm.trace.forward import cache_argument, cache_of, handed_cache

    handed = handed_cache(ref)
    kw = {} if handed is None else {cache_argument(ref): handed}
    out = ref(torch.tensor(past_ids), use_cache=True, **kw)
    return cache_of(out) if handed is None else handed


def _keeps_no_cache(ref: Any, past_ids: Any) -> bool:
    import torch

    from graphllm.trace.forward import cache_of, handed_cache

    if handed_cache(ref) is not None:  # it keeps the cache it is handed
        return False
    with torch.no_grad():
        out = ref(torch.tensor(past_ids), use_cache=True)
    return cache_of(out) is None


def _onnx(raw: dict[str, Any], ref: Any, ids: Any, past_ids: Any) -> bool | str:
    """The traced model exported (decomposed, weights from save_pretrained) and run on
    onnxruntime after a cached past: its logits against transformers'; the error's first line
    where it fails."""
    import tempfile
    from pathlib import Path

    import numpy as np
    import onnxruntime as ort
    import torch

    from graphllm.exporters.onnx import export_onnx
    from graphllm.models.workload import Workload
    from graphllm.trace import traced_graph
    from graphllm.trace.forward import cache_argument

    try:
        with tempfile.TemporaryDirectory() as folder:
            # the checkpoint as transformers writes it: renamed tensors, experts one a tensor
            ref.save_pretrained(folder)
            cached = past_ids.shape[1] > 0
            wl = Workload(seq_len=1, past_len=int(cached), dtype="fp32")
            g = traced_graph(raw, wl, values=True)
            path = str(Path(folder) / "m.onnx")
            export_onnx(g, path, weights=folder, ops="decomposed")
            session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            with torch.no_grad():
                cache = _past_cache(ref, past_ids) if cached else None
                # before the step extends it
                feeds = _feeds(g, ids, past_ids.shape[1], cache, ref)
                # the positions the export is fed: transformers' Bamba starts them at 0 after
                # a cache when it is given none
                kw = {**_positions(feeds), cache_argument(ref): cache}
                want = ref(torch.tensor(ids), **kw).logits.float().numpy()
            names = {i.name for i in session.get_inputs()}
            feeds["attention_mask"] = np.ones(
                (ids.shape[0], sum(past_ids.shape[1:]) + ids.shape[1]), np.int64
            )
            feeds["position_ids"] = np.broadcast_to(
                np.arange(past_ids.shape[1], past_ids.shape[1] + ids.shape[1]), ids.shape
            ).copy()
            got = session.run(["logits"], {k: v for k, v in feeds.items() if k in names})[0]
            return bool(np.abs(got - want).max() < 1e-4)
    except Exception as e:
        return (
            f"{type(e).__name__}: {str(e).strip().splitlines()[0][:150] if str(e).strip() else ''}"
        )


def _positions(feeds: dict[str, Any]) -> dict[str, Any]:
    """transformers' position_ids argument: the positions the graph is fed, where it reads any."""
    import torch

    return {"position_ids": torch.tensor(feeds["position_ids"])} if "position_ids" in feeds else {}


def _stored_numel(ref: Any) -> int:
    """What a checkpoint of `ref` holds: its parameters and persistent buffers, a tied tensor
    once."""
    return sum(t.numel() for t in {t.data_ptr(): t for t in ref.state_dict().values()}.values())


def _feeds(g: Any, ids: Any, past: int, cache: Any, ref: Any) -> dict[str, Any]:
    import numpy as np

    from graphllm.trace.forward import cache_tensors, handed_cache

    b, t = ids.shape
    feeds = {"input_ids": ids}
    if "position_ids" in g:
        feeds["position_ids"] = np.broadcast_to(np.arange(past, past + t), (b, t)).copy()
    holder = None if handed_cache(ref) is None else ref  # the states its modules keep
    held = (
        {name: t for name, t, _ in cache_tensors(cache, "past_key_values", holder)} if cache else {}
    )
    for n in g.nodes("input"):
        if n.name in held:
            feeds[n.name] = held[n.name].float().numpy().copy()
    return feeds


def _child(model_type: str, q: Any) -> None:
    import warnings

    warnings.simplefilter("ignore")
    os.environ["GRAPHLLM_TRACE_CACHE"] = "0"  # each type traced afresh: the times are the trace's
    try:
        q.put(check(model_type))
    except Exception as e:  # one line: the cause
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        where = traceback.extract_tb(e.__traceback__)[-1]
        q.put(
            {
                "model_type": model_type,
                "error": f"{type(e).__name__}: {msg[:300]}",
                "at": f"{where.filename.rsplit('/', 1)[-1]}:{where.lineno}",
            }
        )


def run_one(model_type: str, timeout: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")  # fork from a threaded parent that holds torch can deadlock
    q = ctx.Queue()
    proc = ctx.Process(target=_child, args=(model_type, q))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        return {"model_type": model_type, "error": f"timed out after {timeout:.0f} s"}
    try:
        return q.get(timeout=5)
    except Exception:
        return {"model_type": model_type, "error": f"the check process died (exit {proc.exitcode})"}


PASSES = ("prefill_trace", "decode_trace", "params", "prefill_flops", "decode_flops")
RUNS = ("prefill_logits", "decode_logits")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated model types")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    types, skipped = decoder_types()
    if args.only:
        types = [t for t in args.only.split(",") if t]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda mt: run_one(mt, args.timeout), types))
    report(rows, skipped)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "excluded": skipped}, f, indent=1)


def report(rows: list[dict[str, Any]], skipped: dict[str, str]) -> None:
    n = len(rows)
    exact = [r for r in rows if all(_holds(r.get(k)) for k in PASSES)]
    runs = [r for r in exact if all(_holds(r.get(k)) for k in RUNS)]
    exported = [r for r in runs if r.get("onnx") is True]
    print(f"{'model_type':28} trace  params flops  logits  onnx  prefill_s")
    for r in rows:
        if "error" in r:
            print(f"{r['model_type']:28} FAIL   {r['error'][:150]}")
            continue
        marks = [_mark(r.get(k)) for k in ("decode_trace", "params", "decode_flops")]
        logits = "ok" if all(_holds(r.get(k)) for k in RUNS) else "--"
        print(
            f"{r['model_type']:28} {marks[0]:6} {marks[1]:6} {marks[2]:6} {logits:7} "
            f"{'ok' if r.get('onnx') is True else '--':5} {r.get('prefill_s', 0):.2f}"
        )
    print(
        f"\n{n} decoder-only types; {len(skipped)} excluded (encoders, seq2seq models, bidirectional ones)"
    )
    print("ok*: the model keeps no cache (prefill checked; no cached step exists)")
    print(
        f"trace with exact params and FLOPs: {len(exact)}/{n} = {100 * len(exact) / max(n, 1):.0f}%"
    )
    print(
        f"and logits equal transformers' (numpy interpreter): {len(runs)}/{n} = {100 * len(runs) / max(n, 1):.0f}%"
    )
    share = 100 * len(exported) / max(n, 1)
    print(f"and exported to ONNX with logits parity: {len(exported)}/{n} = {share:.0f}%")
    onnx_causes = Counter(r["onnx"][:100] for r in rows if isinstance(r.get("onnx"), str))
    for cause, k in onnx_causes.most_common():
        print(f"  ONNX failure x{k}: {cause}")
    times = [r["prefill_s"] for r in rows if "prefill_s" in r]
    if times:
        print(f"median trace time (prefill, 3 probes): {statistics.median(times):.2f} s")
    causes = Counter(
        r["error"].split(":")[0] + ": " + _cause(r["error"]) for r in rows if "error" in r
    )
    if causes:
        print("\nfailures by cause:")
        for cause, k in causes.most_common():
            print(f"  {k:3}  {cause}")


def _holds(v: Any) -> bool:
    return v is True or v == NO_CACHE


def _mark(v: Any) -> str:
    return "ok" if v is True else "ok*" if v == NO_CACHE else "--"


def _cause(error: str) -> str:
    text = error.split(":", 1)[1].strip() if ":" in error else error
    for key in ("runs aten.", "fails in", "mask", "branches", "no linear rule", "item()"):
        if key in text:
            return text[: text.find(key) + len(key) + 30].split(" in model")[0]
    return text[:90]


if __name__ == "__main__":
    sys.exit(main())
