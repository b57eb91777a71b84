"""Figures of chapter 11, looking at fewer keys: the sliding window's mask and the ring of its cache.

:func:`plot_window_mask` draws which keys each query sees under a sliding window: itself and the
``window - 1`` before it; the future is hidden by the causal mask, the older past by the window.
:func:`plot_ring_cache` draws Mistral's rolling buffer: ``window`` slots, token ``p`` written into
slot ``p % window`` over the oldest key, which has just left the window. Each row is one decoding
step; each cell names the position a slot holds after that step.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

from ..attention._validation import validate_positive_int
from ..attention.masking import causal_mask
from .style import COLUMN_WIDTH, NEUTRAL, OKABE_ITO, house_style

#: The fills of a slot just written, a slot holding an older key, and an empty slot.
_WRITTEN, _HELD, _EMPTY = OKABE_ITO[0], "#CFE3F2", "white"

#: The fills of a visible key, a future one and one that has left the window (hatched as well).
_VISIBLE, _FUTURE, _GONE = OKABE_ITO[0], "#F2F2F2", "#FBE3C4"


@house_style()
def plot_window_mask(num_tokens: int = 10, window: int = 4):
    """Draw what each query sees under a sliding window, from the package's :func:`~mha_course.causal_mask`.

    One square per (query, key): filled where the key is visible (the query itself and the
    ``window - 1`` keys before it), pale where it lies in the future, hatched where it has left the
    window. Every row but the first ``window - 1`` sees exactly ``window`` keys.

    Example:
        >>> fig = plot_window_mask(6, 3)
        >>> sorted({p.get_gid() for p in fig.axes[0].patches if p.get_gid()})
        ['future', 'gone', 'visible']
        >>> sum(p.get_gid() == "visible" for p in fig.axes[0].patches)  # 1 + 2 + 3 + 3 + 3 + 3
        15
    """
    num_tokens = validate_positive_int("num_tokens", num_tokens)
    window = validate_positive_int("window", window)
    hidden, future = causal_mask(num_tokens, window=window), causal_mask(num_tokens)
    side = min(0.62 * COLUMN_WIDTH, 4.4)
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH, side), layout="constrained")
    for i in range(num_tokens):
        for j in range(num_tokens):
            kind = "future" if future[i, j] else ("gone" if hidden[i, j] else "visible")
            fill = {"visible": _VISIBLE, "future": _FUTURE, "gone": _GONE}[kind]
            ax.add_patch(Rectangle((j, i), 1, 1, facecolor=fill, edgecolor="white" if kind == "visible" else "#BBBBBB",
                                   lw=0.8, hatch="\\\\" if kind == "gone" else None, gid=kind))
    ax.set_xlim(0, num_tokens)
    ax.set_ylim(num_tokens, 0)
    ax.set_aspect("equal")
    ticks = range(0, num_tokens, max(1, num_tokens // 10))
    ax.set_xticks([t + 0.5 for t in ticks], [str(t) for t in ticks])
    ax.set_yticks([t + 0.5 for t in ticks], [str(t) for t in ticks])
    ax.tick_params(length=0)
    ax.xaxis.set_label_position("top")
    ax.xaxis.tick_top()
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")
    for spine in ax.spines.values():
        spine.set_visible(False)
    handles = [Patch(facecolor=_VISIBLE, edgecolor="black", label="visible:\n0 <= i - j < window"),
               Patch(facecolor=_FUTURE, edgecolor="#BBBBBB", label="the future:\nj > i"),
               Patch(facecolor=_GONE, edgecolor="#BBBBBB", hatch="\\\\", label="left the window:\ni - j >= window")]
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.04, 0.5), frameon=False,
              title=f"T = {num_tokens}, window = {window}")
    return fig


def ring_slots(window: int, num_tokens: int) -> list[list[int | None]]:
    """After each of ``num_tokens`` decoding steps, the position each of ``window`` slots holds (``None``: empty).

    Example:
        >>> ring_slots(3, 5)[-1]  # after token 4: slot 0 holds 3, slot 1 holds 4, slot 2 holds 2
        [3, 4, 2]
    """
    slots: list[int | None] = [None] * window
    steps = []
    for position in range(num_tokens):
        slots[position % window] = position  # over the key that has just left the window
        steps.append(list(slots))
    return steps


@house_style()
def plot_ring_cache(window: int = 4, num_tokens: int = 10):
    """Draw the ring of ``window`` slots through ``num_tokens`` decoding steps, one row per step.

    The slot written at each step is dark, the other filled slots light, empty ones white; each
    cell holds the position of the key in it. From step ``window`` on, every write replaces the key
    that has just left the window, and the ring holds exactly the keys the new token sees.

    Example:
        >>> fig = plot_ring_cache(4, 10)
        >>> [t.get_text() for t in fig.axes[0].texts][-4:]  # step 9: positions 8, 9, 6, 7
        ['8', '9', '6', '7']
    """
    window = validate_positive_int("window", window)
    num_tokens = validate_positive_int("num_tokens", num_tokens)
    steps = ring_slots(window, num_tokens)
    cell = min(0.42, 3.6 / num_tokens)
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH * 0.8, max(2.4, cell * num_tokens + 1.2)), layout="constrained")
    for step, slots in enumerate(steps):
        for slot, position in enumerate(slots):
            written = position == step
            fill = _WRITTEN if written else (_EMPTY if position is None else _HELD)
            ax.add_patch(Rectangle((slot, step), 1, 1, facecolor=fill, edgecolor=NEUTRAL, lw=0.8))
            if position is not None:
                ax.text(slot + 0.5, step + 0.5, str(position), ha="center", va="center",
                        color="white" if written else "black", fontsize=9.5)
    ax.set_xlim(0, window)
    ax.set_ylim(num_tokens, 0)
    ax.set_xticks([s + 0.5 for s in range(window)], [str(s) for s in range(window)])
    ax.set_yticks([t + 0.5 for t in range(num_tokens)], [str(t) for t in range(num_tokens)])
    ax.tick_params(length=0)
    ax.xaxis.set_label_position("top")
    ax.xaxis.tick_top()
    ax.set_xlabel(f"slot (position mod {window})")
    ax.set_ylabel("decoding step: token position")
    for spine in ax.spines.values():
        spine.set_visible(False)
    handles = [Patch(facecolor=_WRITTEN, edgecolor=NEUTRAL, label="written at this step"),
               Patch(facecolor=_HELD, edgecolor=NEUTRAL, label="an earlier key, kept"),
               Patch(facecolor=_EMPTY, edgecolor=NEUTRAL, label="empty")]
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.04, 0.5), frameon=False,
              title=f"window = {window}")
    return fig
