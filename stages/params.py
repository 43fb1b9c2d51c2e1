"""params.yaml: read it, and validate one stage's section into a frozen model.

Every error names the file and the key (and, for YAML syntax, the line), so a typo in a
300-line params file is found at once and no stage starts on a half-understood setting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

DEFAULT_PATH = Path("params.yaml")


class ParamsError(ValueError):
    """params.yaml is missing, malformed, or a section does not validate."""


class Section(BaseModel):
    """A params.yaml section: every key required (params.yaml is where defaults live), no
    unknown key, immutable once read."""

    model_config = ConfigDict(frozen=True, extra="forbid")


M = TypeVar("M", bound=Section)


def load_params(path: str | Path = DEFAULT_PATH) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ParamsError(f"{path}: no such parameters file") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        where = ""
        mark = getattr(e, "problem_mark", None)
        if mark is not None:
            where = f" (line {mark.line + 1}, column {mark.column + 1})"
        problem = getattr(e, "problem", None) or str(e)
        raise ParamsError(f"{path}{where}: not valid YAML: {problem}") from None
    if not isinstance(data, dict):
        raise ParamsError(f"{path}: expected a mapping of sections, got {type(data).__name__}")
    return data


DEVICES = ("cpu", "cuda")


def device_of(params: dict[str, Any], source: str | Path) -> str:
    """The top-level `device:` (cpu when absent)."""
    device = params.get("device", "cpu")
    if device not in DEVICES:
        raise ParamsError(f"{source}: device must be one of {DEVICES} (got {device!r})")
    return device


def section(params: dict[str, Any], name: str, model: type[M], *, source: str | Path) -> M:
    """params[name] validated by `model`; ParamsError naming `source` and each bad key."""
    if name not in params:
        raise ParamsError(f"{source}: no `{name}:` section")
    try:
        return model.model_validate(params[name])
    except ValidationError as e:
        problems = "; ".join(
            f"{name}.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()
        )
        raise ParamsError(f"{source}: {problems}") from None


class MatchSearchSection(Section):
    """The search of a match (`gate.search`, the evaluate stage, `tengen gtp`): no noise, so
    no forced playouts and no root-only first-play urgency (in the paper both go with the
    noise of self-play's full searches); params.yaml refuses those keys here rather than
    ignoring them."""

    c_puct: float = Field(gt=0)
    puct_exponent: float = Field(gt=0, le=1)
    fpu_reduction: float = Field(ge=0)
    virtual_loss: float = Field(ge=0)
    score_utility: float = Field(ge=0)

    def params(self):
        from gocore.search import SearchParams

        return SearchParams(
            c_puct=self.c_puct,
            puct_exponent=self.puct_exponent,
            fpu_reduction=self.fpu_reduction,
            root_fpu_reduction=self.fpu_reduction,  # unused without noise; the same everywhere
            forced_playouts_k=0.0,
            virtual_loss=self.virtual_loss,
            score_utility=self.score_utility,
        )


class EngineSection(BaseModel):
    """What a GTP engine playing a net reads of a match section (`gate`, `evaluate`): its
    search and batch; the stage's other keys are the stage's to check."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    search: MatchSearchSection
    leaves_per_game: int = Field(ge=1)
