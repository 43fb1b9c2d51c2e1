"""Batched MCTS as arrays: one preallocated tree per game, many games stepped in lockstep.

The tree (mctx's layout, with compact edges): nodes and edges are integer indices into
per-game arrays. A node is created when the search first walks an edge; its edges are created
when it is expanded, one per legal move only, so memory grows with visits x legal moves.

One step of the search, for every game at once (`select_all`, then the caller's network call,
then `expand_and_backup_all`):
1. select: from the root, follow the edge of highest PUCT value (first-play urgency for
   unvisited edges; forced playouts at the root) until an edge with no node; create the node,
   play the path's moves on the game's leaf board, add virtual loss along the path;
2. the caller encodes the leaf boards (gocore.features) and evaluates them in one call;
3. expand and back up: the leaf gets an edge per legal move with the network's prior, and its
   value goes up the path, the sign flipping at every level, virtual loss removed. A leaf
   just after a pass is worth at least, to its player to move, the exact result of passing
   back and ending the game: the network's value is raised to it where lower (a minimax
   bound; without it a flat early value lets a search pass into a lost game).

A node's `value_sum` is the sum of the utilities seen below it from the view of the player who
moved into it (the player to move at its parent), so a parent maximises value_sum / visits.

Root policy targets (`policy_targets`) apply KataGo's pruning: forced playouts are taken off
every child but the most visited while its PUCT value stays below the best's; children left
with one playout are dropped.

The Gumbel root (Danihelka et al. 2022, "Policy improvement by planning with Gumbel", as in
mctx's gumbel_muzero_policy), for a game whose root has `considered` > 0: once the root is
expanded, `add_root_gumbel` draws a Gumbel variable g(a) for each move and keeps the m =
`considered` moves of largest g(a) + logits(a) (sampling m moves without replacement); the
root's walks then spread the visit budget over them by sequential halving
(`halving_visits`), each walk taking the considered move with the schedule's visit count and
the largest g + logits + sigma(q); `gumbel_move` plays the most visited such move, and
`gumbel_target` is the completed-Q policy softmax(logits + sigma(completed q)), an unvisited
move's q being the mixed value of the root's own evaluation and its visited children. Below
the root the walks are PUCT's. A Gumbel root does not reuse its tree (the schedule counts a
search's own visits).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from gocore.board import (
    BLACK,
    EMPTY,
    LEGAL,
    MAX_AREA,
    PASS,
    Boards,
    copy_game,
    legality,
    new_boards,
    play_legal,
    score,
)
from gocore.jit import CPU, batched, kernel, per_game, routine
from gocore.playout import next_u64

ROOT = 0
UNVISITED = -1
_S11 = np.uint64(11)  # an edge with no node yet; a node with no edges yet (not expanded)


class SearchParams(NamedTuple):
    """The search's knobs (all numbers, so the kernels take them as one tuple). No defaults
    here: params.yaml's search sections are where they live (stages.params builds this)."""

    c_puct: float
    puct_exponent: float  # 0.5: AlphaZero's sqrt; Cazenave's generalized PUCT: 0.737
    fpu_reduction: float  # unvisited children: parent's value - this * sqrt(visited prior)
    root_fpu_reduction: float
    forced_playouts_k: float  # n_forced = sqrt(k * P * total visits); 0 turns them off
    virtual_loss: float
    # Appendix F: utility = win value + score_utility * (2/pi) atan((score - centre) / width),
    # the centre being the root's expected score when its search began; 0 turns it off.
    score_utility: float
    # sigma(q) = (gumbel_c_visit + the most visits of a root child) * gumbel_c_scale * q, q
    # rescaled to [0, 1] (the Gumbel paper and mctx: 50 and 0.1); used by Gumbel roots only.
    gumbel_c_visit: float
    gumbel_c_scale: float


class Tree(NamedTuple):
    """G trees of at most N nodes and E edges (shapes in the comments)."""

    visits: np.ndarray  # [G, N] int32 completed visits
    value_sum: np.ndarray  # [G, N] float32 utilities, from the view of the player moving into it
    win_sum: np.ndarray  # [G, N] float32 the win/loss part of those utilities (same view)
    score_sum: np.ndarray  # [G, N] float32 expected final scores, Black's lead (no flip)
    pending: np.ndarray  # [G, N] int32 virtual visits in flight
    parent: np.ndarray  # [G, N] int32 parent node (-1 at the root)
    first_edge: np.ndarray  # [G, N] int32 its edges' start, UNVISITED until expanded
    num_edges: np.ndarray  # [G, N] int32
    terminal: np.ndarray  # [G, N] int8 whether the game is over at this node
    edge_move: np.ndarray  # [G, E] int16 the move (padded point or PASS)
    edge_prior: np.ndarray  # [G, E] float32
    edge_child: np.ndarray  # [G, E] int32 node index, UNVISITED if never walked
    node_count: np.ndarray  # [G] int32
    edge_count: np.ndarray  # [G] int32
    noise: np.ndarray  # [G, A] float32 the Dirichlet sample of the root's edges (scratch)
    reroot_map: np.ndarray  # [G, N] int32 scratch of `reroot`: old node of each new one
    leaf: np.ndarray  # [G, L] int32 the leaves selected this step (-1: none)
    leaf_value: np.ndarray  # [G, L] float32 a terminal leaf's exact utility (player to move)
    leaf_win: np.ndarray  # [G, L] float32 its win/loss value
    leaf_score: np.ndarray  # [G, L] float32 its final score (Black's lead)
    # Whether leaf i follows a pass (the game not over): its value is at least what passing
    # back and ending the game gives its player to move, the leaf_* values above.
    leaf_after_pass: np.ndarray  # [G, L] int8
    explore: np.ndarray  # [G] int8 whether the root takes forced playouts (a full search)
    centre: np.ndarray  # [G] float64 the score utility's centre (Black's lead); NaN: none yet
    # The Gumbel root (see above); considered 0: a PUCT root.
    considered: np.ndarray  # [G] int32 the moves sequential halving spreads the visits over
    budget: np.ndarray  # [G] int32 the search's visits, which the halving schedule divides
    gumbel: np.ndarray  # [G, A] float32 g + logits of each root edge; -1e30: not considered
    sigma: np.ndarray  # [G, A] float32 scratch: sigma(completed q) of each root edge
    root_raw: np.ndarray  # [G] float32 the root's own evaluation (utility, player to move)


def tree_size(visits: int, leaves_per_game: int, points: int) -> tuple[int, int]:
    """(nodes, edges) of a tree that holds a search of `visits` visits taken `leaves_per_game`
    leaves a step on a board of `points` points (each node's moves and a pass): what the
    self-play and match drivers, the GTP engine and gocore.mcts.search allocate."""
    nodes = visits + leaves_per_game + 2
    return nodes, nodes * (points + 1)


def new_tree(
    games: int, max_nodes: int, max_edges: int, leaves_per_game: int = 1, area: int = MAX_AREA
) -> Tree:
    tree = Tree(
        visits=np.zeros((games, max_nodes), np.int32),
        value_sum=np.zeros((games, max_nodes), np.float32),
        win_sum=np.zeros((games, max_nodes), np.float32),
        score_sum=np.zeros((games, max_nodes), np.float32),
        pending=np.zeros((games, max_nodes), np.int32),
        parent=np.zeros((games, max_nodes), np.int32),
        first_edge=np.zeros((games, max_nodes), np.int32),
        num_edges=np.zeros((games, max_nodes), np.int32),
        terminal=np.zeros((games, max_nodes), np.int8),
        edge_move=np.zeros((games, max_edges), np.int16),
        edge_prior=np.zeros((games, max_edges), np.float32),
        edge_child=np.zeros((games, max_edges), np.int32),
        node_count=np.zeros(games, np.int32),
        edge_count=np.zeros(games, np.int32),
        noise=np.zeros((games, area), np.float32),
        reroot_map=np.zeros((games, max_nodes), np.int32),
        leaf=np.full((games, leaves_per_game), -1, np.int32),
        leaf_value=np.zeros((games, leaves_per_game), np.float32),
        leaf_win=np.zeros((games, leaves_per_game), np.float32),
        leaf_score=np.zeros((games, leaves_per_game), np.float32),
        leaf_after_pass=np.zeros((games, leaves_per_game), np.int8),
        explore=np.ones(games, np.int8),
        centre=np.full(games, np.nan),
        considered=np.zeros(games, np.int32),
        budget=np.zeros(games, np.int32),
        gumbel=np.zeros((games, area), np.float32),
        sigma=np.zeros((games, area), np.float32),
        root_raw=np.zeros(games, np.float32),
    )
    reset_all(tree)
    return tree


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------


@kernel
def reset_tree(t, g):
    """An empty tree: the root only, not expanded."""
    t.node_count[g] = 1
    t.edge_count[g] = 0
    t.visits[g, ROOT] = 0
    t.value_sum[g, ROOT] = 0.0
    t.win_sum[g, ROOT] = 0.0
    t.score_sum[g, ROOT] = 0.0
    t.pending[g, ROOT] = 0
    t.parent[g, ROOT] = -1
    t.first_edge[g, ROOT] = UNVISITED
    t.num_edges[g, ROOT] = 0
    t.terminal[g, ROOT] = 0
    t.considered[g] = 0
    t.root_raw[g] = 0.0


@kernel
def _new_node(t, g, parent):
    n = t.node_count[g]
    if n >= t.visits.shape[1]:
        return -1  # the tree is full
    t.node_count[g] = n + 1
    t.visits[g, n] = 0
    t.value_sum[g, n] = 0.0
    t.win_sum[g, n] = 0.0
    t.score_sum[g, n] = 0.0
    t.pending[g, n] = 0
    t.parent[g, n] = parent
    t.first_edge[g, n] = UNVISITED
    t.num_edges[g, n] = 0
    t.terminal[g, n] = 0
    return n


@kernel
def node_q(t, g, n, virtual_loss):
    """Mean utility of node n for the player moving into it, counting visits in flight as
    losses."""
    visits = t.visits[g, n] + t.pending[g, n]
    if visits == 0:
        return 0.0
    return (t.value_sum[g, n] - virtual_loss * t.pending[g, n]) / visits


@routine
def select_edge(t, g, n, params, is_root, total_root_visits):
    """The edge of node n with the highest PUCT value (forced playouts first at the root); a
    Gumbel root's by sequential halving."""
    if is_root and t.considered[g] > 0:
        return gumbel_root_edge(t, g, params)
    start = t.first_edge[g, n]
    count = t.num_edges[g, n]
    parent_visits = t.visits[g, n] + t.pending[g, n]
    # First-play urgency: unvisited children are valued at the parent's value, reduced by the
    # square root of the prior already explored.
    visited_prior = 0.0
    for e in range(start, start + count):
        child = t.edge_child[g, e]
        if child >= 0 and t.visits[g, child] + t.pending[g, child] > 0:
            visited_prior += t.edge_prior[g, e]
    # The parent's value for the player to move at n is minus n's own value.
    parent_q = -node_q(t, g, n, params.virtual_loss) if parent_visits > 0 else 0.0
    # The root's own reduction only where it takes noise (a full search); cheap searches use
    # the same first-play urgency everywhere (the paper: c_FPU = 0 at the root with noise).
    reduction = params.root_fpu_reduction if is_root and t.explore[g] else params.fpu_reduction
    fpu = parent_q - reduction * math.sqrt(visited_prior)
    explore = params.c_puct * max(float(parent_visits), 1.0) ** params.puct_exponent
    best = start
    best_score = -1e30
    best_forced = False
    for e in range(start, start + count):
        child = t.edge_child[g, e]
        child_visits = 0
        q = fpu
        if child >= 0:
            child_visits = t.visits[g, child] + t.pending[g, child]
            if child_visits > 0:
                q = node_q(t, g, child, params.virtual_loss)
        prior = t.edge_prior[g, e]
        if is_root and t.explore[g] and params.forced_playouts_k > 0.0:
            forced = math.sqrt(params.forced_playouts_k * prior * total_root_visits)
            if child_visits < forced:
                # Forced playout: this child has had fewer visits than its noise-given prior
                # demands; it outranks every unforced one, and among forced children the
                # larger prior goes first (as KataGo, which opens new children in policy
                # order). A score of 1e20 + prior would tie them all in float64 and hand
                # the forced visits out in board order.
                if not best_forced or prior > best_score:
                    best_forced = True
                    best_score = prior
                    best = e
                continue
        if best_forced:
            continue
        score = q + explore * prior / (1.0 + child_visits)
        if score > best_score:
            best_score = score
            best = e
    return best


@kernel
def _undo_pending(t, g, n):
    while n >= 0:
        t.pending[g, n] -= 1
        n = t.parent[g, n]


@routine
def select_leaf(t, g, root_board, gb, leaves, lg, params):
    """Walk from the root to a new leaf, playing the path on `leaves` slot lg (a copy of the
    root board); returns the leaf's node index, or -1 if the tree is full. Adds a virtual
    visit to every node on the path. A terminal node reached again is its own leaf."""
    copy_game(root_board, gb, leaves, lg)
    n = ROOT
    total = t.visits[g, ROOT]
    while True:
        if t.terminal[g, n] or t.first_edge[g, n] == UNVISITED:
            t.pending[g, n] += 1
            return n  # a terminal node, or one selected by another leaf this step
        # The edge is chosen before this walk's own virtual visit lands on n: counted first,
        # it would be a loss in n's value and so a win in every unvisited child's first-play
        # urgency (about +1 / visits: +0.5 at one visit), and the tree would explore far wider
        # than PUCT intends. Other walks in flight still count.
        e = select_edge(t, g, n, params, n == ROOT, total)
        t.pending[g, n] += 1
        move = t.edge_move[g, e]
        play_legal(leaves, lg, move, leaves.to_move[lg])
        child = t.edge_child[g, e]
        if child < 0:
            child = _new_node(t, g, n)
            if child < 0:
                _undo_pending(t, g, n)  # the tree is full: this walk leaves no trace
                return -1
            t.edge_child[g, e] = child
            t.pending[g, child] += 1
            if leaves.passes[lg] >= 2:
                t.terminal[g, child] = 1
            return child
        n = child


@kernel
def score_utility(black_lead, centre, width, to_move, weight):
    """Appendix F's score utility of a final score for the player to move:
    weight * (2/pi) * atan((score - centre) / width), the score from that player's side.
    0 while there is no centre (NaN: the root's own first evaluation)."""
    if weight == 0.0 or centre != centre:
        return 0.0
    u = weight * (2.0 / math.pi) * math.atan((black_lead - centre) / width)
    return u if to_move == BLACK else -u


@routine
def terminal_value(t, g, i, leaves, lg, no_marks, owner, params):
    """The exact values of a finished game for the player to move, into t.leaf_*[g, i]: win
    +1, loss -1, draw 0, plus the score utility; scored by the game's rules as the stones
    stand (no dead stones)."""
    black_lead = score(leaves, lg, no_marks, no_marks, owner)
    win = 0.0
    if black_lead != 0:
        win = 1.0 if (black_lead > 0) == (leaves.to_move[lg] == BLACK) else -1.0
    t.leaf_win[g, i] = win
    t.leaf_score[g, i] = black_lead
    t.leaf_value[g, i] = win + score_utility(
        black_lead, t.centre[g], float(leaves.size[lg]), leaves.to_move[lg], params.score_utility
    )


@routine
def expand(t, g, n, leaves, lg, policy):
    """Give leaf n an edge per legal move of the leaf board, with prior policy[p] (renormalized
    over the legal moves; uniform if the policy gives them nothing)."""
    c = leaves.to_move[lg]
    start = t.edge_count[g]
    count = 0
    total = 0.0
    cells = leaves.color.shape[1]
    for i in range(1, cells + 1):
        # The board's points first, the pass last: among equal PUCT values the first edge
        # wins, and a pass should not (with uniform priors it would end every early game).
        p = i if i < cells else PASS
        if p != PASS and leaves.color[lg, p] != EMPTY:
            continue
        if legality(leaves, lg, p, c) != LEGAL:
            continue
        if start + count >= t.edge_move.shape[1]:
            break  # edge storage full: the remaining moves are left out
        t.edge_move[g, start + count] = p
        t.edge_prior[g, start + count] = policy[p]
        t.edge_child[g, start + count] = UNVISITED
        total += policy[p]
        count += 1
    if count > 0:
        for e in range(start, start + count):
            t.edge_prior[g, e] = t.edge_prior[g, e] / total if total > 0 else 1.0 / count
    t.first_edge[g, n] = start
    t.num_edges[g, n] = count
    t.edge_count[g] = start + count
    if count == 0:
        # No move at all (the move list is full, or edge storage ran out): an end of the game
        # for the search, scored as the stones stand when reached again.
        t.terminal[g, n] = 1


@kernel
def backup(t, g, n, value, win, black_score):
    """value and win: the utility and its win/loss part for the player to move at leaf n;
    black_score: its expected final score, Black's lead. Adds them up the path, the first two
    flipping sign at each level, and removes the virtual visits."""
    v = -value  # for the player who moved into n
    w = -win
    while n >= 0:
        t.visits[g, n] += 1
        t.pending[g, n] -= 1
        t.value_sum[g, n] += v
        t.win_sum[g, n] += w
        t.score_sum[g, n] += black_score
        v = -v
        w = -w
        n = t.parent[g, n]


# ---------------------------------------------------------------------------------------------
# The root: noise, policy targets with pruning, tree reuse
# ---------------------------------------------------------------------------------------------


@kernel
def _uniform(rng, g):
    """A uniform float in (0, 1)."""
    return ((next_u64(rng, g) >> _S11) + 0.5) * (1.0 / 9007199254740992.0)


@kernel
def _gamma(rng, g, alpha):
    """A Gamma(alpha, 1) sample (Marsaglia and Tsang; alpha < 1 through Gamma(alpha + 1))."""
    boost = 1.0
    if alpha < 1.0:
        boost = _uniform(rng, g) ** (1.0 / alpha)
        alpha += 1.0
    d = alpha - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    while True:
        # A standard normal by Box-Muller.
        x = math.sqrt(-2.0 * math.log(_uniform(rng, g))) * math.cos(
            2.0 * math.pi * _uniform(rng, g)
        )
        v = 1.0 + c * x
        if v <= 0.0:
            continue
        v = v * v * v
        u = _uniform(rng, g)
        if math.log(u) < 0.5 * x * x + d - d * v + d * math.log(v):
            return d * v * boost


@routine
def add_root_noise(t, g, rng, alpha_total, epsilon):
    """Mix Dirichlet noise into the root's priors: P = (1 - epsilon) P + epsilon Dir(alpha),
    alpha = alpha_total / the number of legal moves (the paper: 0.03 * 361 / legal moves)."""
    start = t.first_edge[g, ROOT]
    count = t.num_edges[g, ROOT]
    if start < 0 or count == 0:
        return
    alpha = alpha_total / count
    total = 0.0
    for e in range(start, start + count):
        sample = _gamma(rng, g, alpha)
        t.noise[g, e - start] = sample
        total += sample
    for e in range(start, start + count):
        share = t.noise[g, e - start] / total if total > 0 else 1.0 / count
        t.edge_prior[g, e] = (1.0 - epsilon) * t.edge_prior[g, e] + epsilon * share


@routine
def policy_target(t, g, params, out):
    """out[move] = the root's visit distribution after policy target pruning (KataGo): for every
    child but the most visited, take off up to its forced playouts sqrt(k P N) while its PUCT
    value stays at most the best child's; a child left with one playout gets none. Only where
    the root took forced playouts (t.explore[g]). Returns the number of visits left in the
    target (0 if the root has none)."""
    for p in range(out.shape[0]):
        out[p] = 0.0
    start = t.first_edge[g, ROOT]
    count = t.num_edges[g, ROOT]
    if start < 0:
        return 0.0
    total = 0
    best = -1
    best_visits = -1
    for e in range(start, start + count):
        child = t.edge_child[g, e]
        n = t.visits[g, child] if child >= 0 else 0
        total += n
        if n > best_visits:
            best_visits = n
            best = e
    if total == 0:
        return 0.0
    explore = params.c_puct * float(total) ** params.puct_exponent
    best_child = t.edge_child[g, best]
    best_q = t.value_sum[g, best_child] / best_visits
    best_puct = best_q + explore * t.edge_prior[g, best] / (1.0 + best_visits)
    kept = 0.0
    for e in range(start, start + count):
        child = t.edge_child[g, e]
        n = float(t.visits[g, child]) if child >= 0 else 0.0
        if e != best and n > 0 and t.explore[g] and params.forced_playouts_k > 0.0:
            prior = t.edge_prior[g, e]
            q = t.value_sum[g, child] / n
            forced = math.sqrt(params.forced_playouts_k * prior * total)
            reduced = n
            if best_puct > q:
                # Fewest visits (a real number, as KataGo's weights) keeping
                # q + explore * prior / (1 + n') <= best_puct.
                floor = explore * prior / (best_puct - q) - 1.0
                reduced = min(max(n - forced, floor, 0.0), n)
            if reduced <= 1.0:
                reduced = 0.0
            n = reduced
        out[t.edge_move[g, e]] = n
        kept += n
    for p in range(out.shape[0]):
        out[p] = out[p] / kept
    return kept


# ---------------------------------------------------------------------------------------------
# The Gumbel root (Danihelka et al. 2022; mctx's gumbel_muzero_policy)
# ---------------------------------------------------------------------------------------------

NOT_CONSIDERED = -1e30  # t.gumbel of a move not considered (compare with is_considered)


@kernel
def is_considered(value):
    """Whether a t.gumbel entry is a considered move's (float32 rounds NOT_CONSIDERED)."""
    return value > -1e29


@kernel
def halving_visits(m, n, k):
    """The visits a considered move must have for the root's k-th walk (from 0) to take it, in
    sequential halving of n visits over m moves as the Gumbel search schedules it (mctx's
    get_sequence_of_considered_visits): each phase gives every move still considered
    max(1, n // (ceil(log2 m) * considered)) more visits, one round at a time, then keeps the
    better half (at least 2). Walks past n go on with the last phase's rounds."""
    if m <= 1:
        return k
    log2m = 0
    while (1 << log2m) < m:
        log2m += 1
    considered = m
    done = 0  # walks scheduled before this phase
    level = 0  # visits of each considered move when the phase starts
    while True:
        extra = max(1, n // (log2m * considered))
        if k < done + extra * considered:
            return level + (k - done) // considered
        done += extra * considered
        level += extra
        considered = max(2, considered // 2)


@routine
def gumbel_sigma(t, g, params, out):
    """out[e - start] = sigma(completed q) for each root edge e (mctx's
    qtransform_completed_by_mix_value): a visited child's q for the player to move at the root,
    an unvisited one's the mixed value (the root's own evaluation averaged with the
    prior-weighted q of the visited children, weighted by their visits), min-max rescaled to
    [0, 1], times (c_visit + the most visits of a child) * c_scale. Visits in flight count as
    virtual losses, as in PUCT."""
    start = t.first_edge[g, ROOT]
    count = t.num_edges[g, ROOT]
    visited = 0.0
    weighted = 0.0
    prior_visited = 0.0
    most = 0
    for e in range(start, start + count):
        child = t.edge_child[g, e]
        n = t.visits[g, child] + t.pending[g, child] if child >= 0 else 0
        if n > 0:
            visited += n
            weighted += t.edge_prior[g, e] * node_q(t, g, child, params.virtual_loss)
            prior_visited += t.edge_prior[g, e]
            most = max(most, n)
    mixed = t.root_raw[g]
    if prior_visited > 0.0:
        mixed = (mixed + visited * weighted / prior_visited) / (visited + 1.0)
    low = 1e30
    high = -1e30
    for e in range(start, start + count):
        child = t.edge_child[g, e]
        q = mixed
        if child >= 0 and t.visits[g, child] + t.pending[g, child] > 0:
            q = node_q(t, g, child, params.virtual_loss)
        out[e - start] = q
        low = min(low, q)
        high = max(high, q)
    scale = (params.gumbel_c_visit + most) * params.gumbel_c_scale / max(high - low, 1e-8)
    for e in range(start, start + count):
        out[e - start] = (out[e - start] - low) * scale


@routine
def add_root_gumbel(t, g, rng, considered, sample):
    """Make g's expanded root a Gumbel root: t.gumbel = g(a) + log prior(a) per edge, g(a) a
    standard Gumbel draw (0 without `sample`: a match's deterministic search), and only the
    `considered` edges of largest value kept (the rest NOT_CONSIDERED): Gumbel-top-k, a sample
    of that many moves without replacement from the policy. The visit budget for the
    schedule is t.budget[g], set by the caller."""
    start = t.first_edge[g, ROOT]
    count = t.num_edges[g, ROOT]
    if start < 0 or count == 0:
        return
    for e in range(start, start + count):
        noise = 0.0
        if sample:
            noise = -math.log(-math.log(_uniform(rng, g)))
        score = noise + math.log(max(t.edge_prior[g, e], 1e-30))
        t.gumbel[g, e - start] = score
        t.sigma[g, e - start] = score  # scratch for the selection below
    m = min(considered, count)
    for _ in range(m):
        best = start
        for e in range(start, start + count):
            if t.sigma[g, e - start] > t.sigma[g, best - start]:
                best = e
        t.sigma[g, best - start] = NOT_CONSIDERED  # taken
    for e in range(start, start + count):
        if is_considered(t.sigma[g, e - start]):
            t.gumbel[g, e - start] = NOT_CONSIDERED
    t.considered[g] = m


@routine
def gumbel_root_edge(t, g, params):
    """The root edge the next walk takes: among the considered moves with the visits the
    halving schedule asks for at this walk, the one of largest g + logits + sigma(q); if none
    has them (walks in flight), the least visited considered move, ties to the larger score."""
    start = t.first_edge[g, ROOT]
    count = t.num_edges[g, ROOT]
    k = t.visits[g, ROOT] + t.pending[g, ROOT] - 1  # the root's own evaluation is not a walk
    wanted = halving_visits(t.considered[g], t.budget[g], k)
    gumbel_sigma(t, g, params, t.sigma[g])
    best = -1
    best_score = -1e30
    fallback = start
    fallback_visits = 1 << 30
    fallback_score = -1e30
    for e in range(start, start + count):
        if not is_considered(t.gumbel[g, e - start]):
            continue
        child = t.edge_child[g, e]
        n = t.visits[g, child] + t.pending[g, child] if child >= 0 else 0
        score = t.gumbel[g, e - start] + t.sigma[g, e - start]
        if n == wanted and score > best_score:
            best = e
            best_score = score
        if n < fallback_visits or (n == fallback_visits and score > fallback_score):
            fallback = e
            fallback_visits = n
            fallback_score = score
    return best if best >= 0 else fallback


@routine
def gumbel_move(t, g, params):
    """The move a Gumbel root plays: of the most visited considered moves, the one of largest
    g + logits + sigma(q) (PASS if the root has no edges)."""
    start = t.first_edge[g, ROOT]
    count = t.num_edges[g, ROOT]
    if start < 0 or count == 0:
        return PASS
    gumbel_sigma(t, g, params, t.sigma[g])
    most = -1
    for e in range(start, start + count):
        child = t.edge_child[g, e]
        if is_considered(t.gumbel[g, e - start]) and child >= 0:
            most = max(most, t.visits[g, child])
    best = start
    best_score = -1e30
    for e in range(start, start + count):
        if not is_considered(t.gumbel[g, e - start]):
            continue
        child = t.edge_child[g, e]
        n = t.visits[g, child] if child >= 0 else 0
        score = t.gumbel[g, e - start] + t.sigma[g, e - start]
        if n == max(most, 0) and score > best_score:
            best = e
            best_score = score
    return t.edge_move[g, best]


@routine
def gumbel_target(t, g, params, out):
    """out[move] = the completed-Q policy softmax(logits + sigma(completed q)) over every legal
    root move (the Gumbel paper's policy target, visited or not). Returns the root's child
    visits (0: no target)."""
    for p in range(out.shape[0]):
        out[p] = 0.0
    start = t.first_edge[g, ROOT]
    count = t.num_edges[g, ROOT]
    if start < 0 or count == 0:
        return 0.0
    gumbel_sigma(t, g, params, t.sigma[g])
    top = -1e30
    visits = 0.0
    for e in range(start, start + count):
        logit = math.log(max(t.edge_prior[g, e], 1e-30)) + t.sigma[g, e - start]
        t.sigma[g, e - start] = logit
        top = max(top, logit)
        child = t.edge_child[g, e]
        visits += t.visits[g, child] if child >= 0 else 0
    total = 0.0
    for e in range(start, start + count):
        weight = math.exp(t.sigma[g, e - start] - top)
        out[t.edge_move[g, e]] = weight
        total += weight
    for p in range(out.shape[0]):
        out[p] = out[p] / total
    return visits


@routine
def reroot(t, g, child, into, gi):
    """Copy the subtree under node `child` of tree t (game g) into tree `into` (game gi, another
    tree) as its whole tree, `child` becoming the root: the part of the search a move keeps.
    Breadth-first; into.reroot_map[gi, k] is the old index of new node k. Returns the nodes."""
    into.node_count[gi] = 1
    into.edge_count[gi] = 0
    into.considered[gi] = 0  # a PUCT root (a Gumbel search starts afresh)
    into.reroot_map[gi, 0] = child
    head = 0
    while head < into.node_count[gi]:
        old = into.reroot_map[gi, head]
        new = head
        head += 1
        into.visits[gi, new] = t.visits[g, old]
        into.value_sum[gi, new] = t.value_sum[g, old]
        into.win_sum[gi, new] = t.win_sum[g, old]
        into.score_sum[gi, new] = t.score_sum[g, old]
        into.pending[gi, new] = 0
        into.terminal[gi, new] = t.terminal[g, old]
        start = t.first_edge[g, old]
        count = t.num_edges[g, old]
        if start < 0:
            into.first_edge[gi, new] = UNVISITED
            into.num_edges[gi, new] = 0
            continue
        first = into.edge_count[gi]
        into.first_edge[gi, new] = first
        into.num_edges[gi, new] = count
        into.edge_count[gi] = first + count
        for i in range(count):
            e = start + i
            into.edge_move[gi, first + i] = t.edge_move[g, e]
            into.edge_prior[gi, first + i] = t.edge_prior[g, e]
            old_child = t.edge_child[g, e]
            if old_child < 0:
                into.edge_child[gi, first + i] = UNVISITED
                continue
            k = into.node_count[gi]
            into.node_count[gi] = k + 1
            into.reroot_map[gi, k] = old_child
            into.parent[gi, k] = new
            into.edge_child[gi, first + i] = k
    into.parent[gi, ROOT] = -1
    return into.node_count[gi]


@routine
def copy_tree(src, gs, dst, gd):
    """Tree gd of dst becomes a copy of tree gs of src (its used nodes and edges only)."""
    nodes = src.node_count[gs]
    edges = src.edge_count[gs]
    dst.node_count[gd] = nodes
    dst.edge_count[gd] = edges
    dst.considered[gd] = src.considered[gs]
    dst.budget[gd] = src.budget[gs]
    dst.root_raw[gd] = src.root_raw[gs]
    for a in range(src.gumbel.shape[1]):
        dst.gumbel[gd, a] = src.gumbel[gs, a]
    for n in range(nodes):
        dst.visits[gd, n] = src.visits[gs, n]
        dst.value_sum[gd, n] = src.value_sum[gs, n]
        dst.win_sum[gd, n] = src.win_sum[gs, n]
        dst.score_sum[gd, n] = src.score_sum[gs, n]
        dst.pending[gd, n] = src.pending[gs, n]
        dst.parent[gd, n] = src.parent[gs, n]
        dst.first_edge[gd, n] = src.first_edge[gs, n]
        dst.num_edges[gd, n] = src.num_edges[gs, n]
        dst.terminal[gd, n] = src.terminal[gs, n]
    for e in range(edges):
        dst.edge_move[gd, e] = src.edge_move[gs, e]
        dst.edge_prior[gd, e] = src.edge_prior[gs, e]
        dst.edge_child[gd, e] = src.edge_child[gs, e]


@kernel
def root_priors(t, g, out):
    """out[move] = the root's prior of each move (0 for the others)."""
    for p in range(out.shape[0]):
        out[p] = 0.0
    start = t.first_edge[g, ROOT]
    if start < 0:
        return
    for e in range(start, start + t.num_edges[g, ROOT]):
        out[t.edge_move[g, e]] = t.edge_prior[g, e]


@kernel
def gather_root(t, g, ints, sums):
    """What a driver's control reads of tree g after a step, into small rows: ints[g] = (root
    visits, root's first edge, the L selected leaves, whether each is a finished game's node);
    sums[g] = the root's value, win and score sums."""
    ints[g, 0] = t.visits[g, ROOT]
    ints[g, 1] = t.first_edge[g, ROOT]
    per = t.leaf.shape[1]
    for i in range(per):
        n = t.leaf[g, i]
        ints[g, 2 + i] = n
        ints[g, 2 + per + i] = t.terminal[g, n] if n >= 0 else 0
    sums[g, 0] = t.value_sum[g, ROOT]
    sums[g, 1] = t.win_sum[g, ROOT]
    sums[g, 2] = t.score_sum[g, ROOT]


class RootState(NamedTuple):
    """A host copy of what the self-play driver's control reads of its trees (`root_state`)."""

    visits: np.ndarray  # [G] int32 the root's visits
    expanded: np.ndarray  # [G] bool whether the root is expanded
    value: np.ndarray  # [G] float64 root_values: mean utility, player to move (NaN: no visit)
    win: np.ndarray  # [G] float64 its win value
    black_lead: np.ndarray  # [G] float64 Black's expected lead
    leaf: np.ndarray  # [G, L] int32 the leaves selected by the last step (-1: none)
    leaf_terminal: np.ndarray  # [G, L] bool whether each is a finished game's node


def root_state_of(ints: np.ndarray, sums: np.ndarray) -> RootState:
    """The RootState of gathered rows (gather_root's ints [G, 2 + 2L] and sums [G, 3])."""
    per = (ints.shape[1] - 2) // 2
    n = ints[:, 0].astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        value, win, lead = -sums[:, 0] / n, -sums[:, 1] / n, sums[:, 2] / n
    return RootState(
        visits=ints[:, 0].copy(),
        expanded=ints[:, 1] >= 0,
        value=value,
        win=win,
        black_lead=lead,
        leaf=ints[:, 2 : 2 + per].copy(),
        leaf_terminal=ints[:, 2 + per :] != 0,
    )


# ---------------------------------------------------------------------------------------------
# Drivers and the Python API
# ---------------------------------------------------------------------------------------------


@routine
def select_game(t, g, roots, leaves, params, budget, no_marks, owner):
    """Select budget (<= L) leaves in game g: t.leaf[g], their positions on the leaf boards
    g * L + i, and the exact values of the terminal ones."""
    per = t.leaf.shape[1]
    for i in range(per):
        t.leaf[g, i] = -1
        t.leaf_value[g, i] = 0.0
        t.leaf_win[g, i] = 0.0
        t.leaf_score[g, i] = 0.0
        t.leaf_after_pass[g, i] = 0
        if i >= budget:
            continue
        lg = g * per + i
        n = select_leaf(t, g, roots, g, leaves, lg, params)
        t.leaf[g, i] = n
        if n >= 0 and (t.terminal[g, n] or leaves.passes[lg] == 1):
            # A finished game's exact values; after a pass, those of passing back (the
            # bound expand_backup_game applies).
            terminal_value(t, g, i, leaves, lg, no_marks[lg], owner[lg], params)
            t.leaf_after_pass[g, i] = 1 - t.terminal[g, n]


@routine
def expand_backup_game(t, g, leaves, policy, value, win, black_score):
    """Expand game g's selected leaves with their evaluations and back them up."""
    per = t.leaf.shape[1]
    for i in range(per):
        n = t.leaf[g, i]
        lg = g * per + i
        if n < 0:
            continue
        if t.terminal[g, n]:
            backup(t, g, n, t.leaf_value[g, i], t.leaf_win[g, i], t.leaf_score[g, i])
            continue
        if t.first_edge[g, n] == UNVISITED:
            expand(t, g, n, leaves, lg, policy[lg])
            v, w, s = value[lg], win[lg], black_score[lg]
            if t.leaf_after_pass[g, i] and t.leaf_value[g, i] > v:
                # After a pass the player to move can pass back and end the game: the position
                # is worth at least that to it, whatever the network says (a weak net's flat
                # value would let the search pass early into a lost game).
                v, w, s = t.leaf_value[g, i], t.leaf_win[g, i], t.leaf_score[g, i]
            if n == ROOT:
                t.root_raw[g] = v
            backup(t, g, n, v, w, s)
        else:
            # Selected twice this step (virtual loss did not steer the second walk away):
            # the second evaluation is dropped, its virtual visits taken back.
            _undo_pending(t, g, n)


@routine
def reroot_game(t, g, move, into):
    """Tree g of `into` becomes the subtree under `move` at t's root (fresh if unsearched)."""
    child = -1
    first = t.first_edge[g, ROOT]
    if first >= 0:
        for e in range(first, first + t.num_edges[g, ROOT]):
            if t.edge_move[g, e] == move:
                child = t.edge_child[g, e]
    if child < 0:
        reset_tree(into, g)
    else:
        reroot(t, g, child, into, g)


# Each batched call's per-game step, declared once for both targets (gocore.jit.per_game).


@per_game("reset_tree")
def reset_tree_step(g, t, which):
    if which[g]:
        reset_tree(t, g)


@per_game("select")
def select_step(g, t, roots, leaves, params, budget, no_marks, owner):
    select_game(t, g, roots, leaves, params, budget[g], no_marks, owner)


@per_game("expand_backup")
def expand_backup_step(g, t, leaves, policy, value, win, black_score):
    expand_backup_game(t, g, leaves, policy, value, win, black_score)


@per_game("noise")
def noise_step(g, t, rng, alpha_total, epsilon, which):
    if which[g]:
        add_root_noise(t, g, rng, alpha_total, epsilon)


@per_game("targets")
def targets_step(g, t, params, out, kept):
    kept[g] = policy_target(t, g, params, out[g])


@per_game("gumbel")
def gumbel_step(g, t, rng, considered, sample, which):
    if which[g]:
        add_root_gumbel(t, g, rng, considered, sample)


@per_game("gumbel_targets")
def gumbel_targets_step(g, t, params, out, kept):
    kept[g] = gumbel_target(t, g, params, out[g])


@per_game("gumbel_moves")
def gumbel_moves_step(g, t, params, out):
    out[g] = gumbel_move(t, g, params)


@per_game("reroot")
def reroot_step(g, t, moves, into, which):
    if which[g]:
        reroot_game(t, g, moves[g], into)


@per_game("copy_tree")
def copy_tree_step(g, src, dst, which):
    if which[g]:
        copy_tree(src, g, dst, g)


@per_game("priors")
def priors_step(g, t, out):
    root_priors(t, g, out[g])


@per_game("gather")
def gather_step(g, t, ints, sums):
    gather_root(t, g, ints, sums)


# The batched API: each function written once over `on` (gocore.jit.CPU, the default, or
# gocore.cuda.GPU, whose arrays stay on the device); gocore.device hands them out.


def _games(t: Tree) -> int:
    return t.node_count.shape[0]


@batched
def add_noise_all(t: Tree, rng, which, *, alpha_total: float, epsilon: float, on=CPU) -> None:
    """Dirichlet noise on the expanded roots of the games marked in `which` ([G] bool):
    alpha_total spread over the legal moves (selfplay.noise_alpha_total; the paper's alpha
    0.03 per point of 19x19 is 10.83), mixed in with weight epsilon (selfplay.noise_epsilon)."""
    games = _games(t)
    on.run(noise_step, games, t, on.array(rng, np.uint64), alpha_total, epsilon,
           on.mask(which, games))  # fmt: skip


@batched
def policy_targets_all(t: Tree, params: SearchParams, area: int, *, on=CPU):
    """([G, area] float32 policy targets over points after pruning, [G] visits they keep)."""
    out = on.output((_games(t), area), np.float32)  # each row written whole
    kept = on.output(_games(t), np.float64)
    on.run(targets_step, _games(t), t, params, out, kept)
    return out, kept


@batched
def add_gumbel_all(t: Tree, rng, which, considered: int, sample: bool = True, *, on=CPU) -> None:
    """Gumbel roots for the expanded roots of the games marked in `which`, `considered` moves
    each (fewer where fewer are legal), drawn with `rng` ([G] uint64) when `sample`. Set
    t.budget first: the visits each search spreads over them."""
    games = _games(t)
    on.run(gumbel_step, games, t, on.array(rng, np.uint64), int(considered), bool(sample),
           on.mask(which, games))  # fmt: skip


@batched
def gumbel_targets_all(t: Tree, params: SearchParams, area: int, *, on=CPU):
    """([G, area] float32 completed-Q policy targets over points, [G] root child visits)."""
    out = on.output((_games(t), area), np.float32)  # each row written whole
    kept = on.output(_games(t), np.float64)
    on.run(gumbel_targets_step, _games(t), t, params, out, kept)
    return out, kept


@batched
def gumbel_moves_all(t: Tree, params: SearchParams, *, on=CPU):
    """[G] int64: the move each Gumbel root plays (gumbel_move)."""
    out = on.output(_games(t), np.int64)
    on.run(gumbel_moves_step, _games(t), t, params, out)
    return out


def reroot_all(t: Tree, spare: Tree, moves: np.ndarray) -> Tree:
    """After every game g plays moves[g] at its root, the tree to search on: `spare` filled
    with the subtree under that move (a fresh root where the move was never searched).
    Returns `spare`; `t` becomes the spare of the next move."""
    games = _games(t)
    CPU.run(reroot_step, games, t, CPU.array(moves, np.int64), spare, CPU.mask(True, games))
    return spare


@batched
def reroot_some(t: Tree, spare: Tree, moves, which, *, on=CPU) -> None:
    """In place: every game g with which[g] keeps only the subtree under moves[g] (a fresh root
    where that move was never searched), through `spare` as scratch; other games untouched."""
    if isinstance(which, np.ndarray) and not which.any():
        return
    games = _games(t)
    which = on.mask(which, games)
    on.run(reroot_step, games, t, on.array(moves, np.int64), spare, which)
    on.run(copy_tree_step, games, spare, t, which)


@batched
def reset_some(t: Tree, which, *, on=CPU) -> None:
    on.run(reset_tree_step, _games(t), t, on.mask(which, _games(t)))


@batched
def root_priors_all(t: Tree, area: int, *, on=CPU):
    """[G, area] float32: each root's priors over points (0 where not expanded)."""
    out = on.output((_games(t), area), np.float32)
    on.run(priors_step, _games(t), t, out)
    return out


@batched
def root_state(t: Tree, *, on=CPU) -> RootState:
    """The roots' visits and values and the last step's leaves, as a driver reads them
    (gathered where the trees are; two small arrays reach the host)."""
    games, per = t.leaf.shape
    ints = on.output((games, 2 + 2 * per), np.int32)
    sums = on.output((games, 3), np.float32)
    on.run(gather_step, games, t, ints, sums)
    return root_state_of(on.host(ints), on.host(sums))


def root_values(t: Tree) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each root's mean (utility, win value, Black's expected lead) over its visits, the first
    two for the player to move there; NaN where the root has no visits (root_state's)."""
    state = root_state(t)
    return state.value, state.win, state.black_lead


def reset_all(t: Tree) -> None:
    reset_some(t, True)


def new_leaves(roots: Boards, leaves_per_game: int) -> Boards:
    """Leaf boards: leaves_per_game slots per game, same layout and move limit as the roots."""
    games = roots.games * leaves_per_game
    return new_boards(
        games,
        np.repeat(roots.size, leaves_per_game),
        np.repeat(roots.rules, leaves_per_game, axis=0),
        layout=roots.layout,
        max_moves=roots.max_moves,
    )


@batched
def select_all(t: Tree, roots: Boards, leaves: Boards, params: SearchParams, budget, *, on=CPU):
    """Select budget[g] (<= L) leaves in every game g (t.leaf, -1 where none), with their
    positions on the leaf boards."""
    no_marks, owner = on.select_scratch(leaves)
    on.run(select_step, roots.games, t, roots, leaves, params, on.array(budget, np.int64),
           no_marks, owner)  # fmt: skip


@batched
def expand_and_backup_all(t: Tree, leaves: Boards, policy, value, win=None, black_score=None, *,
                          on=CPU) -> None:  # fmt: skip
    """policy [G * L, A] over the leaf boards' points (PASS at 0), value [G * L] utility for
    each leaf's player to move, win [G * L] its win/loss part (default: the utility), and
    black_score [G * L] the expected final score from Black's side (default 0); numpy, or on
    the device."""
    value = on.array(value, np.float32)
    win = value if win is None else on.array(win, np.float32)
    if black_score is None:
        black_score = np.zeros(leaves.games, np.float32)
    on.run(expand_backup_step, _games(t), t, leaves, on.array(policy, np.float32), value, win,
           on.array(black_score, np.float32))  # fmt: skip


# Gauss-Hermite nodes for expectations over a normal score belief.
_HERMITE_X, _HERMITE_W = np.polynomial.hermite.hermgauss(16)


def expected_score_utility(
    black_mean: np.ndarray,
    stdev: np.ndarray,
    centre: np.ndarray,
    width: np.ndarray,
    to_move: np.ndarray,
    weight: float,
) -> np.ndarray:
    """The score utility (Appendix F) of a leaf whose final score, Black's lead, is normal with
    this mean and stdev: E[weight (2/pi) atan((S - centre) / width)] for the player to move,
    by 16-point Gauss-Hermite quadrature. 0 where the centre is NaN (no centre yet)."""
    if weight == 0.0:
        return np.zeros(np.shape(black_mean), np.float32)
    mean = np.asarray(black_mean, np.float64)[:, None]
    sd = np.maximum(np.asarray(stdev, np.float64), 0.0)[:, None]
    c = np.asarray(centre, np.float64)[:, None]
    w = np.asarray(width, np.float64)[:, None]
    samples = mean + math.sqrt(2.0) * sd * _HERMITE_X[None, :]
    u = (np.arctan((samples - c) / w) * _HERMITE_W[None, :]).sum(axis=1) / math.sqrt(math.pi)
    u = np.where(np.isnan(c[:, 0]), 0.0, weight * (2.0 / math.pi) * u)
    return (np.where(np.asarray(to_move) == BLACK, u, -u)).astype(np.float32)


def root_visits(t: Tree, g: int) -> dict[int, int]:
    """{move: visits} of game g's root children."""
    start, count = t.first_edge[g, ROOT], t.num_edges[g, ROOT]
    out = {}
    for e in range(start, start + count):
        child = t.edge_child[g, e]
        out[int(t.edge_move[g, e])] = int(t.visits[g, child]) if child >= 0 else 0
    return out


def temperature(move_number: np.ndarray, board_width: np.ndarray, *, start=0.8, end=0.2):
    """The move-choice temperature: `start` decaying to `end`, halving the gap every
    `board_width` moves (19 moves on 19x19, 9 on 9x9)."""
    move_number = np.asarray(move_number, np.float64)
    return end + (start - end) * 0.5 ** (move_number / np.asarray(board_width, np.float64))


def choose_moves(
    visits: np.ndarray, move_number, board_width, rng: np.random.Generator, *, start=0.8, end=0.2
) -> np.ndarray:
    """One move per game, drawn with probability proportional to visits^(1 / temperature)
    ([G, A] visit counts or a policy target over points; PASS = 0)."""
    visits = np.asarray(visits, np.float64)
    t = temperature(move_number, board_width, start=start, end=end)[:, None]
    top = visits.max(axis=1, keepdims=True)
    if (top <= 0).any():
        raise ValueError("choose_moves: a game with no visits")
    # Normalised by the most visited move first, so the power cannot overflow.
    weights = np.where(visits > 0, (visits / top) ** (1.0 / t), 0.0)
    cumulative = np.cumsum(weights, axis=1)
    draws = rng.random(len(visits)) * cumulative[:, -1]
    return (cumulative < draws[:, None]).sum(axis=1)
