"""`trace` of the GPTQ presets: the bytes a GPTQ checkpoint stores, summed here in closed form
from the published layout, and the one published size found for one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import graphllm
from graphllm import build_graph, load_config
from graphllm.cli import main
from graphllm.passes import run

PRESETS = Path(graphllm.__file__).parent / "models" / "presets"
GPTQ_PRESETS = ("qwen2.5-1.5b-instruct-gptq-int4", "qwen2.5-32b-instruct-gptq-int4")
# Qwen/Qwen2.5-1.5B-Instruct-GPTQ-Int4 on the Hub, from its file listing as a public report
# quotes it (GitHub; find_string "1,149,862,960 B"): its one model.safetensors file, and the
# parameters the Hub counts in it
PUBLISHED_FILE_BYTES = 1_149_862_960
PUBLISHED_PARAMS = 1_543_714_304


def gptq_bytes(c: dict) -> int:
    """A Qwen2 GPTQ checkpoint's tensor bytes from its config.json, tensor by tensor as AutoGPTQ
    and optimum write them: per quantized Linear (in, out), qweight int32 [in*bits/32, out],
    qzeros int32 [in/g, out*bits/32], scales fp16 [in/g, out] and g_idx int32 [in] (its
    QuantLinear stores g_idx whether or not desc_act is set); embeddings, norms, the q/k/v
    biases and the LM head fp16."""
    q = c["quantization_config"]
    bits, g = q["bits"], q["group_size"]
    d, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hd = d // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * hd
    linears = [(d, d), (d, kv), (d, kv), (d, d), (d, f), (d, f), (f, d)]  # q k v o gate up down
    per_layer = 0
    for i, o in linears:
        qweight = i * bits // 32 * o * 4
        qzeros = i // g * (o * bits // 32) * 4
        scales = i // g * o * 2
        g_idx = i * 4
        per_layer += qweight + qzeros + scales + g_idx
    per_layer += (2 * d + d + 2 * kv) * 2  # two norms, q/k/v biases
    heads = 1 if c["tie_word_embeddings"] else 2
    return c["num_hidden_layers"] * per_layer + heads * v * d * 2 + d * 2  # + final norm


def trace(preset: str) -> dict:
    r = CliRunner().invoke(main, ["trace", "--json", "-t", "1", "--model", preset])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("preset", GPTQ_PRESETS)
def test_trace_is_the_gptq_layout_summed_by_hand(preset):
    c = json.loads((PRESETS / f"{preset}.json").read_text())
    doc = trace(preset)
    assert doc["memory"]["weights"] == gptq_bytes(c)
    q = doc["model"]["quantization"]
    assert q["method"] == "gptq" and set(q["stored_bytes_by_dtype"]) == {"fp16", "int4"}
    # the defaults transformers' GPTQConfig fills for keys the configs leave out
    assert q["weights"]["desc_act"] is False and q["weights"]["checkpoint_format"] == "gptq"


def test_qwen2_5_1_5b_gptq_is_its_published_file():
    weights = trace("qwen2.5-1.5b-instruct-gptq-int4")["memory"]["weights"]
    assert weights == pytest.approx(PUBLISHED_FILE_BYTES, rel=0.01)
    # what the file holds beyond the tensors is its JSON header (8 bytes of length, then one
    # entry per tensor: 28 layers x (7 Linears x 4 tensors + 2 norms + 3 biases) + 2); a count
    # without g_idx (2,035,712 bytes fewer) would leave ~2.1 MB, not a header's size
    tensors = 28 * (7 * 4 + 2 + 3) + 2
    header = PUBLISHED_FILE_BYTES - weights
    assert 0 < header < 200 * tensors


def test_qwen2_5_1_5b_gptq_params_are_the_hubs_count():
    # the Hub's figure is 1,310,195,712 I32 (the quantized weights' values unpacked; qzeros and
    # g_idx are not in it) + 233,518,592 F16 (embeddings, norms, biases; no scales): the
    # parameters, as `params` counts them
    graph = build_graph(load_config("Qwen2.5-1.5B-Instruct-GPTQ-Int4"))
    assert run(graph, ["params"])["params"].total == PUBLISHED_PARAMS


def test_the_hub_spellings_are_aliases():
    for preset in GPTQ_PRESETS:
        alias = json.loads((PRESETS / f"{preset}.json").read_text())["_aliases"][0]
        assert load_config(alias) == load_config(preset)
