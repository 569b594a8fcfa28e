"""benchmarks/published.py: graphllm's predictions beside published measurements. The script runs
on its own table; its output has a row per measurement, each with its source, and the summary."""

import pytest

from tests.support.benchmark_scripts import load_script, run_script, script_json


@pytest.fixture(scope="module")
def doc():
    return script_json("published")


def test_every_row_is_a_sourced_quoted_measurement_with_a_prediction(doc):
    rows = doc["rows"]
    assert len(rows) >= 15
    metrics = {r["metric"] for r in rows}
    assert metrics == {"decode_tokens_per_s", "ttft_ms", "itl_ms"}
    assert any(r["batch"] == 1 and r["metric"] == "decode_tokens_per_s" for r in rows)
    assert len({r["engine"] for r in rows}) >= 3  # gpt-fast, TensorRT-LLM, NIM
    for r in rows:
        assert r["source"].startswith("https://") and r["quote"].strip(), r["id"]
        assert str(r["measured"]) in r["quote"] or f"{r['measured']:g}" in r["quote"], r["id"]
        assert r["predicted"] > 0
        if r["metric"] in ("ttft_ms", "itl_ms"):
            assert r["ratio"] == pytest.approx(r["measured"] / r["predicted"])
        else:
            assert r["ratio"] == pytest.approx(r["predicted"] / r["measured"])
    assert doc["rate_model"] == "achievable"


def test_the_summary_is_the_median_and_the_rows_beyond_one_and_a_half(doc):
    import statistics

    judged = [r for r in doc["rows"] if r["batch"] == 1]
    s = doc["summary"]
    assert s["judged"] == len(judged) and s["rows"] == len(doc["rows"])
    assert s["median_ratio"] == pytest.approx(statistics.median(r["ratio"] for r in judged))
    beyond = [r["id"] for r in judged if not 1 / 1.5 <= r["ratio"] <= 1.5]
    assert s["beyond_1.5x"] == beyond


def test_the_text_prints_each_row_the_median_and_the_sources():
    out = run_script("published")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.startswith("predictions on the achievable rate model")
    assert "median of measured/predicted over" in text and "rows beyond 1.5x:" in text
    assert text.count("source [") >= 15


def test_an_itl_row_is_the_decode_step_in_milliseconds():
    pub = load_script("published")
    row = next(r for r in pub.load_rows() if r["metric"] == "itl_ms")
    as_rate = row | {"metric": "decode_tokens_per_s"}
    itl, rate = pub.compare([row])[0], pub.compare([as_rate])[0]
    assert itl["predicted"] == pytest.approx(1e3 / rate["predicted"])
    assert itl["ratio"] == pytest.approx(row["measured"] / itl["predicted"])


def test_an_fp8_engine_with_fp16_attention_times_attention_at_the_fp16_rate():
    from graphllm.models.hardware import load_hardware

    pub = load_script("published")
    row = next(r for r in pub.load_rows() if r["id"] == "trt-llm h100 llama2-7b fp8 p2048")
    assert row["attention"] == "fp16" and row["precision"]["act"] == "fp8"
    h100 = load_hardware("h100")
    assert h100.attention_rate("fp8") == 1200e12
    # W8A8: the attention runs on the bf16 stream, at its rate, which the row's fp16 sets
    assert pub._engine_attention(h100, row).attention_rate("bf16") == 740e12
    assert pub._engine_attention(h100, row).gemm_rate("fp8") == 1402.6e12  # GEMMs stay FP8
    assert pub._engine_attention(h100, row | {"attention": None}) is h100
    plain = pub.predict_seconds({k: v for k, v in row.items() if k != "attention"})
    assert pub.predict_seconds(row) == plain  # FP16 attention: what the W8A8 stream runs


def test_gpt_fast_rows_keep_the_lm_head_whole_and_attend_over_the_whole_cache():
    # issue 20: gpt-fast's tp.py shards the layers only, so each rank reads the whole LM head;
    # and its decode attends over the whole 208-position cache generate.py allocates
    from graphllm.models.hardware import load_hardware

    pub = load_script("published")
    row = next(r for r in pub.load_rows() if r["id"] == "gpt-fast llama3.1-8b bf16 tp8")
    assert row["whole_vocab"] is True and row["past"] == 207
    cut = pub.predict_seconds(row | {"whole_vocab": False})
    lm_head = 128256 * 4096 * 2 * 7 / 8  # bytes a rank reads beyond its eighth
    added = lm_head / load_hardware(row["hardware"]).bandwidth()
    assert 0.8 * added < pub.predict_seconds(row) - cut < added  # less the logits' gather
    short = pub.predict_seconds(row | {"past": 105})
    assert pub.predict_seconds(row) > short


def test_prefill_pairs_split_two_ttfts_into_a_slope_and_an_intercept():
    pub = load_script("published")
    same = {"engine": "e", "version": "v", "hardware": "h", "model": "m", "tp": 1, "batch": 1}
    same |= {"metric": "ttft_ms", "precision": {"weight": "fp8"}}
    rows = [
        same | {"id": "short", "prompt": 128, "measured": 7.0, "predicted": 4.0},
        same | {"id": "long", "prompt": 2048, "measured": 36.0, "predicted": 28.0},
        same | {"id": "alone", "prompt": 128, "measured": 9.0, "predicted": 6.0, "tp": 2},
    ]
    (pair,) = pub.prefill_pairs(rows)  # the tp 2 row has no partner
    assert pair["rows"] == ["short", "long"] and pair["prompts"] == [128, 2048]
    slope = {"measured": 29.0 / 1.92, "predicted": 24.0 / 1.92}
    assert pair["ms_per_1000_tokens"] == pytest.approx(slope)
    assert pair["intercept_ms"]["measured"] == pytest.approx(7.0 - slope["measured"] * 0.128)
    assert pair["intercept_ms"]["predicted"] == pytest.approx(4.0 - slope["predicted"] * 0.128)
    assert pair["slope_ratio"] == pytest.approx(29.0 / 24.0)


def test_the_table_s_prefill_pairs_are_its_ttft_rows_at_two_lengths(doc):
    pairs = doc["prefill_pairs"]
    rows = {r["id"]: r for r in doc["rows"]}
    assert len(pairs) >= 5
    for p in pairs:
        short, long = (rows[i] for i in p["rows"])
        assert short["metric"] == long["metric"] == "ttft_ms"
        assert short["hardware"] == long["hardware"] and short["tp"] == long["tp"]
        assert short["prompt"] < long["prompt"]
        span = (long["prompt"] - short["prompt"]) / 1e3
        assert p["ms_per_1000_tokens"]["measured"] == pytest.approx(
            (long["measured"] - short["measured"]) / span
        )
