"""The `graphllm` console script's first module: it sets the signal handlers before anything heavy
is imported, so a Ctrl-C while numpy, onnx and the op table load ends as the command's own
interrupt does (one line, exit 128+N), not with a traceback from inside an import.

It lives outside the `graphllm` package because importing any module of the package runs the
package's __init__, which imports the library."""

from __future__ import annotations

import gc
import signal
import sys

_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _interrupted_while_starting(signum: int, frame: object) -> None:
    for s in _SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    sys.stderr.write(f"error: interrupted ({signal.Signals(signum).name})\n")
    sys.stderr.flush()
    # nothing was written yet: no temporary to remove, so no unwinding is needed
    import os

    os._exit(128 + signum)


def main() -> None:
    for s in _SIGNALS:
        signal.signal(s, _interrupted_while_starting)
    from graphllm.cli import main as cli_main  # the heavy imports, now interruptible

    # what the imports made lives as long as the process: the collector need not walk it again
    # at each full collection that a graph of thousands of nodes brings on (a test process
    # running many commands does not come through here, and collects as usual)
    gc.freeze()
    cli_main()


if __name__ == "__main__":
    main()
