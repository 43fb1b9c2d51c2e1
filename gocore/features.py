"""The network's inputs (the KataGo paper's Appendix A.1): 18 planes and 10 global values per
position, ladders read by search, pass-alive area by Benson's algorithm, the 8 symmetries, and
the bit-packed form of the planes that training rows store.

Planes, from the view of the player to move ("own"); a board smaller than the tensor sits in
its top-left corner and plane ON_BOARD says where it is:

    0  ON_BOARD          the point is on this game's board
    1  OWN, 2 OPPONENT   stones
    3  LIBERTIES_1 .. 5 LIBERTIES_3   stones of groups with exactly 1, 2, 3 liberties
    6  KO_BANNED         empty points the player to move may not play because of ko or superko
    7  LAST_MOVE .. 11   where the last 5 moves were played (7: the latest; passes mark nothing)
    12 LADDERED .. 14    stones that can be captured in a ladder now, 1 turn ago, 2 turns ago
    15 LADDER_CATCH      moves that start a working ladder on an opponent group of 2 liberties
    16 OWN_PASS_ALIVE, 17 OPPONENT_PASS_ALIVE   pass-alive stones and the regions they enclose

Globals: 0..4 whether each of the last 5 moves was a pass; 5 komi for the player to move / 20;
6, 7 the ko rule (simple 0, 0; positional 1, 0.5; situational 1, -0.5); 8 multi-stone suicide
allowed; 9 territory scoring.

Ladders. A group in atari is "laddered" if, with the defender to move, the attacker captures it
by ataris alone; a group with 2 liberties is laddered if some attacker move on one of them
leads to that (those moves are the LADDER_CATCH points). The defender's replies are its
liberty and every capture of an adjacent attacker group in atari, so ladder breakers and
escapes by capturing come out of the reading. The reader is a depth-first search with an
explicit stack (no recursion) on a colours-only copy of the board: liberties are counted by
flood fill and a move is undone by restoring the stones it captured. A ladder that needs a ko
is not counted (the defender is assumed to win kos), and a search over its depth or node budget
counts as an escape. A search is not started where its answer is known: the defender's
extension to its liberty would give 3 liberties or more.

Pass-alive area (Benson 1976): chains of a colour with at least two vital regions, iterated to
a fixed point, plus the regions they enclose that have at most one point not next to one of
their stones. Such stones cannot be captured even if their owner passes forever.

Every kernel here is a per-game function over arrays, as in gocore.board, so the same source
compiles for the CPU and as CUDA device code (gocore.cuda).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from gocore.board import (
    BLACK,
    EMPTY,
    ILLEGAL_KO,
    ILLEGAL_SUPERKO,
    LEGAL,
    NO_POINT,
    PASS,
    WALL,
    WHITE,
    Boards,
    legality,
    new_boards,
    past_key,
    place_stone,
    replay_position,
    touches_group,
)
from gocore.jit import CPU, batched, kernel, per_game, routine
from gocore.rules import (
    KO_POSITIONAL,
    KO_SITUATIONAL,
    RULE_KO,
    RULE_KOMI_HALVES,
    RULE_SCORING,
    RULE_SUICIDE,
    SCORING_TERRITORY,
)

N_PLANES = 18
N_GLOBALS = 10

ON_BOARD = 0
OWN = 1
OPPONENT = 2
LIBERTIES_1 = 3
LIBERTIES_2 = 4
LIBERTIES_3 = 5
KO_BANNED = 6
LAST_MOVE = 7  # 7..11: the last five moves, latest first
LADDERED = 12  # 12..14: now, 1 turn ago, 2 turns ago
LADDER_CATCH = 15
OWN_PASS_ALIVE = 16
OPPONENT_PASS_ALIVE = 17

LAST_PASS = 0  # globals 0..4
KOMI = 5
KO_RULE = 6  # 6, 7
SUICIDE = 8
TERRITORY = 9

KOMI_SCALE = 20.0  # komi 7.5 -> 0.375
SYMMETRIES = 8

# Ladder reading bounds: plies deep (a ladder across a 19x19 board is about 70) and nodes per
# search (a long ladder with breakers to check is a few hundred).
LADDER_MAX_DEPTH = 160
LADDER_MAX_NODES = 3000
LADDER_MAX_OPTIONS = 8  # moves tried per node: the defender's captures and its liberty
# Positions whose ladders the encoder remembers, per row of a batch (`remember_ladders`): a
# group of rows that share a memo (a game's leaves) has this many entries per row.
LADDER_MEMO = 16

# Pass-alive area bits (FeatureWork.area).
AREA_BLACK = 1
AREA_WHITE = 2


class FeatureWork(NamedTuple):
    """Per-game work space of the encoder, made once per batch by `new_work` (A = layout area,
    D = LADDER_MAX_DEPTH, Q = the groups of rows that share a memo of ladders, M = LADDER_MEMO
    x the rows a group). Nothing here outlives one call but the memo of positions' ladders,
    which is keyed by the position itself, and the current positions' ladders waiting to join
    it."""

    past: Boards  # [G] the position 1 and 2 turns ago, rebuilt by replaying the moves
    color: np.ndarray  # [G, A] int8 the ladder reader's board (colours only)
    mark: np.ndarray  # [G, A] int32 flood-fill visit stamps; [g, 0] the last stamp used
    fill: np.ndarray  # [G, A] int16 flood-fill stack
    chain: np.ndarray  # [G, A] int16 stones of the chain being walked
    adjacent: np.ndarray  # [G, A] int16 opposing stones next to it
    captured: np.ndarray  # [G, A + D] int16 stones taken by reader moves, for undo
    node_moves: np.ndarray  # [G, D, LADDER_MAX_OPTIONS] int16 moves to try at each depth
    node_count: np.ndarray  # [G, D] int16 how many
    node_next: np.ndarray  # [G, D] int16 the move being tried, -1 before any
    node_captured: np.ndarray  # [G, D + 1] int32 start of each depth's entries in `captured`
    node_ko: np.ndarray  # [G, D] int16 the ko point before the move at this depth
    laddered: np.ndarray  # [G, A] int8 work marks of one position's laddered chains
    region: np.ndarray  # [G, A] int16 Benson: the region of each empty or opponent point
    region_vital: np.ndarray  # [G, A, 4] int16 chains (heads) a region is vital to
    region_vital_count: np.ndarray  # [G, A] int8
    region_inside: np.ndarray  # [G, A] int8 points not next to the colour's stones (max 2)
    region_borders: np.ndarray  # [G, A] int8 whether the region touches the colour's stones
    region_spoiled: np.ndarray  # [G, A] int8 whether it borders a chain found not alive
    heads: np.ndarray  # [G, A] int16 the colour's chain heads
    alive: np.ndarray  # [G, A] int8 at a head: still alive in Benson's iteration
    vital_count: np.ndarray  # [G, A] int16 at a head: vital regions counted this round
    area: np.ndarray  # [G, A] int8 pass-alive area bits AREA_BLACK | AREA_WHITE
    memo_hash: np.ndarray  # [Q, M] uint64 the stones' hash of a position whose ladders are kept
    memo_tag: np.ndarray  # [Q, M] int64 its board size, ko point and ko colour; -1: no entry
    memo_marks: np.ndarray  # [Q, M, A] int8 its laddered stones
    memo_used: np.ndarray  # [Q, M] int64 the group's call that last used the entry
    memo_work: np.ndarray  # [Q, M] int32 its read's work: the flood fills encode's read takes
    memo_clock: np.ndarray  # [Q] int64 the group's calls so far
    past_entry: np.ndarray  # [G, 2] int16 the entries of the positions 2 and 1 turns ago
    past_reads: np.ndarray  # [G] int64 positions 1 or 2 turns ago read (not in the memo), ever
    now_hash: np.ndarray  # [G] uint64 the position the row last encoded (its stones' hash)
    now_tag: np.ndarray  # [G] int64 as memo_tag; -1: none waiting to join the memo
    now_marks: np.ndarray  # [G, A] int8 its laddered stones
    now_work: np.ndarray  # [G] int32 its read's flood fills
    row_work: np.ndarray  # [G] int32 its read's expected work: its parent's (encode_order)
    ladder_nodes: int  # node budget of one ladder search


def new_work(b: Boards, *, ladder_nodes: int = LADDER_MAX_NODES, share: int = 1) -> FeatureWork:
    """The encoder's work space for batch `b` (about 32 KB a row on 19x19, 7 KB of it the
    memo); reusable for any batch of the same shape. Each `share` consecutive rows (a game's
    leaves) share one memo of positions' ladders: a leaf's positions 1 and 2 turns ago are
    mostly ones its game's other leaves, or the leaf's parent, were before."""
    games, area = b.color.shape
    if share < 1 or games % share:
        raise ValueError(f"share={share}: the {games} rows must split into groups of {share}")
    if LADDER_MEMO * share > np.iinfo(np.int16).max:  # past_entry's type
        raise ValueError(f"share={share}: at most {np.iinfo(np.int16).max // LADDER_MEMO} rows")
    groups, entries = games // share, LADDER_MEMO * share
    depth = LADDER_MAX_DEPTH
    return FeatureWork(
        past=new_boards(games, b.size, b.rules, layout=b.layout, max_moves=1),
        color=np.zeros((games, area), np.int8),
        mark=np.zeros((games, area), np.int32),
        fill=np.zeros((games, area), np.int16),
        chain=np.zeros((games, area), np.int16),
        adjacent=np.zeros((games, area), np.int16),
        captured=np.zeros((games, area + depth), np.int16),
        node_moves=np.zeros((games, depth, LADDER_MAX_OPTIONS), np.int16),
        node_count=np.zeros((games, depth), np.int16),
        node_next=np.zeros((games, depth), np.int16),
        node_captured=np.zeros((games, depth + 1), np.int32),
        node_ko=np.zeros((games, depth), np.int16),
        laddered=np.zeros((games, area), np.int8),
        region=np.zeros((games, area), np.int16),
        region_vital=np.zeros((games, area, 4), np.int16),
        region_vital_count=np.zeros((games, area), np.int8),
        region_inside=np.zeros((games, area), np.int8),
        region_borders=np.zeros((games, area), np.int8),
        region_spoiled=np.zeros((games, area), np.int8),
        heads=np.zeros((games, area), np.int16),
        alive=np.zeros((games, area), np.int8),
        vital_count=np.zeros((games, area), np.int16),
        area=np.zeros((games, area), np.int8),
        memo_hash=np.zeros((groups, entries), np.uint64),
        memo_tag=np.full((groups, entries), -1, np.int64),
        memo_marks=np.zeros((groups, entries, area), np.int8),
        memo_used=np.zeros((groups, entries), np.int64),
        memo_work=np.zeros((groups, entries), np.int32),
        memo_clock=np.zeros(groups, np.int64),
        past_entry=np.full((games, 2), -1, np.int16),
        past_reads=np.zeros(games, np.int64),
        now_hash=np.zeros(games, np.uint64),
        now_tag=np.full(games, -1, np.int64),
        now_marks=np.zeros((games, area), np.int8),
        now_work=np.zeros(games, np.int32),
        row_work=np.zeros(games, np.int32),
        ladder_nodes=ladder_nodes,
    )


# ---------------------------------------------------------------------------------------------
# Symmetries
# ---------------------------------------------------------------------------------------------


@kernel
def symmetric_xy(x, y, n, sym):
    """Where (x, y) of an n x n board goes under symmetry `sym` (0..7): bit 0 mirrors x, bit 1
    mirrors y, bit 2 then transposes. 0 is the identity."""
    if sym & 1:
        x = n - 1 - x
    if sym & 2:
        y = n - 1 - y
    if sym & 4:
        return y, x
    return x, y


@kernel
def _set_plane(planes, plane, stride, n, sym, p):
    x, y = symmetric_xy(p % stride - 1, p // stride - 1, n, sym)
    planes[plane, y, x] = 1.0


# ---------------------------------------------------------------------------------------------
# The ladder reader: a colours-only board with flood-fill liberties and undo
#
# Its hot helpers take rows of the work space (one game's arrays), not the tuples. `mark` holds
# flood-fill visit stamps; its cell 0 (always a wall, never visited) holds the last stamp used.
# ---------------------------------------------------------------------------------------------


@kernel
def _new_stamp(mark):
    s = mark[0] + 1
    mark[0] = s
    return s


@kernel
def _chain_liberties(color, mark, fill, stride, p, limit):
    """Liberties of the reader's chain at p, counted up to `limit`: (count, first, second)."""
    c = color[p]
    s = _new_stamp(mark)
    mark[p] = s
    fill[0] = p
    top = 1
    i = 0
    count = 0
    first = NO_POINT
    second = NO_POINT
    while i < top:
        q = np.int64(fill[i])
        i += 1
        for r in (q - stride, q - 1, q + 1, q + stride):
            if mark[r] == s:
                continue
            rc = color[r]
            if rc == EMPTY:
                mark[r] = s
                if count == 0:
                    first = r
                elif count == 1:
                    second = r
                count += 1
                if count >= limit:
                    return count, first, second
            elif rc == c:
                mark[r] = s
                fill[top] = r
                top += 1
    return count, first, second


@kernel
def _reader_remove(color, captured, stride, p, top):
    """Take the reader's chain at p off the board, logging its stones from captured[top];
    returns the new top."""
    c = color[p]
    color[p] = EMPTY
    captured[top] = p
    i = top
    top += 1
    while i < top:
        q = np.int64(captured[i])
        i += 1
        for r in (q - stride, q - 1, q + 1, q + stride):
            if color[r] == c:
                color[r] = EMPTY
                captured[top] = r
                top += 1
    return top


@kernel
def _reader_undo(color, captured, p, c, start, top):
    """Take back c's move at p and put back the stones it captured (captured[start:top])."""
    color[p] = EMPTY
    for i in range(start, top):
        color[captured[i]] = 3 - c


@routine
def _reader_legal(color, mark, fill, stride, p, c, ko):
    """Whether c may play p on the reader's board (simple ko; a suicide is never tried)."""
    if color[p] != EMPTY or p == ko:
        return False
    for q in (p - stride, p - 1, p + 1, p + stride):
        if color[q] == EMPTY:
            return True  # before any chain's liberties are counted
    for q in (p - stride, p - 1, p + 1, p + stride):
        qc = color[q]
        if qc == c or qc == 3 - c:
            libs, _, _ = _chain_liberties(color, mark, fill, stride, q, 2)
            if qc == c and libs >= 2:
                return True  # connects to a chain with another liberty
            if qc != c and libs == 1:
                return True  # captures
    return False


@routine
def _reader_play(color, mark, fill, captured, stride, p, c, top):
    """c plays p (legal) on the reader's board, logging captures from captured[top].
    Returns (new top, the ko point the move leaves or NO_POINT)."""
    color[p] = c
    start = top
    for q in (p - stride, p - 1, p + 1, p + stride):
        if color[q] == 3 - c:
            libs, _, _ = _chain_liberties(color, mark, fill, stride, q, 1)
            if libs == 0:
                top = _reader_remove(color, captured, stride, q, top)
    ko = NO_POINT
    if top - start == 1:
        lone = True
        for q in (p - stride, p - 1, p + 1, p + stride):
            if color[q] == c:
                lone = False
        if lone:
            libs, _, _ = _chain_liberties(color, mark, fill, stride, p, 2)
            if libs == 1:
                ko = np.int64(captured[start])
    return top, ko


@kernel
def _open_sides(color, stride, p, besides):
    """How many of p's neighbours other than `besides` are empty on the reader's board."""
    n = 0
    for q in (p - stride, p - 1, p + 1, p + stride):
        if q != besides and color[q] == EMPTY:
            n += 1
    return n


@routine
def _extends_to_three(color, mark, fill, stride, target, lib):
    """Whether the reader's chain at `target`, whose one liberty is `lib` and whose stones the
    last flood fill marked, has 3 liberties or more once its owner plays `lib` (captures left
    out: they only add). The empty points around `lib` answer it without a fill unless the
    move joins another chain of the owner's."""
    c = color[target]
    s = mark[0]  # the stamp of the fill that walked the chain
    joins = False
    for q in (lib - stride, lib - 1, lib + 1, lib + stride):
        if color[q] == c and mark[q] != s:
            joins = True
    if not joins:
        return _open_sides(color, stride, lib, NO_POINT) >= 3
    color[lib] = c
    libs, _, _ = _chain_liberties(color, mark, fill, stride, target, 3)
    color[lib] = EMPTY
    return libs >= 3


@routine
def _defender_options(color, mark, fill, chain, adjacent, options, stride, target):
    """The defender's moves: captures of adjacent attacker chains in atari (each gains
    liberties), then its own liberty. Writes them to `options`; returns how many."""
    c = color[target]
    # Walk the target chain; the attacker stones next to it go to `adjacent`.
    s = _new_stamp(mark)
    mark[target] = s
    chain[0] = target
    top = 1
    i = 0
    n_adjacent = 0
    liberty = NO_POINT
    while i < top:
        q = np.int64(chain[i])
        i += 1
        for r in (q - stride, q - 1, q + 1, q + stride):
            if mark[r] == s:
                continue
            rc = color[r]
            if rc == c:
                mark[r] = s
                chain[top] = r
                top += 1
            elif rc == EMPTY:
                liberty = r
            elif rc == 3 - c:
                mark[r] = s
                adjacent[n_adjacent] = r
                n_adjacent += 1
    count = 0
    for k in range(n_adjacent):
        if count >= options.shape[0] - 1:
            break
        if mark[adjacent[k]] > s:
            continue  # its chain was counted from an earlier stone (a later stamp reached it)
        libs, lib, _ = _chain_liberties(color, mark, fill, stride, np.int64(adjacent[k]), 2)
        if libs != 1:
            continue
        known = False
        for j in range(count):
            if options[j] == lib:
                known = True
        if not known:
            options[count] = lib
            count += 1
    if liberty != NO_POINT:
        options[count] = liberty
        count += 1
    return count


@routine
def _ladder_captured(w, g, stride, target, log_start):
    """Whether the reader's chain at `target`, in atari with its owner to move, is captured by
    a ladder. Kos are assumed to go the defender's way. Reader moves log their captures from
    captured[log_start]. The board is left as it was."""
    color = w.color[g]
    mark = w.mark[g]
    fill = w.fill[g]
    captured = w.captured[g]
    node_moves = w.node_moves[g]
    node_count = w.node_count[g]
    node_next = w.node_next[g]
    node_captured = w.node_captured[g]
    node_ko = w.node_ko[g]
    defender = color[target]
    attacker = 3 - defender
    depth = 0
    node_next[0] = -1
    node_captured[0] = log_start
    ko = NO_POINT
    result = False
    returned = False
    nodes = 0
    while True:
        if depth < 0:
            return result
        is_defender = depth % 2 == 0
        mover = defender if is_defender else attacker
        if node_next[depth] == -1:
            nodes += 1
            if nodes > w.ladder_nodes or depth >= LADDER_MAX_DEPTH - 1:
                # Out of budget: take back the moves of depths 0..depth-1 (all that are on the
                # board when a node is entered) and call it an escape.
                for d in range(depth - 1, -1, -1):
                    d_mover = defender if d % 2 == 0 else attacker
                    move = np.int64(node_moves[d, node_next[d]])
                    start, stop = node_captured[d], node_captured[d + 1]
                    _reader_undo(color, captured, move, d_mover, start, stop)
                return False
            libs, lib0, lib1 = _chain_liberties(color, mark, fill, stride, target, 3)
            if is_defender:
                if libs >= 2 or ko != NO_POINT:
                    # Escaped, or the attacker's last move left a ko the defender can take.
                    result = False
                    returned = True
                    depth -= 1
                    continue
                if depth == 0 and _extends_to_three(color, mark, fill, stride, target, lib0):
                    # Whatever the defender tries first, the search ends in an escape (a
                    # capture that fails leaves the extension; a budget run out counts as
                    # one). Only at the root, where skipping the search changes no other
                    # node's budget.
                    return False
                node_count[depth] = _defender_options(
                    color, mark, fill, w.chain[g], w.adjacent[g], node_moves[depth], stride, target
                )
            else:
                if libs <= 1 or libs >= 3:
                    result = libs <= 1
                    returned = True
                    depth -= 1
                    continue
                node_moves[depth, 0] = lib0
                node_moves[depth, 1] = lib1
                node_count[depth] = 2
            node_next[depth] = 0
        else:
            if returned:
                move = np.int64(node_moves[depth, node_next[depth]])
                _reader_undo(
                    color, captured, move, mover, node_captured[depth], node_captured[depth + 1]
                )
                ko = np.int64(node_ko[depth])
            if (is_defender and not result) or (not is_defender and result):
                returned = True
                depth -= 1
                continue
            node_next[depth] += 1
        if node_next[depth] >= node_count[depth]:
            # No move left: the defender is caught, or the attacker found nothing.
            result = is_defender
            returned = True
            depth -= 1
            continue
        move = np.int64(node_moves[depth, node_next[depth]])
        if not _reader_legal(color, mark, fill, stride, move, mover, ko):
            result = is_defender
            returned = False
            continue
        node_ko[depth] = ko
        log = node_captured[depth]
        top, ko = _reader_play(color, mark, fill, captured, stride, move, mover, log)
        node_captured[depth + 1] = top
        depth += 1
        node_next[depth] = -1


@routine
def _ladder_catches(w, g, stride, target, ko, record, catches):
    """For the reader's chain at `target` with 2 liberties: how many of the attacker's moves on
    them start a ladder that captures it; with `record`, catches[move] = 1 for each (without,
    it stops at the first: 0 or 1)."""
    color = w.color[g]
    mark = w.mark[g]
    fill = w.fill[g]
    captured = w.captured[g]
    attacker = 3 - color[target]
    libs, lib0, lib1 = _chain_liberties(color, mark, fill, stride, target, 3)
    if libs != 2:
        return 0
    found = 0
    for move in (lib0, lib1):
        other = lib1 if move == lib0 else lib0
        if _open_sides(color, stride, other, move) >= 3:
            # The defender extends to `other` with 3 liberties or more (the attacker's move
            # can only add some, by capturing): as in _ladder_captured, no ladder.
            continue
        if not _reader_legal(color, mark, fill, stride, move, attacker, ko):
            continue
        top, _ = _reader_play(color, mark, fill, captured, stride, move, attacker, 0)
        # The defender answers first; kos are assumed to go its way.
        caught = _ladder_captured(w, g, stride, target, top)
        _reader_undo(color, captured, move, attacker, 0, top)
        if caught:
            found += 1
            if not record:
                break  # one catch is enough to call the chain laddered
            catches[move] = 1
    return found


@routine
def mark_ladders(b, g, w, catch_color, catches):
    """w.laddered[g, p] = 1 for every stone of b's game g that a ladder captures (a chain in
    atari with its owner to move, or with 2 liberties and the attacker to move). For laddered
    chains of `catch_color` with 2 liberties, catches[p] = 1 at the moves that catch them.
    Returns how many chains are laddered."""
    stride = b.stride
    n_points = b.color.shape[1]
    for p in range(n_points):
        w.color[g, p] = b.color[g, p]
        w.laddered[g, p] = 0
        w.mark[g, p] = 0
    count = 0
    for p in range(n_points):
        c = b.color[g, p]
        if (c != BLACK and c != WHITE) or b.group_head[g, p] != p:
            continue
        libs = b.group_libs[g, p]
        laddered = False
        if libs == 1:
            laddered = _ladder_captured(w, g, stride, p, 0)
        elif libs == 2:
            ko = b.ko_point[g] if b.ko_color[g] == 3 - c else NO_POINT
            record = c == catch_color
            laddered = _ladder_catches(w, g, stride, p, ko, record, catches) > 0
        if laddered:
            count += 1
            s = p
            while True:
                w.laddered[g, s] = 1
                s = np.int64(b.group_next[g, s])
                if s == p:
                    break
    return count


# ---------------------------------------------------------------------------------------------
# Pass-alive area: Benson's algorithm
# ---------------------------------------------------------------------------------------------


@routine
def mark_pass_alive(b, g, w, c, bit):
    """Set `bit` in w.area[g, p] for c's pass-alive stones and the regions they enclose.
    Returns how many of c's chains are pass-alive."""
    stride = b.stride
    n_points = b.color.shape[1]
    opp = 3 - c
    every_point_counts = b.rules[g, RULE_SUICIDE] != 0  # a region's stones can be given up
    n_regions = 0
    n_heads = 0
    for p in range(n_points):
        w.region[g, p] = -1
    for p in range(n_points):
        pc = b.color[g, p]
        if pc == c and b.group_head[g, p] == p:
            w.heads[g, n_heads] = p
            n_heads += 1
            w.alive[g, p] = 1
        if pc != EMPTY or w.region[g, p] >= 0:
            continue
        # A new region: the empty and opponent points connected to p.
        r = n_regions
        n_regions += 1
        n_vital = 0
        for q in (p - stride, p - 1, p + 1, p + stride):
            if b.color[g, q] == c:
                head = b.group_head[g, q]
                known = False
                for k in range(n_vital):
                    if w.region_vital[g, r, k] == head:
                        known = True
                if not known:
                    w.region_vital[g, r, n_vital] = head
                    n_vital += 1
        inside = 0
        borders = 0
        w.region[g, p] = r
        w.fill[g, 0] = p
        top = 1
        i = 0
        while i < top:
            s = np.int64(w.fill[g, i])
            i += 1
            # Vital to a chain: every empty point of the region is its liberty.
            if every_point_counts or b.color[g, s] == EMPTY:
                kept = 0
                for k in range(n_vital):
                    head = w.region_vital[g, r, k]
                    if touches_group(b, g, s, head, c):
                        w.region_vital[g, r, kept] = head
                        kept += 1
                n_vital = kept
            next_to_c = False
            for q in (s - stride, s - 1, s + 1, s + stride):
                qc = b.color[g, q]
                if qc == c:
                    next_to_c = True
                elif (qc == EMPTY or qc == opp) and w.region[g, q] < 0:
                    w.region[g, q] = r
                    w.fill[g, top] = q
                    top += 1
            if next_to_c:
                borders = 1
            elif inside < 2:
                inside += 1
        w.region_vital_count[g, r] = n_vital
        w.region_inside[g, r] = inside
        w.region_borders[g, r] = borders
        w.region_spoiled[g, r] = 0
    # Benson's iteration: a chain with fewer than two vital regions (not next to a chain
    # already found not alive) is not alive; repeat until nothing changes.
    while True:
        for i in range(n_heads):
            w.vital_count[g, w.heads[g, i]] = 0
        for r in range(n_regions):
            if w.region_spoiled[g, r] == 0:
                for k in range(w.region_vital_count[g, r]):
                    w.vital_count[g, w.region_vital[g, r, k]] += 1
        changed = False
        for i in range(n_heads):
            head = np.int64(w.heads[g, i])
            if w.alive[g, head] == 0 or w.vital_count[g, head] >= 2:
                continue
            w.alive[g, head] = 0
            changed = True
            s = head
            while True:
                for q in (s - stride, s - 1, s + 1, s + stride):
                    if w.region[g, q] >= 0:
                        w.region_spoiled[g, w.region[g, q]] = 1
                s = np.int64(b.group_next[g, s])
                if s == head:
                    break
        if not changed:
            break
    alive = 0
    for i in range(n_heads):
        head = np.int64(w.heads[g, i])
        if w.alive[g, head] == 0:
            continue
        alive += 1
        s = head
        while True:
            w.area[g, s] |= bit
            s = np.int64(b.group_next[g, s])
            if s == head:
                break
    for p in range(n_points):
        r = w.region[g, p]
        if (
            r >= 0
            and w.region_inside[g, r] <= 1
            and w.region_borders[g, r] == 1
            and w.region_spoiled[g, r] == 0
        ):
            w.area[g, p] |= bit
    return alive


@routine
def pass_alive_area(b, g, w):
    """w.area[g]: the pass-alive area of b's game g, AREA_BLACK and AREA_WHITE bits (0
    elsewhere), as the encoder reads it."""
    for p in range(b.color.shape[1]):
        w.area[g, p] = 0
    mark_pass_alive(b, g, w, BLACK, AREA_BLACK)
    mark_pass_alive(b, g, w, WHITE, AREA_WHITE)


@routine
def ladders_now(b, g, w, catches):
    """The encoder's read of b's game g's current position: its laddered stones in
    w.laddered[g], and catches[p] = 1 at the moves that catch an opponent of its player to move
    (0 elsewhere). Returns how many chains are laddered."""
    for p in range(catches.shape[0]):
        catches[p] = 0
    return mark_ladders(b, g, w, 3 - b.to_move[g], catches)


# ---------------------------------------------------------------------------------------------
# The encoder
# ---------------------------------------------------------------------------------------------


@routine
def _ladder_planes(b, g, w, planes, plane, n, sym, catches):
    """Mark the stones laddered in b's current position of game g on `plane` (through the
    symmetry), its catching moves in `catches` (ladders_now)."""
    stride = b.stride
    if ladders_now(b, g, w, catches) == 0:
        return
    for p in range(b.color.shape[1]):
        if w.laddered[g, p]:
            _set_plane(planes, plane, stride, n, sym, p)


@kernel
def _memo_find(w, q, key, tag):
    """The entry of group q's memo that holds the position (`key`, `tag`), or -1."""
    for i in range(w.memo_tag.shape[1]):
        if w.memo_tag[q, i] == tag and w.memo_hash[q, i] == key:
            return i
    return -1


@kernel
def _memo_store(w, q, key, tag, marks, work):
    """Put a position's laddered stones in group q's memo, in place of the entry used longest
    ago (an empty one first: never used), and return the entry. Entries used in this call of
    remember_ladders are the group's newest (at most 3 per row, of LADDER_MEMO > 3 per row), so
    none of them is replaced."""
    best = 0
    for i in range(1, w.memo_used.shape[1]):
        if w.memo_used[q, i] < w.memo_used[q, best]:
            best = i
    w.memo_hash[q, best] = key
    w.memo_tag[q, best] = tag
    for p in range(marks.shape[0]):
        w.memo_marks[q, best, p] = marks[p]
    w.memo_used[q, best] = w.memo_clock[q]
    w.memo_work[q, best] = work
    return best


@kernel
def _memo_tag(b, g, ko):
    """The memo's tag of a position of game g with ko_key `ko`: what a ladder read depends on
    besides the stones (mark_ladders), the board's size and the ko."""
    return np.int64(b.size[g]) * 262144 + ko  # ko_key < 4 * 65536


@routine
def remember_ladders(b, q, w, which):
    """Before the encoder runs on the rows of group q (its rows q * S .. q * S + S - 1) marked in
    `which`: the entries of its memo holding each row's positions 1 and 2 turns ago, in
    w.past_entry, read and remembered where the memo has not got them. First the group's
    current positions from the last call (each row's `now_*`) join the memo: a leaf is, a step
    later, the position 1 turn ago of its children, and the positions of a search's root and the
    one before it are those of a leaf of the search before. A position in the memo is neither
    rebuilt from the moves nor read. Reading ladders is most of the encoder's time; on a GPU,
    where a warp's 32 rows wait for the slowest, a read missing from a few rows costs the time
    of a read in every warp, so the rows that can share a memo do.

    One thread a group: only it writes the group's memo and its rows' past boards, so the
    encoder (a thread a row, next) reads the memo while nothing writes it. Where a read is cut
    short (its node budget, its depth, the options it tries at a node), it also depends on the
    order of a chain's linked stones and which one is its head, which two move orders reaching
    the same stones may leave different: the memo then answers with the first read.

    Each marked row's `row_work` is then the flood fills its position 1 turn ago took to read:
    a position's ladders cost about what its parent's did, so the GPU's encoder launches the
    rows in that order (encode_order)."""
    share = w.laddered.shape[0] // w.memo_tag.shape[0]
    clock = w.memo_clock[q] + 1
    w.memo_clock[q] = clock
    for g in range(q * share, q * share + share):
        tag = w.now_tag[g]
        if tag < 0:
            continue
        w.now_tag[g] = -1
        i = _memo_find(w, q, w.now_hash[g], tag)
        if i < 0:
            i = _memo_store(w, q, w.now_hash[g], tag, w.now_marks[g], w.now_work[g])
        w.memo_used[q, i] = clock
    for g in range(q * share, q * share + share):
        if not which[g]:
            continue
        m = b.move_count[g]
        for j in range(2):
            key, ko = past_key(b, g, max(m - 2 + j, 0))
            i = _memo_find(w, q, key, _memo_tag(b, g, ko))
            if i >= 0:
                w.memo_used[q, i] = clock
            w.past_entry[g, j] = i
    past = w.past
    for g in range(q * share, q * share + share):
        if not which[g]:
            continue
        m = b.move_count[g]
        built = False  # whether past[g] holds the position 2 turns ago
        for j in range(2):
            if w.past_entry[g, j] >= 0:
                continue
            k = max(m - 2 + j, 0)
            key, ko = past_key(b, g, k)
            tag = _memo_tag(b, g, ko)
            i = _memo_find(w, q, key, tag)  # another row may have read it just now
            if i < 0:
                if j == 1 and built and m >= 2:  # 1 turn ago is one move on from 2 turns ago
                    if b.moves[g, m - 2] != PASS:
                        place_stone(past, g, b.moves[g, m - 2], b.move_colors[g, m - 2])
                    else:
                        past.ko_point[g] = NO_POINT  # a pass lifts the ko ban
                else:
                    replay_position(b, g, past, g, k)
                built = True
                # Read as encode reads a current position (the catches of the opponent of its
                # player to move, who played move k, recorded in w.area[g], which ladders_now
                # clears before its own use), so that the entry's flood fills are what encode's
                # read takes.
                mover = b.move_colors[g, k] if k < m else b.to_move[g]
                mark_ladders(past, g, w, 3 - mover, w.area[g])  # resets w.laddered first
                w.past_reads[g] += 1
                i = _memo_store(w, q, key, tag, w.laddered[g], w.mark[g, 0])
            w.memo_used[q, i] = clock
            w.past_entry[g, j] = i
        w.row_work[g] = w.memo_work[q, w.past_entry[g, 1]]


@kernel
def _memo_planes(w, q, i, planes, plane, stride, n, sym, n_points):
    """Mark the stones of group q's memo entry i on `plane` (through the symmetry)."""
    for p in range(n_points):
        if w.memo_marks[q, i, p]:
            _set_plane(planes, plane, stride, n, sym, p)


@routine
def encode(b, g, w, sym, planes, glob):
    """Write game g's input planes ([N_PLANES, T, T], T >= its size) and globals ([N_GLOBALS])
    under symmetry `sym`, from the view of its player to move. remember_ladders must have run on
    g's group first (encode_all and encode_some do): the ladders 1 and 2 turns ago are the memo
    entries it left in w.past_entry[g]."""
    stride = b.stride
    n = b.size[g]
    n_points = b.color.shape[1]
    pla = b.to_move[g]
    for k in range(planes.shape[0]):
        for y in range(planes.shape[1]):
            for x in range(planes.shape[2]):
                planes[k, y, x] = 0.0
    for k in range(glob.shape[0]):
        glob[k] = 0.0

    simple_ko = b.rules[g, RULE_KO] != KO_POSITIONAL and b.rules[g, RULE_KO] != KO_SITUATIONAL
    for p in range(n_points):
        c = b.color[g, p]
        if c == WALL:
            continue
        x, y = symmetric_xy(p % stride - 1, p // stride - 1, n, sym)
        planes[ON_BOARD, y, x] = 1.0
        if c == EMPTY:
            if simple_ko:
                banned = p == b.ko_point[g] and pla == b.ko_color[g]
            else:
                status = legality(b, g, p, pla)
                banned = status == ILLEGAL_KO or status == ILLEGAL_SUPERKO
            if banned:
                planes[KO_BANNED, y, x] = 1.0
            continue
        planes[OWN if c == pla else OPPONENT, y, x] = 1.0
        libs = b.group_libs[g, b.group_head[g, p]]
        if libs <= 3:
            planes[LIBERTIES_1 + libs - 1, y, x] = 1.0

    m = b.move_count[g]
    for i in range(5):
        if m - 1 - i < 0:
            break
        p = b.moves[g, m - 1 - i]
        if p == PASS:
            glob[LAST_PASS + i] = 1.0
        else:
            _set_plane(planes, LAST_MOVE + i, stride, n, sym, p)

    # Ladders now (with the catching moves against the opponent, collected in w.area), kept
    # to join the memo at the next call; then 2 and 1 turns ago, from the memo
    # (remember_ladders found or read them).
    _ladder_planes(b, g, w, planes, LADDERED, n, sym, w.area[g])
    w.now_work[g] = w.mark[g, 0]  # the stamps mark_ladders used: one a flood fill
    for p in range(n_points):
        w.now_marks[g, p] = w.laddered[g, p]
        if w.area[g, p]:
            _set_plane(planes, LADDER_CATCH, stride, n, sym, p)
            w.area[g, p] = 0
    key, ko = past_key(b, g, m)
    w.now_hash[g] = key
    w.now_tag[g] = _memo_tag(b, g, ko)
    q = g // (w.laddered.shape[0] // w.memo_tag.shape[0])
    _memo_planes(w, q, w.past_entry[g, 0], planes, LADDERED + 2, stride, n, sym, n_points)
    _memo_planes(w, q, w.past_entry[g, 1], planes, LADDERED + 1, stride, n, sym, n_points)

    pass_alive_area(b, g, w)
    own_bit = AREA_BLACK if pla == BLACK else AREA_WHITE
    for p in range(n_points):
        a = w.area[g, p]
        if a & own_bit:
            _set_plane(planes, OWN_PASS_ALIVE, stride, n, sym, p)
        if a & (AREA_BLACK + AREA_WHITE - own_bit):
            _set_plane(planes, OPPONENT_PASS_ALIVE, stride, n, sym, p)

    komi = b.rules[g, RULE_KOMI_HALVES] * 0.5
    glob[KOMI] = (komi if pla == WHITE else -komi) / KOMI_SCALE
    ko_rule = b.rules[g, RULE_KO]
    if ko_rule == KO_POSITIONAL:
        glob[KO_RULE] = 1.0
        glob[KO_RULE + 1] = 0.5
    elif ko_rule == KO_SITUATIONAL:
        glob[KO_RULE] = 1.0
        glob[KO_RULE + 1] = -0.5
    glob[SUICIDE] = 1.0 if b.rules[g, RULE_SUICIDE] != 0 else 0.0
    glob[TERRITORY] = 1.0 if b.rules[g, RULE_SCORING] == SCORING_TERRITORY else 0.0


@routine
def policy_to_points(b, g, sym, policy, t, out):
    """Map a policy over the symmetric tensor (policy[y * T + x], policy[T * T] = pass) back to
    game g's points: out[p] for each point p of its board, out[PASS] for the pass."""
    stride = b.stride
    n = b.size[g]
    for p in range(out.shape[0]):
        out[p] = 0.0
    for y in range(n):
        for x in range(n):
            sx, sy = symmetric_xy(x, y, n, sym)
            out[(y + 1) * stride + x + 1] = policy[sy * t + sx]
    out[PASS] = policy[t * t]


@routine
def legal_to_tensor(b, g, sym, t, out):
    """out[y * t + x] = whether game g's player to move may play the point that symmetry `sym`
    moves to (x, y); out[t * t] = whether it may pass. The mask of a policy over the tensor."""
    stride = b.stride
    n = b.size[g]
    c = b.to_move[g]
    for i in range(out.shape[0]):
        out[i] = False
    for y in range(n):
        for x in range(n):
            p = (y + 1) * stride + x + 1
            if b.color[g, p] == EMPTY and legality(b, g, p, c) == LEGAL:
                sx, sy = symmetric_xy(x, y, n, sym)
                out[sy * t + sx] = True
    out[t * t] = legality(b, g, PASS, c) == LEGAL


# ---------------------------------------------------------------------------------------------
# Batched drivers and the Python API
# ---------------------------------------------------------------------------------------------


@per_game("remember")
def remember_step(q, b, w, which):
    remember_ladders(b, q, w, which)


@per_game("encode", capped=True)
def encode_step(i, b, w, rows, symmetry, planes, glob):
    g = np.int64(rows[i])
    encode(b, g, w, symmetry[g], planes[g], glob[g])


@per_game("policy")
def policy_step(g, b, symmetry, policy, tensor, out):
    policy_to_points(b, g, symmetry[g], policy[g], tensor, out[g])


@per_game("legal_tensor")
def legal_tensor_step(g, b, symmetry, tensor, out):
    legal_to_tensor(b, g, symmetry[g], tensor, out[g])


@per_game("ladders")
def ladders_step(g, b, w, catches):
    ladders_now(b, g, w, catches[g])


@per_game("pass_alive")
def pass_alive_step(g, b, w):
    pass_alive_area(b, g, w)


def encode_order(which: np.ndarray, row_work: np.ndarray) -> np.ndarray:
    """[K] int32: the rows marked in `which`, the most work expected first (`row_work`, which
    remember_ladders leaves: the flood fills of each row's position 1 turn ago; ties in row
    order, and past 65,535 all tie). On a GPU the encoder's thread i encodes row order[i]: a
    warp's 32 rows run in lockstep, so a warp takes as long as its slowest row, and rows of like
    work in a warp waste less of it; the heaviest go first, so that the last blocks to run are
    short ones. (On the CPU each thread takes a range of rows in order: the order would only
    unbalance them.)"""
    rows = np.flatnonzero(which)
    # As uint16 numpy sorts by radix, several times faster than an int32 sort
    # (docs/benchmarks.md). Past 65,535 flood fills, rows tie.
    top = np.iinfo(np.uint16).max
    work = np.minimum(np.asarray(row_work)[rows], top).astype(np.uint16)
    return rows[np.argsort(top - work, kind="stable")].astype(np.int32)


def untimed(name: str) -> contextlib.AbstractContextManager:
    """encode_some's default `phase`: no timing."""
    return contextlib.nullcontext()


def tensor_shapes(games: int, tensor_size: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return (games, N_PLANES, tensor_size, tensor_size), (games, N_GLOBALS)


@batched
def encode_all(b: Boards, work: FeatureWork, planes, glob, symmetry=None, *,
               threads: int | None = None, on=CPU) -> None:  # fmt: skip
    """Encode every game of `b` into the caller's float32 buffers planes [G, 18, T, T] and
    glob [G, 10] (T >= the largest board), game g under symmetry[g] (default: identity). On
    the GPU the buffers are device arrays, or anything with __cuda_array_interface__ such as a
    torch CUDA tensor."""
    encode_some(b, work, True, planes, glob, symmetry, threads=threads, on=on)


@batched
def encode_some(b: Boards, work: FeatureWork, which, planes, glob, symmetry=None, *,
                phase: Callable[[str], contextlib.AbstractContextManager] = untimed,
                threads: int | None = None, on=CPU) -> None:  # fmt: skip
    """As encode_all, for the games marked in `which` ([G] bool) only; the other rows of the
    buffers are left as they were. `phase(name)` is entered around the groups' memos of ladders
    ("remember") and around the rest ("encode": the checks, the order of the rows, the rows),
    so that the self-play driver times them apart.

    `remember` runs a thread a group, then the encoder a thread a marked row. Where threads run
    in lockstep (a GPU's warp of 32), the rows go in encode_order's order, the most work
    expected first (from the work their positions 1 turn ago took, which `remember` leaves in
    work.row_work), so that rows of like work share warps; that order costs a round trip: [G]
    int32 to the host, sorted there, [K] int32 back."""
    with phase("encode"):
        sizes = on.host(b.size)
        check_work(b.color.shape, b.stride, work)
        check_buffers(b.games, int(sizes.max()), planes.shape, glob.shape)
        symmetry = check_symmetries(None if symmetry is None else on.host(symmetry), b.games)
        which = np.ascontiguousarray(np.broadcast_to(on.host(which), (b.games,)), np.bool_)
    with phase("remember"):
        on.run(remember_step, work.memo_tag.shape[0], b, work, on.array(which, np.bool_),
               threads=threads)  # fmt: skip
    with phase("encode"):
        if on.lockstep:
            rows = encode_order(which, on.host(work.row_work))
        else:
            rows = np.flatnonzero(which).astype(np.int32)
        if len(rows):
            on.run(encode_step, len(rows), b, work, on.array(rows, np.int32),
                   on.array(symmetry, np.int64), on.buffer(planes), on.buffer(glob),
                   threads=threads)  # fmt: skip


@batched
def policy_all(b: Boards, policy, symmetry=None, *, on=CPU):
    """[G, A] float32: each game's policy ([G, T * T + 1] over its symmetric tensor: numpy, or
    on the device) mapped back to its padded points, pass at PASS."""
    tensor = check_policy(b.games, int(on.host(b.size).max()), policy.shape)
    symmetry = check_symmetries(None if symmetry is None else on.host(symmetry), b.games)
    out = on.output(b.color.shape, np.float32)
    on.run(policy_step, b.games, b, on.array(symmetry, np.int64), on.array(policy, np.float32),
           tensor, out)  # fmt: skip
    return out


@batched
def legal_tensor_all(b: Boards, tensor: int, symmetry=None, *, on=CPU):
    """[G, T * T + 1] bool: the legal moves of each game's player to move on the symmetric
    tensor the encoder wrote (pass last): the mask for the network's policy."""
    largest = int(on.host(b.size).max())
    if tensor < largest:
        raise ValueError(f"a {tensor}x{tensor} tensor cannot hold a {largest} board")
    symmetry = check_symmetries(None if symmetry is None else on.host(symmetry), b.games)
    out = on.output((b.games, tensor * tensor + 1), np.bool_)
    on.run(legal_tensor_step, b.games, b, on.array(symmetry, np.int64), tensor, out)
    return out


def ladders_all(
    b: Boards, work: FeatureWork | None = None, *, threads: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """([G, A] int8 laddered stones, [G, A] int8 moves catching an opponent of the player to
    move in a ladder) for every game of `b`: the encoder's read of a current position."""
    work = new_work(b) if work is None else work
    check_work(b.color.shape, b.stride, work)
    catches = np.zeros(b.color.shape, np.int8)
    CPU.run(ladders_step, b.games, b, work, catches, threads=threads)
    return work.laddered.copy(), catches


def pass_alive_all(
    b: Boards, work: FeatureWork | None = None, *, threads: int | None = None
) -> np.ndarray:
    """[G, A] int8 pass-alive area: AREA_BLACK, AREA_WHITE bits (0 elsewhere)."""
    work = new_work(b) if work is None else work
    check_work(b.color.shape, b.stride, work)
    CPU.run(pass_alive_step, b.games, b, work, threads=threads)
    return work.area.copy()


def pass_alive_of(b: Boards, g: int, work: FeatureWork) -> np.ndarray:
    """[A] int8 pass-alive area of game g alone (as a row of `pass_alive_all`)."""
    check_work(b.color.shape, b.stride, work)
    pass_alive_step.over(b, work, g, g + 1)
    return work.area[g].copy()


def check_work(board_shape, stride: int, work: FeatureWork) -> None:
    """Refuse a work space made for a batch of another shape (the kernels do not check bounds)."""
    if tuple(work.color.shape) != tuple(board_shape) or work.past.stride != stride:
        raise ValueError(
            f"work space of shape {tuple(work.color.shape)} (stride {work.past.stride}) does not "
            f"fit boards of shape {tuple(board_shape)} (stride {stride}): make it with new_work"
        )


def check_policy(games: int, largest: int, policy_shape) -> int:
    """The tensor width T of a policy [games, T * T + 1]; refuses any other shape."""
    policy_shape = tuple(policy_shape)
    t = int(round((policy_shape[-1] - 1) ** 0.5)) if policy_shape and policy_shape[-1] > 0 else 0
    if len(policy_shape) != 2 or policy_shape[0] != games or t * t + 1 != policy_shape[1]:
        raise ValueError(f"policy must be [{games}, T * T + 1] (got {policy_shape})")
    if t < largest:
        raise ValueError(f"a policy over {t}x{t} cannot hold a {largest}x{largest} board")
    return t


def check_buffers(games: int, largest: int, planes_shape, glob_shape) -> None:
    """Refuse feature buffers of the wrong shape (numpy, device arrays and tensors alike)."""
    planes_shape, glob_shape = tuple(planes_shape), tuple(glob_shape)
    if (
        len(planes_shape) != 4
        or planes_shape[:2] != (games, N_PLANES)
        or planes_shape[2] != planes_shape[3]
    ):
        raise ValueError(f"planes must be [{games}, {N_PLANES}, T, T] (got {planes_shape})")
    if planes_shape[2] < largest:
        raise ValueError(
            f"planes of {planes_shape[2]}x{planes_shape[2]} cannot hold a {largest}x{largest} board"
        )
    if glob_shape != (games, N_GLOBALS):
        raise ValueError(f"globals must be [{games}, {N_GLOBALS}] (got {glob_shape})")


def check_symmetries(symmetry, games: int) -> np.ndarray:
    if symmetry is None:
        return np.zeros(games, np.int64)
    # A writable copy, as the zeros above: a read-only array is a separate compile.
    symmetry = np.array(np.broadcast_to(symmetry, (games,)), dtype=np.int64)
    if symmetry.min() < 0 or symmetry.max() >= SYMMETRIES:
        raise ValueError(f"symmetries are 0..{SYMMETRIES - 1} (got {sorted(set(symmetry))})")
    return symmetry


def symmetric_planes(planes: np.ndarray, sym: int, size: int) -> np.ndarray:
    """Planes [..., T, T] with the top-left size x size board moved by symmetry `sym` (what
    encoding the transformed board gives). Plain numpy, for tests and data augmentation."""
    out = np.zeros_like(planes)
    board = planes[..., :size, :size]
    if sym & 1:
        board = board[..., :, ::-1]
    if sym & 2:
        board = board[..., ::-1, :]
    if sym & 4:
        board = np.swapaxes(board, -1, -2)
    out[..., :size, :size] = board
    return out


# ---------------------------------------------------------------------------------------------
# Bit-packed planes for training rows
# ---------------------------------------------------------------------------------------------


def packed_length(size: int) -> int:
    """Bytes of one position's packed planes on a size x size board."""
    return (N_PLANES * size * size + 7) // 8


def pack_planes(planes: np.ndarray, size: int) -> np.ndarray:
    """[R, 18, T, T] binary planes -> [R, packed_length(size)] uint8: the top-left size x size
    board of every plane, one bit per point. Exact: `unpack_planes` gives the planes back."""
    board = np.ascontiguousarray(planes[:, :, :size, :size])
    if not np.all((board == 0) | (board == 1)):
        raise ValueError("pack_planes: planes must be 0 or 1")
    return np.packbits(board.reshape(board.shape[0], -1).astype(np.bool_), axis=1)


def unpack_planes(packed: np.ndarray, size: int, tensor_size: int | None = None) -> np.ndarray:
    """[R, packed_length(size)] uint8 -> [R, 18, T, T] float32 (T = tensor_size or size)."""
    tensor_size = size if tensor_size is None else tensor_size
    packed = np.asarray(packed, dtype=np.uint8)
    if packed.ndim != 2 or packed.shape[1] != packed_length(size):
        raise ValueError(
            f"packed planes of a {size}x{size} board are [rows, {packed_length(size)}] bytes "
            f"(got {packed.shape})"
        )
    bits = np.unpackbits(packed, axis=1, count=N_PLANES * size * size)
    out = np.zeros((packed.shape[0], N_PLANES, tensor_size, tensor_size), np.float32)
    out[:, :, :size, :size] = bits.reshape(-1, N_PLANES, size, size)
    return out
