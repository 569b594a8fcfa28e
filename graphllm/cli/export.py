"""`graphllm export`: the model as an ONNX file that onnxruntime runs (prefill and decode);
`graphllm bench`: that file timed on onnxruntime beside the roofline prediction."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from graphllm.build.builder import build_export_graph, build_graph
from graphllm.build.weights import unmodelled_tensors
from graphllm.cli.common import (
    WARMUPS,
    WEIGHTS_CONFIG_HELP,
    export_deepseek_options,
    frontend_option,
    hardware_option,
    json_option,
    logits_option,
    options,
    repeats_option,
    resolve,
    seed_option,
    source_options,
    traced_source,
    user_errors,
)
from graphllm.cli.progress import bar, showing
from graphllm.errors import ConfigError, NoCacheError
from graphllm.exporters.genai import CONFIG, MODEL, export_genai
from graphllm.exporters.model_explorer import export_model_explorer, overlay_paths
from graphllm.exporters.onnx import ExportResult, export_onnx
from graphllm.exporters.onnx.export import check_export_target
from graphllm.exporters.onnx.nbits import ACCURACY_LEVELS, BITS, BLOCK_SIZES, Quantization
from graphllm.exporters.onnx.quantize import checkpoint_quantization
from graphllm.files import check_target, folder_problem, json_text, temporary_folder
from graphllm.ir import Graph
from graphllm.models.hardware import load_hardware, local_path
from graphllm.models.model_config import ModelConfig
from graphllm.models.workload import Workload
from graphllm.runtime.bench import BenchReport
from graphllm.runtime.bench import bench as run_bench
from graphllm.runtime.budget import require_bench_export, require_threads
from graphllm.runtime.calibrate import check_local_writable
from graphllm.runtime.session import PROVIDERS, providers
from graphllm.trace import traced_graph

OP_SETS = ["auto", "decomposed", "standard", "ort"]  # exporters/onnx.py LOWERINGS, and auto
DEVICES = ["auto", "cpu", "cuda"]


def ops_options(fn: Any) -> Any:
    """--ops and --device: the lowering, by default the fastest exact one for the provider."""
    fn = click.option(
        "--device",
        type=click.Choice(DEVICES),
        default="auto",
        show_default=True,
        help="onnxruntime provider to run on (auto: CUDA when this onnxruntime has it).",
    )(fn)
    return click.option(
        "--ops",
        type=click.Choice(OP_SETS),
        default="auto",
        show_default=True,
        help="ONNX lowering: decomposed (one node per IR op), standard (opset 23 Attention, "
        "RotaryEmbedding, RMSNormalization), ort (com.microsoft GroupQueryAttention, "
        "SkipSimplifiedLayerNormalization, MoE); auto picks per provider and family.",
    )(fn)


def provider_kind(device: str) -> str:
    """'cpu' or 'cuda': the provider `device` runs on (auto without onnxruntime: cpu)."""
    if device != "auto":
        return device
    try:
        return "cuda" if providers("auto")[0] == PROVIDERS["cuda"] else "cpu"
    except ModuleNotFoundError:
        return "cpu"


def quantize_options(fn: Any) -> Any:
    """--quantize and its settings (defaults: onnxruntime-genai's model builder's for the CPU)."""
    return options(
        click.option(
            "--quantize",
            type=click.Choice(list(BITS)),
            help="Linear weights as onnxruntime's MatMulNBits, quantized blockwise from the "
            "float weights (embeddings and routed experts stay float); a GPTQ/AWQ "
            "checkpoint's integers are kept as stored.",
        ),
        click.option(
            "--block-size",
            type=click.Choice([str(b) for b in BLOCK_SIZES]),
            help="Values per quantization block along the input axis [default: 32; a "
            "GPTQ/AWQ checkpoint's group size].",
        ),
        click.option(
            "--accuracy-level",
            type=click.Choice([str(a) for a in ACCURACY_LEVELS]),
            help="MatMulNBits compute: 0/1 fp32, 4 int8 activations [default: 4].",
        ),
        click.option(
            "--symmetric",
            is_flag=True,
            default=None,
            help="Symmetric blocks, no zero points [default: asymmetric, uint8 zero points].",
        ),
    )(fn)


def quantization(
    method: str | None, block_size: str | None, accuracy_level: str | None, symmetric: bool | None
) -> Quantization | None:
    """The --quantize options as a Quantization; its settings without it are refused."""
    if method is None:
        given = [
            flag
            for flag, value in (
                ("--block-size", block_size),
                ("--accuracy-level", accuracy_level),
                ("--symmetric", symmetric),
            )
            if value is not None
        ]
        if given:
            raise ConfigError(f"{', '.join(given)} set how --quantize quantizes: give --quantize")
        return None
    defaults = Quantization(method)
    return Quantization(
        method,
        int(block_size) if block_size else defaults.block_size,
        int(accuracy_level) if accuracy_level else defaults.accuracy_level,
        bool(symmetric),
    )


# -- --format model-explorer and genai ---------------------------------------------
FORMATS = ["onnx", "model-explorer", "genai"]
EXPLORER_HARDWARE = "h100"  # trace's default device: the time overlay's


def explorer_options(fn: Any) -> Any:
    """--format, and the workload and device Model Explorer's cost overlays are computed at."""
    return options(
        click.option(
            "--format",
            "fmt",
            type=click.Choice(FORMATS),
            default="onnx",
            show_default=True,
            help="onnx: OUTPUT.onnx; genai: the folder OUTPUT for onnxruntime-genai "
            "(model.onnx, genai_config.json, tokenizer files); model-explorer: OUTPUT.json, "
            "Google AI Edge Model Explorer's graph, and OUTPUT.{flops,bytes,time}.json overlays.",
        ),
        click.option(
            "--hardware",
            help=f"model-explorer: the device of the predicted-time overlay [default: "
            f"{EXPLORER_HARDWARE}].",
        ),
        click.option("--batch", "-b", type=click.IntRange(min=1), help="model-explorer: B."),
        click.option(
            "--seq-len", "-t", type=click.IntRange(min=1), help="model-explorer: new tokens T."
        ),
        click.option(
            "--past-len", type=click.IntRange(min=0), help="model-explorer: past tokens P."
        ),
    )(fn)


def export_explorer(
    config_path: Path | None,
    preset: str | None,
    dtype: str | None,
    logits: str | None,
    mla: str,
    mtp: bool,
    hardware: str | None,
    batch: int | None,
    seq_len: int | None,
    past_len: int | None,
    output: Path,
    given: dict[str, Any],
) -> None:
    """`export --format model-explorer`: the analysed graph (as `trace` builds it: the
    checkpoint's storage, this workload) as Model Explorer's graph JSON and its overlays."""
    wrong = [k for k, v in given.items() if v is not None]
    if wrong:
        raise ConfigError(
            f"{', '.join(wrong)}: how an ONNX export is written; --format model-explorer "
            "writes the graph and its costs"
        )
    # before the work: the graph JSON and each overlay beside it
    for target in (output, *overlay_paths(output).values()):
        check_target(target, inputs=(config_path,))
    options = _model_only(config_path, preset, dtype, logits)
    options |= {"batch": batch, "seq_len": [seq_len] if seq_len else None, "past_len": past_len}
    config, workload = resolve(options)
    hw = load_hardware(hardware or EXPLORER_HARDWARE)
    graph = build_graph(config, workload, mla=mla, mtp=mtp)
    r = export_model_explorer(graph, output, hardware=hw)
    overlays = ",".join(str(p) for p in r.overlays.values())
    click.echo(
        f"wrote {r.path}: {config.name}, {r.nodes:,} nodes (B={workload.batch}, "
        f"T={workload.seq_len}, P={workload.past_len}; time on {hw.name}); overlays "
        f"{', '.join(p.name for p in r.overlays.values())}"
    )
    click.echo(f"view: model-explorer {r.path} --node_data_paths={overlays}")


def export_genai_folder(
    config_path: Path | None,
    preset: str | None,
    weights: Path | None,
    dtype: str,
    seed: int,
    logits: str | None,
    mla: str,
    mtp: bool,
    ops: str,
    device: str,
    output: Path,
    no_weights: bool = False,
    quantize: str | None = None,
) -> None:
    """`export --format genai`: the folder onnxruntime-genai loads (float weights, random or
    from --weights: --no-weights and --quantize are refused)."""
    if no_weights or quantize is not None:
        flag = "--no-weights" if no_weights else "--quantize"
        raise ConfigError(f"{flag}: --format genai writes float weights, random or --weights")
    if weights is not None and config_path is None and preset is None:
        config_path = weights
    # before the work: a folder that cannot be made, or files in it that cannot be replaced
    problem = folder_problem(output)
    if problem is not None:
        raise ConfigError(f"cannot write the genai export under {output}: {problem}")
    if output.is_dir():
        check_export_target(output / MODEL, inputs=(config_path, weights))
        check_target(output / CONFIG, inputs=(config_path, weights))
    config, workload, graph = _export_graph(config_path, preset, dtype, logits, mla, mtp)
    with bar(f"writing {output.name}", showing(), in_bytes=True) as told:
        r = export_genai(
            graph,
            output,
            workload=workload,
            weights=weights,
            config_file=config_path,
            seed=seed,
            ops=ops,
            device=provider_kind(device),
            progress=told,
        )
    tok = ", ".join(r.tokenizer) if r.tokenizer else "no tokenizer files (give --weights DIR)"
    shared = r.config["search"]["past_present_share_buffer"]
    click.echo(
        f"wrote {r.folder}: {r.model.path.name} ({config.name}, {dtype}, {r.model.lowering} "
        f"lowering, weights {r.model.weights}), genai_config.json (type {r.model_type}, "
        f"past_present_share_buffer {str(shared).lower()}), {tok}"
    )


@click.command()
@source_options(WEIGHTS_CONFIG_HELP)
@click.option(
    "--weights",
    type=click.Path(path_type=Path, file_okay=False),
    help="A transformers checkpoint folder (safetensors) to read the weights from.",
)
@click.option("--no-weights", is_flag=True, help="No weights: they become graph inputs (Netron).")
@click.option(
    "--dtype",
    type=click.Choice(["fp32", "fp16"]),
    help="Activations and weights [default: fp32; model-explorer: the config's].",
)
@seed_option("Seed of random weights.")
@logits_option
@ops_options
@quantize_options
@export_deepseek_options
@explorer_options
@frontend_option
@click.option("--output", "-o", type=click.Path(path_type=Path), required=True)
@user_errors
def export(
    config_path: Path | None,
    preset: str | None,
    weights: Path | None,
    no_weights: bool,
    dtype: str | None,
    seed: int,
    logits: str | None,
    ops: str,
    device: str,
    quantize: str | None,
    block_size: str | None,
    accuracy_level: str | None,
    symmetric: bool | None,
    mla: str,
    mtp: bool,
    fmt: str,
    hardware: str | None,
    batch: int | None,
    seq_len: int | None,
    past_len: int | None,
    frontend: str,
    output: Path,
) -> None:
    """Write the model as ONNX: dynamic batch and lengths, KV cache in and out, left padding.

    Weights are seeded random unless --weights names a checkpoint folder; past 2 GB they go to
    OUTPUT.<hex>.data beside the model. The config and workload ride along in the model's metadata.
    --format genai writes the model into the folder OUTPUT with onnxruntime-genai's
    genai_config.json and the checkpoint's tokenizer files; --format model-explorer writes the
    graph as Model Explorer's graph JSON, with one cost overlay per metric beside it.
    """

    if fmt == "model-explorer":
        export_explorer(
            config_path, preset, dtype, logits, mla, mtp, hardware, batch, seq_len, past_len,
            output,
            given={"--weights": weights, "--no-weights": no_weights or None,
                   "--quantize": quantize, "--block-size": block_size,
                   "--accuracy-level": accuracy_level, "--symmetric": symmetric,
                   "--ops": None if ops == "auto" else ops,
                   "--device": None if device == "auto" else device},
        )  # fmt: skip
        return
    _refuse_explorer_flags(hardware, batch, seq_len, past_len)
    dtype = dtype or "fp32"
    if fmt == "genai":
        genai = (weights, dtype, seed, logits, mla, mtp, ops, device)
        export_genai_folder(config_path, preset, *genai, output, no_weights, quantize)
        return
    if weights is not None and no_weights:
        raise ConfigError("give --weights DIR or --no-weights, not both")
    quant = _written_quantization(quantize, block_size, accuracy_level, symmetric, no_weights)
    config_path = config_path or (weights if preset is None else None)  # a checkpoint's own
    if export_traced(
        frontend, (config_path, preset, weights, no_weights, seed), dtype, ops, quant, output
    ):
        return
    source = _Source(config_path, preset, weights, dtype, logits, mla, mtp)
    export_onnx_file(source, no_weights, seed, ops, device, quant, block_size is not None, output)


def export_traced(
    frontend: str,
    given: tuple[Path | None, str | None, Path | None, bool, int],
    dtype: str,
    ops: str,
    quant: Quantization | None,
    output: Path,
) -> bool:
    """`export` of a model traced from transformers' code (graphllm.trace), where the model is
    one (`given`: --config, --model, --weights, --no-weights and --seed): the decomposed
    lowering at fp32, weights random, from a checkpoint or none. False for a built family."""
    config_path, preset, weights, no_weights, seed = given
    source = traced_source({"config_path": config_path, "preset": preset}, frontend)
    if source is None:
        return False
    for flag, bad in (
        (f"--ops {ops}", ops not in ("auto", "decomposed")),
        (f"--dtype {dtype}", dtype != "fp32"),
        ("--quantize", quant is not None),
    ):
        if bad:
            raise ConfigError(
                f"{flag}: a traced model exports at fp32 with the decomposed lowering"
            )
    check_export_target(output, inputs=(config_path, weights))
    graph, steps = _traced_export_graph(*source)
    r = export_onnx(
        graph, output, weights=weights, seed=seed, no_weights=no_weights, ops="decomposed"
    )
    data = f" + {r.data_path.name}" if r.data_path else ""
    click.echo(
        f"wrote {r.path}{data}: {source[1]} (traced from transformers' code), fp32, {steps}, "
        f"{r.lowering} lowering, {r.nodes} ONNX nodes, {r.params / 1e6:.1f}M params, "
        f"weights {r.weights}"
    )
    return True


def _traced_export_graph(raw: dict[str, Any], name: str) -> tuple[Graph, str]:
    """The traced graph an export lowers, and the steps it runs: a cached step (its export
    serves the prefill too), or the prefill alone where the model keeps no cache (GPT-1)."""
    try:
        wl = Workload(batch=1, seq_len=1, past_len=1, dtype="fp32")
        return traced_graph(raw, wl, name, True), "prefill and cached steps"
    except NoCacheError:
        wl = Workload(batch=1, seq_len=1, past_len=0, dtype="fp32")
        return traced_graph(raw, wl, name, True), "prefill only (the model keeps no cache)"


def _written_quantization(
    method: str | None,
    block_size: str | None,
    accuracy_level: str | None,
    symmetric: bool | None,
    no_weights: bool,
) -> Quantization | None:
    """`quantization` of the --quantize options, refused with --no-weights (nothing to quantize)."""
    quant = quantization(method, block_size, accuracy_level, symmetric)
    if quant is not None and no_weights:
        raise ConfigError(
            "--quantize quantizes the weights it writes: give random weights or --weights DIR, "
            "not --no-weights"
        )
    return quant


def _refuse_explorer_flags(
    hardware: str | None, batch: int | None, seq_len: int | None, past_len: int | None
) -> None:
    """The workload flags only --format model-explorer reads, refused for the other formats."""
    workload_flags = {"--hardware": hardware, "--batch": batch, "--seq-len": seq_len}
    workload_flags["--past-len"] = past_len
    given = [k for k, v in workload_flags.items() if v is not None]
    if given:
        raise ConfigError(
            f"{', '.join(given)}: the workload and device of model-explorer's cost overlays; "
            "an ONNX export's lengths are dynamic (give --format model-explorer)"
        )


@dataclass(frozen=True)
class _Source:
    """What `export` builds the model from: its config (or preset), checkpoint and graph options."""

    config_path: Path | None
    preset: str | None
    weights: Path | None
    dtype: str
    logits: str | None
    mla: str
    mtp: bool


def export_onnx_file(
    source: _Source,
    no_weights: bool,
    seed: int,
    ops: str,
    device: str,
    quant: Quantization | None,
    block_given: bool,
    output: Path,
) -> None:
    """`export --format onnx`: OUTPUT.onnx (and its weights file beside it, past 2 GB)."""
    s = source
    # before the work: a device, a FIFO, a folder where the model or an earlier export's weights
    # file is, a missing or read-only folder, or one of the inputs is refused now
    check_export_target(output, inputs=(s.config_path, s.weights))
    config, workload, graph = _export_graph(
        s.config_path, s.preset, s.dtype, s.logits, s.mla, s.mtp
    )
    if s.weights is not None and config.text_decoder_of:
        unused = unmodelled_tensors(s.weights, config.text_decoder_of)
        click.echo(
            f"note: the checkpoint's {len(unused):,} tensors of the vision tower and projector "
            f"are not read: only the text decoder of this {config.text_decoder_of} model is "
            "modelled",
            err=True,
        )
    stored = graph.meta.get("checkpoint_quantization")
    if quant is not None and s.weights is not None and stored is not None:
        # a GPTQ/AWQ checkpoint's integers are kept: its group size is the default block
        quant = checkpoint_quantization(quant, stored.weights, block_given=block_given)
    with bar(f"writing {output.name}", showing() and not no_weights, in_bytes=True) as told:
        r = export_onnx(
            graph,
            output,
            workload=workload,
            weights=s.weights,
            seed=seed,
            no_weights=no_weights,
            ops=ops,
            device=provider_kind(device),
            quantize=quant,
            progress=told,
        )
    click.echo(f"wrote {r.path}{_wrote(r, config, s.dtype, quant, no_weights)}")


def _wrote(
    r: ExportResult, config: ModelConfig, dtype: str, quant: Quantization | None, no_weights: bool
) -> str:
    """The line `export` ends with, after the model's path: its data file, what it holds."""
    data = f" + {r.data_path.name}" if r.data_path else ""
    size = "" if no_weights else f" ({r.weight_bytes / 1e9:.2f} GB)"
    how = dtype
    if quant is not None:
        zp = "symmetric" if quant.symmetric else "zero points"
        how += (
            f" activations, {quant.method} MatMulNBits weights (block {quant.block_size}, "
            f"{zp}, accuracy level {quant.accuracy_level})"
        )
    return (
        f"{data}: {config.name}, {how}, {r.lowering} lowering, {r.nodes} ONNX "
        f"nodes, {r.params / 1e6:.1f}M params{size}, weights {r.weights}"
    )


@click.command()
@click.argument("model_path", required=False, type=click.Path(path_type=Path, dir_okay=False))
@source_options(
    "Export this config (random weights) to a temporary file and bench that.",
    "Export this preset and bench it.",
)
@click.option("--dtype", type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True)
@ops_options
@export_deepseek_options
@click.option("--prompt-len", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--new-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--batch", "-b", type=click.IntRange(min=1), default=1, show_default=True)
@repeats_option
@click.option("--warmup", type=WARMUPS, default=1, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), help="intra-op threads [default: CPUs]")
@hardware_option("local")
@click.option("--no-predict", is_flag=True, help="Measure only: no roofline prediction.")
@click.option(
    "--no-huge-pages",
    is_flag=True,
    help="Leave the loaded weights on the pages they got (by default they are moved onto "
    "transparent huge pages, as numpy's buffers are; graphllm.hugepages).",
)
@json_option
@user_errors
def bench(
    model_path: Path | None,
    config_path: Path | None,
    preset: str | None,
    dtype: str,
    ops: str,
    device: str,
    mla: str,
    mtp: bool,
    prompt_len: int,
    new_tokens: int,
    batch: int,
    repeats: int,
    warmup: int,
    threads: int | None,
    hardware: str,
    no_predict: bool,
    no_huge_pages: bool,
    as_json: bool,
) -> None:
    """Time MODEL.onnx (or the --config/--model, exported first) on onnxruntime: prefill latency
    for a prompt, decode ms per token through the KV cache (IO binding), tokens/s, each the
    median over --repeats after --warmup runs, beside the roofline prediction on --hardware and
    the ratio measured/predicted. A graphllm .onnx is analysed from its metadata; `local`
    calibrates this machine first when it has not been."""

    _check_bench_source(model_path, config_path, preset, ops, mla, mtp)
    _check_bench_hardware(None if no_predict else hardware)
    # before the temporary folder and the export: a refusal leaves nothing behind
    require_threads(threads or os.cpu_count() or 1, "bench")
    built = None
    if model_path is None:
        built = _export_graph(config_path, preset, dtype, None, mla, mtp)
        _require_bench(built, batch, prompt_len, new_tokens)
    # what it does on the way (the export, a calibration, progress) is for a terminal: in a log
    # or a pipe, stderr holds nothing but an error line, if any
    chatty = not as_json and sys.stderr is not None and sys.stderr.isatty()
    say = (lambda msg: click.echo(msg, err=True)) if chatty else None
    # the export of --config/--model: removed on errors and signals; a killed run's by the next
    with temporary_folder("graphllm-bench") as tmp:
        if built is not None:
            model_path = _export_to_bench(built, tmp / "model.onnx", ops, device, say)
        report = run_bench(
            model_path,
            prompt_len=prompt_len,
            new_tokens=new_tokens,
            batch=batch,
            repeats=repeats,
            warmup=warmup,
            threads=threads,
            device=device,
            hardware=None if no_predict else hardware,
            progress=chatty,
            say=say,
            huge_pages=not no_huge_pages,
        )
    if as_json:
        click.echo(json_text(report.to_dict(), indent=2))
    else:
        print_bench(report)


def _check_bench_source(
    model_path: Path | None,
    config_path: Path | None,
    preset: str | None,
    ops: str,
    mla: str,
    mtp: bool,
) -> None:
    """One model to bench: a .onnx file as it was exported, or a config exported here."""
    if (model_path is None) == (config_path is None and preset is None):
        raise ConfigError("give MODEL.onnx, or one of --config PATH / --model NAME")
    if model_path is not None and (ops != "auto" or mla != "naive" or mtp):
        raise ConfigError(
            "--ops, --mla and --mtp choose how a config is exported: give --config or "
            "--model (a .onnx file is benched as it was exported)"
        )


def _check_bench_hardware(hardware: str | None) -> None:
    """A bad spec, or a cache a calibration could not be saved in, refused before the export
    (None: no prediction, nothing to check)."""
    if hardware is None:
        return
    if hardware.strip().lower() != "local":
        load_hardware(hardware)
    elif not local_path().is_file():
        check_local_writable()


def _require_bench(
    built: tuple[ModelConfig, Workload, Graph], batch: int, prompt_len: int, new_tokens: int
) -> None:
    """The export and the runs of the --config/--model graph within this machine's budget."""
    config, _, graph = built
    vocab, heads = config.vocab_size, config.num_attention_heads
    require_bench_export(graph, vocab, heads, batch, prompt_len, new_tokens)


def _export_to_bench(
    built: tuple[ModelConfig, Workload, Graph],
    path: Path,
    ops: str,
    device: str,
    say: Any,
) -> Path:
    """The --config/--model graph exported (random weights, unchecked) to `path`."""
    config, workload, graph = built
    r = export_onnx(
        graph, path, workload=workload, ops=ops, device=provider_kind(device), check=False
    )
    if say:
        say(f"exported {config.name} ({r.lowering} lowering, random weights) to bench it")
    return path


def print_bench(report: BenchReport) -> None:
    """The measured figures beside the predicted ones, and their ratio."""
    huge = report.huge_page_bytes
    click.echo(
        f"{report.model} ({report.lowering} lowering) on {report.provider}, {report.threads} "
        f"threads, batch {report.batch}: prompt {report.prompt_len} tokens, then "
        f"{report.new_tokens} new; median of {report.repeats}"
        + (f"; {huge / 1e6:.0f} MB of its memory on huge pages" if huge else "")
    )
    pred = f"predicted ({report.hardware})" if report.hardware else ""
    ratio = "measured/predicted" if pred else ""
    click.echo(f"{'':19s} {'measured':>10s} {pred:>22s} {ratio:>19s}")
    for figure, unit, measured, predicted in report.figures():
        line = f"{figure:8s} {unit:10s} {_num(measured):>10s}"
        if predicted is not None:
            # time over predicted time, whichever way the figure is written
            slower = predicted / measured if unit == "tokens/s" else measured / predicted
            line += f" {_num(predicted):>22s} {slower:19.2f}"
        click.echo(line)
    if report.calibrated:
        click.echo("(this machine was calibrated for the prediction: graphllm calibrate)")


def _num(x: float) -> str:
    """Four significant digits without an exponent where that reads better."""
    if x >= 1e6 or x < 1e-3:
        return f"{x:.3e}"
    return f"{x:,.0f}" if x >= 1000 else f"{x:.4g}"


def _export_graph(
    config_path: Path | None,
    preset: str | None,
    dtype: str,
    logits: str | None,
    mla: str,
    mtp: bool,
) -> tuple[ModelConfig, Workload, Graph]:
    """The config, its workload defaults and the graph `export_onnx` writes (prefill and decode)."""
    # the export computes at `dtype` and dequantizes a quantized checkpoint's weights
    config, workload = resolve(_model_only(config_path, preset, dtype, logits), stored=False)
    return config, workload, build_export_graph(config, dtype, workload.logits, mla, mtp)


def _model_only(
    config_path: Path | None, preset: str | None, dtype: str, logits: str | None
) -> dict[str, Any]:
    """The options `resolve` takes, for commands whose workload is only a dtype (and logits)."""
    return {
        "config_path": config_path,
        "preset": preset,
        "batch": None,
        "seq_len": None,
        "past_len": None,
        "dtype": dtype,
        "weight_dtype": None,
        "act_dtype": None,
        "kv_dtype": None,
        "logits": logits,
    }
