"""A GTP v2 engine (`tengen gtp`): the required commands, the tournament subset, GNU Go's and
KataGo's extensions that GUIs and referees use, over any Player.

Protocol rules (GTP v2, section 3): control characters other than HT and LF are dropped, `#`
starts a comment, HT is a space, blank lines are ignored, an optional numeric id is echoed. A
command that fails answers `?` and leaves the game exactly as it was; the engine never exits on
bad input, only on `quit` or the end of its input.

With a player that searches (play.netplayer.NetPlayer) the engine also keeps the clock
(`time_settings`, `kgs-time_settings`, `time_left`: each move gets a share of the time left)
and speaks KataGo's and Leela Zero's analysis extensions (`lz-analyze`, `kata-analyze`, their
`genmove_analyze` forms, `kata-raw-nn`) in the formats of KataGo's docs/GTP_Extensions.md:
`lz-analyze` and `kata-analyze` stream an `info` line every interval until the next command
(or a blank line) arrives.
"""

from __future__ import annotations

import dataclasses
import math
import queue
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import TextIO

import numpy as np

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


# Seconds kept back from every move's share of the clock for the controller's and the pipes'
# lag, and the share of a byo-yomi period a move may use.
TIME_LAG = 0.25
PERIOD_SHARE = 0.8


@dataclasses.dataclass
class Stream:
    """A response that goes on after its first line: `lines()` yields text to write (None:
    nothing now, a chance to stop); `until_input` ends it when the next command arrives."""

    head: str
    lines: Callable[[Callable[[], bool]], Iterator[str | None]]
    until_input: bool


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
        # (main time, byo-yomi time, stones per period); kind as KGS names it.
        self.time_settings: tuple[float, float, int] | None = None
        self.time_kind = "canadian"
        self.time_left: dict[int, tuple[float, int]] = {}
        self.seed = 0
        self.done = False
        self.log = log
        self._dead_cache: tuple[tuple, dict[str, list[list[Point]]]] | None = None
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
            "kgs-time_settings": self.cmd_kgs_time_settings,
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
        if hasattr(player, "search"):
            self.commands.update(
                {
                    "lz-analyze": lambda a: self._analyze(a, kata=False),
                    "kata-analyze": lambda a: self._analyze(a, kata=True),
                    "lz-genmove_analyze": lambda a: self._genmove_analyze(a, kata=False),
                    "kata-genmove_analyze": lambda a: self._genmove_analyze(a, kata=True),
                    "kata-raw-nn": self.cmd_kata_raw_nn,
                }
            )

    # -- the protocol -------------------------------------------------------------------------

    def handle(self, raw_line: str) -> str | None:
        """The full response (ending in a blank line) to one input line; None for blank lines.
        A streaming response is run here whole: an analysis to its first line, a
        genmove_analyze to its move."""
        response = self.respond(raw_line)
        if isinstance(response, Stream):
            # No next command can arrive here: an open-ended analysis ends after its first
            # line (its first interval), a genmove_analyze when its move is chosen.
            lines = []
            for line in response.lines(lambda: response.until_input and bool(lines)):
                if line:
                    lines.append(line)
            return f"{response.head}\n{''.join(lines)}\n"
        return response

    def respond(self, raw_line: str) -> str | Stream | None:
        """The response to one input line: its text, a Stream, or None for blank lines."""
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
        if isinstance(result, Stream):
            result.head = f"={cmd_id}"
            return result
        # A response ends at its first blank line, so a result must not contain one.
        result = re.sub(r"\n\s*\n", "\n", result.rstrip("\n"))
        return f"={cmd_id} {result}\n\n"

    def serve(self, inp: TextIO = sys.stdin, out: TextIO = sys.stdout) -> None:
        """Answer each line of `inp` on `out`. Input is read on a thread of its own, so a
        streaming analysis sees the next command arrive and ends before it is answered."""
        lines: queue.Queue[str | None] = queue.Queue()
        waiting: list[str | None] = []  # a line taken off the queue to end a stream

        def read() -> None:
            for raw in inp:
                lines.put(raw)
            lines.put(None)

        def arrived() -> bool:
            return bool(waiting) or not lines.empty()

        threading.Thread(target=read, daemon=True).start()
        while not self.done:
            raw_line = waiting.pop() if waiting else lines.get()
            if raw_line is None:
                break
            response = self.respond(raw_line)
            if response is None:
                continue
            if not isinstance(response, Stream):
                out.write(response)
                out.flush()
                continue
            out.write(response.head + "\n")
            out.flush()
            stop = arrived if response.until_input else (lambda: False)
            try:
                for text in response.lines(stop):
                    if text:
                        out.write(text)
                        out.flush()
                    if stop():
                        break
            except Exception:  # the stream ends, the engine goes on answering
                if self.log is not None:
                    traceback.print_exc(file=self.log)
            if response.until_input and not arrived():
                # The search stopped on its own (its visit cap): the response still ends only
                # when the next line arrives, which is then answered as usual.
                waiting.append(lines.get())
            out.write("\n")
            out.flush()

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

    def _final_status(self) -> dict[str, list[list[Point]]]:
        """Every group's status (dead, alive, seki), computed once per position (final_score
        and a referee's three final_status_list calls then agree with each other): from the
        player's own judgement (a net's ownership head) where it has one, else from random
        playouts, which cannot tell a seki from a group that lives (no group is seki)."""
        game = self.game
        key = (game.hash, len(game.moves), game.size, game.rules, self.seed)
        if self._dead_cache is None or self._dead_cache[0] != key:
            status = None
            if hasattr(self.player, "final_status"):
                status = self.player.final_status(game)  # None: the net has no ownership
            if status is None:
                estimate = game.estimate_dead(playouts=self.dead_stone_playouts, seed=self.seed)
                dead = set(estimate.dead)
                status = {"dead": [], "alive": [], "seki": []}
                for _, group in game.groups():
                    status["dead" if group[0] in dead else "alive"].append(group)
            self._dead_cache = (key, status)
        return self._dead_cache[1]

    def _dead_stones(self) -> list[Point]:
        return [p for group in self._final_status()["dead"] for p in group]

    def _seki_stones(self) -> list[Point]:
        return [p for group in self._final_status()["seki"] for p in group]

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
        started = time.monotonic()
        move = self.player.genmove(
            self.game, color, cleanup=cleanup, seconds=self.move_seconds(color)
        )
        return self._decided(color, move, play=play, thought=time.monotonic() - started)

    def _decided(self, color: int, move: Move | str, *, play: bool, thought: float) -> str:
        """The answer to a genmove: the move played (if asked) and the clock charged."""
        self._spend(color, thought)
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

    # -- the clock ----------------------------------------------------------------------------

    def move_seconds(self, color: int) -> float | None:
        """This move's share of `color`'s clock (None: no time limit). In a byo-yomi period,
        the period's time over its stones (KGS's Japanese byo-yomi: a share of the period);
        in main time, the time left over the moves the game still has for this side, and
        never more than the time left less TIME_LAG."""
        if self.time_settings is None:
            return None
        main, byo, stones = self.time_settings
        if main <= 0 and byo <= 0 and self.time_kind != "absolute":
            return None
        if byo > 0 and stones == 0 and self.time_kind == "canadian":
            return None  # GTP: byo-yomi time with no stones means no time limit
        left, stones_left = self.time_left.get(color, (main if main > 0 else byo, 0))
        if main <= 0 and color not in self.time_left:
            stones_left = stones
        if stones_left > 0:
            if self.time_kind == "byoyomi":
                share = PERIOD_SHARE * left  # each move has the whole period
            else:
                share = PERIOD_SHARE * left / stones_left
        else:
            area = self.game.size * self.game.size
            moves_left = max(0.5 * area - 0.5 * len(self.game.moves), 0.15 * area, 1.0)
            share = left / moves_left
            if byo > 0 and left < byo:
                # Main time is nearly out and byo-yomi follows: play as if already in it.
                per = byo if self.time_kind == "byoyomi" else byo / max(stones, 1)
                share = max(share, PERIOD_SHARE * min(per, left + byo))
        return max(0.0, min(share, left + (byo if stones_left == 0 else 0.0) - TIME_LAG))

    def _spend(self, color: int, seconds: float) -> None:
        """Without the controller's time_left, keep the clock ourselves (main time only)."""
        if self.time_settings is None or color not in self.time_left:
            return
        left, stones = self.time_left[color]
        self.time_left[color] = (max(left - seconds, 0.0), stones)

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

    def _seconds(self, text: str, what: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise GtpError(f"syntax error: {what} must be a number (got {text!r})") from None
        if not math.isfinite(value) or value < 0:
            raise GtpError(f"syntax error: {what} must be >= 0 (got {text!r})")
        return value

    def _stones(self, text: str, what: str) -> int:
        value = self._int(text, what)
        if value < 0:
            raise GtpError(f"syntax error: {what} must be >= 0 (got {text!r})")
        return value

    def cmd_time_settings(self, args: list[str]) -> str:
        main, byo, stones = self._args(args, 3, "time_settings main_time byo_yomi_time stones")
        self.time_settings = (
            self._seconds(main, "main time"),
            self._seconds(byo, "byo-yomi time"),
            self._stones(stones, "byo-yomi stones"),
        )
        self.time_kind = "canadian"
        self.time_left = {}
        return ""

    def cmd_kgs_time_settings(self, args: list[str]) -> str:
        usage = (
            "kgs-time_settings none | absolute main | canadian main byo stones"
            " | byoyomi main byo periods"
        )
        if not args:
            raise GtpError(f"syntax error: usage: {usage}")
        kind, rest = args[0].lower(), args[1:]
        if kind == "none" and not rest:
            self.time_settings = None
        elif kind == "absolute" and len(rest) == 1:
            self.time_settings = (self._seconds(rest[0], "main time"), 0.0, 0)
        elif kind in ("canadian", "byoyomi") and len(rest) == 3:
            self.time_settings = (
                self._seconds(rest[0], "main time"),
                self._seconds(rest[1], "byo-yomi time"),
                self._stones(rest[2], "byo-yomi stones" if kind == "canadian" else "periods"),
            )
        else:
            raise GtpError(f"syntax error: usage: {usage}")
        self.time_kind = kind
        self.time_left = {}
        return ""

    def cmd_time_left(self, args: list[str]) -> str:
        color_text, time_text, stones = self._args(args, 3, "time_left color time stones")
        color = parse_color(color_text)
        self.time_left[color] = (self._seconds(time_text, "time"), self._stones(stones, "stones"))
        return ""

    def cmd_final_score(self, args: list[str]) -> str:
        return format_score(self.game.score(dead=self._dead_stones(), seki=self._seki_stones()))

    def cmd_final_status_list(self, args: list[str]) -> str:
        (status,) = self._args(args, 1, "final_status_list alive|dead|seki")
        status = status.lower()
        if status not in ("alive", "dead", "seki"):
            raise GtpError(f"syntax error: status must be alive, dead or seki (got {status!r})")
        return "\n".join(self._vertices(group) for group in self._final_status()[status])

    def cmd_loadsgf(self, args: list[str]) -> str:
        if len(args) not in (1, 2):
            raise GtpError("syntax error: usage: loadsgf filename [move_number]")
        upto = None
        if len(args) == 2:
            # GTP: the position before move `move_number` is played.
            number = self._int(args[1], "move number")
            if number < 1:
                raise GtpError(f"syntax error: move number must be >= 1 (got {number})")
            upto = number - 1
        try:
            record = read_sgf(args[0])
            if upto is not None and upto > len(record.moves):
                raise SgfError(f"{args[0]}: no move {upto + 1}: the game has {len(record.moves)}")
            # A file without KM[] leaves the komi as it was (komi, kgs-rules or the default).
            if not record.komi_given:
                record.komi = self.game.rules.komi
            game = replay(record, self.game.rules, upto=upto)
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

    # -- analysis (KataGo's docs/GTP_Extensions.md) -------------------------------------------

    def _analysis_args(self, args: list[str], *, kata: bool) -> dict:
        """[player] [interval] then key-value pairs: interval, minmoves, maxmoves and, for
        kata-analyze, ownership."""
        out = {"color": self.game.to_move, "interval": 0.0, "minmoves": 0, "maxmoves": 10**6,
               "ownership": False}  # fmt: skip
        rest = list(args)
        if rest and rest[0].lower() in ("b", "w", "black", "white"):
            out["color"] = parse_color(rest.pop(0))
        if rest and rest[0].isdigit():
            out["interval"] = int(rest.pop(0)) / 100
        if len(rest) % 2:
            raise GtpError(f"syntax error: {rest[-1]!r} has no value")
        for key, value in zip(rest[::2], rest[1::2], strict=True):
            if key == "interval":
                out["interval"] = self._stones(value, "interval") / 100
            elif key in ("minmoves", "maxmoves"):
                out[key] = self._stones(value, key)
            elif key == "ownership" and kata:
                if value.lower() not in ("true", "false"):
                    raise GtpError(f"syntax error: ownership must be true or false (got {value!r})")
                out["ownership"] = value.lower() == "true"
            elif key in ("allow", "avoid"):
                raise GtpError(f"{key} is not supported")
            else:
                raise GtpError(f"syntax error: unknown key {key!r}")
        return out

    def _info_line(self, result, opts: dict, *, kata: bool) -> str:
        n = self.game.size
        moves = [m for m in result.moves if m.visits > 0]
        if len(moves) < opts["minmoves"]:
            moves += [m for m in result.moves if m.visits == 0][: opts["minmoves"] - len(moves)]
        moves = moves[: opts["maxmoves"]]
        parts = []
        for order, m in enumerate(moves):
            visited = m.visits > 0
            winrate = m.winrate if visited else result.winrate
            lead = m.score_lead if visited else result.score_lead
            utility = m.utility if visited else 2 * result.winrate - 1
            lcb = m.lcb()
            pv = " ".join(format_vertex(p, n) for p in m.pv)
            if kata:
                parts.append(
                    f"info move {format_vertex(m.move, n)} visits {m.visits} "
                    f"utility {utility:.6g} winrate {winrate:.6g} scoreMean {lead:.6g} "
                    f"scoreStdev {result.score_stdev:.6g} scoreLead {lead:.6g} "
                    f"scoreSelfplay {lead:.6g} prior {m.prior:.6g} lcb {lcb:.6g} "
                    f"utilityLcb {utility - 2 * (winrate - lcb):.6g} order {order} pv {pv}"
                )
            else:
                parts.append(
                    f"info move {format_vertex(m.move, n)} visits {m.visits} "
                    f"winrate {_x10000(winrate)} prior {_x10000(m.prior)} lcb {_x10000(lcb)} "
                    f"order {order} pv {pv}"
                )
        if not parts:
            return ""  # nothing searched yet below the root
        line = " ".join(parts)
        if kata and opts["ownership"] and result.ownership is not None:
            side = 1.0 if result.to_move == BLACK else -1.0
            values = " ".join(f"{side * v:.6g}" for v in result.ownership.reshape(-1))
            line += f" ownership {values}"
        return line.strip() + "\n"

    def _analyze(self, args: list[str], *, kata: bool) -> Stream:
        opts = self._analysis_args(args, kata=kata)
        player, game = self.player, self.game.copy()

        def lines(stop: Callable[[], bool]) -> Iterator[str | None]:
            interval = opts["interval"] or None
            last = None
            for result in player.search(
                game, opts["color"], visits=player.visit_cap(game.size, 10**9),
                interval=interval if interval else 0.05, ownership=opts["ownership"],
                should_stop=stop,
            ):  # fmt: skip
                last = result
                if interval and result.visits:
                    yield self._info_line(result, opts, kata=kata)
                else:
                    yield None
            if last is not None and not interval and last.visits:
                yield self._info_line(last, opts, kata=kata)

        return Stream("=", lines, until_input=True)

    def _genmove_analyze(self, args: list[str], *, kata: bool) -> Stream:
        opts = self._analysis_args(args, kata=kata)
        color = opts["color"]

        def lines(stop: Callable[[], bool]) -> Iterator[str | None]:
            # Answered whole, like genmove: the next command waits for the move.
            started = time.monotonic()
            thinking = self.player.think(
                self.game, color, seconds=self.move_seconds(color),
                interval=opts["interval"] or None,
            )  # fmt: skip
            while True:
                try:
                    result = next(thinking)
                except StopIteration as done:
                    move = done.value
                    break
                if result.visits:
                    yield self._info_line(result, opts, kata=kata)
            answer = self._decided(color, move, play=True, thought=time.monotonic() - started)
            yield f"play {answer}\n"

        return Stream("=", lines, until_input=False)

    def cmd_kata_raw_nn(self, args: list[str]) -> str:
        (text,) = self._args(args, 1, "kata-raw-nn symmetry|all")
        if text == "all":
            symmetries = range(8)
        elif text.isdigit() and int(text) < 8:
            symmetries = [int(text)]
        else:
            raise GtpError(f"syntax error: symmetry must be 0..7 or all (got {text!r})")
        out = []
        for s in symmetries:
            raw = self.player.raw(self.game, symmetry=s)
            white = raw["to_move"] == WHITE
            side = -1.0 if white else 1.0  # from the player to move to Black
            white_lead = -side * raw["score_lead"]
            out += [
                f"symmetry {s}",
                f"whiteWin {raw['win'] if white else raw['loss']:.6g}",
                f"whiteLoss {raw['loss'] if white else raw['win']:.6g}",
                f"noResult {raw['no_result']:.6g}",
                f"whiteLead {white_lead:.6g}",
                f"whiteScoreSelfplay {white_lead:.6g}",
                f"whiteScoreSelfplaySq {white_lead**2 + raw['score_stdev'] ** 2:.6g}",
                "policy",
                *(" ".join(_float(v) for v in row) for row in raw["policy"]),
                f"policyPass {raw['pass']:.6g}",
                "whiteOwnership",
                *(" ".join(f"{-side * v:.6g}" for v in row) for row in raw["ownership"]),
            ]
        return "\n".join(out)


def _x10000(value: float) -> int:
    """Leela Zero's fields: 10000 times a probability, an integer in [0, 10000]."""
    return int(min(max(round(10000 * value), 0), 10000)) if math.isfinite(value) else 0


def _float(value: float) -> str:
    return "NAN" if np.isnan(value) else f"{value:.6g}"


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
