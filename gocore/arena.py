"""Matches between two networks, many games in lockstep: the gate (candidate against champion)
and evaluations. Each move is a fresh search of `visits` visits in which every leaf is
evaluated by the network of the player to move at its game's root; no noise, no forced
playouts (so no root-only first-play urgency either: the paper's c_FPU = 0 at the root goes
with noise); the utility is the win value plus the score utility of Appendix F around the
root's expected score; the move is drawn from the visits with a temperature decaying from
`temperature_start` to `temperature_end` (so that games differ), and games are scored by
their rules with pass-alive cleanup, as in self-play.

`LeafEvaluator` is the search's evaluate over networks, shared with the GTP engine's player.

The networks are gocore's evaluator callables (see gocore.selfplay); gocore never imports
torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from gocore import features as F
from gocore import mcts
from gocore import search as S
from gocore.board import BLACK, PASS, Boards, move_cap, new_boards, play_some
from gocore.device import backend
from gocore.rules import Rules
from gocore.selfplay import final_score, leaf_values, net_rows, row_taker


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


class LeafEvaluator:
    """The search's `evaluate(leaves)` over networks: every leaf board encoded under a random
    symmetry, each leaf's rows run through the net its game is assigned (`net_of_game()`, [G]
    indices into `nets`, read at every call), the policy mapped back to the board's points,
    and the leaves' utilities formed as the self-play driver forms them: win value plus the
    expected score utility around `tree.centre` (set to each root's expected score once the
    root has been evaluated, by `update_centres`).

    With `ownership`, the mean over every evaluated leaf of the net's ownership, from Black's
    side, is kept per game (`ownership_sum / ownership_count`): each visit backs up one leaf,
    so this is the search's own ownership average at the root, as KataGo reports it.

    On `device` "cuda" the leaves and the tree are the device's (gocore.device): the encoding
    and the policy mapping run there, the net gets its rows there where it runs there.
    """

    def __init__(
        self,
        nets: list[Callable],
        leaves: Boards,
        tree: S.Tree,
        *,
        leaves_per_game: int,
        score_utility: float,
        rng: np.random.Generator,
        net_of_game: Callable[[], np.ndarray] | None = None,
        ownership: bool = False,
        device: str = "cpu",
    ):
        self.xp = xp = backend(device)
        self.nets = nets
        self.takes = [row_taker(xp, net) for net in nets]
        self.tree = tree
        # The score utility's centres, kept on the host (the tree's own array on the CPU).
        self.centre = xp.to_numpy(tree.centre)
        self.per = leaves_per_game
        self.score_utility = score_utility
        self.rng = rng
        self.net_of_game = net_of_game
        self.tensor = int(xp.to_numpy(leaves.size).max())
        b = leaves.games
        self.work = xp.new_work(leaves, share=leaves_per_game)
        self.planes = xp.zeros((b, F.N_PLANES, self.tensor, self.tensor), np.float32)
        self.glob = xp.zeros((b, F.N_GLOBALS), np.float32)
        # The nets' policy over the tensor, on the device (the rows a walk selected this step
        # are the ones expand reads).
        self.policy_t = xp.zeros((b, self.tensor * self.tensor + 1), np.float32)
        self.evaluations = 0
        games = b // leaves_per_game
        self.ownership_sum = np.zeros((games, leaves.color.shape[1])) if ownership else None
        self.ownership_count = np.zeros(games, np.int64)

    def __call__(self, leaves: Boards):
        xp = self.xp
        b = leaves.games
        t = self.tensor
        symmetry = self.rng.integers(0, 8, b)
        xp.encode_all(leaves, self.work, self.planes, self.glob, symmetry)
        legal = xp.legal_tensor_all(leaves, t, symmetry)
        value = np.zeros((b, 3), np.float32)
        score_mean = np.zeros(b, np.float32)
        score_stdev = np.zeros(b, np.float32)
        outputs = {"policy": self.policy_t, "value": value, "score_mean": score_mean,
                   "score_stdev": score_stdev}  # fmt: skip
        ownership_t = None
        if self.ownership_sum is not None:
            ownership_t = np.zeros((b, t, t), np.float32)
            outputs["ownership"] = ownership_t
        # Only leaves that a walk selected this step: the rest of the buffer is stale.
        selected = (xp.root_state(self.tree).leaf >= 0).reshape(-1)
        of_game = (
            np.zeros(b // self.per, np.int64) if self.net_of_game is None else self.net_of_game()
        )
        of_leaf = np.repeat(of_game, self.per)
        for i, net in enumerate(self.nets):
            net_rows(net, self.planes, self.glob, legal, np.flatnonzero(selected & (of_leaf == i)),
                     outputs, take=self.takes[i], to_numpy=xp.to_numpy,
                     put_rows=xp.put_rows)  # fmt: skip
        self.evaluations += int(selected.sum())
        policy = xp.policy_all(leaves, self.policy_t, symmetry)
        centre = np.repeat(self.centre, self.per)
        to_move = xp.to_numpy(leaves.to_move)
        utility, win, black_mean = leaf_values(
            to_move, xp.to_numpy(leaves.size), value, score_mean, score_stdev, centre,
            self.score_utility,
        )  # fmt: skip
        if ownership_t is not None:
            mover = np.where(to_move == BLACK, 1.0, -1.0)
            flat = np.concatenate([ownership_t.reshape(b, t * t), np.zeros((b, 1), np.float32)], 1)
            black = xp.to_numpy(xp.policy_all(leaves, flat, symmetry))
            black = black * mover[:, None].astype(np.float32)
            black[:, PASS] = 0.0
            rows = np.flatnonzero(selected)
            np.add.at(self.ownership_sum, rows // self.per, black[rows])
            np.add.at(self.ownership_count, rows // self.per, 1)
        return policy, utility, win, black_mean

    def update_centres(self) -> None:
        """Roots evaluated for the first time get their expected score as the score utility's
        centre (as in self-play)."""
        state = self.xp.root_state(self.tree)
        fresh = np.isnan(self.centre) & (state.visits > 0)
        if fresh.any():
            self.centre[fresh] = state.black_lead[fresh]
            self.xp.upload(self.centre, self.tree.centre)

    def reset_centres(self) -> None:
        """No centre yet in any game (a new search from fresh roots)."""
        self.centre[:] = np.nan
        self.xp.upload(self.centre, self.tree.centre)


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
    max_moves_per_area: float,
    considered: int = 0,
    device: str = "cpu",
) -> list[MatchGame]:
    """One game per entry of a_is_black, all at once; A plays Black where a_is_black[g].
    `considered` > 0: Gumbel roots of that many moves, each game's own draw choosing its
    moves (no temperature); else PUCT roots, moves drawn from the visits with the
    temperature. On `device` "cuda" the search, the leaf boards and the encoding run on the
    GPU (gocore.device); the boards of the games are kept on the host and mirrored there after
    every move (the rows of the games still on). The same seed plays the same games on either
    device."""
    xp = backend(device)
    a_is_black = np.asarray(a_is_black, np.bool_)
    games = len(a_is_black)
    rng = np.random.default_rng(seed)
    max_moves = move_cap(max_moves_per_area, size * size)
    roots = new_boards(games, size, rules, max_moves=max_moves + 1)
    device_roots = xp.mirror(roots)
    leaves = xp.new_leaves(device_roots, leaves_per_game)
    root_work = F.new_work(roots)
    cells = roots.color.shape[1]
    nodes, edges = S.tree_size(visits, leaves_per_game, size * size)
    tree = xp.new_tree(games, nodes, edges, leaves_per_game, cells)
    evaluate = LeafEvaluator(
        [net_a, net_b], leaves, tree, leaves_per_game=leaves_per_game,
        score_utility=params.score_utility, rng=rng,
        net_of_game=lambda: np.where((roots.to_move == BLACK) == a_is_black, 0, 1),
        device=device,
    )  # fmt: skip
    every = np.ones(games, np.bool_)
    over = np.zeros(games, np.bool_)
    while not over.all():
        xp.reset_some(tree, every)
        # No forced playouts: the visits are the search's own.
        xp.upload(np.zeros(games, np.int8), tree.explore)
        evaluate.reset_centres()
        draws = rng.integers(0, 2**63, games, dtype=np.uint64) if considered else None
        mcts.search(
            device_roots, evaluate, np.where(over, 0, visits), params=params,
            leaves_per_game=leaves_per_game, tree=tree, leaves=leaves,
            on_step=evaluate.update_centres, considered=considered, gumbel_rng=draws,
            device=device,
        )  # fmt: skip
        playing = np.flatnonzero(~over)
        moves = np.zeros(games, np.int64)
        if considered:
            moves[playing] = xp.to_numpy(xp.gumbel_moves_all(tree, params))[playing]
        else:
            counts = xp.to_numpy(xp.policy_targets_all(tree, params, cells)[0])
            moves[playing] = S.choose_moves(
                counts[playing],
                roots.move_count[playing],
                roots.size[playing],
                rng,
                start=temperature_start,
                end=temperature_end,
            )
        play_some(roots, moves, ~over)
        xp.mirror(roots, device_roots, ~over)  # the games still on
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
