"""Running the benchmarks/ scripts from their tests: as a program, and as a module to call."""

import importlib.util
import json
import subprocess
import sys
from types import ModuleType

from tests.support.paths import REPO

BENCHMARKS = REPO / "benchmarks"


def run_script(name: str, *args: str) -> subprocess.CompletedProcess:
    """`python benchmarks/NAME.py ARGS`, its output captured as text."""
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def load_script(name: str) -> ModuleType:
    """benchmarks/NAME.py imported under a name of its own, to call its functions."""
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its main finds itself there
    spec.loader.exec_module(mod)
    return mod


def script_json(name: str) -> dict:
    """The document `python benchmarks/NAME.py --json` prints; the run must succeed."""
    out = run_script(name, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)
