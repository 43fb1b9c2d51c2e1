"""A GTP v2 engine (`tengen gtp`): the required commands, the tournament subset, GNU Go's and
KataGo's extensions that GUIs and referees use, over any Player.

Protocol rules (GTP v2, section 3): control characters other than HT and LF are dropped, `#`
starts a comment, HT is a space, blank lines are ignored, an optional numeric id is echoed. A
command that fails answers `?` and leaves the game exactly as it was; the engine never exits on
bad input, only on `quit` or the end of its input.
"""

from __future__ import annotations

import re
import sys
import traceback
from collections.abc import Callable
from typing import TextIO

from gocore.board import BLACK, MAX_SIZE, MIN_SIZE, WHITE
from gocore.rules import Rules, RulesError, fixed_handicap_points, max_fixed_handicap, parse_rules
from play.game import Game, IllegalMoveError, Move, Point
from play.players import RESIGN, Player
from play.sgf import SgfError, read_sgf, record_from_game, replay, write_sgf

COLUMNS = "ABCDEFGHJKLMNOPQRSTUVWXYZ"  # GTP skips I
_VERTEX = re.compile(r"^([A-HJ-Za-hj-z])(\d{1,2})$")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


class GtpError(Exception):
    """A command failure: the message becomes the `?` response."""


def parse_color(text: str) -> int:
    t = text.lower()
    if t in ("b", "black"):
        return BLACK
    if t in ("w", "white"):
        return WHITE
    raise GtpError(f"syntax error: invalid color {text!r}")


def format_color(color: int) -> str:
    return "black" if color == BLACK else "white"


def parse_vertex(text: str, size: int) -> Move:
    """A GTP vertex (`D4`, `pass`) as (x, y), y = 0 at the top; None for pass."""
    if text.lower() == "pass":
        return None
    m = _VERTEX.match(text)
    if m is None:
        raise GtpError(f"syntax error: invalid vertex {text!r}")
    x = COLUMNS.index(m[1].upper())
    row = int(m[2])
    if not (x < size and 1 <= row <= size):
        raise GtpError(f"illegal move: {text} is off the {size}x{size} board")
    return x, size - row


def format_vertex(move: Move, size: int) -> str:
    if move is None:
        return "pass"
    x, y = move
    return f"{COLUMNS[x]}{size - y}"


def format_score(score: float) -> str:
    """GTP's final_score text for a score from Black's side."""
    if score == 0:
        return "0"
    return f"{'B' if score > 0 else 'W'}+{abs(score):g}"


class GtpEngine:
    """The engine state (a Game, time settings) and the command table."""

    def __init__(
        self,
        player: Player,
        *,
        rules: Rules,
        size: int = 19,
        name: str = "tengen",
        version: str = "0.1.0",
        dead_stone_playouts: int = 128,
        log: TextIO | None = None,
    ):
        self.player = player
        self.name = name
        self.version = version
        self.game = Game(size, rules)
        self.dead_stone_playouts = dead_stone_playouts
        self.time_settings: tuple[int, int, int] | None = None
        self.time_left: dict[int, tuple[int, int]] = {}
        self.seed = 0
        self.done = False
        self.log = log
        self._dead_cache: tuple[tuple, list[Point]] | None = None
        self.commands: dict[str, Callable[[list[str]], str]] = {
            "protocol_version": lambda a: "2",
            "name": lambda a: self.name,
            "version": lambda a: self.version,
            "known_command": self.cmd_known_command,
            "list_commands": lambda a: "\n".join(sorted(self.commands)),
            "quit": self.cmd_quit,
            "boardsize": self.cmd_boardsize,
            "clear_board": self.cmd_clear_board,
            "komi": self.cmd_komi,
            "play": self.cmd_play,
            "genmove": lambda a: self._genmove(a, play=True),
            "reg_genmove": lambda a: self._genmove(a, play=False),
            "kgs-genmove_cleanup": lambda a: self._genmove(a, play=True, cleanup=True),
            "undo": self.cmd_undo,
            "fixed_handicap": self.cmd_fixed_handicap,
            "place_free_handicap": self.cmd_place_free_handicap,
            "set_free_handicap": self.cmd_set_free_handicap,
            "time_settings": self.cmd_time_settings,
            "time_left": self.cmd_time_left,
            "final_score": self.cmd_final_score,
            "final_status_list": self.cmd_final_status_list,
            "loadsgf": self.cmd_loadsgf,
            "printsgf": self.cmd_printsgf,
            "showboard": lambda a: "\n" + board_diagram(self.game),
            "list_stones": self.cmd_list_stones,
            "is_legal": self.cmd_is_legal,
            "all_legal": self.cmd_all_legal,
            "captures": self.cmd_captures,
            "set_random_seed": self.cmd_set_random_seed,
            "kata-set-rules": self.cmd_kata_set_rules,
            "kata-get-rules": lambda a: self.game.rules.to_json(),
        }

    # -- the protocol -------------------------------------------------------------------------

    def handle(self, raw_line: str) -> str | None:
        """The full response (ending in a blank line) to one input line; None for blank lines."""
        line = _CONTROL.sub("", raw_line).split("#", 1)[0].replace("\t", " ").strip()
        if not line:
            return None
        words = line.split()
        cmd_id = ""
        if words[0].isdigit():
            cmd_id = words.pop(0)
            if not words:
                return f"?{cmd_id} syntax error: no command after the id\n\n"
        name, args = words[0], words[1:]
        handler = self.commands.get(name)
        if handler is None:
            return f"?{cmd_id} unknown command\n\n"
        try:
            result = handler(args)
        except GtpError as e:
            return f"?{cmd_id} {e}\n\n"
        except Exception as e:  # the engine must answer and keep going, whatever went wrong
            if self.log is not None:
                traceback.print_exc(file=self.log)
            return f"?{cmd_id} internal error: {type(e).__name__}: {e}\n\n"
        # A response ends at its first blank line, so a result must not contain one.
        result = re.sub(r"\n\s*\n", "\n", result.rstrip("\n"))
        return f"={cmd_id} {result}\n\n"

    def serve(self, inp: TextIO = sys.stdin, out: TextIO = sys.stdout) -> None:
        for raw_line in inp:
            response = self.handle(raw_line)
            if response is not None:
                out.write(response)
                out.flush()
            if self.done:
                break

    # -- helpers ------------------------------------------------------------------------------

    def _args(self, args: list[str], count: int, usage: str) -> list[str]:
        if len(args) != count:
            raise GtpError(f"syntax error: usage: {usage}")
        return args

    def _int(self, text: str, what: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise GtpError(f"syntax error: {what} must be an integer (got {text!r})") from None

    def _new_game(self, size: int | None = None) -> None:
        """An empty board (of a new size), keeping the rules and komi."""
        self.game = Game(self.game.size if size is None else size, self.game.rules)

    def _dead_stones(self) -> list[Point]:
        """The dead-stone estimate, computed once per position (final_score and the three
        final_status_list calls of a referee then agree with each other)."""
        game = self.game
        key = (game.hash, len(game.moves), game.size, game.rules, self.seed)
        if self._dead_cache is None or self._dead_cache[0] != key:
            estimate = self.game.estimate_dead(playouts=self.dead_stone_playouts, seed=self.seed)
            self._dead_cache = (key, estimate.dead)
        return self._dead_cache[1]

    def _vertices(self, points: list[Point]) -> str:
        return " ".join(format_vertex(p, self.game.size) for p in points)

    # -- commands -----------------------------------------------------------------------------

    def cmd_known_command(self, args: list[str]) -> str:
        (name,) = self._args(args, 1, "known_command command_name")
        return "true" if name in self.commands else "false"

    def cmd_quit(self, args: list[str]) -> str:
        self.done = True
        return ""

    def cmd_boardsize(self, args: list[str]) -> str:
        (text,) = self._args(args, 1, "boardsize size")
        size = self._int(text, "board size")
        if not MIN_SIZE <= size <= MAX_SIZE:
            raise GtpError(f"unacceptable size (tengen plays {MIN_SIZE}..{MAX_SIZE})")
        self._new_game(size)
        return ""

    def cmd_clear_board(self, args: list[str]) -> str:
        self._new_game()
        return ""

    def cmd_komi(self, args: list[str]) -> str:
        (text,) = self._args(args, 1, "komi value")
        try:
            komi = float(text)
        except ValueError:
            raise GtpError(f"syntax error: komi must be a number (got {text!r})") from None
        try:
            self.game.set_komi(komi)
        except RulesError as e:
            raise GtpError(f"syntax error: {e}") from None
        return ""

    def cmd_play(self, args: list[str]) -> str:
        color_text, vertex_text = self._args(args, 2, "play color vertex")
        color = parse_color(color_text)
        move = parse_vertex(vertex_text, self.game.size)
        try:
            self.game.play(color, move)
        except IllegalMoveError as e:
            raise GtpError(f"illegal move: {e.reason}") from None
        return ""

    def _genmove(self, args: list[str], *, play: bool, cleanup: bool = False) -> str:
        (color_text,) = self._args(args, 1, "genmove color")
        color = parse_color(color_text)
        move = self.player.genmove(self.game, color, cleanup=cleanup)
        if move == RESIGN:
            return "resign"
        if play:
            try:
                self.game.play(color, move)
            except IllegalMoveError as e:
                raise GtpError(
                    f"cannot play {format_vertex(move, self.game.size)}: {e.reason}"
                ) from None
        return format_vertex(move, self.game.size)

    def cmd_undo(self, args: list[str]) -> str:
        if not self.game.moves:
            raise GtpError("cannot undo")
        self.game.undo()
        return ""

    def _place_handicap(self, points: list[Point]) -> str:
        self.game.add_setup_stones(BLACK, points)
        self.game.set_to_move(WHITE)
        return self._vertices(points)

    def cmd_fixed_handicap(self, args: list[str]) -> str:
        (text,) = self._args(args, 1, "fixed_handicap number_of_stones")
        stones = self._int(text, "number of stones")
        if not self.game.is_empty():
            raise GtpError("board not empty")
        try:
            points = fixed_handicap_points(self.game.size, stones)
        except RulesError as e:
            raise GtpError(f"invalid number of stones: {e}") from None
        return self._place_handicap(points)

    def cmd_place_free_handicap(self, args: list[str]) -> str:
        (text,) = self._args(args, 1, "place_free_handicap number_of_stones")
        stones = self._int(text, "number of stones")
        n = self.game.size
        if stones < 2 or stones > n * n - 1:
            raise GtpError(f"invalid number of stones (2..{n * n - 1} on {n}x{n})")
        if not self.game.is_empty():
            raise GtpError("board not empty")
        return self._place_handicap(free_handicap_points(n, stones))

    def cmd_set_free_handicap(self, args: list[str]) -> str:
        n = self.game.size
        if not self.game.is_empty():
            raise GtpError("board not empty")
        if len(args) < 2 or len(args) > n * n - 1:
            raise GtpError(f"invalid number of stones (2..{n * n - 1} on {n}x{n})")
        points = []
        for text in args:
            try:
                p = parse_vertex(text, n)
            except GtpError:
                raise GtpError(f"bad vertex list: {text!r} is not a vertex of this board") from None
            if p is None or p in points:
                raise GtpError(f"bad vertex list: {text!r} is a pass or repeated")
            points.append(p)
        try:
            self._place_handicap(points)
        except IllegalMoveError as e:
            raise GtpError(f"bad vertex list: {e}") from None
        return ""

    def cmd_time_settings(self, args: list[str]) -> str:
        main, byo, stones = self._args(args, 3, "time_settings main_time byo_yomi_time stones")
        self.time_settings = (
            self._int(main, "main time"),
            self._int(byo, "byo-yomi time"),
            self._int(stones, "byo-yomi stones"),
        )
        return ""

    def cmd_time_left(self, args: list[str]) -> str:
        color_text, time_text, stones = self._args(args, 3, "time_left color time stones")
        color = parse_color(color_text)
        self.time_left[color] = (self._int(time_text, "time"), self._int(stones, "stones"))
        return ""

    def cmd_final_score(self, args: list[str]) -> str:
        return format_score(self.game.score(dead=self._dead_stones()))

    def cmd_final_status_list(self, args: list[str]) -> str:
        (status,) = self._args(args, 1, "final_status_list alive|dead|seki")
        status = status.lower()
        if status not in ("alive", "dead", "seki"):
            raise GtpError(f"syntax error: status must be alive, dead or seki (got {status!r})")
        dead = set(self._dead_stones())
        lines = []
        for _, group in self.game.groups():
            is_dead = group[0] in dead
            # Random playouts cannot tell a seki from a group that lives, so no group is seki.
            if (status == "dead") == is_dead and status != "seki":
                lines.append(self._vertices(group))
        return "\n".join(lines)

    def cmd_loadsgf(self, args: list[str]) -> str:
        if len(args) not in (1, 2):
            raise GtpError("syntax error: usage: loadsgf filename [move_number]")
        upto = None
        if len(args) == 2:
            # GTP: the position before move `move_number` is played.
            upto = max(self._int(args[1], "move number") - 1, 0)
        try:
            record = read_sgf(args[0])
            game = replay(record, self.game.rules.with_komi(record.komi), upto=upto)
        except SgfError as e:
            raise GtpError(f"cannot load file: {e}") from None
        self.game = game
        return ""

    def cmd_printsgf(self, args: list[str]) -> str:
        record = record_from_game(self.game, black=None, white=None)
        return write_sgf(record).decode("utf-8").replace("\n", "")

    def cmd_list_stones(self, args: list[str]) -> str:
        (color_text,) = self._args(args, 1, "list_stones color")
        return self._vertices(self.game.stones(parse_color(color_text)))

    def cmd_is_legal(self, args: list[str]) -> str:
        color_text, vertex_text = self._args(args, 2, "is_legal color vertex")
        color = parse_color(color_text)
        try:
            move = parse_vertex(vertex_text, self.game.size)
        except GtpError as e:
            if str(e).startswith("illegal move"):
                return "0"
            raise
        return "1" if self.game.is_legal(color, move) else "0"

    def cmd_all_legal(self, args: list[str]) -> str:
        (color_text,) = self._args(args, 1, "all_legal color")
        return self._vertices(self.game.legal_moves(parse_color(color_text)))

    def cmd_captures(self, args: list[str]) -> str:
        (color_text,) = self._args(args, 1, "captures color")
        return str(self.game.captures[parse_color(color_text)])

    def cmd_set_random_seed(self, args: list[str]) -> str:
        (text,) = self._args(args, 1, "set_random_seed seed")
        self.seed = self._int(text, "seed") % (1 << 63)
        self.player.set_seed(self.seed)
        return ""

    def cmd_kata_set_rules(self, args: list[str]) -> str:
        if not args:
            raise GtpError("syntax error: usage: kata-set-rules rules")
        try:
            rules = parse_rules(" ".join(args), komi=self.game.komi)
        except RulesError as e:
            raise GtpError(str(e)) from None
        try:
            self.game.set_rules(rules)
        except IllegalMoveError as e:
            raise GtpError(f"the game so far is illegal under {rules.name}: {e}") from None
        return ""


def board_diagram(game: Game) -> str:
    """The board as text: X black, O white, the last move in parentheses, coordinates around,
    then side to move, captures, rules and komi (GTP's showboard, GNU Go style)."""
    n = game.size
    board = game.board()
    last = game.moves[-1][1] if game.moves else None
    header = "   " + " ".join(COLUMNS[:n])
    rows = [header]
    for y in range(n):
        row = ""
        for x in range(n + 1):
            if last == (x, y):
                row += "("
            elif last == (x - 1, y):
                row += ")"
            else:
                row += " "
            if x < n:
                row += ".XO"[board[y, x]]
        rows.append(f"{n - y:2d}{row}{n - y:2d}")
    rows.append(header)
    rows.append(
        f"{format_color(game.to_move)} to move, move {len(game.moves)}, "
        f"captures B {game.captures[BLACK]} W {game.captures[WHITE]}, "
        f"rules {game.rules.name}, komi {game.komi:g}"
    )
    return "\n".join(rows)


def free_handicap_points(size: int, stones: int) -> list[Point]:
    """Handicap points for place_free_handicap: the fixed layout as far as it goes, then, one
    at a time, the point farthest from every stone so far (off the first lines where possible).
    """
    fixed = max_fixed_handicap(size)
    points = fixed_handicap_points(size, min(stones, fixed)) if fixed >= 2 else []
    margin = 2 if size >= 9 else (1 if size >= 5 else 0)
    inner = [(x, y) for y in range(margin, size - margin) for x in range(margin, size - margin)]
    everywhere = [(x, y) for y in range(size) for x in range(size)]
    while len(points) < stones:
        candidates = [p for p in inner if p not in points] or [
            p for p in everywhere if p not in points
        ]

        def spread(p: Point) -> tuple[int, int, int]:
            nearest = min((abs(p[0] - q[0]) + abs(p[1] - q[1]) for q in points), default=0)
            return nearest, -p[1], -p[0]

        points.append(max(candidates, key=spread))
    return points
