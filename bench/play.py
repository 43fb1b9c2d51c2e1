"""`tengen bench play`: seconds per move of the GTP engine's player (the net with the search, one
torch thread, params.yaml's gate search) at several visit counts, beside the same net's
evaluations per second at the same batch with no search, measured in the same run: the net
alone would take visits / that rate per move, and the ratio is the share of the time the
network gets.

Each figure is the median over the positions of a seeded random 9x9 game (moves 10, 20, ...);
"full" searches every visit, "genmove" is what a move costs as played, stopping once its most
visited move cannot be overtaken. The nets are random-init: speed does not depend on weights.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from bench.table import Column, Table, board_text
from gocore.board import BLACK
from gocore.rules import PRESETS
from play.game import Game
from play.netplayer import NetPlayer


def positions(size: int, count: int, seed: int = 0) -> list[Game]:
    """Positions after 10, 20, ... moves of a random game (no eye filling)."""
    from gocore.playout import new_rng

    rng = new_rng(1, seed)
    game = Game(size, PRESETS["chinese"])
    out = []
    while len(out) < count and not game.is_over:
        game.play(game.to_move, game.random_move(game.to_move, rng))
        if len(game.moves) % 10 == 0:
            out.append(game.copy())
    return out


def bench_one(net_name: str, size: int, visits_list, *, leaves: int, moves: int, params) -> list:
    import torch

    from nets.config import net_config
    from nets.evaluator import Evaluator
    from nets.model import GoNet

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = Evaluator(GoNet(net_config(net_name)))
    games = positions(size, moves)
    # The net alone at the search's batch.
    from gocore import features as F

    b = games[0].b
    planes = np.zeros((leaves, F.N_PLANES, size, size), np.float32)
    glob = np.zeros((leaves, F.N_GLOBALS), np.float32)
    one = np.zeros((1, F.N_PLANES, size, size), np.float32)
    F.encode_all(b, F.new_work(b), one, glob[:1])
    planes[:] = one
    glob[:] = glob[:1]
    legal = np.ones((leaves, size * size + 1), np.bool_)
    net(planes, glob, legal=legal)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < 2.0:
        net(planes, glob, legal=legal)
        calls += 1
    net_rate = calls * leaves / (time.perf_counter() - start)
    rows = []
    for visits in visits_list:
        player = NetPlayer(net, params=params, visits=visits, leaves_per_game=leaves)
        player.genmove(games[0], BLACK)  # compile and allocate
        full, played, searched = [], [], []
        for game in games:
            color = game.to_move
            start = time.perf_counter()
            *_, result = player.search(
                game, color, visits=visits, should_stop=lambda: False, interval=None
            )
            full.append(time.perf_counter() - start)
            start = time.perf_counter()
            player.genmove(game, color)
            played.append(time.perf_counter() - start)
            searched.append(player.last.visits)
            assert result.visits >= visits - leaves
        seconds = statistics.median(full)
        rows.append({
            "net": net_name, "board": size, "visits": visits, "batch": leaves,
            "seconds_per_move_full": round(seconds, 4),
            "seconds_per_move_genmove": round(statistics.median(played), 4),
            "genmove_visits": round(statistics.median(searched)),
            "visits_per_s": round(visits / seconds, 1),
            "net_only_evals_per_s": round(net_rate, 1),
            "net_only_seconds_per_move": round(visits / net_rate, 4),
            "efficiency": round(visits / seconds / net_rate, 4),
        })  # fmt: skip
    return rows


TABLE = Table(
    (
        Column("net", 7, "net"),
        Column("board", 5, board_text),
        Column("visits", 6, "visits"),
        Column("batch", 5, "batch"),
        Column("s/move", 8, "seconds_per_move_full", ".3f"),
        Column("genmove", 8, "seconds_per_move_genmove", ".3f"),
        Column("(visits)", 8, "genmove_visits"),
        Column("visits/s", 9, "visits_per_s", ",.0f"),
        Column("net-only s/move", 15, "net_only_seconds_per_move", ".3f"),
        Column("efficiency", 10, "efficiency", ".1%"),
    )
)
