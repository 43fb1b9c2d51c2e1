"""The Go board as batched arrays: padded 1-D layout, incremental groups and liberties, Zobrist.

Layout (KataGo's): a board of width n lives in a padded layout of width N >= n with stride
W = N + 1 and area A = (N + 2) * W + 1. Point (x, y), y = 0 the top row, is
`(y + 1) * W + x + 1`; its neighbours are `p - W, p - 1, p + 1, p + W`, its diagonals
`p +- W +- 1` (the last cell of the area is there only as the bottom-right corner's diagonal).
Every cell that is not on the game's board is WALL, so games of different sizes share one
batch and no kernel checks bounds. Point 0 is always a wall and doubles as the PASS move.

Groups are circular linked lists (`group_next`) with a head (`group_head`); the head holds the
group's stone count and its exact liberty count, kept up to date incrementally as stones are
placed, merged and captured.

Every per-game kernel takes the batch `b` and a game index `g` and touches only row g, so the
batched drivers can run games in parallel and the same source can become CUDA device code.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from gocore.jit import CPU, batched, kernel, per_game
from gocore.rules import (
    KO_SIMPLE,
    KO_SITUATIONAL,
    RULE_FIELDS,
    RULE_KO,
    RULE_KOMI_HALVES,
    RULE_SCORING,
    RULE_SUICIDE,
    SCORING_TERRITORY,
    Rules,
)

EMPTY = 0
BLACK = 1
WHITE = 2
WALL = 3

PASS = 0
NO_POINT = -1

MIN_SIZE = 2
MAX_SIZE = 19
MAX_AREA = (MAX_SIZE + 2) * (MAX_SIZE + 1) + 1

# What `play` and `legality` return.
LEGAL = 0
ILLEGAL_OFF_BOARD = 1
ILLEGAL_OCCUPIED = 2
ILLEGAL_SUICIDE = 3
ILLEGAL_KO = 4
ILLEGAL_SUPERKO = 5
ILLEGAL_GAME_FULL = 6  # the move history of this batch is full (max_moves)
ILLEGAL_SETUP = 7  # a setup stone that would capture or have no liberty, or setup after moves

STATUS_NAMES = {
    LEGAL: "legal",
    ILLEGAL_OFF_BOARD: "off the board",
    ILLEGAL_OCCUPIED: "point occupied",
    ILLEGAL_SUICIDE: "suicide",
    ILLEGAL_KO: "ko",
    ILLEGAL_SUPERKO: "superko",
    ILLEGAL_GAME_FULL: "move limit reached",
    ILLEGAL_SETUP: "invalid setup stone",
}

# Scratch marks of the region flood fill.
_UNSEEN = -1
_QUEUED = -2

_zobrist_rng = np.random.default_rng(0x7E46E4)
_ZOBRIST_SEED = _zobrist_rng.integers(1, np.iinfo(np.uint64).max, dtype=np.uint64)
ZOBRIST_SIDE = _zobrist_rng.integers(1, np.iinfo(np.uint64).max, size=3, dtype=np.uint64)
# The empty board's hash is not zero, so that zero can mark free slots of the history table.
EMPTY_BOARD_HASH = _zobrist_rng.integers(1, np.iinfo(np.uint64).max, dtype=np.uint64)


class Boards(NamedTuple):
    """G games in one padded layout. Shapes: A = layout area, M = max moves, T = history slots."""

    stride: int  # W = N + 1 for a layout of width N
    size: np.ndarray  # [G] int32 board width of each game, 2..N
    rules: np.ndarray  # [G, RULE_FIELDS] int32, see gocore.rules
    color: np.ndarray  # [G, A] int8 EMPTY, BLACK, WHITE or WALL
    group_head: np.ndarray  # [G, A] int16 head stone of the stone's group
    group_next: np.ndarray  # [G, A] int16 next stone of the group (circular)
    group_size: np.ndarray  # [G, A] int16 stones of the group, at its head
    group_libs: np.ndarray  # [G, A] int16 liberties of the group, at its head
    to_move: np.ndarray  # [G] int8 the player to move
    ko_point: np.ndarray  # [G] int16 point banned by simple ko, NO_POINT if none
    ko_color: np.ndarray  # [G] int8 the player the ko ban applies to
    passes: np.ndarray  # [G] int32 consecutive passes just played
    move_count: np.ndarray  # [G] int32 moves played, passes included
    moves: np.ndarray  # [G, M] int16 the moves played, PASS for a pass
    move_colors: np.ndarray  # [G, M] int8 who played each move
    captures: np.ndarray  # [G, 3] int32 stones captured by BLACK ([g, 1]) and WHITE ([g, 2])
    hash: np.ndarray  # [G] uint64 Zobrist hash of the stones on the board
    history: np.ndarray  # [G, T] uint64 set (open addressing) of past position keys; 0 = free
    history_slots: np.ndarray  # [G, M + 2] int32 the slots filled, in order (to clear only those)
    history_count: np.ndarray  # [G] int32 how many slots are filled
    scratch: np.ndarray  # [G, A] int16 work space of flood fills
    setup: np.ndarray  # [G, A] int8 the setup stones (handicap, SGF AB/AW), EMPTY elsewhere
    # The two positions before the current one, the position after k moves at [g, k % 2] for
    # k = move_count - 2 and move_count - 1 (kept by play_legal; read with past_key).
    past_hash: np.ndarray  # [G, 2] uint64 its stones' hash
    past_ko: np.ndarray  # [G, 2] int32 its ko ban, as ko_key gives it

    @property
    def games(self) -> int:
        return self.size.shape[0]

    @property
    def layout(self) -> int:
        return self.stride - 1

    @property
    def max_moves(self) -> int:
        return self.moves.shape[1]


def layout_area(layout: int) -> int:
    """Cells of a padded layout: every neighbour and diagonal of every point is inside it."""
    return (layout + 2) * (layout + 1) + 1


def point(stride: int, x: int, y: int) -> int:
    """The padded index of (x, y), y = 0 the top row."""
    return (y + 1) * stride + x + 1


def point_xy(stride: int, p: int) -> tuple[int, int]:
    return p % stride - 1, p // stride - 1


def grid(row: np.ndarray, stride: int, size: int) -> np.ndarray:
    """The [size, size] board (row 0 at the top) of one game's [A] padded row, as a view."""
    return row[: (size + 2) * stride].reshape(-1, stride)[1 : size + 1, 1 : size + 1]


def move_cap(moves_per_area: float, area: int) -> int:
    """The moves after which a self-play or match game stops and is scored as it stands
    (selfplay.max_moves_per_area times the board's points, at least 8)."""
    return max(8, math.ceil(moves_per_area * area))


def default_max_moves(size: int) -> int:
    """A move limit no real game reaches and random games rarely do."""
    return max(64, 8 * size * size)


def new_boards(
    games: int,
    size: int | np.ndarray,
    rules: Rules | np.ndarray | None = None,
    *,
    layout: int | None = None,
    max_moves: int | None = None,
) -> Boards:
    """Allocate and clear `games` boards; `size` and `rules` may differ per game."""
    sizes = np.broadcast_to(np.asarray(size, dtype=np.int32), (games,)).copy()
    if sizes.min() < MIN_SIZE or sizes.max() > MAX_SIZE:
        raise ValueError(f"board size must be {MIN_SIZE}..{MAX_SIZE} (got {sorted(set(sizes))})")
    layout = int(sizes.max()) if layout is None else layout
    if layout < sizes.max() or layout > MAX_SIZE:
        raise ValueError(
            f"layout {layout} must hold the largest board ({sizes.max()}) and be <= 19"
        )
    if rules is None:
        rules = Rules()
    rule_rows = rules.as_row() if isinstance(rules, Rules) else np.asarray(rules, dtype=np.int32)
    # C order, as every other batch's rows: astype of a broadcast view keeps no particular
    # order (it gave Fortran order), and each layout is a separate compile of every kernel.
    rule_rows = np.array(np.broadcast_to(rule_rows, (games, RULE_FIELDS)), np.int32, order="C")
    max_moves = default_max_moves(layout) if max_moves is None else max_moves
    area = layout_area(layout)
    # At most half full, so open-addressing probes stay short.
    slots = 1 << int(np.ceil(np.log2(2 * (max_moves + 2))))
    b = Boards(
        stride=layout + 1,
        size=sizes,
        rules=rule_rows,
        color=np.zeros((games, area), np.int8),
        group_head=np.zeros((games, area), np.int16),
        group_next=np.zeros((games, area), np.int16),
        group_size=np.zeros((games, area), np.int16),
        group_libs=np.zeros((games, area), np.int16),
        to_move=np.zeros(games, np.int8),
        ko_point=np.zeros(games, np.int16),
        ko_color=np.zeros(games, np.int8),
        passes=np.zeros(games, np.int32),
        move_count=np.zeros(games, np.int32),
        moves=np.zeros((games, max_moves), np.int16),
        move_colors=np.zeros((games, max_moves), np.int8),
        captures=np.zeros((games, 3), np.int32),
        hash=np.zeros(games, np.uint64),
        history=np.zeros((games, slots), np.uint64),
        history_slots=np.zeros((games, max_moves + 2), np.int32),
        history_count=np.zeros(games, np.int32),
        scratch=np.zeros((games, area), np.int16),
        setup=np.zeros((games, area), np.int8),
        past_hash=np.zeros((games, 2), np.uint64),
        past_ko=np.zeros((games, 2), np.int32),
    )
    reset_all(b)
    return b


# ---------------------------------------------------------------------------------------------
# Per-game kernels
# ---------------------------------------------------------------------------------------------


@kernel
def reset(b, g):
    """Clear game g to an empty board of its size, black to move."""
    n = b.size[g]
    stride = b.stride
    for p in range(b.color.shape[1]):
        b.color[g, p] = WALL
        b.group_head[g, p] = 0
        b.group_next[g, p] = 0
        b.group_size[g, p] = 0
        b.group_libs[g, p] = 0
        b.setup[g, p] = EMPTY
    for y in range(n):
        for x in range(n):
            b.color[g, (y + 1) * stride + x + 1] = EMPTY
    b.to_move[g] = BLACK
    b.ko_point[g] = NO_POINT
    b.ko_color[g] = EMPTY
    b.passes[g] = 0
    b.move_count[g] = 0
    for c in range(3):
        b.captures[g, c] = 0
    b.hash[g] = EMPTY_BOARD_HASH
    reset_history(b, g)


@kernel
def _history_key(b, g, position_hash, side_to_move):
    """The key superko compares: the position, plus the side to move under situational superko."""
    if b.rules[g, RULE_KO] == KO_SITUATIONAL:
        return position_hash ^ ZOBRIST_SIDE[side_to_move]
    return position_hash


@kernel
def _history_slot(b, g, key):
    """The slot holding `key`, or the free slot where it would go."""
    mask = np.uint64(b.history.shape[1] - 1)
    i = np.int64(key & mask)
    while True:
        k = b.history[g, i]
        if k == key or k == 0:
            return i
        i = np.int64((np.uint64(i) + np.uint64(1)) & mask)


@kernel
def _history_contains(b, g, key):
    return b.history[g, _history_slot(b, g, key)] == key


@kernel
def _history_insert(b, g, key):
    slot = _history_slot(b, g, key)
    if b.history[g, slot] == 0:
        b.history[g, slot] = key
        b.history_slots[g, b.history_count[g]] = slot
        b.history_count[g] += 1


@kernel
def reset_history(b, g):
    """Forget past positions: the current one (with its side to move) is the only one seen.

    Only the filled slots are cleared, so a reset costs the moves played, not the table size.
    """
    for i in range(b.history_count[g]):
        b.history[g, b.history_slots[g, i]] = 0
    b.history_count[g] = 0
    if b.rules[g, RULE_KO] != KO_SIMPLE:
        _history_insert(b, g, _history_key(b, g, b.hash[g], b.to_move[g]))


@kernel
def touches_group(b, g, p, head, c):
    """Whether point p touches the group of colour c headed by `head` (for an empty p: is its
    liberty)."""
    stride = b.stride
    for q in (p - stride, p - 1, p + 1, p + stride):
        if b.color[g, q] == c and b.group_head[g, q] == head:
            return True
    return False


@kernel
def liberties(b, g, p):
    """Liberties of the group at p (0 for an empty point or a wall)."""
    c = b.color[g, p]
    if c != BLACK and c != WHITE:
        return 0
    return np.int64(b.group_libs[g, b.group_head[g, p]])


@kernel
def _first_sighting(head, seen0, seen1, seen2):
    """Distinct group heads around a point, kept in three scalars (a point has four neighbours,
    the fourth needs no memory): returns (whether `head` is new, the updated three)."""
    if head == seen0 or head == seen1 or head == seen2:
        return False, seen0, seen1, seen2
    if seen0 < 0:
        return True, head, seen1, seen2
    if seen1 < 0:
        return True, seen0, head, seen2
    return True, seen0, seen1, head


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


@kernel
def zobrist(c, p):
    """The Zobrist key of a c stone at point p: splitmix64 (Steele et al.) of the pair, computed
    rather than read from a [colour, point] table. A table is a constant array, and numba-cuda
    gives each device function that reads one its own copy: the five that play a move took
    the play kernel past the GPU's 64 KiB of constant memory (13 KiB each). Distinct and
    non-zero for every (colour, point) of a 19x19 board (tested)."""
    z = np.uint64((np.int64(p) << 2) | np.int64(c)) * _GOLDEN + _ZOBRIST_SEED
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@kernel
def _hash_after(b, g, p, c, suicide):
    """The hash after c plays at p: its captures removed, or its own groups if it is a suicide."""
    stride = b.stride
    removed = c if suicide else 3 - c
    h = b.hash[g] ^ zobrist(c, p)
    seen0 = -1
    seen1 = -1
    seen2 = -1
    for q in (p - stride, p - 1, p + 1, p + stride):
        if b.color[g, q] != removed:
            continue
        head = np.int64(b.group_head[g, q])
        new, seen0, seen1, seen2 = _first_sighting(head, seen0, seen1, seen2)
        if not new or (not suicide and b.group_libs[g, head] != 1):
            continue
        s = head
        while True:
            h ^= zobrist(removed, s)
            s = np.int64(b.group_next[g, s])
            if s == head:
                break
    if suicide:
        h ^= zobrist(c, p)
    return h


@kernel
def legality(b, g, p, c):
    """LEGAL if c may play at p now (PASS always may, while the move history has room), else
    the ILLEGAL_* reason."""
    if b.move_count[g] >= b.moves.shape[1]:
        return ILLEGAL_GAME_FULL
    if p == PASS:
        return LEGAL
    if p < 0 or p >= b.color.shape[1]:
        return ILLEGAL_OFF_BOARD
    here = b.color[g, p]
    if here == WALL:
        return ILLEGAL_OFF_BOARD
    if here != EMPTY:
        return ILLEGAL_OCCUPIED
    if p == b.ko_point[g] and c == b.ko_color[g]:
        return ILLEGAL_KO
    stride = b.stride
    opp = 3 - c
    suicide = True
    has_friend = False
    for q in (p - stride, p - 1, p + 1, p + stride):
        qc = b.color[g, q]
        if qc == EMPTY:
            suicide = False
        elif qc == c:
            has_friend = True
            if b.group_libs[g, b.group_head[g, q]] > 1:
                suicide = False
        elif qc == opp:
            if b.group_libs[g, b.group_head[g, q]] == 1:
                suicide = False
    # A lone stone with no liberty is never legal; a group's suicide only where the rules allow.
    if suicide and (not has_friend or b.rules[g, RULE_SUICIDE] == 0):
        return ILLEGAL_SUICIDE
    if b.rules[g, RULE_KO] != KO_SIMPLE:
        key = _history_key(b, g, _hash_after(b, g, p, c, suicide), opp)
        if _history_contains(b, g, key):
            return ILLEGAL_SUPERKO
    return LEGAL


@kernel
def _merge_groups(b, g, head_a, head_b, c):
    """Merge two groups of colour c; the larger keeps its head. Returns the surviving head."""
    if b.group_size[g, head_a] < b.group_size[g, head_b]:
        head_a, head_b = head_b, head_a
    stride = b.stride
    b.group_size[g, head_a] += b.group_size[g, head_b]
    # Liberties of the smaller group not already liberties of the larger one. Stones are
    # relabelled as we go, so a point next to two stones of the smaller group counts once.
    new_libs = 0
    s = head_b
    while True:
        for q in (s - stride, s - 1, s + 1, s + stride):
            if b.color[g, q] == EMPTY and not touches_group(b, g, q, head_a, c):
                new_libs += 1
        b.group_head[g, s] = head_a
        s = np.int64(b.group_next[g, s])
        if s == head_b:
            break
    b.group_libs[g, head_a] += new_libs
    # Splice the two circular lists.
    after_b = b.group_next[g, head_b]
    b.group_next[g, head_b] = b.group_next[g, head_a]
    b.group_next[g, head_a] = after_b
    return head_a


@kernel
def _remove_group(b, g, start):
    """Take the group at `start` off the board; returns the number of stones removed."""
    c = b.color[g, start]
    opp = 3 - c
    stride = b.stride
    removed = 0
    s = start
    while True:
        b.color[g, s] = EMPTY
        b.hash[g] ^= zobrist(c, s)
        removed += 1
        # The emptied point is a new liberty of each distinct neighbouring opponent group.
        seen0 = -1
        seen1 = -1
        seen2 = -1
        for q in (s - stride, s - 1, s + 1, s + stride):
            if b.color[g, q] == opp:
                head = np.int64(b.group_head[g, q])
                new, seen0, seen1, seen2 = _first_sighting(head, seen0, seen1, seen2)
                if new:
                    b.group_libs[g, head] += 1
        s = np.int64(b.group_next[g, s])
        if s == start:
            break
    return removed


@kernel
def place_stone(b, g, p, c):
    """Put c's stone at p with its captures (and a legal group suicide); updates the ko point."""
    stride = b.stride
    opp = 3 - c
    b.color[g, p] = c
    b.group_head[g, p] = p
    b.group_next[g, p] = p
    b.group_size[g, p] = 1
    libs = 0
    for q in (p - stride, p - 1, p + 1, p + stride):
        if b.color[g, q] == EMPTY:
            libs += 1
    b.group_libs[g, p] = libs
    b.hash[g] ^= zobrist(c, p)

    captured = 0
    ko_candidate = NO_POINT
    seen0 = -1
    seen1 = -1
    seen2 = -1
    for q in (p - stride, p - 1, p + 1, p + stride):
        qc = b.color[g, q]
        if qc == c:
            head = np.int64(b.group_head[g, q])
            own = np.int64(b.group_head[g, p])
            if head == own:
                continue
            b.group_libs[g, head] -= 1  # p was its liberty
            _merge_groups(b, g, head, own, c)
        elif qc == opp:
            head = np.int64(b.group_head[g, q])
            new, seen0, seen1, seen2 = _first_sighting(head, seen0, seen1, seen2)
            if not new:
                continue
            b.group_libs[g, head] -= 1
            if b.group_libs[g, head] == 0:
                captured += _remove_group(b, g, q)
                ko_candidate = q
    b.captures[g, c] += captured

    own = np.int64(b.group_head[g, p])
    # A ko: one stone captured by a lone stone that is itself left in atari.
    if captured == 1 and b.group_size[g, own] == 1 and b.group_libs[g, own] == 1:
        b.ko_point[g] = ko_candidate
        b.ko_color[g] = opp
    else:
        b.ko_point[g] = NO_POINT
    if b.group_libs[g, own] == 0:
        b.captures[g, opp] += _remove_group(b, g, p)


@kernel
def _record_move(b, g, p, c):
    m = b.move_count[g]
    b.moves[g, m] = p
    b.move_colors[g, m] = c
    b.move_count[g] = m + 1
    b.to_move[g] = 3 - c
    if p == PASS:
        b.passes[g] += 1
        b.ko_point[g] = NO_POINT
    else:
        b.passes[g] = 0
    if b.rules[g, RULE_KO] != KO_SIMPLE:
        _history_insert(b, g, _history_key(b, g, b.hash[g], 3 - c))


@kernel
def play(b, g, p, c):
    """c plays p (a point or PASS) in game g if legal; returns LEGAL or the reason it is not."""
    status = legality(b, g, p, c)
    if status == LEGAL:
        play_legal(b, g, p, c)
    return status


@kernel
def ko_key(ko_point, ko_color):
    """A position's ko ban as one number: the banned point and the colour it binds, or -1 for
    none (the colour of a lifted ban is stale and not part of it)."""
    if ko_point == NO_POINT:
        return np.int32(-1)
    return np.int32(np.int64(ko_point) * 4 + np.int64(ko_color))


@kernel
def past_key(b, g, k):
    """(stones' hash, ko_key) of game g's position after its first k moves, for k from
    move_count - 2 to move_count (the current position), what replay_position(b, g, .., k)
    would rebuild, without rebuilding it."""
    if k == b.move_count[g]:
        return b.hash[g], ko_key(b.ko_point[g], b.ko_color[g])
    return b.past_hash[g, k % 2], b.past_ko[g, k % 2]


@kernel
def play_legal(b, g, p, c):
    """c plays p, known to be legal (from `legality`) with room left in the move history."""
    m = b.move_count[g]
    b.past_hash[g, m % 2] = b.hash[g]
    b.past_ko[g, m % 2] = ko_key(b.ko_point[g], b.ko_color[g])
    if p != PASS:
        place_stone(b, g, p, c)
    _record_move(b, g, p, c)


@kernel
def setup_stone(b, g, p, c):
    """Add a stone before any move (handicap, SGF AB/AW): it may not capture, may not be without
    a liberty, and is not recorded as a move."""
    if b.move_count[g] > 0:
        return ILLEGAL_SETUP
    if p <= 0 or p >= b.color.shape[1] or b.color[g, p] == WALL:
        return ILLEGAL_OFF_BOARD
    if b.color[g, p] != EMPTY:
        return ILLEGAL_OCCUPIED
    stride = b.stride
    has_liberty = False
    for q in (p - stride, p - 1, p + 1, p + stride):
        qc = b.color[g, q]
        if qc == EMPTY or (qc == c and b.group_libs[g, b.group_head[g, q]] > 1):
            has_liberty = True
        elif qc == 3 - c and b.group_libs[g, b.group_head[g, q]] == 1:
            return ILLEGAL_SETUP
    if not has_liberty:
        return ILLEGAL_SETUP
    place_stone(b, g, p, c)
    b.setup[g, p] = c
    b.ko_point[g] = NO_POINT
    reset_history(b, g)
    return LEGAL


@kernel
def set_to_move(b, g, c):
    b.to_move[g] = c
    if b.move_count[g] == 0:
        reset_history(b, g)


@kernel
def recompute_hash(b, g):
    """The Zobrist hash computed from the stones alone (the incremental one must equal it)."""
    h = EMPTY_BOARD_HASH
    for p in range(b.color.shape[1]):
        c = b.color[g, p]
        if c == BLACK or c == WHITE:
            h ^= zobrist(c, p)
    return h


@kernel
def copy_game(src, gs, dst, gd):
    """Copy game gs of `src` into slot gd of `dst` (same layout and limits)."""
    if src.color is dst.color and gs == gd:
        return  # clearing the destination's history would clear the source's
    dst.size[gd] = src.size[gs]
    for i in range(src.rules.shape[1]):
        dst.rules[gd, i] = src.rules[gs, i]
    for p in range(src.color.shape[1]):
        dst.color[gd, p] = src.color[gs, p]
        dst.group_head[gd, p] = src.group_head[gs, p]
        dst.group_next[gd, p] = src.group_next[gs, p]
        dst.group_size[gd, p] = src.group_size[gs, p]
        dst.group_libs[gd, p] = src.group_libs[gs, p]
        dst.setup[gd, p] = src.setup[gs, p]
    dst.to_move[gd] = src.to_move[gs]
    dst.ko_point[gd] = src.ko_point[gs]
    dst.ko_color[gd] = src.ko_color[gs]
    dst.passes[gd] = src.passes[gs]
    n = src.move_count[gs]
    dst.move_count[gd] = n
    for m in range(n):
        dst.moves[gd, m] = src.moves[gs, m]
        dst.move_colors[gd, m] = src.move_colors[gs, m]
    for c in range(3):
        dst.captures[gd, c] = src.captures[gs, c]
    dst.hash[gd] = src.hash[gs]
    for k in range(2):
        dst.past_hash[gd, k] = src.past_hash[gs, k]
        dst.past_ko[gd, k] = src.past_ko[gs, k]
    for i in range(dst.history_count[gd]):
        dst.history[gd, dst.history_slots[gd, i]] = 0
    count = src.history_count[gs]
    for i in range(count):
        slot = src.history_slots[gs, i]
        dst.history[gd, slot] = src.history[gs, slot]
        dst.history_slots[gd, i] = slot
    dst.history_count[gd] = count


@kernel
def replay_position(src, gs, dst, gd, upto):
    """Rebuild in slot gd of `dst` the stones of game gs after its first `upto` moves (setup
    stones first): colours, groups, liberties, captures, hash and the simple-ko point. The move
    list and the superko history of `dst` are left alone (`dst` may be made with few moves)."""
    dst.size[gd] = src.size[gs]
    for i in range(src.rules.shape[1]):
        dst.rules[gd, i] = src.rules[gs, i]
    for p in range(src.color.shape[1]):
        dst.color[gd, p] = WALL if src.color[gs, p] == WALL else EMPTY
        dst.group_head[gd, p] = 0
        dst.group_next[gd, p] = 0
        dst.group_size[gd, p] = 0
        dst.group_libs[gd, p] = 0
        dst.setup[gd, p] = src.setup[gs, p]
    for c in range(3):
        dst.captures[gd, c] = 0
    dst.hash[gd] = EMPTY_BOARD_HASH
    for p in range(src.color.shape[1]):
        c = src.setup[gs, p]
        if c != EMPTY:
            place_stone(dst, gd, p, c)
    dst.ko_point[gd] = NO_POINT
    # Who moves first: the colour of the first move, else the side to move now.
    c = src.move_colors[gs, 0] if src.move_count[gs] > 0 else src.to_move[gs]
    passes = 0
    for m in range(upto):
        p = src.moves[gs, m]
        c = src.move_colors[gs, m]
        if p == PASS:
            dst.ko_point[gd] = NO_POINT
            passes += 1
        else:
            place_stone(dst, gd, p, c)
            passes = 0
        c = 3 - c
    dst.to_move[gd] = c
    dst.passes[gd] = passes


@kernel
def is_eye(b, g, p, c):
    """Whether empty p is a real-looking eye of c: all neighbours c's, enough diagonals c's."""
    stride = b.stride
    if b.color[g, p] != EMPTY:
        return False
    on_edge = False
    for q in (p - stride, p - 1, p + 1, p + stride):
        qc = b.color[g, q]
        if qc == WALL:
            on_edge = True
        elif qc != c:
            return False
    bad = 0
    for q in (p - stride - 1, p - stride + 1, p + stride - 1, p + stride + 1):
        qc = b.color[g, q]
        if qc == 3 - c:
            bad += 1
    # In the middle one opposing diagonal is tolerated; on the edge none.
    return bad == 0 if on_edge else bad <= 1


@kernel
def legal_row(b, g, c, out):
    """out[p] = whether c may play p, for every p of the layout (out[PASS]: whether c may pass,
    which is only refused when the move history is full)."""
    for p in range(b.color.shape[1]):
        out[p] = b.color[g, p] == EMPTY and legality(b, g, p, c) == LEGAL
    out[PASS] = legality(b, g, PASS, c) == LEGAL


@kernel
def fill_regions(b, g, dead, seki, owner):
    """Who owns each point, Tromp-Taylor style, with `dead` stones taken off first.

    owner[p] is BLACK or WHITE for a living stone and for an empty region (dead stones'
    points included) bordered by that colour only, EMPTY for dame and walls. Returns the
    territory of (BLACK, WHITE): the points of owned regions that touch no stone marked `seki`.
    """
    stride = b.stride
    stack = b.scratch
    n_points = b.color.shape[1]
    for p in range(n_points):
        owner[p] = _UNSEEN
    black_territory = 0
    white_territory = 0
    for p in range(n_points):
        if owner[p] != _UNSEEN:
            continue
        c = b.color[g, p]
        if c == WALL:
            owner[p] = EMPTY
            continue
        if (c == BLACK or c == WHITE) and not dead[p]:
            owner[p] = c
            continue
        # Flood the region of empty and dead points from p; stack[g, :top] ends up holding it.
        owner[p] = _QUEUED
        stack[g, 0] = p
        top = 1
        i = 0
        borders = 0
        touches_seki = False
        while i < top:
            s = np.int64(stack[g, i])
            i += 1
            for q in (s - stride, s - 1, s + 1, s + stride):
                qc = b.color[g, q]
                if qc == WALL:
                    continue
                if qc == EMPTY or dead[q]:
                    if owner[q] == _UNSEEN:
                        owner[q] = _QUEUED
                        stack[g, top] = q
                        top += 1
                else:
                    borders |= qc  # BLACK = 1, WHITE = 2: the bits say who borders
                    if seki[q]:
                        touches_seki = True
        region_owner = borders if borders == BLACK or borders == WHITE else EMPTY
        for j in range(top):
            owner[stack[g, j]] = region_owner
        if not touches_seki:
            if region_owner == BLACK:
                black_territory += top
            elif region_owner == WHITE:
                white_territory += top
    return black_territory, white_territory


@kernel
def score(b, g, dead, seki, owner):
    """Final score from Black's side (Black's points - White's points - komi) under g's rules.

    Area scoring counts living stones and owned regions; territory scoring counts owned
    regions that touch no seki group, plus prisoners (captures and dead stones).
    """
    black_territory, white_territory = fill_regions(b, g, dead, seki, owner)
    komi = b.rules[g, RULE_KOMI_HALVES] * 0.5
    if b.rules[g, RULE_SCORING] == SCORING_TERRITORY:
        dead_black = 0
        dead_white = 0
        for p in range(b.color.shape[1]):
            if dead[p]:
                if b.color[g, p] == BLACK:
                    dead_black += 1
                elif b.color[g, p] == WHITE:
                    dead_white += 1
        black = black_territory + b.captures[g, BLACK] + dead_white
        white = white_territory + b.captures[g, WHITE] + dead_black
        return black - white - komi
    black = 0
    white = 0
    for p in range(b.color.shape[1]):
        if owner[p] == BLACK:
            black += 1
        elif owner[p] == WHITE:
            white += 1
    return black - white - komi


# ---------------------------------------------------------------------------------------------
# Batched drivers: one call steps every game of the batch, spread over cores.
# ---------------------------------------------------------------------------------------------


@per_game("reset")
def reset_step(g, b):
    reset(b, g)


@per_game("play")
def play_step(g, b, moves, status):
    status[g] = play(b, g, moves[g], b.to_move[g])


@per_game("legal")
def legal_step(g, b, out):
    legal_row(b, g, b.to_move[g], out[g])


@per_game("play_some")
def play_some_step(g, b, moves, which):
    if which[g]:
        play(b, g, moves[g], b.to_move[g])


@per_game("score")
def score_step(g, b, dead, seki, owner, out):
    out[g] = score(b, g, dead[g], seki[g], owner[g])


@batched
def reset_all(b: Boards, *, on=CPU) -> None:
    """Clear every game (to its own size), black to move."""
    on.run(reset_step, b.games, b)


@batched
def play_all(b: Boards, moves, *, on=CPU):
    """Every game g plays moves[g] ([G] padded points, PASS = 0) for its side to move.

    Returns [G] int32 statuses: LEGAL, or why the move was refused (that game is unchanged).
    """
    status = on.output(b.games, np.int32)
    on.run(play_step, b.games, b, on.array(moves, np.int64), status)
    return status


@batched
def legal_all(b: Boards, *, on=CPU):
    """[G, A] bool: whether each game's side to move may play each point (column PASS: pass)."""
    out = on.output(b.color.shape, np.bool_)
    on.run(legal_step, b.games, b, out)
    return out


def play_some(b: Boards, moves: np.ndarray, which: np.ndarray) -> None:
    """Game g plays moves[g] (its player to move) where which[g]."""
    CPU.run(play_some_step, b.games, b, CPU.array(moves, np.int64), CPU.array(which, np.bool_))


def score_all(
    b: Boards, dead: np.ndarray | None = None, seki: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Scores of every game from Black's side ([G] float64) and the owner of each point ([G, A]
    int8), with optional [G, A] bool marks of dead and seki stones.
    """
    no_marks = np.zeros(b.color.shape, np.bool_)
    dead = no_marks if dead is None else dead
    seki = no_marks if seki is None else seki
    owner = np.zeros(b.color.shape, np.int8)
    out = np.zeros(b.games, np.float64)
    CPU.run(score_step, b.games, b, dead, seki, owner, out)
    return out, owner
