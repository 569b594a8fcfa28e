"""The command table of `graphllm --help`: each command is imported only when it runs, and the
help line the table shows is the start of the command's own help."""

from __future__ import annotations

import os
import subprocess
import sys

import click
import pytest

from graphllm.cli.main import COMMANDS, main


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_table_help_is_the_command_help(name):
    command = main.get_command(click.Context(main), name)
    assert command is not None and command.name == name
    own = " ".join((command.help or "").split())
    assert own.startswith(COMMANDS[name][2].rstrip(".")), (name, own)


def test_help_imports_no_command_module():
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from graphllm.cli.main import main\n"
        "r = CliRunner().invoke(main, ['--help'])\n"
        "assert r.exit_code == 0, r.output\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('graphllm.cli.', 'graphllm.exporters', 'graphllm.runtime', 'onnx')))\n"
        "print(loaded)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['graphllm.cli.common', 'graphllm.cli.main']"


def test_unknown_command_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["tracee"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tracee" in err[0]


def test_a_reader_that_leaves_is_not_an_error():
    # `graphllm trace ... | head -1`: rich's own broken-pipe exit was 1 with no message. The
    # reader here has left before the first line, so the pipe is broken at every write
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "graphllm.cli", "trace", "--model", "llama3-8b"],
            stdout=write,
            stderr=subprocess.PIPE,
            timeout=120,
        )
    finally:
        os.close(write)
    assert proc.returncode == 141 and proc.stderr == b""
