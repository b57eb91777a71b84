"""What a fixed state remembers (the recall experiment) and what the caches of Qwen3-Next's hybrid hold."""

from __future__ import annotations

import pytest

from mha_course.state_memory import (QWEN3_NEXT_80B_A3B, hybrid_cache_rows, measured_layer_bytes, recall_experiment,
                                     recall_table)


@pytest.fixture(scope="module")
def rows():
    return {r["pairs"]: r for r in recall_experiment()}


def test_the_cache_recalls_every_pair_and_the_states_fail_past_their_size(rows):
    assert all(r["softmax"] == 1.0 for r in rows.values())
    for n in (8, 16):  # fewer pairs than the state's 32 rows: all recalled
        assert rows[n]["linear"] == rows[n]["delta"] == 1.0
    for memory in ("linear", "delta"):  # eight times as many pairs as rows: most are lost
        assert rows[256][memory] < 0.5
    # the delta rule keeps the most recent pairs and overwrites the old ones
    assert rows[256]["delta recent"] > 2 * rows[256]["delta"]


def test_the_table_reads_per_cent(rows):
    text = str(recall_table(list(rows.values())))
    assert "100 %" in text and "pairs written" in text


def test_a_state_layer_holds_the_same_bytes_after_any_prompt_and_the_hybrid_adds_up():
    measured = measured_layer_bytes()
    s = QWEN3_NEXT_80B_A3B
    state = s["linear_num_value_heads"] * s["linear_key_head_dim"] * s["linear_value_head_dim"] * 4  # float32
    inputs = (2 * s["linear_num_key_heads"] * s["linear_key_head_dim"]
              + s["linear_num_value_heads"] * s["linear_value_head_dim"]) * (s["linear_conv_kernel_dim"] - 1) * 2
    assert measured == {"state": state + inputs, "kv_per_token": 2 * s["num_key_value_heads"] * s["head_dim"] * 2}
    for row in hybrid_cache_rows():
        assert row["hybrid"] == 36 * row["state layer"] + 12 * row["attention layer"]
        assert row["all attention"] == 48 * row["attention layer"]
        assert row["attention layer"] == measured["kv_per_token"] * row["tokens"]
