"""Runs too large for this process, refused before they allocate: `verify tokens` and `verify
partition` at huge batch and lengths (numpy interpreter runs), `bench` at huge prompt, batch,
decode length or thread counts, `calibrate` under an address-space limit. Each refusal says what
the run would need and what the process has, in one line and well inside the harness's 6 GiB
address space and a few seconds (a run that allocated first would die of MemoryError)."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphllm.runtime.budget import max_threads
from graphllm.runtime.calibrate import MIN_BUFFER, _llc_bytes
from tests.support.hostile import GIB, Case, cases_params, check_case, run_cli
from tests.support.onnx_files import tiny_export
from tests.support.paths import EXAMPLES

TINY = str(EXAMPLES / "tiny.yaml")
MIB = 1 << 20
FAST = 20.0  # seconds: a refusal happens before any work


def _tiny_onnx(root: Path) -> None:
    (root / "m.onnx").write_bytes(tiny_export())


def _bench(id: str, *args: str, expect: str = "needs") -> Case:
    return Case(
        id, ["bench", "m.onnx", "--no-predict", *args], make=_tiny_onnx, expect=expect, timeout=FAST
    )


def _verify(id: str, *args: str, expect: str = "needs") -> Case:
    return Case(id, ["verify", *args], expect=expect, timeout=FAST)


BIG = str(10**9)
AT_MOST = "graphllm takes at most"

BENCH = [
    _bench("prompt-1e9", "--prompt-len", BIG),
    _bench("prompt-1e18", "--prompt-len", str(10**18)),
    _bench("prompt-1e5", "--prompt-len", str(10**5)),  # a small cache, but 160 GB of scores
    _bench("batch-1e9", "--batch", BIG),
    _bench("new-tokens-1e9", "--new-tokens", BIG),
    _bench("new-tokens-1e6", "--new-tokens", str(10**6)),  # its masks alone: quadratic
    _bench("prompt-and-batch-1e5", "--prompt-len", str(10**5), "--batch", str(10**5)),
    _bench("threads-1e5", "--threads", str(10**5), expect="--threads 100,000 is more than"),
    _bench("threads-1e18", "--threads", str(10**18), expect="--threads"),
    _bench("threads-past-limit", "--threads", str(max_threads() + 1), expect="is more than"),
    Case(
        "config-threads-1e5",  # refused before its temporary export folder is made
        ["bench", "--config", TINY, "--threads", str(10**5), "--no-predict"],
        expect="--threads",
        timeout=FAST,
    ),
    Case(
        "config-prompt-1e9",  # exported to a temporary folder first: it is removed
        ["bench", "--config", TINY, "--prompt-len", BIG, "--no-predict"],
        expect="needs",
        timeout=FAST,
    ),
    Case(
        "bench-under-1gib",
        ["bench", "m.onnx", "--no-predict", "--prompt-len", str(10**6)],
        make=_tiny_onnx,
        expect="available",
        memory=2 * GIB,
        timeout=FAST,
    ),
]

VERIFY = [
    # the examples: past the workload's sanity limits, refused before any pricing
    _verify("tokens-batch-1e9", "tokens", "--config", TINY, "-b", BIG, expect=AT_MOST),
    _verify(
        "tokens-batch-1e9-onnx", "tokens", "--config", TINY, "-b", BIG, "--onnx", expect=AT_MOST
    ),
    _verify("tokens-past-1e9", "tokens", "--config", TINY, "--past-len", BIG, expect=AT_MOST),
    _verify("tokens-preset-batch-1e9", "tokens", "--model", "llama3-8b", "-b", BIG, expect=AT_MOST),
    _verify("tokens-full-size-405b", "tokens", "--model", "llama3.1-405b", "--full-size"),
    _verify(
        "tokens-full-size-batch",
        "tokens",
        "--config",
        TINY,
        "--full-size",
        "-b",
        BIG,
        expect=AT_MOST,
    ),
    _verify(
        "partition-b1e5-t1e5",
        "partition",
        "--config",
        TINY,
        "-b",
        "100000",
        "-t",
        "100000",
        expect=AT_MOST,
    ),
    _verify(
        "partition-batch-1e9", "partition", "--config", TINY, "-b", BIG, "-t", "4", expect=AT_MOST
    ),
    _verify(
        "partition-past-1e9",
        "partition",
        "--config",
        TINY,
        "--past-len",
        BIG,
        "-t",
        "1",
        expect=AT_MOST,
    ),
    # inside those limits but past this process's memory: priced and refused
    _verify("tokens-batch-1e7", "tokens", "--config", TINY, "-b", "10000000"),
    _verify("tokens-batch-1e7-onnx", "tokens", "--config", TINY, "-b", "10000000", "--onnx"),
    _verify("tokens-past-1e7", "tokens", "--config", TINY, "--past-len", "10000000"),
    _verify("tokens-preset-batch-1e5", "tokens", "--model", "llama3-8b", "-b", "100000"),
    _verify("partition-b1e4-t1e4", "partition", "--config", TINY, "-b", "10000", "-t", "10000"),
    _verify("partition-batch-1e7", "partition", "--config", TINY, "-b", "10000000", "-t", "4"),
    _verify(
        "partition-past-1e7", "partition", "--config", TINY, "--past-len", "10000000", "-t", "1"
    ),
    _verify("partition-tp2-b1e7", "partition", "--config", TINY, "--tp", "2", "-b", "10000000"),
    _verify("partition-seq-1e7", "partition", "--config", TINY, "-t", "10000000"),
]

CALIBRATE = [
    Case("calibrate-200mib", ["calibrate"], expect="calibrate needs", memory=200 * MIB),
    Case(
        "calibrate-405b-200mib",
        ["calibrate", "--model", "llama3.1-405b"],
        expect="available",
        memory=200 * MIB,
    ),
    Case("calibrate-threads-1e5", ["calibrate", "--threads", str(10**5)], expect="--threads"),
    Case(
        "calibrate-405b-threads-1e5",
        ["calibrate", "--model", "llama3.1-405b", "--threads", str(10**5)],
        expect="is more than",
    ),
]

CASES = BENCH + VERIFY + CALIBRATE


@pytest.mark.parametrize("case", cases_params(CASES))
def test_refused(case, tmp_path):
    result = check_case(case, tmp_path)
    assert result.seconds < case.timeout


def test_calibrate_fits_a_model_read_in_a_limited_address_space(tmp_path):
    """405B's weights do not fit in the 1.5 GiB (or, on a machine whose last-level cache wants
    a larger read, a GiB past twice that read: 4.75 GiB for a 480 MiB L3): the model-sized read
    is cut to what does, and the calibration completes instead of dying of MemoryError (its
    buffers were sized from the machine's free memory, not from what the process may use)."""
    least = max(MIN_BUFFER, 4 * _llc_bytes())  # the smallest read calibrate accepts
    memory = max(3 * GIB // 2, 2 * least + GIB)
    r = run_cli(
        ["calibrate", "--model", "llama3.1-405b", "--repeats", "1"], tmp_path, memory=memory
    )
    assert r.returncode == 0, r.stderr[-2000:]
    saved = next((tmp_path / "cache").rglob("hardware-local.yaml")).read_text()
    assert "model_buffer_bytes" in saved
