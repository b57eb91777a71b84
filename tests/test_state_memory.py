"""What a fixed state remembers (the recall experiment) and what the caches of Qwen3-Next's hybrid hold."""

from __future__ import annotations

import pytest

from mha_course.state_memory import HYBRID, hybrid_cache_rows, hybrid_cache_table, recall_experiment, recall_table


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


def test_the_hybrid_adds_up_its_measured_layers_as_published():
    """Qwen3-Next-80B-A3B: 36 Gated DeltaNet layers, each a fixed size, and 12 attention layers that grow."""
    pytest.importorskip("transformers")
    rows = hybrid_cache_rows(lengths=(4096, 131072))
    assert len({row["state layer"] for row in rows}) == 1
    for row in rows:
        assert row["attention layer"] == 2 * 2 * 256 * 2 * row["tokens"]  # a key and a value, 2 heads of 256
        assert row["hybrid"] == 36 * row["state layer"] + 12 * row["attention layer"]
        assert row["all attention"] == 48 * row["attention layer"]
    notes = "\n".join(hybrid_cache_table(rows).notes)
    assert "last 3 inputs" in notes and "36 Gated DeltaNet layers and 12 attention layers" in notes
    assert HYBRID in hybrid_cache_table(rows).title
