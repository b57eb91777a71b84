"""The exercise checks: correct answers pass, every catalogued mistake gets its own message, an
answer that is or calls the package's own answer is refused, inputs change from run to run, and
``check`` never raises, prints exactly one line and leaves the caller's state alone.

The answers live in ``tests/chapterN_answers.py``, a file a chapter, each with the same four names:
``CORRECT`` (exercise id -> a correct answer), ``ALSO_CORRECT`` (id -> more correct answers, written
differently), ``WRONG`` ((id, mistake key) -> an answer that makes that mistake) and
``BY_THE_PACKAGE`` (name -> (id, an answer that is or calls the package's own answer, what the
refusal names)). They are written the way a learner would write them, independently of the
catalogue's own detectors, so a test passes only if the catalogue recognises real code. This file
finds every answers file by its name, as the registry finds the ``chapterN`` modules of
``mha_course.exercises``: a new chapter's answers need no line here.

Every check draws fresh inputs, as it does for a learner; ``MHA_COURSE_CHECK_SEED`` fixes them when
a failure needs reproducing. tests/test_checks_over_seeds.py runs the answers of some chapters over
many fixed seeds.
"""

from __future__ import annotations

import gc
import importlib
import io
import marshal
import re
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from mha_course import MultiHeadAttention, check
from mha_course.exercises import EXERCISES, run_check
from mha_course.exercises.capstone import batched_variant
from mha_course.exercises.chapter1 import head_variant, reference_head
from mha_course.exercises.chapter4 import fused_variant
from mha_course.exercises.chapter5 import ablated, trained_model
from mha_course.exercises.framework import OWN_CODE, SEED_ENV_VAR, judge, probe
from mha_course.exercises.records import (Failed, expect_close, format_pair, format_values, number_pair,
                                          summarise)
from mha_course.exercises.registry import chapter_modules
from mha_course.experiments.specialisation import accuracy, evaluation_data, head_role, head_scores, train

# ----------------------------------------------------------------------------------------------
# The answers of every chapter

#: The names every answers file defines (an empty dict where a chapter has none of a kind).
ANSWER_NAMES = ("CORRECT", "ALSO_CORRECT", "WRONG", "BY_THE_PACKAGE")


def answer_modules() -> dict:
    """Chapter -> its answers module: every ``tests/chapterN_answers.py``, found by its name."""
    found = [(int(match.group(1)), match.group(0)) for path in Path(__file__).parent.glob("chapter*_answers.py")
             if (match := re.fullmatch(r"chapter(\d+)_answers", path.stem))]
    return {chapter: importlib.import_module(name) for chapter, name in sorted(found)}


ANSWERS = answer_modules()


def _gathered(name: str) -> dict:
    """``name``'s dict of every answers file, merged in the order of the chapters."""
    merged: dict = {}
    for module in ANSWERS.values():
        if not hasattr(module, name):
            raise AttributeError(f"{module.__file__} has no {name}: every tests/chapterN_answers.py defines "
                                 f"{', '.join(ANSWER_NAMES)} (an empty dict where the chapter has none).")
        merged.update(getattr(module, name))
    return merged


CORRECT, ALSO_CORRECT, WRONG, BY_THE_PACKAGE = (_gathered(name) for name in ANSWER_NAMES)
CATALOGUE = [(exercise.id, mistake) for exercise in EXERCISES.values() for mistake in exercise.mistakes]


def test_every_chapter_has_its_answers_file_and_it_answers_that_chapter_alone():
    chapters = [int(re.fullmatch(r".*\.chapter(\d+)", name).group(1)) for name in chapter_modules()]
    missing = [f"tests/chapter{n}_answers.py" for n in chapters if n not in ANSWERS]
    assert not missing, (f"mha_course/exercises/ has chapters {chapters}; write {missing}, defining "
                         f"{', '.join(ANSWER_NAMES)} as tests/chapter6_answers.py does")
    assert sorted(ANSWERS) == chapters, f"answers files of chapters {sorted(ANSWERS)}, exercise modules of {chapters}"
    for chapter, module in ANSWERS.items():
        ids = {*module.CORRECT, *module.ALSO_CORRECT, *(e for e, _ in module.WRONG),
               *(e for e, _, _ in module.BY_THE_PACKAGE.values())}
        strays = sorted(i for i in ids if i not in EXERCISES or EXERCISES[i].chapter != chapter)
        assert not strays, (f"{Path(module.__file__).name} answers {strays}, which are not exercises of chapter "
                            f"{chapter}: move each answer to the answers file of its exercise's chapter")


def test_every_catalogue_entry_has_a_wrong_answer_here():
    assert {(eid, m.key) for eid, m in CATALOGUE} == set(WRONG)


def test_every_exercise_has_a_correct_answer_and_at_least_three_per_chapter():
    assert set(CORRECT) == set(EXERCISES)
    for chapter in (1, 2, 3):
        assert sum(e.chapter == chapter for e in EXERCISES.values()) >= 3
    for chapter in sorted({e.chapter for e in EXERCISES.values()}):  # ids run 1, 2, 3 ... in every chapter
        numbers = [int(e.id.split(".")[1]) for e in EXERCISES.values() if e.chapter == chapter]
        assert numbers == list(range(1, len(numbers) + 1))


@pytest.mark.parametrize("exercise_id", list(CORRECT))
def test_correct_answer_passes(exercise_id, capsys):
    result = check(exercise_id, CORRECT[exercise_id])
    total = len(EXERCISES[exercise_id].checks)
    assert capsys.readouterr().out == f"✓ {exercise_id} passed ({total} checks)\n"
    assert result.passed and result.checks_passed == total == result.checks_total


@pytest.mark.parametrize("exercise_id", list(ALSO_CORRECT))
def test_correct_answers_in_other_styles_pass(exercise_id):
    for answer in ALSO_CORRECT[exercise_id]:
        result = run_check(exercise_id, answer)
        assert result.passed, result.line


@pytest.mark.parametrize("exercise_id,mistake", CATALOGUE, ids=[f"{e}-{m.key}" for e, m in CATALOGUE])
def test_mistake_gets_its_message(exercise_id, mistake, capsys):
    result = check(exercise_id, WRONG[(exercise_id, mistake.key)])
    line = capsys.readouterr().out
    assert result.status == "failed"
    assert result.mistake == mistake.key, line
    assert line == result.line + "\n" and line.count("\n") == 1
    assert line.startswith(f"✗ {exercise_id}: {result.failed_check}: expected ")
    assert mistake.message in line
    assert result.failed_check != OWN_CODE


def test_the_four_false_passes_of_the_old_checks_fail():
    # Each passed both check() and the grader before: the mask ignoring its device argument, the
    # stacked heads without dropout or with it on the merged output, the transfer that leaves
    # plain tensors where mha's parameters were.
    cases = {("1.1", "device-ignored"): "mask on the requested device",
             ("2.1", "dropout-not-passed"): "dropout acts on every head's attention weights in training mode",
             ("2.1", "dropout-on-output"): "dropout acts on every head's attention weights in training mode",
             ("3.3", "plain-tensors"): "mha keeps its parameters, trainable"}
    for (exercise_id, key), failed_check in cases.items():
        result = run_check(exercise_id, WRONG[(exercise_id, key)])
        assert (result.status, result.failed_check, result.mistake) == ("failed", failed_check, key), result.line


def test_two_more_false_passes_fail_with_a_hint():
    # Each passed check() and the grader: the wrapper built with dropout 0.1 where the exercise asks for
    # none, and head indices made on the CPU, which the meta device let index_select take.
    cases = {("2.2", "dropout-kept"): "no dropout", ("6.1", "index-on-cpu"): "output on the input's device"}
    for (exercise_id, key), failed_check in cases.items():
        result = run_check(exercise_id, WRONG[(exercise_id, key)])
        assert (result.status, result.failed_check, result.mistake) == ("failed", failed_check, key), result.line


@pytest.mark.parametrize("exercise_id, key, words", [
    ("1.2", "dropout-left-in", "dropout (F.dropout, nn.Dropout) is left in"),  # was: a future-token leak alone
    ("3.5", "dropout-on-masked-scores", "multiplies their -inf by 0, which is NaN"),  # was: got [nan, ...] alone
    ("3.5", "view-without-contiguous", "call .contiguous() first"),  # was: torch's error alone
    ("4.1", "percentage", "That is a percentage"),
    ("5.1", "mode-changed", "got the same weights but training mode"),  # was: "Work on a copy" to one who did
    ("1.2", "keys-dot-T", "keys.transpose(1, 2), or keys.mT"),  # was: torch's "batch2 tensor" error alone
    ("5.1", "value-columns", "a column is one feature of the input"),  # was: expected and got alone
    ("6.2", "appended-twice", "hold the new token twice"),
    ("6.2", "cpu-tensor", "makes a tensor on the CPU"),
])
def test_messages_that_misled_now_say_what_went_wrong(exercise_id, key, words):
    result = run_check(exercise_id, WRONG[(exercise_id, key)])
    assert (result.status, result.mistake) == ("failed", key), result.line
    assert words in result.line


def test_positions_in_a_message_are_counted_from_1_as_the_book_counts():
    expected = torch.zeros(2, 4, 3)
    got = expected.clone()
    got[1, 2, 1] = 0.5
    with pytest.raises(Failed) as raised:
        expect_close(got, expected, labels=("sequence", "token"))
    assert raised.value.expected == "sequence 2, token 3 (index [1, 2]) = [0.000, 0.000, 0.000]"
    assert raised.value.got == "[0.000, 0.500, 0.000]"
    # The causality check: the first three tokens are watched while the later ones change.
    line = run_check("1.2", WRONG[("1.2", "no-mask")]).line
    assert "expected tokens 1-3 unchanged when only tokens 4 and later change, got token " in line, line
    assert re.search(r"got token [123] changed by", line), line


def test_expected_and_got_are_printed_with_digits_enough_to_differ(monkeypatch):
    # Three decimals show these two rows alike; the message shows as many as it takes to tell them apart.
    expected, got = torch.tensor([[0.3312, 0.0421]]), torch.tensor([[0.3309, 0.0421]])
    assert format_values(expected[0]) == format_values(got[0])  # what the old messages printed
    with pytest.raises(Failed) as raised:
        expect_close(got, expected)
    assert (raised.value.expected, raised.value.got) == ("row 1 (index [0]) = [0.3312, 0.0421]", "[0.3309, 0.0421]")
    assert format_pair(0.1, 0.1 + 2e-9) == ("0.100000000", "0.100000002")
    assert number_pair(0.25, summarise(torch.tensor(0.2504)), 3) == ("0.2500", "tensor(0.2504)")

    def off_a_little(x, W_query, W_key, W_value):  # a slip the tolerance catches and three decimals hide
        return CORRECT["1.2"](x, W_query, W_key, W_value) + 3e-4

    for seed in range(4):
        monkeypatch.setenv(SEED_ENV_VAR, str(seed))
        result = run_check("1.2", off_a_little)
        assert result.failed_check == "values on the running example", result.line
        shown = re.search(r"= (\[.+?\]) for", result.expected).group(1)
        assert shown != result.got, result.line


def test_numbers_are_shown_as_the_type_the_learner_returned():
    def ints(d_model, num_heads, context_length, qkv_bias=True):  # head_dim wrong, every number an int
        return {"head_dim": d_model, "parameters": 4 * d_model * (d_model + 1),
                "attention_weights_mib": num_heads * context_length**2 * 4 // 2**20}

    line = run_check("3.4", ints).line
    assert "got 768." in line and "768.0" not in line, line
    tensors = lambda d, h, t, qkv_bias=True: {k: torch.tensor(v) for k, v in ints(d, h, t, qkv_bias).items()}
    assert "got tensor(768)." in run_check("3.4", tensors).line
    floats = lambda d, h, t, qkv_bias=True: {k: float(v) for k, v in ints(d, h, t, qkv_bias).items()}
    assert "got 768.0." in run_check("3.4", floats).line


def test_records_judged_side_by_side_get_the_verdicts_they_get_alone():
    """The grader judges several notebooks' records at once (--jobs); dropout is replayed from
    torch's global random state, which the threads share."""
    from concurrent.futures import ThreadPoolExecutor

    records = [(eid, probe(EXERCISES[eid], CORRECT[eid])) for eid in ("2.1", "3.5", "4.2", "6.2", "3.3")]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda item: judge(EXERCISES[item[0]], item[1]), records * 6))
    assert [r.exercise for r in results if not r.passed] == []


def test_head_variant_defaults_are_the_package_reference():
    x = torch.randn(2, 5, 4)
    weights = [torch.randn(4, 3) for _ in range(3)]
    assert torch.allclose(head_variant(x, *weights), reference_head(x, *weights), atol=1e-6)


def test_capstone_variant_defaults_are_the_package_module():
    mha = MultiHeadAttention(5, 6, 8, dropout=0.5, num_heads=3, qkv_bias=True)
    state, x = {n: p.detach() for n, p in mha.named_parameters()}, torch.randn(2, 7, 5)
    assert torch.allclose(batched_variant(state, x, 3), mha.eval()(x), atol=1e-6)
    torch.manual_seed(3)
    expected = mha.train()(x)
    torch.manual_seed(3)
    assert torch.allclose(batched_variant(state, x, 3, dropout=0.5), expected, atol=1e-6)


def test_fused_variant_defaults_are_the_package_module():
    mha, x = MultiHeadAttention(5, 6, 8, dropout=0.0, num_heads=3).eval(), torch.randn(2, 7, 5)
    assert torch.allclose(fused_variant(mha, x), mha(x), atol=1e-6)


def test_ablation_reference_silences_exactly_one_head():
    model = trained_model(2)
    tokens, _ = evaluation_data()
    # Without head 0 the output equals the output when head 0's context vectors are zero.
    captured = {}
    handle = model.attention.out_proj.register_forward_pre_hook(
        lambda module, args: (args[0] * torch.tensor([0.0] * 8 + [1.0] * 8),))
    with torch.no_grad():
        captured["hooked"] = model(tokens[:50])
    handle.remove()
    with torch.no_grad():
        assert torch.allclose(ablated(model, 0)(tokens[:50]), captured["hooked"], atol=1e-6)


# ----------------------------------------------------------------------------------------------
# Shortcuts: an answer that is, or calls, the package's own answer is refused


@pytest.mark.parametrize("name", list(BY_THE_PACKAGE))
def test_an_answer_that_is_or_calls_the_package_answer_is_refused(name):
    exercise_id, answer, label = BY_THE_PACKAGE[name]
    result = run_check(exercise_id, answer)
    assert (result.status, result.failed_check, result.checks_passed) == ("failed", OWN_CODE, 0), result.line
    assert label in result.line
    shortcut = next(s for s in EXERCISES[exercise_id].all_shortcuts() if s.label == label.removeprefix("a subclass of "))
    if label.startswith("a subclass of "):
        assert result.line.endswith(f"This subclasses {shortcut.label}: write the class yourself.")
    else:
        assert result.line.endswith(shortcut.hint(is_answer=result.got == label))


def test_the_message_names_the_package_function_to_write_yourself():
    result = run_check("3.3", BY_THE_PACKAGE["3.3 calls transfer_weights"][1])
    assert result.line.endswith("This calls mha_course's own transfer_weights: write it yourself.")


def test_building_blocks_the_exercise_is_meant_to_use_stay_allowed():
    # The stacked heads of 2.1 use CausalAttention; the capstone may use causal_mask and its own
    # split/merge (the first of its ALSO_CORRECT); the fused forward of 4.2 must call
    # scaled_dot_product_attention; 5.1 uses the package's accuracy.
    for exercise_id, answer in (("2.1", CORRECT["2.1"]), ("3.5", ALSO_CORRECT["3.5"][0]),
                                ("4.2", CORRECT["4.2"]), ("5.1", CORRECT["5.1"])):
        assert run_check(exercise_id, answer).passed


# ----------------------------------------------------------------------------------------------
# Inputs drawn afresh for every run


def test_each_run_draws_other_inputs_and_messages_show_them(monkeypatch):
    wrong = WRONG[("2.3", "bias-ignored")]
    lines = set()
    for seed in ("11", "12"):
        monkeypatch.setenv(SEED_ENV_VAR, seed)
        result = run_check("2.3", wrong)
        # The learner's input and both results, e.g. "expected 1,743 for wrapper_parameter_count(
        # d_in=37, d_out=5, num_heads=3, qkv_bias=True), got 1,665".
        assert re.search(r"expected [\d,]+ for wrapper_parameter_count\(d_in=\d+, d_out=\d+, num_heads=\d+, "
                         r"qkv_bias=True\), got [\d,]+\.", result.line), result.line
        lines.add(result.line)
    assert len(lines) == 2


def test_a_number_copied_from_a_message_is_no_answer(monkeypatch):
    monkeypatch.setenv(SEED_ENV_VAR, "21")
    first = run_check("2.3", lambda d_in, d_out, num_heads, qkv_bias=False: 0)
    copied = int(re.search(r"expected ([\d,]+)", first.line).group(1).replace(",", ""))

    def memorised(d_in, d_out, num_heads, qkv_bias=False):
        return copied

    assert not run_check("2.3", memorised).passed  # other cases of the same run already differ
    monkeypatch.setenv(SEED_ENV_VAR, "22")
    assert not run_check("2.3", memorised).passed


def test_tensor_messages_say_how_to_rebuild_the_input(monkeypatch):
    monkeypatch.setenv(SEED_ENV_VAR, "5")
    result = run_check("3.1", WRONG[("3.1", "view-without-transpose")])
    assert re.search(r"for to_heads\(random_batch\(\d+, \d+, \d+, seed=\d+\), \d+\)", result.line), result.line


def test_the_seed_variable_fixes_the_inputs(monkeypatch):
    monkeypatch.setenv(SEED_ENV_VAR, "7")
    assert run_check("1.2", WRONG[("1.2", "no-scale")]).line == run_check("1.2", WRONG[("1.2", "no-scale")]).line
    monkeypatch.setenv(SEED_ENV_VAR, "seven")
    result = run_check("1.2", CORRECT["1.2"])
    assert result.status == "error" and SEED_ENV_VAR in result.line


# ----------------------------------------------------------------------------------------------
# The stored models of exercise 5.1


@pytest.mark.parametrize("num_heads", [2, 4])
def test_the_stored_models_are_the_packages_seeded_training(num_heads):
    # The two-head model is the one chapter 5 trains live: same seed, same settings, same weights.
    # (`write_models()` regenerates the file from the same training.)
    run = train(num_heads, seed=0)
    stored = trained_model(num_heads).state_dict()
    assert stored.keys() == run.model.state_dict().keys()
    # Trained on another processor, whose kernels round differently: after hundreds of steps the
    # weights agree to about 1e-5, where another seed or setting moves them by whole units.
    assert all(torch.allclose(stored[name], value, atol=1e-4) for name, value in run.model.state_dict().items())


def test_what_the_solution_of_5_1_says_about_the_models():
    # The solution of 5.1 in chapter 5: the two-head model loses most of its accuracy without either
    # head; two heads of the four-head model read the first token and two the previous one, yet in a
    # pair one head can go without any loss while losing the other costs most of the accuracy.
    tokens, labels = evaluation_data()
    two = [CORRECT["5.1"](trained_model(2), head, tokens, labels) for head in range(2)]
    four = [CORRECT["5.1"](trained_model(4), head, tokens, labels) for head in range(4)]
    assert accuracy(trained_model(2), tokens, labels) == accuracy(trained_model(4), tokens, labels) == 1.0
    assert min(two) > 0.5
    roles = [head_role(*pair) for pair in head_scores(trained_model(4), tokens).tolist()]
    assert sorted(roles) == ["first", "first", "previous", "previous"]
    pairs = [[drop for drop, r in zip(four, roles) if r == role] for role in ("first", "previous")]
    assert any(min(pair) < 0.01 and max(pair) > 0.5 for pair in pairs), (roles, four)


# ----------------------------------------------------------------------------------------------
# Not implemented, unknown, hostile answers


def _stub(*args, **kwargs):
    raise NotImplementedError("Replace this line with your solution.")


class _StubModule(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        raise NotImplementedError


class _HalfDone(CORRECT["2.1"]):  # the stacked heads of 2.1, their forward not written
    def forward(self, x):
        raise NotImplementedError


@pytest.mark.parametrize("exercise_id", list(CORRECT))
@pytest.mark.parametrize("answer", [None, ..., _stub], ids=["None", "Ellipsis", "stub"])
def test_not_implemented(exercise_id, answer, capsys):
    result = check(exercise_id, answer)
    assert capsys.readouterr().out == f"○ {exercise_id} not implemented yet\n"
    assert result.status == "not implemented" and not result


@pytest.mark.parametrize("exercise_id", ["2.1", "3.5"])
@pytest.mark.parametrize("answer", [_StubModule, _HalfDone])
def test_class_stubs_are_not_implemented(exercise_id, answer):
    assert run_check(exercise_id, answer).status == "not implemented"


def test_unknown_exercise_is_reported_not_raised(capsys):
    result = check("9.9", CORRECT["1.1"])
    assert result.status == "error"
    assert capsys.readouterr().out.startswith("✗ 9.9: no exercise has this id; the exercises are 1.1, 1.2")


def _exits(*args, **kwargs):
    sys.exit(3)


def _recurses(*args, **kwargs):
    return _recurses(*args, **kwargs)


class _Weird:
    def __eq__(self, other):
        raise RuntimeError("no comparing me")

    def __len__(self):
        raise RuntimeError("no measuring me")


def _prints_and_warns(*args, **kwargs):
    import warnings

    print("debugging output")
    warnings.warn("a warning", stacklevel=2)
    return _Weird()


HOSTILE = [_exits, _recurses, _prints_and_warns, lambda *a, **k: [_Weird()], lambda *a, **k: {"a": _Weird()},
           lambda *a, **k: torch.tensor(float("nan")), 42, "not a function", CORRECT["2.1"]]


@pytest.mark.parametrize("exercise_id", list(CORRECT))
@pytest.mark.parametrize("answer", HOSTILE, ids=[f"hostile{i}" for i in range(len(HOSTILE))])
def test_check_never_raises_and_prints_one_line(exercise_id, answer, capsys):
    if answer is CORRECT["2.1"] and exercise_id == "2.1":
        pytest.skip("the correct answer")
    result = check(exercise_id, answer)
    out = capsys.readouterr()
    assert result.status == "failed", result.line
    assert out.out == result.line + "\n" and out.out.count("\n") == 1
    assert out.err == ""
    assert result.line.startswith(f"✗ {exercise_id}: ")


def _stack_depth() -> int:
    frame, depth = sys._getframe(1), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


class _Cycle:
    """Garbage only the cycle collector frees; its finaliser notes how deep the stack was."""

    depths: list[int] = []

    def __init__(self):
        self.me = self

    def __del__(self):
        _Cycle.depths.append(_stack_depth())


def _recurses_leaving_garbage(*args, **kwargs):
    _Cycle()
    return _recurses_leaving_garbage(*args, **kwargs)


def test_no_finaliser_runs_at_the_bottom_of_a_runaway_recursion():
    # Left running, the collector would free these cycles at every depth down to the recursion
    # limit, where a finaliser fails for want of stack ("Exception ignored in ...").
    _Cycle.depths.clear()
    depth = _stack_depth()
    assert run_check("3.3", _recurses_leaving_garbage).status == "failed"
    gc.collect()
    assert _Cycle.depths, "the answer left no garbage: the test tests nothing"
    assert max(_Cycle.depths) < depth + 50, (depth, max(_Cycle.depths))


def test_check_leaves_the_random_state_grad_mode_and_profiler_alone():
    torch.manual_seed(5)
    state = torch.get_rng_state()
    profiler = sys.getprofile()
    with torch.no_grad():
        check("2.1", CORRECT["2.1"])  # builds modules, which draws random numbers
        check("1.2", CORRECT["1.2"])
        assert not torch.is_grad_enabled()
    assert torch.equal(torch.get_rng_state(), state)
    assert sys.getprofile() is profiler


def test_gradient_checks_run_even_under_no_grad(capsys):
    with torch.no_grad():
        assert run_check("1.2", CORRECT["1.2"]).passed


def test_result_displays_nothing_in_a_notebook():
    result = run_check("1.1", CORRECT["1.1"])
    assert result._ipython_display_() is None
    assert result.to_dict()["status"] == "passed"


@pytest.mark.parametrize("exercise_id", list(CORRECT))
def test_records_survive_the_trip_to_the_grader(exercise_id):
    # The grader moves records from the process where the answers run to its own, as marshal data
    # (mha_course.grading.answer_process): the verdict must be the same on the other side.
    from mha_course.grading.answer_process import from_message, to_message

    exercise = EXERCISES[exercise_id]
    for answer in (CORRECT[exercise_id], *[WRONG[(exercise_id, m.key)] for m in exercise.mistakes][:2]):
        record = probe(exercise, answer)
        loaded = from_message(marshal.loads(marshal.dumps(to_message(record))))
        assert judge(exercise, loaded) == judge(exercise, record)


def test_answer_output_is_swallowed(capsys):
    def noisy(num_tokens, device=None):
        print("looking at", num_tokens, file=io.StringIO())
        print("debug", num_tokens)
        return CORRECT["1.1"](num_tokens, device)

    check("1.1", noisy)
    assert capsys.readouterr().out == f"✓ 1.1 passed ({len(EXERCISES['1.1'].checks)} checks)\n"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none is present")
def test_checks_run_on_the_gpu_too():
    # probe_devices adds the GPU to the meta device: correct answers pass, a CPU-bound mask fails.
    for exercise_id, answer in CORRECT.items():
        assert run_check(exercise_id, answer).passed, exercise_id
    result = run_check("1.2", WRONG[("1.2", "mask-on-cpu")])
    assert result.failed_check == "output on the input's device"


def test_replacing_secrets_randbelow_does_not_fix_the_inputs(monkeypatch):
    import secrets

    from mha_course.exercises.framework import run_seed

    monkeypatch.delenv(SEED_ENV_VAR, raising=False)
    monkeypatch.setattr(secrets, "randbelow", lambda n: 4242)
    assert len({run_seed() for _ in range(20)}) > 1


# ----------------------------------------------------------------------------------------------
# Partial credit counts the checks of an answer's behaviour, never its form


def _none(*args, **kwargs):
    return None


def _zero(*args, **kwargs):
    return 0


def _empty(*args, **kwargs):
    return []


def _raises(*args, **kwargs):
    raise ValueError("not this input either")


class _ReturnsNone(nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, *args, **kwargs):
        return None


class _AlwaysRaises(_ReturnsNone):
    def forward(self, *args, **kwargs):
        raise ValueError("not this input either")


NON_ANSWERS = {"None": (_none, _ReturnsNone), "a constant": (_zero, _ReturnsNone), "empty": (_empty, _ReturnsNone),
               "raises": (_raises, _AlwaysRaises)}


@pytest.mark.parametrize("exercise_id", list(CORRECT))
def test_an_answer_that_does_nothing_of_the_task_earns_no_share(exercise_id):
    # None, a constant, an empty container and an answer that raises on every input pass at most gates
    # (written by you, a type, builds, runs, leaves its inputs alone): their share is 0 in every exercise.
    exercise = EXERCISES[exercise_id]
    for name, (function, module) in NON_ANSWERS.items():
        answer = module if isinstance(CORRECT[exercise_id], type) else function
        result = judge(exercise, probe(exercise, answer))
        passed = [c.name for c in exercise.checks[:result.checks_passed]]
        assert exercise.share(result.checks_passed) == 0, f"{name} passes {passed}: mark the form checks gate=True"
    assert exercise.share(len(exercise.checks)) == 1 and not any(c.gate for c in exercise.checks[-1:])


@pytest.mark.parametrize("exercise_id", ["1.1", "2.3", "3.3", "5.1"])
def test_a_partial_answer_earns_the_share_of_the_behaviour_checks_it_passes(exercise_id):
    exercise = EXERCISES[exercise_id]
    gates = sum(c.gate for c in exercise.checks)
    assert exercise.checks[0].name == OWN_CODE and exercise.checks[0].gate
    assert exercise.share(0) == exercise.share(1) == 0  # refused as the package's answer: nothing
    assert exercise.share(len(exercise.checks) - 1) == round(1 - 1 / (len(exercise.checks) - gates), 4)
