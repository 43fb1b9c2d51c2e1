"""The network sizes of a run: `train.net` from generation 0, and each net of `run.grow`
(each bigger than the one before, by parameter count) from its `from` generation on. Every
size trains on the same windows with its own train, EMA and gate stages; promote takes the
biggest candidate that passed its gate, never going back to a smaller net than the
champion's, so a bigger net takes over self-play once it beats the champion (the KataGo
paper's growing b6c96 -> b10c128 -> b15c192 -> b20c256).

Only `tengen pipeline` (dvc.yaml) reads run.grow: the stages get the net and their inputs on
the command line, so adding a net to a run reruns only that net's stages and the promotes.

train.net keeps the plain paths (models/gen-N/train, reports/gate/gen-N.json); a grown net's
paths and stage names carry its name (models/gen-N/b6c96/train, reports/gate/gen-N-b6c96.json,
train-b6c96-N).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from stages.params import ParamsError


@dataclasses.dataclass(frozen=True)
class Line:
    net: str
    start: int  # the first generation it trains in
    rank: int  # 0 for train.net, then run.grow's order

    @property
    def primary(self) -> bool:
        return self.rank == 0

    def stage(self, name: str, n: int) -> str:
        return f"{name}-{n}" if self.primary else f"{name}-{self.net}-{n}"

    def models(self, n: int) -> Path:
        return Path(f"models/gen-{n}") if self.primary else Path(f"models/gen-{n}/{self.net}")

    def train_dir(self, n: int) -> Path:
        return self.models(n) / "train"

    def ema_dir(self, n: int) -> Path:
        return self.models(n) / "ema"

    def candidate(self, n: int) -> Path:
        return self.ema_dir(n) / "candidate.pt"

    def report(self, kind: str, n: int) -> Path:
        """reports/<kind>/gen-N.json, or gen-N-<net>.json for a grown net."""
        suffix = "" if self.primary else f"-{self.net}"
        return Path(f"reports/{kind}/gen-{n}{suffix}.json")

    def gate_games(self, n: int) -> Path:
        return self.report("gate", n).with_suffix("")


@functools.cache
def size_of(net: str) -> int:
    """A net's parameter count (built on torch's meta device: no memory, no time)."""
    import torch

    from nets.config import net_config
    from nets.model import GoNet, parameter_count

    with torch.device("meta"):
        return parameter_count(GoNet(net_config(net)))


def line_for(net: str | None) -> Line:
    """The paths of train.net's line (net None) or of a grown net's."""
    return Line(net, 1, 1) if net else Line("", 0, 0)


def lines(raw: dict, source: str | Path) -> list[Line]:
    """train.net and run.grow's nets, validated."""
    from nets.config import SIZES

    train = raw.get("train")
    run = raw.get("run")
    if not isinstance(train, dict) or not isinstance(train.get("net"), str):
        raise ParamsError(f"{source}: train.net must name a net")
    if run is not None and not isinstance(run, dict):
        raise ParamsError(f"{source}: run must be a mapping")
    grow = (run or {}).get("grow") or []
    if not isinstance(grow, list):
        raise ParamsError(f"{source}: run.grow must be a list of {{net: ..., from: N}}")
    out = [Line(train["net"], 0, 0)]
    for i, entry in enumerate(grow):
        where = f"{source}: run.grow[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"net", "from"}:
            raise ParamsError(f"{where}: expected {{net: <size>, from: <generation>}}")
        net, start = entry["net"], entry["from"]
        if not isinstance(net, str) or net not in SIZES:
            raise ParamsError(f"{where}.net: unknown net {net!r}; known: {', '.join(SIZES)}")
        if net in {line.net for line in out}:
            raise ParamsError(f"{where}.net: {net} is already one of the run's nets")
        if out[-1].net in SIZES and size_of(net) <= size_of(out[-1].net):
            raise ParamsError(
                f"{where}.net: {net} ({size_of(net):,} parameters) is not bigger than "
                f"{out[-1].net} ({size_of(out[-1].net):,}); each grown net must be"
            )
        if isinstance(start, bool) or not isinstance(start, int) or start < 1:
            raise ParamsError(f"{where}.from: a generation >= 1 (got {start!r})")
        if start < out[-1].start:
            raise ParamsError(f"{where}.from: the nets must start in order ({start} < "
                              f"{out[-1].start})")  # fmt: skip
        out.append(Line(net, start, i + 1))
    return out


def active(all_lines: list[Line], n: int) -> list[Line]:
    """The lines that train in generation n."""
    return [line for line in all_lines if line.start <= n]
