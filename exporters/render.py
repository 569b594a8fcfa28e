"""Turn DOT text into a picture: Graphviz's `dot` binary when present, else the `graphviz-pure` wheel.

graphviz-pure (the `render` extra) is a Rust port of Graphviz with the same command line as `dot`
(`-Tsvg -o FILE`) under the command name `graphviz-pure`; it writes SVG and PNG (and the text
formats) but not PDF, so PDF needs the real Graphviz. `.dot` files need neither. The renderer is
chosen by argument, else by the GRAPHLLM_RENDERER environment variable (`auto`, `dot`, `pure`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from graphllm.errors import GraphllmError
from graphllm.files import write_atomic, write_text_atomic

FORMATS = ("svg", "png", "pdf", "dot")
RENDERERS = ("auto", "dot", "pure")
ENV = "GRAPHLLM_RENDERER"
PURE_FORMATS = frozenset({"svg", "png"})
INSTALL = (
    "install a renderer: pip install 'graphllm[render]' (the graphviz-pure wheel, SVG and PNG) "
    "or Graphviz itself (apt-get install graphviz, brew install graphviz)"
)
TIMEOUT_S = 600


def output_format(path: str | Path) -> str:
    """The format a file name asks for (its suffix), or a one-line error."""
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        got = f"'.{fmt}'" if fmt else "no suffix"
        raise GraphllmError(f"{path}: {got} is not a format to draw; use .svg, .png, .pdf or .dot")
    return fmt


def _pure_binary() -> str | None:
    """The graphviz-pure command: on PATH, or beside this Python (a venv not activated)."""
    found = shutil.which("graphviz-pure")
    if found:
        return found
    beside = Path(sys.executable).parent / "graphviz-pure"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def find_renderer(fmt: str, renderer: str | None = None) -> tuple[str, str]:
    """(name, executable) of the renderer to use for `fmt`: 'dot' or 'pure'."""
    choice = renderer or os.environ.get(ENV) or "auto"
    if choice not in RENDERERS:
        raise GraphllmError(f"renderer {choice!r}: use one of {', '.join(RENDERERS)}")
    dot = shutil.which("dot") if choice in ("auto", "dot") else None
    pure = _pure_binary() if choice in ("auto", "pure") else None
    if fmt == "pdf":
        if dot:
            return "dot", dot
        why = "the renderer is forced to graphviz-pure" if choice == "pure" else "dot is not found"
        raise GraphllmError(
            f"PDF needs Graphviz's dot binary ({why}; graphviz-pure writes SVG and PNG only): "
            "apt-get install graphviz, brew install graphviz, or draw .svg"
        )
    if dot:
        return "dot", dot
    if pure:
        return "pure", pure
    if choice == "dot":
        raise GraphllmError(f"the dot binary is not found: {INSTALL}")
    if choice == "pure":
        raise GraphllmError("graphviz-pure is not installed: pip install 'graphllm[render]'")
    raise GraphllmError(f"drawing .{fmt} needs a renderer ({INSTALL}); .dot files need none")


def render(dot_text: str, path: str | Path, renderer: str | None = None) -> Path:
    """Write `dot_text` to `path` as the format its suffix names, whole or not at all."""
    fmt = output_format(path)
    if fmt == "dot":
        return write_text_atomic(path, dot_text)
    _, exe = find_renderer(fmt, renderer)

    def write(tmp: Path) -> None:
        try:
            proc = subprocess.run(
                [exe, f"-T{fmt}", "-o", str(tmp)],
                input=dot_text.encode(),
                capture_output=True,
                timeout=TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as e:
            raise GraphllmError(f"{Path(exe).name} took over {TIMEOUT_S} s to draw {path}") from e
        if proc.returncode != 0:
            lines = proc.stderr.decode(errors="replace").strip().splitlines()
            errors = [ln for ln in lines if "Warning" not in ln] or lines or ["no message"]
            raise GraphllmError(f"{Path(exe).name} failed on {path}: {errors[0]}")

    return write_atomic(path, write)


def svg_text(dot_text: str, renderer: str | None = None) -> str:
    """`dot_text` drawn as SVG text, for a page that inlines its pictures (exporters.html)."""
    _, exe = find_renderer("svg", renderer)
    try:
        proc = subprocess.run(
            [exe, "-Tsvg"], input=dot_text.encode(), capture_output=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired as e:
        raise GraphllmError(f"{Path(exe).name} took over {TIMEOUT_S} s to draw a diagram") from e
    if proc.returncode != 0:
        lines = proc.stderr.decode(errors="replace").strip().splitlines()
        errors = [ln for ln in lines if "Warning" not in ln] or lines or ["no message"]
        raise GraphllmError(f"{Path(exe).name} failed on a diagram: {errors[0]}")
    return proc.stdout.decode()
