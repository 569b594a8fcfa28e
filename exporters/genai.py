"""onnxruntime-genai: the ONNX export in a folder with the `genai_config.json` that
`onnxruntime_genai.Model(DIR)` reads, and the checkpoint's tokenizer files beside it.

The config carries what onnxruntime-genai's own model builder writes for a decoder-only model
(its I/O names, heads, head size, layers, context length, the token ids, the search defaults),
with graphllm's I/O names (`position_ids` among the inputs: the export takes positions, the
builder's models derive them from the mask). `past_present_share_buffer` is true only under the
`ort` lowering: its GroupQueryAttention appends to a cache buffer bound as both past and present;
the other lowerings' attention concatenates a new present each step.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from graphllm.errors import ConfigError, GraphllmError
from graphllm.files import check_target, json_text, make_folder, write_atomic, write_text_atomic
from graphllm.ir import Graph
from graphllm.models.families import FAMILY_TABLE
from graphllm.models.model_config import LAYER_TYPES, ModelConfig
from graphllm.models.workload import Workload

from .onnx import export_onnx
from .onnx.export import ExportResult

CONFIG = "genai_config.json"
MODEL = "model.onnx"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
FULL_ATTENTION = LAYER_TYPES[0]  # a layer that attends to every past position
SHARED_BUFFER_LOWERINGS = frozenset({"ort"})
# the search section as onnxruntime-genai's builder writes it (greedy; max_length set per model)
SEARCH = {
    "diversity_penalty": 0.0,
    "do_sample": False,
    "early_stopping": True,
    "length_penalty": 1.0,
    "min_length": 0,
    "no_repeat_ngram_size": 0,
    "num_beams": 1,
    "num_return_sequences": 1,
    "repetition_penalty": 1.0,
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 1.0,
}


@dataclass(frozen=True)
class GenaiExport:
    """What `export_genai` wrote into the folder."""

    folder: Path
    model: ExportResult
    model_type: str
    tokenizer: tuple[str, ...]  # the tokenizer files copied
    config: dict[str, Any]


def genai_type(config: ModelConfig, graph: Graph) -> str:
    """onnxruntime-genai's model type for `config`, or a one-line refusal."""
    # each family declares the type onnxruntime-genai loads it as (Family.genai_type)
    family = FAMILY_TABLE.get(config.model_type)
    t = family.genai_type if family else None
    if t is None:
        known = ", ".join(sorted(mt for mt, f in FAMILY_TABLE.items() if f.genai_type))
        raise ConfigError(
            f"onnxruntime-genai 0.18 has no model type for {config.model_type} ({config.name}): "
            f"--format genai takes {known}; export it with --format onnx"
        )
    # genai keeps one K and one V of every position per layer: a window layer's rolled cache
    # (the last W-1 keys) or a carried state is a cache it would grow and index wrongly
    other = sorted({k for k in config.layer_types if k != FULL_ATTENTION})
    if other or graph.state_outputs():
        raise ConfigError(
            f"--format genai: {config.name} has {', '.join(other) or 'state-carrying'} layers, "
            "whose cache is not one K/V of every position per layer as onnxruntime-genai keeps "
            "it; export it with --format onnx"
        )
    layers = range(config.num_hidden_layers)
    fed = {"input_ids", "position_ids"} | {
        f"past_key_values.{i}.{kv}" for i in layers for kv in ("key", "value")
    }
    read = {"logits"} | {f"present.{i}.{kv}" for i in layers for kv in ("key", "value")}
    extra = sorted({n.name for n in graph.nodes("input")} - fed) + sorted(set(graph.outputs) - read)
    if extra:
        raise ConfigError(
            f"--format genai: onnxruntime-genai feeds the ids, mask, positions and past K/V and "
            f"reads the logits and present K/V; this graph also has {', '.join(extra[:3])}"
        )
    return t


def token_ids(checkpoint: Path | None, config_file: Path | None) -> dict[str, Any]:
    """bos/eos/pad ids from the checkpoint's config.json, with generation_config.json's where
    config.json has none (eos may be a list); a YAML file or preset gives none."""
    ids: dict[str, Any] = {}
    sources: list[Path] = []
    if checkpoint is not None:
        sources = [checkpoint / "config.json", checkpoint / "generation_config.json"]
    elif config_file is not None:
        folder = config_file if config_file.is_dir() else config_file.parent
        file = config_file / "config.json" if config_file.is_dir() else config_file
        if file.suffix == ".json":
            sources = [file, folder / "generation_config.json"]
    for src in sources:
        if not src.is_file():
            continue
        try:
            doc = json.loads(src.read_text())
        except (OSError, ValueError) as e:
            raise GraphllmError(f"{src}: not a readable JSON file ({e})") from None
        for k in TOKEN_IDS:
            if k not in ids and isinstance(doc, dict) and doc.get(k) is not None:
                ids[k] = doc[k]
    return ids


def genai_config(
    config: ModelConfig,
    model: Path,
    lowering: str,
    model_type: str,
    ids: dict[str, Any],
) -> dict[str, Any]:
    """The `genai_config.json` document for the export at `model`."""
    layers = config.num_hidden_layers
    meta = {p.key: p.value for p in onnx.load(str(model), load_external_data=False).metadata_props}
    # the ort lowering's rotary tables end the positions it can run (graphllm.positions)
    context = config.max_position_embeddings
    if meta.get("graphllm.positions"):
        context = min(context, int(meta["graphllm.positions"]))
    inputs = {
        "input_ids": "input_ids",
        "attention_mask": "attention_mask",
        "position_ids": "position_ids",
        "past_key_names": "past_key_values.%d.key",
        "past_value_names": "past_key_values.%d.value",
    }
    outputs = {
        "logits": "logits",
        "present_key_names": "present.%d.key",
        "present_value_names": "present.%d.value",
    }
    eos = ids.get("eos_token_id")
    return {
        "model": {
            **{k: ids[k] for k in TOKEN_IDS if k in ids},
            # genai stops on eos and pads with pad: a checkpoint without pad pads with eos
            **(
                {"pad_token_id": _first(eos)}
                if "pad_token_id" not in ids and eos is not None
                else {}
            ),
            "context_length": context,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": model.name,
                "head_size": config.head_dim,
                "hidden_size": config.hidden_size,
                "inputs": inputs,
                "outputs": outputs,
                "num_attention_heads": config.num_attention_heads,
                "num_hidden_layers": layers,
                "num_key_value_heads": config.num_key_value_heads,
            },
            "type": model_type,
            "vocab_size": config.vocab_size,
        },
        "search": dict(SEARCH)
        | {
            "max_length": context,
            "past_present_share_buffer": lowering in SHARED_BUFFER_LOWERINGS,
        },
    }


def export_genai(
    graph: Graph,
    folder: str | Path,
    *,
    workload: Workload | None = None,
    weights: str | Path | None = None,
    config_file: Path | None = None,
    seed: int = 0,
    ops: str = "auto",
    device: str = "cpu",
    progress: Any = None,
) -> GenaiExport:
    """Export `graph` into `folder` for onnxruntime-genai: model.onnx (as `export_onnx`), the
    checkpoint's tokenizer files, then genai_config.json, written last: a folder whose export
    was interrupted has none, so onnxruntime-genai refuses it rather than load a mix."""
    config: ModelConfig = graph.meta["config"]
    model_type = genai_type(config, graph)
    if weights is not None and Path(folder).resolve() == Path(weights).resolve():
        raise ConfigError(f"--format genai -o {folder}: give a folder other than the checkpoint's")
    folder = make_folder(Path(folder), "the genai export")
    target = check_target(folder / CONFIG)
    target.unlink(missing_ok=True)  # the old config goes first: no config pairs with a new model
    ckpt = Path(weights) if weights is not None else None
    ids = token_ids(ckpt, config_file)
    r = export_onnx(
        graph,
        folder / MODEL,
        workload=workload,
        weights=weights,
        seed=seed,
        ops=ops,
        device=device,
        progress=progress,
    )
    copied = []
    for name in TOKENIZER_FILES:
        src = ckpt / name if ckpt is not None else None
        if src is not None and src.is_file():
            write_atomic(folder / name, lambda p, s=src: shutil.copyfile(s, p))
            copied.append(name)
    doc = genai_config(config, r.path, r.lowering, model_type, ids)
    write_text_atomic(target, json_text(doc, indent=4) + "\n")
    return GenaiExport(folder, r, model_type, tuple(copied), doc)


def _first(v: Any) -> Any:
    return v[0] if isinstance(v, list) and v else v
