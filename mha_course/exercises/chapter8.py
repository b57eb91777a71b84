"""The exercise of chapter 8, reading production attention: the course's module written as GPT-2's weights.

8.1 asks for ``gpt2_state_dict(mha)``: the state dict that a transformers ``GPT2Attention`` of the
same size loads (``load_state_dict``, strict) to compute what a :class:`MultiHeadAttention` ``mha``
computes. The chapter reads the mapping one way, GPT-2 into the course
(:func:`~mha_course.from_gpt2_attention`); the exercise asks for the other way, worked out from
GPT-2's parameter names and shapes. The reference is ``mha``'s own output: GPT-2's, after the load
and given the causal mask, must equal it, and each tensor must hold ``mha``'s numbers where GPT-2
reads them. The package's conversion is no answer, nor a way to find one.

transformers is imported when a check runs, not when the checks are imported: ``check("1.1", ...)``
never waits for it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..attention.masking import causal_mask
from ..attention.multihead import MultiHeadAttention
from ..convert.transformers import from_gpt2_attention
from .framework import Check, Exercise, Mistake
from .probes import batch, draw, generator, state_of
from .records import Failed, Recorder, describe, error_summary, expect_close, format_pair, plain, same, seed_of, \
    value_of
from .shortcuts import package

TOKEN_LABELS = ("sequence", "token")
ROLES = ("W_query", "W_key", "W_value")
#: The names of a GPT2Attention's state dict (transformers 5: no buffers in it).
NAMES = ("c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias")


def mapping_cases(seed: int) -> dict[str, tuple[int, int, int]]:
    """``case -> (num_heads, head_dim, num_tokens)``: a small layer and another size."""
    small = draw(seed, "8.1 small", {"num_heads": (2, 3), "head_dim": (4, 5), "num_tokens": (6, 7)})
    other = draw(seed, "8.1 other", {"num_heads": (4, 6), "head_dim": (2, 3), "num_tokens": (8, 9)})
    return {name: (c["num_heads"], c["head_dim"], c["num_tokens"]) for name, c in (("small", small), ("other", other))}


def _describe(seed: int, case: str) -> str:
    heads, head_dim, tokens = mapping_cases(seed)[case]
    d = heads * head_dim
    return f"mha = MultiHeadAttention({d}, {d}, {tokens}, 0.0, {heads}, qkv_bias=True)"


def course_module(seed: int, case: str) -> MultiHeadAttention:
    """The case's course module in eval mode, every parameter (biases too) drawn from the seed."""
    heads, head_dim, num_tokens = mapping_cases(seed)[case]
    width = heads * head_dim
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        mha = MultiHeadAttention(width, width, num_tokens, 0.0, heads, qkv_bias=True)
    g = generator(seed, f"8.1 {case} weights")
    with torch.no_grad():
        for p in mha.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * width**-0.5)
    return mha.eval()


def gpt2_layer(seed: int, case: str):
    """A GPT-2 attention layer of the case's size in eval mode, with weights of its own (the answer's replace them)."""
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    heads, head_dim, num_tokens = mapping_cases(seed)[case]
    config = GPT2Config(n_embd=heads * head_dim, n_head=heads, n_positions=num_tokens, attn_pdrop=0.0,
                        resid_pdrop=0.0, attn_implementation="eager")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        return GPT2Attention(config, layer_idx=0).eval()


def gpt2_output(attention, x: torch.Tensor) -> torch.Tensor:
    """GPT-2's output given the causal mask in transformers' additive form."""
    t = x.shape[1]
    mask = torch.zeros(t, t, dtype=x.dtype).masked_fill(causal_mask(t), float("-inf"))  # (T, T)
    with torch.no_grad():
        return attention(x, attention_mask=mask[None, None])[0]


def _input(seed: int, case: str):
    heads, head_dim, num_tokens = mapping_cases(seed)[case]
    return batch(seed, f"8.1 {case}", 2, num_tokens, heads * head_dim)


def _probe_state(gpt2_state_dict, rec: Recorder) -> None:
    for case in mapping_cases(rec.seed):
        mha = course_module(rec.seed, case)
        state = rec.call(f"{case}_call", gpt2_state_dict, mha)
        rec.note(f"{case}_mha_state", state_of(mha))
        if not isinstance(state, Mapping):
            continue
        # The probe's own steps, outside rec.call: they are not the learner's code.
        layer = gpt2_layer(rec.seed, case)
        try:
            layer.load_state_dict(dict(state))  # strict: every name, every shape
        except Exception as error:  # what torch says of names or shapes that do not fit, on one line
            summary = error_summary(error)
            message = " ".join(str(error).split()).removeprefix("Error(s) in loading state_dict for GPT2Attention:")
            rec.record[f"{case}_load"] = {**summary, "message": message.strip()[:300]}
            continue
        rec.note(f"{case}_load", "loaded")
        rec.note(f"{case}_out", gpt2_output(layer, _input(rec.seed, case)[0]))


def _state(record, case: str = "small") -> dict:
    got = value_of(record, f"{case}_call", f"gpt2_state_dict(mha) for {_describe(seed_of(record), case)}")
    answer = plain(got)
    if not isinstance(answer, dict):
        raise Failed(f"a dict of GPT-2's parameter names ({', '.join(NAMES)}) and tensors", describe(got),
                     "Return a dict: {'c_attn.weight': ..., 'c_attn.bias': ..., 'c_proj.weight': ..., "
                     "'c_proj.bias': ...}.")
    return answer


def _names(record):
    names = set(_state(record))
    missing, extra = [n for n in NAMES if n not in names], sorted(names - set(NAMES))
    if missing or extra:
        got = " and ".join(part for part in (f"without {', '.join(missing)}" if missing else "",
                                             f"with {', '.join(extra)}" if extra else "") if part)
        got = f"a dict {got}"
        raise Failed(f"exactly GPT-2's names, {', '.join(NAMES)}", got)
    for name, value in _state(record).items():
        if not isinstance(value, torch.Tensor):
            raise Failed(f"a tensor under {name!r}", describe(_state_summary(record)[name]))


def _state_summary(record) -> dict:
    return record["small_call"]["value"]


def _mha_unchanged(record):
    got = plain(record["small_mha_state"])
    for name, value in state_of(course_module(seed_of(record), "small")).items():
        if not same(got.get(name), value):
            raise Failed("mha left as it was", f"a changed mha.{name}",
                         "Read mha's weights and build new tensors (.T, torch.cat make new ones); leave mha alone.")


def _loads(case: str):
    def run(record):
        _state(record, case)
        loaded = record.get(f"{case}_load")
        if isinstance(loaded, dict) and loaded.get("kind") == "error":
            heads, head_dim, _ = mapping_cases(seed_of(record))[case]
            raise Failed(f"a state dict that GPT2Attention(GPT2Config(n_embd={heads * head_dim}, n_head={heads}))"
                         ".load_state_dict accepts", describe(loaded))
    return run


def _same_output(case: str):
    def run(record):
        _loads(case)(record)
        seed = seed_of(record)
        x, label = _input(seed, case)
        got = value_of(record, f"{case}_out", "GPT-2's output after the load")
        with torch.no_grad():
            expected = course_module(seed, case)(x)
        expect_close(plain(got), expected, labels=TOKEN_LABELS,
                     where=f"(mha's own output) for {_describe(seed, case)} on {label}")
    return run


def _holds_values(record):
    """Every tensor holds mha's numbers where GPT-2 reads them (a consistent permutation of heads
    would give the same output from other tensors)."""
    seed = seed_of(record)
    got = _state(record)
    for name, value in state_variant(course_module(seed, "small")).items():
        if not same(got[name], value):
            shown, seen = format_pair(value, got[name])
            raise Failed(f"{name} to hold {shown}", f"{seen} (for {_describe(seed, 'small')})")


def state_variant(mha: MultiHeadAttention, *, transpose: bool = True, out_transpose: bool = True,
                  order: tuple[int, int, int] = (0, 1, 2), per_head: bool = False) -> dict[str, torch.Tensor]:
    """GPT-2's state dict for ``mha``, written with a chosen mistake; the defaults give the right one.

    ``order`` says which of query, key and value fills each third of ``c_attn``'s columns;
    ``per_head`` writes each head's query, key and value side by side instead of in thirds.
    """
    d, h = mha.d_out, mha.num_heads
    weights = [getattr(mha, ROLES[i]).weight.detach() for i in order]  # (d, d_in) each, nn.Linear's
    biases = [getattr(mha, ROLES[i]).bias.detach() for i in order]  # (d,) each
    columns = [w.T if transpose else w for w in weights]  # (d_in, d) each, Conv1D's
    if per_head:  # (d_in, h, 3, d_h): head by head
        weight = torch.stack([c.reshape(-1, h, d // h) for c in columns], dim=2).reshape(-1, 3 * d)
        bias = torch.stack([b.reshape(h, d // h) for b in biases], dim=1).reshape(3 * d)
    else:
        weight, bias = torch.cat(columns, dim=1), torch.cat(biases)  # (d_in, 3d), (3d,)
    out = mha.out_proj.weight.detach()
    return {"c_attn.weight": weight, "c_attn.bias": bias,
            "c_proj.weight": out.T if transpose and out_transpose else out,
            "c_proj.bias": mha.out_proj.bias.detach()}


def _like(**how):
    def detect(record):
        got = plain(record.get("small_call"))
        if not isinstance(got, dict):
            return False
        expected = state_variant(course_module(seed_of(record), "small"), **how)
        return all(same(got.get(name), value) for name, value in expected.items())
    return detect


def _any_order(record) -> bool:
    orders = [(0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)]
    return any(_like(order=order)(record) for order in orders)


def _c_attn_misplaced(record) -> bool:
    """``c_attn.weight`` has Conv1D's shape and holds exactly mha's query, key and value numbers, but not
    where GPT-2 reads them: the same numbers, moved (a transpose left out, the roles in another order, a
    ``view`` where a transpose belongs, or several of these at once)."""
    got = plain(record.get("small_call"))
    if not isinstance(got, dict) or not isinstance(got.get("c_attn.weight"), torch.Tensor):
        return False
    weight = got["c_attn.weight"]
    expected = state_variant(course_module(seed_of(record), "small"))["c_attn.weight"]
    if weight.shape != expected.shape or weight.dtype != expected.dtype or same(weight, expected):
        return False
    return torch.equal(weight.detach().flatten().sort().values, expected.flatten().sort().values)


def _names_are(test):
    def detect(record):
        got = plain(record.get("small_call"))
        return isinstance(got, dict) and test(set(got))
    return detect


def _load_raised(*fragments: str):
    def detect(record):
        loaded = record.get("small_load")
        return (isinstance(loaded, dict) and loaded.get("kind") == "error"
                and any(f in loaded["message"] for f in fragments))
    return detect


def _mha_changed(record) -> bool:
    got = plain(record.get("small_mha_state")) or {}
    return any(not same(got.get(name), value)
               for name, value in state_of(course_module(seed_of(record), "small")).items())


_NAMES = "the state dict holds GPT-2's four names"
_LOADS = "GPT2Attention loads it (strict: every name and shape)"
_UNCHANGED = "leaves mha unchanged"

MAPPING = Exercise(
    id="8.1",
    title="the course's module as GPT-2's weights",
    answer_name="gpt2_state_dict",
    signature="gpt2_state_dict(mha)",
    probe=_probe_state,
    checks=(
        Check("runs on a MultiHeadAttention", lambda record: _state(record), gate=True),
        Check(_NAMES, _names),
        Check(_UNCHANGED, _mha_unchanged, gate=True),
        Check(_LOADS, _loads("small")),
        Check("GPT-2 then gives mha's output, given the causal mask", _same_output("small")),
        Check("another size, more heads", _same_output("other")),
        Check("each tensor holds mha's numbers where GPT-2 reads them", _holds_values),
    ),
    mistakes=(
        Mistake("no-return",
                "Your function returns nothing: end it with return and the dict you built.",
                lambda record: plain(record.get("small_call")) is None and "small_call" in record),
        Mistake("course-names",
                "Those are the course's names. A GPT2Attention's state dict has four entries, named after "
                "its two Conv1D layers: c_attn.weight, c_attn.bias, c_proj.weight and c_proj.bias "
                "(print(attention.state_dict().keys()) lists them).",
                _names_are(lambda names: any(n.startswith(("W_", "out_proj")) for n in names)), (_NAMES,)),
        Mistake("bias-left-out",
                "A bias is missing. GPT-2's c_attn has one bias of 3 * d numbers, the query, key and value "
                "biases one after the other, and c_proj has its own: mha's four biases go into those two.",
                _names_are(lambda names: {"c_attn.weight", "c_proj.weight"} <= names
                           and not {"c_attn.bias", "c_proj.bias"} <= names), (_NAMES,)),
        Mistake("mha-changed",
                "mha is changed after your function ran: an in-place operation (t_(), copy_() into mha, "
                "a write to .data) turned its weights. Read them, build new tensors, and leave mha alone.",
                _mha_changed, (_UNCHANGED,)),
        Mistake("shapes-do-not-fit",
                "The shapes do not fit. c_attn is a Conv1D: it computes x @ weight + bias with weight "
                "(d_in, 3 * d_out), one COLUMN per output. nn.Linear stores (d_out, d_in), one row per "
                "output: transpose each of mha's three weights and put them side by side along the "
                "columns (torch.cat(..., dim=1)).",
                _load_raised("size mismatch", "shape"), (_LOADS,)),
        Mistake("not-transposed",
                "The shapes fit but the weights are not transposed. mha.W_query.weight is (d_out, d_in), "
                "nn.Linear's layout; Conv1D wants (d_in, d_out): take each weight's .T before joining "
                "them, and c_proj.weight is out_proj.weight.T.",
                _like(transpose=False)),
        Mistake("c-proj-not-transposed",
                "c_attn is right, but c_proj is a Conv1D too: its weight is out_proj.weight.T.",
                _like(out_transpose=False)),
        Mistake("qkv-order",
                "Query, key and value are swapped: GPT-2 splits c_attn's output into query, key, value, "
                "in that order (its first d_out columns are the queries).",
                _any_order),
        Mistake("split-per-head",
                "You wrote each head's query, key and value side by side (as some other models store "
                "them). GPT-2 keeps all queries first, then all keys, then all values: three blocks of "
                "d_out columns.",
                _like(per_head=True)),
        Mistake("c-attn-layout",
                "c_attn.weight has the right shape and holds mha's query, key and value weights, but not where "
                "GPT-2 reads them. The likely cause: a weight not transposed for GPT-2's Conv1D, which wants "
                "(d_in, d_out) where nn.Linear stores (d_out, d_in) (with d_in = d_out both shapes fit), or "
                "the three joined in another order than query, key, value, or .view/.reshape where a "
                ".T belongs. Join the three transposed weights along the columns, queries first.",
                _c_attn_misplaced),
    ),
    shortcuts=package(from_gpt2_attention,
                      why="This is the package's conversion, the other way: work the mapping out yourself."),
)

EXERCISES = (MAPPING,)

__all__ = ["EXERCISES", "NAMES", "mapping_cases", "course_module", "gpt2_layer", "gpt2_output", "state_variant"]
