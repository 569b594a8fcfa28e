"""issue 19: the tokens pass on Nemotron-H finds, from the signatures and relations alone, that
the Mamba2 layers mix through their conv (a window of K positions) and their scan (a prefix of
every earlier position, and through the carried state every past one), beside core attention;
perturbation observes the same, in numpy and on onnxruntime."""

import pytest

from graphllm import Workload, build_graph, load_config
from graphllm.passes import run


def _report(preset: str, **wl):
    cfg = load_config(preset)
    small = cfg.with_layers(6)
    return small, run(build_graph(small, Workload(**wl)), ["tokens"])["tokens"]


def test_the_mamba_layers_mix_through_their_conv_and_scan():
    _, report = _report("nemotron-3-nano-30b-a3b", seq_len=16)
    ops = {}
    for name, _ in report.mixing_nodes:
        layer = int(name.split(".")[2])
        ops.setdefault(layer, set()).add(name.rsplit(".", 1)[1])
    # MEMEM*: Mamba2 layers 0, 2, 4 mix in their conv and scan, attention layer 5 in its core;
    # the MoE layers 1 and 3 do not mix at all
    assert ops == {0: {"conv1d", "scan"}, 2: {"conv1d", "scan"}, 4: {"conv1d", "scan"}} | {
        5: {"scores", "softmax", "pv"}
    }
    assert report.depends_on(15) == list(range(16))
    assert report.depends_on(0) == [0]


def test_one_mamba_layer_reaches_every_earlier_position_and_no_later_one():
    """A Mamba2 layer alone (Nemotron-H-8B's layer 0, before any attention): its scan's prefix
    gives each position every earlier one, its conv's window alone would give K."""
    cfg, report = _report("nemotron-h-8b", seq_len=12)
    assert cfg.layer_type(0) == "mamba2" and report.per_layer[0]["reach"] == 12
    for t in range(12):
        assert report.depends_on(t) == list(range(t + 1))
    # after a past of 5 the carried state stands for all of it
    _, after = _report("nemotron-h-8b", seq_len=3, past_len=5)
    assert after.depends_on(0) == list(range(6))


@pytest.mark.parametrize("runtime", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("past", [0, 5])
def test_token_mixing_prediction_matches_perturbation(runtime, past):
    from graphllm.runtime.observe import check_token_mixing

    cfg = load_config("nemotron-3-nano-30b-a3b")
    wl = Workload(seq_len=8 if past else 12, past_len=past)
    assert check_token_mixing(cfg, workload=wl, runtime=runtime).agrees
