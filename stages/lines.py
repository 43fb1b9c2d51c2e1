"""The network sizes of a run: `train.net` from generation 0, and each net of `run.grow`
(each bigger than the one before, by parameter count) from its `from` generation on. Every
size trains on the same windows with its own train, EMA and gate stages; promote takes the
biggest candidate that passed its gate, never going back to a smaller net than the
champion's, so a bigger net takes over self-play once it beats the champion (the KataGo
paper's growing b6c96 -> b10c128 -> b15c192 -> b20c256).

Only dvc.yaml's generator reads run.grow: the stages get the net and their inputs on the
command line, so adding a net to a run reruns only that net's stages and the promotes.
train.net keeps the plain paths; a grown net's paths (stages.layout) and stage names carry its
name (models/gen-N/b6c96/train, train-b6c96-N).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from stages.params import ParamsError, TrainParams, run_section, section


@dataclasses.dataclass(frozen=True)
class Line:
    net: str
    start: int  # the first generation it trains in
    rank: int  # 0 for train.net, then run.grow's order

    @property
    def primary(self) -> bool:
        return self.rank == 0

    @property
    def grown(self) -> str | None:
        """The net's name in its paths (stages.layout): None for train.net."""
        return None if self.primary else self.net

    def stage(self, name: str, n: int) -> str:
        return f"{name}-{n}" if self.primary else f"{name}-{self.net}-{n}"


@functools.cache
def size_of(net: str) -> int:
    """A net's parameter count. Built on the CPU: 0.3 s for b20c256, where torch's meta device
    took 3 s on its first use (it imports torch._dynamo), in every promote stage."""
    from nets.config import net_config
    from nets.model import GoNet, parameter_count

    return parameter_count(GoNet(net_config(net)))


def lines(raw: dict, source: str | Path) -> list[Line]:
    """train.net and run.grow's nets, validated."""
    train = section(raw, "train", TrainParams, source=source)
    run = run_section(raw, source)
    out = [Line(train.net, 0, 0)]
    for i, entry in enumerate(run.grow):
        where = f"{source}: run.grow[{i}]"
        net, start = entry.net, entry.from_
        if net in {line.net for line in out}:
            raise ParamsError(f"{where}.net: {net} is already one of the run's nets")
        if size_of(net) <= size_of(out[-1].net):
            raise ParamsError(
                f"{where}.net: {net} ({size_of(net):,} parameters) is not bigger than "
                f"{out[-1].net} ({size_of(out[-1].net):,}); each grown net must be"
            )
        if start < out[-1].start:
            raise ParamsError(f"{where}.from: the nets must start in order ({start} < "
                              f"{out[-1].start})")  # fmt: skip
        out.append(Line(net, start, i + 1))
    return out
