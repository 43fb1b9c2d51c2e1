"""The array MCTS: visit accounting, tactics with an exact evaluator, PUCT against a pure-Python
reference, virtual loss, terminal nodes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gocore import board as gb
from gocore import search as S
from gocore.board import BLACK, PASS, WHITE
from tests.conftest import game_from_diagram


def score_evaluator(leaves):
    """Uniform prior; value = the sign of the area score for the player to move."""
    policy = np.ones(leaves.color.shape, np.float32)
    scores, _ = gb.score_all(leaves)
    value = np.sign(scores) * np.where(leaves.to_move == BLACK, 1.0, -1.0)
    return policy, value.astype(np.float32)


def random_evaluator(seed: int):
    rng = np.random.default_rng(seed)

    def evaluate(leaves):
        policy = rng.random(leaves.color.shape).astype(np.float32)
        return policy, rng.uniform(-1, 1, leaves.games).astype(np.float32)

    return evaluate


@pytest.mark.parametrize("leaves_per_game", [1, 4])
def test_visits_sum_to_what_was_asked(leaves_per_game):
    roots = gb.new_boards(3, [5, 7, 9], max_moves=200)
    tree = S.search(roots, random_evaluator(0), 64, leaves_per_game=leaves_per_game)
    assert (tree.visits[:, S.ROOT] == 64).all()
    for g in range(3):
        assert sum(S.root_visits(tree, g).values()) == 63  # the root's own evaluation is one
        assert tree.node_count[g] <= 65
        # Every node's visits are its own evaluation plus its children's.
        for n in range(tree.node_count[g]):
            start, count = tree.first_edge[g, n], tree.num_edges[g, n]
            if start < 0:
                continue
            children = [tree.edge_child[g, e] for e in range(start, start + count)]
            below = sum(int(tree.visits[g, c]) for c in children if c >= 0)
            assert tree.visits[g, n] == below + 1
    assert not tree.pending.any()


def test_search_captures_the_group_in_atari():
    game = game_from_diagram(
        """
        . X . . .
        X O O X .
        . X X . .
        . . . . .
        . . . . .
        """,
        rules="chinese",
        to_move=BLACK,
    )
    tree = S.search(game.b, score_evaluator, 200)
    visits = S.root_visits(tree, 0)
    best = max(visits, key=visits.get)
    assert gb.point_xy(game.b.stride, best) == (2, 0)


def test_passing_to_end_a_won_game_is_a_terminal_win():
    game = game_from_diagram(
        """
        . X . . .
        X X . . .
        . X . . .
        X X . . .
        . X . . .
        """,
        rules="chinese",
        to_move=WHITE,
    )
    game.set_komi(0.5)
    game.play(WHITE, None)  # White passes; Black may end the game by passing
    tree = S.search(game.b, score_evaluator, 50)
    start, count = tree.first_edge[0, S.ROOT], tree.num_edges[0, S.ROOT]
    pass_edge = [e for e in range(start, start + count) if tree.edge_move[0, e] == PASS][0]
    child = tree.edge_child[0, pass_edge]
    assert child >= 0 and tree.terminal[0, child] == 1
    # Black owns the board: the pass wins outright, +1 for Black at every visit.
    assert tree.value_sum[0, child] == tree.visits[0, child] > 0


def reference_select(tree, g, n, params, is_root):
    """PUCT by the formulas, in plain Python."""
    start, count = int(tree.first_edge[g, n]), int(tree.num_edges[g, n])
    edges = range(start, start + count)
    parent_visits = int(tree.visits[g, n])
    parent_q = -tree.value_sum[g, n] / parent_visits if parent_visits else 0.0
    visited = sum(
        float(tree.edge_prior[g, e])
        for e in edges
        if tree.edge_child[g, e] >= 0 and tree.visits[g, tree.edge_child[g, e]] > 0
    )
    reduction = params.root_fpu_reduction if is_root else params.fpu_reduction
    fpu = parent_q - reduction * math.sqrt(visited)
    total = int(tree.visits[g, S.ROOT])
    scores = []
    for e in edges:
        child = int(tree.edge_child[g, e])
        n_child = int(tree.visits[g, child]) if child >= 0 else 0
        prior = float(tree.edge_prior[g, e])
        forced = math.sqrt(params.forced_playouts_k * prior * total)
        if is_root and params.forced_playouts_k > 0 and n_child < forced:
            scores.append(1e20 + prior)
            continue
        q = tree.value_sum[g, child] / n_child if n_child else fpu
        explore = params.c_puct * max(parent_visits, 1) ** params.puct_exponent
        scores.append(q + explore * prior / (1 + n_child))
    return start + int(np.argmax(scores))


@pytest.mark.parametrize(
    "params",
    [
        S.SearchParams(),
        S.SearchParams(c_puct=0.057, puct_exponent=0.737, forced_playouts_k=0.0),
        S.SearchParams(fpu_reduction=0.0, root_fpu_reduction=0.3, forced_playouts_k=0.0),
    ],
    ids=["puct-forced", "generalized-puct", "fpu"],
)
def test_puct_selection_matches_the_reference(params):
    roots = gb.new_boards(2, 7, max_moves=200)
    tree = S.search(roots, random_evaluator(1), 120, params=params)
    checked = 0
    for g in range(2):
        for n in range(tree.node_count[g]):
            if tree.first_edge[g, n] < 0 or tree.num_edges[g, n] == 0:
                continue
            is_root = n == S.ROOT
            total = tree.visits[g, S.ROOT]
            got = S.select_edge(tree, g, n, params, is_root, total)
            assert got == reference_select(tree, g, n, params, is_root), (g, n)
            checked += 1
    assert checked > 20


def test_virtual_loss_spreads_the_leaves_of_one_step():
    roots = gb.new_boards(1, 9, max_moves=200)
    tree = S.new_tree(1, 100, 100 * roots.color.shape[1], leaves_per_game=4)
    leaves = S.new_leaves(roots, 4)
    evaluate = random_evaluator(2)
    # The first step evaluates the root alone; the second selects four different leaves.
    for budget in (1, 4):
        S.select_all(tree, roots, leaves, S.DEFAULT_PARAMS, np.array([budget]))
        policy, value = evaluate(leaves)
        if budget == 4:
            assert len(set(tree.leaf[0].tolist())) == 4
        S.expand_and_backup_all(tree, leaves, policy, value)
    assert tree.visits[0, S.ROOT] == 5 and not tree.pending.any()


def test_a_full_tree_stops_growing_without_losing_counts():
    roots = gb.new_boards(2, 5, max_moves=100)
    tree = S.new_tree(2, 5, 5 * roots.color.shape[1])
    tree = S.search(roots, random_evaluator(3), 40, tree=tree)
    # Five nodes: the root's evaluation and four children's, then no room for a fifth child.
    assert (tree.node_count == 5).all() and (tree.visits[:, S.ROOT] == 5).all()
    assert not tree.pending.any()
