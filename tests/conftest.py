"""Shared fixtures and helpers for the package tests."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from torch import nn

from mha_course import (
    CausalAttention,
    FastMultiHeadAttention,
    GroupedQueryAttention,
    KVCache,
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    TiledMultiHeadAttention,
)
from mha_course.bench import machine
from mha_course.bench.machine import cpu_memory_unsupported_reason
from mha_course.grading.grading_setup import platform_problem
from mha_course.grading.sandbox import BUBBLEWRAP, choose_sandbox, python_folders

# tests/notebooks/ holds the grader's test inputs (some raise, hang or tamper on purpose): they are
# read by tests/test_grader.py, never collected by nbval as chapters.
collect_ignore_glob = ["notebooks/*.ipynb"]


@pytest.fixture(scope="session", autouse=True)
def _short_watch_for_other_work():
    """A benchmark run watches the machine for other programs' work for a second as it starts and
    as it ends, asleep; the tests' runs watch for a twentieth of that (what they check is that the
    watch is made and stored, not what it finds)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(machine, "OTHER_WORK_WINDOW_S", 0.05)
        yield


# Tests run single-threaded and seeded, so results do not depend on the machine's core count.
torch.set_num_threads(1)

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none is present")

# Grading (python -m mha_course grade / progress) needs a POSIX system; elsewhere (Windows) the
# tests that grade are skipped with the grader's own message.
POSIX_GRADING = pytest.mark.skipif(platform_problem() is not None, reason=platform_problem() or "")
# Grading's sandbox (bubblewrap): the tests that show what it prevents are skipped where none starts (macOS, a
# container that refuses user namespaces), but not where MHA_COURSE_REQUIRE_SANDBOX=1 says it must (.ci/run).
SANDBOX_STARTS = platform_problem() is None and choose_sandbox(python_folders()).kind == BUBBLEWRAP
SANDBOXED = pytest.mark.skipif(not SANDBOX_STARTS and os.environ.get("MHA_COURSE_REQUIRE_SANDBOX") != "1",
                               reason="no bubblewrap sandbox starts here: sudo apt-get install bubblewrap, or allow "
                                      "user namespaces")
# The benchmark's peak-memory probe forks a child and reads the resource module: not on Windows.
CPU_MEMORY = pytest.mark.skipif(cpu_memory_unsupported_reason() is not None,
                                reason=f"peak memory is not measured: {cpu_memory_unsupported_reason()}")


class TokenByToken(nn.Module):
    """Runs a cached module one token at a time through a fresh :class:`KVCache`: the decoding path."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cache = KVCache()
        return torch.cat([self.module(x[:, t : t + 1], cache=cache) for t in range(x.shape[1])], dim=1)


def default_kv_groups(num_heads: int) -> int:
    """Real grouping where the head count allows it: 4 heads -> 2 groups of 2, otherwise one group."""
    return num_heads // 2 if num_heads % 2 == 0 and num_heads > 2 else 1


def build(kind: str, d_in: int = 3, head_dim: int = 2, num_heads: int = 2, context_length: int = 6,
          dropout: float = 0.0, qkv_bias: bool = False, num_kv_groups: int | None = None):
    """Build one of the attention classes with comparable sizes.

    ``head_dim`` is the width of one head; for the multi-head modules the total ``d_out`` is
    ``num_heads * head_dim`` and for ``CausalAttention`` there is one head. ``"gqa"`` shares key/value
    heads in ``num_kv_groups`` groups (default: :func:`default_kv_groups`); ``"gqa-cached"`` is the
    same module decoding token by token through a KV cache.
    """
    if kind == "causal":
        return CausalAttention(d_in, head_dim, context_length, dropout, qkv_bias)
    if kind == "wrapper":
        return MultiHeadAttentionWrapper(d_in, head_dim, context_length, dropout, num_heads, qkv_bias)
    if kind == "batched":
        return MultiHeadAttention(d_in, num_heads * head_dim, context_length, dropout, num_heads, qkv_bias)
    if kind in ("fast", "fast-explicit"):
        fast = FastMultiHeadAttention(d_in, num_heads * head_dim, context_length, dropout, num_heads, qkv_bias)
        fast.use_sdpa = kind == "fast"  # "fast-explicit" takes the step-by-step path of the same module
        return fast
    if kind == "tiled":  # MultiHeadAttention with the tiled loop of chapter 7 in the middle
        return TiledMultiHeadAttention(d_in, num_heads * head_dim, context_length, dropout, num_heads, qkv_bias,
                                       block_size=2)
    if kind in ("gqa", "gqa-cached"):
        groups = default_kv_groups(num_heads) if num_kv_groups is None else num_kv_groups
        gqa = GroupedQueryAttention(d_in, num_heads * head_dim, context_length, dropout, num_heads, groups, qkv_bias)
        return gqa if kind == "gqa" else TokenByToken(gqa)
    raise ValueError(kind)


KINDS = ["causal", "wrapper", "batched", "gqa"]
# The modules that keep a causal mask buffer (chapters 1 to 3); the others build their mask per call.
BUFFER_KINDS = ["causal", "wrapper", "batched"]
# Every module that must be causal: the fast path (both of its code paths) and cached decoding included.
CAUSAL_KINDS = KINDS + ["fast", "fast-explicit", "gqa-cached", "tiled"]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _no_figure_left_open():
    """Close every figure a test left open (one whose assertion failed before its close, too): a worker
    that holds more than 20 warns on every figure after."""
    yield
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.close("all")


def on_a_thread(work, guard: float):
    """``work()`` on a thread, waited for at most ``guard`` seconds, its result returned (or its
    error raised): a grader that hangs fails the test instead of hanging it."""
    import threading

    results, errors = [], []

    def run() -> None:
        try:
            results.append(work())
        except BaseException as error:  # noqa: BLE001 - raised again below, in the test
            errors.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(guard)
    assert not thread.is_alive(), f"still running after {guard:g} s: the grader hangs"
    if errors:
        raise errors[0]
    return results[0]


def all_ended(pids, guard: float = 60.0) -> bool:
    """Whether every process of ``pids`` has ended, waiting up to ``guard`` seconds: a sandbox's processes
    end a few milliseconds after its first process is reaped, as the system tears the sandbox down."""
    import time

    deadline = time.monotonic() + guard
    while any(process_running(int(pid)) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.01)
    return not any(process_running(int(pid)) for pid in pids)


def process_running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, dead but not yet reaped, is not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as file:
            return file.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
