"""`tengen ablate`: the KataGo paper's ablations (Wu 2019, section 5.2) as one command.

An ablation runs arms of the same run side by side: each arm is a run folder of its own
(runs/ablate-<name>/<arm>, a git repository with DVC, like a preset's) whose params.yaml is the
base's with the arm's changes on top. The arms get the same self-play compute, counted in
network evaluations rather than generations (an arm with cheaper searches plays more
generations): the budget is cut into `points` equal steps, and at each step every arm grows,
one generation at a time, until its self-play has spent that many evaluations; then the
champion of that generation plays the evaluation ladder (the base's `evaluate` section, the
same opponents and games for every arm; earlier champions do not play). The Elo of every point
of every arm comes from one Bradley-Terry fit over all the arms' evaluation games (joint_fit):
the ladder's fixed opponents are common players, so the arms are rated on one scale, and a
handicap rung or the random player tells two arms apart that both lose every even game to the
anchor (each arm's own evaluate stage fits that arm's games alone: it cannot).
The arms take turns step by step, so a stopped ablation leaves every arm at the same compute,
and `tengen ablate` again goes on from there (each arm's loop resumes by DVC).

The reference arm, `full`, is the paper's method: the PUCT root with forced playouts and
policy target pruning, playout cap randomization with rows of full searches only, global
pooling, the auxiliary targets and the Go-specific input features. Each other arm takes one
of them away, or (`gumbel`) puts Gumbel MuZero's root in place of PUCT's.

What a user sees:
- MLflow (runs/ablate-<name>/mlflow.db, `tengen ui --repo runs/ablate-<name>/full` or
  `mlflow ui --backend-store-uri sqlite:///runs/ablate-<name>/mlflow.db`): experiment
  `ablate-<name>` (tagged as model training, so the UI opens on its runs) with one run per arm
  whose `elo` metric is logged with the self-play evaluations spent as its step: the compare
  view of the arms draws Elo against compute for all of them in one chart. A point's `elo` is
  the fit over every arm's games when it was logged (`elo_arm`: the arm's own fit);
  report.json, elo.png and `--report` fit again with every game. The arms' own stage runs
  are in experiments `ablate-<name>/<arm>` of the same store.
- runs/ablate-<name>/elo.png (also an artifact of every arm's run) and a DVC plot
  (`cd runs/ablate-<name> && dvc plots show`): each arm's points/<arm>.json.
- `tengen ablate --name <name> --report`: each arm's acceleration factor against the full
  method (ablate.acceleration).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable
from pathlib import Path

import yaml
from prefect import flow, get_run_logger

from gocore.atomic import write_json, write_text
from stages import layout
from stages.params import ParamsError, load_params
from stages.vega import install_dvc_template

REFERENCE = "full"
# The arms of the paper's section 5.2, and ours. A fixed cap is `fixed-cap-<visits>`.
ARMS: dict[str, tuple[str, dict]] = {
    REFERENCE: (
        "the KataGo paper's method: PUCT root, forced playouts and pruning, playout cap "
        "randomization, global pooling, every target, the Go-specific features",
        {},
    ),
    "no-forced-playouts": (
        "without forced playouts and policy target pruning (k = 0)",
        {"selfplay": {"search": {"forced_playouts_k": 0.0}}},
    ),
    "no-global-pooling": (
        "without global pooling in the net's trunk (the heads still pool)",
        {"train": {"global_pooling": False}},
    ),
    "no-opponent-policy": (
        "without the opponent-policy target (its loss weight 0)",
        {"loss": {"opponent_policy": 0.0}},
    ),
    "no-ownership-score": (
        "without the ownership and score targets (their loss weights 0, and no score utility "
        "in the search, since the score head is no longer trained)",
        {
            "loss": {
                "ownership": 0.0,
                "score_pdf": 0.0,
                "score_cdf": 0.0,
                "score_mean": 0.0,
                "score_stdev": 0.0,
            },
            "selfplay": {"search": {"score_utility": 0.0}},
        },
    ),  # fmt: skip
    "no-go-features": (
        "without the Go-specific input features (liberties, ladders, pass-alive areas): the "
        "net sees the stones, ko, the move history and the rules",
        {"train": {"go_features": False}},
    ),
    "gumbel": (
        "ours: Gumbel MuZero's root search (sequential halving, completed-Q targets) in "
        "place of PUCT's",
        {"selfplay": {"search": {"root": "gumbel"}}},
    ),
}
FIXED_CAP = re.compile(r"^fixed-cap-(\d+)$")
# What every arm shares, as in the paper: a PUCT root unless the arm says otherwise, and
# rows of full searches only (so that a fixed cap's arm records no more value rows than the
# full method's); evaluations at the ablation's compute points only (Ablation.change).
COMMON = {"selfplay": {"search": {"root": "puct"}, "record_cheap_searches": False}}


class AblationError(ParamsError):
    """A bad ablation: an unknown arm, a folder made for other arms or another budget."""


def arm_names() -> list[str]:
    return [*ARMS, "fixed-cap-<visits>"]


def arm_change(name: str) -> tuple[str, dict]:
    """(what the arm is, its params.yaml changes on top of the base's)."""
    if name in ARMS:
        return ARMS[name]
    if m := FIXED_CAP.match(name):
        visits = int(m.group(1))
        if visits < 1:
            raise AblationError(f"arm {name}: the cap must be at least 1 visit")
        return (
            f"without playout cap randomization: every search {visits} visits, every move a "
            "policy target",
            {"selfplay": {"full_visits": visits, "full_probability": 1.0}},
        )
    raise AblationError(f"unknown arm {name!r}; arms: {', '.join(arm_names())}")


def _deep_merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        both = isinstance(v, dict) and isinstance(out.get(k), dict)
        out[k] = _deep_merge(out[k], v) if both else v
    return out


@dataclasses.dataclass(frozen=True)
class Ablation:
    name: str
    folder: Path  # runs/ablate-<name>
    arms: tuple[str, ...]  # the reference first
    budget: float  # self-play network evaluations per arm
    points: int  # compute points: budget * k / points, k = 1..points
    preset: str | None = None  # the base: params.yaml with this preset on top
    base: str | None = None  # the params.yaml the arms start from (None: the source tree's)

    @property
    def experiment(self) -> str:
        return f"ablate-{self.name}"

    def targets(self) -> list[float]:
        return [self.budget * (k + 1) / self.points for k in range(self.points)]

    def arm_folder(self, arm: str) -> Path:
        return self.folder / arm

    def store(self) -> str:
        return f"sqlite:///{(self.folder / 'mlflow.db').resolve()}"

    def change(self, arm: str) -> dict:
        """The arm's params.yaml changes: COMMON, the arm's, and where it logs."""
        _, change = arm_change(arm)
        logging = {
            "evaluate": {"every": 0, "at": [], "past_champions": 0},
            "mlflow": {
                "enabled": True,
                "tracking_uri": self.store(),
                "experiment": f"{self.experiment}/{arm}",
                "registered_model": f"tengen-{self.experiment}-{arm}",
            },
        }
        return _deep_merge(_deep_merge(COMMON, change), logging)

    def spec(self) -> dict:
        return {"name": self.name, "arms": list(self.arms), "budget": self.budget,
                "points": self.points, "preset": self.preset, "base": self.base}  # fmt: skip


SPEC = "ablation.json"


def open_ablation(
    name: str,
    arms: list[str] | None,
    *,
    budget: float | None,
    points: int | None,
    preset: str | None = None,
    base: str | Path | None = None,
    root: Path = Path("runs"),
) -> Ablation:
    """The ablation `name`: made from the arguments, or the one in runs/ablate-<name>, which
    the arguments given must agree with (a budget can only grow; arms can be added)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", name):
        raise AblationError(f"ablation name {name!r}: letters, digits, - and _ only")
    folder = root / f"ablate-{name}"
    spec_path = folder / SPEC
    old = None
    if spec_path.exists():
        try:
            old = json.loads(spec_path.read_text())
        except json.JSONDecodeError as e:
            raise AblationError(f"{spec_path}: not valid JSON ({e})") from None
    for arm in arms or []:
        arm_change(arm)  # an unknown arm is an error before anything runs
    if base is not None:
        base = Path(base).resolve()
        if not base.is_file():
            raise AblationError(f"--base {base}: no such params.yaml")
        base = str(base)
    if old is None:
        if budget is None or not budget > 0:
            raise AblationError("a new ablation needs --budget (self-play evaluations per arm)")
        if points is not None and points < 1:
            raise AblationError(f"--points must be at least 1 (got {points})")
        chosen = [REFERENCE] + [a for a in dict.fromkeys(arms or []) if a != REFERENCE]
        if len(chosen) < 2:
            raise AblationError(f"name at least one arm beside {REFERENCE}: {arm_names()}")
        return Ablation(name, folder, tuple(chosen), float(budget), points or 4, preset, base)
    if preset is not None and preset != old["preset"]:
        raise AblationError(f"{spec_path}: made with preset {old['preset']!r}, not {preset!r}")
    if base is not None and base != old.get("base"):
        raise AblationError(
            f"{spec_path}: made from {old.get('base') or layout.PARAMS}, not {base}"
        )
    if points is not None and points != old["points"]:
        raise AblationError(f"{spec_path}: made with {old['points']} points, not {points}")
    if budget is not None and budget < old["budget"]:
        raise AblationError(
            f"{spec_path}: the budget is {old['budget']:g} evaluations; it can grow, not shrink"
        )
    extra = [a for a in dict.fromkeys(arms or []) if a not in old["arms"]]
    return Ablation(
        name, folder, (*old["arms"], *extra), float(budget or old["budget"]), old["points"],
        old["preset"], old.get("base"),
    )  # fmt: skip


# -- compute and results of one arm ---------------------------------------------------------


def compute(folder: Path, generation: int) -> dict:
    """Self-play compute of generations 0..generation: evaluations, visits, seconds."""
    from stages.evaluate import compute_spent

    return compute_spent(folder / layout.REPORTS, generation)


def evaluated(folder: Path) -> list[int]:
    """The generations of the arm's params.yaml `evaluate.at`: its compute points so far."""
    return list(load_params(folder / layout.PARAMS)["evaluate"].get("at") or [])


def set_evaluated(folder: Path, generations: list[int]) -> None:
    """Rewrite `evaluate.at` in the arm's params.yaml (a generated file: plain YAML after its
    header comments, which are kept)."""
    path = folder / layout.PARAMS
    text = path.read_text()
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    raw = yaml.safe_load(text)
    raw["evaluate"]["at"] = list(generations)
    write_text(header + "\n" + yaml.safe_dump(raw, sort_keys=False, width=100), path)


def points_of(folder: Path) -> list[dict]:
    """The arm's results at its compute points: generation, evaluations, Elo and its
    standard error, win rates against each fixed opponent."""
    out = []
    for g in evaluated(folder):
        path = folder / layout.eval_report(g)
        if not path.exists():
            break  # the point's evaluation has not run yet
        report = json.loads(path.read_text())
        out.append({
            "generation": g,
            "evaluations": report["selfplay_evaluations"],
            "seconds": report["selfplay_seconds"],
            "elo": report["elo"],
            "elo_stderr": report["elo_stderr"],
            **{k: v for k, v in report.items() if k.startswith("win_rate_")},
        })  # fmt: skip
    return out


# -- acceleration factors -------------------------------------------------------------------


def _compute_at(curve: list[tuple[float, float]], elo: float) -> tuple[float | None, str]:
    """The compute at which a curve of (compute, Elo) points, linear between them, first
    reaches `elo`: (compute, ""); outside the curve, (its last compute, ">") when it never
    gets there, and (its first compute, "<") for an Elo below its first point."""
    if not curve:
        return None, ""
    if elo <= curve[0][1]:  # reached at the first point, or before: no later than it
        return curve[0][0], "<"
    for (c0, e0), (c1, e1) in zip(curve, curve[1:], strict=False):
        if e0 < elo <= e1:
            return c0 + (c1 - c0) * (elo - e0) / (e1 - e0), ""
    return curve[-1][0], ">"


def acceleration(reference: list[dict], arm: list[dict], z: float = 1.959964) -> dict:
    """The arm's acceleration factor relative to the reference, as the paper reports them
    (section 5.2): the self-play compute the reference needs to reach the arm's final Elo,
    divided by the compute the arm spent on it. Above 1 the arm learns faster than the reference; an
    ablation of a technique that helps comes out below 1. The interval carries the arm's
    final Elo's 95% Bradley-Terry interval through the reference's curve (the curve's own
    error is not in it). A bound ("<" or ">") where the Elo lies outside the reference's
    range."""
    if not reference or not arm:
        return {"factor": None, "bound": "", "interval": [None, None]}
    curve = [(p["evaluations"], p["elo"]) for p in reference]
    # The reference's best Elo so far: a dip between points is noise, not lost strength.
    best, monotone = -math.inf, []
    for c, e in curve:
        best = max(best, e)
        monotone.append((c, best))
    last = arm[-1]
    spent = last["evaluations"]

    def factor(elo: float) -> tuple[float | None, str]:
        needed, bound = _compute_at(monotone, elo)
        return (needed / spent if needed is not None and spent > 0 else None), bound

    value, bound = factor(last["elo"])
    low, low_bound = factor(last["elo"] - z * last["elo_stderr"])
    high, high_bound = factor(last["elo"] + z * last["elo_stderr"])

    def rnd(x):
        return None if x is None else round(x, 3)

    return {"factor": rnd(value), "bound": bound, "interval": [rnd(low), rnd(high)],
            "interval_bounds": [low_bound, high_bound], "elo": last["elo"],
            "elo_stderr": last["elo_stderr"], "evaluations": spent}  # fmt: skip


def joint_fit(ab: Ablation, arms: dict[str, list[dict]]) -> dict:
    """One Bradley-Terry fit over every arm's evaluation games, each arm's champions named
    <arm>/gen-N: the ladder's opponents are the same players for every arm, so the arms'
    Elo come out on one scale. Each arm's own evaluate stage fits its own games alone: its
    points come apart there, on the random player or a handicap rung, but two arms whose
    champions all lose every game to the anchor do not (at its first point, each arm's Elo
    is the same prior-pinned value, whatever it did against the rest of the ladder)."""
    from play.ratings import Pairing, fit
    from stages.evaluate import rating_anchor

    def name(arm: str, player: str) -> str:
        return f"{arm}/{player}" if player.startswith("gen-") else player

    settings = load_params(ab.arm_folder(REFERENCE) / layout.PARAMS)["evaluate"]
    games = []
    for arm, pts in arms.items():
        for p in pts:
            path = ab.arm_folder(arm) / layout.eval_report(p["generation"])
            for q in json.loads(path.read_text())["pairings"]:  # that evaluation's own games
                games.append(Pairing(name(arm, q["a"]), name(arm, q["b"]), q["games"],
                                     q["a_score"]))  # fmt: skip
    # Where the anchor never played (its program left out), the evaluate stage's fallback.
    anchor, anchor_elo = rating_anchor(
        settings["anchor"], float(settings["anchor_elo"]), list(settings.get("opponents") or []),
        [{"a": g.a, "b": g.b} for g in games],
    )  # fmt: skip
    return fit(games, anchor=anchor, anchor_elo=anchor_elo,
               prior_draws=float(settings["prior_draws"]))  # fmt: skip


def report(ab: Ablation) -> dict:
    """Every arm's points, rated in one fit over all the arms' games (joint_fit; each arm's
    own fit is kept as elo_arm), and its acceleration factor against the reference."""
    from play.ratings import RatingError

    arms = {arm: points_of(ab.arm_folder(arm)) for arm in ab.arms if ab.arm_folder(arm).exists()}
    rating = "one Bradley-Terry fit over every arm's games"
    if any(arms.values()):
        try:
            ratings = joint_fit(ab, arms)
        except RatingError as e:  # each arm's own fit stands
            ratings, rating = {}, f"each arm's own fit (one over all of them failed: {e})"
        for arm, pts in arms.items():
            for p in pts:
                joint = ratings.get(f"{arm}/gen-{p['generation']}")
                p["elo_arm"], p["elo_arm_stderr"] = p["elo"], p["elo_stderr"]
                if joint is not None:
                    p["elo"], p["elo_stderr"] = round(joint.elo, 1), round(joint.stderr, 1)
    reference = arms.get(REFERENCE, [])
    return {
        "ablation": ab.name,
        "budget": ab.budget,
        "points": ab.targets(),
        "rating": rating,
        "arms": {
            arm: {"what": arm_change(arm)[0], "points": pts,
                  "acceleration": acceleration(reference, pts) if arm != REFERENCE else None}
            for arm, pts in arms.items()
        },
    }  # fmt: skip


def format_report(rep: dict) -> str:
    rows = [f"ablation {rep['ablation']}: {rep['budget']:,.0f} self-play evaluations per arm, "
            f"{len(rep['points'])} compute points",
            f"{'arm':<22} {'points':>6} {'evaluations':>12} {'Elo':>13} {'acceleration':>13} "
            f"{'95% interval':>16}"]  # fmt: skip
    for arm, a in rep["arms"].items():
        pts = a["points"]
        last = pts[-1] if pts else None
        elo = f"{last['elo']:+.0f} ± {last['elo_stderr']:.0f}" if last else "-"
        acc = a["acceleration"]
        if arm == REFERENCE:
            factor, interval = "1 (reference)", ""
        elif acc is None or acc["factor"] is None:
            factor, interval = "-", ""
        else:
            factor = f"{acc['bound']}{acc['factor']:.2f}x"
            ends = zip(acc["interval"], acc.get("interval_bounds", ["", ""]), strict=True)
            interval = "[" + ", ".join("-" if x is None else f"{b}{x:.2f}" for x, b in ends) + "]"
        evals = f"{last['evaluations']:,.0f}" if last else "-"
        rows.append(f"{arm:<22} {len(pts):>6} {evals:>12} {elo:>13} {factor:>13} {interval:>16}")
    rows.append(
        "acceleration: the compute the full method needs to reach the arm's final Elo over "
        "the arm's compute (< 1: the arm learns slower); the interval carries the arm's Elo "
        "interval only"
    )
    return "\n".join(rows)


# -- the chart ------------------------------------------------------------------------------


def write_chart(rep: dict, path: Path) -> Path:
    """Elo against self-play evaluations, one line per arm, 95% error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for arm, a in rep["arms"].items():
        pts = a["points"]
        if not pts:
            continue
        ax.errorbar([p["evaluations"] for p in pts], [p["elo"] for p in pts],
                    yerr=[1.96 * p["elo_stderr"] for p in pts], marker="o", capsize=3,
                    label=arm, linewidth=2.5 if arm == REFERENCE else 1.2)  # fmt: skip
    ax.set_xlabel("self-play network evaluations")
    ax.set_ylabel("Elo (evaluation ladder's anchor = 0)")
    ax.set_title(f"ablation {rep['ablation']}: Elo against compute")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)
    return path


def write_plots(ab: Ablation, rep: dict) -> None:
    """points/<arm>.json for DVC's plots and the dvc.yaml that draws them together."""
    for arm, a in rep["arms"].items():
        write_json(a["points"], ab.folder / "points" / f"{arm}.json")
    plots = [{"Elo against self-play evaluations": {
        "x": "evaluations",
        "y": {f"points/{arm}.json": "elo" for arm in rep["arms"]},
        "title": f"ablation {ab.name}",
        "x_label": "self-play network evaluations",
        "y_label": "Elo",
    }}]  # fmt: skip
    write_text(yaml.safe_dump({"plots": plots}, sort_keys=False), ab.folder / "dvc.yaml")


# -- running it -----------------------------------------------------------------------------


def compare_link(ab: Ablation) -> str:
    """The MLflow UI's compare view of the arms' runs (`mlflow ui` on the ablation's store):
    their Elo against compute in one chart."""
    from stages.tracking import LOCAL_UI, compare_url

    summary = _Summary(ab)
    runs = [summary.run_of(arm) for arm in ab.arms]
    return compare_url(LOCAL_UI, summary.experiment_id, runs)


class _Summary:
    """The ablation's MLflow record: experiment ablate-<name>, one run per arm."""

    def __init__(self, ab: Ablation):
        import os

        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        import mlflow

        from stages.tracking import experiment

        self.client = mlflow.MlflowClient(ab.store())
        self.experiment_id = experiment(self.client, ab.experiment, ab.store())
        self.ab = ab
        self._runs: dict[str, str] = {}  # arm -> run id, found or made once

    def run_of(self, arm: str) -> str:
        if arm not in self._runs:
            self._runs[arm] = self._find_or_make(arm)
        return self._runs[arm]

    def _find_or_make(self, arm: str) -> str:
        found = self.client.search_runs(
            [self.experiment_id], f"tags.`tengen.ablation_arm` = '{arm}'", max_results=1
        )
        if found:
            return found[0].info.run_id
        what, change = arm_change(arm)
        run = self.client.create_run(
            self.experiment_id, run_name=arm,
            tags={"tengen.ablation": self.ab.name, "tengen.ablation_arm": arm,
                  "mlflow.note.content": what},
        )  # fmt: skip
        from stages.tracking import flatten

        for key, value in flatten(change).items():
            self.client.log_param(run.info.run_id, key, json.dumps(value))
        self.client.log_param(run.info.run_id, "ablation.budget", self.ab.budget)
        return run.info.run_id

    def log_missing(self, arm: str, points: list[dict]) -> None:
        """The arm's points whose step has no `elo` in MLflow yet."""
        run = self.run_of(arm)
        logged = {m.step for m in self.client.get_metric_history(run, "elo")}
        for point in points:
            if int(round(point["evaluations"])) not in logged:
                self.log_point(arm, point)

    def log_point(self, arm: str, point: dict) -> None:
        run = self.run_of(arm)
        step = int(round(point["evaluations"]))
        keys = ("elo", "elo_stderr", "elo_arm", "elo_arm_stderr", "seconds", "generation")
        for key in (k for k in keys if k in point):
            self.client.log_metric(run, key if key != "seconds" else "selfplay_seconds",
                                   float(point[key]), step=step)  # fmt: skip
        for key, value in point.items():
            if key.startswith("win_rate_") and value is not None:
                self.client.log_metric(run, key, float(value), step=step)

    def log_artifacts(self, files: list[Path]) -> None:
        for arm in self.ab.arms:
            run = self.run_of(arm)
            for f in files:
                self.client.log_artifact(run, str(f))

    def start(self) -> None:
        """Every arm's run, found or made, RUNNING while the ablation goes on."""
        for arm in self.ab.arms:
            self.client.update_run(self.run_of(arm), status="RUNNING")

    def finish(self, status: str) -> None:
        for arm in self.ab.arms:
            self.client.set_terminated(self.run_of(arm), status)


def _prepare(ab: Ablation) -> None:
    from flows.runs import create_run
    from play.defaults import DEFAULTS

    ab.folder.mkdir(parents=True, exist_ok=True)
    if not (ab.folder / ".dvc").is_dir():  # for `dvc plots show` there (the arms are subrepos)
        import subprocess
        import sys

        subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=ab.folder,
                       check=True, capture_output=True)  # fmt: skip
    install_dvc_template(ab.folder)  # its chart draws offline
    base = Path(ab.base) if ab.base else DEFAULTS
    for arm in ab.arms:
        folder = ab.arm_folder(arm)
        if (folder / layout.PARAMS).exists():
            continue
        what, _ = arm_change(arm)
        try:
            create_run(folder, ab.preset, base, change=ab.change(arm),
                       note=f"tengen ablate {ab.name}, arm {arm}: {what}")  # fmt: skip
        except ParamsError as e:
            raise AblationError(f"arm {arm} of {ab.folder}: {e}") from None
    # Written once the arms exist: a bad preset or base is not locked into the ablation.
    write_json(ab.spec(), ab.folder / SPEC)


def advance(
    folder: Path, target: float, run_loop: Callable, log: Callable = print
) -> tuple[dict, bool]:
    """The arm's point at `target` evaluations: the first generation whose self-play, with
    all before it, has spent that many, its champion evaluated (a stage of the arm's own
    pipeline, through evaluate.at). Grows the arm one generation at a time until there is
    such a generation. Returns (the point, whether it is new)."""
    from flows.runs import completed_generations

    at = evaluated(folder)
    if at and not (folder / layout.eval_report(at[-1])).exists():
        # Its evaluation was stopped or failed (GNU Go missing, a signal): run it again first.
        log(f"{folder.name}: evaluating generation {at[-1]} again (it did not finish)")
        done = completed_generations(folder)
        run_loop(folder, generations=max(done, at[-1] + 1), start=at[-1])
    for point in points_of(folder):
        if point["evaluations"] >= target:
            return point, False  # reached before (a resumed ablation)
    done = completed_generations(folder)
    first = (at[-1] + 1) if at else 0
    g = next((k for k in range(first, done)
              if compute(folder, k)["selfplay_evaluations"] >= target), None)  # fmt: skip
    while g is None:
        log(f"{folder.name}: generation {done}")
        run_loop(folder, generations=done + 1, start=done)
        if compute(folder, done)["selfplay_evaluations"] >= target:
            g = done
        done += 1
    set_evaluated(folder, [*at, g])
    spent = compute(folder, g)["selfplay_evaluations"]
    log(f"{folder.name}: evaluating generation {g} ({spent:,.0f} evaluations)")
    run_loop(folder, generations=max(done, g + 1), start=g)
    return points_of(folder)[-1], True


def run(ab: Ablation, *, log: Callable = print) -> dict:
    """Every arm to every compute point, the arms taking turns; the report."""
    from flows.loop import loop, when_stopped

    def arm_loop(repo: Path, **kwargs):  # one MLflow loop run an arm, over its loops
        return loop(repo, resume_run=True, report=False, **kwargs)  # not after each step

    _prepare(ab)
    summary = _Summary(ab)
    status = "FAILED"
    try:
        summary.start()
        # Ctrl-C in an arm's loop ends the process there (flows.loop.stop), past this
        # `finally`: the hook marks the arms' runs KILLED then.
        with when_stopped(lambda: summary.finish("KILLED")):
            for k, target in enumerate(ab.targets()):
                for arm in ab.arms:
                    log(f"point {k + 1}/{ab.points}: {arm} to {target:,.0f} evaluations")
                    advance(ab.arm_folder(arm), target, arm_loop, log)
                rep = report(ab)
                # Every point MLflow lacks (new ones, and those of a stop before this), with
                # the Elo of the fit over every arm's games so far.
                for arm in ab.arms:
                    summary.log_missing(arm, rep["arms"].get(arm, {}).get("points", []))
                write_json(rep, ab.folder / "report.json")
                write_plots(ab, rep)
                write_chart(rep, ab.folder / "elo.png")
            summary.log_artifacts([ab.folder / "elo.png", ab.folder / "report.json"])
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        summary.finish(status)
    return report(ab)


@flow(name="tengen-ablate", flow_run_name="ablate-{name}")
def ablation_flow(
    name: str,
    arms: list[str] | None = None,
    budget: float | None = None,
    points: int | None = None,
    preset: str | None = None,
    base: str | None = None,
    root: str = "runs",
) -> dict:
    """The ablation as a Prefect flow (each arm's loop a subflow of it): make or go on with
    runs/ablate-<name> (open_ablation), then `run` it."""
    ab = open_ablation(
        name, arms, budget=budget, points=points, preset=preset, base=base, root=Path(root)
    )
    return run(ab, log=get_run_logger().info)
