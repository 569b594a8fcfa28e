"""What the `graphllm` commands share: the model and workload options, resolving them into a
ModelConfig and Workloads, and turning user errors into one line and exit code 2."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from graphllm.build.mla import MLA_FORMS
from graphllm.echo import shown
from graphllm.errors import ConfigError, GraphllmError, Interrupted
from graphllm.files import forget_inputs
from graphllm.frontends import require_engine_form
from graphllm.ir import Graph
from graphllm.models.config import (
    SUPPORTED,
    load_config,
    load_workload_section,
    read_config_source,
)
from graphllm.models.hardware import rate_model
from graphllm.models.model_config import ModelConfig
from graphllm.models.quantization import Quantization
from graphllm.models.workload import ATTENTION_FORMS, Workload
from graphllm.models.workload_merge import merge_workload
from graphllm.passes.parallel.engine import mla_form
from graphllm.trace.model import traced_graph
from graphllm.trace.stored import traced_quantization

DTYPE_NAMES = ["fp32", "bf16", "fp16", "fp8", "int8", "int4", "int4g32"]
PRESET_HELP = "A preset name (see `graphllm presets`)."
# the commands that can read a checkpoint's weights (export, run) find its config beside them
WEIGHTS_CONFIG_HELP = (
    "HF config.json, a checkpoint folder, or a YAML file (default: the --weights folder)."
)
ATTENTION_HELP = "Fused core attention, or every op through memory."
# numpy's generators take a non-negative seed
SEED = click.IntRange(min=0, max=2**63 - 1)
# timed repetitions: a median of more than this many says nothing more, and takes hours
REPEATS = click.IntRange(min=1, max=10_000)
WARMUPS = click.IntRange(min=0, max=1_000)
# new tokens a verification runs at when the user gives no T (t_given): each position is run
# or every rank simulated in numpy, so the 2048 that the analyses assume is far over budget
VERIFY_T = 12
# the workload flags besides --seq-len, as Workload's fields
WORKLOAD_FLAGS = ("batch", "past_len", "dtype", "weight_dtype", "act_dtype", "kv_dtype", "logits")
# --seq-len sweeps at most this many points: each builds and analyses a graph (up to a second)
MAX_SWEEP = 256


class IntList(click.ParamType):
    """A positive integer, or a comma-separated list of them (a sweep)."""

    name = "N[,N...]"

    def convert(self, value: Any, param: Any, ctx: Any) -> list[int]:
        if isinstance(value, list):
            return value
        try:
            out = [int(v) for v in str(value).split(",") if v.strip()]
        except ValueError:
            self.fail(f"{value!r} is not an integer or a comma-separated list of them", param, ctx)
        if not out or min(out) < 1:
            self.fail(f"{value!r}: sizes must be positive", param, ctx)
        if len(out) > MAX_SWEEP:
            self.fail(
                f"a sweep of {len(out):,} points; graphllm takes at most {MAX_SWEEP}", param, ctx
            )
        return out


def _shorten_words(message: str, width: int = 60) -> str:
    """A message with every word longer than `width` (a value echoed back: 5000 digits, a long
    path) cut to its start and its length."""
    return re.sub(
        rf"\S{{{width + 1},}}",
        lambda m: f"{m.group()[: width // 2]}... ({len(m.group()):,} characters)",
        message,
    )


def _fail(msg: str, code: int = 2) -> None:
    click.echo(f"error: {msg}", err=True)
    sys.exit(code)


class OneLineErrors(click.Group):
    """The command group whose usage errors (a bad choice, a number out of range, an unknown
    option) are one line on stderr and exit 2, as every other user error is, not click's
    usage block."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        forget_inputs()  # a CliRunner runs several commands in one process
        if sys.stdout is None:  # started with stdout closed (`>&-`): nowhere to answer
            _fail("stdout is closed; graphllm prints its results there")
        argv = args[0] if args and args[0] is not None else sys.argv[1:]
        unnamed = _undecodable(argv)
        if unnamed is not None:
            _fail(f"argument {unnamed} is not valid UTF-8 (graphllm takes UTF-8 file names)")
        try:
            with signals_interrupt():
                code = super().main(*args, standalone_mode=False, **kwargs)
                sys.stdout.flush()  # a full disk or a closed pipe shows here, not at exit
        except Interrupted as e:
            _fail(str(e), 128 + e.signum)
        except OSError as e:
            if e.errno not in _OUTPUT_ERRNOS:
                raise
            _output_failed(e)
        except click.ClickException as e:
            if type(e).__name__ == "NoArgsIsHelpError":  # a bare `graphllm`: the help, as is
                e.show()
                sys.exit(e.exit_code)
            # click's lists on one line, and the value it echoes shortened
            _fail(_shorten_words(" ".join(e.format_message().split())), e.exit_code)
        except click.exceptions.Abort:
            _fail("aborted", 1)
        sys.exit(code if isinstance(code, int) else 0)


# SIGHUP: the terminal closed under a long export
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# what writing to stdout can fail with: a full disk or /dev/full, a closed pipe, a lost terminal
_OUTPUT_ERRNOS = {errno.ENOSPC, errno.EPIPE, errno.EIO, errno.EFBIG, errno.EDQUOT, errno.EBADF}


def _undecodable(argv: Any) -> str | None:
    """The first argument that is not valid UTF-8 (Python keeps its bytes as surrogates, which
    no UTF-8 writer, onnx or onnxruntime can take), shown with its bytes escaped."""
    for arg in argv or ():
        if isinstance(arg, str):
            try:
                arg.encode("utf-8")
            except UnicodeEncodeError:
                return shown(os.fsencode(arg))
    return None


def _output_failed(e: OSError) -> None:
    """Stdout could not be written: one line (silence for a reader that left, as `| head`),
    and stdout pointed at /dev/null so that the exit's flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass  # not a real file (CliRunner's): nothing is flushed at exit
    if e.errno == errno.EPIPE:
        sys.exit(128 + signal.SIGPIPE)
    _fail(f"cannot write the output: {e.strerror}")


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGTERM, SIGINT and SIGHUP raise Interrupted in the main thread (so that `finally` blocks remove
    temporaries and the old output is left as it was); a second signal while that unwinds is
    ignored, so the cleanup finishes. The previous handlers come back afterwards (CliRunner
    runs the command inside pytest)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def interrupt(signum: int, frame: Any) -> None:
        if _in_import_machinery(frame):
            # raised here, the exception can land in one of importlib's callbacks, which print
            # it as "Exception ignored" and swallow it: raise it a moment later, out of there
            pending.append(signum)
            signal.setitimer(signal.ITIMER_REAL, 0.02)
            return
        for s in _SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        raise Interrupted(signum)

    def retry(_: int, frame: Any) -> None:
        if pending:
            interrupt(pending[-1], frame)

    before = {s: signal.signal(s, interrupt) for s in _SIGNALS}
    before_alarm = signal.signal(signal.SIGALRM, retry)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before_alarm)
        for s, handler in before.items():
            signal.signal(s, handler)


def _in_import_machinery(frame: Any) -> bool:
    """Whether `frame` or a caller of it runs inside importlib's bootstrap."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def user_errors(fn: Callable) -> Callable:
    """Turn GraphllmError (and a missing optional dependency) into one line and exit 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:

        try:
            return fn(*args, **kwargs)
        except GraphllmError as e:
            _fail(str(e))
        except ModuleNotFoundError as e:
            _fail(f"{e.name} is not installed (see docs/command-line.md for the extras)")

    return wrapper


def options(*decorators: Callable) -> Callable:
    """One decorator of several click options (or decorators of them), listed by `--help` in
    the order given."""

    def deco(fn: Callable) -> Callable:
        for d in reversed(decorators):
            fn = d(fn)
        return fn

    return deco


def logits_option(fn: Callable) -> Callable:
    """--logits: the LM head for every new position or the last."""
    return click.option(
        "--logits",
        type=click.Choice(["all", "last"]),
        help="LM head for every new position, or the last only (as a server).",
    )(fn)


def model_options(fn: Callable) -> Callable:
    """--config / --model and the workload flags, shared by every command that builds a graph."""
    config_help = "HF config.json, a checkpoint folder, or a YAML file (with optional workload:)."
    return options(
        source_options(config_help),
        click.option("--batch", "-b", type=click.IntRange(min=1), help="Batch size B."),
        click.option(
            "--seq-len", "-t", type=IntList(), help="New tokens T (a list sweeps: 128,1024)."
        ),
        click.option(
            "--past-len", type=click.IntRange(min=0), help="Past tokens P in the KV cache."
        ),
        click.option(
            "--dtype", type=click.Choice(DTYPE_NAMES), help="Weights, activations and KV cache."
        ),
        click.option("--weight-dtype", type=click.Choice(DTYPE_NAMES)),
        click.option("--act-dtype", type=click.Choice(DTYPE_NAMES)),
        click.option("--kv-dtype", type=click.Choice(DTYPE_NAMES)),
        logits_option,
    )(fn)


def source_options(config_help: str, model_help: str = PRESET_HELP) -> Callable:
    """--config PATH / --model NAME: where the model comes from (one of them)."""

    def deco(fn: Callable) -> Callable:
        fn = click.option("--model", "preset", help=model_help)(fn)
        return click.option(
            "--config", "config_path", type=click.Path(path_type=Path), help=config_help
        )(fn)

    return deco


def t_given(options: dict[str, Any]) -> bool:
    """Whether the user gave T: --seq-len, or the --config file's workload section (a file that
    does not read gives none; resolve says why). Call it before resolve takes the flags out."""
    if options.get("seq_len"):
        return True
    path = options.get("config_path")
    if path is None:
        return False
    try:
        return "seq_len" in load_workload_section(path)
    except (OSError, GraphllmError):
        return False


def resolve(options: dict[str, Any], stored: bool = True) -> tuple[Any, Any]:
    """ModelConfig and Workload from the shared options: flags over the YAML's workload section.
    `stored` as in resolve_sweep."""
    config, workloads = resolve_sweep(options, stored)
    if len(workloads) > 1:
        raise ConfigError("this command takes one --seq-len, not a list")
    return config, workloads[0]


def resolve_sweep(options: dict[str, Any], stored: bool = True) -> tuple[Any, list[Any]]:
    """Like `resolve`, with one Workload per --seq-len value. `stored`: the command models the
    checkpoint's storage, so a weight dtype given overrides a quantized config's and says so
    (an export, which computes at its dtype whatever the storage, passes False)."""

    path, preset = options.pop("config_path"), options.pop("preset")
    if (path is None) == (preset is None):
        raise ConfigError("give exactly one of --config PATH or --model NAME")
    config = load_config(path if path is not None else preset)
    section = load_workload_section(path) if path is not None else {}
    seq_lens = options.pop("seq_len") or []
    flags = {k: options.pop(k) for k in WORKLOAD_FLAGS}
    got = merge_workload(config, section, flags, seq_lens, stored)
    _note_dropped(got, flags)
    return got.config, list(got.workloads)


def _note_dropped(got: Any, flags: dict[str, Any]) -> None:
    """The note that a weight dtype given overrides the checkpoint's stored format."""
    if got.dropped_quantization is None:
        return
    by = got.overridden_by
    said = f"--{by.replace('_', '-')} {flags[by]}" if by else "the workload's dtype"
    click.echo(
        f"note: {said} overrides the checkpoint's quantization_config "
        f"({got.dropped_quantization}): every weight is modelled as "
        f"{got.workloads[0].weight_dtype}",
        err=True,
    )


FRONTENDS = ("auto", "built", "traced")


def frontend_option(fn: Callable) -> Callable:
    return click.option(
        "--frontend",
        type=click.Choice(FRONTENDS),
        default="auto",
        show_default=True,
        help="How the graph is made: graphllm's hand-built family (built), transformers' own "
        "code traced on fake tensors (traced, needs torch and transformers), or built where "
        "graphllm has the family and traced otherwise (auto).",
    )(fn)


def traced_source(options: dict[str, Any], frontend: str) -> tuple[dict, str] | None:
    """The config's fields and name where the model is to be traced (`frontend`, or auto and
    a model_type graphllm builds no family for), else None and `options` left as they are."""
    if frontend == "built":
        return None
    source = options.get("config_path") or options.get("preset")
    if (options.get("config_path") is None) == (options.get("preset") is None):
        raise ConfigError("give exactly one of --config PATH or --model NAME")
    raw, name = read_config_source(source)
    if frontend == "auto" and raw.get("model_type") in SUPPORTED:
        return None
    return raw, name


def traced_workloads(options: dict[str, Any], raw: dict) -> list[Workload]:
    """The workloads of a traced model: flags over the YAML's workload section over the
    defaults. A weight dtype named overrides a quantized checkpoint's stored format, as for a
    built family: `raw` then loses its quantization_config (it is what the trace reads)."""
    path = options.pop("config_path")
    options.pop("preset")
    section = load_workload_section(path) if path is not None else {}
    seq_lens = options.pop("seq_len") or []
    flags = {k: options.pop(k) for k in WORKLOAD_FLAGS}
    held = _Storage(traced_quantization(raw))
    got = merge_workload(held, section, flags, seq_lens, True)  # type: ignore[arg-type]
    _note_dropped(got, flags)
    if got.dropped_quantization is not None:
        raw.pop("quantization_config", None)
        if isinstance(raw.get("text_config"), dict):
            raw["text_config"] = dict(raw["text_config"])
            raw["text_config"].pop("quantization_config", None)
    return list(got.workloads)


def traced_model(
    source: tuple[dict, str],
    options: dict[str, Any],
    command: str,
    mla: str,
    phase: str,
    mtp: bool = False,
) -> tuple[Graph, Workload]:
    """The graph of a model traced at the one workload a command takes (`phase`: the step's,
    or training), its latent attention checked to be in the form engines run."""
    raw, name = source
    workloads = traced_workloads(options, raw)
    if len(workloads) > 1:
        raise ConfigError(f"{command} takes one --seq-len, not a list")
    graph = traced_graph(raw, workloads[0], name)
    require_engine_form(graph.meta["config"], mla, phase or workloads[0].phase, mtp)
    return graph, workloads[0]


@dataclass(frozen=True)
class _Storage:
    """What merge_workload reads of a traced model's config: how its checkpoint stores it."""

    quantization: Quantization | None = None


def attention_option(help_text: str) -> Callable:
    return click.option(
        "--attention",
        type=click.Choice(ATTENTION_FORMS),
        default="flash",
        show_default=True,
        help=help_text,
    )


def hardware_option(default: str | None) -> Callable:
    """--hardware, and the rate model every time the command prints is computed under: --ideal
    and --cuda-graphs/--no-cuda-graphs (applied to each device the command loads)."""

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def command(*args: Any, ideal: bool, cuda_graphs: bool | None, **kwargs: Any) -> Any:
            with rate_model(ideal=ideal, cuda_graphs=cuda_graphs):
                return fn(*args, **kwargs)

        return options(
            click.option(
                "--hardware",
                default=default,
                show_default=True,
                help="Device preset (see `graphllm hardware`), a YAML/JSON spec file, or `local`.",
            ),
            click.option(
                "--ideal",
                is_flag=True,
                help="Time on the data sheet's peaks with no latencies or launch costs, not on "
                "the device's measured (achievable) rates.",
            ),
            click.option(
                "--cuda-graphs/--no-cuda-graphs",
                default=None,
                help="Launch kernels through CUDA graphs (achievable rates) [default: for decode].",
            ),
        )(command)

    return decorate


def device_options(attention_help: str = ATTENTION_HELP) -> Callable:
    """--hardware (default h100) with its rate model, and --attention: what the costs are
    timed on and how core attention is counted."""
    return options(hardware_option("h100"), attention_option(attention_help))


MLA_HELP = (
    "DeepSeek latent attention: re-expand the cached latent (as transformers), or fold the up "
    "projections into the query and output"
)
# what an analysis prices by default: the form engines run (a naive decode step re-expands every
# past position's keys and values in every layer, which no engine pays)
MLA_AUTO_HELP = f"{MLA_HELP}; auto: as engines run it (naive for prefill, absorbed for decode)."


def mla_option(help_text: str = MLA_AUTO_HELP, auto: bool = True) -> Callable:
    """--mla: how a DeepSeek model's latent attention is computed; with `auto` (the analyses'
    default) the form engines use for the workload's phase, else naive (what runs the model)."""
    return click.option(
        "--mla",
        type=click.Choice([*(["auto"] if auto else []), *MLA_FORMS]),
        default="auto" if auto else "naive",
        show_default=True,
        help=help_text,
    )


def mla_for(config: ModelConfig, workload: Workload, training: bool, mla: str) -> str:
    """The MLA form an analysis of `workload` builds: `mla`, or under 'auto' the engines' form
    for the step's phase (passes.parallel.engine.mla_form)."""
    return mla_form(config, "training" if training else workload.phase, mla)


def _mtp_option() -> Callable:
    return click.option(
        "--mtp",
        is_flag=True,
        help="DeepSeek-V3, Kimi-K2, GLM-4.5: include the multi-token-prediction modules (inputs "
        "mtp.{k}.input_ids, outputs mtp.{k}.logits).",
    )


def deepseek_options(fn: Callable) -> Callable:
    """--mla (auto by default: each phase as engines run it) and --mtp, for the analyses."""
    return options(mla_option(), _mtp_option())(fn)


def export_deepseek_options(fn: Callable) -> Callable:
    """--mla (naive by default: the form transformers computes, for prefill and decode alike)
    and --mtp, for what exports or runs the model."""
    return options(mla_option(f"{MLA_HELP}.", auto=False), _mtp_option())(fn)


def json_option(fn: Callable) -> Callable:
    """--json: the command's document instead of its tables."""
    flag = click.option("--json", "as_json", is_flag=True, help="Print a JSON document instead.")
    return flag(fn)


def seed_option(help_text: str | None = None) -> Callable:
    """--seed of the random draws (weights, prompts), 0 by default."""
    return click.option("--seed", type=SEED, default=0, show_default=True, help=help_text)


def repeats_option(fn: Callable) -> Callable:
    """--repeats: timed runs, of which the median is reported."""
    return click.option("--repeats", type=REPEATS, default=5, show_default=True)(fn)


def renderer_option(help_text: str) -> Callable:
    """--renderer: Graphviz's dot binary or the graphviz-pure wheel (graphllm.exporters.render)."""
    return click.option("--renderer", type=click.Choice(["auto", "dot", "pure"]), help=help_text)
