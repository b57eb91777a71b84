"""The exercise of chapter 8, reading production attention: GPT-2's weights in the course's module.

8.1 asks for ``copy_gpt2_weights(attention, mha)``: copy a transformers ``GPT2Attention``'s
weights into a :class:`MultiHeadAttention` of the same size so that both compute the same function.
The reference is GPT-2's own output, given the causal mask; the package's
:func:`~mha_course.from_gpt2_attention` does the same mapping and is no answer.

transformers is imported when a check runs, not when the checks are imported: ``check("1.1", ...)``
never waits for it.
"""

from __future__ import annotations

import copy

import torch

from ..attention.masking import causal_mask
from ..attention.multihead import MultiHeadAttention
from ..convert.transformers import from_gpt2_attention
from .framework import Check, Exercise, Mistake
from .probes import batch, draw, generator, state_of
from .records import (Failed, Recorder, describe, expect_close, format_pair, plain, raised, same, seed_of,
                      value_of)
from .shortcuts import package

TOKEN_LABELS = ("sequence", "token")
ROLES = ("W_query", "W_key", "W_value")


def mapping_cases(seed: int) -> dict[str, tuple[int, int, int]]:
    """``case -> (num_heads, head_dim, num_tokens)``: a small layer and another size."""
    small = draw(seed, "8.1 small", {"num_heads": (2, 3), "head_dim": (4, 5), "num_tokens": (6, 7)})
    other = draw(seed, "8.1 other", {"num_heads": (4, 6), "head_dim": (2, 3), "num_tokens": (8, 9)})
    return {name: (c["num_heads"], c["head_dim"], c["num_tokens"]) for name, c in (("small", small), ("other", other))}


def _describe(seed: int, case: str) -> str:
    heads, head_dim, _ = mapping_cases(seed)[case]
    return f"GPT2Attention(GPT2Config(n_embd={heads * head_dim}, n_head={heads}))"


def gpt2_layer(seed: int, case: str):
    """The case's GPT-2 attention layer in eval mode, every parameter (biases too) drawn from the seed."""
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    heads, head_dim, num_tokens = mapping_cases(seed)[case]
    width = heads * head_dim
    config = GPT2Config(n_embd=width, n_head=heads, n_positions=num_tokens, attn_pdrop=0.0, resid_pdrop=0.0,
                        attn_implementation="eager")
    with torch.random.fork_rng(devices=[]):
        attention = GPT2Attention(config, layer_idx=0)
    g = generator(seed, f"8.1 {case} weights")
    with torch.no_grad():
        for p in attention.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * width**-0.5)
    return attention.eval()


def course_module(seed: int, case: str) -> MultiHeadAttention:
    """The (differently initialised) course module the answer fills, the same every time."""
    heads, head_dim, num_tokens = mapping_cases(seed)[case]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MultiHeadAttention(heads * head_dim, heads * head_dim, num_tokens, 0.0, heads, qkv_bias=True).eval()


def gpt2_output(attention, x: torch.Tensor) -> torch.Tensor:
    """GPT-2's output given the causal mask in transformers' additive form."""
    t = x.shape[1]
    mask = torch.zeros(t, t, dtype=x.dtype).masked_fill(causal_mask(t), float("-inf"))  # (T, T)
    with torch.no_grad():
        return attention(x, attention_mask=mask[None, None])[0]


def _input(seed: int, case: str):
    heads, head_dim, num_tokens = mapping_cases(seed)[case]
    return batch(seed, f"8.1 {case}", 2, num_tokens, heads * head_dim)


def _shared(mha, attention) -> list[str]:
    theirs = {p.untyped_storage().data_ptr() for p in attention.parameters()}
    return [name for name, p in mha.named_parameters() if p.untyped_storage().data_ptr() in theirs]


def _kinds(mha) -> dict[str, str]:
    kinds = {name: "trainable" if p.requires_grad else "frozen" for name, p in mha.named_parameters()}
    for role in (*ROLES, "out_proj"):
        for attribute in ("weight", "bias"):
            value, name = getattr(getattr(mha, role, None), attribute, None), f"{role}.{attribute}"
            if isinstance(value, torch.Tensor) and name not in kinds:
                kinds[name] = "plain tensor"
    return kinds


def _probe_mapping(copy_weights, rec: Recorder) -> None:
    for case in mapping_cases(rec.seed):
        attention, mha = gpt2_layer(rec.seed, case), course_module(rec.seed, case)
        returned = rec.call(f"{case}_call", copy_weights, attention, mha)
        rec.note(f"{case}_returned_mha", returned is mha)
        # the module the check runs must be the course's class with its own forward
        rec.note(f"{case}_module", {"class": type(mha).__name__, "course_class": type(mha) is MultiHeadAttention,
                                    "own_forward": "forward" not in vars(mha)})
        rec.note(f"{case}_gpt2_state", state_of(attention))
        rec.note(f"{case}_mha_state", state_of(mha))
        rec.note(f"{case}_shared", _shared(mha, attention))
        rec.note(f"{case}_parameters", _kinds(mha))
        with torch.no_grad():
            rec.call(f"{case}_out", mha, _input(rec.seed, case)[0])


def _runs(case: str):
    def run(record):
        value_of(record, f"{case}_call", f"copy_gpt2_weights(attention, mha) for attention = "
                 f"{_describe(seed_of(record), case)}")
    return run


def _returns_mha(record):
    _runs("small")(record)
    if not plain(record["small_returned_mha"]):
        raise Failed("mha, the module given, returned", describe(record["small_call"]),
                     "End the function with return mha.")


def _own_forward(record):
    module = plain(record["small_module"])
    if not module["course_class"]:
        raise Failed("mha still a MultiHeadAttention", f"a {module['class']}",
                     "Copy the weights into mha's parameters; leave its class alone.")
    if not module["own_forward"]:
        raise Failed("mha's own forward", "a forward set on the instance",
                     "Copy the weights into mha's parameters; leave its forward alone.")


def _forward_replaced(record) -> bool:
    module = plain(record["small_module"])
    return not (module["course_class"] and module["own_forward"])


def _holds_weights(record):
    """The exercise's point: every parameter holds GPT-2's values (the output alone can be faked)."""
    seed = seed_of(record)
    got = plain(record["small_mha_state"])
    expected = mapping_variant(gpt2_layer(seed, "small"), course_module(seed, "small"))
    for name, value in expected.items():
        if name in got and not same(got[name], value):
            shown, seen = format_pair(value, got[name])
            raise Failed(f"mha.{name} to hold GPT-2's values", f"{seen}, not {shown} (for attention = "
                         f"{_describe(seed, 'small')})")


def _gpt2_unchanged(record):
    for name, value in state_of(gpt2_layer(seed_of(record), "small")).items():
        if not same(plain(record["small_gpt2_state"]).get(name), value):
            raise Failed("GPT-2's weights untouched", f"a changed {name}",
                         "Copy from attention into mha, never the other way round.")


def _same_output(case: str):
    def run(record):
        _runs(case)(record)
        seed = seed_of(record)
        x, label = _input(seed, case)
        got = value_of(record, f"{case}_out", "mha(x) after the copy")
        if got.get("kind") != "tensor":
            raise Failed("a tensor from mha(x)", "something else")
        expect_close(plain(got), gpt2_output(gpt2_layer(seed, case), x), labels=TOKEN_LABELS,
                     where=f"(GPT-2's output given the causal mask) for attention = {_describe(seed, case)} on {label}")
    return run


def _copies(record):
    shared = plain(record["small_shared"])
    if shared:
        raise Failed("mha's own copies of the weights", f"{shared[0]} sharing GPT-2's memory",
                     "Changing one module would change the other: copy the values with .copy_().")


def _keeps_parameters(record):
    expected = [name for name, _ in course_module(seed_of(record), "small").named_parameters()]
    kinds = plain(record["small_parameters"])
    for name in expected:
        kind = kinds.get(name, "missing")
        if kind != "trainable":
            raise Failed(f"mha's {len(expected)} parameters, all still trainable nn.Parameters",
                         f"{name} {'is a ' + kind if kind == 'plain tensor' else kind}",
                         "Copy values into the existing parameters with .copy_() under torch.no_grad().")


def mapping_variant(attention, mha: MultiHeadAttention, *, transpose: bool = True, out_transpose: bool = True,
                    order: tuple[int, int, int] = (0, 1, 2), qkv_bias: bool = True, out_bias: bool = True,
                    out_proj: bool = True, per_head: bool = False) -> dict[str, torch.Tensor]:
    """The state of ``mha`` after the mapping written with a chosen mistake (on a copy of ``mha``);
    the defaults give the right mapping. ``order`` says which third of ``c_attn`` each of query,
    key and value takes; ``per_head`` reads ``c_attn`` as if each head kept its query, key and
    value side by side."""
    mha = copy.deepcopy(mha)
    d, h = mha.d_out, mha.num_heads
    weight, bias = attention.c_attn.weight.detach(), attention.c_attn.bias.detach()  # (d, 3d), (3d,)
    if per_head:
        index = torch.arange(3 * d).view(h, 3, d // h).transpose(0, 1).reshape(3, d)  # (role, d)
    else:
        index = torch.arange(3 * d).view(3, d)  # (role, d): thirds
    with torch.no_grad():
        for linear, third in zip((getattr(mha, role) for role in ROLES), order):
            columns = weight[:, index[third]]  # (d, d)
            linear.weight.copy_(columns.T if transpose else columns)
            if qkv_bias:
                linear.bias.copy_(bias[index[third]])
        if out_proj:
            c_proj = attention.c_proj.weight.detach()
            mha.out_proj.weight.copy_(c_proj.T if transpose and out_transpose else c_proj)
            if out_bias:
                mha.out_proj.bias.copy_(attention.c_proj.bias.detach())
    return state_of(mha)


def _like(**how):
    def detect(record):
        seed = seed_of(record)
        got = plain(record["small_mha_state"])
        expected = mapping_variant(gpt2_layer(seed, "small"), course_module(seed, "small"), **how)
        return all(same(got.get(name), value) for name, value in expected.items())
    return detect


def _any_order(record) -> bool:
    orders = [(0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)]
    return any(_like(order=order)(record) for order in orders)


def _not_in_place(record) -> bool:
    seed = seed_of(record)
    got = plain(record["small_mha_state"])
    return all(same(got.get(name), value) for name, value in state_of(course_module(seed, "small")).items())


def _replaced(kind: str):
    return lambda record: kind in plain(record["small_parameters"]).values()


_KEEPS = "mha keeps its parameters, trainable"
_OWN_FORWARD = "mha computes with its own class and forward"
_COPIES = "mha's weights are copies, not GPT-2's own"

MAPPING = Exercise(
    id="8.1",
    title="GPT-2's attention weights in the course's module",
    answer_name="copy_gpt2_weights",
    signature="copy_gpt2_weights(attention, mha)",
    probe=_probe_mapping,
    checks=(
        Check("runs on a GPT-2 attention layer", _runs("small")),
        Check("returns mha", _returns_mha),
        Check("leaves GPT-2's weights unchanged", _gpt2_unchanged),
        Check(_OWN_FORWARD, _own_forward),
        Check("mha gives GPT-2's output, given the causal mask", _same_output("small")),
        Check("another size, more heads", _same_output("other")),
        Check(_COPIES, _copies),
        Check(_KEEPS, _keeps_parameters),
        Check("mha's parameters hold GPT-2's weights", _holds_weights),
    ),
    mistakes=(
        Mistake("needs-no-grad",
                "Copying into a parameter in place is an operation autograd refuses to record. Wrap the "
                "copies in `with torch.no_grad():`.",
                lambda record: raised(record, "small_call", "leaf Variable", "requires grad")),
        Mistake("shapes-do-not-fit",
                "The shapes do not fit. c_attn is a Conv1D: its weight is (d_in, 3 * d_out), one column "
                "per output, so query, key and value are its three blocks of COLUMNS, each (d_in, d_out). "
                "nn.Linear stores (d_out, d_in): transpose each block.",
                lambda record: raised(record, "small_call", "must match", "size mismatch", "shape")),
        Mistake("no-return",
                "Your function returns nothing: end it with return mha, so that a caller can write "
                "mha = copy_gpt2_weights(attention, mha).",
                lambda record: plain(record["small_call"]) is None, ("returns mha",)),
        Mistake("forward-replaced",
                "mha gives GPT-2's output only because its forward (or its class) now calls GPT-2: the "
                "exercise asks for GPT-2's weights in mha's own parameters, which its own forward uses.",
                _forward_replaced, (_OWN_FORWARD,)),
        Mistake("not-in-place",
                "mha is unchanged after your function ran. Copy the weights into the module you are "
                "given (with .copy_() under torch.no_grad()): the check runs that module.",
                _not_in_place),
        Mistake("not-transposed",
                "The blocks are right but not transposed. Conv1D computes x @ weight + bias with weight "
                "(d_in, d_out); nn.Linear computes x @ weight.T + bias with weight (d_out, d_in). Copy "
                "each block's .T, and c_proj.weight.T into out_proj.",
                _like(transpose=False)),
        Mistake("c-proj-not-transposed",
                "Query, key and value are right, but c_proj is a Conv1D too: copy c_proj.weight.T into "
                "out_proj.weight.",
                _like(out_transpose=False)),
        Mistake("qkv-order",
                "Query, key and value are swapped: GPT-2 splits c_attn's output into query, key, value, "
                "in that order (columns 0 to d_out - 1 are the queries).",
                _any_order),
        Mistake("split-per-head",
                "You read c_attn as if each head kept its query, key and value side by side (as some "
                "other models do). GPT-2 keeps all queries first, then all keys, then all values: cut "
                "the columns into three equal blocks.",
                _like(per_head=True)),
        Mistake("qkv-biases-dropped",
                "The weights are right but the query, key and value biases were not copied: "
                "c_attn.bias holds them, in the same three blocks as the weight's columns.",
                _like(qkv_bias=False)),
        Mistake("out-bias-dropped",
                "Everything is right but the output bias: copy c_proj.bias into out_proj.bias.",
                _like(out_bias=False)),
        Mistake("out-proj-left",
                "Query, key and value are right, but out_proj still holds its random weights: copy "
                "c_proj (weight transposed, and bias) into it.",
                _like(out_proj=False)),
        Mistake("shared",
                "mha computes GPT-2's output, but its parameters are views of GPT-2's tensors "
                "(nn.Parameter(t) keeps t's memory): training one module would change the other. Copy "
                "the values into mha's own parameters with .copy_() under torch.no_grad().",
                lambda record: bool(plain(record["small_shared"])), (_COPIES,)),
        Mistake("plain-tensors",
                "You replaced mha's weights by plain tensors: .parameters() misses them, so no optimiser "
                "would train them. Copy the values into the existing parameters with .copy_().",
                _replaced("plain tensor"), (_KEEPS,)),
        Mistake("frozen",
                "Your copies froze mha's parameters (requires_grad=False). Copy with .copy_() under "
                "torch.no_grad(): the parameters stay trainable.",
                _replaced("frozen"), (_KEEPS,)),
    ),
    shortcuts=package(from_gpt2_attention, why="This is the package's own conversion: write the mapping yourself."),
)

EXERCISES = (MAPPING,)

__all__ = ["EXERCISES", "mapping_cases", "gpt2_layer", "course_module", "gpt2_output", "mapping_variant"]
