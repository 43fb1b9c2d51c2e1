"""The run's layout: every path a stage reads or writes, as a function of the generation (and,
for the nets that grow into a run, the net), relative to the run's folder. The stages, dvc.yaml's
generator, the loop and the tests all take their paths from here.

    data/selfplay/gen-N/part-K.parquet, sgf/     selfplay_dir(N)
    data/windows/gen-N/part-K.parquet, manifest   window_dir(N)
    models/gen-N[/<net>]/train/                   train_dir(N, net)
    models/gen-N[/<net>]/ema/candidate.pt         candidate(N, net)
    models/gen-N/champion/champion.pt             champion(N), promotion(N)
    reports/selfplay/gen-N.json                   selfplay_report(N)
    reports/train/gen-N[-<net>].json              train_report(N, net)
    reports/gate/gen-N[-<net>].json and /sgf      gate_report(N, net), gate_games(N, net)
    reports/history/gen-N.json                    history(N)
    reports/lineage/gen-N.json                    lineage(N)
    reports/eval/gen-N.json, gen-N/, history-...  eval_report(N), eval_games(N), eval_history(N)
    logs/<stage>.log, logs/tengen-run.log         stage_log(name), RUN_LOG (not DVC's)
    .dvc/tmp/tengen-run.lock                      RUN_LOCK: one `tengen run` a folder

`net` is None for train.net, whose paths are the plain ones; a net of run.grow has its name in
its paths (stages.lines).
"""

from __future__ import annotations

import re
from pathlib import Path

from play import names

CHAMPION = names.CHAMPION  # a champion folder's checkpoint
PARAMS = names.PARAMS  # the run's parameters, at its top

CANDIDATE = "candidate.pt"
PROMOTION = "promotion.json"
MANIFEST = "manifest.json"

DATA = Path("data")
MODELS = Path("models")
REPORTS = Path("reports")
SELFPLAY = DATA / "selfplay"  # every generation's self-play folder
WINDOWS = DATA / "windows"
LOGS = Path("logs")  # what the loop's stages and the loop itself printed, whole
RUN_LOG = LOGS / "tengen-run.log"
RUN_LOCK = Path(".dvc") / "tmp" / "tengen-run.lock"  # DVC's own git-ignored scratch folder


def _gen(n: int) -> str:
    return f"gen-{n}"


def _suffix(net: str | None) -> str:
    return f"-{net}" if net else ""


def selfplay_dir(n: int) -> Path:
    return SELFPLAY / _gen(n)


def selfplay_report(n: int) -> Path:
    return REPORTS / "selfplay" / f"{_gen(n)}.json"


def data_report(n: int) -> Path:
    """Generation n's data report (stages.data), written by the shuffle stage."""
    return REPORTS / "data" / f"{_gen(n)}.json"


def window_dir(n: int) -> Path:
    return WINDOWS / _gen(n)


def models_dir(n: int, net: str | None = None) -> Path:
    return MODELS / _gen(n) / net if net else MODELS / _gen(n)


def train_dir(n: int, net: str | None = None) -> Path:
    return models_dir(n, net) / "train"


def snapshots_dir(n: int, net: str | None = None) -> Path:
    return train_dir(n, net) / "snapshots"


def ema_dir(n: int, net: str | None = None) -> Path:
    return models_dir(n, net) / "ema"


def candidate(n: int, net: str | None = None) -> Path:
    return ema_dir(n, net) / CANDIDATE


def train_report(n: int, net: str | None = None) -> Path:
    return REPORTS / "train" / f"{_gen(n)}{_suffix(net)}.json"


def gate_report(n: int, net: str | None = None) -> Path:
    return REPORTS / "gate" / f"{_gen(n)}{_suffix(net)}.json"


def gate_games(n: int, net: str | None = None) -> Path:
    return REPORTS / "gate" / f"{_gen(n)}{_suffix(net)}"


def champion_dir(n: int) -> Path:
    """The champion after generation n's promote stage (every generation has its own)."""
    return models_dir(n) / "champion"


def champion(n: int) -> Path:
    return champion_dir(n) / CHAMPION


def promotion(n: int) -> Path:
    return champion_dir(n) / PROMOTION


def history(n: int) -> Path:
    """The run's rows up to generation n, one per generation (DVC's plots)."""
    return REPORTS / "history" / f"{_gen(n)}.json"


def lineage(n: int) -> Path:
    """Generation n's champion and candidates by SHA-256, in the run's git (stages.promote)."""
    return REPORTS / "lineage" / f"{_gen(n)}.json"


def eval_games(n: int) -> Path:
    return REPORTS / "eval" / _gen(n)


def eval_report(n: int) -> Path:
    return REPORTS / "eval" / f"{_gen(n)}.json"


def eval_history(n: int) -> Path:
    return REPORTS / "eval" / f"history-{_gen(n)}.json"


def stage_log(name: str) -> Path:
    """What a DVC stage (`evaluate-2`) printed when the loop ran it, each try appended."""
    return LOGS / f"{name}.log"


_MADE_BY = [
    (re.compile(r"data/selfplay/gen-(\d+)(/|$)"), "selfplay-{n}"),
    (re.compile(r"data/windows/gen-(\d+)(/|$)"), "shuffle-{n}"),
    (re.compile(r"models/gen-(\d+)/champion(/|$)"), "promote-{n}"),
    (re.compile(r"models/gen-(\d+)/(?:(?P<net>[^/]+)/)?train(/|$)"), "train-{net}{n}"),
    (re.compile(r"models/gen-(\d+)/(?:(?P<net>[^/]+)/)?ema(/|$)"), "ema-{net}{n}"),
]


def made_by(path: str | Path) -> str | None:
    """The DVC stage that writes `path` (to name the stage to rerun when it is broken)."""
    text = Path(path).as_posix()
    for pattern, name in _MADE_BY:
        m = pattern.search(text)
        if m:
            net = m.groupdict().get("net")
            return name.format(n=m[1], net=f"{net}-" if net else "")
    return None


def in_reports(reports: Path, path: Path) -> Path:
    """A report's path (one of the functions above) under another reports folder than
    REPORTS (a test's, a copied run's)."""
    return Path(reports) / Path(path).relative_to(REPORTS)


def promoted_generations(run: Path) -> list[int]:
    """The generations of a run folder whose promote stage has finished, in order."""
    found = []
    for folder in (Path(run) / MODELS).glob("gen-*/champion"):
        match = re.fullmatch(r"gen-(\d+)", folder.parent.name)
        if match and (folder / PROMOTION).is_file():
            found.append(int(match[1]))
    return sorted(found)


def newest_champion(run: Path) -> Path | None:
    """The champion checkpoint of a run folder's highest promoted generation that has one
    (None: no candidate has passed a gate yet)."""
    for n in reversed(promoted_generations(run)):
        path = Path(run) / champion(n)
        if path.is_file():
            return path
    return None
