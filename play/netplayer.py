"""The network player: a trained net with the project's own MCTS (gocore.search), for the GTP
engine, the GUIs' analysis and matches against other engines.

Each move is a fresh search from the game's position (no noise, no forced playouts; the
match search of params.yaml's `gate.search`), leaves evaluated `leaves_per_game` at a time
under a random symmetry, and the most visited move is played. A search stops at its visit
cap, at its deadline (`seconds`, or what the GTP engine's clock allows), or as soon as the
most visited move cannot be overtaken in the visits left (an obvious move costs little).

The net is any gocore evaluator callable (nets.evaluator.Evaluator for a checkpoint), so this
module never needs torch itself.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Generator, Iterator

import numpy as np

from gocore import features as F
from gocore import mcts
from gocore import search as S
from gocore.arena import LeafEvaluator
from gocore.board import BLACK, PASS, WHITE, legal_row
from play.game import Game, Move, Point
from play.players import RESIGN

# A search with a deadline and no visit cap of its own stops here, and analysis (lz-analyze,
# kata-analyze, searching until the next command) too: the tree is preallocated, so the cap
# is also bounded by MAX_EDGES edges (about 10 bytes each; 22,000 visits on 19x19).
TIME_VISITS_CAP = 100_000
MAX_EDGES = 8_000_000
PV_LENGTH = 15
# A group whose mean ownership from its own side is below this is dead; between -this and
# +SEKI_OWNERSHIP next to a shared liberty of the same kind of opponent group, in seki.
DEAD_OWNERSHIP = 0.0
SEKI_OWNERSHIP = 0.35


@dataclasses.dataclass(frozen=True)
class MoveInfo:
    """One root move of a search, from the view of the player to move at the root."""

    move: Move
    visits: int
    winrate: float  # in [0, 1]
    utility: float  # win value plus score utility, in about [-1.5, 1.5]
    score_lead: float  # points the player to move leads by after this move
    prior: float
    pv: list[Move]

    def lcb(self) -> float:
        """A lower confidence bound of the winrate: two binomial standard errors below it."""
        if self.visits == 0:
            return 0.0
        spread = 1.96 * math.sqrt(max(self.winrate * (1 - self.winrate), 1e-4) / self.visits)
        return max(0.0, self.winrate - spread)


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """What a search found: the root's values, every root move, and the ownership."""

    to_move: int
    visits: int  # the root's visits
    winrate: float
    score_lead: float  # for the player to move
    score_stdev: float  # the net's at the root
    moves: list[MoveInfo]  # most visited first (then by prior)
    ownership: np.ndarray | None  # [n, n] from Black's side: the search's average
    seconds: float
    evaluations: int
    choice: Move | None = None  # a Gumbel root's move (its own rule, not the most visited)
    chose: bool = False  # whether `choice` is set (None is a pass)
    final: bool = False  # the search's last result (the others are reports during it)

    def best(self) -> Move | None:
        if self.chose:
            return self.choice
        visited = [m for m in self.moves if m.visits > 0]
        if visited:
            return visited[0].move
        return self.moves[0].move if self.moves else None


class NetPlayer:
    """A net with the search, playing one game at a time."""

    name = "net"

    def __init__(
        self,
        net: Callable,
        *,
        params: S.SearchParams,
        visits: int | None,
        seconds: float | None = None,
        leaves_per_game: int,
        resign_below: float | None = None,
        resign_after: int = 20,
        seed: int = 0,
        model_id: str = "",
        playouts: int = 128,
        considered: int = 0,
    ):
        """`considered` > 0: a Gumbel root of that many moves for genmove (deterministic:
        no Gumbel draw), PUCT for open-ended analysis, which has no visit budget to halve."""
        if visits is None and seconds is None:
            raise ValueError("a search needs a visit cap, a time limit, or both")
        if visits is not None and visits < 1:
            raise ValueError(f"visits must be >= 1 (got {visits})")
        if seconds is not None and seconds <= 0:
            raise ValueError(f"seconds must be > 0 (got {seconds})")
        if resign_below is not None and not 0 < resign_below < 1:
            raise ValueError(f"resign_below must be in (0, 1) (got {resign_below})")
        self.net = net
        self.params = params
        self.visits = visits
        self.seconds = seconds
        self.leaves_per_game = leaves_per_game
        self.resign_below = resign_below
        self.resign_after = resign_after
        self.model_id = model_id
        self.playouts = playouts
        if considered < 0:
            raise ValueError(f"considered must be >= 0 (got {considered})")
        self.considered = considered
        self.last: SearchResult | None = None
        self._trees: dict[tuple, tuple] = {}
        self._raw: dict[tuple, dict] = {}
        self.set_seed(seed)

    def set_seed(self, seed: int) -> None:
        self.rng = np.random.default_rng(int(seed) % (1 << 63))

    def fork(self, seed: int) -> NetPlayer:
        """Another player with the same net and knobs, and its own trees, caches and random
        state: a second thread searches with it while this one searches (the net is shared;
        a NetPlayer itself is not for two threads at once)."""
        return NetPlayer(
            self.net, params=self.params, visits=self.visits, seconds=self.seconds,
            leaves_per_game=self.leaves_per_game, resign_below=self.resign_below,
            resign_after=self.resign_after, seed=seed, model_id=self.model_id,
            playouts=self.playouts, considered=self.considered,
        )  # fmt: skip

    def clear_cache(self) -> None:
        """Forget the net's evaluations kept for positions seen before."""
        self._raw.clear()

    def warm_up(self, size: int = 9) -> None:
        """A two-visit search and a dead-stone estimate on a board with one stone, so that
        numba's kernels are compiled, or loaded from their cache, before the first command
        that needs them (`tengen gtp` does it before it answers anything): on an empty cache
        that took 91 s here, which a match runner would count against its first genmove.
        The player's random state is left as it was: a seed's games do not change."""
        state = self.rng.bit_generator.state
        game = Game(size)
        game.play(BLACK, (size // 2, size // 2))
        for _ in self.search(game, WHITE, visits=2):
            pass
        game.estimate_dead(playouts=2, seed=0)
        self.rng.bit_generator.state = state

    # -- moves --------------------------------------------------------------------------------

    def genmove(
        self, game: Game, color: int, *, cleanup: bool = False, seconds: float | None = None
    ) -> Move | str:
        """The move for `color`: the most visited after the search (pass if nothing else is
        legal), RESIGN when allowed and the win rate is below `resign_below`. `seconds`: the
        clock's budget for this move (the tighter of it and the player's own limit counts)."""
        thinking = self.think(game, color, cleanup=cleanup, seconds=seconds)
        while True:
            try:
                next(thinking)
            except StopIteration as done:
                return done.value

    def think(
        self,
        game: Game,
        color: int,
        *,
        cleanup: bool = False,
        seconds: float | None = None,
        interval: float | None = None,
    ) -> Generator[SearchResult, None, Move | str]:
        """genmove as a generator: with `interval`, yields the search's state every interval
        seconds and at its end (for genmove_analyze); returns the move."""
        limit = self.seconds if seconds is None else min(seconds, self.seconds or seconds)
        result = None
        for result in self.search(
            game, color, visits=self.visit_cap(game.size), seconds=limit, interval=interval
        ):
            if interval is not None:
                yield result
        assert result is not None
        self.last = result
        if (
            self.resign_below is not None
            and len(game.moves) >= self.resign_after
            and result.visits > 1
            and result.winrate < self.resign_below
        ):
            return RESIGN
        move = result.best()
        if cleanup and move is None:
            move = self._cleanup_move(game, color, result)
        return move

    def _cleanup_move(self, game: Game, color: int, result: SearchResult) -> Move:
        """kgs-genmove_cleanup: rather than pass, fill a liberty of an opponent group the net
        judges dead (the most visited such move, else the one of highest prior)."""
        dead = set(self.dead_stones(game)) & set(game.stones(3 - color))
        if not dead:
            return None
        targets = set()
        for x, y in dead:
            for q in ((x - 1, y), (x + 1, y), (x, y - 1), (x, y + 1)):
                if 0 <= q[0] < game.size and 0 <= q[1] < game.size:
                    targets.add(q)
        trial = game.copy()
        trial.set_to_move(color)
        options = [m for m in result.moves if m.move in targets and trial.is_legal(color, m.move)]
        if options:
            return max(options, key=lambda m: (m.visits, m.prior)).move
        legal = [p for p in sorted(targets) if trial.is_legal(color, p)]
        return legal[0] if legal else None

    # -- the search ---------------------------------------------------------------------------

    def search(
        self,
        game: Game,
        color: int,
        *,
        visits: int,
        seconds: float | None = None,
        interval: float | None = None,
        ownership: bool = False,
        should_stop: Callable[[], bool] | None = None,
    ) -> Iterator[SearchResult]:
        """Search the position with `color` to move. Yields the state every `interval` seconds
        (if given) and once at the end; stops at `visits`, after `seconds` (once the root has
        been evaluated), when `should_stop()`, or when the most visited move can no longer be
        overtaken (not with `should_stop`: an open-ended analysis searches on)."""
        started = time.monotonic()
        deadline = None if seconds is None else started + max(seconds, 0.0)
        trial = game.copy()
        if trial.to_move != color:
            trial.set_to_move(color)
        roots = trial.b
        roots.passes[:] = np.minimum(roots.passes, 1)  # a finished game is played on
        tree, leaves = self._tree(roots, visits)
        S.reset_all(tree)
        tree.explore[:] = 0
        tree.centre[:] = np.nan
        evaluate = LeafEvaluator(
            [self.net], leaves, tree, leaves_per_game=self.leaves_per_game,
            score_utility=self.params.score_utility, rng=self.rng, ownership=ownership,
        )  # fmt: skip
        next_report = None if interval is None else started + interval
        # Open-ended analysis searches on; a move's search may stop once its move is settled
        # (not a Gumbel root's: its halving schedule spends the whole budget).
        open_ended = should_stop is not None
        considered = 0 if open_ended else self.considered

        def finished(now: float) -> bool:
            return (
                tree.visits[0, S.ROOT] >= visits
                # At least the root's own evaluation: a move from the policy, never a blind pass.
                or (deadline is not None and now >= deadline and tree.visits[0, S.ROOT] > 0)
                or (should_stop is not None and should_stop())
                or (
                    not open_ended
                    and not considered
                    and self._settled(tree, visits, started, deadline, now)
                )
            )

        def stop() -> bool:
            now = time.monotonic()
            return finished(now) or (next_report is not None and now >= next_report)

        fresh = True
        while True:
            mcts.search(
                roots, evaluate, visits, params=self.params, leaves_per_game=self.leaves_per_game,
                tree=tree, leaves=leaves, on_step=evaluate.update_centres, stop=stop,
                considered=considered if fresh else 0,  # the root, once: it stays Gumbel
            )  # fmt: skip
            fresh = False
            now = time.monotonic()
            # Otherwise the search returned because a report is due, or the tree is full.
            if finished(now) or next_report is None or now < next_report:
                break
            next_report = now + interval
            yield self._result(trial, tree, evaluate, now - started, considered)
        last = self._result(trial, tree, evaluate, time.monotonic() - started, considered)
        yield dataclasses.replace(last, final=True)

    def _tree(self, roots, visits: int):
        """A preallocated tree and leaf boards for this board, reused across moves."""
        key = (roots.color.shape[1], int(roots.size[0]), roots.max_moves, visits)
        if key not in self._trees:
            self._trees.clear()
            nodes, edges = S.tree_size(visits, self.leaves_per_game, int(roots.size[0]) ** 2)
            tree = S.new_tree(1, nodes, edges, self.leaves_per_game, roots.color.shape[1])
            self._trees[key] = (tree, S.new_leaves(roots, self.leaves_per_game))
        return self._trees[key]

    def visit_cap(self, size: int, visits: int | None = None) -> int:
        """The most visits one search of a size x size board can hold."""
        cap = self.visits if visits is None else visits
        room = MAX_EDGES // (size * size + 1)
        return max(2, min(cap if cap is not None else TIME_VISITS_CAP, room))

    @staticmethod
    def _settled(tree: S.Tree, visits: int, started: float, deadline, now: float) -> bool:
        """Whether the most visited root move can no longer be overtaken: its lead over the
        second is more than the visits left (by the cap, or by the deadline at this rate)."""
        done = int(tree.visits[0, S.ROOT])
        if done < 8:
            return False
        left = visits - done
        if deadline is not None:
            rate = done / max(now - started, 1e-6)
            left = min(left, rate * (deadline - now))
        counts = sorted(S.root_visits(tree, 0).values(), reverse=True)
        if len(counts) < 2:
            return len(counts) == 1  # a single legal move
        return counts[0] - counts[1] > left

    def _result(
        self, trial: Game, tree: S.Tree, evaluate: LeafEvaluator, seconds: float, considered: int
    ):
        g = 0
        to_move = trial.to_move
        side = 1.0 if to_move == BLACK else -1.0
        _, win, black_lead = S.root_values(tree)
        n = trial.size
        moves = []
        start, count = tree.first_edge[g, S.ROOT], tree.num_edges[g, S.ROOT]
        for e in range(start, start + count) if start >= 0 else ():
            child = int(tree.edge_child[g, e])
            visits = int(tree.visits[g, child]) if child >= 0 else 0
            if visits:
                winrate = (float(tree.win_sum[g, child]) / visits + 1) / 2
                utility = float(tree.value_sum[g, child]) / visits
                lead = side * float(tree.score_sum[g, child]) / visits
            else:
                winrate, utility, lead = float("nan"), float("nan"), float("nan")
            move = trial.index_point(int(tree.edge_move[g, e]))
            pv = [move] + (self._pv(trial, tree, child) if visits else [])
            prior = float(tree.edge_prior[g, e])
            moves.append(MoveInfo(move, visits, winrate, utility, lead, prior, pv))
        moves.sort(key=lambda m: (-m.visits, -m.prior))
        ownership = None
        if evaluate.ownership_sum is not None and evaluate.ownership_count[g] > 0:
            mean = evaluate.ownership_sum[g] / evaluate.ownership_count[g]
            stride = trial.b.stride
            ownership = np.array(
                [[mean[(y + 1) * stride + x + 1] for x in range(n)] for y in range(n)]
            )
        root_visits = int(tree.visits[g, S.ROOT])
        chose = bool(considered and root_visits > 1)
        choice = trial.index_point(int(S.gumbel_moves_all(tree, self.params)[g])) if chose else None
        return SearchResult(
            to_move=to_move,
            visits=root_visits,
            winrate=(float(win[g]) + 1) / 2 if root_visits else 0.5,
            score_lead=side * float(black_lead[g]) if root_visits else 0.0,
            score_stdev=self._root_stdev(trial),
            moves=moves,
            ownership=ownership,
            seconds=seconds,
            evaluations=evaluate.evaluations,
            choice=choice,
            chose=chose,
        )

    @staticmethod
    def _pv(trial: Game, tree: S.Tree, node: int) -> list[Move]:
        """The principal variation below `node`: the most visited child, again and again."""
        out = []
        g = 0
        while len(out) < PV_LENGTH - 1 and tree.first_edge[g, node] >= 0:
            start, count = tree.first_edge[g, node], tree.num_edges[g, node]
            best, best_visits = -1, 0
            for e in range(start, start + count):
                child = tree.edge_child[g, e]
                if child >= 0 and tree.visits[g, child] > best_visits:
                    best, best_visits = e, int(tree.visits[g, child])
            if best < 0:
                break
            out.append(trial.index_point(int(tree.edge_move[g, best])))
            node = int(tree.edge_child[g, best])
        return out

    # -- the raw net --------------------------------------------------------------------------

    def raw(self, game: Game, color: int | None = None, symmetry: int = 0) -> dict:
        """The net on this position under one symmetry, mapped back to the board: policy
        [n, n] (NaN where illegal) and pass, win/loss/no-result and score lead for the player
        to move, ownership [n, n] from that player's side."""
        trial = game.copy()
        if color is not None and trial.to_move != color:
            trial.set_to_move(color)
        b = trial.b
        n = trial.size
        key = (trial.hash, len(trial.moves), trial.to_move, trial.rules, n, symmetry)
        cached = self._raw.get(key)
        if cached is not None:
            return cached
        work = F.new_work(b)
        planes = np.zeros((1, F.N_PLANES, n, n), np.float32)
        glob = np.zeros((1, F.N_GLOBALS), np.float32)
        sym = np.array([symmetry], np.int64)
        F.encode_all(b, work, planes, glob, sym)
        legal = F.legal_tensor_all(b, n, sym)
        out = self.net(planes, glob, legal=legal)
        policy = F.policy_all(b, np.asarray(out["policy"], np.float32), sym)[0]
        own = np.zeros((1, n * n + 1), np.float32)
        has_ownership = "ownership" in out
        if has_ownership:
            own[0, :-1] = np.asarray(out["ownership"], np.float32).reshape(n * n)
        ownership = F.policy_all(b, own, sym)[0]
        legal_points = np.zeros(b.color.shape[1], np.bool_)
        legal_row(b, 0, trial.to_move, legal_points)
        stride = b.stride

        def grid(values, mask=None):
            rows = []
            for y in range(n):
                row = []
                for x in range(n):
                    p = (y + 1) * stride + x + 1
                    row.append(float(values[p]) if mask is None or mask[p] else float("nan"))
                rows.append(row)
            return np.array(rows)

        value = np.asarray(out["value"], np.float64)[0]
        result = {
            "to_move": trial.to_move,
            "policy": grid(policy, legal_points),
            "pass": float(policy[PASS]),
            "win": float(value[0]),
            "loss": float(value[1]),
            "no_result": float(value[2]),
            "score_lead": float(np.asarray(out.get("score_mean", [0.0]))[0]),
            "score_stdev": float(np.asarray(out.get("score_stdev", [0.0]))[0]),
            "ownership": grid(ownership),
            "has_ownership": has_ownership,
        }
        if len(self._raw) >= 64:
            self._raw.clear()
        self._raw[key] = result
        return result

    def _root_stdev(self, trial: Game) -> float:
        return self.raw(trial)["score_stdev"]

    def ownership(self, game: Game) -> np.ndarray:
        """[n, n] the net's final ownership from Black's side, averaged over the 8 symmetries."""
        total = np.zeros((game.size, game.size))
        for s in range(8):
            raw = self.raw(game, symmetry=s)
            side = 1.0 if raw["to_move"] == BLACK else -1.0
            total += side * raw["ownership"]
        return total / 8

    def final_status(self, game: Game) -> dict[str, list[list[Point]]] | None:
        """Every group as dead, alive or seki, from the ownership: one part the net's (over
        the 8 symmetries) to two parts that of random playouts to the end (Game.estimate_dead,
        `playouts` of them). Dead where a group's mean ownership from its own side is below
        DEAD_OWNERSHIP; seki where two groups of both colours that are not dead share a
        liberty that neither owns and neither is owned clearly (|ownership| < SEKI_OWNERSHIP
        for both groups and the liberty). None for a net without an ownership head (the
        uniform priors).

        Why both: on the 32 finished evaluation games of a 3-generation champion against GNU
        Go, GNU Go's dead stones were those of the net's ownership alone in 4 games, of random
        playouts alone in all 32, and of this blend in 31: the playouts decide where they are
        sure (the dead stones of a finished game), a confident net where they are not (a
        seki, which random playouts fill)."""
        if not self.raw(game)["has_ownership"]:
            return None
        playouts = game.estimate_dead(playouts=self.playouts, seed=0).ownership
        own = (self.ownership(game) + 2 * playouts) / 3
        board = game.board()
        groups = game.groups()
        mean = {}
        for color, points in groups:
            side = 1.0 if color == BLACK else -1.0
            mean[points[0]] = side * float(np.mean([own[y, x] for x, y in points]))
        dead = {points[0] for _, points in groups if mean[points[0]] < DEAD_OWNERSHIP}
        group_of = {p: points[0] for _, points in groups for p in points}
        unclear = {
            points[0]
            for _, points in groups
            if points[0] not in dead and mean[points[0]] < SEKI_OWNERSHIP
        }
        seki = set()
        n = game.size
        for y in range(n):
            for x in range(n):
                if board[y, x] != 0 or abs(own[y, x]) >= SEKI_OWNERSHIP:
                    continue
                near = {BLACK: set(), WHITE: set()}
                for q in ((x - 1, y), (x + 1, y), (x, y - 1), (x, y + 1)):
                    if 0 <= q[0] < n and 0 <= q[1] < n and board[q[1], q[0]] != 0:
                        head = group_of[q]
                        if head in unclear:
                            near[int(board[q[1], q[0]])].add(head)
                if near[BLACK] and near[WHITE]:
                    seki |= near[BLACK] | near[WHITE]
        status: dict[str, list[list[Point]]] = {"dead": [], "alive": [], "seki": []}
        for _, points in groups:
            head = points[0]
            kind = "dead" if head in dead else "seki" if head in seki else "alive"
            status[kind].append(points)
        return status

    def dead_stones(self, game: Game) -> list[Point]:
        status = self.final_status(game)
        groups = status["dead"] if status is not None else []
        return sorted((p for group in groups for p in group), key=lambda p: (p[1], p[0]))
