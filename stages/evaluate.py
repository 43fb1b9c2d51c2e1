"""The evaluate stage: generation N's champion plays a ladder of fixed outside opponents (GNU Go
at several levels, GNU Go giving handicap stones, the random player, any GTP engine) and the
champions of earlier evaluations, colours alternating (in a handicap rung the champion is Black
throughout), through GTP (`tengen gtp --model`, the `evaluate.search` knobs); one
Bradley-Terry fit over every evaluation game of the run so far rates them all, anchored on
`evaluate.anchor` (GNU Go level 1 = 0 by default). The games run where params.yaml's `cluster:`
says (stages.fanout): on a cluster each engine pair of each pairing is a shard, the same games.

    python -m stages.evaluate --generation N [--earlier 2,5] [--champion PATH]
        [--out reports/eval/gen-N] [--report reports/eval/gen-N.json]

`--earlier` lists the generations evaluated before this one (dvc.yaml's schedule, from
`evaluate.every`): their reports feed the fit, and the last `evaluate.past_champions` of them
play. Writes the games (reports/eval/gen-N/<opponent>/games/*.sgf) and a chart (elo.png)
atomically, then reports/eval/gen-N.json (each pairing's wins and games, every rating, the
champion's Elo and the self-play compute spent so far) and reports/eval/history-gen-N.json
(one row per evaluated generation, for DVC's plots).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import shlex
import shutil
import socket
import sys
import tempfile
from pathlib import Path

from gocore.atomic import output_dir, write_bytes, write_json
from gocore.rules import PRESETS
from play import katago
from play.match import EngineStartError, GameResult, Match, MatchConfig, wilson_interval
from play.models import UNIFORM
from play.programs import (
    HERE,
    REFEREE,
    find_program,
    install_command,
    install_hint,
    missing_line,
    program_of,
    which,
)
from play.ratings import Pairing, RatingError, UnboundedRating, fit
from stages import cli, layout
from stages.cli import InputError
from stages.fanout import IN_PROCESS, cluster_params, fan_out, worker_name
from stages.params import ClusterParams, Device, EvaluateParams, Rung, Section, read
from stages.spec import DvcStage, Plan, sections


class Params(Section):
    """What the evaluate stage reads of params.yaml."""

    evaluate: EvaluateParams
    device: Device


@dataclasses.dataclass(frozen=True)
class EvaluateIO:
    generation: int
    champion: Path
    out: Path  # reports/eval/gen-N: the games and the chart
    report: Path  # reports/eval/gen-N.json
    history: Path  # reports/eval/history-gen-N.json
    earlier: tuple[int, ...] = ()  # generations evaluated before, oldest first
    params_path: Path = Path(layout.PARAMS)
    reports: Path | None = layout.REPORTS  # None: outside a run (no self-play compute)
    name: str | None = None  # the champion's name in the ratings (default gen-N)


def dvc(n: int, plan: Plan) -> list[DvcStage]:
    """Generation n's evaluation, when it is due (every `evaluate.every` and the last)."""
    if not plan.evaluated(n):
        return []
    earlier = plan.evaluated_before(n)
    count = plan.evaluation.past_champions
    past = earlier[len(earlier) - count :] if count else []
    flag = f" --earlier {','.join(map(str, earlier))}" if earlier else ""
    # Its params: every section it reads, less the schedule (evaluate.every, evaluate.at).
    measured = tuple(
        k for name in sections(Params) for k in
        (EvaluateParams.measured() if name == "evaluate" else (name,))
    )  # fmt: skip
    deps = [layout.champion_dir(n), *(layout.champion_dir(k) for k in past)]
    deps += [layout.eval_report(k) for k in earlier]
    deps += [layout.selfplay_report(k) for k in range(n + 1)]
    return [
        DvcStage(
            f"evaluate-{n}", "stages.evaluate", f"--generation {n}{flag}", measured,
            deps=tuple(map(str, deps)),
            # The history is drawn by dvc.yaml's top-level plots; declared as plots here too,
            # DVC would draw it a second time with its default template (step against one
            # column), a useless chart per evaluation.
            outs=(str(layout.eval_games(n)), {str(layout.eval_history(n)): {"cache": False}}),
            metrics=(str(layout.eval_report(n)),),
        )
    ]  # fmt: skip


class MissingProgram(InputError):
    """An opponent's (or the referee's) program that is not installed."""

    def __init__(self, program: str, command: str):
        self.program, self.command = program, command
        super().__init__(f"evaluate: `{program}` is not installed{install_hint(program)}: "
                         f"{command!r}")  # fmt: skip


TENGEN = "{tengen}"  # in a command line: this installation's CLI
KATAGO = "{katago}"  # in a command line: KataGo's GTP engine (tengen engines install katago)


def engine_command(command: str) -> str:
    """A GTP command line with `{tengen}` as this interpreter's CLI and `{katago}` as the
    installed KataGo's GTP engine, its program found on PATH or in play.programs' folders
    (/usr/games). MissingProgram where it is not installed."""
    command = command.replace(TENGEN, f"{shlex.quote(sys.executable)} -m flows.cli")
    if KATAGO in command:
        found = katago.installed()
        if found is None:
            raise MissingProgram("katago", command)
        command = command.replace(KATAGO, found.gtp_command(visits=None))
    words = find_program(command)
    if words and shutil.which(words[0]) is None:
        raise MissingProgram(words[0], command)
    return shlex.join(words)


def needed_programs(params: EvaluateParams) -> dict[str, list[str]]:
    """The outside programs the evaluation runs, each with the opponents that need it (and
    REFEREE for the referee); tengen's own engines are not among them."""
    needed: dict[str, list[str]] = {}
    commands = {name: rung.command for name, rung in params.rungs().items()}
    if params.referee:
        commands[REFEREE] = params.referee
    for name, command in commands.items():
        program = program_of(command)
        if program == KATAGO:
            program = "katago"
        if program and TENGEN not in program:
            needed.setdefault(program, []).append(name)
    return needed


def missing_programs(params: EvaluateParams) -> dict[str, list[str]]:
    """needed_programs() that are not installed here."""
    return {p: names for p, names in needed_programs(params).items() if which(p) is None}


def without(program: str, names: list[str], where: str | None = None) -> str:
    """One line: `program` is missing (here, or on the workers `where`), what the evaluation
    does without it, and its install."""
    rungs = [n for n in names if n != REFEREE]
    what = []
    if rungs:
        what.append(f"the evaluations leave out {', '.join(rungs)}")
    if REFEREE in names:
        what.append("score without a referee (the dead stones both engines agree on)")
    return missing_line(program, " and ".join(what), where)


def champion_command(
    path: Path | str | None, params: EvaluateParams, device: str, params_path: Path | str
) -> str:
    """A champion's GTP engine (path None: the uniform priors), with this interpreter."""
    return shlex.join([sys.executable, "-m", "flows.cli", *_champion_args(path, params, device,
                                                                         params_path)])  # fmt: skip


def _champion_args(path, params: EvaluateParams, device: str, params_path) -> list[str]:
    return [
        "gtp", "--model", str(path or UNIFORM), "--visits", str(params.visits),
        "--threads", str(params.threads), "--device", device, "--params", str(params_path),
        "--section", "evaluate",
    ]  # fmt: skip


# A cluster's worker runs the engines: the champions' checkpoints and params.yaml go to it as
# bytes, into a temporary folder that FILES in the command lines names there, and `{tengen}`
# and the programs are found on the worker.
FILES = "{files}"


def _worker_command(model: str | None, params: EvaluateParams, device: str) -> str:
    """champion_command for a worker: the checkpoint `model` (None: uniform) and params.yaml
    in FILES."""
    path = f"{FILES}/{model}" if model is not None else None
    return "{tengen} " + shlex.join(_champion_args(path, params, device, f"{FILES}/params.yaml"))


def rung_config(even: MatchConfig, rung: Rung, params: EvaluateParams) -> MatchConfig:
    """A fixed opponent's games: at its komi, and with a handicap the champion (A) in Black
    every game, the opponent's stones given."""
    return dataclasses.replace(
        even, rules=PRESETS[params.rules].with_komi(rung.komi), handicap=rung.handicap,
        a_black=rung.handicap >= 2,
    )  # fmt: skip


def chunks(games: int, workers: int) -> list[list[int]]:
    """A pairing's game numbers (from 1) dealt to `workers` engine pairs."""
    numbers = list(range(1, games + 1))
    return [numbers[i::workers] for i in range(workers) if numbers[i::workers]]


def play_games(
    name: str, a: str, b: str, config: MatchConfig, out: Path, numbers: list[int]
) -> list[GameResult]:
    """Games `numbers` of A against B with one engine pair; the SGFs in out/games."""
    match = Match(a, b, config, out)
    try:
        try:
            match.start()
        except EngineStartError as e:
            raise InputError(f"evaluate, pairing {name}: {e}") from None
        return [match.play_game(n) for n in numbers]
    finally:
        match.close()


def play_pairing(
    name: str, a: str, b: str, config: MatchConfig, out: Path, workers: int
) -> list[GameResult]:
    """config.games games of A against B, split over `workers` engine pairs (each its own
    processes), colours alternating by game number (or A in Black throughout, a handicap
    rung's); the SGFs in out/games."""
    parts = chunks(config.games, workers)

    def play(numbers: list[int]) -> list[GameResult]:
        return play_games(name, a, b, config, out, numbers)

    with concurrent.futures.ThreadPoolExecutor(len(parts), f"eval-{name}") as pool:
        results = [r for part in pool.map(play, parts) for r in part]
    return sorted(results, key=lambda r: r.number)


@dataclasses.dataclass
class ChunkResult:
    index: int
    name: str  # the pairing's opponent
    results: list[GameResult]  # none where the opponent's program is missing on the worker
    files: dict[str, bytes]  # what the match wrote (games/*.sgf, logs/), by relative path
    worker: str
    # The programs the worker lacked: the opponent's (its games not played), the referee's.
    opponent_missing: str | None = None
    referee_missing: str | None = None
    unplayed: int = 0  # games not played for want of the opponent's program


def play_chunk(
    *,
    index: int,
    name: str,
    a: str,
    b: str,
    config: MatchConfig,
    numbers: list[int],
    files: dict[str, bytes],
) -> ChunkResult:
    """play_games on a cluster's worker: `files` (checkpoints, params.yaml) written to a
    temporary folder that FILES in the command lines names; the match's files sent back. An
    opponent whose program the worker lacks plays no game there (the chunk says which), a
    referee it lacks scores without one."""
    with tempfile.TemporaryDirectory(prefix="tengen-eval-") as folder:
        for file_name, data in files.items():
            (Path(folder) / file_name).write_bytes(data)

        def here(command: str) -> str:
            return engine_command(command.replace(FILES, folder))

        try:
            try:
                opponent = here(b)
            except MissingProgram as e:
                return ChunkResult(index, name, [], {}, worker_name(),
                                   opponent_missing=e.program, unplayed=len(numbers))  # fmt: skip
            referee, referee_missing = None, None
            try:
                referee = config.referee and here(config.referee)
            except MissingProgram as e:
                referee_missing = e.program
            config = dataclasses.replace(config, referee=referee or None)
            out = Path(folder) / "out"
            results = play_games(name, here(a), opponent, config, out, numbers)
        except InputError as e:
            raise InputError(f"{e} (on the worker {socket.gethostname()})") from None
        back = {
            str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()
        }
    return ChunkResult(index, name, results, back, worker_name(), referee_missing=referee_missing)


def pairing_summary(a: str, b: str, results: list[GameResult]) -> dict:
    """A's wins, draws, void games and win rate (draws half) with its 95% Wilson interval."""
    wins = sum(r.winner == "A" for r in results)
    losses = sum(r.winner == "B" for r in results)
    void = sum(r.winner is None and r.result == "Void" for r in results)
    draws = len(results) - wins - losses - void
    decided = wins + losses + draws
    score = wins + 0.5 * draws
    low, high = wilson_interval(score, decided)
    return {
        "a": a, "b": b, "games": decided, "a_score": score, "a_wins": wins, "draws": draws,
        "void": void, "a_win_rate": round(score / decided, 4) if decided else None,
        "a_win_rate_95ci": [round(low, 4), round(high, 4)],
        "a_wins_as_black": sum(r.winner == "A" and r.black == "A" for r in results),
        "reasons": sorted({r.reason for r in results}),
    }  # fmt: skip


def compute_spent(reports: Path, generation: int) -> dict:
    """Self-play compute up to and including this generation: network evaluations, visits
    and seconds, from reports/selfplay/gen-K.json."""
    total = {"selfplay_evaluations": 0.0, "selfplay_visits": 0.0, "selfplay_seconds": 0.0}
    for k in range(generation + 1):
        m = cli.read_report(layout.in_reports(reports, layout.selfplay_report(k)), "evaluate",
                            f"selfplay-{k}")  # fmt: skip
        seconds = float(m.get("seconds", 0.0))
        total["selfplay_seconds"] += seconds
        total["selfplay_evaluations"] += float(
            m.get("evaluations", m.get("evaluations_per_s", 0.0) * seconds)
        )
        total["selfplay_visits"] += float(m.get("visits", m.get("visits_per_s", 0.0) * seconds))
    return {k: round(v, 1) for k, v in total.items()}


def _earlier_report(reports: Path, k: int) -> dict:
    return cli.read_report(layout.in_reports(reports, layout.eval_report(k)), "evaluate",
                           f"evaluate-{k}")  # fmt: skip


def _on_cluster(champion_path, engines, configs, params, device, io, cluster, log) -> dict:
    """Every pairing's chunks as shards on the cluster at once: {opponent: (its command line
    as the workers run it, its chunks in order)}."""
    common = {layout.PARAMS: Path(io.params_path).read_bytes()}
    if champion_path is not None:
        common[layout.CHAMPION] = champion_path.read_bytes()
    champion = _worker_command(layout.CHAMPION if champion_path else None, params, device)
    calls, commands = [], {}
    for name, engine in engines.items():
        files = dict(common)
        if isinstance(engine, str):
            command = engine
        else:  # a past champion (gen-K): its checkpoint as gen-K.pt
            path = engine[0]
            if path is not None:
                files[f"{name}.pt"] = path.read_bytes()
            command = _worker_command(f"{name}.pt" if path else None, params, device)
        commands[name] = command
        for numbers in chunks(configs[name].games, params.workers):
            calls.append(dict(index=len(calls), name=name, a=champion, b=command,
                              config=configs[name], numbers=numbers, files=files))  # fmt: skip
    back = fan_out(play_chunk, calls, cluster=cluster, name=f"evaluate gen-{io.generation}",
                   log=log)  # fmt: skip
    return {name: (command, [c for c in back if c.name == name])
            for name, command in commands.items()}  # fmt: skip


def run(
    params: Params,
    io: EvaluateIO,
    *,
    progress=None,
    cluster: ClusterParams = IN_PROCESS,
    log=None,
    leave_out_missing: bool = True,
) -> dict:
    """Play the ladder (in this process, or each pairing's chunks as shards where `cluster`
    says: the same games), rate every evaluation so far, write the report. An opponent whose
    program is not installed (here, or on the workers that drew its games) is left out with
    a warning through `log` and listed in the report's `left_out` (MissingProgram instead
    without `leave_out_missing`); the ratings are fitted over the games that were played,
    anchored on evaluate.anchor or, where it never played, the next opponent that did."""
    device, params = params.device, params.evaluate
    champion_path = _champion(io.champion, f"promote-{io.generation}")
    me = io.name or f"gen-{io.generation}"
    if me in params.opponents:
        raise InputError(f"evaluate.opponents: {me!r} is the name of a champion")
    earlier = [_earlier_report(io.reports or Path("reports"), k) for k in io.earlier]
    rungs = params.rungs()
    # Each opponent: its rung's command line, or a past champion's checkpoint (None: uniform).
    engines: dict[str, str | tuple[Path | None]] = {n: r.command for n, r in rungs.items()}
    past = io.earlier[len(io.earlier) - params.past_champions :] if params.past_champions else []
    for k in past:
        engines[f"gen-{k}"] = (_champion(layout.champion(k), f"promote-{k}"),)
    if params.anchor not in params.opponents and not any(
        params.anchor in (p["a"], p["b"]) for r in earlier for p in r["pairings"]
    ):
        raise InputError(
            f"evaluate.anchor: {params.anchor!r} is not among evaluate.opponents "
            f"({sorted(params.opponents)}) nor in an earlier evaluation"
        )
    even = MatchConfig(
        games=params.games, size=params.board_size,
        rules=PRESETS[params.rules].with_komi(params.komi), timeout=params.timeout,
        referee=params.referee or None,
    )  # fmt: skip
    configs = {
        name: even if name not in rungs else rung_config(even, rungs[name], params)
        for name in engines
    }
    pairings = []

    def record(name: str, command: str, results: list[GameResult]) -> None:
        config = configs[name]
        summary = {
            "opponent": name, "command": command, "handicap": config.handicap,
            "komi": config.rules.komi, **pairing_summary(me, name, results),
        }  # fmt: skip
        pairings.append(summary)
        if progress is not None:
            progress(summary)

    left_out: list[dict] = []  # opponents (and the referee) whose program was not installed
    with output_dir(io.out) as tmp:
        if cluster.address is None:
            # Every program found before any game is played.
            champion = champion_command(champion_path, params, device, io.params_path)
            commands = {}
            for name, e in engines.items():
                if not isinstance(e, str):
                    commands[name] = champion_command(e[0], params, device, io.params_path)
                    continue
                try:
                    commands[name] = engine_command(e)
                except MissingProgram as missing:
                    if not leave_out_missing:
                        raise
                    left_out.append(_left_out(name, missing.program))
            referee = None
            try:
                referee = params.referee and engine_command(params.referee)
            except MissingProgram as missing:
                if not leave_out_missing:
                    raise
                left_out.append(_left_out(REFEREE, missing.program))
            _warn_left_out(left_out, log)
            for name, command in commands.items():
                config = dataclasses.replace(configs[name], referee=referee or None)
                record(name, command, play_pairing(name, champion, command, config,
                                                   tmp / name, params.workers))  # fmt: skip
        else:
            by_name = _on_cluster(champion_path, engines, configs, params, device, io, cluster,
                                  log)  # fmt: skip
            workers = {c.worker for _, back in by_name.values() for c in back}
            left_out = _left_out_on_workers({n: back for n, (_, back) in by_name.items()})
            for name, (command, chunks_back) in by_name.items():
                played = [c for c in chunks_back if c.results]
                if not played:
                    continue
                # Each engine pair's logs (logs/A.stderr.log, ...) follow one another, as in
                # one process, where the pairs append to the same files.
                files: dict[str, bytes] = {}
                for chunk in played:
                    for relative, data in chunk.files.items():
                        files[relative] = files.get(relative, b"") + data
                for relative, data in files.items():
                    write_bytes(data, tmp / name / relative)
                results = sorted((r for c in played for r in c.results),
                                 key=lambda r: r.number)  # fmt: skip
                record(name, command, results)
            _warn_left_out(left_out, log)
        all_pairings = [p for r in earlier for p in r["pairings"]] + pairings
        anchor, anchor_elo = rating_anchor(
            params.anchor, params.anchor_elo, list(params.opponents), all_pairings
        )
        ratings = {}
        if pairings:  # else every opponent was left out: nothing to rate this time
            try:
                ratings = fit(
                    [Pairing(p["a"], p["b"], p["games"], p["a_score"]) for p in all_pairings],
                    anchor=anchor, anchor_elo=anchor_elo, prior_draws=params.prior_draws,
                )  # fmt: skip
            except UnboundedRating as e:
                raise InputError(
                    f"evaluate: the games cannot be rated: {e}; evaluate.prior_draws is "
                    f"{params.prior_draws}: set it above 0 (1 adds one draw to each pairing)"
                ) from None
            except RatingError as e:
                raise InputError(f"evaluate: the games cannot be rated: {e}") from None
            if me not in ratings:
                reasons = sorted({r for p in pairings for r in p["reasons"]})
                raise InputError(
                    f"evaluate: no game of {me} was decided (every one void: {reasons})"
                )
        compute = compute_spent(io.reports, io.generation) if io.reports is not None else {}
        rated = ratings.get(me)
        report = {
            "generation": io.generation if io.reports is not None else None,  # None: no run
            "champion": me,
            "champion_path": str(champion_path or "uniform"),
            "anchor": anchor,
            **({} if anchor == params.anchor else {"anchor_wanted": params.anchor}),
            "elo": round(rated.elo, 1) if rated else None,
            "elo_stderr": round(rated.stderr, 1) if rated else None,
            **{f"win_rate_{p['opponent']}": p["a_win_rate"] for p in pairings},
            **compute,
            **(
                {}
                if cluster.address is None
                else {"cluster": cluster.address, "workers": len(workers)}
            ),
            "pairings": pairings,
            "left_out": left_out,
            "ratings": {
                name: {"elo": round(r.elo, 1), "stderr": round(r.stderr, 1)}
                for name, r in sorted(ratings.items())
            },
        }
        rows = history_rows(earlier + [report], ratings, params)
        chart(rows, params, tmp / "elo.png", anchor, anchor_elo)
    write_json(rows, io.history)
    write_json(report, io.report)
    return report


def _left_out(name: str, program: str, where: str = HERE, games: int | None = None) -> dict:
    """A report's entry for an opponent (or REFEREE) left out: its program and the command
    that installs it, where it was missing (HERE, or the workers), and the games not played."""
    entry = {"opponent": name, "program": program, "install": install_command(program),
             "where": where}  # fmt: skip
    return entry if games is None else {**entry, "games": games}


def _left_out_on_workers(chunks: dict[str, list[ChunkResult]]) -> list[dict]:
    """What the workers left out, from each pairing's chunks: an opponent whose program some
    lacked (with the games not played and those workers' hosts), and the referee where some
    played without it (one entry, with every such host)."""
    entries = []
    no_referee: dict[str, set[str]] = {}  # program -> hosts
    for name, chunks_back in chunks.items():
        unplayed: dict[str, list[ChunkResult]] = {}
        for chunk in chunks_back:
            if chunk.opponent_missing:
                unplayed.setdefault(chunk.opponent_missing, []).append(chunk)
            if chunk.referee_missing:
                no_referee.setdefault(chunk.referee_missing, set()).add(_host(chunk.worker))
        for program, chunks_missing in unplayed.items():
            hosts = ", ".join(sorted({_host(c.worker) for c in chunks_missing}))
            games = sum(c.unplayed for c in chunks_missing)
            entries.append(_left_out(name, program, hosts, games))
    for program, hosts in no_referee.items():
        entries.append(_left_out(REFEREE, program, ", ".join(sorted(hosts))))
    return entries


def _host(worker: str) -> str:
    return worker.rsplit(":", 1)[0]  # worker_name(): host:pid


def replays(repo: Path, plan: Plan) -> dict[int, list[dict]]:
    """The evaluations done so far that left out an opponent (or the referee) for want of a
    program that this machine has now, with those entries: the loop plays them again. An
    entry of workers elsewhere counts only where every one of them was this machine."""
    here = socket.gethostname()
    out = {}
    for n in range(plan.generations):
        path = repo / layout.eval_report(n)
        if not plan.evaluated(n) or not path.is_file():
            continue
        try:
            left_out = json.loads(path.read_text()).get("left_out") or []
        except (json.JSONDecodeError, AttributeError):
            continue  # its own stage says what is wrong with it
        found = [
            e for e in left_out
            if which(e["program"]) is not None
            and (e["where"] == HERE or set(e["where"].split(", ")) <= {here})
        ]  # fmt: skip
        if found:
            out[n] = found
    return out


def _warn_left_out(left_out: list[dict], log) -> None:
    """One warning a program, naming what the evaluation left out for want of it."""
    by_program: dict[str, list[str]] = {}
    for entry in left_out:
        by_program.setdefault(entry["program"], []).append(entry["opponent"])
    for program, names in by_program.items():
        hosts = sorted({e["where"] for e in left_out if e["program"] == program} - {HERE})
        if log is not None:
            log(f"warning: {without(program, names, ', '.join(hosts) or None)}")


def rating_anchor(
    anchor: str, anchor_elo: float, opponents: list[str], pairings: list[dict]
) -> tuple[str, float]:
    """The Elo anchor and its Elo: evaluate.anchor (`anchor`) where it has played in the
    `pairings`, else (its program left out) the first of `opponents` that has played, else
    the oldest champion, at Elo 0."""
    played = [x for p in pairings for x in (p["a"], p["b"])]
    if anchor in played or not played:
        return anchor, float(anchor_elo)
    for name in opponents:
        if name in played:
            return name, 0.0
    return played[0], 0.0


def history_rows(reports: list[dict], ratings: dict, params: EvaluateParams) -> list[dict]:
    """One row per evaluated generation, every Elo from the latest fit (none for a champion
    that has played no game: every opponent of its evaluation left out)."""
    rows = []
    for r in reports:
        name = r["champion"]
        if name not in ratings:
            continue
        row = {
            "generation": r["generation"],
            "elo": round(ratings[name].elo, 1),
            "elo_stderr": round(ratings[name].stderr, 1),
            "selfplay_evaluations": r.get("selfplay_evaluations"),
            "selfplay_seconds": r.get("selfplay_seconds"),
        }
        for p in r["pairings"]:
            if p["opponent"] in params.opponents:
                row[f"win_rate_{p['opponent']}"] = p["a_win_rate"]
        rows.append(row)
    return rows


def chart(
    rows: list[dict], params: EvaluateParams, path: Path, anchor: str, anchor_elo: float
) -> Path:
    """elo.png: Elo against generation and against self-play evaluations (error bars of one
    standard error), and the win rate against each fixed opponent."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gens = [r["generation"] for r in rows]
    elo = [r["elo"] for r in rows]
    err = [r["elo_stderr"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    axes[0].errorbar(gens, elo, yerr=err, marker="o", capsize=3)
    axes[0].set(xlabel="generation", ylabel=f"Elo ({anchor} = {anchor_elo:g})",
                title="champion Elo")  # fmt: skip
    compute = [r.get("selfplay_evaluations") or 0 for r in rows]
    axes[1].errorbar(compute, elo, yerr=err, marker="o", capsize=3)
    axes[1].set(xlabel="self-play network evaluations", ylabel="Elo", title="Elo against compute")
    for name in params.opponents:
        key = f"win_rate_{name}"
        points = [(r["generation"], r[key]) for r in rows if r.get(key) is not None]
        if points:
            axes[2].plot(*zip(*points, strict=True), marker="o", label=name)
    axes[2].set(xlabel="generation", ylabel="win rate", ylim=(-0.05, 1.05),
                title="win rate against each opponent")  # fmt: skip
    if axes[2].lines:  # none where every fixed opponent was left out
        axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def prepare(
    params_path, generation: int, *, earlier=(), champion=None, out=None, report=None
) -> tuple[EvaluateParams, EvaluateIO]:
    params = read(params_path, Params)
    io = EvaluateIO(
        generation=generation,
        champion=Path(champion or layout.champion(generation)),
        out=Path(out or layout.eval_games(generation)),
        report=Path(report or layout.eval_report(generation)),
        history=layout.eval_history(generation),
        earlier=tuple(earlier),
        params_path=Path(params_path),
    )
    if any(k >= generation or k < 0 for k in io.earlier):
        raise InputError(
            f"evaluate: --earlier {list(io.earlier)} must be generations < {generation}"
        )
    return params, io


def _champion(path: Path, stage: str) -> Path | None:
    """A champion's checkpoint; None (the uniform priors) where its promote stage ran before
    any candidate passed a gate."""
    if path.is_file():
        return path
    if (path.parent / layout.PROMOTION).is_file():
        return None
    raise InputError(f"evaluate: {path} does not exist; run {stage} first")


def _generations(text: str) -> list[int]:
    return [int(k) for k in text.split(",") if k.strip()] if text else []


def main(argv: list[str] | None = None) -> int:
    p = cli.parser("evaluate", __doc__)
    p.add_argument("--earlier", type=_generations, default=[], help="e.g. 2,5")
    p.add_argument("--champion", type=Path, default=None)
    p.add_argument("--out", type=Path, default=None, help="the games: reports/eval/gen-N")
    p.add_argument("--report", type=Path, default=None, help="reports/eval/gen-N.json")
    args = p.parse_args(argv)

    def work(tracked):
        params, io = prepare(
            args.params, args.generation, earlier=args.earlier, champion=args.champion,
            out=args.out, report=args.report,
        )  # fmt: skip

        def progress(summary):
            print(
                f"evaluate-{io.generation}: {summary['a']} vs {summary['opponent']}: "
                f"{summary['a_score']:g} of {summary['games']}",
                file=sys.stderr,
                flush=True,
            )

        log = functools.partial(print, "evaluate:", file=sys.stderr, flush=True)
        report = run(params, io, progress=progress, cluster=cluster_params(args.params), log=log)
        if tracked is not None:
            tracked.log_artifact(io.report)
            tracked.log_artifact(io.history)
            tracked.log_artifact(io.out, "games")
        return report

    return cli.finish("evaluate", work, Params, params=args.params, generation=args.generation)


if __name__ == "__main__":
    sys.exit(main())
