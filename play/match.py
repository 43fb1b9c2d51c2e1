"""Matches between GTP engines (`tengen match`): alternating colours, our own rules engine as
the arbiter, scoring with agreed dead stones or a referee, one SGF per game and a JSON summary.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import queue
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gocore.atomic import write_text
from gocore.board import BLACK, WHITE
from gocore.rules import Rules, fixed_handicap_points
from play.game import Game, IllegalMoveError, Point
from play.gtp import GtpError, format_score, format_vertex, parse_vertex
from play.programs import find_program, install_hint
from play.sgf import record_from_game, save_sgf


class EngineFailure(RuntimeError):
    """An engine that died, hung past its timeout, or broke the protocol."""


class EngineStartError(EngineFailure):
    """An engine whose command line does not start a program (not installed, a typo)."""


class GtpCommandError(RuntimeError):
    """An engine answered `?` to a command."""


# Seconds an engine may take before its first answer (`name`): tengen's own compiles numba's
# kernels then on a fresh install.
START_TIMEOUT = 300.0


class GtpClient:
    """A GTP engine in a subprocess, one command at a time, each with a timeout; its first
    command (`name`) waits up to `start_timeout`: an engine may load or compile before it
    answers (tengen's compiles numba's kernels on a fresh install, KataGo tunes OpenCL)."""

    def __init__(
        self,
        command: str,
        *,
        label: str,
        timeout: float = 60.0,
        log_dir: Path | None = None,
        start_timeout: float = START_TIMEOUT,
    ):
        self.command = command
        self.label = label
        self.timeout = timeout
        self.start_timeout = max(start_timeout, timeout)
        self._known: dict[str, bool] = {}
        try:
            argv = find_program(command)
        except ValueError as e:  # shlex: an unclosed quote
            raise EngineStartError(f"engine {label}: cannot read {command!r}: {e}") from None
        if not argv:
            raise EngineStartError(f"engine {label}: empty command line")
        stderr: Any = subprocess.DEVNULL
        self.stderr_path = None if log_dir is None else log_dir / f"{label}.stderr.log"
        if self.stderr_path is not None:
            self.stderr_path.parent.mkdir(parents=True, exist_ok=True)
            stderr = open(self.stderr_path, "ab")  # noqa: SIM115 (lives with the process)
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                encoding="utf-8",
                errors="replace",
                bufsize=1,
            )
        except OSError as e:
            raise EngineStartError(
                f"engine {label}: cannot start {command!r}: {e.strerror}{install_hint(argv[0])}"
            ) from None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.name = self._describe()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\r\n"))
        self._lines.put(None)

    def _describe(self) -> str:
        try:
            name = self.send("name", timeout=self.start_timeout)
        except GtpCommandError:
            return self.label
        except EngineFailure as e:
            # It never answered: a program that is not a GTP engine, or one that exits on its
            # arguments (its stderr says why).
            log = f"; its stderr: {self.stderr_path}" if self.stderr_path is not None else ""
            self.close()
            raise EngineStartError(f"{e}, its first command{log}") from None
        try:
            version = self.send("version")
        except GtpCommandError:
            version = ""
        return f"{name} {version}".strip()

    def send(self, command: str, *, timeout: float | None = None) -> str:
        """The engine's answer to one command; raises GtpCommandError on `?`."""
        ok, text = self.send_many([command], timeout=timeout)[0]
        if not ok:
            raise GtpCommandError(f"engine {self.label}: {command!r} failed: {text}")
        return text

    def send_many(
        self, commands: list[str], *, timeout: float | None = None
    ) -> list[tuple[bool, str]]:
        """Write all commands at once, then read the answers in order: (succeeded, text).

        GTP answers in order, so a long script costs one round trip instead of one per command.
        """
        if self.proc.poll() is not None:
            raise EngineFailure(f"engine {self.label} has exited (status {self.proc.returncode})")
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write("".join(c + "\n" for c in commands))
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise EngineFailure(f"engine {self.label} closed its input") from None
        wait = self.timeout if timeout is None else timeout
        return [self._response(command, wait) for command in commands]

    def _response(self, command: str, timeout: float) -> tuple[bool, str]:
        deadline = time.monotonic() + timeout
        lines: list[str] = []
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:
                raise EngineFailure(
                    f"engine {self.label} did not answer {command!r} within {timeout:g} s"
                ) from None
            if line is None:
                raise EngineFailure(f"engine {self.label} exited while answering {command!r}")
            if not lines and not line.strip():
                continue  # stray blank lines between responses
            if not lines and line[:1] not in ("=", "?"):
                raise EngineFailure(f"engine {self.label} answered {command!r} with {line!r}")
            if lines and not line.strip():
                break
            lines.append(line)
        head = lines[0]
        # Drop the status character and any numeric id.
        body = head[1:].lstrip("0123456789")
        text = "\n".join([body.strip(), *lines[1:]]).strip()
        return head.startswith("="), text

    def known(self, command: str) -> bool:
        if command not in self._known:
            try:
                self._known[command] = self.send(f"known_command {command}").lower() == "true"
            except GtpCommandError:
                self._known[command] = False
        return self._known[command]

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(EngineFailure, GtpCommandError):
                self.send("quit")
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclasses.dataclass(frozen=True)
class MatchConfig:
    games: int = 2
    size: int = 9
    rules: Rules = dataclasses.field(default_factory=lambda: Rules(ko="simple", suicide=False))
    handicap: int = 0
    a_black: bool = False  # engine A takes Black in every game (a handicap rung), not in odd ones
    max_moves: int | None = None  # default: 3 * size * size
    timeout: float = 60.0  # seconds per engine command
    referee: str | None = None  # a GTP command line to settle dead stones

    def move_limit(self) -> int:
        return self.max_moves if self.max_moves is not None else 3 * self.size * self.size


@dataclasses.dataclass
class GameResult:
    number: int
    black: str  # "A" or "B"
    white: str
    winner: str | None  # "A", "B", or None for a draw or a void game
    result: str  # SGF RE: "B+3.5", "W+R", "0" (draw), "Void"
    reason: str  # score, resign, illegal move, engine failure, move limit, disagreement
    moves: int
    score: float | None = None  # from Black's side
    scoring: str | None = None  # how dead stones were settled
    detail: str = ""
    sgf: str = ""


def _letter(color: int) -> str:
    return "B" if color == BLACK else "W"


def _name(color: int) -> str:
    return "black" if color == BLACK else "white"


def wilson_interval(successes: float, trials: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% by default)."""
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


class Match:
    """Runs the games; engine A takes Black in odd-numbered games (1, 3, ...), or in every game
    with `config.a_black`."""

    def __init__(
        self,
        engine_a: str,
        engine_b: str,
        config: MatchConfig,
        out_dir: Path,
        *,
        progress: Callable[[GameResult, dict], None] | None = None,
    ):
        self.commands = {"A": engine_a, "B": engine_b}
        self.config = config
        self.out_dir = Path(out_dir)
        self.progress = progress
        self.clients: dict[str, GtpClient | None] = {"A": None, "B": None}
        self.referee: GtpClient | None = None
        self.results: list[GameResult] = []

    # -- engines ------------------------------------------------------------------------------

    def _client(self, label: str) -> GtpClient:
        client = self.clients[label]
        if client is None or client.proc.poll() is not None:
            client = GtpClient(
                self.commands[label],
                label=label,
                timeout=self.config.timeout,
                log_dir=self.out_dir / "logs",
            )
            self.clients[label] = client
        return client

    def start(self) -> None:
        """Start both engines and the referee; EngineStartError if a command line starts no
        program, before any game is played (a forfeit of every game would read as a result)."""
        for label in ("A", "B"):
            try:
                self._client(label)
            except EngineStartError:
                raise
            except EngineFailure:
                pass  # it started and then failed: it forfeits its games, one by one
        if self.config.referee:
            self._referee()

    def _referee(self) -> GtpClient:
        """The referee's engine, (re)started when it is not running."""
        if self.referee is None or self.referee.proc.poll() is not None:
            self.referee = GtpClient(
                self.config.referee,
                label="referee",
                timeout=self.config.timeout,
                log_dir=self.out_dir / "logs",
            )
        return self.referee

    def close(self) -> None:
        for client in [*self.clients.values(), self.referee]:
            if client is not None:
                client.close()

    # -- one game -----------------------------------------------------------------------------

    def _setup_engine(self, client: GtpClient, handicap: list[Point]) -> None:
        cfg = self.config
        client.send(f"boardsize {cfg.size}")
        client.send("clear_board")
        client.send(f"komi {cfg.rules.komi:g}")
        if client.known("kata-set-rules"):
            # KataGo knows the preset names but not "simple"; its shorthand covers any rules.
            name = cfg.rules.name
            client.send(f"kata-set-rules {cfg.rules.shorthand() if name == 'simple' else name}")
        if handicap:
            client.send(
                "set_free_handicap " + " ".join(format_vertex(p, cfg.size) for p in handicap)
            )

    def play_game(self, number: int) -> GameResult:
        cfg = self.config
        black, white = ("A", "B") if number % 2 == 1 or cfg.a_black else ("B", "A")
        side = {BLACK: black, WHITE: white}
        game = Game(cfg.size, cfg.rules, max_moves=cfg.move_limit() + 2)
        handicap = fixed_handicap_points(cfg.size, cfg.handicap) if cfg.handicap >= 2 else []
        if handicap:
            game.add_setup_stones(BLACK, handicap)
            game.set_to_move(WHITE)

        def finish(winner_color: int | None, result: str, reason: str, **kw) -> GameResult:
            winner = side[winner_color] if winner_color is not None else None
            return GameResult(number, black, white, winner, result, reason, len(game.moves), **kw)

        # The engines of this game, (re)started before it; one that dies during the game is
        # not restarted behind the arbiter's back: its next command fails and it forfeits.
        engines: dict[int, GtpClient] = {}
        for color in (BLACK, WHITE):
            try:
                engines[color] = self._client(side[color])
                self._setup_engine(engines[color], handicap)
            except (EngineFailure, GtpCommandError) as e:
                failure = finish(
                    3 - color, f"{_letter(3 - color)}+F", "engine failure", detail=str(e)
                )
                return self._record(game, failure)

        while True:
            if len(game.moves) >= cfg.move_limit():
                result = self._score(game, finish, reason="move limit")
                break
            color = game.to_move
            mover, other = engines[color], engines[3 - color]
            winner_if_fault = 3 - color
            forfeit = f"{_letter(winner_if_fault)}+F"
            try:
                reply = mover.send(f"genmove {_name(color)}")
            except (EngineFailure, GtpCommandError) as e:
                result = finish(winner_if_fault, forfeit, "engine failure", detail=str(e))
                break
            if reply.strip().lower() == "resign":
                result = finish(winner_if_fault, f"{_letter(winner_if_fault)}+R", "resign")
                break
            try:
                move = parse_vertex(reply.strip(), cfg.size)
                game.play(color, move)
            except (GtpError, IllegalMoveError) as e:
                result = finish(winner_if_fault, forfeit, "illegal move", detail=f"{reply!r}: {e}")
                break
            try:
                other.send(f"play {_name(color)} {format_vertex(move, cfg.size)}")
            except GtpCommandError as e:
                # The two engines disagree on the rules; neither can be blamed for it.
                result = finish(None, "Void", "disagreement", detail=str(e))
                break
            except EngineFailure as e:
                result = finish(color, f"{_letter(color)}+F", "engine failure", detail=str(e))
                break
            if game.is_over:
                result = self._score(game, finish, reason="score")
                break
        return self._record(game, result)

    def _dead_stones(self, game: Game) -> tuple[list[Point], str]:
        """Dead stones agreed by both engines, else the referee's, else none (Tromp-Taylor)."""
        cfg = self.config
        lists = []
        for label in ("A", "B"):
            client = self.clients[label]
            try:
                if client is None or not client.known("final_status_list"):
                    break
                lists.append(_parse_points(client.send("final_status_list dead"), cfg.size))
            except (EngineFailure, GtpCommandError, GtpError):
                break
        if len(lists) == 2 and set(lists[0]) == set(lists[1]):
            return lists[0], "dead stones agreed by both engines"
        if cfg.referee:
            try:
                ref = self._referee()
                self._setup_engine(ref, [p for c, p in game.setup if c == BLACK])
                moves = [f"play {_name(c)} {format_vertex(m, cfg.size)}" for c, m in game.moves]
                for command, (ok, text) in zip(moves, ref.send_many(moves), strict=True):
                    if not ok:
                        raise GtpCommandError(f"{command!r} failed: {text}")
                dead = _parse_points(ref.send("final_status_list dead"), cfg.size)
                return dead, f"dead stones from the referee ({ref.name})"
            except (EngineFailure, GtpCommandError, GtpError) as e:
                return [], f"Tromp-Taylor (no dead stones): the referee failed: {e}"
        why = (
            "the engines disagree on dead stones"
            if len(lists) == 2
            else "an engine cannot list dead stones"
        )
        return [], f"Tromp-Taylor (no dead stones): {why} and there is no referee"

    def _score(self, game: Game, finish, *, reason: str) -> GameResult:
        dead, how = self._dead_stones(game)
        score = game.score(dead=dead)
        winner = BLACK if score > 0 else WHITE if score < 0 else None
        return finish(winner, format_score(score), reason, score=score, scoring=how)

    def _record(self, game: Game, result: GameResult) -> GameResult:
        names = {label: (c.name if c is not None else label) for label, c in self.clients.items()}
        comment = f"{result.reason}" + (f": {result.detail}" if result.detail else "")
        if result.scoring:
            comment += f"; {result.scoring}"
        record = record_from_game(
            game,
            result=result.result,
            black=f"{names[result.black]} ({result.black})",
            white=f"{names[result.white]} ({result.white})",
            root_comment=comment,
        )
        path = save_sgf(record, self.out_dir / "games" / f"game-{result.number:04d}.sgf")
        result.sgf = str(path.relative_to(self.out_dir))
        return result

    # -- the match ----------------------------------------------------------------------------

    def run(self) -> dict:
        try:
            self.start()
            for number in range(1, self.config.games + 1):
                result = self.play_game(number)
                self.results.append(result)
                summary = self.summary()
                _write_json(self.out_dir / "summary.json", summary)
                if self.progress is not None:
                    self.progress(result, summary)
        finally:
            self.close()
        return self.summary()

    def summary(self) -> dict:
        wins = {"A": 0, "B": 0}
        as_black = {"A": 0, "B": 0}
        draws = void = 0
        for r in self.results:
            if r.winner is not None:
                wins[r.winner] += 1
                if r.winner == r.black:
                    as_black[r.winner] += 1
            elif r.result == "Void":
                void += 1
            else:
                draws += 1
        decided = wins["A"] + wins["B"] + draws
        a_points = wins["A"] + 0.5 * draws
        low, high = wilson_interval(a_points, decided)
        names = {label: (c.name if c is not None else None) for label, c in self.clients.items()}
        cfg = self.config
        return {
            "engines": {
                label: {"command": self.commands[label], "name": names[label]}
                for label in ("A", "B")
            },
            "config": {
                "games": cfg.games,
                "size": cfg.size,
                "komi": cfg.rules.komi,
                "rules": cfg.rules.name,
                "handicap": cfg.handicap,
                "a_black": cfg.a_black,
                "max_moves": cfg.move_limit(),
                "referee": cfg.referee,
            },
            "games_played": len(self.results),
            "wins": wins,
            "wins_as_black": as_black,
            "draws": draws,
            "void": void,
            "a_win_rate": a_points / decided if decided else None,
            "a_win_rate_95ci": [low, high],
            "results": [dataclasses.asdict(r) for r in self.results],
        }


def _parse_points(text: str, size: int) -> list[Point]:
    points = []
    for word in text.split():
        p = parse_vertex(word, size)
        if p is not None:
            points.append(p)
    return points


def _write_json(path: Path, data: dict) -> None:
    write_text(json.dumps(data, indent=2) + "\n", path)
