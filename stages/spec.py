"""What a stage declares beside its `run`: the DVC stages it contributes to a generation (its
command, data deps, outs, metrics and plots), with its params sections taken from its `Params`
model. flows.pipeline loops over the stages' specs to write dvc.yaml and adds each stage's code
deps from its import graph (stages.imports); the loop runs them in that order.

A `Plan` is what a stage needs to know of the whole run to say where generation N's inputs
come from: the generations, the nets that train (stages.lines) and the evaluation schedule.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from stages.lines import Line, lines
from stages.params import EvaluateParams, GateParams, run_section, section


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """When the evaluate stage runs and what it plays."""

    every: int = 0  # evaluate every this many generations, and after the last; 0: never
    at: tuple[int, ...] = ()  # and these generations
    past_champions: int = 0
    opponents: tuple[str, ...] = ()  # the fixed opponents' names, for the win-rate plot

    @property
    def scheduled(self) -> bool:
        """Whether the run evaluates any generation at all."""
        return bool(self.every or self.at)


@dataclasses.dataclass(frozen=True)
class Plan:
    generations: int = 1
    lines: tuple[Line, ...] = (Line("", 0, 0),)
    evaluation: Evaluation = Evaluation()
    gated: bool = True  # gate.games > 0: each candidate plays the champion before promotion

    def evaluated(self, n: int) -> bool:
        """Whether generation n has an evaluate stage: every `every` generations and the last,
        and the generations listed in `at`."""
        every = self.evaluation.every
        if n in self.evaluation.at:
            return True
        return every > 0 and ((n + 1) % every == 0 or n == self.generations - 1)

    def evaluated_before(self, n: int) -> list[int]:
        return [k for k in range(n) if self.evaluated(k)]

    def active(self, n: int) -> list[Line]:
        """The nets that train in generation n."""
        return [line for line in self.lines if line.start <= n]

    def carried(self, n: int) -> list[tuple[Line, str, bool]]:
        """For each net training in generation n: the line, its command-line flags (`--net`
        for a grown net, and `--fresh` in its first generation) and whether it carries state
        on from generation n - 1."""
        out = []
        for line in self.active(n):
            before = n > line.start
            flags = "" if line.primary else f" --net {line.net}" + ("" if before else " --fresh")
            out.append((line, flags, before))
        return out


def plan_of(raw: dict, source: str | Path) -> Plan:
    """The run's plan from params.yaml (no `evaluate:` section: no evaluation)."""
    run = run_section(raw, source)
    evaluation = Evaluation()
    if "evaluate" in raw:
        e = section(raw, "evaluate", EvaluateParams, source=source)
        evaluation = Evaluation(e.every, tuple(e.at), e.past_champions, tuple(e.opponents))
    gated = "gate" not in raw or section(raw, "gate", GateParams, source=source).games > 0
    return Plan(run.generations, tuple(lines(raw, source)), evaluation, gated)


@dataclasses.dataclass(frozen=True)
class DvcStage:
    """One stage of dvc.yaml."""

    name: str  # selfplay-3, train-b6c96-4
    module: str  # python -m <module>
    args: str  # its arguments
    params: tuple[str, ...]  # the params.yaml sections (or keys) it reads
    deps: tuple[str, ...] = ()  # data it reads
    outs: tuple = ()  # folders (or {path: {cache: false}})
    metrics: tuple[str, ...] = ()  # JSON reports, not cached
    plots: tuple[str, ...] = ()
    result: str | None = None  # the JSON of its results, when not its first metrics file

    @property
    def report(self) -> str | None:
        """The JSON the stage reports its results in (the loop reads it)."""
        return self.result or (self.metrics[0] if self.metrics else None)

    def entry(self, code) -> dict:
        """Its dvc.yaml entry, `code` (project files) first among its deps."""
        out: dict = {"cmd": f"python -m {self.module} {self.args}".rstrip()}
        out["deps"] = sorted(code) + [str(d) for d in self.deps]
        if self.params:
            out["params"] = list(self.params)
        out["outs"] = [o if isinstance(o, dict) else str(o) for o in self.outs]
        if self.metrics:
            out["metrics"] = [{str(m): {"cache": False}} for m in self.metrics]
        if self.plots:
            out["plots"] = [{str(p): {"cache": False}} for p in self.plots]
        return out


def sections(model) -> tuple[str, ...]:
    """The params.yaml sections a stage's Params model reads."""
    return tuple(model.model_fields)
