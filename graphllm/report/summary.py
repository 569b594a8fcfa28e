"""Readable terminal summaries (rich tables) of the documents in graphllm.report."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from graphllm.models.family import CHUNKED, SLIDING
from graphllm.report.console import console as new_console


def _n(x: float) -> str:
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.2f}{unit}"
    return f"{float(x):g}"


def print_trace(doc: dict[str, Any], console: Console | None = None) -> None:
    """Model, workload, graph size and parameters by kind."""
    con = console or new_console()
    m, w, g, p = doc["model"], doc["workload"], doc["graph"], doc["params"]
    con.print(f"[bold]{m['name']}[/bold] ({m['model_type']})")
    if m.get("frontend") == "traced":
        con.print(
            "frontend: traced from transformers' modeling code (graphllm builds no family for "
            "this model_type, or --frontend traced asked for it)"
        )
    if m.get("text_decoder_of"):
        con.print(
            f"note: only the text decoder of this {m['text_decoder_of']} model is modelled "
            "(its text_config); the vision tower and projector are not"
        )
    q = m.get("quantization")
    weights = f"as the checkpoint stores them ({q['method']})" if q else w["weight_dtype"]
    phase = "training step (forward + backward)" if w.get("training") else w["phase"]
    con.print(
        f"workload: {phase}, B={w['batch']} T={w['seq_len']} P={w['past_len']} "
        f"(S={w['key_len']}); weights {weights}, activations {_activations(w)}, "
        f"KV cache {w['kv_dtype']}"
    )
    if q:
        con.print(
            f"storage: {q['describe']} (quantization_config). Parameters count the weights' "
            "values; the bytes below are what is stored, their scales and zero points included"
        )
    con.print(f"graph: {g['nodes']} nodes, {g['edges']} edges")
    table = Table("parameters", "count", "share", title=None)
    total = p["total"] or 1
    for kind, count in p["by_kind"].items():
        if count:
            table.add_row(kind, f"{count:,} ({_n(count)})", f"{100 * count / total:.1f}%")
    if p.get("mtp"):  # DeepSeek-V3's MTP modules: their weights are inside the kinds above
        main = p["total"] - p["mtp"]
        table.add_row("main model", f"{main:,} ({_n(main)})", f"{100 * main / total:.1f}%")
        table.add_row(
            "MTP modules", f"{p['mtp']:,} ({_n(p['mtp'])})", f"{100 * p['mtp'] / total:.1f}%"
        )
    table.add_row("[bold]total[/bold]", f"[bold]{p['total']:,}[/bold] ({_n(p['total'])})", "")
    table.add_row("active per token", f"{p['active']:,} ({_n(p['active'])})", "")
    if p["active"] != p["total"]:
        # the conventions vendors publish MoE active counts under (gpt-oss, GLM)
        for label, key in (
            ("  without embedding", "active_without_embedding"),
            ("  without embedding and head", "active_without_embedding_and_head"),
        ):
            if key in p:
                table.add_row(label, f"{p[key]:,} ({_n(p[key])})", "")
    con.print(table)
    if "token_mixing" in doc:
        print_token_mixing(doc["token_mixing"], con)
    if "flops" in doc:
        print_costs(doc, con)
    if "mla" in doc:
        print_mla(doc["mla"], doc["workload"], con)


def print_mla(mla: dict[str, Any], w: dict[str, Any], con: Console) -> None:
    """MLA's cache against multi-head attention's, and the two forms' cost."""
    kv, forms = mla["kv_cache_per_token"], mla["forms"]
    con.print(
        f"latent attention (MLA): KV cache per token {_b(kv['mla_bytes'])} "
        f"({kv['mla_values']:,} values: the latent and the RoPE key of every layer) against "
        f"{_b(kv['mha_bytes'])} with standard multi-head attention ({kv['ratio']:.1f}x less)"
    )
    naive, absorbed = forms["naive"], forms["absorbed"]
    con.print(
        f"MLA forms, this workload: naive FLOPs {_n(naive['flops'])}, bytes "
        f"{_b(naive['bytes'])}; absorbed FLOPs {_n(absorbed['flops'])}, bytes "
        f"{_b(absorbed['bytes'])} (shown above: --mla {w.get('mla', 'naive')})"
    )


def print_token_mixing(tm: dict[str, Any], con: Console) -> None:
    """Which ops mix token positions, and how far the last position reaches."""
    names = tm["nodes"]
    ops = ", ".join(tm["mixing_ops"]) or "none"
    con.print(f"token mixing: {len(names)} nodes mix positions (ops: {ops}); all others are local")
    layers = tm["per_layer"]
    reach = ", ".join(str(r["reach"]) for r in layers[:8]) + (" ..." if len(layers) > 8 else "")
    con.print(
        f"receptive field of the last position: {tm['receptive_field']} input positions "
        f"(per layer: {reach})"
    )


def _b(x: float) -> str:
    for unit, div in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.2f} {unit}"
    return f"{x:g} B"


def _t(sec: float) -> str:
    return f"{sec * 1e3:.3f} ms" if sec < 1 else f"{sec:.3f} s"


def print_costs(doc: dict[str, Any], con: Console) -> None:
    """FLOPs, bytes, memory and roofline time, with the top scopes and op kinds."""
    f, b, m, r = doc["flops"], doc["bytes"], doc["memory"], doc.get("roofline")
    w = doc["workload"]
    kind = "forward + backward" if w.get("training") else "forward"
    con.print(
        f"FLOPs ({kind}): total {_n(f['total'])}, matmul {_n(f['matmul'])}, "
        f"matmul with the mask skipped {_n(f['matmul_causal'])}"
    )
    con.print(
        f"bytes moved ({w.get('attention', 'flash')} attention, forward pass): total {_b(b['total'])} = "
        f"weights {_b(b['weights'])} + KV cache {_b(b['kv_cache'])} + "
        f"activations {_b(b['activations'])}"
    )
    con.print(
        f"memory: weights {_b(m['weights'])} (active {_b(m['weights_active'])}), "
        f"KV cache {_b(m['kv_cache'])}{_window_saving(m, _limited(doc))}, peak activations "
        f"{_b(m['activations'])}"
    )
    if m.get("state"):
        con.print(_state_line(m, doc["model"].get("frontend") != "traced"))
    fit = doc.get("fit") or {}
    if fit.get("parts"):  # a training step's memory on one device
        parts, o = fit["parts"], fit["options"]
        con.print(
            f"training memory on one device (Adam, fp32 state, recompute {o['recompute']}, "
            f"ZeRO-{o['zero']}): weights {_b(parts['weights'])}, gradients "
            f"{_b(parts['gradients'])}, optimizer {_b(parts['optimizer'])}, activations "
            f"{_b(parts['activations'] + parts['activations_working'])}: {_b(fit['needs'])}"
        )
    table = Table("scope", "FLOPs", "bytes", "time" if r else "")
    times = r["by_scope"] if r else {}
    for scope, fl in sorted(f["by_scope"].items(), key=lambda kv: -kv[1]):
        t = _t(times[scope]) if scope in times else ""
        table.add_row(scope, _n(fl), _b(b["by_scope"].get(scope, 0.0)), t)
    con.print(table)
    # a node counts in every scope it lies in (attention holds core_attention, moe its router
    # and experts): say so, since the rows then add up to more than the whole
    con.print("scopes nest (an op counts in each one it lies in): the rows overlap")
    ops = Table("op kind", "FLOPs", "time" if r else "")
    op_times = r["by_op"] if r else {}
    top = sorted(f["by_op"].items(), key=lambda kv: -op_times.get(kv[0], kv[1]))[:8]
    for op, fl in top:
        ops.add_row(op, _n(fl), _t(op_times[op]) if op in op_times else "")
    con.print(ops)
    if r and w.get("attention", "flash") == "flash" and f["matmul_causal"] < f["matmul"]:
        con.print(
            "FLOPs count every (query, key) pair; flash attention skips the masked blocks, so "
            "the attention matmuls are timed on the pairs the mask leaves"
        )
    if r:
        share = r["compute_bound_seconds"] / r["seconds"] if r["seconds"] else 0.0
        line = f"roofline on {r['hardware']}: {_t(r['seconds'])} per step"
        if r["phase"] == "decode":
            line += f", {r['ms_per_token']:.3f} ms per token"
        line += f", {r['tokens_per_second']:,.0f} tokens/s; {100 * share:.0f}% of it compute-bound"
        con.print(line + _fit_note(doc.get("fit"), r["hardware"]))
        con.print(rate_model_line(r))


def hardware_model_line(hw: dict[str, Any]) -> str:
    """Which model a device's times come from (a report's `hardware` entry), in one line."""
    if hw.get("achievable") is None and hw.get("links"):  # calibrate --link's
        return (
            f"times: {hw['name']}'s measured peaks; {', '.join(hw['links'])} at their measured "
            "bus bandwidth plus latency (graphllm calibrate --link), other collectives at the "
            "line rate"
        )
    if hw.get("achievable") is None:
        return "times: ideal model (data-sheet peaks and line rates, no latencies or launches)"
    return (
        "times: achievable model (measured GEMM, attention and HBM rates; collectives at "
        "latency plus bytes over bus bandwidth, by NCCL's tuner where the link names it, "
        "NVLS where measured; kernel launches); --ideal for peaks"
    )


def rate_model_line(r: dict[str, Any]) -> str:
    """Which model produced a roofline's times, in one line."""
    if r.get("rate_model", "ideal") == "ideal":
        return "times: ideal model (data-sheet peaks, no latencies or launch costs; --ideal)"
    if r["rate_model"] == "calibrated":
        dispatch = (
            f"; {r['kernels']:,} ops, {_t(r['launch_seconds'])} of dispatch"
            if r.get("launch_seconds")
            else ""
        )
        return (
            f"times: calibrated model (graphllm calibrate's GEMM rates by shape, attention by "
            f"step, read bandwidth "
            f"{r['bandwidth'] / 1e9:.1f} GB/s at this step's working set{dispatch}); --ideal for "
            f"peaks"
        )
    launch = "CUDA graphs" if r["cuda_graphs"] else "one launch each"
    overhead = (
        f"{_t(r['launch_seconds'])} of launch overhead"
        if r["launch_seconds"]
        else f"no launch costs measured for {r['hardware']}"
    )
    return (
        f"times: achievable model (measured GEMM, attention and HBM rates; {r['kernels']:,} "
        f"kernels, {launch}: {overhead}); --ideal for peaks"
    )


def _fit_note(fit: dict[str, Any] | None, hardware: str) -> str:
    """What the roofline line adds when weights, cache and activations overflow the device."""
    if not fit or fit["fits"]:
        return ""
    note = (
        f"; but it does not fit one {hardware}: it needs {_b(fit['needs'])} of "
        f"{_b(fit['memory_bytes'])}"
    )
    if fit["devices"] is None:
        return note + f" ({fit['unplanned']})"
    layout = " ".join(f"{k}={v}" for k, v in fit["layout"].items())
    command = fit.get("plan_command") or f"graphllm plan -n {fit['devices']}"
    also = f" ({fit['plan_note']})" if fit.get("plan_note") else ""
    return note + (
        f"; {fit['devices']} devices are the fewest that hold it ({layout}, "
        f"{_b(fit['layout_memory_bytes'])} each): `{command}` ranks their layouts{also}"
    )


def print_sweep(rows: list[dict[str, Any]], title: str, console: Console | None = None) -> None:
    """How FLOPs, bytes and predicted time grow with T, under `title` (the model and device),
    and which model produced the times."""
    con = console or new_console()
    con.print(title)
    table = Table("T", "FLOPs", "x", "bytes", "x", "time", "x")
    first = rows[0]
    for row in rows:

        def ratio(key: str, row: dict[str, Any] = row) -> str:
            return f"{row[key] / first[key]:.2f}" if first[key] else ""

        sec = row["seconds"]
        table.add_row(
            str(row["seq_len"]),
            _n(row["flops"]),
            ratio("flops"),
            _b(row["bytes"]),
            ratio("bytes"),
            _t(sec) if sec is not None else "",
            ratio("seconds") if sec is not None else "",
        )
    con.print(table)
    con.print(sweep_model_line(rows[-1]))


def sweep_model_line(row: dict[str, Any]) -> str:
    """Which model produced a sweep's times (a row of it), in one line."""
    model = row.get("rate_model")
    if model is None:
        return "times: none (no --hardware)"
    if model == "ideal":
        return "times: ideal model (data-sheet peaks, no latencies or launch costs; --ideal)"
    if model == "calibrated":
        return "times: calibrated model (graphllm calibrate's tables); --ideal for peaks"
    launch = "through CUDA graphs" if row["cuda_graphs"] else "one launch each"
    return (
        f"times: achievable model (measured GEMM, attention and HBM rates; kernels {launch}); "
        "--ideal for peaks"
    )


def _state_line(m: dict, compared: bool = True) -> str:
    """the linear-attention / Mamba layers' states beside the attention layers' keys, against
    full attention on every layer at the same length where that is `compared` (a traced
    model's recurrent layers have no K/V shape of the model's to price them at)."""
    held, full = m["kv_cache"] + m["state"], m.get("kv_cache_full", 0.0)
    line = (
        f"state (conv and recurrent, constant in the sequence length) {_b(m['state'])}; "
        f"KV cache + state {_b(held)}"
    )
    if not compared:
        return line
    saving = f": {1 - held / full:.0%} less" if full > held else ""
    return f"{line}, against {_b(full)} with full attention on every layer{saving}"


def _limited(doc: dict[str, Any]) -> str:
    """What the layers that keep fewer keys are: windows, chunks (Llama 4's), or both."""
    types = set(doc["model"].get("config", {}).get("layer_types") or ())
    kinds = [k for k, t in (("windows", SLIDING), ("chunks", CHUNKED)) if t in types]
    return " and ".join(kinds) or "windows"


def _window_saving(m: dict, limited: str = "windows") -> str:
    """What the layers that keep a window save against full attention on every layer; after a
    prefill longer than the window, against what the window layers keep for the next step.
    `limited` names those layers' limits (windows, chunks)."""
    full, kv = m.get("kv_cache_full", 0.0), m["kv_cache"]
    kept = m.get("kv_cache_kept", kv) or kv
    if m.get("state"):  # a hybrid: the state line compares the whole cache with full attention
        return ""
    if kept < 0.99 * kv:  # a prefill longer than a window: the step held all T, it keeps less
        return (
            f" ({_b(kept)} kept for the next step; {_b(full)} with full attention on every "
            f"layer: {limited} save {1 - kept / full:.0%})"
        )
    if full <= kv * (1 + 1e-9):
        return ""
    return f" ({_b(full)} with full attention on every layer: {limited} save {1 - kv / full:.0%})"


def _activations(w: dict) -> str:
    """The activation dtype, and the stream's where that is a W8A8 GEMM-only dtype."""
    stream = w.get("stream_dtype", w["act_dtype"])
    if stream == w["act_dtype"]:
        return w["act_dtype"]
    return f"{w['act_dtype']} into the GEMMs, {stream} between them"
