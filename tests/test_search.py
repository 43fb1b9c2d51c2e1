"""The array MCTS: visit accounting, tactics with an exact evaluator, PUCT against a pure-Python
reference, virtual loss, terminal nodes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gocore import board as gb
from gocore import mcts
from gocore import search as S
from gocore.board import BLACK, PASS, WHITE
from tests.conftest import game_from_diagram, search_params

# params.yaml's self-play search, on win/loss alone (these positions test the value's backup).
PARAMS = search_params(score_utility=0.0)


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
    tree = mcts.search(
        roots, random_evaluator(0), 64, leaves_per_game=leaves_per_game, params=PARAMS
    )
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


def atari():
    """Black to move captures two White stones at (2, 0)."""
    return game_from_diagram(
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


def test_search_captures_the_group_in_atari():
    game = atari()
    tree = mcts.search(game.b, score_evaluator, 200, params=PARAMS)
    visits = S.root_visits(tree, 0)
    best = max(visits, key=visits.get)
    assert gb.point_xy(game.b.stride, best) == (2, 0)


def test_search_finds_the_one_move_that_saves_a_group():
    """Black's two stones have one liberty: Black wins if they live (komi -6.5), and only the
    extension keeps White from capturing them at once."""
    game = game_from_diagram(
        """
        . . . . .
        . O O O .
        O X X . .
        . O O . .
        . . . . .
        """,
        rules="chinese",
        to_move=BLACK,
    )
    game.set_komi(-6.5)
    tree = mcts.search(game.b, score_evaluator, 1500, params=PARAMS)
    visits = S.root_visits(tree, 0)
    ranked = sorted(visits, key=visits.get, reverse=True)
    assert gb.point_xy(game.b.stride, ranked[0]) == (3, 2)
    assert visits[ranked[0]] > 5 * visits[ranked[1]]  # 936 against 70


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
    tree = mcts.search(game.b, score_evaluator, 50, params=PARAMS)
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
    reduction = params.root_fpu_reduction if is_root and tree.explore[g] else params.fpu_reduction
    fpu = parent_q - reduction * math.sqrt(visited)
    total = int(tree.visits[g, S.ROOT])
    scores = []
    for e in edges:
        child = int(tree.edge_child[g, e])
        n_child = int(tree.visits[g, child]) if child >= 0 else 0
        prior = float(tree.edge_prior[g, e])
        forced = math.sqrt(params.forced_playouts_k * prior * total)
        if is_root and tree.explore[g] and params.forced_playouts_k > 0 and n_child < forced:
            scores.append((1, prior))  # forced: before every unforced child, by prior
            continue
        q = tree.value_sum[g, child] / n_child if n_child else fpu
        explore = params.c_puct * max(parent_visits, 1) ** params.puct_exponent
        scores.append((0, q + explore * prior / (1 + n_child)))
    return start + max(range(len(scores)), key=scores.__getitem__)  # the first of equals


def test_forced_playouts_go_to_the_larger_priors_first():
    """Every unvisited child of a full search's root is forced at first (sqrt(k P N) > 0):
    they get their visits in prior order, the largest first, not in board order."""
    roots = gb.new_boards(1, 7, max_moves=200)

    def rising(leaves):  # priors growing along the board: board order is the worst order
        policy = np.tile(np.arange(leaves.color.shape[1], dtype=np.float32) + 1, (leaves.games, 1))
        return policy, np.zeros(leaves.games, np.float32)

    tree = mcts.search(roots, rising, 10, params=PARAMS)  # forced_playouts_k 2, explore on
    edges = np.arange(tree.first_edge[0, 0], tree.first_edge[0, 0] + tree.num_edges[0, 0])
    top = tree.edge_move[0, edges[np.argsort(tree.edge_prior[0, edges])[-9:]]]
    visited = {m for m, v in S.root_visits(tree, 0).items() if v}
    assert visited == set(top.tolist())


@pytest.mark.parametrize(
    "params",
    [
        PARAMS,
        PARAMS._replace(c_puct=0.057, puct_exponent=0.737, forced_playouts_k=0.0),
        PARAMS._replace(fpu_reduction=0.0, root_fpu_reduction=0.3, forced_playouts_k=0.0),
    ],
    ids=["puct-forced", "generalized-puct", "fpu"],
)
def test_puct_selection_matches_the_reference(params):
    roots = gb.new_boards(2, 7, max_moves=200)
    tree = mcts.search(roots, random_evaluator(1), 120, params=params)
    checked = 0
    # Game 1 as a cheap search: no forced playouts, the ordinary first-play urgency at its root.
    tree.explore[1] = 0
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


@pytest.mark.parametrize(
    "params",
    [
        PARAMS._replace(forced_playouts_k=0.0),
        PARAMS._replace(fpu_reduction=0.0, forced_playouts_k=0.0),
        PARAMS,
    ],
    ids=["fpu-0.2", "fpu-0", "forced"],
)
def test_a_walk_follows_the_formula_without_its_own_virtual_loss(params):
    """Each walk of a real select_all picks, at every node on its path, the edge that PUCT
    with first-play urgency gives for the tree as it was before the walk: the walk's own
    virtual visit must not count as a loss in the parent's value (which would value every
    unvisited child at about +1 / visits more and widen the tree)."""
    roots = gb.new_boards(2, 7, max_moves=200)
    tree = S.new_tree(2, 200, 200 * roots.color.shape[1])
    leaves = S.new_leaves(roots, 1)
    evaluate = random_evaluator(4)
    walks = first_visits = 0
    for _ in range(60):
        expected = []
        for g in range(2):
            path, n = [], S.ROOT
            while tree.first_edge[g, n] >= 0 and not tree.terminal[g, n]:
                e = reference_select(tree, g, n, params, n == S.ROOT)
                path.append(e)
                n = tree.edge_child[g, e]
                if n < 0:
                    break
            expected.append(path)
        S.select_all(tree, roots, leaves, params, np.ones(2, np.int64))
        for g in range(2):
            got, n = [], int(tree.leaf[g, 0])
            while tree.parent[g, n] >= 0:
                parent = tree.parent[g, n]
                start, count = tree.first_edge[g, parent], tree.num_edges[g, parent]
                got.append(next(e for e in range(start, start + count)
                                if tree.edge_child[g, e] == n))  # fmt: skip
                n = parent
            assert got[::-1] == expected[g]
            walks += 1
            first_visits += len(expected[g]) == 1
        S.expand_and_backup_all(tree, leaves, *evaluate(leaves))
    assert not tree.pending.any()
    # The walks went below the root, so first-play urgency at inner nodes was exercised.
    assert walks - first_visits > 40


def test_virtual_loss_spreads_the_leaves_of_one_step():
    roots = gb.new_boards(1, 9, max_moves=200)
    tree = S.new_tree(1, 100, 100 * roots.color.shape[1], leaves_per_game=4)
    leaves = S.new_leaves(roots, 4)
    evaluate = random_evaluator(2)
    # The first step evaluates the root alone; the second selects four different leaves.
    for budget in (1, 4):
        S.select_all(tree, roots, leaves, PARAMS, np.array([budget]))
        policy, value = evaluate(leaves)
        if budget == 4:
            assert len(set(tree.leaf[0].tolist())) == 4
        S.expand_and_backup_all(tree, leaves, policy, value)
    assert tree.visits[0, S.ROOT] == 5 and not tree.pending.any()


def test_a_full_tree_stops_growing_without_losing_counts():
    roots = gb.new_boards(2, 5, max_moves=100)
    tree = S.new_tree(2, 5, 5 * roots.color.shape[1])
    tree = mcts.search(roots, random_evaluator(3), 40, tree=tree, params=PARAMS)
    # Five nodes: the root's evaluation and four children's, then no room for a fifth child.
    assert (tree.node_count == 5).all() and (tree.visits[:, S.ROOT] == 5).all()
    assert not tree.pending.any()


def reference_target(tree, g, params):
    """KataGo's policy target pruning, by the formulas, in plain Python: {move: visits}."""
    start, count = int(tree.first_edge[g, S.ROOT]), int(tree.num_edges[g, S.ROOT])
    children = []
    for e in range(start, start + count):
        child = int(tree.edge_child[g, e])
        n = int(tree.visits[g, child]) if child >= 0 else 0
        q = float(tree.value_sum[g, child]) / n if n else 0.0
        children.append((int(tree.edge_move[g, e]), float(tree.edge_prior[g, e]), n, q))
    total = sum(c[2] for c in children)
    explore = params.c_puct * total**params.puct_exponent
    best = max(range(len(children)), key=lambda i: children[i][2])  # first of the most visited
    _, p_best, n_best, q_best = children[best]
    puct_best = q_best + explore * p_best / (1 + n_best)
    target = {}
    for i, (move, prior, n, q) in enumerate(children):
        kept = float(n)
        if i != best and n > 0 and params.forced_playouts_k > 0:
            forced = math.sqrt(params.forced_playouts_k * prior * total)
            lowest = max(n - forced, 0.0)

            def puct(visits, q=q, prior=prior):
                return q + explore * prior / (1 + visits)

            if puct(lowest) <= puct_best:
                kept = lowest
            elif puct(n) <= puct_best:
                # Bisect for the fewest visits at which the child is no better than the best.
                lo, hi = lowest, float(n)
                for _ in range(100):
                    mid = (lo + hi) / 2
                    lo, hi = (lo, mid) if puct(mid) <= puct_best else (mid, hi)
                kept = hi
            if kept <= 1:
                kept = 0.0
        target[move] = kept
    return target


@pytest.mark.parametrize("k", [2.0, 0.0])
def test_policy_targets_prune_forced_playouts_as_the_formula_says(k):
    params = PARAMS._replace(forced_playouts_k=k)
    roots = gb.new_boards(4, 7, max_moves=200)
    tree = mcts.search(
        roots,
        random_evaluator(4),
        150,
        params=params,
        noise_rng=S_rng(4),
        noise_games=True,
        noise=(10.83, 0.25),
    )
    targets, kept = S.policy_targets_all(tree, params, roots.color.shape[1])
    pruned_any = False
    for g in range(4):
        expected = reference_target(tree, g, params)
        total = sum(expected.values())
        assert kept[g] == pytest.approx(total, rel=1e-5)
        for move, visits in expected.items():
            assert targets[g, move] == pytest.approx(visits / total, abs=1e-5), (g, move)
        assert targets[g].sum() == pytest.approx(1.0)
        raw = S.root_visits(tree, g)
        pruned_any |= sum(raw.values()) > total
        if k == 0:
            assert total == sum(raw.values())
    assert pruned_any == (k > 0)


def S_rng(seed: int, games: int = 4):
    from gocore.playout import new_rng

    return new_rng(games, seed)


def test_root_noise_is_a_dirichlet_mix():
    roots = gb.new_boards(1, 5, max_moves=100)
    tree = mcts.search(
        roots, score_evaluator, 1, params=PARAMS
    )  # the root expanded, uniform priors
    count = tree.num_edges[0, S.ROOT]
    start = tree.first_edge[0, S.ROOT]
    base = tree.edge_prior[0, start : start + count].copy()
    shares = []
    rng = S_rng(5, 1)
    for _ in range(400):
        tree.edge_prior[0, start : start + count] = base
        S.add_noise_all(tree, rng, True, alpha_total=10.83, epsilon=1.0)
        noisy = tree.edge_prior[0, start : start + count].copy()
        assert noisy.sum() == pytest.approx(1.0, abs=1e-5) and (noisy > 0).all()
        shares.append(noisy)
    shares = np.array(shares)
    # Dirichlet(alpha, ..., alpha): every share has mean 1 / count and variance
    # (1/count)(1 - 1/count) / (alpha_total + 1).
    assert np.allclose(shares.mean(axis=0), 1 / count, atol=0.015)
    expected_var = (1 / count) * (1 - 1 / count) / (10.83 + 1)
    assert shares.var(axis=0).mean() == pytest.approx(expected_var, rel=0.25)
    # epsilon = 0 leaves the priors alone; the same seed gives the same noise.
    tree.edge_prior[0, start : start + count] = base
    S.add_noise_all(tree, S_rng(6, 1), True, alpha_total=10.83, epsilon=0.0)
    assert np.allclose(tree.edge_prior[0, start : start + count], base)
    first, second = [], []
    for out in (first, second):
        tree.edge_prior[0, start : start + count] = base
        S.add_noise_all(tree, S_rng(7, 1), True, alpha_total=10.83, epsilon=0.25)
        out.append(tree.edge_prior[0, start : start + count].copy())
    assert np.array_equal(first[0], second[0])


def test_tree_reuse_keeps_the_subtree_counts():
    roots = gb.new_boards(2, 7, max_moves=200)
    area = roots.color.shape[1]
    tree = S.new_tree(2, 402, 402 * area, area=area)
    spare = S.new_tree(2, 402, 402 * area, area=area)
    tree = mcts.search(roots, random_evaluator(8), 200, tree=tree, params=PARAMS)
    moves = np.array([max(S.root_visits(tree, g).items(), key=lambda kv: kv[1])[0] for g in (0, 1)])
    children = []
    for g in range(2):
        start, count = tree.first_edge[g, S.ROOT], tree.num_edges[g, S.ROOT]
        children.append(
            next(
                tree.edge_child[g, e]
                for e in range(start, start + count)
                if tree.edge_move[g, e] == moves[g]
            )
        )
    old = tree
    new = S.reroot_all(tree, spare, moves)
    for g in range(2):
        assert new.visits[g, S.ROOT] == old.visits[g, children[g]] > 1
        # Every kept node has the visits and value of the node it came from.
        for k in range(new.node_count[g]):
            source = new.reroot_map[g, k]
            assert new.visits[g, k] == old.visits[g, source]
            assert new.value_sum[g, k] == old.value_sum[g, source]
        assert new.node_count[g] == _subtree_size(old, g, children[g])
    # The search goes on from the kept tree: the game moves on, and visits top up to 200.
    gb.play_all(roots, moves)
    kept = new.visits[:, S.ROOT].copy()
    new = mcts.search(roots, random_evaluator(9), 200, tree=new, params=PARAMS)
    assert (new.visits[:, S.ROOT] == 200).all() and (kept > 1).all()
    # A move the search never tried starts a fresh tree.
    fresh = S.reroot_all(new, old, np.array([-5, -5]))
    assert (fresh.node_count == 1).all() and (fresh.visits[:, S.ROOT] == 0).all()


def _subtree_size(tree, g, n):
    size = 1
    start, count = tree.first_edge[g, n], tree.num_edges[g, n]
    if start >= 0:
        for e in range(start, start + count):
            if tree.edge_child[g, e] >= 0:
                size += _subtree_size(tree, g, tree.edge_child[g, e])
    return size


def test_temperature_halves_every_board_width_moves():
    t = S.temperature(np.array([0, 9, 18, 19, 1000]), np.array([9, 9, 9, 19, 9]))
    assert np.allclose(t, [0.8, 0.5, 0.35, 0.5, 0.2])


def test_move_choice_follows_visits_sharpened_by_the_temperature():
    visits = np.zeros((1, 10))
    visits[0, [2, 5, 7]] = [60, 30, 10]
    rng = np.random.default_rng(0)
    early = np.array([S.choose_moves(visits, [0], [9], rng)[0] for _ in range(4000)])
    late = np.array([S.choose_moves(visits, [200], [9], rng)[0] for _ in range(4000)])
    assert set(early) <= {2, 5, 7} and set(late) <= {2, 5, 7}
    # At temperature 0.8 the weights are visits^1.25; at 0.2, visits^5.
    for draws, power in ((early, 1.25), (late, 5.0)):
        w = np.array([60, 30, 10], float) ** power
        expected = w / w.sum()
        seen = np.array([(draws == m).mean() for m in (2, 5, 7)])
        assert np.allclose(seen, expected, atol=0.03), (seen, expected)
    with pytest.raises(ValueError, match="no visits"):
        S.choose_moves(np.zeros((1, 10)), [0], [9], rng)


def test_a_node_without_moves_is_an_end_of_the_game():
    # A move list one move from full: every leaf below the root has no legal move left.
    roots = gb.new_boards(1, 5, max_moves=1)
    tree = mcts.search(roots, score_evaluator, 30, params=PARAMS)
    assert tree.visits[0, S.ROOT] == 30 and not tree.pending.any()
    children = [c for c in tree.edge_child[0, : tree.edge_count[0]] if c >= 0]
    assert children and all(tree.terminal[0, c] == 1 for c in children)


@pytest.mark.parametrize("komi, pass_is_lost", [(7.5, True), (-20.5, False)])
def test_a_pass_the_opponent_can_answer_with_a_win_is_seen_as_lost(komi, pass_is_lost):
    """A net with a flat value and a strong pass prior: after Black's pass White can pass
    back and win on the board, so Black's pass is a loss from its first visit on (without the
    bound that visit would be worth the net's 0); with a komi that has Black ahead, it is
    worth at least the net's value."""
    game = game_from_diagram(
        """
        . . . . .
        . X . O .
        . . . . .
        . O . X .
        . . . . .
        """,
        rules="chinese",
        to_move=BLACK,
    )
    game.set_komi(komi)

    def flat_passing(leaves):
        policy = np.full(leaves.color.shape, 0.01, np.float32)
        policy[:, PASS] = 0.9
        return policy, np.zeros(leaves.games, np.float32)

    tree = mcts.search(game.b, flat_passing, 17, params=PARAMS._replace(forced_playouts_k=0.0))
    edges = range(tree.first_edge[0, 0], tree.first_edge[0, 0] + tree.num_edges[0, 0])
    (pass_edge,) = [e for e in edges if tree.edge_move[0, e] == PASS]
    child = tree.edge_child[0, pass_edge]
    q = tree.value_sum[0, child] / tree.visits[0, child]  # for Black, who passed
    assert q == -1.0 if pass_is_lost else q >= 0.0


# -- the Gumbel root -------------------------------------------------------------------------


def mctx_sequence(m: int, n: int) -> list[int]:
    """mctx's get_sequence_of_considered_visits, written out: the visits a considered move
    has when the root's k-th walk takes it, in sequential halving of n walks over m moves."""
    if m <= 1:
        return list(range(n))
    log2max = math.ceil(math.log2(m))
    sequence, visits, considered = [], [0] * m, m
    while len(sequence) < n:
        for _ in range(max(1, int(n / (log2max * considered)))):
            sequence.extend(visits[:considered])
            for i in range(considered):
                visits[i] += 1
        considered = max(2, considered // 2)
    return sequence[:n]


@pytest.mark.parametrize("m", [1, 2, 3, 4, 7, 16])
@pytest.mark.parametrize("n", [1, 5, 16, 20, 64, 99])
def test_halving_schedule_is_mctx_sequence(m, n):
    assert [S.halving_visits(m, n, k) for k in range(n)] == mctx_sequence(m, n)


def _final_visits(m: int, n: int) -> list[int]:
    """Each considered move's visits after the n walks of the schedule, most first."""
    counts: dict[int, int] = {}
    level_seen: dict[int, int] = {}
    for wanted in mctx_sequence(m, n):
        level_seen[wanted] = level_seen.get(wanted, 0) + 1
        slot = level_seen[wanted] - 1  # the slot-th move to reach this level
        counts[slot] = counts.get(slot, 0) + 1
    return sorted(counts.values(), reverse=True)


@pytest.mark.parametrize("visits", [17, 65, 101])
def test_gumbel_root_spreads_its_visits_by_sequential_halving(visits):
    """16 of the 82 moves of an empty 9x9 board get visits, in the schedule's amounts."""
    roots = gb.new_boards(2, 9, max_moves=200)
    tree = mcts.search(roots, random_evaluator(3), visits, params=PARAMS, considered=16,
                    gumbel_rng=new_rng(2, 7))  # fmt: skip
    for g in range(2):
        got = sorted((v for v in S.root_visits(tree, g).values() if v), reverse=True)
        assert got == _final_visits(16, visits - 1)
        considered = tree.gumbel[g, : tree.num_edges[g, S.ROOT]] > -1e29
        assert considered.sum() == 16
    # Different draws consider different moves.
    assert not np.array_equal(tree.gumbel[0] > -1e29, tree.gumbel[1] > -1e29)


def test_gumbel_root_finds_the_capture_with_few_visits():
    game = atari()
    capture = gb.point(game.b.stride, 2, 0)
    tree = mcts.search(game.b, score_evaluator, 40, params=PARAMS, considered=32)
    assert S.gumbel_moves_all(tree, PARAMS)[0] == capture
    targets, kept = S.gumbel_targets_all(tree, PARAMS, game.b.color.shape[1])
    assert kept[0] == 39 and targets[0].argmax() == capture
    assert targets[0].sum() == pytest.approx(1.0, abs=1e-5)
    legal = gb.legal_all(game.b)[0]
    assert (targets[0][legal] > 0).all() and not targets[0][~legal].any()


def test_completed_q_target_improves_on_the_prior():
    """An unvisited move keeps its prior's share relative to other unvisited moves (they share
    the mixed value); the move whose search value is best gains over its prior."""
    game = atari()
    rng = np.random.default_rng(5)
    prior = rng.random(game.b.color.shape[1]).astype(np.float32) + 0.1
    capture = gb.point(game.b.stride, 2, 0)
    prior[capture] = 3.0  # the largest prior: one of the 4 moves a draw-free root considers

    def evaluate(leaves):
        _, value = score_evaluator(leaves)
        return np.broadcast_to(prior, leaves.color.shape).copy(), value

    tree = mcts.search(game.b, evaluate, 12, params=PARAMS, considered=4)
    targets, _ = S.gumbel_targets_all(tree, PARAMS, game.b.color.shape[1])
    visits = S.root_visits(tree, 0)
    edges = range(tree.first_edge[0, 0], tree.first_edge[0, 0] + tree.num_edges[0, 0])
    priors = {int(tree.edge_move[0, e]): float(tree.edge_prior[0, e]) for e in edges}
    unvisited = [m for m, v in visits.items() if v == 0]
    ratios = [targets[0][m] / priors[m] for m in unvisited]
    assert len(unvisited) > 10 and np.ptp(ratios) < 1e-4 * np.mean(ratios)
    assert visits[capture] > 0 and targets[0][capture] / priors[capture] > max(ratios)


def new_rng(games: int, seed: int) -> np.ndarray:
    from gocore.playout import new_rng as make

    return make(games, seed)
