"""Exercises of chapter 7, attention without the score matrix: the online-softmax update, the causal tile
skip, the backward pass from the saved state.

The references are the package's: the update inside :class:`mha_course.attention.tiled.TiledAttention` (7.1),
:func:`mha_course.attention.tiled.tile_kind` (7.2) and the gradients of :func:`mha_course.tiled_attention` (7.3).
An answer that calls ``tiled_attention``, PyTorch's fused kernel or ``tile_kind`` is refused (see
:mod:`~mha_course.exercises.shortcuts`).
"""

from __future__ import annotations

import torch

from ..attention.tiled import COMPUTED, CUT, SKIPPED, TiledAttention, TiledMultiHeadAttention, tile_kind, tiled_attention
from .framework import Check, Exercise, Mistake
from .probes import chooser, device_check, generator, probe_on_devices
from .records import Failed, Recorder, describe, expect_close, format_shape, plain, same, seed_of, value_of
from .shortcuts import package, torch_attention

DEVICE_HINT = ("Build the new state from the inputs (torch.maximum, torch.exp, @): a tensor made anew "
               "(torch.zeros, torch.tensor) lands on the CPU unless you pass its device.")

# ----------------------------------------------------------------------------------------------
# 7.1 The online-softmax update


@torch.no_grad()
def update_variant(row_max, row_sum, acc, scores, values, *, rescale_acc: bool = True, rescale_sum: bool = True,
                   rescale: str = "new-max", running_max: bool = True):
    """One online-softmax step with a chosen mistake (the catalogue of 7.1); the defaults give the right one.

    ``rescale``: ``"new-max"`` (right: ``exp(m_old - m_new)``), ``"tile-max"`` (the tile's own
    maximum instead of the new running one) or ``"inverted"`` (``exp(m_new - m_old)``);
    ``running_max=False`` exponentiates the raw scores.
    """
    tile_max = scores.amax(-1, keepdim=True)  # (..., b, 1)
    new_max = torch.maximum(row_max, tile_max)  # (..., b, 1)
    if not running_max:
        weights, factor = torch.exp(scores), torch.ones_like(row_max)
    else:
        weights = torch.exp(scores - new_max)  # (..., b, c)
        factor = {"new-max": lambda: torch.exp(row_max - new_max), "tile-max": lambda: torch.exp(row_max - tile_max),
                  "inverted": lambda: torch.exp(new_max - row_max)}[rescale]()
    new_sum = (row_sum * factor if rescale_sum else row_sum) + weights.sum(-1, keepdim=True)
    new_acc = (acc * factor if rescale_acc else acc) + weights @ values  # (..., b, d_v)
    return new_max, new_sum, new_acc


@torch.no_grad()
def update_slip(row_max, row_sum, acc, scores, values, *, slip: str):
    """One online-softmax step with one of the slips of 7.1 that ``update_variant`` does not model.

    ``"max-kept"``: the old maximum returned; ``"tile-max-only"``: the tile's maximum taken for the
    running one; ``"base-2"``: ``exp2`` without the factor log2(e); ``"old-max-weights"``: the
    tile's exponentials taken against the old maximum; ``"acc-normalised"``: the accumulator divided
    by the sum at every step; ``"sum-over-rows"``: the tile summed over its rows; ``"tile-only"``:
    the state of this tile alone, the incoming state dropped.
    """
    tile_max = scores.amax(-1, keepdim=True)  # (..., b, 1)
    new_max = tile_max if slip in ("tile-max-only", "tile-only") else torch.maximum(row_max, tile_max)
    exp = torch.exp2 if slip == "base-2" else torch.exp
    weights = exp(scores - (row_max if slip == "old-max-weights" else new_max))  # (..., b, c)
    rescale = exp(row_max - new_max)  # (..., b, 1)
    tile_sum = weights.sum(-2 if slip == "sum-over-rows" else -1, keepdim=True)
    if slip == "tile-only":
        return new_max, tile_sum, weights @ values
    new_sum = row_sum * rescale + tile_sum
    new_acc = acc * rescale + weights @ values  # (..., b, d_v)
    if slip == "acc-normalised":
        new_acc = new_acc / new_sum
    return (row_max if slip == "max-kept" else new_max), new_sum, new_acc


#: The cases of 7.1: the first tile (an empty state), a tile that raises some rows' maximum and not
#: others', a whole row of tiles (with heads), and scores in the thousands.
UPDATE_CASES = ("first", "grows", "whole", "large")


def update_case(seed: int, key: str):
    """``(tiles, values)`` of one case of 7.1: the score tiles of some query rows, ``(..., b, c)``
    each, and the matching value blocks ``(..., c, d_v)``, drawn from ``seed``."""
    draw, g = chooser(seed, f"7.1 {key}"), generator(seed, f"7.1 {key}")
    lead = (2, draw.randint(2, 3)) if key == "whole" else ()  # (B, h) for the whole row
    rows, width, value_dim = draw.randint(2, 4), draw.randint(2, 4), draw.randint(2, 3)
    count = {"first": 1, "grows": 2, "whole": draw.randint(3, 4), "large": 3}[key]
    tiles = [torch.randn(*lead, rows, width, generator=g) * 2 for _ in range(count)]
    if key == "grows":  # the second tile raises the maximum of even rows, not of odd ones
        first_max = tiles[0].amax(-1, keepdim=True)  # (b, 1)
        up = first_max - tiles[1].amin(-1, keepdim=True) + 1  # every score of the row above the old maximum
        down = first_max - tiles[1].amax(-1, keepdim=True) - 1  # every score of the row below it
        even = (torch.arange(rows) % 2 == 0).unsqueeze(-1)
        tiles[1] = tiles[1] + torch.where(even, up, down)
    if key == "large":
        tiles = [t * 400 for t in tiles]  # exp() of these overflows float32
    values = [torch.randn(*lead, width, value_dim, generator=g) for _ in range(count)]
    return tiles, values


def empty_state(scores: torch.Tensor, values: torch.Tensor):
    """``(row_max, row_sum, acc)`` before the first tile: -inf, 0 and 0."""
    shape = scores.shape[:-1]
    return (torch.full((*shape, 1), float("-inf")), torch.zeros(*shape, 1),
            torch.zeros(*shape, values.shape[-1]))


def run_updates(update, tiles, values, state=None):
    """Feed every tile to ``update``; return the final ``(row_max, row_sum, acc)``."""
    state = empty_state(tiles[0], values[0]) if state is None else state
    for scores, block in zip(tiles, values):
        state = update(*state, scores, block)
        if not isinstance(state, (tuple, list)) or len(state) != 3:
            raise TypeError(f"online_softmax_update must return (row_max, row_sum, acc), got {describe_value(state)}")
    return state


def describe_value(value) -> str:
    return f"a {type(value).__name__}" + (f" of {len(value)} items" if isinstance(value, (tuple, list)) else "")


def _probe_update(online_softmax_update, rec: Recorder) -> None:
    tiles, values = update_case(rec.seed, "first")
    rec.call("first", online_softmax_update, *empty_state(tiles[0], values[0]), tiles[0], values[0])
    tiles, values = update_case(rec.seed, "grows")
    state = update_variant(*empty_state(tiles[0], values[0]), tiles[0], values[0])  # the right state after tile 1
    rec.call("grows", online_softmax_update, *state, tiles[1], values[1])
    def loop(tiles, values, state):  # run_updates, written here: the watch refuses the checks' own functions
        for scores, block in zip(tiles, values):
            state = online_softmax_update(*state, scores, block)
            if not isinstance(state, (tuple, list)) or len(state) != 3:
                return state  # the check says what came back
        return state

    for key in ("whole", "large"):
        tiles, values = update_case(rec.seed, key)
        rec.call(key, loop, tiles, values, empty_state(tiles[0], values[0]))
    tiles, values = update_case(rec.seed, "grows")
    inputs = (*empty_state(tiles[0], values[0]), tiles[0], values[0])
    probe_on_devices(rec, "on", lambda device: online_softmax_update(*(t.to(device) for t in inputs))[2])


def _update_call(key: str, tiles, values) -> str:
    shapes = f"scores {format_shape(tiles[0].shape)}, values {format_shape(values[0].shape)}"
    return {"first": f"the first tile ({shapes}) from row_max = -inf, row_sum = 0, acc = 0",
            "grows": f"a second tile ({shapes}) that raises the maximum of rows 1, 3, ... (index 0, 2, ...)",
            "whole": f"{len(tiles)} tiles in turn ({shapes} each)",
            "large": f"{len(tiles)} tiles of scores in the thousands ({shapes} each)"}[key]


def _expected_update(seed: int, key: str):
    tiles, values = update_case(seed, key)
    if key == "first":
        return update_variant(*empty_state(tiles[0], values[0]), tiles[0], values[0])
    if key == "grows":
        state = update_variant(*empty_state(tiles[0], values[0]), tiles[0], values[0])
        return update_variant(*state, tiles[1], values[1])
    return run_updates(update_variant, tiles, values)


def _state_of(record, key: str):
    """The learner's ``(row_max, row_sum, acc)`` for case ``key``; a :class:`Failed` unless three tensors."""
    tiles, values = update_case(seed_of(record), key)
    summary = value_of(record, key, f"online_softmax_update on {_update_call(key, tiles, values)}")
    got = plain(summary)
    if not isinstance(got, list) or len(got) != 3 or not all(isinstance(t, torch.Tensor) for t in got):
        raise Failed("three tensors (row_max, row_sum, acc)", describe(summary))
    return got


def _update_shapes(record):
    got = _state_of(record, "first")
    expected = _expected_update(seed_of(record), "first")
    for name, g, e in zip(("row_max", "row_sum", "acc"), got, expected):
        if tuple(g.shape) != tuple(e.shape):
            raise Failed(f"{name} of shape {format_shape(e.shape)} (one per query row{'' if name != 'acc' else ', d_v wide'})",
                         f"shape {format_shape(g.shape)}")


def _update_part(key: str, parts=(0, 1, 2)):
    names = ("row_max", "row_sum", "acc")

    def run(record):
        got, expected = _state_of(record, key), _expected_update(seed_of(record), key)
        tiles, values = update_case(seed_of(record), key)
        for index in parts:
            try:
                expect_close(got[index], expected[index], labels=("sequence", "head", "row"))
            except Failed as failure:
                raise Failed(f"{names[index]} {failure.expected} after {_update_call(key, tiles, values)}",
                             failure.got) from None
    return run


def _softmax_output(key: str):
    """The whole row of tiles: acc / row_sum must be softmax(all scores) @ all values."""
    def run(record):
        _, row_sum, acc = _state_of(record, key)
        tiles, values = update_case(seed_of(record), key)
        expected = torch.softmax(torch.cat(tiles, dim=-1), dim=-1) @ torch.cat(values, dim=-2)
        where = f"after {_update_call(key, tiles, values)}"
        output = acc / row_sum
        if not bool(torch.isfinite(output).all()):
            raise Failed(f"finite numbers, acc / row_sum = softmax(scores) @ values {where}",
                         "inf or nan: exp() of scores this large overflows")
        try:
            expect_close(output, expected, labels=("sequence", "head", "row"))
        except Failed as failure:
            raise Failed(f"acc / row_sum = softmax(scores) @ values: {failure.expected} {where}",
                         failure.got) from None
    return run


def _update_like(key: str = "grows", **how):
    """A detector: on case ``key`` the answer's row_sum and acc equal the variant with mistake ``how``."""
    def detect(record):
        tiles, values = update_case(seed_of(record), key)
        state = None
        if key == "grows":
            state = update_variant(*empty_state(tiles[0], values[0]), tiles[0], values[0])
            expected = update_variant(*state, tiles[1], values[1], **how)
        else:
            expected = update_variant(*empty_state(tiles[0], values[0]), tiles[0], values[0], **how)
        got = plain(record[key])
        return same(got[1], expected[1]) and same(got[2], expected[2])
    return detect


def _slip_like(slip: str, key: str = "grows"):
    """A detector: on case ``key`` the answer's whole state equals :func:`update_slip`'s with ``slip``."""
    def detect(record):
        tiles, values = update_case(seed_of(record), key)
        state = empty_state(tiles[0], values[0])
        if key == "grows":
            state = update_variant(*state, tiles[0], values[0])
        expected = update_slip(*state, tiles[-1] if key == "grows" else tiles[0],
                               values[-1] if key == "grows" else values[0], slip=slip)
        got = plain(record[key])
        return isinstance(got, list) and len(got) == 3 and all(same(g, e) for g, e in zip(got, expected))
    return detect


def _no_running_max(record) -> bool:
    # Right on ordinary scores once divided, but exp() of the raw scores: the first tile's sum shows it.
    return _update_like("first", running_max=False)(record)


UPDATE = Exercise(
    id="7.1",
    title="the online-softmax update",
    answer_name="online_softmax_update",
    signature="online_softmax_update(row_max, row_sum, acc, scores, values)",
    probe=_probe_update,
    checks=(
        Check("returns (row_max, row_sum, acc)", lambda r: _state_of(r, "first")),
        Check("shapes: row_max and row_sum (..., b, 1), acc (..., b, d_v)", _update_shapes),
        Check("the first tile: the running maximum", _update_part("first", (0,))),
        Check("the first tile: the running sum and the accumulator", _update_part("first", (1, 2))),
        Check("a tile that raises the maximum: the running maximum", _update_part("grows", (0,))),
        Check("a tile that raises the maximum: the sum and accumulator rescaled", _update_part("grows", (1, 2))),
        Check("a whole row of tiles gives softmax(scores) @ values", _softmax_output("whole")),
        Check("scores in the thousands stay finite", _softmax_output("large")),
        Check("output on the input's device", device_check("on", "online_softmax_update", DEVICE_HINT)),
    ),
    mistakes=(
        Mistake("no-running-max",
                "You took exp() of the raw scores. The result is right once divided, for small scores only: "
                "exp(90) already overflows float32. Subtract the running maximum first: "
                "weights = torch.exp(scores - new_max), and keep new_max as the state.",
                _no_running_max),
        Mistake("neither-rescaled",
                "Neither the sum nor the accumulator was rescaled when the maximum grew. Both hold "
                "exponentials taken against the OLD maximum: multiply both by exp(row_max - new_max) "
                "before adding the new tile's.",
                _update_like(rescale_acc=False, rescale_sum=False)),
        Mistake("acc-not-rescaled",
                "The sum was rescaled but the accumulator was not. The accumulator holds exp(s - row_max) "
                "times the values, taken against the old maximum: acc * exp(row_max - new_max) + weights @ values.",
                _update_like(rescale_acc=False)),
        Mistake("sum-not-rescaled",
                "The accumulator was rescaled but the sum was not. The sum holds exp(s - row_max) against "
                "the old maximum too: row_sum * exp(row_max - new_max) + weights.sum(-1, keepdim=True).",
                _update_like(rescale_sum=False)),
        Mistake("rescale-by-tile-max",
                "You rescaled with the tile's own maximum, exp(row_max - tile_max). The factor that turns "
                "the old maximum into the new one is exp(row_max - new_max), with "
                "new_max = torch.maximum(row_max, tile_max): when the tile's maximum is the smaller, "
                "your factor exceeds 1.",
                _update_like(rescale="tile-max")),
        Mistake("rescale-inverted",
                "Your rescaling factor is upside down, exp(new_max - row_max), which is at least 1. Moving "
                "from the old maximum to a larger new one SHRINKS what was summed: exp(row_max - new_max).",
                _update_like(rescale="inverted")),
        Mistake("max-kept",
                "You returned the old maximum, row_max, as the new one. The next tile's rescaling reads "
                "it: return new_max = torch.maximum(row_max, tile_max), against which this tile's "
                "exponentials were taken.",
                _slip_like("max-kept", "first")),
        Mistake("tile-max-only",
                "Your running maximum is this tile's maximum alone. Where an earlier tile held the "
                "larger score, the maximum must stay: new_max = torch.maximum(row_max, "
                "scores.amax(-1, keepdim=True)).",
                _slip_like("tile-max-only")),
        Mistake("tile-only",
                "You returned this tile's state alone and dropped the incoming one. The state carries "
                "every earlier tile: rescale row_sum and acc by exp(row_max - new_max), then add the "
                "tile's own terms.",
                _slip_like("tile-only")),
        Mistake("base-2",
                "You used powers of 2 (torch.exp2) as if they were powers of e: the weights are "
                "2^(s - m), a softmax of s * ln 2. Kernels use exp2 only with the scores multiplied by "
                "log2(e) = 1.4427 first; torch.exp needs nothing.",
                _slip_like("base-2", "first")),
        Mistake("old-max-weights",
                "You took this tile's exponentials against the OLD maximum, exp(scores - row_max): "
                "before the first tile that is exp(s + inf) = inf, and a score above the old maximum "
                "overflows too. Subtract the new maximum: torch.exp(scores - new_max).",
                _slip_like("old-max-weights")),
        Mistake("acc-normalised",
                "You divided the accumulator by the sum at every step. The update keeps the numerator "
                "and the denominator apart and divides once, after the last tile: return "
                "acc * rescale + weights @ values as it is.",
                _slip_like("acc-normalised")),
        Mistake("sum-over-rows",
                "You summed the tile's exponentials over its rows (dim=-2), one sum per key. The "
                "softmax's denominator is one sum per query row, over the keys: "
                "weights.sum(dim=-1, keepdim=True).",
                _slip_like("sum-over-rows", "first")),
    ),
    shortcuts=package(tiled_attention, TiledAttention, TiledMultiHeadAttention,
                      why="It runs the package's own loop, update included: write the update yourself.")
    + torch_attention("The fused kernel computes attention whole: write the update of one tile yourself."),
)

# ----------------------------------------------------------------------------------------------
# 7.2 The causal tile skip

#: The cases of 7.2: ``aligned`` (T a multiple of block_size), ``ragged`` (a shorter last block),
#: ``one left`` (a last block of one token), ``single`` (block_size 1), ``whole`` (block_size >= T).
TILE_CASES = ("aligned", "ragged", "one left", "single", "whole")


def tile_case(seed: int, key: str) -> tuple[int, int]:
    """``(num_tokens, block_size)`` of one case of 7.2, drawn from ``seed``."""
    draw = chooser(seed, f"7.2 {key}")
    block, blocks = draw.randint(3, 5), draw.randint(3, 5)
    return {"aligned": (blocks * block, block), "ragged": (blocks * block + draw.randint(2, block - 1), block),
            "one left": (blocks * block + 1, block), "single": (draw.randint(3, 6), 1),
            "whole": (draw.randint(2, 6), draw.randint(6, 9))}[key]


def tile_grid(kind, num_tokens: int, block_size: int) -> list[list]:
    """``kind(q_start, k_start, block_size, num_tokens)`` for every tile, by row of query blocks."""
    starts = range(0, num_tokens, block_size)
    return [[kind(q, k, block_size, num_tokens) for k in starts] for q in starts]


def tile_variant(q_start: int, k_start: int, block_size: int, num_tokens: int, *, mistake: str | None = None) -> str:
    """``tile_kind`` with a chosen mistake of the catalogue of 7.2 (``None``: the right kind)."""
    last_row = min(q_start + block_size, num_tokens) - 1
    last_col = min(k_start + block_size, num_tokens) - 1
    if mistake == "no-clamp":
        last_row, last_col = q_start + block_size - 1, k_start + block_size - 1
    if mistake == "diagonal-skipped":
        return SKIPPED if k_start >= q_start else COMPUTED
    if mistake == "diagonal-not-cut":
        return SKIPPED if k_start > q_start else COMPUTED
    if mistake == "one-tile-past":
        return SKIPPED if k_start > q_start + block_size else (CUT if k_start >= q_start else COMPUTED)
    if k_start > last_row:
        return SKIPPED
    if mistake == "diagonal-always-cut":
        return CUT if k_start == q_start else COMPUTED
    return CUT if last_col > q_start else COMPUTED


def _probe_tiles(tile_kind_answer, rec: Recorder) -> None:
    def grid(num_tokens, block_size):  # tile_grid, written here: the watch refuses the checks' own functions
        starts = range(0, num_tokens, block_size)
        return [[tile_kind_answer(q, k, block_size, num_tokens) for k in starts] for q in starts]

    for key in TILE_CASES:
        rec.call(key, grid, *tile_case(rec.seed, key))


def _grid_of(record, key: str):
    num_tokens, block_size = tile_case(seed_of(record), key)
    summary = value_of(record, key, f"tile_kind on {num_tokens} tokens in blocks of {block_size}")
    got = plain(summary)
    if not all(isinstance(kind, str) and kind in (COMPUTED, CUT, SKIPPED) for row in got for kind in row):
        found = sorted({repr(kind) for row in got for kind in row if kind not in (COMPUTED, CUT, SKIPPED)})
        raise Failed('"computed", "cut" or "skipped" for every tile', ", ".join(found[:3]))
    return got


def _grid_check(key: str, which=None):
    """The kinds of case ``key``; with ``which``, only the tiles it picks (``which(i, j)``)."""
    def run(record):
        got = _grid_of(record, key)
        num_tokens, block_size = tile_case(seed_of(record), key)
        expected = tile_grid(tile_variant, num_tokens, block_size)
        for i, row in enumerate(expected):
            for j, kind in enumerate(row):
                if (which is None or which(i, j)) and got[i][j] != kind:
                    # The tile as the call that names it: offsets, counted from 0 as the code counts.
                    raise Failed(f'"{kind}" for tile_kind({i * block_size}, {j * block_size}, {block_size}, '
                                 f"{num_tokens}), query block {i + 1} and key block {j + 1}",
                                 f'"{got[i][j]}"')
    return run


def _tiles_like(mistake: str, keys=("aligned", "one left")):
    def detect(record):
        return all(plain(record[key]) == tile_grid(
            lambda *args: tile_variant(*args, mistake=mistake), *tile_case(seed_of(record), key)) for key in keys)
    return detect


TILES = Exercise(
    id="7.2",
    title="the causal tile skip",
    answer_name="tile_kind",
    signature="tile_kind(q_start, k_start, block_size, num_tokens)",
    probe=_probe_tiles,
    checks=(
        Check('returns "computed", "cut" or "skipped"', lambda r: _grid_of(r, "aligned")),
        Check("the tiles wholly above the diagonal are skipped", _grid_check("aligned", lambda i, j: j > i)),
        Check("the tiles on the diagonal are cut (computed, then masked)", _grid_check("aligned", lambda i, j: i == j)),
        Check("the tiles below the diagonal are computed whole", _grid_check("aligned", lambda i, j: j < i)),
        Check("a last block shorter than the others", _grid_check("ragged")),
        Check("a last block of one token", _grid_check("one left")),
        Check("tiles of one token (block_size=1)", _grid_check("single")),
        Check("one tile for the whole sequence (block_size >= num_tokens)", _grid_check("whole")),
    ),
    mistakes=(
        Mistake("diagonal-skipped",
                "You skipped the tiles ON the diagonal too: they hold every token's score with itself (and "
                "with the tokens just before it), so the loop must compute them. Skip a tile only when its "
                "first key comes after its last query: k_start > last_row.",
                _tiles_like("diagonal-skipped")),
        Mistake("diagonal-not-cut",
                "You computed the tiles on the diagonal whole, without the mask: the queries at the start "
                "of such a tile would see the keys after them, the future. A tile is cut when its last key "
                "comes after its FIRST query: last_col > q_start.",
                _tiles_like("diagonal-not-cut")),
        Mistake("one-tile-past",
                "You also computed the tile just right of the diagonal. Every key there comes after every "
                "query of the block, so all its scores would be masked: skip it (k_start > last_row).",
                _tiles_like("one-tile-past")),
        Mistake("no-clamp",
                "The last block holds fewer tokens than block_size: its last position is "
                "min(start + block_size, num_tokens) - 1. A last block of one token on the diagonal needs "
                "no mask, so it is computed, not cut.",
                _tiles_like("no-clamp", keys=("aligned", "one left", "single"))),
        Mistake("diagonal-always-cut",
                "A diagonal tile of one query and one key holds a token's score with itself, which it may "
                "see: nothing to mask, so it is computed. Cut a tile only when its last key comes after its "
                "first query (last_col > q_start).",
                lambda r: _tiles_like("diagonal-always-cut", keys=("single",))(r)),
    ),
    shortcuts=package(tile_kind),
)

# ----------------------------------------------------------------------------------------------
# 7.3 The backward of one tile

#: The cases of 7.3: ``one`` (one sequence, one head), ``heads`` (a batch of several heads) and
#: ``large`` (float64 scores in the thousands, which overflow exp() without the maximum; float64, so
#: that the gradients, which such scores make ill-conditioned, are compared to many digits).
BACKWARD_CASES = ("one", "heads", "large")


def backward_case(seed: int, key: str):
    """``(queries, keys, values, grad_out)`` of one case of 7.3, ``(B, h, T, d_h)`` each."""
    draw, g = chooser(seed, f"7.3 {key}"), generator(seed, f"7.3 {key}")
    batch, heads = (2, draw.randint(2, 3)) if key == "heads" else (1, 1)
    tokens, head_dim = draw.randint(4, 7), draw.randint(3, 5)
    scale, dtype = (60.0, torch.float64) if key == "large" else (1.0, torch.float32)
    q, k = (scale * torch.randn(batch, heads, tokens, head_dim, generator=g, dtype=dtype) for _ in range(2))
    v, d_out = (torch.randn(batch, heads, tokens, head_dim, generator=g, dtype=dtype) for _ in range(2))
    return q, k, v, d_out


@torch.no_grad()
def forward_state(queries, keys, values):
    """What the forward pass leaves for the backward: ``(out, row_max, row_sum)``, the last two
    ``(B, h, T, 1)``: the causal scores' maximum and the sum of their exponentials, per row."""
    num_tokens = queries.shape[-2]
    scores = (queries @ keys.transpose(-2, -1)) * queries.shape[-1] ** -0.5  # (B, h, T, T)
    future = torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=queries.device).triu(1)
    scores = scores.masked_fill(future, -torch.inf)
    row_max = scores.amax(-1, keepdim=True)
    weights = torch.exp(scores - row_max)
    row_sum = weights.sum(-1, keepdim=True)
    return (weights / row_sum) @ values, row_max, row_sum


def backward_inputs(seed: int, key: str):
    """The arguments of ``attention_backward`` for case ``key``:
    ``(queries, keys, values, out, row_max, row_sum, grad_out)``."""
    q, k, v, d_out = backward_case(seed, key)
    return (q, k, v, *forward_state(q, k, v), d_out)


@torch.no_grad()
def backward_variant(queries, keys, values, out, row_max, row_sum, grad_out, *, mistake: str | None = None):
    """The gradients ``(dq, dk, dv)`` of causal attention from the saved state, with a chosen
    mistake of the catalogue of 7.3 (``None``: the right ones)."""
    scale = queries.shape[-1] ** -0.5
    scores = (queries @ keys.transpose(-2, -1)) * scale  # (B, h, T, T)
    if mistake != "no-causal-mask":
        num_tokens = queries.shape[-2]
        future = torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=queries.device).triu(1)
        scores = scores.masked_fill(future, -torch.inf)
    lse = (0 if mistake == "row-sum-not-divided" else torch.log(row_sum)) + (
        0 if mistake == "lse-without-max" else row_max)  # (B, h, T, 1)
    p = torch.exp(scores - lse)  # the probabilities, recomputed
    d_v = (p if mistake == "dv-untransposed" else p.transpose(-2, -1)) @ grad_out
    d_p = grad_out @ values.transpose(-2, -1)
    d = p.sum(-1, keepdim=True) if mistake == "d-from-p" else (grad_out * out).sum(-1, keepdim=True)
    d_s = p * d_p if mistake == "no-d" else p * (d_p - d)
    if mistake != "grads-not-scaled":
        d_s = d_s * scale
    return d_s @ keys, d_s.transpose(-2, -1) @ queries, d_v


def _probe_backward(attention_backward, rec: Recorder) -> None:
    for key in BACKWARD_CASES:
        rec.call(key, attention_backward, *backward_inputs(rec.seed, key))
    inputs = backward_inputs(rec.seed, "one")
    probe_on_devices(rec, "on", lambda device: attention_backward(*(t.to(device) for t in inputs))[0])


def _backward_call(seed: int, key: str) -> str:
    q = backward_case(seed, key)[0]
    size = f"queries, keys and values of shape {format_shape(q.shape)}"
    return {"one": size, "heads": size, "large": f"{size}, float64 scores in the thousands"}[key]


def _gradients_of(record, key: str):
    """The learner's ``(dq, dk, dv)`` for case ``key``; a :class:`Failed` unless three tensors."""
    summary = value_of(record, key, f"attention_backward on {_backward_call(seed_of(record), key)}")
    got = plain(summary)
    if not isinstance(got, list) or len(got) != 3 or not all(isinstance(t, torch.Tensor) for t in got):
        raise Failed("three tensors (dq, dk, dv)", describe(summary))
    return got


def _expected_gradients(seed: int, key: str):
    """The package's gradients: autograd through :func:`~mha_course.tiled_attention`'s own backward."""
    q, k, v, d_out = backward_case(seed, key)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    return torch.autograd.grad(tiled_attention(*leaves, block_size=2), leaves, d_out)


def _gradient_check(key: str, parts=(0, 1, 2)):
    names = ("dq", "dk", "dv")

    def run(record):
        got = _gradients_of(record, key)
        expected = _expected_gradients(seed_of(record), key)
        for index in parts:
            if not bool(torch.isfinite(got[index]).all()):
                raise Failed(f"finite {names[index]} on {_backward_call(seed_of(record), key)}",
                             "inf or nan")
            try:
                expect_close(got[index], expected[index], labels=("sequence", "head", "token"))
            except Failed as failure:
                raise Failed(f"{names[index]} {failure.expected} on {_backward_call(seed_of(record), key)}",
                             failure.got) from None
    return run


def _backward_like(mistake: str, key: str = "heads"):
    def detect(record):
        got = plain(record[key])
        expected = backward_variant(*backward_inputs(seed_of(record), key), mistake=mistake)
        return isinstance(got, list) and len(got) == 3 and all(same(g, e) for g, e in zip(got, expected))
    return detect


BACKWARD = Exercise(
    id="7.3",
    title="the backward from the saved state",
    answer_name="attention_backward",
    signature="attention_backward(queries, keys, values, out, row_max, row_sum, grad_out)",
    probe=_probe_backward,
    checks=(
        Check("returns (dq, dk, dv)", lambda r: _gradients_of(r, "one")),
        Check("dv = P^T dO, P recomputed from the saved state", _gradient_check("one", (2,))),
        Check("dq, through D and the scale", _gradient_check("one", (0,))),
        Check("dk, through D and the scale", _gradient_check("one", (1,))),
        Check("a batch of several heads", _gradient_check("heads")),
        Check("scores in the thousands stay finite", _gradient_check("large")),
        Check("output on the input's device", device_check("on", "attention_backward", DEVICE_HINT)),
    ),
    mistakes=(
        Mistake("no-causal-mask",
                "You recomputed the probabilities without the causal mask: P = exp(S - L) is then "
                "non-zero for keys after their query, which the forward pass never weighed. Mask S "
                "(-inf above the diagonal) before the exp, as the forward did; in the tiled loop the "
                "backward skips the same tiles.",
                _backward_like("no-causal-mask")),
        Mistake("lse-without-max",
                "Your log-sum-exp is log(row_sum) alone. row_sum was summed against the row's maximum, "
                "sum_j exp(s_ij - m_i), so log sum_j exp(s_ij) = row_max + log(row_sum): add the maximum "
                "back, or P = exp(S - L) is off by exp(m_i) and overflows for large scores.",
                _backward_like("lse-without-max")),
        Mistake("d-from-p",
                "Your D is the row sum of P, which is 1 for every row. D is the row sum of dO * O "
                "(equal to the row sum of P * dP): D = (grad_out * out).sum(-1, keepdim=True), from the "
                "saved output.",
                _backward_like("d-from-p")),
        Mistake("no-d",
                "You took dS = P * dP, without D. The softmax couples a row's entries: "
                "dS = P * (dP - D), with D = (grad_out * out).sum(-1, keepdim=True) per row.",
                _backward_like("no-d")),
        Mistake("grads-not-scaled",
                "Your dq and dk miss the factor 1/sqrt(d_h). The scores are S = Q K^T / sqrt(d_h), so "
                "dQ = dS K / sqrt(d_h) and dK = dS^T Q / sqrt(d_h); dv is right.",
                _backward_like("grads-not-scaled")),
        Mistake("row-sum-not-divided",
                "Your P is exp(S - row_max): the maximum is taken off, but each row is never divided by its "
                "sum, so its weights add up to row_sum, not 1. P = exp(S - row_max) / row_sum, that is "
                "exp(S - L) with L = row_max + log(row_sum).",
                _backward_like("row-sum-not-divided")),
        Mistake("dv-untransposed",
                "Your dv is P dO. Value j was weighed by P[i, j] for every query i, so its gradient sums over "
                "the queries: dv = P^T dO (p.transpose(-2, -1) @ grad_out). The shapes match either way, "
                "(T, T) times (T, d_h), which is why nothing complained.",
                _backward_like("dv-untransposed")),
    ),
    shortcuts=package(tiled_attention, TiledAttention, TiledMultiHeadAttention,
                      why="It runs the package's own backward: write the gradients yourself.")
    + torch_attention("The fused kernel's backward computes the gradients for you: write them yourself."),
)

EXERCISES = (UPDATE, TILES, BACKWARD)

__all__ = ["EXERCISES", "update_case", "update_variant", "update_slip", "empty_state", "run_updates", "tile_case",
           "tile_grid", "tile_variant", "backward_case", "backward_inputs", "forward_state", "backward_variant"]

