"""Workload(...) under random values, as a YAML workload section or a caller can hand it: it is a
valid workload within the sanity limits, or a ConfigError of one short line; nothing else."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphllm.echo import count, shown
from graphllm.errors import ConfigError
from graphllm.models.workload import MAX_PAIRS, MAX_POSITIONS, MAX_TOKENS, Workload

# what YAML (and a careless caller) can put in a field: ints of any size, floats, strings, bools,
# None, lists and mappings
ints = st.one_of(
    st.integers(-3, 70_000),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.sampled_from([2**24, 2**24 + 1, 2**30, 2**48, 2**63, 10**3000, -(10**3000)]),
)
scalars = st.one_of(
    ints,
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.text(min_size=2000, max_size=3000),
    st.booleans(),
    st.none(),
)
values = st.one_of(
    scalars, st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=3), ints)
)
dtype_values = st.one_of(
    st.sampled_from(["fp32", "bf16", "float16", "int4", "int8", "half", "bf17", "INT4"]), values
)
fields = st.fixed_dictionaries(
    {},
    optional={
        "batch": values,
        "seq_len": values,
        "past_len": values,
        "weight_dtype": dtype_values,
        "act_dtype": dtype_values,
        "kv_dtype": dtype_values,
        "dtype": dtype_values,
        "logits": st.one_of(st.sampled_from(["all", "last"]), values),
    },
)
sizes = st.fixed_dictionaries(
    {"batch": ints, "seq_len": ints, "past_len": ints},
)


def assert_valid_or_refused(kwargs: dict) -> None:
    try:
        wl = Workload(**kwargs)
    except ConfigError as e:
        message = str(e)
        assert "\n" not in message and len(message) < 300, message
        return
    s = wl.key_len
    assert 1 <= wl.seq_len <= s <= MAX_POSITIONS and wl.past_len >= 0
    assert wl.batch * s <= MAX_TOKENS and wl.batch * wl.seq_len * s <= MAX_PAIRS


@settings(max_examples=300, deadline=None)
@given(fields)
def test_random_fields(kwargs):
    assert_valid_or_refused(kwargs)


@settings(max_examples=300, deadline=None)
@given(sizes)
def test_random_sizes(kwargs):
    assert_valid_or_refused(kwargs)


@settings(max_examples=100, deadline=None)
@given(sizes, st.sampled_from(["fp8", "int4", None]))
def test_with_dtype(kwargs, dtype):
    try:
        Workload.with_dtype(None, dtype=dtype, **kwargs)
    except ConfigError as e:
        assert "\n" not in str(e) and len(str(e)) < 300


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        (
            {"seq_len": 10**15},
            "seq_len (--seq-len) is 1,000,000,000,000,000; graphllm takes at most",
        ),
        ({"past_len": 10**20}, "past_len (--past-len) is 100,000,000,000,000,000,000"),
        ({"batch": 2**24 + 1}, "batch (--batch) is 16,777,217"),
        ({"seq_len": 2**23, "past_len": 2**23 + 1}, "key length past_len + seq_len"),
        ({"batch": 2**20, "seq_len": 2**11}, "batch x key length"),
        ({"batch": 16, "seq_len": 2**23}, "query-key pairs"),
        ({"seq_len": 10**5000}, "a 5001-digit number"),
        ({"seq_len": "x" * 10**6}, "(1,000,000 characters)"),
        ({"batch": True}, "got True"),
        ({"weight_dtype": ["bf16"]}, "unknown dtype ['bf16']"),
        ({"logits": {"a": 1}}, "logits must be 'all' or 'last'"),
    ],
)
def test_refusals_name_the_field_and_the_limit(kwargs, fragment):
    with pytest.raises(ConfigError) as e:
        Workload(**kwargs)
    assert fragment in str(e.value)
    assert len(str(e.value)) < 300


def test_the_limits_themselves_are_valid():
    Workload(seq_len=2**24)
    Workload(batch=2**6, seq_len=1, past_len=2**24 - 1)
    Workload(batch=1, seq_len=2**23, past_len=2**23)


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (12345, "12,345"),
        (10**29, "100,000,000,000,000,000,000,000,000,000"),
        (10**30, "a 31-digit number"),
        (10**4000 - 1, "a 4000-digit number"),
        (-(10**5000), "a 5001-digit negative number"),
    ],
    ids=["small", "29-digits", "31-digits", "4000-digits", "5001-digits-negative"],
)
def test_count_never_prints_a_huge_number(value, shown):
    assert count(value) == shown


def test_show_shortens():
    assert shown("abc") == "'abc'"
    assert shown("y" * 5000).endswith("... (5,000 characters)")
    assert len(shown(list(range(1000)))) <= 60
    assert shown([10**5000]) == "[a 5001-digit number]"  # repr() refuses such an int
    assert shown(True) == "True"
