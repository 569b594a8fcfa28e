"""The `graphllm` command line: thin click commands that parse, call the library, and print."""

from graphllm.cli.main import main

__all__ = ["main"]
