"""Matches between two networks, many games in lockstep: the gate (candidate against champion)
and evaluations. Each move is a fresh search of `visits` visits in which every leaf is
evaluated by the network of the player to move at its game's root; no noise, no forced
playouts; the move is drawn from the visits with a temperature decaying from
`temperature_start` to `temperature_end` (so that games differ), and games are scored by
their rules with pass-alive cleanup, as in self-play.

The networks are gocore's evaluator callables (see gocore.selfplay); gocore never imports
torch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from gocore import features as F
from gocore import search as S
from gocore.board import BLACK, new_boards
from gocore.rules import Rules
from gocore.selfplay import final_score, net_rows, play_some


@dataclasses.dataclass(frozen=True)
class MatchGame:
    a_is_black: bool
    black_lead: float  # the final score from Black's side
    moves: np.ndarray  # padded points
    colors: np.ndarray
    stride: int

    @property
    def a_result(self) -> float:
        """1 if A won, 0 if it lost, 0.5 for a draw."""
        if self.black_lead == 0:
            return 0.5
        return 1.0 if (self.black_lead > 0) == self.a_is_black else 0.0


def play_match(
    net_a: Callable,
    net_b: Callable,
    a_is_black: np.ndarray,
    *,
    size: int,
    rules: Rules,
    visits: int,
    params: S.SearchParams,
    leaves_per_game: int,
    seed: int,
    temperature_start: float,
    temperature_end: float,
    max_moves_per_area: float = 3.0,
) -> list[MatchGame]:
    """One game per entry of a_is_black, all at once; A plays Black where a_is_black[g]."""
    a_is_black = np.asarray(a_is_black, np.bool_)
    games = len(a_is_black)
    rng = np.random.default_rng(seed)
    max_moves = max(8, math.ceil(max_moves_per_area * size * size))
    roots = new_boards(games, size, rules, max_moves=max_moves + 1)
    leaves = S.new_leaves(roots, leaves_per_game)
    work = F.new_work(leaves)
    root_work = F.new_work(roots)
    b = leaves.games
    planes = np.zeros((b, F.N_PLANES, size, size), np.float32)
    glob = np.zeros((b, F.N_GLOBALS), np.float32)
    game_of_leaf = np.arange(b) // leaves_per_game
    cells = roots.color.shape[1]
    nodes = visits + leaves_per_game + 2

    def evaluate(leaf_boards):
        symmetry = rng.integers(0, 8, b)
        F.encode_all(leaf_boards, work, planes, glob, symmetry)
        legal = F.legal_tensor_all(leaf_boards, size, symmetry)
        a_moves = (roots.to_move[game_of_leaf] == BLACK) == a_is_black[game_of_leaf]
        policy = np.zeros((b, size * size + 1), np.float32)
        value = np.zeros((b, 3), np.float32)
        outputs = {"policy": policy, "value": value}
        net_rows(net_a, planes, glob, legal, np.flatnonzero(a_moves), outputs)
        net_rows(net_b, planes, glob, legal, np.flatnonzero(~a_moves), outputs)
        return F.policy_all(leaf_boards, policy, symmetry), value[:, 0] - value[:, 1]

    over = np.zeros(games, np.bool_)
    while not over.all():
        tree = S.new_tree(games, nodes, nodes * (size * size + 1), leaves_per_game, cells)
        tree.explore[:] = 0  # no forced playouts: the visits are the search's own
        S.search(
            roots, evaluate, np.where(over, 0, visits), params=params,
            leaves_per_game=leaves_per_game, tree=tree, leaves=leaves,
        )  # fmt: skip
        playing = np.flatnonzero(~over)
        counts, _ = S.policy_targets_all(tree, params, cells)
        moves = np.zeros(games, np.int64)
        moves[playing] = S.choose_moves(
            counts[playing],
            roots.move_count[playing],
            roots.size[playing],
            rng,
            start=temperature_start,
            end=temperature_end,
        )
        play_some(roots, moves, ~over)
        over |= (roots.passes >= 2) | (roots.move_count >= max_moves)
    results = []
    for g in range(games):
        lead, _ = final_score(roots, root_work, g)
        played = int(roots.move_count[g])
        results.append(
            MatchGame(
                a_is_black=bool(a_is_black[g]),
                black_lead=lead,
                moves=roots.moves[g, :played].copy(),
                colors=roots.move_colors[g, :played].copy(),
                stride=roots.stride,
            )
        )
    return results
