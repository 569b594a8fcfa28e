"""issue 18: Llama-4-Scout and Llama-4-Maverick parameter counts, exact against transformers'
meta model and the published checkpoint totals, and Meta's "17B active" as params.active itself.

Published totals, every stored tensor (the vision tower and projector included, which graphllm
does not model, so the text decoder's count plus theirs from the meta model must give it):
- Llama-4-Scout-17B-16E(-Instruct) 108,641,793,536: the Hub's safetensors count, as public model
  tables copy it (`HF={'meta-llama/Llama-4-Scout-17B-16E-Instruct': 108641793536}`);
- Llama-4-Maverick-17B-128E(-Instruct) 401,583,781,376: the paramCount of Fireworks' model
  listing (llama4-maverick-instruct-basic) in its billing-export documentation.
"""

import json

import pytest
from click.testing import CliRunner

from graphllm import Workload, build_graph, load_config
from graphllm.cli import main
from graphllm.models.config import PRESETS_DIR
from graphllm.passes import run

PUBLISHED = {"llama4-scout": 108_641_793_536, "llama4-maverick": 401_583_781_376}
TEXT = {"llama4-scout": 107_769_861_120, "llama4-maverick": 400_711_848_960}


def params(preset: str):
    graph = build_graph(load_config(preset), Workload(seq_len=1))
    return run(graph, ["params"])["params"]


def _meta_model(preset: str):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    d = json.loads((PRESETS_DIR / f"{preset}.json").read_text())
    d = {k: v for k, v in d.items() if not k.startswith("_")}
    text = d.pop("text_config")
    # Scout's published 4, which transformers 4.5x read as true; transformers 5 wants a bool
    text["attn_temperature_tuning"] = bool(text.get("attn_temperature_tuning", True))
    cfg = transformers.Llama4Config(**d, text_config=text)
    with torch.device("meta"):
        return transformers.Llama4ForConditionalGeneration(cfg)


@pytest.mark.parametrize("preset", PUBLISHED)
def test_text_decoder_and_checkpoint_totals(preset):
    p = params(preset)
    assert p.total == TEXT[preset]
    model = _meta_model(preset)
    # language_model: a Llama4ForCausalLM, its LM head included
    assert p.total == sum(t.numel() for t in model.language_model.parameters())
    # the rest of the published checkpoint: the vision tower and its projector, not modelled
    others = sum(t.numel() for n, t in model.named_parameters() if "language_model" not in n)
    assert p.total + others == PUBLISHED[preset] == sum(t.numel() for t in model.parameters())


def test_active_is_one_routed_expert_plus_the_shared_one():
    # Meta: Scout and Maverick "17B active parameters", params.active under its own definition
    for preset in PUBLISHED:
        p, cfg = params(preset), load_config(preset)
        e, k = cfg.num_experts, cfg.num_experts_per_tok
        routed = sum(cfg.moe_layers) * e * 3 * cfg.hidden_size * cfg.moe_intermediate_size
        assert p.active == p.total - routed + routed * k // e
        assert round(p.active / 1e9) == 17
    assert params("llama4-scout").active == 17_172_894_720
    assert params("llama4-maverick").active == 17_184_691_200


# issue 18 audit: the fused expert tensors are routed experts to memory, bytes moved and ep
# (they counted whole before: "active" weights 215.54 GB for Scout, every expert read a token)
@pytest.mark.parametrize("preset", PUBLISHED)
def test_memory_bytes_and_ep_count_the_chosen_expert(preset):
    cfg = load_config(preset)
    graph = build_graph(cfg, Workload(seq_len=1, past_len=16))
    res = run(graph, ["params", "memory", "cost"])
    p, mem = res["params"], res["memory"]
    assert mem.weights == 2 * p.total and mem.weights_active == 2 * p.active  # bf16
    # a decode step reads the one expert its token chooses in each MoE layer, not all E
    assert res["cost"].bytes["weights"] < 1.01 * mem.weights_active
    routed = sum(cfg.moe_layers) * cfg.num_experts * 3 * cfg.hidden_size
    routed *= cfg.moe_intermediate_size
    r = CliRunner().invoke(main, ["partition", "--model", preset, "--ep", "4", "--json"])
    assert r.exit_code == 0, r.output
    devices = json.loads(r.stdout)["partition"]["devices"]
    assert {d["params"] for d in devices} == {p.total - routed + routed // 4}
