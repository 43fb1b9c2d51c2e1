"""The promote stage: after generation N's gate, the champion that generation N + 1's
self-play and gate use. A candidate that passed its gate becomes the champion; otherwise the
previous champion stays (none before the first promotion: self-play keeps uniform priors).

    python -m stages.promote --generation N [--candidate models/gen-N/ema/candidate.pt]
        [--decision reports/gate/gen-N.json] [--previous models/gen-(N-1)/champion]
        [--out models/gen-N/champion]

Writes models/gen-N/champion/champion.pt (when there is a champion) and promotion.json (the
champion's id, the generation it was promoted in, this generation's gate decision, and the
line of champions so far), atomically. Each generation has its own champion folder, so every
generation's pipeline outputs stay apart (what DVC needs) and any champion can be found again.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import sys
from pathlib import Path

from gocore.atomic import output_dir, sha256_file, write_json
from nets.checkpoint import load
from nets.model import parameter_count
from stages import cli, data, layout
from stages.champions import champion_in
from stages.cli import InputError
from stages.lines import size_of
from stages.params import Section
from stages.spec import DvcStage, Plan, sections
from stages.tracking import model_digest

CHAMPION = layout.CHAMPION
PROMOTION = layout.PROMOTION


class Params(Section):
    """What promote reads of params.yaml: nothing (its decisions come from the gates)."""


@dataclasses.dataclass(frozen=True)
class PromoteIO:
    generation: int
    candidate: Path  # models/gen-N/ema/candidate.pt
    decision: Path | None  # reports/gate/gen-N.json; None: no gate (gate.games 0)
    out: Path  # models/gen-N/champion
    previous: Path | None = None  # models/gen-(N-1)/champion
    # The run's history, one row per generation, for DVC's plots: reports/history/gen-N.json
    # (None: not written), from reports/{selfplay,train}/gen-N.json and the row list before.
    history: Path | None = None
    # Generation N's checkpoints by SHA-256 (reports/lineage/gen-N.json; None: not written):
    # what a player checks a checkpoint from MLflow against (stages.champions.check_against).
    lineage: Path | None = None
    reports: Path = layout.REPORTS
    # The grown nets' candidates of this generation (stages.lines), beside train.net's above.
    grown: tuple[Contender, ...] = ()


@dataclasses.dataclass(frozen=True)
class Contender:
    """A grown net's candidate (stages.lines)."""

    net: str
    candidate: Path  # models/gen-N/<net>/ema/candidate.pt
    decision: Path | None  # reports/gate/gen-N-<net>.json; None: no gate
    train_report: Path  # reports/train/gen-N-<net>.json


def dvc(n: int, plan: Plan) -> list[DvcStage]:
    """Generation n's promotion: what every net's gate decided, among their candidates."""
    judged = []
    for line in plan.active(n):
        net = line.grown
        gate = [layout.gate_report(n, net)] if plan.gated else []
        judged += [*gate, layout.ema_dir(n, net), layout.train_report(n, net)]
    before = [layout.champion_dir(n - 1), layout.history(n - 1)] if n > 0 else []
    grown = ",".join(line.net for line in plan.active(n) if not line.primary)
    flags = (f" --grown {grown}" if grown else "") + ("" if plan.gated else " --ungated")
    return [
        DvcStage(
            f"promote-{n}", "stages.promote", f"--generation {n}{flags}", sections(Params),
            deps=tuple(
                str(p)
                for p in [*judged, layout.selfplay_report(n), layout.data_report(n), *before]
            ),
            outs=(
                str(layout.champion_dir(n)),
                {str(layout.history(n)): {"cache": False}},
                {str(layout.lineage(n)): {"cache": False}},
            ),
            result=str(layout.promotion(n)),
        )
    ]  # fmt: skip


def _read_json(path: Path, stage: str) -> dict:
    return cli.read_report(path, "promote", f"the {stage} stage")


# The decision of a candidate without a gate (gate.games 0): promoted, as in KataGo's runs.
UNGATED = {
    "games": 0, "candidate_wins": 0.0, "draws": 0, "win_rate": None, "needed": 0.0,
    "passed": True, "stopped_early": False, "skipped": "no gate (gate.games 0)",
}  # fmt: skip


def run(params: Params, io: PromoteIO) -> dict:
    """The champion after generation N: the biggest candidate (by parameters) that passed its
    gate (every candidate, without gates) and is not smaller than the champion, else the
    champion before."""
    train_report = layout.in_reports(io.reports, layout.train_report(io.generation))
    primary = Contender("", io.candidate, io.decision, train_report)
    contenders = [primary, *io.grown]
    decisions = {}
    for c in contenders:
        decisions[c] = UNGATED if c.decision is None else _read_json(c.decision, "gate")
        if "passed" not in decisions[c]:
            raise InputError(f"promote: {c.decision} has no `passed`; rerun the gate stage")
    previous = {"champion": None, "line": []}
    if io.previous is not None:
        previous = _read_json(io.previous / PROMOTION, "promote stage of the previous generation's")
    floor = _champion_size(previous["champion"], io.previous)
    passed = []
    for c in contenders:
        if decisions[c]["passed"]:
            if not c.candidate.is_file():
                raise InputError(f"promote: {c.candidate} does not exist; run the ema stage first")
            model, meta = load(c.candidate)  # refuses a corrupt or foreign file
            size = parameter_count(model)  # not its size's: it may lack global pooling
            if size >= floor:
                passed.append((size, c, model.config.name, meta))
    best = max(passed, key=lambda p: p[0]) if passed else None
    chosen = best[1] if best else None
    played = [c for c in contenders if not decisions[c].get("skipped")]
    deciding = chosen or (played[-1] if played else primary)
    rows = None
    if io.history is not None:
        rows = history(io, decisions[deciding], chosen is not None, deciding.train_report)
    lineage = {"generation": io.generation, **digests(io, contenders, chosen, previous)}
    with output_dir(io.out) as tmp:
        if best is not None:
            size, chosen, net, meta = best
            shutil.copyfile(chosen.candidate, tmp / CHAMPION)
            champion = {
                "id": meta.get("model_id") or f"gen-{io.generation}-{net}",
                "generation": io.generation,
                "source": str(chosen.candidate),
                "net": net,
                "parameters": size,
            }
            line = [*previous["line"], champion]
        else:
            champion = previous["champion"]
            line = previous["line"]
            source = champion_in(io.previous) if io.previous is not None else None
            if champion is not None:
                if source is None:
                    raise InputError(
                        f"promote: {io.previous} names champion {champion['id']} but has no "
                        f"{CHAMPION}; rerun the previous generation's promote stage"
                    )
                shutil.copyfile(source, tmp / CHAMPION)
        promotion = {
            "generation": io.generation,
            "promoted": chosen is not None,
            "champion": champion,
            "decision": decisions[deciding],
            "decisions": {c.net or "train.net": decisions[c] for c in contenders},
            "line": line,
        }
        write_json(promotion, tmp / PROMOTION)
    if rows is not None:
        write_json(rows, io.history)
    if io.lineage is not None:
        write_json(lineage, io.lineage)
    return {
        "generation": io.generation,
        "promoted": promotion["promoted"],
        "champion": champion["id"] if champion else None,
        "champion_net": champion.get("net") if champion else None,
    }


def digests(io: PromoteIO, contenders: list[Contender], chosen, previous: dict) -> dict:
    """The SHA-256 of generation N's champion (`champion_sha256`, none before the first
    promotion) and of each of its candidates (`candidate_sha256`, `candidate_sha256_<net>`
    for a grown net's): the run's lineage in its git, against which a player checks a
    checkpoint fetched from MLflow (stages.champions.check_against). Not in the history rows,
    whose string values DVC's plots cannot draw."""
    out = {}
    if chosen is not None:
        out["champion_sha256"] = sha256_file(chosen.candidate)
    elif previous["champion"] is not None and io.previous is not None:
        source = champion_in(io.previous)
        if source is not None:
            out["champion_sha256"] = sha256_file(source)
    for c in contenders:
        if c.candidate.is_file():
            out["candidate_sha256" + (f"_{c.net}" if c.net else "")] = sha256_file(c.candidate)
    return out


def _champion_size(champion: dict | None, folder: Path | None) -> int:
    """The champion's parameter count (-1: none yet, so any candidate may be promoted)."""
    if champion is None:
        return -1
    if "parameters" in champion:
        return champion["parameters"]
    path = champion_in(folder) if folder is not None else None
    if path is not None:  # a promotion.json from before parameters were recorded
        return parameter_count(load(path)[0])
    return size_of(champion["net"]) if champion.get("net") else -1


def elo_gain(wins: float, games: int) -> float:
    """The candidate's Elo over the champion from its gate score, (wins + 1/2) / (games + 1)
    so that a clean sweep stays finite."""
    p = (wins + 0.5) / (games + 1)
    return 400.0 * math.log10(p / (1 - p))


def history(io: PromoteIO, decision: dict, promoted: bool, train_report: Path) -> list[dict]:
    """The rows so far plus generation N's: self-play, window, losses, gate, and the
    champion's Elo (uniform priors = 0, each promotion adding its candidate's gate Elo)."""
    n = io.generation
    rows = []
    if n > 0:
        rows = _read_json(layout.in_reports(io.reports, layout.history(n - 1)), "promote")
    selfplay = _read_json(layout.in_reports(io.reports, layout.selfplay_report(n)), "selfplay")
    train = _read_json(train_report, "train")
    figures = layout.in_reports(io.reports, layout.data_report(n))  # none from older runs
    quality = data.history_row(_read_json(figures, "shuffle")) if figures.exists() else {}
    gain = elo_gain(decision["candidate_wins"], decision["games"]) if decision["games"] else 0.0
    before = rows[-1]["champion_elo"] if rows else 0.0
    loss = train.get("loss", {})
    row = {
        "generation": n,
        "selfplay_games": selfplay.get("games"),
        "selfplay_rows": selfplay.get("rows"),
        "window_rows": train.get("window_rows"),
        "samples_total": train.get("samples_total"),
        **quality,
        **{f"loss_{k}": v for k, v in loss.items()},
        "gate_games": decision["games"],
        "gate_win_rate": decision["win_rate"],
        "promoted": int(promoted),
        "elo_gain": round(gain, 1),
        "champion_elo": round(before + gain if promoted else before, 1),
    }
    return [*rows, row]


def main(argv: list[str] | None = None) -> int:
    p = cli.parser("promote", __doc__)
    p.add_argument("--candidate", type=Path, default=None)
    p.add_argument("--decision", type=Path, default=None)
    p.add_argument("--previous", type=Path, default=None, help="models/gen-(N-1)/champion")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--history", type=Path, default=None, help="reports/history/gen-N.json")
    p.add_argument("--ungated", action="store_true",
                   help="no gate ran (gate.games 0): every candidate is promoted")  # fmt: skip
    p.add_argument(
        "--grown", type=lambda v: [x for x in v.split(",") if x], default=[],
        help="the grown nets training in this generation, comma-separated (run.grow)",
    )  # fmt: skip
    args = p.parse_args(argv)
    n = args.generation

    def work(tracked):
        def gate(net=None):
            return None if args.ungated else layout.gate_report(n, net)

        grown = tuple(
            Contender(net, layout.candidate(n, net), gate(net), layout.train_report(n, net))
            for net in args.grown
        )
        io = PromoteIO(
            generation=n,
            candidate=args.candidate or layout.candidate(n),
            decision=args.decision or gate(),
            out=args.out or layout.champion_dir(n),
            previous=args.previous or (layout.champion_dir(n - 1) if n else None),
            history=args.history or layout.history(n),
            lineage=layout.lineage(n),
            grown=grown,
        )
        metrics = run(Params(), io)
        if tracked is not None:
            track(tracked, io, metrics)
        return metrics

    return cli.finish("promote", work, Params, params=args.params, generation=n)


def track(tracked, io: PromoteIO, metrics: dict) -> None:
    """A promoted candidate's registered version gets the alias `champion`."""
    tracked.log_artifact(io.out / PROMOTION)
    path = champion_in(io.out)
    if path is None:
        return
    digest = model_digest(path)
    tracked.tag({"tengen.champion_sha256": digest})
    if not metrics["promoted"]:
        return
    found = tracked.tracker.version_of(digest)
    if found is None:
        # Where results are logged does not change them: the promotion stands, untracked.
        print(
            f"promote: warning: the new champion {path} was never logged to MLflow (the ema "
            f"stage ran with tracking off, or against another store); no `champion` alias",
            file=sys.stderr,
        )
        tracked.tag({"tengen.champion_unregistered": "true"})
        return
    version = found.version
    client, name = tracked.client, tracked.tracker.model_name
    client.set_registered_model_alias(name, "champion", version)
    client.set_model_version_tag(name, version, "tengen.promoted_generation", str(io.generation))
    tracked.tag({"tengen.model_version": version})


if __name__ == "__main__":
    sys.exit(main())
