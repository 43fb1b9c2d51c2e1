"""`tengen bench rules`: random games per second on one core, beside OpenSpiel's C++ Go.

Both sides play the same kind of game: uniform over the legal moves including pass, suicide
forbidden, until two passes in a row, no move cap (OpenSpiel's default cap of 2 * n * n moves is
lifted). tengen uses positional superko, which costs a hash-table probe per candidate move;
OpenSpiel's Go has only the simple ko rule. OpenSpiel is driven from Python, as a Python
pipeline would use it: legal_actions(), a random choice, apply_action() per move.
"""

from __future__ import annotations

import random
import time

from bench.table import Column, Table
from gocore.board import new_boards
from gocore.playout import new_rng, random_games
from gocore.rules import Rules

BENCH_RULES = Rules(ko="positional", suicide=False, scoring="area", komi=7.5)


# So long that no random game reaches it (the longest seen: ~12 n^2 moves on 5x5); the
# superko table is cleared by the moves a game played, so its size costs nothing per game.
BENCH_MOVE_LIMIT_PER_POINT = 100


def tengen_random_games(size: int, seconds: float, seed: int = 1) -> tuple[float, float, int, int]:
    """(games per second, moves per game, games, games cut at the move limit) for `seconds`
    of single-threaded play."""
    b = new_boards(1, size, BENCH_RULES, max_moves=BENCH_MOVE_LIMIT_PER_POINT * size * size)
    rng = new_rng(1, seed)
    random_games(b, rng, 2)  # compile or load from the cache outside the timing
    chunk = 256 if size <= 9 else 32
    games = moves = truncated = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        played, cut = random_games(b, rng, chunk)
        games += chunk
        moves += played
        truncated += cut
    elapsed = time.perf_counter() - start
    return games / elapsed, moves / games, games, truncated


def openspiel_random_games(size: int, seconds: float, seed: int = 1) -> tuple[float, float, int]:
    import pyspiel  # the baseline; installed with the `bench` extra

    game = pyspiel.load_game(
        "go", {"board_size": size, "komi": 7.5, "max_game_length": 100 * size * size}
    )
    rng = random.Random(seed)
    games = moves = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        state = game.new_initial_state()
        while not state.is_terminal():
            state.apply_action(rng.choice(state.legal_actions()))
        games += 1
        moves += state.move_number()
    elapsed = time.perf_counter() - start
    return games / elapsed, moves / games, games


def bench_rules(sizes: tuple[int, ...] = (9, 19), seconds: float = 3.0) -> list[dict]:
    rows = []
    for size in sizes:
        ours, our_length, our_games, truncated = tengen_random_games(size, seconds)
        try:
            theirs, their_length, their_games = openspiel_random_games(size, seconds)
        except ImportError:
            theirs = their_length = None
            their_games = 0
        rows.append(
            {
                "board": f"{size}x{size}",
                "tengen_games_per_s": round(ours, 1),
                "openspiel_games_per_s": None if theirs is None else round(theirs, 1),
                "ratio": None if theirs is None else round(ours / theirs, 2),
                "tengen_moves_per_game": round(our_length, 1),
                "openspiel_moves_per_game": None
                if their_length is None
                else round(their_length, 1),
                "tengen_games": our_games,
                "tengen_games_at_move_limit": truncated,
                "openspiel_games": their_games,
            }
        )
    return rows


TABLE = Table(
    title="random games per second, one core (uniform legal moves incl. pass, until two passes)",
    columns=(
        Column("board", 6, "board"),
        Column("tengen", 10, "tengen_games_per_s", ".0f"),
        Column("OpenSpiel", 10, "openspiel_games_per_s", ".0f", missing="n/a"),
        Column(
            "ratio",
            7,
            lambda r: None if r["ratio"] is None else f"{r['ratio']:.1f}x",
            missing="n/a",
        ),
        Column(
            "moves/game tengen, OpenSpiel",
            30,
            lambda r: f"{r['tengen_moves_per_game']:.1f}, {r['openspiel_moves_per_game']}",
            align="<",
            gap=3,
        ),
    ),
)


def format_table(rows: list[dict]) -> str:
    missing = any(r["openspiel_games_per_s"] is None for r in rows)
    footer = "OpenSpiel is not installed: pip install 'tengen[bench]' (open-spiel)"
    return TABLE.render(rows, footer if missing else "")
