"""Op signatures (ir/signature.py): einops-like axis lists with groups and an ellipsis."""

from graphllm.ir.signature import parse


def test_signature_parse_groups_and_ellipsis():
    sig = parse("b t (h e) -> b h t e")
    assert sig.inputs == (("b", "t", ("h", "e")),)
    assert sig.outputs == (("b", "h", "t", "e"),)
    assert parse("... d, f d -> ... f").inputs[0] == ("...", "d")
