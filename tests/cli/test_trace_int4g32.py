"""Issue 20: `--dtype int4g32` (torch's tinygemm storage: int4 in groups of 32 with a bf16 scale
and zero point each) from the command line: its weights take 0.625 bytes a weight against int4's
0.515625, and on the A100 its decode step is timed at tinygemm's share of the bandwidth."""

import json

from click.testing import CliRunner

from graphllm.cli import main
from tests.support.paths import EXAMPLES

ARGS = ["trace", "--config", str(EXAMPLES / "tiny.yaml"), "-t", "1", "--past-len", "8", "--json"]


def _trace(*extra: str) -> dict:
    out = CliRunner().invoke(main, [*ARGS, *extra])
    assert out.exit_code == 0, out.output
    return json.loads(out.output)


def test_int4g32_weights_and_decode_time_against_int4():
    g32, g128 = _trace("--dtype", "int4g32"), _trace("--dtype", "int4")
    # examples/tiny.yaml's matrices: per layer q, o 64x64, k, v 64x32, gate, up, down 64x128
    # (36,864), two layers, the embedding and the LM head 256x64 each: 106,496 weights
    weights = 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128) + 2 * 256 * 64
    assert g32["memory"]["weights_by_dtype"]["int4g32"] == weights * 0.625
    assert g128["memory"]["weights_by_dtype"]["int4"] == weights * (0.5 + 2 / 128)
    a100_g32 = _trace("--dtype", "int4g32", "--hardware", "a100")["roofline"]
    a100_g128 = _trace("--dtype", "int4", "--hardware", "a100")["roofline"]
    assert a100_g32["seconds"] > a100_g128["seconds"]


def test_a_typo_of_the_dtype_is_one_line():
    out = CliRunner().invoke(main, [*ARGS, "--dtype", "int4g31"])
    assert out.exit_code == 2 and "int4g32" in out.output
    assert "Traceback" not in out.output
