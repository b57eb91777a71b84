"""The comparison tables and head-count sweeps report what the modules really own, return and cost."""

from __future__ import annotations

import pytest
import torch

from conftest import build
from mha_course import CausalAttention, MultiHeadAttentionWrapper, three_token_example
from mha_course.compare import compare_modules, describe_module, head_count_sweep, head_outputs, sweep_table
from mha_course.cost import multiply_adds, parameter_count


# --- Head outputs and one-module reports --------------------------------------------------------------

def test_head_outputs_of_the_wrapper_are_the_heads_and_merge_by_concatenation():
    wrapper = build("wrapper", num_heads=3)
    x = torch.randn(2, 5, 3)
    zs = head_outputs(wrapper, x)
    assert [tuple(z.shape) for z in zs] == [(2, 5, 2)] * 3
    for head, z in zip(wrapper.heads, zs):
        assert torch.equal(z, head(x))
    assert torch.equal(torch.cat(zs, dim=-1), wrapper(x))


def test_head_outputs_of_the_batched_module_are_its_slices_before_out_proj():
    mha = build("batched", num_heads=2, head_dim=3)
    x = torch.randn(2, 6, 3)
    zs = head_outputs(mha, x)
    assert [tuple(z.shape) for z in zs] == [(2, 6, 3)] * 2
    torch.testing.assert_close(mha.out_proj(torch.cat(zs, dim=-1)), mha(x))
    # Each slice is that head's attention weights applied to its own slice of the values.
    weights = mha.attention_weights(x)  # (B, h, T, T)
    values = mha.W_value(x)  # (B, T, d_out)
    for h, z in enumerate(zs):
        torch.testing.assert_close(z, weights[:, h] @ values[..., 3 * h:3 * (h + 1)])


def test_head_outputs_of_one_head_is_its_output():
    head = build("causal")
    x = torch.randn(1, 4, 3)
    (z,) = head_outputs(head, x)
    assert torch.equal(z, head(x))


@pytest.mark.parametrize("kind", ["causal", "wrapper", "batched"])
def test_describe_module_agrees_with_the_cost_formulas(kind):
    module = build(kind, d_in=5, head_dim=3, num_heads=2, context_length=8)
    x = torch.randn(2, 7, 5)
    report = describe_module(module, x, measure_time=False)
    d_out = module.d_out
    num_heads = 1 if kind == "causal" else 2
    assert report.parameters == parameter_count(kind, 5, d_out, num_heads)
    assert report.multiply_adds == multiply_adds(kind, 2, 7, 5, d_out, num_heads).total
    assert report.num_heads == num_heads and report.head_dim == 3
    assert report.head_output_shapes == ((2, 7, 3),) * num_heads
    assert report.output_shape == tuple(module(x).shape)
    assert report.time is None and report.name == type(module).__name__


def test_describe_module_lists_every_weight_matrix():
    assert describe_module(build("causal"), torch.randn(1, 3, 3), measure_time=False).weight_matrices == ((2, 3),) * 3
    batched = describe_module(build("batched"), torch.randn(1, 3, 3), measure_time=False)
    assert batched.weight_matrices == ((4, 3), (4, 3), (4, 3), (4, 4))


def test_describe_module_rejects_other_modules_and_bad_input():
    with pytest.raises(TypeError, match="module must be a CausalAttention, MultiHeadAttentionWrapper or "
                                        "MultiHeadAttention, got Linear"):
        describe_module(torch.nn.Linear(3, 3), torch.randn(1, 3, 3))
    with pytest.raises(ValueError, match="x has 4 features per token"):
        describe_module(build("wrapper"), torch.randn(1, 3, 4))


# --- The one-table comparison -------------------------------------------------------------------------

def test_compare_one_head_with_two_heads_on_the_three_token_example():
    x = three_token_example(batch=True)
    table = compare_modules({"one head": CausalAttention(3, 2, 3, 0.0),
                             "two heads": MultiHeadAttentionWrapper(3, 2, 3, 0.0, num_heads=2)},
                            x, min_run_time=0.01, rounds=1)
    assert table.column("module") == ["one head", "two heads"]
    assert table.column("heads") == [1, 2]
    assert table.column("weight matrices") == ["3 x (2, 3)", "6 x (2, 3)"]
    assert table.column("parameters") == [18, 36]
    assert table.column("head outputs Z_m") == ["1 x (1, 3, 2)", "2 x (1, 3, 2)"]
    assert table.column("merged output Z") == ["(1, 3, 2)", "(1, 3, 4)"]
    assert table.column("multiply-adds") == [90, 180]
    times, ratios = table.column("time"), table.column("time ratio")
    assert all(t > 0 for t in times) and ratios[0] == 1.0
    assert ratios[1] == pytest.approx(times[1] / times[0])


def test_compare_modules_without_time_and_with_nothing():
    table = compare_modules({"batched": build("batched")}, torch.randn(1, 3, 3), measure_time=False)
    assert "time" not in table.columns
    assert table.column("weight matrices") == ["3 x (4, 3) + 1 x (4, 4)"]
    with pytest.raises(ValueError, match="modules is empty"):
        compare_modules({}, torch.randn(1, 3, 3))


# --- The head-count sweep --------------------------------------------------------------------------------

def test_head_width_fixed_grows_with_the_heads():
    points = head_count_sweep((1, 2, 4), regimes=["head_width_fixed"], implementations=("stacked", "batched"),
                              d_in=8, head_dim=4, batch=1, num_tokens=5, measure_time=False)
    wrapper = [p for p in points if p.implementation == "stacked"]
    assert [p.width for p in wrapper] == [4, 8, 16]
    assert [p.parameters for p in wrapper] == [h * 3 * 8 * 4 for h in (1, 2, 4)]
    assert [p.multiply_adds for p in wrapper] == [h * wrapper[0].multiply_adds for h in (1, 2, 4)]
    batched = [p for p in points if p.implementation == "batched"]
    assert [p.parameters for p in batched] == [parameter_count("batched", 8, 4 * h, h) for h in (1, 2, 4)]
    assert [p.score_bytes for p in batched] == [h * 5 * 5 * 4 for h in (1, 2, 4)]


def test_model_width_fixed_keeps_parameters_and_products_but_not_the_score_tensor():
    points = head_count_sweep((1, 2, 4, 8), regimes=["model_width_fixed"], implementations=("stacked", "batched"),
                              d_in=8, d_model=16, batch=2, num_tokens=6, measure_time=False)
    for implementation in ("stacked", "batched"):
        group = [p for p in points if p.implementation == implementation]
        assert [p.head_dim for p in group] == [16, 8, 4, 2]
        assert len({p.parameters for p in group}) == 1 and len({p.multiply_adds for p in group}) == 1
        assert [p.score_bytes for p in group] == [2 * h * 6 * 6 * 4 for h in (1, 2, 4, 8)]


def test_sweep_times_every_point_and_tabulates_ratios():
    points = head_count_sweep((1, 2), d_in=4, head_dim=2, d_model=4, batch=1, num_tokens=3,
                              min_run_time=0.005, rounds=1)
    assert len(points) == 4 and all(p.time.median > 0 for p in points)
    table = sweep_table(points)
    assert table.column("fixed") == ["head width"] * 2 + ["model width"] * 2
    assert table.column("ratio of parameters") == [1.0, 2.0, 1.0, 1.0]
    assert table.column("time ratio")[0] == 1.0 and table.column("time ratio")[2] == 1.0


def test_sweep_rejects_bad_arguments():
    with pytest.raises(ValueError, match="regime must be one of 'head_width_fixed', 'model_width_fixed', got 'wide'"):
        head_count_sweep((1,), regimes=["wide"], measure_time=False)
    with pytest.raises(ValueError, match=r"unknown implementations \['wrapper'\]: choose from stacked, batched"):
        head_count_sweep((1,), implementations=["wrapper"], measure_time=False)
    with pytest.raises(ValueError, match="'torch_mha' cannot run with 1 heads of width 32: torch.nn.Multihead"):
        head_count_sweep((1,), d_in=16, implementations=["torch_mha"], measure_time=False)
    with pytest.raises(ValueError, match=r"d_out \(256\) must be divisible by num_heads \(3\)"):
        head_count_sweep((1, 3), measure_time=False)
    with pytest.raises(ValueError, match="head_counts entry must be a positive integer, got 0"):
        head_count_sweep((0, 1), measure_time=False)
    with pytest.raises(ValueError, match="head_counts is empty"):
        head_count_sweep((), measure_time=False)
    with pytest.raises(ValueError, match="points is empty"):
        sweep_table([])


def test_sweep_builds_any_registered_implementation_by_its_name():
    points = head_count_sweep((1, 2), regimes=["model_width_fixed"], implementations=("batched", "fast", "torch_mha"),
                              d_in=8, d_model=8, batch=1, num_tokens=4, measure_time=False)
    by_name = {name: [p.parameters for p in points if p.implementation == name] for name in ("batched", "fast")}
    assert by_name["batched"] == by_name["fast"] == [parameter_count("batched", 8, 8, h) for h in (1, 2)]
    assert [p.implementation for p in points] == ["batched"] * 2 + ["fast"] * 2 + ["torch_mha"] * 2


def test_a_sweep_of_one_implementation_names_it_in_the_title_not_in_a_column():
    points = head_count_sweep((1, 2), implementations=("stacked",), d_in=4, head_dim=2, d_model=4, batch=1,
                              num_tokens=3, measure_time=False)
    table = sweep_table(points)
    assert "implementation" not in table.columns and table.title == (
        "MultiHeadAttentionWrapper (stacked) with more and more heads, in both regimes; each ratio is to the "
        "fewest heads of the same regime")
    one = sweep_table(head_count_sweep((2, 4), regimes=["model_width_fixed"], d_in=4, d_model=4, batch=1,
                                       num_tokens=3, measure_time=False))
    assert "in the model width fixed regime" in one.title
    assert table.column("heads") == [1, 2, 1, 2]
    both = sweep_table(head_count_sweep((1, 2), implementations=("stacked", "batched"), d_in=4, head_dim=2,
                                       d_model=4, batch=1, num_tokens=3, measure_time=False))
    assert both.column("implementation") == ["stacked", "stacked", "batched", "batched"] * 2
