"""The head-specialisation experiment: task labels, reproducible training, heads that differ, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from mha_course import MultiHeadAttention  # noqa: E402
from mha_course.cli import main  # noqa: E402
from mha_course.cost import count_parameters  # noqa: E402
from mha_course.experiments.specialisation import (  # noqa: E402
    IGNORE_INDEX,
    SpecialisationConfig,
    TinyAttentionModel,
    accuracy,
    difference_task,
    evaluate,
    evaluation_data,
    accuracy_by_heads,
    first_share_by_difference,
    OTHER_BELOW,
    ROLE_THRESHOLD,
    head_role,
    head_scores,
    load_results,
    mean_attention_maps,
    one_token_accuracy,
    plot_accuracy_by_heads,
    plot_first_share_by_difference,
    roles_table,
    run_experiment,
    save_results,
    summary_table,
    train,
)

BOOK_RESULTS = Path(__file__).resolve().parents[1] / "book" / "data" / "specialisation.json"
TINY = SpecialisationConfig(steps=20, batch_size=16, eval_size=50)


# ---------------------------------------------------------------------------------------------- task

@pytest.mark.parametrize("vocab_size,num_tokens", [(8, 8), (3, 5), (11, 3)])
def test_labels_are_first_minus_previous(vocab_size, num_tokens):
    tokens, labels = difference_task(20, num_tokens, vocab_size, seed=7)
    assert tokens.shape == labels.shape == (20, num_tokens)
    assert tokens.dtype == labels.dtype == torch.long
    for row_tokens, row_labels in zip(tokens.tolist(), labels.tolist()):
        assert all(0 <= token < vocab_size for token in row_tokens)
        assert row_labels[0] == IGNORE_INDEX  # nothing before the first token
        for t in range(1, num_tokens):  # recomputed one position at a time, in plain Python
            difference = row_tokens[0] - row_tokens[t - 1]
            assert row_labels[t] == difference + vocab_size - 1
            assert 0 <= row_labels[t] < 2 * vocab_size - 1
        assert row_labels[1] == vocab_size - 1  # position 1: the previous token is the first, difference 0


def test_task_documented_example():
    tokens, labels = difference_task(1, num_tokens=5, vocab_size=8, seed=3)
    first, previous = tokens[0, 0].item(), tokens[0, :-1].tolist()
    assert [label - 7 for label in labels[0, 1:].tolist()] == [first - p for p in previous]


def test_task_is_seeded_and_leaves_global_rng_alone():
    state = torch.get_rng_state()
    a = difference_task(5, seed=1)
    b = difference_task(5, seed=1)
    c = difference_task(5, seed=2)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    assert torch.equal(torch.get_rng_state(), state)
    generator = torch.Generator().manual_seed(1)
    first, second = difference_task(5, seed=generator), difference_task(5, seed=generator)
    assert torch.equal(first[0], a[0]) and not torch.equal(second[0], a[0])  # a generator keeps drawing


def test_task_bad_arguments():
    with pytest.raises(ValueError, match="num_tokens must be at least 3"):
        difference_task(4, num_tokens=2)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        difference_task(0)
    with pytest.raises(ValueError, match="seed must be a non-negative integer, got -1. Pass 0 or more."):
        difference_task(4, seed=-1)
    with pytest.raises(TypeError, match="vocab_size must be a positive integer"):
        difference_task(4, vocab_size=2.5)


# ---------------------------------------------------------------------------------------------- model

def test_model_width_and_parameters_do_not_depend_on_head_count():
    counts = set()
    for num_heads in (1, 2, 4):
        model = TinyAttentionModel(vocab_size=8, num_tokens=8, d_model=16, num_heads=num_heads)
        assert isinstance(model.attention, MultiHeadAttention)
        assert model.attention.d_out == 16 and model.attention.head_dim == 16 // num_heads
        counts.add(count_parameters(model))
    assert len(counts) == 1


def test_model_shapes_and_attention_weights():
    model = TinyAttentionModel(8, 8, 16, 2)
    tokens, _ = difference_task(3, 8, 8)
    assert model(tokens).shape == (3, 8, 15)
    weights = model.attention_weights(tokens)
    assert weights.shape == (3, 2, 8, 8)
    assert torch.allclose(weights.sum(-1), torch.ones(3, 2, 8))
    assert torch.all(weights.triu(1) == 0)  # causal: nothing from later positions


def test_model_bad_inputs():
    with pytest.raises(ValueError, match="num_heads=3 does not divide d_model=16"):
        TinyAttentionModel(8, 8, 16, 3)
    model = TinyAttentionModel(8, 8, 16, 2)
    with pytest.raises(TypeError, match="tokens must be a 2-D int64 tensor"):
        model(torch.zeros(2, 8))
    with pytest.raises(TypeError, match="got a 1-D torch.int64 tensor"):
        model(torch.zeros(8, dtype=torch.long))
    with pytest.raises(ValueError, match="token ids must lie in 0..7"):
        model(torch.full((1, 8), 8))
    with pytest.raises(ValueError, match="num_tokens=8"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_config_bad_arguments():
    with pytest.raises(ValueError, match="steps must be a positive integer, got 0"):
        SpecialisationConfig(steps=0)
    with pytest.raises(ValueError, match="vocab_size must be at least 2"):
        SpecialisationConfig(vocab_size=1)
    with pytest.raises(ValueError, match="num_tokens must be at least 3"):
        SpecialisationConfig(num_tokens=2)
    with pytest.raises(ValueError, match="learning_rate must be a number between 0 and 1, got 5"):
        SpecialisationConfig(learning_rate=5)
    with pytest.raises(TypeError, match="config must be a SpecialisationConfig"):
        train(2, config={"steps": 3})


# ---------------------------------------------------------------------------------------------- training

def test_training_is_reproducible_and_leaves_threads_and_rng_alone():
    threads, state = torch.get_num_threads(), torch.get_rng_state()
    first = train(2, seed=3, config=TINY)
    second = train(2, seed=3, config=TINY)
    other = train(2, seed=4, config=TINY)
    assert first.losses == second.losses and len(first.losses) == TINY.steps
    for (name, a), (_, b) in zip(first.model.state_dict().items(), second.model.state_dict().items()):
        assert torch.equal(a, b), name
    assert first.losses != other.losses
    assert evaluate(first) == evaluate(second)
    assert torch.get_num_threads() == threads
    assert torch.equal(torch.get_rng_state(), state)


def test_training_lowers_the_loss():
    run = train(2, seed=0, config=SpecialisationConfig(steps=60))
    assert sum(run.losses[-10:]) / 10 < 0.8 * sum(run.losses[:10]) / 10


def test_train_bad_arguments():
    with pytest.raises(ValueError, match="num_heads=3 does not divide d_model=16"):
        train(3, config=TINY)
    with pytest.raises(ValueError, match="seed must be a non-negative integer, got -1. Pass 0 or more."):
        train(2, seed=-1, config=TINY)
    with pytest.raises(ValueError, match="num_heads must be a positive integer"):
        train(0, config=TINY)


@pytest.fixture(scope="module")
def two_head_run():
    """The book's 2-head model on seed 0, with a shorter budget (a couple of seconds)."""
    return train(2, seed=0, config=SpecialisationConfig(steps=250))


def test_trained_two_head_model_heads_differ(two_head_run):
    tokens, labels = evaluation_data(two_head_run.config)
    assert accuracy(two_head_run.model, tokens, labels) > 0.9
    scores = head_scores(two_head_run.model, tokens)  # (h, 2): share on first, share on previous
    assert scores.shape == (2, 2)
    reader_of_first = int(scores[:, 0].argmax())
    reader_of_previous = 1 - reader_of_first
    # One head reads the first token, the other the previous token.
    assert scores[reader_of_first, 0] > 0.8 and scores[reader_of_previous, 1] > 0.8
    assert (scores[0] - scores[1]).abs().min() > 0.6


def test_scores_maps_and_shares_are_consistent(two_head_run):
    tokens, _ = evaluation_data(two_head_run.config)
    maps = mean_attention_maps(two_head_run.model, tokens)
    assert maps.shape == (2, 8, 8) and torch.allclose(maps.sum(-1), torch.ones(2, 8))
    scores = head_scores(two_head_run.model, tokens)
    queries = torch.arange(2, 8)
    assert torch.allclose(scores[:, 0], maps[:, 2:, 0].mean(-1), atol=1e-6)
    assert torch.allclose(scores[:, 1], maps[:, queries, queries - 1].mean(-1), atol=1e-6)
    shares = first_share_by_difference(two_head_run.model, tokens)
    assert shares.shape == (2, 15)
    # A head that reads the first token whatever it holds has a flat profile near 1.
    reader = int(scores[:, 0].argmax())
    assert shares[reader].min() > 0.8


def test_head_scores_by_hand():
    """On a model whose attention we set by hand, the scores are the shares we put there."""
    model = TinyAttentionModel(vocab_size=4, num_tokens=5, d_model=4, num_heads=2)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    tokens = torch.tensor([[0, 1, 2, 3, 0]])
    # All-zero weights give every head uniform attention over the visible positions.
    scores = head_scores(model, tokens)
    expected_first = sum(1 / (t + 1) for t in range(2, 5)) / 3
    assert torch.allclose(scores, torch.tensor([[expected_first, expected_first]] * 2))


# ---------------------------------------------------------------------------------------------- experiment

def _fake_results():
    def run(num_heads, seed, steps, acc):
        return {"num_heads": num_heads, "head_dim": 16 // num_heads, "seed": seed, "steps": steps, "accuracy": acc,
                "final_loss": 0.1, "head_scores": [[0.5, 0.5]] * num_heads,
                "first_share_by_difference": [[0.1 * i for i in range(15)]] * num_heads,
                "mean_attention_maps": [[[0.0] * 8] * 8] * num_heads}
    runs = [run(1, 0, 10, 0.2), run(1, 1, 10, 1.0), run(2, 0, 10, 1.0), run(2, 1, 10, 1.0),
            run(1, 0, 40, 1.0), run(1, 1, 40, 0.6)]
    return {"config": {**SpecialisationConfig(steps=10).__dict__}, "seeds": 2, "heads": [1, 2],
            "long_budget_factor": 4, "runs": runs, "command": "python -m mha_course specialise --seeds 2"}


def test_accuracy_by_heads_mean_spread_and_solved():
    rows = accuracy_by_heads(_fake_results())
    assert [(r["num_heads"], r["steps"]) for r in rows] == [(1, 10), (2, 10), (1, 40)]
    one, two, longer = rows
    assert one["mean"] == pytest.approx(0.6) and one["std"] == pytest.approx(0.5656854, abs=1e-6)
    assert (one["min"], one["max"], one["solved"], one["seeds"]) == (0.2, 1.0, 1, 2)
    assert two["mean"] == 1.0 and two["std"] == 0.0 and two["solved"] == 2
    assert longer["mean"] == pytest.approx(0.8)
    table = summary_table(_fake_results())
    assert str(table).splitlines()[2].split() == ["1", "16", "10", "0.600", "0.566", "0.200", "1.000", "1/2"]
    assert table.column("mean") == [row["mean"] for row in rows]


def test_roles_table_one_row_per_seed():
    lines = str(roles_table(_fake_results(), 2)).splitlines()
    assert lines[0].split() == ["seed", "accuracy", "head", "1", "head", "2"]
    assert lines[2].split() == ["0", "1.000", "first+previous", "0.50/0.50", "first+previous", "0.50/0.50"]
    assert len(lines) == 4


def test_head_role_and_one_token_accuracy():
    assert [head_role(*pair) for pair in [(0.9, 0.1), (0.0, 0.85), (0.45, 0.45), (0.2, 0.2)]] == [
        "first", "previous", "first+previous", "other"]
    # A head with nothing on the first token is not a mix of the two tokens: it names where it looks.
    assert [head_role(*pair) for pair in [(0.0, 0.51), (0.55, 0.0), (0.75, 0.25), (0.48, 0.38)]] == [
        "previous+other", "first+other", "first+previous", "first+previous"]
    assert (ROLE_THRESHOLD, OTHER_BELOW) == (0.8, 0.5)  # the thresholds chapter 5 states
    with pytest.raises(ValueError, match="threshold must be in"):
        head_role(0.5, 0.5, threshold=0.4)
    # 3 labelled positions, vocabulary of 2: position 1 is free, the other two are a coin toss.
    assert one_token_accuracy(SpecialisationConfig(vocab_size=2, num_tokens=4)) == pytest.approx((1 + 2 / 2) / 3)


def test_run_experiment_structure_and_round_trip(tmp_path):
    results = run_experiment(seeds=2, heads=(1, 2), config=TINY, long_budget_factor=2, progress=False)
    assert [(r["num_heads"], r["seed"], r["steps"]) for r in results["runs"]] == [
        (1, 0, 20), (1, 1, 20), (2, 0, 20), (2, 1, 20), (1, 0, 40), (1, 1, 40)]
    assert results["runs"][2]["accuracy"] == evaluate(train(2, 0, TINY))["accuracy"]
    path = save_results(results, tmp_path / "deep" / "results.json")
    assert load_results(path) == json.loads(json.dumps(results))
    assert len(accuracy_by_heads(results)) == 3


def test_run_experiment_bad_arguments():
    with pytest.raises(ValueError, match="seeds must be a positive integer, got 0"):
        run_experiment(seeds=0, config=TINY)
    with pytest.raises(ValueError, match="num_heads=3 does not divide d_model=16"):
        run_experiment(seeds=1, heads=(1, 3), config=TINY)
    with pytest.raises(ValueError, match="heads is empty"):
        run_experiment(seeds=1, heads=(), config=TINY)
    with pytest.raises(ValueError, match="long_budget_factor must be 0 .* or a whole number >= 2 .*, got 1"):
        run_experiment(seeds=1, config=TINY, long_budget_factor=1)


def test_load_results_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m mha_course specialise --out"):
        load_results(tmp_path / "missing.json")
    (tmp_path / "other.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ValueError, match="lacks"):
        load_results(tmp_path / "other.json")


def test_plots_draw_every_seed():
    results = _fake_results()
    fig = plot_accuracy_by_heads(results)
    ax = fig.axes[0]
    assert [t.get_text().split("\n")[0] for t in ax.get_xticklabels()] == ["1 head", "2 heads", "1 head"]
    assert sum(len(c.get_offsets()) for c in ax.collections if hasattr(c, "get_offsets")) >= 6
    # Each bar runs from the lowest seed to the highest, inside the axes (a mean + std would pass 1).
    bars = [container.lines[2][0].get_segments()[0][:, 1] for container in ax.containers]
    rows = accuracy_by_heads(results)
    assert [(low, high) for low, high in bars] == [pytest.approx((row["min"], row["max"])) for row in rows]
    assert max(high for _, high in bars) <= ax.get_ylim()[1]
    # The title holds for every group: the last one trained four times as long.
    assert "same budget" not in ax.get_title() and "10 steps unless marked" in ax.get_title()
    plt.close(fig)
    fig = plot_first_share_by_difference(results)
    assert len(fig.axes[0].lines) == 2  # one line per seed (one head each)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- command line

def test_cli_bad_arguments(tmp_path, capsys):
    assert main(["specialise", "--seeds", "0", "--out", str(tmp_path / "r.json")]) == 2
    assert "--seeds must be a positive integer, got 0. Pass a whole number of at least 1." in capsys.readouterr().err
    assert main(["specialise", "--seeds", "1", "--out", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["specialise", "--seeds", "two"])
    assert "invalid int value: 'two'" in capsys.readouterr().err


def test_cli_writes_results(tmp_path, capsys, monkeypatch):
    import mha_course.experiments.specialisation as specialisation

    fake = _fake_results()
    monkeypatch.setattr(specialisation, "run_experiment", lambda seeds, progress: fake)
    out = tmp_path / "sub" / "r.json"
    assert main(["specialise", "--seeds", "2", "--out", str(out), "--no-progress"]) == 0
    assert json.loads(out.read_text(encoding="utf-8")) == fake
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "1/2" in printed


# ---------------------------------------------------------------------------------------------- the book's file

def test_book_results_are_current():
    """The stored results match what the code computes now (the 2-head model of seed 0)."""
    results = load_results(BOOK_RESULTS)
    config = SpecialisationConfig(**results["config"])
    assert config == SpecialisationConfig()  # the book's settings
    stored = next(r for r in results["runs"] if r["num_heads"] == 2 and r["seed"] == 0
                  and r["steps"] == config.steps)
    fresh = evaluate(train(2, seed=0, config=config))
    assert fresh["accuracy"] == pytest.approx(stored["accuracy"], abs=1e-3)
    assert torch.allclose(torch.tensor(fresh["head_scores"]), torch.tensor(stored["head_scores"]), atol=1e-3)
    assert {(r["num_heads"], r["seed"]) for r in results["runs"] if r["steps"] == config.steps} == {
        (h, s) for h in results["heads"] for s in range(results["seeds"])}
