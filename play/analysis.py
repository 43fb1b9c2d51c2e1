"""KataGo's JSON analysis engine over tengen's nets and search (KataGo's docs/Analysis_Engine.md):
one query a line on stdin, one or more responses a line each on stdout, answered out of order
as searches finish. This is the protocol KaTrain and other review tools speak, and the only
one KaTrain speaks to its engine.

A query names a game (rules, komi, size, setup stones, the moves) and the turns to analyze;
each turn becomes a task, queued by priority (highest first, then by arrival) and searched by
one of the engine's analysis threads, each with its own search sharing the net. Every task
ends with exactly one response whose `isDuringSearch` is false, also when it is terminated or
fails. Bad input gets KataGo's answer, an `error` (with the query's `id` and the `field` where
the query names one), and never stops the engine.

What tengen reports, and what it leaves out because it has nothing behind it (docs/gtp.md
lists them): per move `move`, `order`, `visits`, `winrate`, `scoreLead` (`scoreMean` the same,
as KataGo), `prior`, `utility`, `pv`; at the root `visits`, `winrate`, `scoreLead`,
`scoreStdev` (the net's at the root), `currentPlayer`; `ownership` (the search's average) and
`policy` (the net's, -1 where illegal) on request. Not sent: `lcb`, `utilityLcb`,
`scoreSelfplay`, a move's `scoreStdev`, `pvVisits`, a move's own `ownership`, the hashes.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import json
import math
import threading
from collections.abc import Callable
from typing import Any, TextIO

import numpy as np

from gocore.board import BLACK, WHITE
from gocore.rules import Rules, RulesError, parse_rules
from play.game import Game, IllegalMoveError

# KataGo's rule names (docs/GTP_Extensions.md, kata-set-rules) as tengen's rules. Korean is
# Japanese-like (territory, simple ko); stone_scoring counts stones only, which area scoring
# with no territory differs from only in the eyes: area scoring is the closest tengen has.
KATAGO_RULES = {
    "tromp-taylor": "tromp-taylor",
    "chinese": "chinese",
    "chinese-ogs": "chinese",
    "chinese-kgs": "chinese",
    "japanese": "japanese",
    "korean": "japanese",
    "aga": "aga",
    "bga": "aga",
    "new-zealand": "new-zealand",
    "stone_scoring": "chinese",
}
PERSPECTIVES = ("BLACK", "WHITE", "SIDETOMOVE")
COLUMNS = "ABCDEFGHJKLMNOPQRSTUVWXYZ"
MAX_KOMI = 400.0  # as KataGo 1.18 takes it


class QueryError(Exception):
    """A query KataGo would refuse: its message, and the field it names (if any)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def parse_config(text: str, where: str = "config") -> dict[str, str]:
    """KataGo's config format: `key = value` a line, `#` comments, blank lines. A line that is
    none of these is an error that names it."""
    out = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, eq, value = line.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"{where}:{number}: expected `key = value` (got {raw.strip()!r})")
        out[key.strip()] = value.strip()
    return out


def parse_overrides(text: str) -> dict[str, str]:
    """`-override-config`'s `key=value,key=value`."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"-override-config: expected key=value (got {part!r})")
        out[key.strip()] = value.strip()
    return out


@dataclasses.dataclass(frozen=True)
class Settings:
    """The config keys that mean something to tengen; KataGo's others are accepted and
    ignored (`ignored` lists them)."""

    max_visits: int | None
    max_time: float | None
    perspective: str  # reportAnalysisWinratesAs
    board_sizes: frozenset[int]  # tengenBoardSizes, else the sizes the net was trained on
    ignored: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, config: dict[str, str], trained_sizes) -> Settings:
        def number(key, kind, low):
            if key not in config:
                return None
            try:
                value = kind(config[key])
            except ValueError:
                raise ValueError(f"config {key}: not a number ({config[key]!r})") from None
            if not value >= low or not math.isfinite(value):
                raise ValueError(f"config {key}: must be >= {low} (got {config[key]})")
            return value

        perspective = config.get("reportAnalysisWinratesAs", "BLACK").upper()
        if perspective not in PERSPECTIVES:
            raise ValueError(
                f"config reportAnalysisWinratesAs: one of {', '.join(PERSPECTIVES)} "
                f"(got {config['reportAnalysisWinratesAs']!r})"
            )
        sizes = frozenset(trained_sizes)
        if "tengenBoardSizes" in config:
            try:
                sizes = frozenset(int(s) for s in config["tengenBoardSizes"].split(","))
            except ValueError:
                raise ValueError(
                    f"config tengenBoardSizes: sizes separated by commas (got "
                    f"{config['tengenBoardSizes']!r})"
                ) from None
            if not sizes or not all(2 <= s <= 19 for s in sizes):
                raise ValueError("config tengenBoardSizes: sizes within 2..19")
        known = {"maxVisits", "maxTime", "reportAnalysisWinratesAs", "tengenBoardSizes",
                 "numAnalysisThreads"}  # fmt: skip
        return cls(
            max_visits=number("maxVisits", int, 1),
            max_time=number("maxTime", float, 0.0),
            perspective=perspective,
            board_sizes=sizes,
            ignored=tuple(sorted(set(config) - known)),
        )


def format_move(move, size: int) -> str:
    if move is None:
        return "pass"
    x, y = move
    return f"{COLUMNS[x]}{size - y}"


def parse_move(text: Any, xsize: int, ysize: int, field: str):
    """A location as KataGo takes it: GTP's `C4`, `pass`, or `(x,y)` (0-based, y from the
    top)."""
    if not isinstance(text, str):
        raise QueryError(f"Could not parse board location: {text}", field)
    t = text.strip()
    if t.lower() == "pass":
        return None
    if t.startswith("(") and t.endswith(")"):
        try:
            x, y = (int(v) for v in t[1:-1].split(","))
        except ValueError:
            raise QueryError(f"Could not parse board location: {text}", field) from None
    else:
        letter, digits = t[:1].upper(), t[1:]
        if letter not in COLUMNS or not (digits.isascii() and digits.isdigit()):
            raise QueryError(f"Could not parse board location: {text}", field)
        x, y = COLUMNS.index(letter), ysize - int(digits)
    if not (0 <= x < xsize and 0 <= y < ysize):
        raise QueryError(f"Could not parse board location: {text}", field)
    return x, y


def parse_player(text: Any, field: str) -> int:
    if isinstance(text, str) and text.upper() in ("B", "BLACK"):
        return BLACK
    if isinstance(text, str) and text.upper() in ("W", "WHITE"):
        return WHITE
    raise QueryError(f"Could not parse player: {text}", field)


def parse_query_rules(value: Any, komi: float | None) -> Rules:
    if isinstance(value, dict):
        text = json.dumps(value)
    elif isinstance(value, str):
        text = KATAGO_RULES.get(value.strip().lower(), value)
    else:
        raise QueryError("Expected string or object for rules", "rules")
    try:
        return parse_rules(text, komi=komi)
    except (RulesError, ValueError, TypeError, OverflowError):  # JSON rules of a bad type too
        shown = value if isinstance(value, str) else json.dumps(value)
        raise QueryError(f"Could not parse rules: {shown}", "rules") from None


@dataclasses.dataclass
class Task:
    """One turn of one query, queued by (-priority, arrival)."""

    order: tuple[int, int]
    query: dict
    turn: int
    game: Game
    visits: int
    seconds: float | None
    report_every: float | None
    perspective: str
    terminated: threading.Event = dataclasses.field(default_factory=threading.Event)

    def __lt__(self, other: Task) -> bool:
        return self.order < other.order


class AnalysisEngine:
    """Answers analysis queries (`submit`, a line each) on `out`, a line a response.

    `make_player(i)` gives analysis thread i its search (a NetPlayer; each thread its own, the
    net shared). Responses are written whole, one at a time."""

    def __init__(
        self,
        make_player: Callable[[int], Any],
        settings: Settings,
        *,
        out: TextIO,
        threads: int = 1,
        version: str = "unknown",
        model_name: str = "",
        log: Callable[[str], None] | None = None,
    ):
        if threads < 1:
            raise ValueError(f"analysis threads must be >= 1 (got {threads})")
        self.settings = settings
        self.out = out
        self.version = version
        self.model_name = model_name
        self.log = log or (lambda message: None)
        self._players = [make_player(i) for i in range(threads)]
        self._queue: list[Task] = []
        self._running: list[Task] = []
        self._arrivals = itertools.count()
        self._cond = threading.Condition()
        self._write_lock = threading.Lock()
        self._closing = False
        self._workers = [
            threading.Thread(target=self._work, args=(p,), name=f"analysis-{i}", daemon=True)
            for i, p in enumerate(self._players)
        ]
        for worker in self._workers:
            worker.start()

    # -- input --------------------------------------------------------------------------------

    def submit(self, line: str) -> None:
        """One line of input: a query, an action, or something to answer with an error."""
        line = line.strip()
        if not line:
            return
        try:
            query = json.loads(line)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, and too deep or too long
            self._send({"error": f"{e} - could not parse input line as json request: {line}"})
            return
        if not isinstance(query, dict):
            self._send({"error": "Request line was valid json but was not an object"})
            return
        qid = query.get("id")
        if not isinstance(qid, str):
            self._send({"error": "Request did not specify an id field of string type"})
            return
        try:
            if "action" in query:
                self._action(query)
            else:
                self._enqueue(query)
        except QueryError as e:
            self._send(_error(str(e), qid, e.field))
        except Exception as e:  # noqa: BLE001 - a query we did not foresee: never stop the engine
            self.log(f"tengen analysis: query {qid}: {e!r}")
            self._send(_error(f"Internal error: {e}", qid))

    def _action(self, query: dict) -> None:
        action = query["action"]
        if action == "query_version":
            self._send({**query, "version": self.version, "git_hash": "<omitted>"})
        elif action == "query_models":
            player = self._players[0]
            model = {"name": self.model_name, "internalName": player.model_id,
                     "maxBatchSize": player.leaves_per_game, "usesHumanSLProfile": False,
                     "usingFP16": "false"}  # fmt: skip
            self._send({**query, "models": [model]})
        elif action == "clear_cache":
            for player in self._players:
                player.clear_cache()
            self._send(dict(query))
        elif action == "terminate":
            self._terminate(query)
        elif action == "terminate_all":
            self._terminate(query, every=True)
        else:  # KataGo's words, with no id
            self._send({"error": "'action' field must be 'query_version' or 'query_models' or "
                                 "'clear_cache' or 'terminate' or 'terminate_all'"})  # fmt: skip

    def _terminate(self, query: dict, every: bool = False) -> None:
        target = query.get("terminateId")
        if not every and not isinstance(target, str):
            raise QueryError("Must specify terminateId for terminate action", "terminateId")
        turns = query.get("turnNumbers")
        if turns is not None and (
            not isinstance(turns, list)
            or not all(isinstance(t, int) and not isinstance(t, bool) for t in turns)
        ):
            raise QueryError("turnNumbers must be a list of integers", "turnNumbers")

        def chosen(task: Task) -> bool:
            return (every or task.query["id"] == target) and (turns is None or task.turn in turns)

        with self._cond:
            dropped = [t for t in self._queue if chosen(t)]
            self._queue = [t for t in self._queue if not chosen(t)]
            heapq.heapify(self._queue)
            for task in self._running:
                if chosen(task):
                    task.terminated.set()
        self._send(dict(query))
        for task in dropped:
            self._send({"id": task.query["id"], "isDuringSearch": False, "noResults": True,
                        "turnNumber": task.turn})  # fmt: skip

    def _enqueue(self, query: dict) -> None:
        tasks = self._tasks(query)
        with self._cond:
            for task in tasks:
                heapq.heappush(self._queue, task)
            self._cond.notify_all()

    def _tasks(self, query: dict) -> list[Task]:
        """The query's turns as tasks; QueryError for anything KataGo would refuse."""
        qid = query["id"]
        xsize, ysize = (query.get(k) for k in ("boardXSize", "boardYSize"))
        for key, value in (("boardXSize", xsize), ("boardYSize", ysize)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise QueryError(f"{key} must be an integer", key)
        if xsize != ysize:
            raise QueryError("tengen plays square boards only", "boardYSize")
        if not 2 <= xsize <= 19:
            raise QueryError(f"Board size {xsize} is outside 2..19", "boardXSize")
        if xsize not in self.settings.board_sizes:
            sizes = ", ".join(str(s) for s in sorted(self.settings.board_sizes))
            raise QueryError(
                f"Board size {xsize}: the net was trained on {sizes}; set tengenBoardSizes "
                f"in the config to allow others",
                "boardXSize",
            )
        komi = query.get("komi")
        if komi is not None:
            if not isinstance(komi, int | float) or isinstance(komi, bool):
                raise QueryError("komi must be a number", "komi")
            if abs(komi) > MAX_KOMI or not math.isfinite(komi) or komi * 2 != int(komi * 2):
                raise QueryError(f"Must be a integer or half-integer from -{MAX_KOMI} to "
                                 f"{MAX_KOMI}", "komi")  # fmt: skip
        if "rules" not in query:
            raise QueryError("Missing required field rules", "rules")
        rules = parse_query_rules(query["rules"], None if komi is None else float(komi))
        moves = query.get("moves")
        if not isinstance(moves, list):
            raise QueryError("moves must be a list of [player, location] pairs", "moves")
        game = Game(xsize, rules, max_moves=len(moves) + 4 * xsize * xsize)
        stones = query.get("initialStones", [])
        if not isinstance(stones, list):
            raise QueryError("initialStones must be a list of [player, location]", "initialStones")
        for item in stones:
            color, point = self._pair(item, xsize, "initialStones")
            if point is None:
                raise QueryError("initialStones cannot hold a pass", "initialStones")
            try:
                game.add_setup_stones(color, [point])
            except (IllegalMoveError, ValueError) as e:
                raise QueryError(f"Illegal initial stone: {e}", "initialStones") from None
        if "initialPlayer" in query:
            game.set_to_move(parse_player(query["initialPlayer"], "initialPlayer"))
        elif moves:
            first = moves[0][0] if isinstance(moves[0], list) and moves[0] else None
            game.set_to_move(parse_player(first, "moves"))
        turns = query.get("analyzeTurns", [len(moves)])
        if not isinstance(turns, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in turns
        ):
            raise QueryError("analyzeTurns must be a list of integers", "analyzeTurns")
        for t in turns:
            if not 0 <= t <= len(moves):
                raise QueryError(f"Invalid turn number: {t}", "analyzeTurns")
        positions = {0: game.copy()} if 0 in turns else {}
        for i, item in enumerate(moves):
            color, point = self._pair(item, xsize, "moves")
            try:
                game.play(color, point)
            except IllegalMoveError:
                raise QueryError(
                    f"Illegal move {i}: {format_move(point, xsize)}", "moves"
                ) from None
            if i + 1 in turns:
                positions[i + 1] = game.copy()
        visits, seconds, report = self._budget(query)
        perspective = self._perspective(query)
        priorities = query.get("priorities")
        if priorities is not None and (
            not isinstance(priorities, list) or len(priorities) != len(turns)
        ):
            raise QueryError("priorities must be a list as long as analyzeTurns", "priorities")
        priority = query.get("priority", 0)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise QueryError("priority must be an integer", "priority")
        for name in ("includeOwnership", "includeMovesOwnership", "includePolicy",
                     "includePVVisits"):  # fmt: skip
            if name in query and not isinstance(query[name], bool):
                raise QueryError(f"{name} must be a boolean", name)
        tasks = []
        for i, turn in enumerate(turns):
            p = priorities[i] if priorities is not None else priority
            if not isinstance(p, int) or isinstance(p, bool):
                raise QueryError("priorities must be integers", "priorities")
            tasks.append(Task((-p, next(self._arrivals)), query, turn, positions[turn], visits,
                              seconds, report, perspective))  # fmt: skip
        for name in ("avoidMoves", "allowMoves"):  # after every check: a warning, then results
            if query.get(name):
                self._send({"warning": f"{name} is not supported by tengen; searching all moves",
                            "field": name, "id": qid})  # fmt: skip
        return tasks

    @staticmethod
    def _pair(item: Any, size: int, field: str):
        if not isinstance(item, list) or len(item) != 2:
            raise QueryError(f"Each entry of {field} must be [player, location]", field)
        return parse_player(item[0], field), parse_move(item[1], size, size, field)

    def _overrides(self, query: dict) -> dict:
        overrides = query.get("overrideSettings", {})
        if not isinstance(overrides, dict):
            raise QueryError("overrideSettings must be an object", "overrideSettings")
        return overrides

    def _budget(self, query: dict) -> tuple[int, float | None, float | None]:
        overrides = self._overrides(query)
        visits = query.get("maxVisits", overrides.get("maxVisits", self.settings.max_visits))
        if visits is None:
            visits = 400 if self._players[0].visits is None else self._players[0].visits
        if not isinstance(visits, int) or isinstance(visits, bool) or visits < 1:
            raise QueryError("maxVisits must be an integer >= 1", "maxVisits")
        seconds = overrides.get("maxTime", self.settings.max_time)
        if seconds is not None and not _positive(seconds):
            raise QueryError("maxTime must be a number > 0", "overrideSettings")
        report = query.get("reportDuringSearchEvery")
        if report is not None and not _positive(report):
            raise QueryError("reportDuringSearchEvery must be a number > 0",
                             "reportDuringSearchEvery")  # fmt: skip
        return visits, seconds, report

    def _perspective(self, query: dict) -> str:
        value = self._overrides(query).get("reportAnalysisWinratesAs", self.settings.perspective)
        if not isinstance(value, str) or value.upper() not in PERSPECTIVES:
            raise QueryError(f"reportAnalysisWinratesAs must be one of {', '.join(PERSPECTIVES)}",
                             "overrideSettings")  # fmt: skip
        return value.upper()

    # -- the analysis threads -----------------------------------------------------------------

    def _work(self, player) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                task = heapq.heappop(self._queue)
                self._running.append(task)
            try:
                self._analyze(player, task)
            except Exception as e:  # noqa: BLE001 - a task that fails answers, never kills us
                self.log(f"tengen analysis: query {task.query['id']} turn {task.turn}: {e!r}")
                # Still the turn's one final response.
                self._send({**_error(f"Internal error: {e}", task.query["id"]),
                            "turnNumber": task.turn, "isDuringSearch": False})  # fmt: skip
            finally:
                with self._cond:
                    self._running.remove(task)
                    self._cond.notify_all()

    def _analyze(self, player, task: Task) -> None:
        if task.terminated.is_set():
            self._send({"id": task.query["id"], "isDuringSearch": False, "noResults": True,
                        "turnNumber": task.turn})  # fmt: skip
            return
        game = task.game
        visits = player.visit_cap(game.size, task.visits)
        last = None
        for result in player.search(
            game, game.to_move, visits=visits, seconds=task.seconds, interval=task.report_every,
            ownership=bool(task.query.get("includeOwnership")),
            should_stop=task.terminated.is_set,
        ):  # fmt: skip
            if not result.final and task.report_every is not None and result.visits:
                self._send(self._response(player, task, result, during=True))  # as it comes
            last = result
        if last is None or last.visits == 0:
            self._send({"id": task.query["id"], "isDuringSearch": False, "noResults": True,
                        "turnNumber": task.turn})  # fmt: skip
            return
        self._send(self._response(player, task, last, during=False))

    def _response(self, player, task: Task, result, *, during: bool) -> dict:
        game = task.game
        n = game.size
        to_move = result.to_move
        flip = (task.perspective == "BLACK" and to_move == WHITE) or (
            task.perspective == "WHITE" and to_move == BLACK
        )

        def winrate(w: float) -> float:
            return 1.0 - w if flip else w

        def lead(s: float) -> float:
            return -s if flip else s

        infos = []
        for order, m in enumerate(m for m in result.moves if m.visits > 0):
            infos.append({
                "move": format_move(m.move, n),
                "order": order,
                "visits": m.visits,
                "winrate": winrate(m.winrate),
                "scoreLead": lead(m.score_lead),
                "scoreMean": lead(m.score_lead),
                "prior": m.prior,
                "utility": -m.utility if flip else m.utility,
                "pv": [format_move(p, n) for p in m.pv],
            })  # fmt: skip
        out = {
            "id": task.query["id"],
            "isDuringSearch": during,
            "turnNumber": task.turn,
            "moveInfos": infos,
            "rootInfo": {
                "currentPlayer": "B" if to_move == BLACK else "W",
                "visits": result.visits,
                "winrate": winrate(result.winrate),
                "scoreLead": lead(result.score_lead),
                "scoreStdev": result.score_stdev,
            },
        }
        if task.query.get("includeOwnership") and result.ownership is not None:
            # The search's ownership is Black's; KataGo's is from the reported side.
            side = -1.0 if (task.perspective == "WHITE" or (
                task.perspective == "SIDETOMOVE" and to_move == WHITE)) else 1.0  # fmt: skip
            out["ownership"] = [side * float(v) for v in np.asarray(result.ownership).reshape(-1)]
        if task.query.get("includePolicy") and not during:
            raw = player.raw(game)
            policy = [(-1.0 if math.isnan(v) else float(v)) for v in raw["policy"].reshape(-1)]
            out["policy"] = policy + [raw["pass"]]
        return out

    # -- output -------------------------------------------------------------------------------

    def _send(self, response: dict) -> None:
        text = json.dumps(response, separators=(",", ":"))
        with self._write_lock:
            self.out.write(text + "\n")
            self.out.flush()

    def close(self, wait: bool = True) -> None:
        """Stop taking work: with `wait`, answer every queued task first; else terminate them
        (KataGo's -quit-without-waiting) and answer what was searched."""
        with self._cond:
            if not wait:
                for task in self._queue:
                    task.terminated.set()
                for task in self._running:
                    task.terminated.set()
            self._closing = True
            self._cond.notify_all()
        for worker in self._workers:
            worker.join()

    def serve(self, inp: TextIO, *, wait: bool = True) -> None:
        """Answer the lines of `inp` until it ends, then finish (see `close`)."""
        for line in inp:
            self.submit(line)
        self.close(wait=wait)


def _positive(value: Any) -> bool:
    """A finite number > 0 (not a bool)."""
    return (
        isinstance(value, int | float) and not isinstance(value, bool)
        and math.isfinite(value) and value > 0
    )  # fmt: skip


def _error(message: str, qid: str | None, field: str | None = None) -> dict:
    out: dict[str, Any] = {"error": message}
    if field is not None:
        out["field"] = field
    if qid is not None:
        out["id"] = qid
    return out
