"""The gate: generation N's candidate plays the champion; it passes with at least
`win_fraction` of the games (the paper: 100 wins of 200). Colours alternate. Games are played
`slots` at a time, and with `early_stop` the gate ends as soon as the decision cannot change.

    python -m stages.gate --generation N [--candidate models/gen-N/ema/candidate.pt]
        [--champion models/gen-(N-1)/champion/champion.pt] [--out reports/gate/gen-N]
        [--decision reports/gate/gen-N.json]

Without a champion (before the first promotion) the candidate plays generation 0's uniform
priors. Each batch of `slots` games is a shard that runs where params.yaml's `cluster:` says
(stages.fanout), with the same games and decision anywhere. Writes the games to
reports/gate/gen-N/sgf/ (atomically), then the decision to
reports/gate/gen-N.json (games, wins, draws, win rate, passed: a metrics file for DVC).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from pathlib import Path

import numpy as np

from gocore.arena import MatchGame, play_match
from gocore.atomic import output_dir, write_json
from gocore.board import PASS, point_xy
from gocore.rules import PRESETS
from nets.checkpoint import CheckpointError, load
from nets.model import parameter_count
from play.models import evaluator_from_bytes
from play.sgf import GameRecord, save_sgf
from stages import cli, layout
from stages.champions import previous_champion
from stages.cli import InputError
from stages.fanout import IN_PROCESS, cluster_params, fan_out, on_worker, worker_name
from stages.params import ClusterParams, Device, GateParams, Section, read
from stages.spec import DvcStage, Plan, sections
from stages.tracking import model_digest


class Params(Section):
    """What the gate reads of params.yaml."""

    gate: GateParams
    device: Device


@dataclasses.dataclass(frozen=True)
class GateIO:
    generation: int
    candidate: Path
    champion: Path | None  # None: the uniform priors of generation 0
    out: Path  # reports/gate/gen-N: the games (sgf/)
    decision: Path  # reports/gate/gen-N.json
    # Why the candidate cannot be promoted whatever it scores (a champion of a bigger net):
    # then no games are played and the decision says so.
    skip: str | None = None


def dvc(n: int, plan: Plan) -> list[DvcStage]:
    """One gate per net training in generation n (stages.lines); none with gate.games 0."""
    if not plan.gated:
        return []
    champion = (str(layout.champion_dir(n - 1)),) if n > 0 else ()
    out = []
    for line in plan.active(n):
        net = line.grown
        flag = "" if line.primary else f" --net {line.net}"
        out.append(DvcStage(
            line.stage("gate", n), "stages.gate", f"--generation {n}{flag}", sections(Params),
            deps=(str(layout.ema_dir(n, net)), *champion), outs=(str(layout.gate_games(n, net)),),
            metrics=(str(layout.gate_report(n, net)),),
        ))  # fmt: skip
    return out


def decided(wins: float, played: int, games: int, needed: float) -> bool | None:
    """True or False once the gate's outcome cannot change, else None."""
    if wins >= needed:
        return True
    if wins + (games - played) < needed:
        return False
    return None


@dataclasses.dataclass(frozen=True)
class Batch:
    """`count` games from game number `first`, played at once: the gate's unit of work (one
    shard on a cluster). Fixed by gate.games and gate.slots alone, and seeded from the run's
    gate seed, the generation and `first`, so its games do not depend on where it ran."""

    index: int
    first: int
    count: int

    def seed(self, params: GateParams, generation: int) -> int:
        return int(
            np.random.SeedSequence([params.seed, generation, self.first]).generate_state(1)[0]
        )


def batches(params: GateParams) -> list[Batch]:
    firsts = range(0, params.games, params.slots)
    return [Batch(i, f, min(params.slots, params.games - f)) for i, f in enumerate(firsts)]


class Tally:
    """The candidate's score over games counted in order, and whether the gate is decided
    (with early_stop: as soon as the rest of the games cannot change the outcome)."""

    def __init__(self, params: GateParams):
        self.params = params
        self.needed = params.win_fraction * params.games
        self.games: list[MatchGame] = []
        self.wins = 0.0

    @property
    def decided(self) -> bool:
        if not self.games:  # one batch at least, whatever win_fraction (0: every one passes)
            return False
        if len(self.games) >= self.params.games:
            return True
        return self.params.early_stop and (
            decided(self.wins, len(self.games), self.params.games, self.needed) is not None
        )

    def add(self, games: list[MatchGame]) -> None:
        self.games += games
        self.wins += sum(g.a_result for g in games)


@dataclasses.dataclass
class BatchResult:
    index: int
    games: list[MatchGame]  # none: not played, the gate was decided before it
    candidate_id: str
    champion_id: str
    seconds: float
    worker: str


def play_batch(
    *,
    index: int,
    params: Params,
    generation: int,
    batch: Batch,
    candidate: bytes,
    champion: bytes | None,
    sources: tuple[str, str],
    threads: int | None = None,
    tally: Tally | None = None,
) -> BatchResult:
    """A batch of gate games between the checkpoints' bytes (champion None: uniform priors),
    read from the files `sources` (named in errors).
    In the stage's process `tally` is the gate's running score: a batch after the decision
    plays nothing. `threads`: a cluster worker's torch and numba threads."""
    start = time.perf_counter()
    on_worker(threads)
    device, gate = params.device, params.gate
    a, a_id = evaluator_from_bytes(
        candidate, source=sources[0], device=device, compile=gate.compile
    )
    b, b_id = evaluator_from_bytes(
        champion, source=sources[1], device=device, seed=gate.seed, compile=gate.compile
    )
    games = []
    if tally is None or not tally.decided:  # the ids above, even for a batch not played
        games = play_match(
            a, b, (np.arange(batch.first, batch.first + batch.count) % 2) == 0,
            size=gate.board_size, rules=PRESETS[gate.rules].with_komi(gate.komi),
            visits=gate.visits, params=gate.search.params(),
            leaves_per_game=gate.leaves_per_game, seed=batch.seed(gate, generation),
            temperature_start=gate.temperature_start, temperature_end=gate.temperature_end,
            max_moves_per_area=gate.max_moves_per_area, considered=gate.search.considered,
            device=device,
        )  # fmt: skip
        if tally is not None:
            tally.add(games)
    return BatchResult(
        index, games, a_id, b_id, time.perf_counter() - start,
        worker_name(),
    )  # fmt: skip


def run(params: Params, io: GateIO, *, cluster: ClusterParams = IN_PROCESS, log=None) -> dict:
    """Play the gate's batches wherever `cluster` says (stages.fanout) and decide. On a
    cluster every batch is played and the decision read from them in order, so the games
    kept and the decision are the stage's in one process (early_stop saves no compute there)."""
    gate = params.gate
    if not io.candidate.is_file():
        raise InputError(f"gate: {io.candidate} does not exist; run the ema stage first")
    if io.skip:
        with output_dir(io.out):
            pass
        decision = {
            "generation": io.generation, "candidate": str(io.candidate),
            "champion": str(io.champion), "games": 0, "games_planned": gate.games,
            "candidate_wins": 0.0, "draws": 0, "win_rate": None, "needed": 0.0,
            "passed": False, "stopped_early": False, "skipped": io.skip,
        }  # fmt: skip
        write_json(decision, io.decision)
        return decision
    if gate.games == 0:
        raise InputError("gate.games is 0: no gate to play (dvc.yaml has no gate stage then)")
    here = cluster.address is None
    candidate = io.candidate.read_bytes()
    champion = io.champion.read_bytes() if io.champion is not None else None
    where = {"tally": Tally(gate)} if here else {"threads": cluster.worker_threads}
    calls = [
        dict(index=b.index, params=params, generation=io.generation, batch=b,
             candidate=candidate, champion=champion,
             sources=(str(io.candidate), str(io.champion)), **where)
        for b in batches(gate)
    ]  # fmt: skip
    results = fan_out(play_batch, calls, cluster=cluster, name=f"gate gen-{io.generation}", log=log)
    tally = Tally(gate)
    for r in results:
        if tally.decided:
            break
        tally.add(r.games)
    games, wins = tally.games, tally.wins
    candidate_id, champion_id = results[0].candidate_id, results[0].champion_id
    with output_dir(io.out) as tmp:
        for i, game in enumerate(games):
            save_sgf(
                _record(game, gate, candidate_id, champion_id, io.generation, i),
                tmp / "sgf" / f"game-{i:04d}.sgf",
            )
        decision = {
            "generation": io.generation,
            "candidate": candidate_id,
            "champion": champion_id,
            "games": len(games),
            "games_planned": gate.games,
            "candidate_wins": wins,
            "draws": sum(g.a_result == 0.5 for g in games),
            "win_rate": round(wins / len(games), 4),
            "needed": tally.needed,
            "passed": bool(wins >= tally.needed),
            "stopped_early": len(games) < gate.games,
        }
        if not here:
            decision.update(
                cluster=cluster.address, workers=len({r.worker for r in results}),
                shard_workers=[r.worker for r in results],
                games_played=sum(len(r.games) for r in results),
            )  # fmt: skip
    write_json(decision, io.decision)
    return decision


def _record(game: MatchGame, params: GateParams, a: str, b: str, gen: int, i: int) -> GameRecord:
    lead = game.black_lead
    return GameRecord(
        size=params.board_size,
        komi=params.komi,
        rules=params.rules,
        moves=[
            (int(c), None if p == PASS else point_xy(game.stride, int(p)))
            for c, p in zip(game.colors, game.moves, strict=True)
        ],
        result="0" if lead == 0 else f"B+{lead:g}" if lead > 0 else f"W+{-lead:g}",
        black=a if game.a_is_black else b,
        white=b if game.a_is_black else a,
        root_comment=f"tengen gate, generation {gen}, game {i}",
    )


def prepare(
    params_path,
    generation: int,
    *,
    candidate=None,
    champion=None,
    out=None,
    decision=None,
    net: str | None = None,
) -> tuple[Params, GateIO]:
    """The gate's parameters and paths: train.net's candidate, or with `net` that grown
    net's (stages.lines). A candidate smaller than the champion is not played: promote
    never goes back to a smaller net."""
    params = read(params_path, Params)
    candidate = Path(candidate or layout.candidate(generation, net))
    if champion is None:
        champion = previous_champion(generation, "gate")
    skip = None
    if champion and candidate.is_file():
        try:
            held, challenger = load(Path(champion))[0], load(candidate)[0]
        except CheckpointError as e:
            raise InputError(f"gate: {e}; rerun the stage that wrote it") from None
        # The nets' own counts: a size without global pooling has more than its name's.
        if parameter_count(held) > parameter_count(challenger):
            skip = (f"the champion is a {held.config.name}, bigger than this "
                    f"{challenger.config.name}")  # fmt: skip
    io = GateIO(
        generation=generation,
        candidate=candidate,
        champion=Path(champion) if champion else None,
        out=Path(out or layout.gate_games(generation, net)),
        decision=Path(decision or layout.gate_report(generation, net)),
        skip=skip,
    )
    return params, io


def main(argv: list[str] | None = None) -> int:
    p = cli.parser("gate", __doc__)
    p.add_argument("--candidate", type=Path, default=None)
    p.add_argument("--champion", type=Path, default=None, help="none: uniform priors")
    p.add_argument("--out", type=Path, default=None, help="the games: reports/gate/gen-N")
    p.add_argument("--decision", type=Path, default=None, help="reports/gate/gen-N.json")
    p.add_argument("--net", default=None, help="a grown net of run.grow (default: train.net)")
    args = p.parse_args(argv)

    def work(tracked):
        params, io = prepare(
            args.params, args.generation, candidate=args.candidate, champion=args.champion,
            out=args.out, decision=args.decision, net=args.net,
        )  # fmt: skip
        cli.set_threads(params.gate.threads)
        decision = run(
            params,
            io,
            cluster=cluster_params(args.params),
            log=functools.partial(print, "gate:", file=sys.stderr, flush=True),
        )
        if tracked is not None:
            track(tracked, io)
        return decision

    return cli.finish(
        "gate", work, Params, params=args.params, generation=args.generation, net=args.net
    )


def track(tracked, io: GateIO) -> None:
    """Which models played (checkpoint digests), the decision and the games."""
    tracked.tag(
        {
            "tengen.candidate_sha256": model_digest(io.candidate),
            "tengen.champion_sha256": model_digest(io.champion),
        }
    )
    tracked.log_artifact(io.decision)
    tracked.log_artifact(io.out, "games")


if __name__ == "__main__":
    sys.exit(main())
