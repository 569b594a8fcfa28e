"""issue 19: the tokens pass on Qwen3-Next finds, from the signatures alone, that the Gated
DeltaNet layers mix through their causal conv (a window of K positions) and their delta rule
(a prefix), beside core attention in the attention layers; the receptive field follows; and
perturbation observes the same, in numpy and on onnxruntime, with and without a past."""

import pytest

from graphllm import Workload, build_graph, load_config
from graphllm.passes import run
from graphllm.runtime.observe import check_token_mixing


@pytest.fixture(scope="module")
def cfg():
    return load_config("qwen3-next-80b-a3b")


def test_what_mixes_per_layer_type(cfg):
    report = run(build_graph(cfg, Workload(seq_len=4, past_len=5)), ["tokens"])["tokens"]
    by_layer: dict[int, set[str]] = {}
    for name, op in report.mixing_nodes:
        by_layer.setdefault(int(name.split(".")[2]), set()).add(op)
    for i, kind in enumerate(cfg.layer_types):
        if kind == "linear_attention":  # a decode-like step: the recurrence from its state
            assert by_layer[i] == {"causal_conv1d", "gated_delta_chunked_state"}, i
        else:
            assert by_layer[i] == {"scores", "softmax", "pv"}, i


def test_one_linear_layer_reaches_k_minus_1_back_through_the_conv_and_all_through_the_state():
    one = load_config("qwen3-next-80b-a3b").with_layers(1)
    report = run(build_graph(one, Workload(seq_len=8)), ["tokens"])["tokens"]
    assert report.depends_on(5) == list(range(6))  # the delta rule: every earlier position
    assert report.per_layer[0]["reach"] == 8
    report = run(build_graph(one, Workload(seq_len=2, past_len=6)), ["tokens"])["tokens"]
    assert report.depends_on(0) == list(range(7))  # the carried state: all 6 past positions


@pytest.mark.parametrize(
    ("workload", "runtime"),
    [
        (Workload(seq_len=12), "numpy"),
        (Workload(seq_len=4, past_len=5), "numpy"),
        (Workload(seq_len=8), "onnxruntime"),
        (Workload(seq_len=4, past_len=5), "onnxruntime"),  # the states fed to the export
    ],
    ids=["prefill", "after-a-past", "onnx", "onnx-after-a-past"],
)
def test_prediction_matches_perturbation(cfg, workload, runtime):
    pytest.importorskip("onnxruntime")
    check = check_token_mixing(cfg, workload=workload, runtime=runtime)
    assert check.agrees, check.differences()[:5]
