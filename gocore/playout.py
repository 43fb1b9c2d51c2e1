"""Random play: an RNG stream per game, the random player's move choice, random games to the end.

Two move policies:
- uniform: uniform over the legal moves, pass included (the random games of `tengen bench rules`);
- no own eyes: uniform over legal moves that do not fill the mover's own eye, passing only when
  nothing else is left (the GTP random player and the playouts that estimate dead stones).
"""

from __future__ import annotations

import numpy as np

from gocore.board import (
    EMPTY,
    LEGAL,
    PASS,
    is_eye,
    legality,
    play_legal,
    reset,
)
from gocore.jit import CPU, batched, driver, kernel, per_game

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S32 = np.uint64(32)


def new_rng(games: int, seed: int) -> np.ndarray:
    """One splitmix64 state per game ([G] uint64), all from one seed."""
    return np.random.default_rng(seed).integers(0, np.iinfo(np.uint64).max, games, np.uint64)


@kernel
def next_u64(rng, g):
    """splitmix64: the next 64 random bits of game g's stream."""
    x = rng[g] + _GOLDEN
    rng[g] = x
    z = (x ^ (x >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    return z ^ (z >> _S31)


@kernel
def random_below(rng, g, n):
    """A uniform integer in [0, n), n < 2**31 (Lemire's multiply-shift; bias below n * 2**-32)."""
    return np.int64(((next_u64(rng, g) >> _S32) * np.uint64(n)) >> _S32)


@kernel
def _acceptable(b, g, p, c, avoid_own_eyes):
    if b.color[g, p] != EMPTY:
        return False
    if avoid_own_eyes and is_eye(b, g, p, c):
        return False
    return legality(b, g, p, c) == LEGAL


@kernel
def random_move(b, g, c, rng, avoid_own_eyes):
    """A random move for c in game g.

    avoid_own_eyes=False: uniform over the legal moves and PASS.
    avoid_own_eyes=True: uniform over legal moves that fill no own eye; PASS only when none.
    Rejection sampling over the board's points first; when that keeps missing, an exact scan.
    Both are uniform over the same set, so their mixture is too.
    """
    n = b.size[g]
    stride = b.stride
    points = n * n
    choices = points if avoid_own_eyes else points + 1
    for _ in range(2 * points):
        r = random_below(rng, g, choices)
        if r == points:
            return PASS
        p = (r // n + 1) * stride + r % n + 1
        if _acceptable(b, g, p, c, avoid_own_eyes):
            return p
    # Count the candidates, then walk to a uniformly drawn one.
    count = 0
    for y in range(n):
        for x in range(n):
            if _acceptable(b, g, (y + 1) * stride + x + 1, c, avoid_own_eyes):
                count += 1
    if not avoid_own_eyes:
        count += 1
    if count == 0:
        return PASS
    k = random_below(rng, g, count)
    for y in range(n):
        for x in range(n):
            p = (y + 1) * stride + x + 1
            if _acceptable(b, g, p, c, avoid_own_eyes):
                if k == 0:
                    return p
                k -= 1
    return PASS


@kernel
def play_out(b, g, rng, avoid_own_eyes):
    """Random moves in game g until two passes in a row or the move limit; returns moves played."""
    played = 0
    while b.passes[g] < 2 and b.move_count[g] < b.moves.shape[1]:
        c = b.to_move[g]
        play_legal(b, g, random_move(b, g, c, rng, avoid_own_eyes), c)
        played += 1
    return played


@per_game("play_out")
def play_out_step(g, b, rng, avoid_own_eyes):
    play_out(b, g, rng, avoid_own_eyes)


@batched
def play_out_all(b, rng, avoid_own_eyes: bool, *, on=CPU) -> None:
    """Play every game of the batch out at random (see play_out); rng: [G] uint64 states,
    where the games are."""
    on.run(play_out_step, b.games, b, on.array(rng, np.uint64), avoid_own_eyes)


@driver
def random_games(b, rng, games):
    """Play `games` uniform random games (pass included) in slot 0, one after another.

    Returns (moves played, games that hit the move limit). This is the loop `tengen bench rules`
    times: reset, then legal uniform moves until two passes.
    """
    total_moves = 0
    truncated = 0
    for _ in range(games):
        reset(b, 0)
        total_moves += play_out(b, 0, rng, False)
        if b.passes[0] < 2:
            truncated += 1
    return total_moves, truncated
