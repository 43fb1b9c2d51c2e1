"""Self-play: G game slots searched in lockstep, one network call per step for every slot.

Every step selects a few leaves in every slot (gocore.search), encodes them all into one
feature buffer (gocore.features), calls the network once and backs the values up. A slot whose
search has its visits plays its move at once and starts its next search, so games of cheap and
full searches (playout cap randomization) never wait for each other; a slot whose game ends
starts the next game. Python works on whole [G] arrays per step, never per node.

What the KataGo paper (Wu 2019) prescribes, and where it is:
- playout cap randomization (section 3.1): a full search (noise, forced playouts, a policy
  target) with probability `full_probability`, else a cheap one without them; only full
  searches are recorded (cheap ones too, as value-only rows, with `record_cheap_searches`);
- forced playouts and policy target pruning (3.2), Dirichlet noise: gocore.search; or, with
  `root` "gumbel", the Gumbel root instead (no noise, no temperature: its own draw chooses);
- the score utility (Appendix F), centred at the root's expected score when its search began;
- the move temperature 0.8 -> 0.2 halving every board-width moves; the first moves of a game
  drawn from the raw policy (an exponential number, mean `opening_moves` x area);
- game randomization (Appendix D): board sizes, rules and komi drawn per game, handicap games,
  early forks (one uniformly random move early in the game), side positions (in 2.5% of
  positions, a move drawn from the raw policy at temperature 1, 2 or infinity instead of the
  searched one; the position after it gets a full search and one row whose outcome target is
  the search's win value, score and ownership left free; a quarter of them go on for one more
  move, recursively);
- no resignation: a game stays played out; once the losing side's win rate has stayed under
  `decided_winrate` for `decided_turns` turns, its full searches get `decided_visits` and its
  rows the weight `decided_weight`.

The network is any callable `net(planes, glob, legal=...)` returning numpy policy [B, T*T+1]
(pass last), value [B, 3] (win, loss, no result for the player to move), score_mean and
score_stdev [B] (the player to move's lead): nets.evaluator.Evaluator, or `UniformNet` for
generation 0. gocore never imports torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Iterator

import numpy as np

from gocore import features as F
from gocore import search as S
from gocore.board import (
    BLACK,
    LEGAL,
    PASS,
    WHITE,
    Boards,
    copy_game,
    move_cap,
    new_boards,
    play,
    play_some,
    point,
    reset,
    score,
    set_to_move,
    setup_stone,
)
from gocore.device import backend
from gocore.jit import driver
from gocore.rules import PRESETS, fixed_handicap_points, max_fixed_handicap

# How a move was chosen (kept per move for the SGF and the metrics).
RAW_POLICY = 0  # drawn from the raw policy (the opening)
FORK = 1  # an early fork: uniformly random
CHEAP = 2  # a cheap search (no policy target)
FULL = 3  # a full search
SIDE = 4  # a side position's alternative move, from the raw policy
KIND_NAMES = {
    RAW_POLICY: "raw policy",
    FORK: "early fork",
    CHEAP: "cheap search",
    FULL: "full search",
    SIDE: "side position",
}


@dataclasses.dataclass(frozen=True)
class SelfPlayConfig:
    """Every knob of self-play. No defaults here: params.yaml's `selfplay` section is where they
    live (stages.selfplay reads it into this)."""

    full_visits: int  # the paper: 600 on 19x19
    cheap_visits: int  # 100
    full_probability: float  # 0.25
    leaves_per_game: int  # leaves per slot per step (virtual loss)
    search: S.SearchParams
    # The root, as a match's (gocore.arena): the moves a Gumbel root samples (the paper: 16),
    # or 0 for a PUCT root (noise, forced playouts, pruned visit targets).
    considered: int
    noise_alpha_total: float  # Dirichlet alpha x legal moves (0.03 x 361 = 10.83)
    noise_epsilon: float  # 0.25
    temperature_start: float  # 0.8
    temperature_end: float  # 0.2
    opening_moves: float  # mean raw-policy opening moves as a fraction of the area (0.04)
    board_sizes: tuple[tuple[int, float], ...]  # (size, weight)
    rules: tuple[tuple[str, float], ...]  # (preset name, weight)
    komi: tuple[tuple[int, float], ...]  # (size, fair komi); sizes not listed: 7.0
    komi_stdev: float  # komi ~ N(fair, stdev), rounded to a half point
    handicap_probability: float  # 0.05
    early_fork_probability: float  # 0.05
    early_fork_turn: float  # the forked turn ~ exponential, mean this x area
    side_position_probability: float  # 0.025 per searched turn of a game
    side_continue_probability: float  # 0.25: a side position goes on for one more move
    record_cheap_searches: bool  # rows of cheap searches too (value only); the paper: no
    decided_winrate: float  # 0.05
    decided_turns: int  # 5
    decided_visits: int  # full searches of a decided game
    decided_weight: float  # weight of a decided game's rows
    max_moves_per_area: float  # a game stops after this x area moves and is scored as it stands

    @property
    def largest(self) -> int:
        return max(s for s, w in self.board_sizes if w > 0)

    @property
    def max_visits(self) -> int:
        return max(self.full_visits, self.cheap_visits, self.decided_visits)


class UniformNet:
    """Generation 0's network: an even game, and priors uniform over the legal moves up to a
    random +-`jitter` factor (seeded), so that ties between moves break at random rather than
    always towards the same corner."""

    def __init__(self, seed: int = 0, jitter: float = 0.1):
        self.rng = np.random.default_rng(seed)
        self.jitter = jitter

    def __call__(self, planes, glob, *, legal):
        legal = np.asarray(legal, np.float32)
        b = legal.shape[0]
        value = np.zeros((b, 3), np.float32)
        value[:, :2] = 0.5
        policy = legal * (1.0 + self.jitter * self.rng.uniform(-1, 1, legal.shape))
        total = policy.sum(axis=1, keepdims=True)  # 0 on a board with no legal move
        return {
            "policy": np.divide(policy, total, out=np.zeros_like(policy), where=total > 0),
            "value": value,
            "score_mean": np.zeros(b, np.float32),
            "score_stdev": np.zeros(b, np.float32),
        }


@dataclasses.dataclass
class GameInfo:
    """One game's setting and, once over, its result."""

    index: int  # the order in which games started (game ids derive from it)
    size: int
    rules: str
    komi: float
    handicap: int = 0
    fork_turn: int = -1  # the early fork's turn, -1 for none
    side_of: int = -1  # the game a side position came from (its index), -1 for none
    black_lead: float = float("nan")  # the final score (NaN for a side position: not played out)
    moves: np.ndarray | None = None  # [moves] padded points
    colors: np.ndarray | None = None
    setup: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (color, point)
    kinds: np.ndarray | None = None  # [moves] how each move was chosen
    winrates: np.ndarray | None = None  # [moves] the mover's root win rate (NaN: no search)
    visits: np.ndarray | None = None  # [moves] root visits
    decided_at: int = -1  # the turn the game was decided, -1 if never


@dataclasses.dataclass
class FinishedGame:
    """A finished game: its setting, its moves and its training rows (`rows`: column arrays,
    board-local coordinates; see stages.rows for their meaning)."""

    info: GameInfo
    rows: dict[str, np.ndarray]
    stride: int  # of the padded layout its moves are points of (gocore.board.point_xy)


NO_ROW = -1  # Rows.before of a game's first row; SelfPlay.last_row of a game with none
FREED = -2  # Rows.before of a row whose game was taken


class Rows:
    """Training rows of the games in progress, in a pool of column arrays. A row keeps its
    index until its game ends, and a game's rows are a chain (each row holds the index of its
    game's row before it), so that a game's rows leave in time proportional to their number,
    not to the pool's; the indices they free are the next ones filled, and a full pool at least
    doubles (its arrays copied, every row where it was: a constant copying cost a row added)."""

    def __init__(self, layout: int, *, capacity: int = 1024):
        self.layout = layout
        self.width = {
            "planes": F.packed_length(layout),
            "globals": F.N_GLOBALS,
            "policy_target": layout * layout + 1,
        }
        self.dtypes = {
            "turn": np.int32,
            "to_move": np.int8,
            "board_size": np.int8,
            "planes": np.uint8,
            "globals": np.float32,
            "policy_target": np.float32,
            "policy_weight": np.float32,
            "value_weight": np.float32,
            "opponent_move": np.int16,
            "visits": np.int32,
            "root_value": np.float32,
            "root_score": np.float32,
        }
        self.columns = self._alloc(capacity)
        self.before = np.full(capacity, FREED, np.int64)  # [capacity] the game's row before
        # [capacity] the unused indices, a stack whose top is free[n_free - 1] (the next one
        # filled), and [capacity] room for a chain being taken.
        self.free = np.arange(capacity - 1, -1, -1, dtype=np.int64)
        self.n_free = capacity
        self.chain = np.empty(capacity, np.int64)

    def _alloc(self, capacity):
        return {
            name: np.zeros((capacity, self.width[name]) if name in self.width else capacity, dt)
            for name, dt in self.dtypes.items()
        }

    @property
    def count(self) -> int:
        """Rows held."""
        return len(self.before) - self.n_free

    def append(self, before: np.ndarray, **cols) -> np.ndarray:
        """Add rows (equal-length columns), each after row `before` of its game (NO_ROW: the
        game's first); returns their indices, which stay theirs until their game is taken."""
        k = len(before)
        if k > self.n_free:
            self._grow(k)
        idx = self.free[self.n_free - k : self.n_free][::-1].copy()
        self.n_free -= k
        self.before[idx] = before
        for name, value in cols.items():
            self.columns[name][idx] = value
        return idx

    def _grow(self, k: int) -> None:
        old = len(self.before)
        capacity = max(2 * old, old + k - self.n_free)
        fresh = self._alloc(capacity)
        for name, col in self.columns.items():
            fresh[name][:old] = col
        before = np.full(capacity, FREED, np.int64)
        before[:old] = self.before
        free = np.empty(capacity, np.int64)
        added = capacity - old
        free[:added] = np.arange(capacity - 1, old - 1, -1)  # below the old free indices
        free[added : added + self.n_free] = self.free[: self.n_free]
        self.columns, self.before, self.free = fresh, before, free
        self.n_free += added
        self.chain = np.empty(capacity, np.int64)

    def take(self, last: int) -> dict[str, np.ndarray]:
        """Remove and return the rows of the game whose last row is `last` (NO_ROW: a game
        with none), in the order they were added."""
        start = _chain(self.before, last, self.chain)
        if start < 0:
            raise RuntimeError(f"row pool: the chain from row {last} meets a row already taken")
        idx = self.chain[start:].copy()
        out = {name: col[idx] for name, col in self.columns.items()}
        self.before[idx] = FREED
        self.free[self.n_free : self.n_free + len(idx)] = idx
        self.n_free += len(idx)
        return out


@driver
def _chain(before, last, chain):
    """Write the chain of rows that ends at `last` (following `before` back to NO_ROW) into
    the end of `chain`, first row first; returns where it starts, -1 if a row is FREED."""
    start = chain.shape[0]
    row = last
    while row != NO_ROW:
        if row < 0 or before[row] == FREED or start == 0:  # taken, or a cycle
            return -1
        start -= 1
        chain[start] = row
        row = before[row]
    return start


# ---------------------------------------------------------------------------------------------
# Kernels over the slots (masked: only the slots that act this step)
# ---------------------------------------------------------------------------------------------


@driver
def _start_game(b, g, stones, first):
    """Slot g: an empty board of its size (set by the caller), the setup stones, `first` to
    move. Returns the first stone that could not be placed, -1 if none."""
    reset(b, g)
    for i in range(stones.shape[0]):
        if setup_stone(b, g, stones[i, 0], stones[i, 1]) != LEGAL:
            return i
    set_to_move(b, g, first)
    return -1


@driver
def _copy_game(src, gs, dst, gd):
    dst.size[gd] = src.size[gs]
    for i in range(src.rules.shape[1]):
        dst.rules[gd, i] = src.rules[gs, i]
    copy_game(src, gs, dst, gd)


@driver
def _final_score(b, g, dead, no_marks, owner):
    return score(b, g, dead, no_marks, owner)


def final_score(b: Boards, work: F.FeatureWork, g: int) -> tuple[float, np.ndarray]:
    """Game g's final score from Black's side by its rules, stones inside the opponent's
    pass-alive area (Benson) counted dead, and the owner of each point ([A] int8)."""
    area = F.pass_alive_of(b, g, work)
    color = b.color[g]
    dead = ((color == BLACK) & (area & F.AREA_WHITE > 0)) | (
        (color == WHITE) & (area & F.AREA_BLACK > 0)
    )
    owner = np.zeros(color.shape, np.int8)
    return float(_final_score(b, g, dead, np.zeros_like(dead), owner)), owner


def leaf_values(to_move, size, value, score_mean, score_stdev, centre, score_utility: float):
    """(utility, win value, Black's expected lead) of evaluated leaves for the search (their
    player to move and board size [B]): the net's win minus loss for the player to move, plus
    Appendix F's expected score utility around each leaf's game's centre (NaN: none yet)."""
    win = value[:, 0] - value[:, 1]
    mover = np.where(to_move == BLACK, 1.0, -1.0)
    black_mean = mover * score_mean
    utility = win + S.expected_score_utility(
        black_mean, score_stdev, centre, size, to_move, score_utility
    )
    return utility, win, black_mean.astype(np.float32)


def _rows_of(array, rows):
    return array[rows]


def row_taker(xp, net) -> Callable:
    """`take` for net_rows on backend `xp`: the rows stay on the device for a net there (one
    that `takes_cuda_arrays`), else they come to the host."""
    on_device = xp.name != "cpu" and bool(getattr(net, "takes_cuda_arrays", False))

    def take(array, rows):
        taken = xp.take_rows(array, rows)
        return taken if on_device else xp.to_numpy(taken)

    return take


def net_rows(
    net, planes, glob, legal, rows: np.ndarray, out: dict, *, take: Callable = _rows_of,
    to_numpy: Callable = np.asarray, put_rows: Callable | None = None,
) -> None:  # fmt: skip
    """Run `net` on the given rows of the feature buffers; each of its outputs named in `out`
    is written into that array at those rows (an output the net lacks, such as the score of a
    stand-in with no score head, stays as it was: every net has a policy, the one output kept
    from step to step). `take(array, rows)` gathers the rows (on the buffers' device);
    `to_numpy` brings an output to a numpy array of `out`, and `put_rows(values, rows, array)`
    (a backend's, needed for such arrays) writes one into an array on the device, where it
    stays."""
    if len(rows):
        result = net(take(planes, rows), take(glob, rows), legal=take(legal, rows))
        for name, array in out.items():
            if name not in result:
                continue
            if isinstance(array, np.ndarray):
                array[rows] = to_numpy(result[name])
            elif put_rows is None:
                raise TypeError(f"net_rows: output {name!r} is on a device: give put_rows")
            else:
                put_rows(result[name], rows, array)


def _cumulative_pick(weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One index per row of weights [K, n], drawn in proportion (rows with no weight: 0)."""
    cumulative = np.cumsum(weights, axis=1)
    draws = rng.random(len(weights)) * cumulative[:, -1]
    return np.minimum((cumulative < draws[:, None]).sum(axis=1), weights.shape[1] - 1)


# ---------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------


class SelfPlay:
    """Plays `games` games, `slots` at a time; iterate `run()` for the finished games.

    `device` picks where the search, the leaf boards and the feature buffer live
    (gocore.device): on "cuda" the trees, the leaf boards and the network's input stay on the
    GPU, and each step brings to the host only what the driver's control reads (the roots'
    visits and values, the selected leaves: `search.root_state`), the network's outputs where
    the net gives them as host arrays, and a move's targets. The roots (a game's record, its
    scoring and its rows) are kept on the host and mirrored to the device when they change.
    The same seed plays the same games on either device."""

    def __init__(
        self,
        config: SelfPlayConfig,
        net: Callable,
        *,
        games: int,
        slots: int,
        seed: int,
        on_step: Callable[[SelfPlay], None] | None = None,
        device: str = "cpu",
    ):
        if games < 1 or slots < 1:
            raise ValueError(f"games and slots must be >= 1 (got {games}, {slots})")
        self.config = config
        self.net = net
        self.games = games
        self.slots = slots = min(slots, games)
        self.seed = seed
        self.on_step = on_step
        self.xp = xp = backend(device)
        self.take = row_taker(xp, net)
        self.rng = np.random.default_rng(seed)
        layout = config.largest
        self.layout = layout
        self.tensor = layout
        area = layout * layout
        self.max_moves = move_cap(config.max_moves_per_area, area)
        self.roots = new_boards(slots, layout, layout=layout, max_moves=self.max_moves + 1)
        self.side_queue = new_boards(slots, layout, layout=layout, max_moves=self.max_moves + 1)
        self.side_info: list[GameInfo] = []
        leaves_per_game = config.leaves_per_game
        # The roots on the device (the host's own on the CPU), mirrored when they change.
        self.device_roots = xp.mirror(self.roots)
        # The games whose root changed since the device's copy was last brought up to date.
        self.roots_changed = np.zeros(slots, np.bool_)
        self.leaves = xp.new_leaves(self.device_roots, leaves_per_game)
        cells = self.roots.color.shape[1]
        nodes, edges = S.tree_size(config.max_visits, leaves_per_game, area)
        self.tree = xp.new_tree(slots, nodes, edges, leaves_per_game, cells)
        self.spare = xp.new_tree(slots, nodes, edges, leaves_per_game, cells)
        # What the driver sets in the trees, kept on the host (the trees' own arrays on the
        # CPU) and uploaded before the kernels read them.
        self.explore = xp.to_numpy(self.tree.explore)
        self.budget = xp.to_numpy(self.tree.budget)
        self.centre = xp.to_numpy(self.tree.centre)
        self.state = xp.root_state(self.tree)
        self.leaf_work = xp.new_work(self.leaves, share=self.config.leaves_per_game)
        self.root_work = F.new_work(self.roots)
        b = self.leaves.games
        self.planes = xp.zeros((b, F.N_PLANES, layout, layout), np.float32)
        self.glob = xp.zeros((b, F.N_GLOBALS), np.float32)
        # The net's policy over the tensor, on the device: its rows evaluated this step are
        # the ones expand reads (the others are stale).
        self.policy_t = xp.zeros((b, layout * layout + 1), np.float32)
        self.root_planes = np.zeros((slots, F.N_PLANES, layout, layout), np.float32)
        self.root_glob = np.zeros((slots, F.N_GLOBALS), np.float32)
        self.noise_rng = xp.new_rng(slots, seed)
        self.rows = Rows(layout)
        # Per-slot state.
        self.active = np.zeros(slots, np.bool_)
        self.game = np.full(slots, -1, np.int64)  # index of the slot's game in self.info
        self.kind = np.zeros(slots, np.int8)  # how the slot's current move is chosen
        self.target = np.zeros(slots, np.int64)  # visits the current search needs
        self.weight = np.ones(slots, np.float32)  # weight of the current search's row
        self.noise_due = np.zeros(slots, np.bool_)
        self.tree_full = np.zeros(slots, np.bool_)
        self.opening_left = np.zeros(slots, np.int64)
        self.fork_turn = np.full(slots, -1, np.int64)  # the game's early fork (-1: none)
        self.losing_turns = np.zeros(slots, np.int64)
        self.decided = np.zeros(slots, np.bool_)
        self.force_full = np.zeros(slots, np.bool_)
        self.is_side = np.zeros(slots, np.bool_)  # the slot plays a side position
        self.last_row = np.full(slots, NO_ROW, np.int64)
        self.last_row_turn = np.full(slots, -1, np.int64)
        self.raw_priors = np.zeros((slots, cells), np.float32)
        m = self.max_moves + 1
        self.move_kind = np.zeros((slots, m), np.int8)
        self.move_winrate = np.full((slots, m), np.nan, np.float32)
        self.move_visits = np.zeros((slots, m), np.int32)
        self.info: list[GameInfo] = []  # every game and side position, by index
        self.started = 0  # games (side positions aside)
        self.finished = 0
        self.sides_started = 0
        # Counters for progress and metrics.
        self.steps = 0
        self.visits_done = 0
        self.roots_mirrored = 0  # game roots brought up to date on the device (rows mirrored)
        self.moves_done = 0
        self.evaluations = 0
        # Seconds per phase of a step, when timed (a dict: `bench selfplay` sets it); the
        # device is synchronized around each phase, so its queued kernels count where they ran.
        self.phase_seconds: dict[str, float] | None = None
        # Board-local index maps: padded point of (row-major) index i of a size x size board,
        # PASS last.
        self.local_points = {
            n: np.array(
                [point(self.roots.stride, x, y) for y in range(n) for x in range(n)] + [PASS]
            )
            for n in range(2, layout + 1)
        }

    # -- games ---------------------------------------------------------------------------------

    def _draw_game(self) -> GameInfo:
        c = self.config
        rng = self.rng
        sizes, size_w = zip(*c.board_sizes, strict=True)
        size = int(sizes[_cumulative_pick(np.array([size_w], float), rng)[0]])
        names, rule_w = zip(*c.rules, strict=True)
        rules = names[_cumulative_pick(np.array([rule_w], float), rng)[0]]
        fair = dict(c.komi).get(size, 7.0)
        komi = round(2 * rng.normal(fair, c.komi_stdev)) / 2 if c.komi_stdev > 0 else fair
        handicap = 0
        if rng.random() < c.handicap_probability and max_fixed_handicap(size) >= 2:
            handicap = int(rng.integers(2, max_fixed_handicap(size) + 1))
        fork_turn = -1
        if rng.random() < c.early_fork_probability:
            fork_turn = int(rng.exponential(c.early_fork_turn * size * size))
        return GameInfo(
            index=-1, size=size, rules=rules, komi=float(komi), handicap=handicap,
            fork_turn=fork_turn,
        )  # fmt: skip

    def _start(self, g: int, *, sides_only: bool = False) -> bool:
        """Put the next game in slot g: a queued side position first, else a new game while
        any is left (none with `sides_only`). False if the slot stays idle."""
        side = bool(self.side_info)
        if side:
            info = self.side_info.pop()  # the queue is a stack: slot len(side_info) is its top
            _copy_game(self.side_queue, len(self.side_info), self.roots, g)
            self.force_full[g] = True
            self.opening_left[g] = 0
            self.sides_started += 1
        elif sides_only or self.started >= self.games:
            self.active[g] = False
            return False
        else:
            info = self._draw_game()
            stride = self.roots.stride
            stones = [
                (point(stride, x, y), BLACK)
                for x, y in (
                    fixed_handicap_points(info.size, info.handicap) if info.handicap else []
                )
            ]
            info.setup = [(BLACK, p) for p, _ in stones]
            self.roots.size[g] = info.size
            self.roots.rules[g] = PRESETS[info.rules].with_komi(info.komi).as_row()
            bad = _start_game(
                self.roots, g, np.array(stones, np.int64).reshape(-1, 2),
                WHITE if stones else BLACK,
            )  # fmt: skip
            if bad >= 0:
                raise RuntimeError(f"handicap stone {stones[bad]} of a {info.size} board refused")
            self.force_full[g] = False
            mean = self.config.opening_moves * info.size * info.size
            self.opening_left[g] = int(self.rng.exponential(mean)) if mean > 0 else 0
            self.started += 1
        self.roots_changed[g] = True
        self.is_side[g] = side
        info.index = len(self.info)
        self.info.append(info)
        self.game[g] = info.index
        self.fork_turn[g] = info.fork_turn
        self.active[g] = True
        self.losing_turns[g] = 0
        self.decided[g] = False
        self.last_row[g] = NO_ROW
        self.last_row_turn[g] = -1
        self.move_kind[g] = 0
        self.move_winrate[g] = np.nan
        self.move_visits[g] = 0
        if info.kinds is not None:  # a side position: the moves it inherits
            k = len(info.kinds)
            self.move_kind[g, :k] = info.kinds
            self.move_winrate[g, :k] = info.winrates
            self.move_visits[g, :k] = info.visits
        return True

    def _leaf_rules(self):
        """The leaf boards take their slot's size and rules."""
        per = self.config.leaves_per_game
        self.xp.upload(np.repeat(self.roots.size, per), self.leaves.size)
        self.xp.upload(np.repeat(self.roots.rules, per, axis=0), self.leaves.rules)

    def _sync(self) -> None:
        """Before the kernels read them: the roots and what the driver set in the trees, on
        the device (nothing to do on the CPU, where they are the same arrays)."""
        xp, t = self.xp, self.tree
        if self.roots_changed.any():
            xp.mirror(self.roots, self.device_roots, self.roots_changed)
            self.roots_mirrored += int(self.roots_changed.sum())
            self.roots_changed[:] = False
        xp.upload(self.explore, t.explore)
        xp.upload(self.budget, t.budget)
        xp.upload(self.centre, t.centre)

    # -- searches ------------------------------------------------------------------------------

    def _begin_moves(self, which: np.ndarray) -> None:
        """Choose how each slot in `which` picks its next move and set up that search."""
        c = self.config
        k = int(which.sum())
        if k == 0:
            return
        idx = np.flatnonzero(which)
        turn = self.roots.move_count[idx]
        fork_turn = self.fork_turn[idx]
        kind = np.where(self.rng.random(k) < c.full_probability, FULL, CHEAP)
        kind = np.where(self.force_full[idx], FULL, kind)
        kind = np.where(self.opening_left[idx] > 0, RAW_POLICY, kind)
        kind = np.where(turn == fork_turn, FORK, kind)
        self.force_full[idx] = False
        visits = np.where(kind == FULL, c.full_visits, c.cheap_visits)
        visits = np.where((kind == FULL) & self.decided[idx], c.decided_visits, visits)
        visits = np.where((kind == RAW_POLICY) | (kind == FORK), 1, visits)
        self.kind[idx] = kind
        self.target[idx] = visits
        self.weight[idx] = np.where(self.decided[idx], c.decided_weight, 1.0)
        gumbel = c.considered > 0
        self.explore[idx] = (kind == FULL) & (not gumbel)
        self.noise_due[idx] = (kind == FULL) | (gumbel & (kind == CHEAP))
        self.budget[idx] = np.maximum(visits - 1, 1)  # walks after the root's own visit
        self.tree_full[idx] = False
        # The score utility's centre: the root's expected score now (NaN for a fresh root: set
        # after its first evaluation).
        self.centre[idx] = self.state.black_lead[idx]
        if self.noise_due.any():
            # A reused root is expanded already: its noise goes on now.
            self._apply_noise()

    def _apply_noise(self) -> None:
        """Once a search's root is expanded: Dirichlet noise on a PUCT root of a full search,
        or the Gumbel draw of a Gumbel root (every search's)."""
        ready = self.noise_due & self.state.expanded
        if not ready.any():
            return
        xp = self.xp
        priors = xp.to_numpy(xp.root_priors_all(self.tree, self.roots.color.shape[1]))
        self.raw_priors[ready] = priors[ready]
        c = self.config
        if c.considered > 0:
            self._sync()  # the Gumbel schedule reads the budget
            xp.add_gumbel_all(self.tree, self.noise_rng, ready, c.considered)
        else:
            xp.add_noise_all(self.tree, self.noise_rng, ready, alpha_total=c.noise_alpha_total,
                             epsilon=c.noise_epsilon)  # fmt: skip
        self.noise_due &= ~ready

    def _needed(self) -> np.ndarray:
        """[G * L] bool: the leaves that need the network: selected, not a finished game, and
        not a node another leaf of the same game selected this step (that one is dropped)."""
        leaf = self.state.leaf
        need = (leaf >= 0) & ~self.state.leaf_terminal
        for i in range(1, leaf.shape[1]):
            need[:, i] &= ~(leaf[:, :i] == leaf[:, i : i + 1]).any(axis=1)
        return need.reshape(-1)

    @contextlib.contextmanager
    def _phase(self, name: str):
        """Time the block as phase `name` when `phase_seconds` is set (else nothing)."""
        if self.phase_seconds is None:
            yield
            return
        self.xp.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.xp.synchronize()
            spent = time.perf_counter() - start
            self.phase_seconds[name] = self.phase_seconds.get(name, 0.0) + spent

    def _evaluate(self, leaves: Boards):
        """One network call for the leaves that need it; returns the search's leaf values."""
        c, xp = self.config, self.xp
        b = leaves.games
        symmetry = self.rng.integers(0, 8, b)
        need = self._needed()
        rows = np.flatnonzero(need)
        value = np.zeros((b, 3), np.float32)
        score_mean = np.zeros(b, np.float64)
        score_stdev = np.zeros(b, np.float64)
        if len(rows):
            xp.encode_some(leaves, self.leaf_work, need, self.planes, self.glob, symmetry,
                           phase=self._phase)  # fmt: skip
            with self._phase("legal"):
                legal = xp.legal_tensor_all(leaves, self.tensor, symmetry)
            outputs = {"policy": self.policy_t, "value": value, "score_mean": score_mean,
                       "score_stdev": score_stdev}  # fmt: skip
            with self._phase("net"):
                net_rows(self.net, self.planes, self.glob, legal, rows, outputs, take=self.take,
                         to_numpy=xp.to_numpy, put_rows=xp.put_rows)  # fmt: skip
            self.evaluations += len(rows)
        with self._phase("leaf values"):
            policy = xp.policy_all(leaves, self.policy_t, symmetry)
            per = c.leaves_per_game
            centre = np.repeat(self.centre, per)
            to_move = xp.to_numpy(leaves.to_move)
            size = np.repeat(self.roots.size, per)
            values = leaf_values(to_move, size, value, score_mean, score_stdev, centre,
                                 c.search.score_utility)  # fmt: skip
        return (policy, *values)

    def step(self) -> list[FinishedGame]:
        """One lockstep step: finish the searches that are done (moves, rows, game ends), then
        one batch of leaves for every searching slot. Returns the games that ended."""
        with self._phase("moves"):  # moves, rows and game ends: the host's control
            if self.steps == 0:
                for g in range(self.slots):
                    self._start(g)
                self._leaf_rules()
                self._begin_moves(self.active.copy())
            finished = self._finish_moves()
            idle = ~self.active
            if idle.any() and self.side_info:
                # Side positions queued after the games ran out take the idle slots.
                started = np.zeros(self.slots, np.bool_)
                for g in np.flatnonzero(idle):
                    started[g] = self._start(g, sides_only=True)
                self.xp.reset_some(self.tree, started)
                self.state = self.xp.root_state(self.tree)
                self._leaf_rules()
                self._begin_moves(started)
        t, xp = self.tree, self.xp
        budget = np.where(
            self.active,
            np.clip(self.target - self.state.visits, 0, self.config.leaves_per_game),
            0,
        )
        if budget.any():
            before = int(self.state.visits.sum())
            with self._phase("select"):
                self._sync()
                xp.select_all(t, self.device_roots, self.leaves, self.config.search, budget)
                self.state = xp.root_state(t)
            self.tree_full |= (budget > 0) & (self.state.leaf < 0).all(axis=1)
            evaluated = self._evaluate(self.leaves)
            with self._phase("backup"):
                xp.expand_and_backup_all(t, self.leaves, *evaluated)
                self.state = xp.root_state(t)
            self.visits_done += int(self.state.visits.sum()) - before
            fresh = np.isnan(self.centre) & (self.state.visits > 0)
            if fresh.any():
                self.centre[fresh] = self.state.black_lead[fresh]
            if self.noise_due.any():
                with self._phase("moves"):
                    self._apply_noise()
        self.steps += 1
        if self.on_step is not None:
            self.on_step(self)
        return finished

    def run(self) -> Iterator[FinishedGame]:
        """Step until every game and side position has finished, yielding each as it ends."""
        while self.finished < self.games or self.side_info or self.active.any():
            yield from self.step()
            if not self.active.any() and (self.finished < self.games or self.side_info):
                raise RuntimeError("self-play stalled: no active slot and games left")

    # -- moves ---------------------------------------------------------------------------------

    def _finish_moves(self) -> list[FinishedGame]:
        t, xp, state = self.tree, self.xp, self.state
        done = self.active & ((state.visits >= self.target) | self.tree_full)
        if not done.any():
            return []
        c = self.config
        cells = self.roots.color.shape[1]
        idx = np.flatnonzero(done)
        kind = self.kind[idx]
        searched = (kind == FULL) | (kind == CHEAP)
        win, black_lead = state.win, state.black_lead
        # The roots' priors ([G, cells], from the device), read at most once: the trees do not
        # change before the moves are played below.
        root_priors = functools.cache(lambda: xp.to_numpy(xp.root_priors_all(t, cells)))
        # Move choice.
        gumbel = c.considered > 0
        if gumbel:
            targets, kept = xp.gumbel_targets_all(t, c.search, cells)
        else:
            targets, kept = xp.policy_targets_all(t, c.search, cells)
        targets, kept = xp.to_numpy(targets), xp.to_numpy(kept)
        turn = self.roots.move_count[idx].astype(np.int64)
        moves = np.zeros(len(idx), np.int64)
        if searched.any() and gumbel:  # the Gumbel draw is the exploration: no temperature
            moves[searched] = xp.to_numpy(xp.gumbel_moves_all(t, c.search))[idx[searched]]
        elif searched.any():
            s_idx = idx[searched]
            weights = np.where(kept[s_idx, None] > 0, targets[s_idx], 0.0)
            no_target = kept[s_idx] <= 0
            if no_target.any():  # a tree with no visit below the root: take the prior
                weights[no_target] = root_priors()[s_idx[no_target]]
            moves[searched] = S.choose_moves(
                weights,
                turn[searched],
                self.roots.size[s_idx],
                self.rng,
                start=c.temperature_start,
                end=c.temperature_end,
            )
        other = ~searched
        if other.any():
            o_idx = idx[other]
            priors = root_priors()[o_idx].astype(np.float64)
            weights = np.where((kind[other] == FORK)[:, None], priors > 0, priors)
            # An opening or fork move is a move on the board, never a pass: a drawn pass
            # handed the opponent a won game by passing back (a third of generation 2's
            # games ended by move 16), and those rows taught the policy to pass early.
            weights[:, PASS] = 0.0
            weights[weights.sum(axis=1) == 0, PASS] = 1.0
            moves[other] = _cumulative_pick(weights, self.rng)
        # A side position ends after its search, or goes on for one more move (then a full
        # search again).
        side = self.is_side[idx] & searched
        go_on = side & (self.rng.random(len(idx)) < c.side_continue_probability)
        stop = side & ~go_on
        self.force_full[idx[go_on]] = True
        # The previous turn's row gets this move as its opponent's reply (if it is played).
        prev = self.last_row[idx]
        follows = (prev >= 0) & (self.last_row_turn[idx] == turn - 1) & ~stop
        if follows.any():
            sizes = self.roots.size[idx[follows]]
            self.rows.columns["opponent_move"][prev[follows]] = self._local(moves[follows], sizes)
        # Rows of the searched moves (full searches; cheap ones too if asked).
        recorded = (kind == FULL) | ((kind == CHEAP) & c.record_cheap_searches)
        if recorded.any():
            self._record_rows(idx[recorded], targets, kept, win, black_lead)
            self.last_row_turn[idx[recorded]] = turn[recorded]
        # A game's searched turn may branch off a side position.
        self._spawn_sides(idx, kind, moves, root_priors)
        # The resignation-free bookkeeping.
        if searched.any():
            s_idx = idx[searched]
            rate = (1.0 + win[s_idx]) / 2.0
            losing = np.minimum(rate, 1.0 - rate) < c.decided_winrate
            self.losing_turns[s_idx] = np.where(losing, self.losing_turns[s_idx] + 1, 0)
            newly = ~self.decided[s_idx] & (self.losing_turns[s_idx] >= c.decided_turns)
            for g in s_idx[newly]:
                self.info[self.game[g]].decided_at = int(self.roots.move_count[g])
            self.decided[s_idx] |= self.losing_turns[s_idx] >= c.decided_turns
        # Per-move records for the SGF.
        self.move_kind[idx, turn] = kind
        self.move_winrate[idx, turn] = np.where(searched, (1.0 + win[idx]) / 2.0, np.nan)
        self.move_visits[idx, turn] = state.visits[idx]
        self.opening_left[idx] = np.maximum(self.opening_left[idx] - (kind == RAW_POLICY), 0)
        # Play, keep the subtree.
        stopped = np.zeros(self.slots, np.bool_)
        stopped[idx[stop]] = True
        moving = done & ~stopped
        all_moves = np.zeros(self.slots, np.int64)
        all_moves[idx] = moves
        play_some(self.roots, all_moves, moving)
        self.roots_changed |= moving
        if gumbel:  # a Gumbel search schedules its own visits: it starts from a fresh root
            xp.reset_some(t, moving)
        else:
            xp.reroot_some(t, self.spare, all_moves, moving)
        self.moves_done += int(moving.sum())
        # Game ends.
        ended = (self.roots.passes >= 2) | (self.roots.move_count >= self.max_moves)
        over = (moving & ended) | stopped
        finished = [self._end_game(g) for g in np.flatnonzero(over)]
        if over.any():
            xp.reset_some(t, over)
            for g in np.flatnonzero(over):
                self._start(g)
            self._leaf_rules()
        self.state = xp.root_state(t)
        self._begin_moves(done & self.active)
        return finished

    def _local(self, moves: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        """Padded points -> board-local indices (row-major, pass = size * size)."""
        stride = self.roots.stride
        x = moves % stride - 1
        y = moves // stride - 1
        return np.where(moves == PASS, sizes * sizes, y * sizes + x).astype(np.int16)

    def _record_rows(self, s_idx, targets, kept, win, black_lead) -> None:
        which = np.zeros(self.slots, np.bool_)
        which[s_idx] = True
        F.encode_some(self.roots, self.root_work, which, self.root_planes, self.root_glob)
        sizes = self.roots.size[s_idx]
        packed = np.zeros((len(s_idx), F.packed_length(self.layout)), np.uint8)
        policy = np.zeros((len(s_idx), self.layout * self.layout + 1), np.float32)
        for n in np.unique(sizes):
            rows = sizes == n
            packed[rows, : F.packed_length(n)] = F.pack_planes(self.root_planes[s_idx[rows]], n)
            policy[rows, : n * n + 1] = targets[s_idx[rows]][:, self.local_points[n]]
        full = (self.kind[s_idx] == FULL) & (kept[s_idx] > 0)
        weight = self.weight[s_idx]
        mover = np.where(self.roots.to_move[s_idx] == BLACK, 1.0, -1.0)
        self.last_row[s_idx] = self.rows.append(
            self.last_row[s_idx],
            turn=self.roots.move_count[s_idx],
            to_move=self.roots.to_move[s_idx],
            board_size=sizes,
            planes=packed,
            globals=self.root_glob[s_idx],
            policy_target=policy,
            policy_weight=np.where(full, weight, 0.0),
            value_weight=weight,
            opponent_move=np.full(len(s_idx), -1),
            visits=self.state.visits[s_idx],
            root_value=win[s_idx],
            root_score=mover * black_lead[s_idx],
        )

    def _spawn_sides(self, idx, kind, moves, root_priors: Callable[[], np.ndarray]) -> None:
        """Queue side positions off the searched turns of games, drawn with
        side_position_probability (`root_priors()`: the roots' priors, [G, cells])."""
        c = self.config
        if c.side_position_probability <= 0:
            return
        searched = (kind == FULL) | (kind == CHEAP)
        draw = self.rng.random(len(idx)) < c.side_position_probability
        # From games only (a side position's own continuation is its recursion), and with
        # room for the alternative and a move after it.
        room = self.roots.move_count[idx] + 2 < self.max_moves
        for i in np.flatnonzero(searched & draw & ~self.is_side[idx] & room):
            g = idx[i]
            if len(self.side_info) >= self.slots:
                return  # the queue is full: this one is skipped
            # The raw policy (before noise) at temperature 1, 2 or infinity (70/25/5%),
            # without the move the search chose.
            if kind[i] == FULL:
                priors = self.raw_priors[g].astype(np.float64)
            else:
                priors = root_priors()[g].astype(np.float64)
            u = self.rng.random()
            priors = priors if u < 0.7 else np.sqrt(priors) if u < 0.95 else (priors > 0) * 1.0
            priors[moves[i]] = 0.0
            priors[PASS] = 0.0  # the alternative is a move on the board (never a game's end)
            if priors.sum() <= 0:
                continue
            alternative = int(_cumulative_pick(priors[None, :], self.rng)[0])
            q = len(self.side_info)
            _copy_game(self.roots, g, self.side_queue, q)
            play(self.side_queue, q, alternative, self.side_queue.to_move[q])
            parent = self.info[self.game[g]]
            turn = int(self.roots.move_count[g])
            self.side_info.append(
                GameInfo(
                    index=-1,
                    size=parent.size,
                    rules=parent.rules,
                    komi=parent.komi,
                    handicap=parent.handicap,
                    side_of=parent.index,
                    setup=list(parent.setup),
                    kinds=np.append(self.move_kind[g, :turn], np.int8(SIDE)),
                    winrates=np.append(self.move_winrate[g, :turn], np.float32(np.nan)),
                    visits=np.append(self.move_visits[g, :turn], np.int32(0)),
                )  # fmt: skip
            )

    def _end_game(self, g: int) -> FinishedGame:
        """Score slot g's game (stones in the opponent's pass-alive area are dead), fill in its
        rows' outcomes and return it. A side position is not scored: its rows' outcome is their
        search's win value, their score and ownership weigh nothing (score_weight 0)."""
        info = self.info[self.game[g]]
        self.active[g] = False
        if self.is_side[g]:
            return self._end_side(g, info)
        black_lead, owner = final_score(self.roots, self.root_work, g)
        n = int(self.roots.size[g])
        info.black_lead = black_lead
        self._keep_moves(g, info)
        rows = self._take_rows(g)
        mover = np.where(rows["to_move"] == BLACK, 1, -1)
        rows["outcome"] = (mover * np.sign(black_lead)).astype(np.float32)
        rows["final_score"] = (mover * black_lead).astype(np.float32)
        rows["score_weight"] = np.ones(len(mover), np.float32)
        local = owner[self.local_points[n][:-1]]
        black_own = np.where(local == BLACK, 1, np.where(local == WHITE, -1, 0)).astype(np.int8)
        ownership = np.zeros((len(mover), self.layout * self.layout), np.int8)
        ownership[:, : n * n] = mover[:, None] * black_own[None, :]
        rows["ownership"] = ownership  # padded to the layout, as the other board-wide columns
        self.finished += 1
        return FinishedGame(info=info, rows=rows, stride=self.roots.stride)

    def _end_side(self, g: int, info: GameInfo) -> FinishedGame:
        self._keep_moves(g, info)
        rows = self._take_rows(g)
        k = len(rows["turn"])
        rows["outcome"] = rows["root_value"].astype(np.float32)
        rows["final_score"] = np.zeros(k, np.float32)
        rows["score_weight"] = np.zeros(k, np.float32)
        rows["ownership"] = np.zeros((k, self.layout * self.layout), np.int8)
        return FinishedGame(info=info, rows=rows, stride=self.roots.stride)

    def _take_rows(self, g: int) -> dict[str, np.ndarray]:
        """Slot g's game's rows, out of the pool."""
        rows = self.rows.take(int(self.last_row[g]))
        self.last_row[g] = NO_ROW
        return rows

    def _keep_moves(self, g: int, info: GameInfo) -> None:
        played = int(self.roots.move_count[g])
        info.moves = self.roots.moves[g, :played].copy()
        info.colors = self.roots.move_colors[g, :played].copy()
        info.kinds = self.move_kind[g, :played].copy()
        info.winrates = self.move_winrate[g, :played].copy()
        info.visits = self.move_visits[g, :played].copy()
