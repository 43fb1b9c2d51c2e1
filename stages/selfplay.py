"""The self-play stage: the champion net (uniform priors at generation 0) plays `games` games
against itself; out come Parquet shards of training rows, one SGF per game and a metrics JSON.

    python -m stages.selfplay --generation N [--model models/gen-(N-1)/champion/champion.pt]
        [--out data/selfplay/gen-N] [--metrics reports/selfplay/gen-N.json] [--params params.yaml]

The games are split into `selfplay.shards` shards, each seeded from (run seed, generation,
shard), which run in this process or on a Dask cluster (params.yaml `cluster:`,
stages.fanout); each sends back its Parquet files and SGFs as bytes. Everything lands in a
temporary folder next to `--out` that is renamed into place at the end, so a killed run leaves
no half-written generation. The same seed, shard count and inputs give the same files on the
CPU, wherever the shards ran.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gocore.atomic import output_dir, write_bytes, write_json
from gocore.board import BLACK, PASS, point_xy
from gocore.selfplay import (
    CHEAP,
    FULL,
    KIND_NAMES,
    FinishedGame,
    SelfPlay,
)
from play.models import UNIFORM, evaluator_from_bytes
from play.sgf import GameRecord, write_sgf
from stages import cli, layout, tracking
from stages.champions import previous_champion
from stages.fanout import IN_PROCESS, cluster_params, fan_out, on_worker, worker_name
from stages.params import (
    ClusterParams,
    Device,
    ParamsError,
    Section,
    SelfPlayParams,
    read,
)
from stages.rows import SCHEMA, list_shards, manifest_entries, shard_bytes, table_from_columns
from stages.spec import DvcStage, Plan, sections


class Params(Section):
    """What the self-play stage reads of params.yaml."""

    selfplay: SelfPlayParams
    device: Device


@dataclasses.dataclass(frozen=True)
class SelfPlayIO:
    generation: int
    out: Path  # data/selfplay/gen-N: part-K.parquet and sgf/
    metrics: Path  # reports/selfplay/gen-N.json
    model: Path | None = None  # the champion checkpoint; None: uniform priors (generation 0)


def dvc(n: int, plan: Plan) -> list[DvcStage]:
    """Generation n's self-play, from the champion after generation n - 1."""
    champion = (str(layout.champion_dir(n - 1)),) if n > 0 else ()
    return [
        DvcStage(
            f"selfplay-{n}", "stages.selfplay", f"--generation {n} --quiet", sections(Params),
            deps=champion, outs=(str(layout.selfplay_dir(n)),),
            metrics=(str(layout.selfplay_report(n)),),
        )
    ]  # fmt: skip


def prepare(
    params_path: str | Path,
    generation: int,
    *,
    model: str | Path | None = None,
    out: str | Path | None = None,
    metrics: str | Path | None = None,
    games: int | None = None,
) -> tuple[Params, SelfPlayIO]:
    """The stage's parameters and paths (defaults: stages.layout), checked before any game is
    played."""
    params = read(params_path, Params)
    if games is not None:
        if games < params.selfplay.shards:
            raise ParamsError(
                f"selfplay: --games must be at least selfplay.shards ({params.selfplay.shards}; "
                f"got {games})"
            )
        params = params.model_copy(
            update={"selfplay": params.selfplay.model_copy(update={"games": games})}
        )
    if model is None:
        # The champion after the previous generation, if there is one yet.
        model = previous_champion(generation, "selfplay")
    elif str(model) == UNIFORM:
        model = None
    if model is not None and not Path(model).is_file():
        raise ParamsError(f"selfplay: model {model} does not exist (the promote stage writes it)")
    io = SelfPlayIO(
        generation=generation,
        out=Path(out or layout.selfplay_dir(generation)),
        metrics=Path(metrics or layout.selfplay_report(generation)),
        model=Path(model) if model is not None else None,
    )
    return params, io


def game_seed(seed: int, *stream: int) -> int:
    """The run's seed for one stream of games (a generation; a generation's shard):
    independent streams, fixed by (seed, *stream)."""
    return int(np.random.SeedSequence([seed, *stream]).generate_state(1, np.uint64)[0] >> 1)


def sgf_record(game: FinishedGame, game_id: str, model_id: str, generation: int) -> GameRecord:
    info = game.info
    n = info.size
    moves, comments = [], []
    for i, (color, p) in enumerate(zip(info.colors, info.moves, strict=True)):
        moves.append((int(color), None if p == PASS else point_xy(game.stride, int(p))))
        kind = int(info.kinds[i])
        text = KIND_NAMES[kind]
        if kind in (FULL, CHEAP):
            rate = float(info.winrates[i])
            black = rate if color == BLACK else 1.0 - rate
            text += f": {int(info.visits[i])} visits, Black wins {black:.1%}"
        comments.append(text)
    lead = info.black_lead
    if info.side_of >= 0:
        result = None  # a side position is not played out
    else:
        result = "0" if lead == 0 else f"B+{lead:g}" if lead > 0 else f"W+{-lead:g}"
    root = [f"tengen self-play, generation {generation}, game {game_id}, model {model_id}"]
    if info.side_of >= 0:
        root.append(f"side position of game {info.side_of} (not played out)")
    if info.fork_turn >= 0:
        root.append(f"early fork at turn {info.fork_turn}")
    if info.decided_at >= 0:
        root.append(f"decided at turn {info.decided_at} (fewer visits, rows down-weighted)")
    return GameRecord(
        size=n,
        komi=info.komi,
        rules=info.rules,
        handicap=info.handicap,
        setup=[(c, point_xy(game.stride, p)) for c, p in info.setup],
        moves=moves,
        comments=comments,
        result=result,
        black=f"tengen {model_id}",
        white=f"tengen {model_id}",
        root_comment="; ".join(root),
    )


class _Progress:
    """A progress line: games done, moves/s, visits/s (rich, when a terminal is attached), over
    the shards this process plays one after another."""

    def __init__(self, games: int, enabled: bool):
        self.enabled = enabled and sys.stderr.isatty()
        self.start = time.perf_counter()
        self.last = 0.0
        self.bar = None
        self.current: SelfPlay | None = None
        self.before = (0, 0, 0)  # games, moves, visits of the shards played before this one
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self.bar = Progress(
                TextColumn("self-play"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rates]}"),
                transient=False,
            )
            self.task = self.bar.add_task("games", total=games, rates="")
            self.bar.start()

    def __call__(self, sp: SelfPlay, final: bool = False) -> None:
        if sp is not self.current:
            if self.current is not None:
                games, moves, visits = self.before
                c = self.current
                self.before = (games + c.finished, moves + c.moves_done, visits + c.visits_done)
            self.current = sp
        now = time.perf_counter()
        if self.bar is None or (now - self.last < 0.5 and not final):
            return
        self.last = now
        elapsed = now - self.start
        games, moves, visits = self.before
        moves, visits = moves + sp.moves_done, visits + sp.visits_done
        rates = f"{moves / elapsed:,.0f} moves/s  {visits / elapsed:,.0f} visits/s"
        self.bar.update(self.task, completed=games + sp.finished, rates=rates)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


@dataclasses.dataclass(frozen=True)
class Shard:
    """One shard of a generation's games: its share of the games and its own seed."""

    index: int
    count: int  # the generation's shards
    games: int
    seed: int

    def game_id(self, generation: int, run_seed: int, game: int) -> str:
        """A game's id: unique in the run (one shard: the ids of runs made before shards)."""
        shard = f"k{self.index}-" if self.count > 1 else ""
        return f"g{generation}-s{run_seed}-{shard}{game:06d}"


def shard_plan(params: SelfPlayParams, generation: int) -> list[Shard]:
    """The generation's shards: the games split as evenly as they go, each shard's seed from
    (run seed, generation, shard), so that its games do not depend on where it runs or on
    what runs beside it. One shard keeps the generation's seed of runs made before shards."""
    count = params.shards
    each, extra = divmod(params.games, count)
    return [
        Shard(k, count, each + (k < extra), _shard_seed(params.seed, generation, k, count))
        for k in range(count)
    ]


def _shard_seed(seed: int, generation: int, shard: int, count: int) -> int:
    return game_seed(seed, generation) if count == 1 else game_seed(seed, generation, shard)


@dataclasses.dataclass
class ShardResult:
    """What a shard sends back: its files as bytes (no shared filesystem needed) and its
    figures."""

    index: int
    parquet: list[bytes]  # its Parquet files' bytes, in order
    sgf: dict[str, bytes]  # game id -> the game's SGF
    stats: _Stats
    moves: int
    visits: int
    evaluations: int
    seconds: float  # playing, where it ran
    model_id: str
    worker: str  # host:pid that played it


def play_shard(
    *,
    index: int,
    params: Params,
    generation: int,
    shard: Shard,
    model: bytes | None,
    source: str = "",
    threads: int | None = None,
    on_step: Callable[[SelfPlay], None] | None = None,
) -> ShardResult:
    """Play one shard's games with the champion's checkpoint `model` (bytes read from the
    file `source`, named in errors; None: uniform priors) and return its rows as Parquet
    bytes and its games as SGF. `threads` sets torch's and numba's threads (a shard on a Dask
    worker: cluster.worker_threads); `on_step` follows the games (this process's bar)."""
    start = time.perf_counter()
    on_worker(threads)
    device, sp_params = params.device, params.selfplay
    net, model_id = evaluator_from_bytes(
        model, source=source, device=device, seed=shard.seed, compile=sp_params.compile
    )
    sp = SelfPlay(
        sp_params.config(), net, games=shard.games, slots=sp_params.slots, seed=shard.seed,
        device=device,
    )  # fmt: skip
    if on_step is not None:
        sp.on_step = on_step
    files: list[bytes] = []
    sgf: dict[str, bytes] = {}
    stats = _Stats()
    pending: list[tuple[FinishedGame, str]] = []
    pending_rows = 0
    for game in sp.run():
        game_id = shard.game_id(generation, sp_params.seed, game.info.index)
        sgf[game_id] = write_sgf(sgf_record(game, game_id, model_id, generation))
        stats.add(game)
        pending.append((game, game_id))
        pending_rows += len(game.rows["turn"])
        if pending_rows >= sp_params.rows_per_shard:
            files.append(shard_bytes(_table(pending, generation, model_id)))
            pending, pending_rows = [], 0
    if pending or not files:  # a shard whose games left no row still has its (empty) file
        files.append(shard_bytes(_table(pending, generation, model_id)))
    if on_step is not None:
        on_step(sp, final=True)
    return ShardResult(
        index=index, parquet=files, sgf=sgf, stats=stats, moves=sp.moves_done,
        visits=sp.visits_done, evaluations=sp.evaluations,
        seconds=time.perf_counter() - start, model_id=model_id,
        worker=worker_name(),
    )  # fmt: skip


def run(
    params: Params,
    io: SelfPlayIO,
    *,
    cluster: ClusterParams = IN_PROCESS,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Play the generation's games, its shards wherever `cluster` says (stages.fanout); write
    shards, SGFs and metrics. Returns the metrics."""
    plan = shard_plan(params.selfplay, io.generation)
    model = io.model.read_bytes() if io.model is not None else None
    here = cluster.address is None
    bar = _Progress(params.selfplay.games, progress and here)
    where = {"on_step": bar} if here else {"threads": cluster.worker_threads}
    calls = [
        dict(index=s.index, params=params, generation=io.generation, shard=s, model=model,
             source=str(io.model),
             **where)
        for s in plan
    ]  # fmt: skip
    start = time.perf_counter()
    with output_dir(io.out) as tmp, contextlib.closing(bar):
        results = fan_out(
            play_shard, calls, cluster=cluster, name=f"selfplay gen-{io.generation}", log=log
        )
        for i, data in enumerate(f for r in results for f in r.parquet):
            write_bytes(data, tmp / f"part-{i}.parquet")
        for r in results:
            for game_id, record in r.sgf.items():
                write_bytes(record, tmp / "sgf" / f"{game_id}.sgf")
        shards = manifest_entries(list_shards(tmp))
        write_json({"generation": io.generation, "files": shards}, tmp / layout.MANIFEST)
        seconds = time.perf_counter() - start
        metrics = _metrics(results, seconds)
        metrics.update(
            generation=io.generation, model_id=results[0].model_id,
            shards=len(plan),
        )  # fmt: skip
        if len(plan) == 1:  # the generation's seed (runs made before shards had it too)
            metrics["seed"] = plan[0].seed
        else:
            metrics["shard_seeds"] = [shard.seed for shard in plan]
        if not here:
            metrics.update(
                cluster=cluster.address, workers=len({r.worker for r in results}),
                shard_workers=[r.worker for r in results],
                shard_seconds=round(sum(r.seconds for r in results), 2),
            )  # fmt: skip
    write_json(metrics, io.metrics)
    return metrics


@dataclasses.dataclass
class _Stats:
    """The generation's metrics: games (side positions counted apart), rows, results."""

    games: int = 0
    sides: int = 0
    rows: int = 0
    side_rows: int = 0
    full_rows: int = 0
    moves: int = 0
    black_wins: int = 0
    draws: int = 0
    forks: int = 0
    handicap: int = 0
    decided: int = 0

    def add(self, game: FinishedGame) -> None:
        info = game.info
        rows = len(game.rows["turn"])
        self.rows += rows
        self.full_rows += int((game.rows["policy_weight"] > 0).sum())
        if info.side_of >= 0:
            self.sides += 1
            self.side_rows += rows
            return
        self.games += 1
        self.moves += len(info.moves)
        self.black_wins += info.black_lead > 0
        self.draws += info.black_lead == 0
        self.forks += info.fork_turn >= 0
        self.handicap += info.handicap > 0
        self.decided += info.decided_at >= 0

    def __add__(self, other: _Stats) -> _Stats:
        pairs = zip(dataclasses.astuple(self), dataclasses.astuple(other), strict=True)
        return _Stats(*(a + b for a, b in pairs))


def _metrics(results: list[ShardResult], seconds: float) -> dict:
    s = sum((r.stats for r in results), _Stats())
    moves = sum(r.moves for r in results)
    visits = sum(r.visits for r in results)
    evaluations = sum(r.evaluations for r in results)
    g = max(s.games, 1)
    return {
        "games": s.games,
        "rows": s.rows,
        "rows_with_policy_target": s.full_rows,
        "side_positions": s.sides,
        "side_position_rows": s.side_rows,
        "mean_game_length": round(s.moves / g, 2),
        "black_win_rate": round(s.black_wins / g, 4),
        "draw_rate": round(s.draws / g, 4),
        "early_fork_games": s.forks,
        "handicap_games": s.handicap,
        "decided_games": s.decided,
        "seconds": round(seconds, 2),
        "moves_per_s": round(moves / seconds, 2),
        "visits_per_s": round(visits / seconds, 2),
        "evaluations_per_s": round(evaluations / seconds, 2),
    }


def game_columns(info) -> dict:
    """A finished game's own columns of its rows (stages.rows): how long it was, how it ended
    (two passes in a row, the move limit, or a side position's stop), its first pass."""
    moves = np.asarray(info.moves)
    passes = np.flatnonzero(moves == PASS)
    if info.side_of >= 0:
        end = "side"
    elif len(moves) >= 2 and moves[-1] == PASS and moves[-2] == PASS:
        end = "passes"
    else:
        end = "move_limit"
    return {
        "rules": info.rules,
        "komi": info.komi,
        "game_length": len(moves),
        "game_end": end,
        "first_pass": int(passes[0]) if len(passes) else -1,
        "handicap": info.handicap,
    }


def _table(pending, generation: int, model_id: str):
    """The rows of these finished games as one table (stages.rows' schema)."""
    if not pending:
        return SCHEMA.empty_table()
    cols = {name: np.concatenate([g.rows[name] for g, _ in pending]) for name in pending[0][0].rows}
    lengths = [len(g.rows["turn"]) for g, _ in pending]
    per_game = [dict(game_columns(g.info), game_id=gid) for g, gid in pending]
    games = {k: np.repeat([c[k] for c in per_game], lengths) for k in per_game[0]}
    return table_from_columns(cols, games, generation=generation, model_id=model_id)


def main(argv: list[str] | None = None) -> int:
    p = cli.parser("selfplay", __doc__)
    p.add_argument(
        "--model",
        default=None,
        help="a checkpoint, or 'uniform' (default: the previous generation's champion)",
    )
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--metrics", type=Path, default=None)
    p.add_argument("--games", type=int, default=None, help="override selfplay.games")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)

    def work(tracked):
        params, io = prepare(
            args.params, args.generation, model=args.model, out=args.out,
            metrics=args.metrics, games=args.games,
        )  # fmt: skip
        cluster = cluster_params(args.params)
        cli.set_threads(params.selfplay.threads)
        log = functools.partial(print, "selfplay:", file=sys.stderr, flush=True)
        metrics = run(params, io, cluster=cluster, progress=not args.quiet, log=log)
        if tracked is not None:
            track(tracked, io, metrics)
        return metrics

    return cli.finish("selfplay", work, Params, params=args.params, generation=args.generation)


def track(tracked, io: SelfPlayIO, metrics: dict) -> None:
    """Lineage: the model that played (its checkpoint's digest) and the data it made."""
    tracked.tag(
        {
            "tengen.model_sha256": tracking.model_digest(io.model),
            "tengen.model_id": metrics.get("model_id"),
            "tengen.data_sha256": tracking.data_digest(io.out),
            "tengen.data": str(io.out),
        }
    )
    tracked.log_artifact(io.metrics)


if __name__ == "__main__":
    sys.exit(main())
