"""Exercise of chapter 5, why several heads: knock a head out of a trained model and measure what
it costs.

The models are the chapter's own, trained by the package's seeded training
(:func:`mha_course.experiments.specialisation.train`, the book's
:class:`~mha_course.experiments.specialisation.SpecialisationConfig`,
seed 0) with two heads - the model chapter 5 trains live - and with four. Their weights are stored
in ``data/trained_models.json`` next to this module, so that the check trains nothing; regenerate the
file with ``python -c "from mha_course.exercises.chapter5 import write_models; write_models()"``.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import torch

from ..experiments.specialisation import (IGNORE_INDEX, SpecialisationConfig, TinyAttentionModel, accuracy,
                                          difference_task, train)
from .framework import Check, Exercise, Mistake
from .probes import agrees, case_seed, generator
from .records import Failed, Recorder, number, number_of, number_pair, plain, raised, seed_of, value_of

#: The stored models: their weights, and how they were trained.
MODELS_PATH = Path(__file__).parent / "data" / "trained_models.json"
HEAD_COUNTS = (2, 4)
SEED = 0


def write_models(path: Path = MODELS_PATH) -> Path:
    """Train the chapter's models (two and four heads, seed 0, the book's settings) and store their weights."""
    config = SpecialisationConfig()
    models = {}
    for num_heads in HEAD_COUNTS:
        run = train(num_heads, seed=SEED, config=config)
        # Nine significant digits give every float32 back exactly.
        models[str(num_heads)] = {name: _nine_digits(value.tolist()) for name, value in run.model.state_dict().items()
                                  if not name.endswith("mask")}
    payload = {"about": "TinyAttentionModel weights trained by mha_course.experiments.specialisation.train(num_heads, seed=0) "
                        "with the book's SpecialisationConfig; read by exercise 5.1's check.",
               "seed": SEED, "config": {"vocab_size": config.vocab_size, "num_tokens": config.num_tokens,
                                        "d_model": config.d_model, "steps": config.steps},
               "models": models}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload) + "\n", encoding="utf-8")
    return path


def _nine_digits(values):
    return [_nine_digits(v) for v in values] if isinstance(values, list) else float(f"{values:.9g}")


@functools.lru_cache(maxsize=1)
def _stored() -> dict:
    return json.loads(MODELS_PATH.read_text(encoding="utf-8"))


def trained_model(num_heads: int) -> TinyAttentionModel:
    """A fresh copy of the stored model with ``num_heads`` heads, in eval mode."""
    stored = _stored()
    config = stored["config"]
    with torch.random.fork_rng(devices=[]):
        model = TinyAttentionModel(config["vocab_size"], config["num_tokens"], config["d_model"], num_heads)
    state = {name: torch.tensor(value) for name, value in stored["models"][str(num_heads)].items()}
    model.load_state_dict({**state, "attention.mask": model.attention.mask})
    return model.eval()


# ----------------------------------------------------------------------------------------------
# 5.1 Knock out a head


def ablation_cases(seed: int) -> dict[str, tuple[int, int, int]]:
    """``case -> (num_heads, head, num_tokens)``: both heads of the two-head model, every head of the
    four-head model, one on shorter sequences."""
    cases = {f"2 heads, head {h}": (2, h, 8) for h in range(2)}
    cases.update({f"4 heads, head {h}": (4, h, 8) for h in range(4)})
    short = int(torch.randint(0, 4, (1,), generator=generator(seed, "5.1")))
    cases["4 heads, shorter sequences"] = (4, short, 6)
    return cases


def ablation_data(seed: int, case: str) -> tuple[torch.Tensor, torch.Tensor, str]:
    """The held-out sequences of a case: ``(tokens, labels, the call that draws them)``."""
    _, _, num_tokens = ablation_cases(seed)[case]
    s = case_seed(seed, case)
    tokens, labels = difference_task(200, num_tokens, 8, seed=s)
    return tokens, labels, f"difference_task(200, {num_tokens}, 8, seed={s})"


def _probe_ablation(accuracy_drop, rec: Recorder) -> None:
    for case, (num_heads, head, _) in ablation_cases(rec.seed).items():
        model = trained_model(num_heads)
        before = {name: value.clone() for name, value in model.state_dict().items()}
        tokens, labels, _ = ablation_data(rec.seed, case)
        with torch.no_grad():
            outputs = model(tokens)
        rec.call(case, accuracy_drop, model, head, tokens, labels)
        after = model.state_dict()
        weights = all(torch.equal(after[name], value) for name, value in before.items())
        mode = not any(module.training for module in model.modules())
        with torch.no_grad():  # a hook left registered changes what the model computes, not its weights
            same_outputs = mode and torch.equal(model(tokens), outputs)
        rec.note(f"{case} unchanged", weights and mode and same_outputs)
        rec.note(f"{case} weights unchanged", weights)
        rec.note(f"{case} weights and mode unchanged", weights and mode)


def ablated(model: TinyAttentionModel, head: int, how: str = "columns") -> TinyAttentionModel:
    """A copy of ``model`` with head ``head`` knocked out, the right way (``"columns"``: its columns
    of the output projection, the only place its context vectors enter) or a mistaken one."""
    copied = copy.deepcopy(model)
    attention = copied.attention
    d_h, h = attention.head_dim, attention.num_heads
    own = slice(head * d_h, (head + 1) * d_h)  # head's columns of the merged context
    with torch.no_grad():
        if how == "columns":
            attention.out_proj.weight[:, own] = 0
        elif how == "rows":
            attention.out_proj.weight[own, :] = 0
        elif how == "from-one":  # heads counted from 1: head 0 owns no columns, head 1 gets head 0's
            attention.out_proj.weight[:, (head - 1) * d_h:head * d_h] = 0
        elif how == "next":  # the head after the one asked for (head + 1)
            attention.out_proj.weight[:, (head + 1) * d_h:(head + 2) * d_h] = 0
        elif how == "next-around":  # the same, the last head followed by the first
            nxt = (head + 1) % h
            attention.out_proj.weight[:, nxt * d_h:(nxt + 1) * d_h] = 0
        elif how == "not-scaled":  # the slice starts at head, not head * head_dim
            attention.out_proj.weight[:, head:head + d_h] = 0
        elif how == "interleaved":
            attention.out_proj.weight[:, head::h] = 0
        elif how == "queries":
            attention.W_query.weight[own, :] = 0
        elif how == "value-columns":  # nn.Linear keeps (out, in): a column is one input feature
            attention.W_value.weight[:, own] = 0
        elif how == "others":
            for other in range(h):
                if other != head:
                    attention.out_proj.weight[:, other * d_h:(other + 1) * d_h] = 0
        elif how == "with-bias":
            attention.out_proj.weight[:, own] = 0
            attention.out_proj.bias.zero_()
        else:
            raise ValueError(how)
    return copied


@torch.no_grad()
def _accuracy(model, tokens, labels, position_zero: bool = False) -> float:
    if not position_zero:
        return accuracy(model, tokens, labels)
    return float((model(tokens).argmax(dim=-1) == labels).float().mean())  # position 0 counted, never right


def drop_variant(record, case: str, how: str = "columns", result: str = "drop", position_zero: bool = False) -> float:
    """The number a correct answer (the defaults) or a mistaken one gives for ``case``."""
    num_heads, head, _ = ablation_cases(seed_of(record))[case]
    tokens, labels, _ = ablation_data(seed_of(record), case)
    model = trained_model(num_heads)
    full = _accuracy(model, tokens, labels, position_zero)
    without = _accuracy(ablated(model, head, how), tokens, labels, position_zero)
    return {"drop": full - without, "negative": without - full, "accuracy": without}[result]


def _call(record, case: str) -> str:
    num_heads, head, _ = ablation_cases(seed_of(record))[case]
    _, _, data = ablation_data(seed_of(record), case)
    return f"accuracy_drop(model with {num_heads} heads, head={head}, *{data})"


def _drop(cases):
    def run(record):
        for case in cases(record):
            got = number_of(record, case, _call(record, case), "a number (the accuracy lost)")
            expected = drop_variant(record, case)
            if not agrees(got, expected):
                shown, seen = number_pair(expected, record[case], 4)
                raise Failed(f"{shown} for {_call(record, case)}", seen)
    return run


def _unchanged(record):
    for case in ablation_cases(seed_of(record)):
        value_of(record, case, _call(record, case))
        if not plain(record[f"{case} unchanged"]):
            weights = plain(record.get(f"{case} weights unchanged"))
            changed = ("the same weights and mode but other outputs" if plain(record.get(f"{case} weights and mode unchanged"))
                       else "the same weights but training mode" if weights else "changed weights")
            raise Failed("the model passed in left as it was (weights, eval mode and outputs)",
                         f"{changed} after {_call(record, case)}",
                         "Knock the head out of a copy (copy.deepcopy(model)) and leave the model you were given alone.")


def _like(**how):
    def detect(record):
        return all(agrees(number(record[case]), drop_variant(record, case, **how))
                   for case in ablation_cases(seed_of(record)))
    return detect


def _cases_of(num_heads: int, *, short: bool = False):
    def cases(record):
        return [c for c, (h, _, t) in ablation_cases(seed_of(record)).items() if h == num_heads and (t < 8) == short]
    return cases


def _returns_number(record):
    case = next(iter(ablation_cases(seed_of(record))))
    number_of(record, case, _call(record, case), "a number (the accuracy lost)")


_UNCHANGED = "leaves the model unchanged"

ABLATION = Exercise(
    id="5.1",
    title="knock out a head, measure the accuracy lost",
    answer_name="accuracy_drop",
    signature="accuracy_drop(model, head, tokens, labels)",
    probe=_probe_ablation,
    checks=(
        Check("returns a number", _returns_number, gate=True),
        Check(_UNCHANGED, _unchanged, gate=True),
        Check("either head of the chapter's two-head model", _drop(_cases_of(2))),
        Check("every head of a four-head model", _drop(_cases_of(4))),
        Check("shorter sequences", _drop(_cases_of(4, short=True))),
    ),
    mistakes=(
        Mistake("no-grad-missing",
                "PyTorch refuses to change a parameter in place while it records gradients. Zero the "
                "weights inside a with torch.no_grad(): block (or through weight.data).",
                lambda record: any(raised(record, c, "leaf Variable that requires grad")
                                   for c in ablation_cases(seed_of(record)))),
        Mistake("mode-changed",
                "Your function left the weights alone but switched the model it was given to training "
                "mode (model.train(), or a helper that calls it), so whatever uses the model next runs it "
                "in that mode. Leave the mode as it was: knock the head out of a copy and score the copy, "
                "or call model.eval() again before returning.",
                lambda record: any(plain(record.get(f"{c} weights unchanged"))
                                   and not plain(record.get(f"{c} weights and mode unchanged"))
                                   for c in ablation_cases(seed_of(record))),
                (_UNCHANGED,)),
        Mistake("hook-left",
                "Your function left the model's weights and mode as they were, but the model computes something "
                "else afterwards: a hook you registered is still on it (or a method was replaced). Remove it "
                "when you are done (handle = module.register_forward_hook(...); ...; handle.remove()), or "
                "knock the head out of a copy.",
                lambda record: any(plain(record.get(f"{c} weights and mode unchanged")) and not plain(record[f"{c} unchanged"])
                                   for c in ablation_cases(seed_of(record))),
                (_UNCHANGED,)),
        Mistake("in-place",
                "Your function changed the model it was given, so every later measurement runs on a "
                "damaged model. Work on a copy: ablated = copy.deepcopy(model).",
                lambda record: not all(plain(record.get(f"{c} weights unchanged", record[f"{c} unchanged"]))
                                       for c in ablation_cases(seed_of(record))),
                (_UNCHANGED,)),
        Mistake("output-rows",
                "You zeroed ROWS of out_proj.weight: those are output features, which mix every head. "
                "The head reaches the output through the COLUMNS head*head_dim to (head+1)*head_dim "
                "(out_proj computes merged @ weight.T): zero out_proj.weight[:, head*head_dim:(head+1)*head_dim].",
                _like(how="rows")),
        Mistake("value-columns",
                "You zeroed COLUMNS of W_value.weight. nn.Linear keeps its weight as (out_features, "
                "in_features), so a column is one feature of the input, which every head's values read. "
                "The head's values come from the ROWS head*head_dim to (head+1)*head_dim: zero "
                "W_value.weight[head*head_dim:(head+1)*head_dim], or the same columns of out_proj.weight.",
                _like(how="value-columns")),
        Mistake("from-one",
                "You counted heads from 1: head is counted from 0 here, as in code, so head 0 owns the "
                "columns 0 to head_dim - 1 and head m the columns m*head_dim to (m+1)*head_dim - 1.",
                _like(how="from-one")),
        Mistake("next-head",
                "You knocked out the head after the one asked for (head + 1): head is already counted from 0, "
                "so head m owns the columns m*head_dim to (m+1)*head_dim - 1.",
                lambda record: _like(how="next")(record) or _like(how="next-around")(record)),
        Mistake("not-scaled",
                "Your slice starts at column head, not at head*head_dim: it cuts across two heads' columns. "
                "Head m owns the columns m*head_dim to (m+1)*head_dim - 1.",
                _like(how="not-scaled")),
        Mistake("interleaved",
                "You zeroed every num_heads-th column. The head owns the neighbouring columns "
                "head*head_dim to (head+1)*head_dim of the merged context.",
                _like(how="interleaved")),
        Mistake("queries-zeroed",
                "Zeroing a head's queries (or keys) does not silence it: its scores become 0, the softmax "
                "spreads its attention evenly, and it still hands an average of the values on. Remove "
                "what it contributes instead: its columns of out_proj.weight.",
                _like(how="queries")),
        Mistake("kept-only-that-head",
                "You kept the head and silenced all the others. Knock out that one head alone.",
                _like(how="others")),
        Mistake("bias-zeroed",
                "You also zeroed out_proj's bias, which belongs to no head. Zero only the head's columns of "
                "out_proj.weight.",
                _like(how="with-bias")),
        Mistake("sign-flipped",
                "Your drop has the wrong sign: return the accuracy with every head minus the accuracy "
                "without the head, a positive number when the head mattered.",
                _like(result="negative")),
        Mistake("accuracy-not-drop",
                "You returned the accuracy without the head. The exercise asks for the drop: full "
                "accuracy minus that.",
                _like(result="accuracy")),
        Mistake("position-zero-counted",
                "You counted the first token (position 0 in the tensors), which has no label (its label "
                f"is -100, and no prediction equals it). Score only the labelled positions, labels != {IGNORE_INDEX}.",
                _like(position_zero=True)),
    ),
    shortcuts=(),  # the package has no ablation; the checks' own reference is refused
)

EXERCISES = (ABLATION,)

__all__ = ["EXERCISES", "trained_model", "write_models", "ablated", "ablation_cases", "ablation_data", "drop_variant"]
