"""Reading a config or spec file without trusting it: a mapping out, or one ConfigError line.

The file must be a regular file (a FIFO, a device such as /dev/zero, a socket would block the
read or never end), no larger than a config can plausibly be, read with a bounded read. The
parsers are held to what a config is: YAML without anchors, aliases (a "billion laughs" bomb
expands a few hundred bytes into gigabytes) or explicit tags; JSON without NaN; no number that overflows a float or has more digits than any size; no nesting deeper than
any config. Everything is refused while parsing, before a large value is built.

A value an error line names is shown as the file spells it (`show`, `describe`): a bare Infinity,
which reads as transformers 5's {"__float__": "Infinity"}, is named Infinity.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from graphllm.echo import SHOWN_CHARS, cut, shown, shown_path
from graphllm.errors import ConfigError
from graphllm.files import note_input

# A config.json is a few KB (the largest published, with id2label tables, well under 1 MiB);
# 16 MiB is far above any, and JSON parses that much in well under a second.
MAX_JSON_BYTES = 16 << 20
# A YAML config is written by hand (a few hundred bytes); PyYAML's pure-Python parser, the one
# that lets anchors be refused before expansion, takes seconds per MiB.
MAX_YAML_BYTES = 1 << 20
# Config values nest three levels at most (rope_parameters, id2label): 64 is any config's.
MAX_DEPTH = 64
# 2**63 has 19 digits; no size or count in a config has more than that.
MAX_INT_DIGITS = 24

_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
}


def file_kind(mode: int) -> str:
    """What a file of `mode` is, in words: "a FIFO", "a folder", ..."""
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def _check_regular(where: str, st: os.stat_result, cap: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{where}: is {file_kind(st.st_mode)}, not a regular file")
    if st.st_size > cap:
        raise ConfigError(
            f"{where}: {st.st_size:,} bytes is too large for a config file "
            f"(graphllm reads up to {cap:,} bytes; real configs are a few KB)"
        )


def file_mode(path: str | Path) -> int | None:
    """`path`'s st_mode (links followed), or None where there is nothing to stat: missing, a
    name too long or with a NUL byte (pathlib's is_dir raises on some of these)."""
    try:
        return os.stat(path).st_mode
    except (OSError, ValueError):
        return None


def _os_error(where: str, e: OSError) -> ConfigError:
    if e.errno == errno.ENOENT:
        return ConfigError(f"{where}: no such file")
    return ConfigError(f"{where}: cannot read: {e.strerror or cut(str(e))}")


def read_bytes(path: Path, cap: int) -> bytes:
    """The contents of the regular file `path`, at most `cap` bytes, or a ConfigError.

    stat first, so that a FIFO or device is refused without being opened; O_NONBLOCK and a
    second check on the open file, so that one swapped in between cannot block or stream."""
    where = shown_path(path)
    try:
        _check_regular(where, os.stat(path), cap)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise _os_error(where, e) from None
    except ValueError:
        raise ConfigError(f"{where}: a file name cannot hold a NUL byte") from None
    try:
        _check_regular(where, os.fstat(fd), cap)
        chunks, size = [], 0
        while size <= cap:
            chunk = os.read(fd, min(1 << 20, cap + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise _os_error(where, e) from None
    finally:
        os.close(fd)
    if size > cap:  # it grew since the check
        raise ConfigError(f"{where}: larger than the {cap:,} bytes graphllm reads of a config")
    note_input(path)
    return b"".join(chunks)


# ---------------------------------------------------------------------------------------------
# YAML


class _Refused(yaml.YAMLError):
    def __init__(self, problem: str, mark: Any) -> None:
        super().__init__(problem)
        self.problem, self.problem_mark = problem, mark


class ConfigYamlLoader(yaml.SafeLoader):
    """SafeLoader held to plain data: anchors, aliases and explicit tags are refused as the
    composer meets them (before an alias bomb expands), nesting is bounded, `1e-5` reads as a
    float (YAML 1.1 wants `1.0e-5`), and duplicate keys are refused (PyYAML would keep the
    last)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise _Refused(
                f"alias *{cut(event.anchor, 40)} (aliases are not accepted)", event.start_mark
            )
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise _Refused(
                f"anchor &{cut(anchor, 40)} (anchors are not accepted)", event.start_mark
            )
        tag = getattr(event, "tag", None)
        if tag not in (None, "!"):
            raise _Refused(f"tag {cut(tag, 40)} (tags are not accepted)", event.start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


ConfigYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _yaml_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict:
    loader.flatten_mapping(node)
    out: dict = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise _Refused("a mapping key must be a plain value", key_node.start_mark) from None
        if key in out:
            raise _Refused(f"duplicate key {shown(key)}", key_node.start_mark)
        out[key] = loader.construct_object(value_node, deep=True)
    return out


def _yaml_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    digits = len(node.value.lstrip("+-").replace("_", ""))
    if digits > MAX_INT_DIGITS:
        raise _Refused(f"an integer of {digits:,} digits is out of range", node.start_mark)
    return loader.construct_yaml_int(node)


def _yaml_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float:
    value = loader.construct_yaml_float(node)
    if math.isnan(value):
        raise _Refused(f"{cut(node.value, 40)} is not a finite number", node.start_mark)
    if math.isinf(value):
        # the one field that may be infinite (Nemotron-H's time_step_limit) takes the form
        # transformers writes in config.json, which YAML spells as this mapping
        sign = "-" if value < 0 else ""
        raise _Refused(
            f"{cut(node.value, 40)} is not a finite number; where a config's value may be "
            f'infinite, write {{__float__: "{sign}Infinity"}}, as transformers does',
            node.start_mark,
        )
    return value


ConfigYamlLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _yaml_mapping)
ConfigYamlLoader.add_constructor("tag:yaml.org,2002:int", _yaml_int)
ConfigYamlLoader.add_constructor("tag:yaml.org,2002:float", _yaml_float)


def _parse_yaml(text: str, where: str) -> Any:
    try:
        return yaml.load(text, Loader=ConfigYamlLoader)  # a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark else where
        what = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"{at}: malformed YAML: {cut(str(what), 200)}") from None
    except (ValueError, RecursionError) as e:  # what the checks above leave to Python
        raise ConfigError(f"{where}: malformed YAML: {cut(str(e), 200)}") from None


# ---------------------------------------------------------------------------------------------
# JSON


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for k, x in pairs:
        if k in out:
            raise ValueError(f"duplicate key {shown(k)}")
        out[k] = x
    return out


def _json_constant(name: str) -> dict[str, str]:
    # Python's json (and so transformers 4) writes an infinite float as a bare Infinity, which the
    # Hub's configs carry (Nemotron-H's time_step_limit); it reads as the mapping transformers 5
    # writes for it, so only a field whose rule accepts an infinite value takes it
    if name == "NaN":
        raise ValueError("NaN is not a JSON number")
    return {"__float__": name}


def json_float(x: Any) -> Any:
    """The float a config's {"__float__": "Infinity"} or {"__float__": "-Infinity"} stands for
    (transformers >= 5 writes a non-finite float so, JSON having no Infinity); `x` otherwise."""
    if _is_infinity(x):
        return float(x["__float__"].replace("Infinity", "inf"))
    return x


def _is_infinity(x: Any) -> bool:
    return isinstance(x, dict) and len(x) == 1 and x.get("__float__") in ("Infinity", "-Infinity")


class _Spelt:
    """A value whose repr is the text a config file spells it with (Infinity)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _as_written(value: Any, depth: int = 4) -> Any:
    """`value` with each infinite number (a float, or the mapping a bare Infinity reads as) in
    the file's spelling, Infinity or -Infinity. Only what `shown` prints is copied: 3 levels of
    nesting and 6 items of a container (reprlib's limits) plus one, so a huge value costs little."""
    if _is_infinity(value):
        return _Spelt(value["__float__"])
    if isinstance(value, float) and math.isinf(value):
        return _Spelt("Infinity" if value > 0 else "-Infinity")
    if depth == 0:
        return value
    if type(value) in (list, tuple):
        return type(value)(_as_written(x, depth - 1) for x in value[:7])
    if type(value) is dict:
        try:  # reprlib shows a dict's smallest keys, where they sort
            keys = sorted(value)
        except TypeError:
            keys = list(value)
        return {k: _as_written(value[k], depth - 1) for k in keys[:7]}
    return value


def shown_value(value: Any, limit: int = SHOWN_CHARS) -> str:
    """`value` as `shown` gives it, an infinite number spelt Infinity as the config file has it
    rather than as the {"__float__": "Infinity"} it reads as."""
    return shown(_as_written(value), limit)


def describe(v: Any) -> str:
    """A config value for an error line, with its type: `"8" (str)`; an infinite number is
    `Infinity`, whatever it reads as."""
    if _is_infinity(v) or (isinstance(v, float) and math.isinf(v)):
        return shown_value(v)
    return f"{shown_value(v, 40)} ({type(v).__name__})"


def show(v: Any) -> str:
    """A value as the config file spells it (JSON), falling back to repr; shortened."""
    if isinstance(v, str):
        return cut(json.dumps(v[:SHOWN_CHARS]), SHOWN_CHARS) + (
            "..." if len(v) > SHOWN_CHARS else ""
        )
    if v is None or isinstance(v, (bool, float)) or (isinstance(v, int) and v.bit_length() < 64):
        return json.dumps(v)
    return shown_value(v)


def _json_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{cut(text, 40)} is out of a float's range")
    return value


def _json_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {digits:,} digits is out of range")
    return int(text)


def _json_finite(name: str) -> float:
    raise ValueError(f"{name} is not a finite number")


def _parse_json(text: str, where: str, infinity: bool) -> Any:
    try:
        return json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_json_constant if infinity else _json_finite,
            parse_float=_json_float,
            parse_int=_json_int,
        )
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}:{e.lineno}:{e.colno}: malformed JSON: {e.msg}") from None
    except RecursionError:
        raise ConfigError(f"{where}: malformed JSON: nested too deeply") from None
    except ValueError as e:
        raise ConfigError(f"{where}: malformed JSON: {cut(str(e), 200)}") from None


# ---------------------------------------------------------------------------------------------


def _depth_within(data: Any, limit: int) -> bool:
    """Whether `data` nests at most `limit` containers deep (iteratively: no recursion)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > limit:
                return False
            items = value.values() if isinstance(value, dict) else value
            stack.extend((x, depth + 1) for x in items if isinstance(x, (dict, list)))
    return True


def read_mapping(path: Path, infinity: bool = True) -> dict:
    """Parse the .json or .yaml file `path` into a dict; every failure is one ConfigError line.

    With `infinity`, JSON's bare Infinity and -Infinity read as transformers 5's
    {"__float__": "Infinity"} (a model config's field rule decides whether it may be infinite);
    without it (a hardware spec, where nothing is infinite) they are refused.
    """
    where = shown_path(path)
    suffix = path.suffix.lower()
    is_yaml = suffix in (".yaml", ".yml")
    cap = MAX_YAML_BYTES if is_yaml else MAX_JSON_BYTES
    try:  # a missing file or a FIFO is named as such, whatever its name ends with
        _check_regular(where, os.stat(path), cap)
    except OSError as e:
        raise _os_error(where, e) from None
    except ValueError:
        raise ConfigError(f"{where}: a file name cannot hold a NUL byte") from None
    if suffix not in (".json", ".yaml", ".yml"):
        raise ConfigError(f"{where}: unsupported config file type (use .json, .yaml or .yml)")
    raw = read_bytes(path, cap)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{where}: not UTF-8 text (byte {e.start:,} is {raw[e.start]:#04x})"
        ) from None
    data = _parse_yaml(text, where) if is_yaml else _parse_json(text, where, infinity)
    if not isinstance(data, dict):
        raise ConfigError(
            f"{where}: expected a mapping of config fields, got {shown(data)} ({type(data).__name__})"
        )
    if not _depth_within(data, MAX_DEPTH):
        raise ConfigError(f"{where}: nested deeper than {MAX_DEPTH} levels")
    return data
