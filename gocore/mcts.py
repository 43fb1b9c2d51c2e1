"""The search loop: MCTS over a batch of games until each root has its visits, on either
target (`device`), with a caller's evaluator. gocore.search holds the trees and the per-game
steps; gocore.device the backends that run them; this module drives them, so that the search
and the backends import one way only (search <- device <- mcts)."""

from __future__ import annotations

import numpy as np

from gocore.board import Boards
from gocore.device import backend
from gocore.search import SearchParams, Tree, tree_size


def search(
    roots: Boards,
    evaluate,
    visits: int | np.ndarray,
    *,
    params: SearchParams,
    leaves_per_game: int = 1,
    tree: Tree | None = None,
    leaves: Boards | None = None,
    noise_rng: np.ndarray | None = None,
    noise_games: np.ndarray | bool = True,
    noise: tuple[float, float] | None = None,
    considered: int = 0,
    gumbel_rng: np.ndarray | None = None,
    on_step=None,
    stop=None,
    device: str = "cpu",
) -> Tree:
    """Run the search until every root g has `visits` (or visits[g]) visits (its own
    evaluation and visits kept from a reused tree included), fewer in a game whose tree fills
    up. `evaluate(leaves)` returns (policy [G * L, A] over points, value [G * L] utility for
    each leaf's player to move), optionally followed by (win, black_score) as in
    `expand_and_backup_all`, for the leaf boards: the network through gocore.features, or
    anything else with that shape. With `noise_rng` ([G] uint64), the roots of `noise_games`
    get Dirichlet noise once expanded, `noise` its (alpha_total, epsilon); forced playouts go
    to the roots of `noise_games` (of every game without noise_rng). With `considered` > 0
    the roots are Gumbel roots of that many moves (fresh roots only: give no reused tree),
    their Gumbel variables drawn with `gumbel_rng` ([G] uint64; None: 0, a deterministic
    search); then gumbel_move and gumbel_target read the result. `on_step()` is called after
    every step (the caller's bookkeeping, such as the score utility's centre); the search also
    ends once `stop()` returns true (a deadline, a decided move). On `device` "cuda", `roots`,
    `tree` and `leaves` are the device's (gocore.device) and so are the rng arrays; the search
    reads back only `root_state`."""
    if noise_rng is not None and noise is None:
        raise ValueError("noise_rng without noise=(alpha_total, epsilon): params.yaml's")
    xp = backend(device)
    games = roots.games
    area = roots.color.shape[1]
    visits = np.broadcast_to(np.asarray(visits, np.int64), (games,))
    if tree is None:
        points = int(xp.to_numpy(roots.size).max()) ** 2
        nodes, edges = tree_size(int(visits.max()), leaves_per_game, points)
        tree = xp.new_tree(games, nodes, edges, leaves_per_game, area)
    leaves = xp.new_leaves(roots, leaves_per_game) if leaves is None else leaves
    full = np.zeros(games, np.bool_)  # games whose tree has no room left: their search ends
    if noise_rng is not None:
        xp.upload(np.broadcast_to(noise_games, (games,)).astype(np.int8), tree.explore)

    def step(budget):
        xp.select_all(tree, roots, leaves, params, budget)
        nonlocal full
        full |= (budget > 0) & (xp.root_state(tree).leaf < 0).all(axis=1)
        xp.expand_and_backup_all(tree, leaves, *evaluate(leaves))
        if on_step is not None:
            on_step()

    if noise_rng is not None or considered > 0:
        fresh = ~xp.root_state(tree).expanded
        step(fresh.astype(np.int64))  # expand fresh roots first
    if noise_rng is not None:
        alpha_total, epsilon = noise
        xp.add_noise_all(tree, noise_rng, noise_games, alpha_total=alpha_total, epsilon=epsilon)
    if considered > 0:
        xp.upload(visits - 1, tree.budget)  # the walks below the root's own evaluation
        rng = xp.zeros(games, np.uint64) if gumbel_rng is None else gumbel_rng
        xp.add_gumbel_all(tree, rng, True, considered, sample=gumbel_rng is not None)
    while True:
        remaining = np.where(full, 0, visits - xp.root_state(tree).visits)
        if remaining.max() <= 0 or (stop is not None and stop()):
            return tree
        step(np.clip(remaining, 0, leaves_per_game))
