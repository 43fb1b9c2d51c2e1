"""One game as a Python object over a one-game batch: what GTP, SGF replay and the match runner use.

Points are (x, y) with y = 0 the top row; None is a pass. The object keeps the setup stones and
the moves, so it can replay itself (undo, a change of rules) without touching the kernels'
arrays from Python.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from gocore import board as gb
from gocore.board import BLACK, EMPTY, LEGAL, STATUS_NAMES, WHITE, Boards
from gocore.playout import new_rng, play_out_all, random_move
from gocore.rules import PRESETS, RULE_KOMI_HALVES, Rules

Point = tuple[int, int]
Move = Point | None

COLOR_NAMES = {BLACK: "black", WHITE: "white"}


class IllegalMoveError(ValueError):
    """A move the rules forbid; `reason` is one of board.STATUS_NAMES' values."""

    def __init__(self, color: int, move: Move, reason: str, move_number: int | None = None):
        self.color, self.move, self.reason, self.move_number = color, move, reason, move_number
        where = f"move {move_number} " if move_number is not None else ""
        super().__init__(f"{where}{COLOR_NAMES.get(color, color)} {move}: illegal ({reason})")


@dataclasses.dataclass(frozen=True)
class DeadStoneEstimate:
    """Ownership from random playouts and the stones judged dead from it."""

    ownership: np.ndarray  # [n, n] float, +1 = always Black's at the end, -1 = always White's
    dead: list[Point]


class Game:
    """A game of Go under given rules, with its setup stones and move list."""

    def __init__(self, size: int = 19, rules: Rules | None = None, *, max_moves: int | None = None):
        self.rules = PRESETS["tromp-taylor"] if rules is None else rules
        self.size = size
        self._max_moves = max_moves
        self.b: Boards = gb.new_boards(1, size, self.rules, max_moves=max_moves)
        self.setup: list[tuple[int, Point]] = []
        self.moves: list[tuple[int, Move]] = []
        self._first_player = BLACK

    # -- coordinates --------------------------------------------------------------------------

    def point_index(self, p: Point) -> int:
        x, y = p
        if not (0 <= x < self.size and 0 <= y < self.size):
            raise IllegalMoveError(0, p, STATUS_NAMES[gb.ILLEGAL_OFF_BOARD])
        return gb.point(self.b.stride, x, y)

    def index_point(self, index: int) -> Move:
        return None if index == gb.PASS else gb.point_xy(self.b.stride, index)

    # -- state --------------------------------------------------------------------------------

    @property
    def to_move(self) -> int:
        return int(self.b.to_move[0])

    @property
    def komi(self) -> float:
        return self.rules.komi

    @property
    def captures(self) -> dict[int, int]:
        """Stones captured by each player."""
        return {BLACK: int(self.b.captures[0, BLACK]), WHITE: int(self.b.captures[0, WHITE])}

    @property
    def passes(self) -> int:
        return int(self.b.passes[0])

    @property
    def is_over(self) -> bool:
        return self.passes >= 2

    @property
    def hash(self) -> int:
        return int(self.b.hash[0])

    def board(self) -> np.ndarray:
        """[n, n] int8 of EMPTY/BLACK/WHITE, row 0 at the top."""
        return gb.grid(self.b.color[0], self.b.stride, self.size).copy()

    def stones(self, color: int) -> list[Point]:
        ys, xs = np.nonzero(self.board() == color)
        return [(int(x), int(y)) for x, y in zip(xs, ys, strict=True)]

    def color_at(self, p: Point) -> int:
        return int(self.b.color[0, self.point_index(p)])

    def liberties(self, p: Point) -> int:
        return int(gb.liberties(self.b, 0, self.point_index(p)))

    def is_empty(self) -> bool:
        return not self.setup and not self.moves

    # -- moves --------------------------------------------------------------------------------

    def legality(self, color: int, move: Move) -> str:
        """'legal' or the reason the move is illegal."""
        if color not in (BLACK, WHITE):
            raise ValueError(f"color must be BLACK or WHITE (got {color})")
        if move is None:
            return STATUS_NAMES[gb.legality(self.b, 0, gb.PASS, color)]
        x, y = move
        if not (0 <= x < self.size and 0 <= y < self.size):
            return STATUS_NAMES[gb.ILLEGAL_OFF_BOARD]
        return STATUS_NAMES[gb.legality(self.b, 0, self.point_index(move), color)]

    def is_legal(self, color: int, move: Move) -> bool:
        return self.legality(color, move) == STATUS_NAMES[LEGAL]

    def play(self, color: int, move: Move) -> None:
        """Play a move (None = pass); raises IllegalMoveError and leaves the game as it was."""
        if color not in (BLACK, WHITE):
            raise ValueError(f"color must be BLACK or WHITE (got {color})")
        index = gb.PASS if move is None else self._checked_index(color, move)
        status = gb.play(self.b, 0, index, color)
        if status != LEGAL:
            raise IllegalMoveError(color, move, STATUS_NAMES[status], len(self.moves) + 1)
        self.moves.append((color, move))

    def _checked_index(self, color: int, move: Point) -> int:
        try:
            return self.point_index(move)
        except IllegalMoveError:
            raise IllegalMoveError(
                color, move, STATUS_NAMES[gb.ILLEGAL_OFF_BOARD], len(self.moves) + 1
            ) from None

    def legal_moves(self, color: int) -> list[Point]:
        """Every legal point for color (pass, always legal, not listed)."""
        row = np.zeros(self.b.color.shape[1], dtype=np.bool_)
        gb.legal_row(self.b, 0, color, row)
        row[gb.PASS] = False
        return sorted(
            (self.index_point(int(i)) for i in np.nonzero(row)[0]), key=lambda p: (p[1], p[0])
        )

    def add_setup_stones(self, color: int, points: list[Point]) -> None:
        """Place setup (handicap, AB/AW) stones; only before the first move. All or nothing."""
        if self.moves:
            raise ValueError("setup stones can only be placed before the first move")
        trial = self.copy()
        for p in points:
            status = gb.setup_stone(trial.b, 0, trial._checked_index(color, p), color)
            if status != LEGAL:
                raise IllegalMoveError(color, p, STATUS_NAMES[status])
            trial.setup.append((color, p))
        self._adopt(trial)

    def set_komi(self, komi: float) -> None:
        """Change komi (it only enters the score)."""
        self.rules = self.rules.with_komi(komi)
        self.b.rules[0, RULE_KOMI_HALVES] = self.rules.as_row()[RULE_KOMI_HALVES]

    def set_to_move(self, color: int) -> None:
        if not self.moves:
            self._first_player = color
        gb.set_to_move(self.b, 0, color)

    def undo(self) -> None:
        if not self.moves:
            raise ValueError("no move to undo")
        self._adopt(self.replayed(self.rules, moves=self.moves[:-1]))

    def set_rules(self, rules: Rules) -> None:
        """Change the rules; the game so far is replayed under them (all or nothing)."""
        self._adopt(self.replayed(rules))

    def replayed(self, rules: Rules, moves: list[tuple[int, Move]] | None = None) -> Game:
        """A new game with these rules, the same setup, and `moves` (default: this game's)."""
        game = Game(self.size, rules, max_moves=self._max_moves)
        for color, p in self.setup:
            game.add_setup_stones(color, [p])
        game.set_to_move(self._first_player)
        for color, move in self.moves if moves is None else moves:
            game.play(color, move)
        return game

    def copy(self) -> Game:
        game = Game.__new__(Game)
        game.rules, game.size, game._max_moves = self.rules, self.size, self._max_moves
        game.b = Boards(*(f if isinstance(f, int) else f.copy() for f in self.b))
        game.setup, game.moves = list(self.setup), list(self.moves)
        game._first_player = self._first_player
        return game

    def _adopt(self, other: Game) -> None:
        self.__dict__.update(other.__dict__)

    # -- random play and scoring --------------------------------------------------------------

    def random_move(self, color: int, rng: np.ndarray, *, avoid_own_eyes: bool = True) -> Move:
        """A random legal move: by default the random player's (no own-eye filling, pass last)."""
        return self.index_point(int(random_move(self.b, 0, color, rng, avoid_own_eyes)))

    def score(self, dead: list[Point] = (), seki: list[Point] = ()) -> float:
        """Black's points minus White's minus komi under this game's rules (> 0: Black wins)."""
        area = self.b.color.shape[1]
        dead_row = np.zeros(area, np.bool_)
        seki_row = np.zeros(area, np.bool_)
        for p in dead:
            dead_row[self.point_index(p)] = True
        for p in seki:
            seki_row[self.point_index(p)] = True
        owner = np.zeros(area, np.int8)
        return float(gb.score(self.b, 0, dead_row, seki_row, owner))

    def estimate_dead(self, *, playouts: int = 64, seed: int = 0) -> DeadStoneEstimate:
        """Dead stones by Monte-Carlo: play the game out at random (no own-eye filling) many
        times; a group whose points end up the opponent's in most playouts is dead.

        Random playouts misjudge sekis (each side may fill the shared liberties), so this is a
        stand-in until a network's ownership head replaces it.
        """
        batch = gb.new_boards(playouts, self.size, self.rules.as_row(), max_moves=self.b.max_moves)
        for g in range(playouts):
            gb.copy_game(self.b, 0, batch, g)
        batch.passes[:] = 0  # a finished game is played on: both sides may still have moves
        play_out_all(batch, new_rng(playouts, seed), True)
        area = batch.color.shape[1]
        _, owners = gb.score_all(batch)
        ownership = (owners == BLACK).mean(axis=0) - (owners == WHITE).mean(axis=0)
        # A group lives or dies as a whole: average its stones' ownership from its own side.
        color, head = self.b.color[0], self.b.group_head[0]
        stones = np.nonzero((color == BLACK) | (color == WHITE))[0]
        side = np.where(color[stones] == BLACK, 1.0, -1.0)
        heads = head[stones]
        group_total = np.zeros(area)
        group_count = np.zeros(area)
        np.add.at(group_total, heads, side * ownership[stones])
        np.add.at(group_count, heads, 1)
        dead = [
            self.index_point(int(s))
            for s, h in zip(stones, heads, strict=True)
            if group_total[h] < 0
        ]
        return DeadStoneEstimate(
            ownership=gb.grid(ownership, self.b.stride, self.size),
            dead=sorted(dead, key=lambda p: (p[1], p[0])),
        )

    def groups(self) -> list[tuple[int, list[Point]]]:
        """The groups on the board as (color, points), in reading order of their first stone."""
        board = self.board()
        seen = np.zeros_like(board, dtype=bool)
        out: list[tuple[int, list[Point]]] = []
        for y in range(self.size):
            for x in range(self.size):
                c = board[y, x]
                if c == EMPTY or seen[y, x]:
                    continue
                stack, group = [(x, y)], []
                seen[y, x] = True
                while stack:
                    px, py = stack.pop()
                    group.append((px, py))
                    for qx, qy in ((px - 1, py), (px + 1, py), (px, py - 1), (px, py + 1)):
                        on_board = 0 <= qx < self.size and 0 <= qy < self.size
                        if on_board and board[qy, qx] == c and not seen[qy, qx]:
                            seen[qy, qx] = True
                            stack.append((qx, qy))
                out.append((int(c), sorted(group, key=lambda p: (p[1], p[0]))))
        return out
