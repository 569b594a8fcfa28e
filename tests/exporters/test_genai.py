"""`export --format genai`: a folder onnxruntime-genai loads and generates with, greedily, the
tokens transformers and graphllm's own generate give on the same checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from graphllm.cli import main
from graphllm.exporters.genai import CONFIG
from graphllm.models.families import FAMILY_TABLE
from tests.support.paths import EXAMPLES

og = pytest.importorskip("onnxruntime_genai")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

LLAMA = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
PROMPT = [1, 5, 9, 13, 7, 3]
NEW = 12


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Llama with random weights, and a word-level tokenizer of its vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder = tmp_path_factory.mktemp("genai") / "ckpt"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    with torch.no_grad():  # norms off 1, so a wrong norm weight shows in the tokens
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(folder)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(64)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2", pad_token="t0"
    )
    fast.save_pretrained(folder)
    ids = torch.tensor([PROMPT])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False,
        min_new_tokens=NEW, pad_token_id=0,
    )  # fmt: skip
    return folder, out[0, len(PROMPT) :].tolist()


def genai_tokens(folder, prompt: list[int], n: int) -> list[int]:
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + n, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens([prompt])
    out = []
    while not gen.is_done():
        gen.generate_next_token()
        out.append(int(gen.get_next_tokens()[0]))
    return out


@pytest.mark.parametrize("ops, shared", [("standard", False), ("ort", True)])
def test_genai_generates_the_tokens_of_transformers_and_graphllm(checkpoint, tmp_path, ops, shared):
    from graphllm.runtime.session import OnnxModel

    ckpt, expected = checkpoint
    out = tmp_path / "genai"
    args = ["export", "--weights", str(ckpt), "--format", "genai", "--ops", ops, "-o", str(out)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert f"past_present_share_buffer {str(shared).lower()}" in r.output
    cfg = json.loads((out / CONFIG).read_text())
    m = cfg["model"]
    assert (m["type"], m["bos_token_id"], m["eos_token_id"], m["pad_token_id"]) == (
        "llama",
        1,
        2,
        0,
    )
    assert m["context_length"] == cfg["search"]["max_length"] == 128
    d = m["decoder"]
    assert (d["num_hidden_layers"], d["num_attention_heads"], d["num_key_value_heads"]) == (2, 4, 2)
    assert d["head_size"] == 8 and d["filename"] == "model.onnx"
    assert cfg["search"]["past_present_share_buffer"] is shared
    assert {p.name for p in out.iterdir()} == {
        "model.onnx",
        CONFIG,
        "tokenizer.json",
        "tokenizer_config.json",
    }
    # the checkpoint's tokenizer files, as they were (genai's own builder copies the same two;
    # its tokenizer cannot parse a WordLevel tokenizer.json, the builder's output's either)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (ckpt / name).read_bytes()

    ours = OnnxModel(out / "model.onnx").generate(np.array([PROMPT]), NEW)[0].tolist()
    assert genai_tokens(out, PROMPT, NEW) == ours == expected


def test_a_family_genai_has_no_type_for_is_one_line(tmp_path):
    out = tmp_path / "g"
    args = ["export", "--config", str(EXAMPLES / "mixtral.yaml"), "--format", "genai"]
    r = CliRunner().invoke(main, [*args, "-o", str(out)])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
    assert "onnxruntime-genai 0.18 has no model type for mixtral" in r.output
    assert not out.exists()


# the model types onnxruntime-genai 0.18 was checked to load, by the model_type each stands for
GENAI_TYPES = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3_text",
    "phi3": "phi3",
    "granite": "granite",
    "smollm3": "smollm3",
    "gpt_oss": "gptoss",
}


def test_the_families_declare_the_genai_types_checked_here():
    declared = {mt: f.genai_type for mt, f in FAMILY_TABLE.items() if f.genai_type is not None}
    assert declared == GENAI_TYPES


def test_the_refusal_lists_the_families_genai_loads(tmp_path):
    args = ["export", "--config", str(EXAMPLES / "mixtral.yaml"), "--format", "genai"]
    r = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "g")])
    assert r.exit_code == 2
    assert f"--format genai takes {', '.join(sorted(GENAI_TYPES))}; export it" in r.output


def test_every_type_written_is_one_genai_loads(tmp_path, checkpoint):
    """No family declares a genai_type the installed onnxruntime-genai refuses."""
    ckpt, _ = checkpoint
    out = tmp_path / "g"
    r = CliRunner().invoke(
        main, ["export", "--weights", str(ckpt), "--format", "genai", "-o", str(out)]
    )
    assert r.exit_code == 0, r.output
    base = json.loads((out / CONFIG).read_text())
    for t in sorted(set(GENAI_TYPES.values())):
        (out / CONFIG).write_text(json.dumps(base | {"model": base["model"] | {"type": t}}))
        og.Model(str(out))  # raises "Unsupported model_type" for a type it does not know


def test_a_sliding_window_model_is_one_line(tmp_path):
    """genai keeps every position's K/V per layer: a window layer's rolled cache is refused."""
    cfg = LLAMA | {"model_type": "mistral", "sliding_window": 8}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "g"
    args = ["export", "--config", str(tmp_path / "config.json"), "--format", "genai"]
    r = CliRunner().invoke(main, [*args, "-o", str(out)])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
    assert "sliding_attention layers" in r.output
    assert not out.exists()


def test_the_checkpoint_folder_is_not_the_output(checkpoint):
    ckpt, _ = checkpoint
    before = sorted(p.name for p in ckpt.iterdir())
    r = CliRunner().invoke(
        main, ["export", "--weights", str(ckpt), "--format", "genai", "-o", str(ckpt)]
    )
    assert r.exit_code == 2 and "other than the checkpoint's" in r.output
    assert sorted(p.name for p in ckpt.iterdir()) == before
