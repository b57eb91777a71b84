"""Answers to the exercise of chapter 5 for the check tests: correct ones, and one per catalogued mistake.

Written the way a learner would write them, independently of the catalogue's own detector
(:func:`mha_course.exercises.chapter5.drop_variant`), so a test passes only if the catalogue
recognises real code.
"""

from __future__ import annotations

import copy

import torch

from mha_course.experiments.specialisation import accuracy

# ----------------------------------------------------------------------------------------------
# 5.1


def accuracy_drop(model, head, tokens, labels):
    ablated = copy.deepcopy(model)
    d_h = model.attention.head_dim
    with torch.no_grad():
        ablated.attention.out_proj.weight[:, head * d_h:(head + 1) * d_h] = 0
    return accuracy(model, tokens, labels) - accuracy(ablated, tokens, labels)


def accuracy_drop_by_values(model, head, tokens, labels):
    # Zeroing the head's value rows silences it too (the model's projections have no bias).
    ablated_model = copy.deepcopy(model)
    d_h = model.attention.head_dim
    with torch.no_grad():
        ablated_model.attention.W_value.weight[head * d_h:(head + 1) * d_h] = 0
    return accuracy(model, tokens, labels) - accuracy(ablated_model, tokens, labels)


def _drop(zero, result="drop", in_place=False, all_positions=False, train_original=False):
    def accuracy_drop(model, head, tokens, labels):
        if train_original:
            model.train()  # e.g. to read the mode-dependent layers; the weights stay as they were
        target = model if in_place else copy.deepcopy(model)
        attention, d_h = target.attention, model.attention.head_dim
        with torch.no_grad():
            zero(attention, head, d_h)

        def score(m):
            if all_positions:
                return (m(tokens).argmax(-1) == labels).float().mean().item()
            return accuracy(m, tokens, labels)
        full, without = score(model) if not in_place else None, score(target)
        if in_place:
            return 1.0 - without
        return {"drop": full - without, "negative": without - full, "accuracy": without}[result]
    return accuracy_drop


def _columns(attention, head, d_h):
    attention.out_proj.weight[:, head * d_h:(head + 1) * d_h] = 0


def _others(attention, head, d_h):
    for other in range(attention.num_heads):
        if other != head:
            _columns(attention, other, d_h)


def _with_bias(attention, head, d_h):
    _columns(attention, head, d_h)
    attention.out_proj.bias.zero_()


def accuracy_drop_by_a_hook(model, head, tokens, labels):
    # Silences the head by a hook on out_proj's input, removed before returning.
    d_h = model.attention.head_dim

    def silence(module, inputs):
        merged = inputs[0].clone()
        merged[..., head * d_h:(head + 1) * d_h] = 0
        return (merged,)
    full = accuracy(model, tokens, labels)
    handle = model.attention.out_proj.register_forward_pre_hook(silence)
    try:
        return full - accuracy(model, tokens, labels)
    finally:
        handle.remove()


def _drop_by_a_hook_left_on(model, head, tokens, labels):
    # Silences the head by a hook on out_proj's input, and never removes the hook.
    full = accuracy(model, tokens, labels)
    d_h = model.attention.head_dim

    def silence(module, inputs):
        merged = inputs[0].clone()
        merged[..., head * d_h:(head + 1) * d_h] = 0
        return (merged,)
    model.attention.out_proj.register_forward_pre_hook(silence)
    return full - accuracy(model, tokens, labels)


def _drop_outside_no_grad(model, head, tokens, labels):
    ablated_model = copy.deepcopy(model)
    d_h = model.attention.head_dim
    ablated_model.attention.out_proj.weight[:, head * d_h:(head + 1) * d_h] = 0  # torch refuses: a leaf in place
    return accuracy(model, tokens, labels) - accuracy(ablated_model, tokens, labels)


def _drop_from_the_checks(model, head, tokens, labels):
    from mha_course.exercises import chapter5

    return accuracy(model, tokens, labels) - accuracy(chapter5.ablated(model, head), tokens, labels)


CORRECT = {"5.1": accuracy_drop}

#: More correct answers, written differently.
ALSO_CORRECT = {"5.1": [accuracy_drop_by_values, accuracy_drop_by_a_hook]}

WRONG = {
    ("5.1", "in-place"): _drop(_columns, in_place=True),
    ("5.1", "output-rows"): _drop(lambda a, h, d: a.out_proj.weight[h * d:(h + 1) * d].zero_()),
    ("5.1", "from-one"): _drop(lambda a, h, d: a.W_value.weight[(h - 1) * d:h * d].zero_()),
    ("5.1", "next-head"): _drop(lambda a, h, d: a.out_proj.weight[:, (h + 1) * d:(h + 2) * d].zero_()),
    ("5.1", "not-scaled"): _drop(lambda a, h, d: a.W_value.weight[h:h + d].zero_()),
    ("5.1", "interleaved"): _drop(lambda a, h, d: a.out_proj.weight[:, h::a.num_heads].zero_()),
    ("5.1", "value-columns"): _drop(lambda a, h, d: a.W_value.weight[:, h * d:(h + 1) * d].zero_()),
    ("5.1", "queries-zeroed"): _drop(lambda a, h, d: a.W_query.weight[h * d:(h + 1) * d].zero_()),
    ("5.1", "kept-only-that-head"): _drop(_others),
    ("5.1", "bias-zeroed"): _drop(_with_bias),
    ("5.1", "sign-flipped"): _drop(_columns, result="negative"),
    ("5.1", "accuracy-not-drop"): _drop(_columns, result="accuracy"),
    ("5.1", "position-zero-counted"): _drop(_columns, all_positions=True),
    ("5.1", "mode-changed"): _drop(_columns, train_original=True),
    ("5.1", "hook-left"): _drop_by_a_hook_left_on,
    ("5.1", "no-grad-missing"): _drop_outside_no_grad,
}

#: Answers that are, or call, the package's own answer (or the checks' own): refused, naming what
#: they use. Name -> (exercise, answer, what the message names).
BY_THE_PACKAGE = {
    "5.1 calls the check's reference": ("5.1", _drop_from_the_checks, "the checks' own chapter5.ablated"),
}
