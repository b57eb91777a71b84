"""Answers to the exercise of chapter 8 for the check tests: correct ones, and one per catalogued mistake.

Written the way a learner would write them, independently of the catalogue's own detector
(:func:`mha_course.exercises.chapter8.state_variant`), so a test passes only if the catalogue
recognises real code.
"""

from __future__ import annotations

import torch

import mha_course

# ----------------------------------------------------------------------------------------------
# 8.1


def _state(mha, *, transpose=True, out_transpose=True, order=("q", "k", "v"), per_head=False, biases=True,
           rows=False):
    layers = {"q": mha.W_query, "k": mha.W_key, "v": mha.W_value}
    weights = [layers[role].weight for role in order]  # (d, d_in) each
    if rows:  # stacked as nn.Linear keeps them: (3d, d_in)
        weight = torch.cat(weights, dim=0)
    elif per_head:
        h, d_h = mha.num_heads, mha.d_out // mha.num_heads
        blocks = [w.T.reshape(-1, h, d_h) for w in weights]  # (d_in, h, d_h) each
        weight = torch.stack(blocks, dim=2).reshape(mha.d_in, -1)
    else:
        weight = torch.cat([w.T if transpose else w for w in weights], dim=1)  # (d_in, 3d)
    state = {"c_attn.weight": weight.detach().clone(),
             "c_proj.weight": (mha.out_proj.weight.T if transpose and out_transpose
                               else mha.out_proj.weight).detach().clone()}
    if biases:
        if per_head:
            h, d_h = mha.num_heads, mha.d_out // mha.num_heads
            bias = torch.stack([layers[r].bias.reshape(h, d_h) for r in order], dim=1).reshape(-1)
        else:
            bias = torch.cat([layers[role].bias for role in order])
        state["c_attn.bias"] = bias.detach().clone()
        state["c_proj.bias"] = mha.out_proj.bias.detach().clone()
    return state


def gpt2_state_dict(mha):
    return _state(mha)


def _by_stack(mha):  # also correct: stack as one nn.Linear would, then transpose once
    from mha_course import stack_qkv

    weight = stack_qkv(mha.W_query.weight, mha.W_key.weight, mha.W_value.weight)  # (3d, d_in)
    bias = stack_qkv(mha.W_query.bias, mha.W_key.bias, mha.W_value.bias)
    with torch.no_grad():
        return {"c_attn.weight": weight.T.contiguous(), "c_attn.bias": bias.clone(),
                "c_proj.weight": mha.out_proj.weight.t().clone(), "c_proj.bias": mha.out_proj.bias.clone()}


def _views(mha):  # also correct: views of mha's own tensors, which the load copies
    return {"c_attn.weight": torch.cat([mha.W_query.weight, mha.W_key.weight, mha.W_value.weight]).T,
            "c_attn.bias": torch.cat([mha.W_query.bias, mha.W_key.bias, mha.W_value.bias]),
            "c_proj.weight": mha.out_proj.weight.T, "c_proj.bias": mha.out_proj.bias}


def _with(**how):
    return lambda mha: _state(mha, **how)


def _no_return(mha):
    _state(mha)


def _course_names(mha):  # the course's own state dict, under its own names
    return {name: value.detach().clone() for name, value in mha.state_dict().items() if name != "mask"}


def _changes_mha(mha):  # transposes mha's weights in place on the way
    with torch.no_grad():
        for linear in (mha.W_query, mha.W_key, mha.W_value, mha.out_proj):
            linear.weight.data = linear.weight.data.t().contiguous()
    return {"c_attn.weight": torch.cat([mha.W_query.weight, mha.W_key.weight, mha.W_value.weight], dim=1),
            "c_attn.bias": torch.cat([mha.W_query.bias, mha.W_key.bias, mha.W_value.bias]),
            "c_proj.weight": mha.out_proj.weight, "c_proj.bias": mha.out_proj.bias}


def _c_attn_as_linear_stores_it(mha):  # c_proj transposed, but c_attn joins nn.Linear's weights as they are
    state = _state(mha)
    with torch.no_grad():
        state["c_attn.weight"] = torch.cat([mha.W_query.weight, mha.W_key.weight, mha.W_value.weight], dim=1)
    return state


def _read_off_the_package(mha):
    """Learns where each number goes by converting a GPT-2 layer whose weights are their own indices."""
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    d = mha.d_out
    layer = GPT2Attention(GPT2Config(n_embd=d, n_head=mha.num_heads), layer_idx=0)
    with torch.no_grad():
        layer.c_attn.weight.copy_(torch.arange(3 * d * d, dtype=torch.float32).view(d, 3 * d))
    where = mha_course.from_gpt2_attention(layer)
    order = torch.cat([where.W_query.weight, where.W_key.weight, where.W_value.weight]).flatten().long()
    ours = torch.cat([mha.W_query.weight, mha.W_key.weight, mha.W_value.weight]).flatten()
    weight = torch.empty(3 * d * d)
    weight[order] = ours.detach()
    state = _state(mha)
    state["c_attn.weight"] = weight.view(d, 3 * d)
    return state


CORRECT = {"8.1": gpt2_state_dict}

#: More correct answers, written differently.
ALSO_CORRECT = {"8.1": [_by_stack, _views]}

WRONG = {
    ("8.1", "no-return"): _no_return,
    ("8.1", "course-names"): _course_names,
    ("8.1", "bias-left-out"): _with(biases=False),
    ("8.1", "mha-changed"): _changes_mha,
    ("8.1", "shapes-do-not-fit"): _with(rows=True),
    ("8.1", "not-transposed"): _with(transpose=False),
    ("8.1", "c-proj-not-transposed"): _with(out_transpose=False),
    ("8.1", "qkv-order"): _with(order=("k", "q", "v")),
    ("8.1", "split-per-head"): _with(per_head=True),
    ("8.1", "c-attn-layout"): _c_attn_as_linear_stores_it,
}

#: Answers that are, or call, the package's own answer (or the checks' own): refused, naming what
#: they use. Name -> (exercise, answer, what the message names).
BY_THE_PACKAGE = {
    "8.1 reads the mapping off from_gpt2_attention": ("8.1", _read_off_the_package,
                                                      "mha_course's own from_gpt2_attention"),
}
