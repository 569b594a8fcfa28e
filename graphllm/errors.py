"""Exception types. Everything a user can fix derives from GraphllmError, which the CLI turns into
one line on stderr and exit code 2."""

import signal


class GraphllmError(Exception):
    """A problem with the user's input or request, reported as one line."""


class ConfigError(GraphllmError):
    """A model config or workload that graphllm cannot model as given."""


class NoCacheError(ConfigError):
    """A cached step asked of a model that keeps no cache (GPT-1): its prefill is all it runs."""


class GraphError(GraphllmError):
    """A graph that breaks an invariant of the IR or of an op's signature."""


class PassError(GraphllmError):
    """A pass that failed; the message names the pass."""


class WeightsError(GraphllmError):
    """A checkpoint that is missing a tensor, or holds one of the wrong shape."""


class Interrupted(BaseException):
    """SIGTERM or SIGINT arrived: unwinds like KeyboardInterrupt (past `except Exception`), so
    that temporaries are removed on the way out; the CLI exits with 128 + the signal number."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"interrupted ({self.name})")
