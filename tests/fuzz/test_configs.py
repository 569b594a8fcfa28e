"""Bad `--config` inputs, each answered in one line, fast and in bounded memory.

Files that are no config file (a FIFO, a device, a socket, a folder, links to them, files too
large); YAML and JSON that are hostile to their parser (alias bombs, tags, deep nesting, numbers
past any range, text that is not UTF-8); and configs whose values no model has (a million layers,
no key/value heads, a 10 MB activation name), which must be refused before a graph is built.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.hostile import Case, cases_params, check_case
from tests.support.paths import EXAMPLES
from tests.support.sandbox_files import both, fifo, folder, link, text, unix_socket
from tests.support.tiny_configs import LLAMA

TINY = LLAMA | {"rms_norm_eps": 1e-5, "max_position_embeddings": 128, "rope_theta": 10000.0}
TINY_YAML = (EXAMPLES / "tiny.yaml").read_text()
BOMB_LEVELS = 9  # nine levels of nine aliases: 9**9 = 387M strings if expanded


def trace(name: str) -> list[str]:
    return ["trace", "--config", name]


def json_config(name: str = "c.json", **over) -> Callable[[Path], None]:
    return text(name, json.dumps({**TINY, **over}))


def yaml_config(extra: str, name: str = "c.yaml") -> Callable[[Path], None]:
    return text(name, TINY_YAML + extra)


def bomb(field: str) -> str:
    """A billion-laughs YAML whose last level is the value of `field`."""
    lines = ['l0: &l0 "lol"']
    for i in range(1, BOMB_LEVELS):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]")
    lines.append(f"{field}: [{', '.join([f'*l{BOMB_LEVELS - 1}'] * 9)}]")
    return "model_type: llama\n" + "\n".join(lines) + "\n"


def sparse(name: str, prefix: str, size: int) -> Callable[[Path], None]:
    """A file of `size` bytes that starts like a config (sparse: costs no disk)."""

    def make(root: Path) -> None:
        path = root / name
        path.write_text(prefix)
        os.truncate(path, size)

    return make


FILES = [
    Case("fifo", trace("c.json"), make=fifo("c.json"), expect="is a FIFO"),
    Case("fifo-yaml", trace("c.yaml"), make=fifo("c.yaml"), expect="is a FIFO"),
    Case("dev-zero", trace("/dev/zero"), expect="/dev/zero: is a character device"),
    Case("dev-null", trace("/dev/null"), expect="character device"),
    Case("dev-stdin", trace("/dev/stdin"), expect="not a regular file"),
    Case("dev-urandom", trace("/dev/urandom"), expect="character device"),
    Case("socket", trace("c.json"), make=unix_socket("c.json"), expect="is a socket"),
    Case("link-to-fifo", trace("l.json"), make=both(fifo("f"), link("l.json", "f")), expect="FIFO"),
    Case("link-to-dev-zero", trace("l.yaml"), make=link("l.yaml", "/dev/zero"), expect="device"),
    Case("dangling-link", trace("l.json"), make=link("l.json", "gone.json"), expect="no such file"),
    Case("missing", trace("nothing.json"), expect="nothing.json: no such file"),
    Case("missing-no-suffix", trace("./nothing"), expect="no such file"),
    Case("folder-without-config", trace("ckpt"), make=folder("ckpt"), expect="has no config.json"),
    Case(
        "folder-config-is-fifo",
        trace("ckpt"),
        make=folder("ckpt", fifo("config.json")),
        expect="config.json: is a FIFO",
    ),
    Case(
        "folder-config-is-folder",
        trace("ckpt"),
        make=folder("ckpt", folder("config.json")),
        expect="is a folder",
    ),
    Case(
        "folder-config-links-to-dev-zero",
        trace("ckpt"),
        make=folder("ckpt", link("config.json", "/dev/zero")),
        expect="points outside the folder",
    ),
    Case(
        "json-17-mib",
        trace("big.json"),
        make=sparse("big.json", '{"model_type": "llama", "hidden_act": "', 17 << 20),
        expect="too large for a config file",
    ),
    Case(
        "hidden-act-100-mb",
        trace("act.json"),
        make=sparse("act.json", '{"model_type": "llama", "hidden_act": "' + "x" * 4096, 100 << 20),
        expect="too large",
    ),
    Case(
        "yaml-2-mib",
        trace("big.yaml"),
        make=sparse("big.yaml", "model_type: llama\n#", 2 << 20),
        expect="too large",
    ),
    Case("empty-json", trace("c.json"), make=text("c.json", ""), expect="malformed JSON"),
    Case("empty-yaml", trace("c.yaml"), make=text("c.yaml", ""), expect="expected a mapping"),
    Case("wrong-suffix", trace("c.txt"), make=text("c.txt", "{}"), expect="unsupported config"),
    Case("name-too-long", trace("x" * 5000 + ".json"), expect="file name too long"),
    Case("preset-name-5000", ["trace", "--model", "x" * 5000], expect="unknown preset"),
    Case(
        "link-loop",
        trace("a.json"),
        make=both(link("a.json", "b.json"), link("b.json", "a.json")),
        expect="symbolic links",
    ),
]

YAML = [
    Case(
        "alias-bomb-vocab",
        trace("b.yaml"),
        expect="anchor &l0",
        make=text("b.yaml", bomb("vocab_size")),
    ),
    Case(
        "alias-bomb-act",
        trace("b.yaml"),
        expect="anchor &l0",
        make=text("b.yaml", bomb("hidden_act")),
    ),
    Case(
        "alias-bomb-rope",
        trace("b.yaml"),
        expect="anchor &l0",
        make=text("b.yaml", bomb("rope_scaling")),
    ),
    Case(
        "alias-bomb-bookkeeping",
        trace("b.yaml"),
        make=text("b.yaml", bomb("architectures")),
        expect="anchors are not accepted",
    ),
    Case(
        "alias-bomb-workload",
        trace("c.yaml"),
        make=yaml_config("  batch: &b [1, 1]\nx: [*b, *b]\n"),
        expect="anchor &b",
    ),
    Case(
        "alias-of-scalar",
        trace("c.yaml"),
        make=text("c.yaml", "model_type: llama\nvocab_size: *v\n"),
        expect="alias *v",
    ),
    Case(
        "merge-key-with-alias",
        trace("c.yaml"),
        make=text("c.yaml", "base: &b {hidden_size: 64}\nmodel_type: llama\n<<: *b\n"),
        expect="anchor",
    ),
    Case("tag-binary", trace("c.yaml"), make=yaml_config("x: !!binary aGk=\n"), expect="tag"),
    Case(
        "tag-python",
        trace("c.yaml"),
        make=yaml_config("x: !!python/object/apply:os.system [echo]\n"),
        expect="tags are not accepted",
    ),
    Case("tag-custom", trace("c.yaml"), make=yaml_config("x: !mine 3\n"), expect="tag !mine"),
    Case(
        "tag-directive",
        trace("c.yaml"),
        make=text("c.yaml", "%TAG !e! tag:example.com,2000:\n---\nmodel_type: !e!llama x\n"),
        expect="tag",
    ),
    Case(
        "yaml-latin-1",
        trace("c.yaml"),
        make=text("c.yaml", b"model_type: ll\xe4ma\n"),
        expect="not UTF-8",
    ),
    Case(
        "yaml-utf-16",
        trace("c.yaml"),
        make=text("c.yaml", "model_type: llama\n".encode("utf-16")),
        expect="not UTF-8",
    ),
    Case(
        "yaml-nested-1e5",
        trace("c.yaml"),
        make=text("c.yaml", "model_type: llama\nx: " + "[" * 100_000 + "]" * 100_000 + "\n"),
        expect="nested deeper than 64",
    ),
    Case(
        "yaml-nested-block-100",
        trace("c.yaml"),
        make=text("c.yaml", "".join(" " * i + f"k{i}:\n" for i in range(100)) + " " * 100 + "v\n"),
        expect="nested deeper",
    ),
    Case(
        "yaml-int-5000-digits",
        trace("c.yaml"),
        make=yaml_config("bos_token_id: " + "7" * 5000 + "\n"),
        expect="5,000 digits",
    ),
    Case(
        "yaml-int-hex-huge",
        trace("c.yaml"),
        make=text("c.yaml", "model_type: llama\nvocab_size: 0x" + "f" * 60 + "\n"),
        expect="out of range",
    ),
    Case(
        "yaml-float-1e400", trace("c.yaml"), make=yaml_config("x: 1e400\n"), expect="not a finite"
    ),
    Case("yaml-dot-inf", trace("c.yaml"), make=yaml_config("x: .inf\n"), expect="not a finite"),
    Case("yaml-dot-nan", trace("c.yaml"), make=yaml_config("x: .NaN\n"), expect="not a finite"),
    Case("yaml-top-list", trace("c.yaml"), make=text("c.yaml", "- 1\n- 2\n"), expect="a mapping"),
    Case("yaml-top-scalar", trace("c.yaml"), make=text("c.yaml", "llama\n"), expect="a mapping"),
    Case(
        "yaml-duplicate-key",
        trace("c.yaml"),
        make=yaml_config("vocab_size: 9\n"),
        expect="duplicate key",
    ),
    Case(
        "yaml-two-documents",
        trace("c.yaml"),
        make=text("c.yaml", "model_type: llama\n---\nmodel_type: llama\n"),
        expect="malformed YAML",
    ),
    Case(
        "yaml-control-character",
        trace("c.yaml"),
        make=text("c.yaml", "model_type: llama\x07\n"),
        expect="malformed YAML",
    ),
]

JSON = [
    Case(
        "json-nested-1e5",
        trace("c.json"),
        make=text("c.json", '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}"),
        expect="nested",
    ),
    Case(
        "json-nested-500",
        trace("c.json"),
        make=text("c.json", '{"x": ' + "[" * 500 + "]" * 500 + "}"),
        expect="nested deeper than 64",
    ),
    Case(
        "json-int-5000-digits",
        trace("c.json"),
        make=text("c.json", json.dumps(TINY)[:-1] + ', "bos_token_id": ' + "1" * 5000 + "}"),
        expect="5,000 digits",
    ),
    Case("json-nan", trace("c.json"), make=text("c.json", '{"rms_norm_eps": NaN}'), expect="NaN"),
    # Infinity reads as transformers 5's {"__float__": "Infinity"}: a field that must be finite
    # refuses it, naming the value
    Case(
        "json-infinity",
        trace("c.json"),
        make=text("c.json", json.dumps(TINY)[:-1] + ', "rms_norm_eps": Infinity}'),
        expect="rms_norm_eps",
    ),
    Case(
        "json-minus-infinity",
        trace("c.json"),
        make=text("c.json", json.dumps(TINY | {"rope_theta": "@"}).replace('"@"', "-Infinity")),
        expect="-Infinity",
    ),
    Case(
        "json-1e400", trace("c.json"), make=text("c.json", '{"rope_theta": 1e400}'), expect="1e400"
    ),
    Case(
        "json-top-list", trace("c.json"), make=text("c.json", "[1, 2]"), expect="expected a mapping"
    ),
    Case("json-top-string", trace("c.json"), make=text("c.json", '"llama"'), expect="a mapping"),
    Case(
        "json-duplicate-key",
        trace("c.json"),
        make=text("c.json", '{"model_type": "llama", "model_type": "qwen2"}'),
        expect="duplicate key 'model_type'",
    ),
    Case(
        "json-truncated",
        trace("c.json"),
        make=text("c.json", json.dumps(TINY)[:40]),
        expect="malformed JSON",
    ),
    Case(
        "json-latin-1",
        trace("c.json"),
        make=text("c.json", b'{"model_type": "\xe9"}'),
        expect="not UTF-8",
    ),
]

VALUES = [
    Case(
        "layers-1e6",
        trace("c.json"),
        make=json_config(num_hidden_layers=10**6),
        expect="at most 1,024",
    ),
    Case(
        "layers-1e8",
        trace("c.json"),
        make=json_config(num_hidden_layers=10**8),
        expect="at most 1,024",
    ),
    Case(
        "layers-1025", trace("c.json"), make=json_config(num_hidden_layers=1025), expect="is 1,025"
    ),
    Case(
        "layers-yaml-1e6",
        trace("c.yaml"),
        make=text(
            "c.yaml", TINY_YAML.replace("num_hidden_layers: 2\n", "num_hidden_layers: 1000000\n")
        ),
        expect="num_hidden_layers",
    ),
    Case("layers-bool", trace("c.json"), make=json_config(num_hidden_layers=True), expect="(bool)"),
    Case(
        "layers-float", trace("c.json"), make=json_config(num_hidden_layers=2.0), expect="(float)"
    ),
    Case("layers-string", trace("c.json"), make=json_config(num_hidden_layers="2"), expect="(str)"),
    Case(
        "layers-negative",
        trace("c.json"),
        make=json_config(num_hidden_layers=-1),
        expect="positive",
    ),
    Case(
        "kv-heads-0",
        trace("c.json"),
        make=json_config(num_key_value_heads=0),
        expect="num_key_value_heads must be a positive integer, got 0",
    ),
    Case(
        "heads-1e5",
        trace("c.json"),
        make=json_config(num_attention_heads=10**5),
        expect="num_attention_heads",
    ),
    Case("head-dim-1e6", trace("c.json"), make=json_config(head_dim=10**6), expect="head_dim"),
    Case("hidden-1e9", trace("c.json"), make=json_config(hidden_size=10**9), expect="hidden_size"),
    Case(
        "ffn-1e7",
        trace("c.json"),
        make=json_config(intermediate_size=10**7),
        expect="intermediate_size",
    ),
    Case("vocab-1e8", trace("c.json"), make=json_config(vocab_size=10**8), expect="vocab_size"),
    Case(
        "vocab-20-digits", trace("c.json"), make=json_config(vocab_size=10**19), expect="vocab_size"
    ),
    Case(
        "experts-1e6",
        trace("c.json"),
        make=json_config(model_type="mixtral", num_local_experts=10**6, num_experts_per_tok=2),
        expect="num_local_experts",
    ),
    Case("eps-0", trace("c.json"), make=json_config(rms_norm_eps=0), expect="rms_norm_eps"),
    Case("eps-above-1", trace("c.json"), make=json_config(rms_norm_eps=2.0), expect="rms_norm_eps"),
    Case("theta-tiny", trace("c.json"), make=json_config(rope_theta=1e-300), expect="rope_theta"),
    Case("theta-1e20", trace("c.json"), make=json_config(rope_theta=1e20), expect="rope_theta"),
    Case(
        "rope-factor-1e300",
        trace("c.json"),
        make=json_config(rope_scaling={"rope_type": "linear", "factor": 1e300}),
        expect="rope_scaling.factor",
    ),
    Case(
        "hidden-act-10-mb",
        trace("c.json"),
        make=json_config(hidden_act="x" * 10_000_000),
        expect="hidden_act 'xxx",
    ),
    Case(
        "model-type-1-mb",
        trace("c.json"),
        make=json_config(model_type="llama" * 200_000),
        expect="unknown model_type",
    ),
    Case(
        "key-1-mb",
        trace("c.json"),
        make=text("c.json", json.dumps({**TINY, "k" * 10**6: 1})),
        expect="unknown field",
    ),
    Case(
        "sliding-window-1e12",
        trace("c.json"),
        make=json_config(model_type="mistral", sliding_window=10**12),
        expect="sliding_window",
    ),
]

CASES = FILES + YAML + JSON + VALUES


@pytest.mark.parametrize("case", cases_params(CASES))
def test_refused(case, tmp_path):
    result = check_case(case, tmp_path)
    assert len(result.stderr) < 400, result.stderr[:400]  # a shortened value, not the whole


def test_the_corpus_covers_each_kind():
    assert len(FILES) >= 15 and len(YAML) >= 15 and len(JSON) >= 10 and len(VALUES) >= 20
