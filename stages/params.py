"""params.yaml: every knob of the pipeline, defined and validated here once.

Each section of params.yaml is a frozen pydantic model with `extra="forbid"` and no defaults
(params.yaml is where the defaults live). A stage reads exactly the sections its `Params`
model names (stages.spec), which are also the sections dvc.yaml tracks for it and MLflow logs
as its params. gocore's configs are built from these models (`SelfPlayParams.config()`,
`SearchSection.params()`), so gocore validates nothing twice and imports nothing above it.

Every error names the file and the key (and, for YAML syntax, the line) with the value given,
so a typo in a 300-line params file is found at once and no stage starts on a half-understood
setting; the stages' command lines turn it into exit status 2.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from play.defaults import params_file  # noqa: F401  (the commands' params.yaml)
from play.names import PARAMS

DEFAULT_PATH = Path(PARAMS)


class ParamsError(ValueError):
    """params.yaml is missing, malformed, or a section does not validate."""


class Section(BaseModel):
    """A params.yaml section: every key required (params.yaml is where defaults live), no
    unknown key, immutable once read. Numbers are not taken from strings or booleans, and
    are finite."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


M = TypeVar("M", bound=BaseModel)

Probability = Field(ge=0.0, le=1.0)


def _visible(device: str) -> str:
    """`cuda` only where torch sees a GPU: refused here rather than failing mid-stage."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("cuda, but torch sees no CUDA GPU here (use cpu)")
    return device


Device = Annotated[Literal["cpu", "cuda"], AfterValidator(_visible)]


def load_params(path: str | Path = DEFAULT_PATH) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ParamsError(f"{path}: no such parameters file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ParamsError(f"{path}: cannot be read ({e})") from None
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


# Keys that params.yaml had once, and what a run folder written then should do instead.
RETIRED = {
    "ema.every": "delete it: ema.decay is now per snapshot (the paper's 0.75); 0.75 every 4 "
    "snapshots, as before, is decay 0.9306",
}


# Keys added since run folders were first written, with the value that keeps what a run
# folder without them did: filled in when its params.yaml lacks them, so that an older run
# resumes (DVC sees the same sections, so nothing reruns). The source tree's params.yaml has
# every one of them.
ADDED: dict[str, Any] = {
    "selfplay.shards": 1,
    "selfplay.compile": "none",
    "gate.compile": "none",
    "gate.max_moves_per_area": 3.0,
    "run.push": False,
    "cluster": {"address": None, "worker_threads": 1, "resources": {}, "security": None},
    "cluster.security": None,
}


def with_added(data: Any, prefix: str = "", *, sections: bool = True) -> Any:
    """`data` (the keys under `prefix`, or the whole file) with the ADDED keys it lacks; a
    whole section only with `sections`."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    for key, value in ADDED.items():
        if prefix:
            if not key.startswith(prefix + "."):
                continue
            key = key[len(prefix) + 1 :]
        *parents, leaf = key.split(".")
        if not parents and not prefix and not sections:
            continue
        node = out
        for name in parents:
            if not isinstance(node.get(name), dict):
                break
            node[name] = node = dict(node[name])
        else:
            node.setdefault(leaf, copy.deepcopy(value))
    return out


def _problems(e: ValidationError, prefix: str) -> str:
    out = []
    for err in e.errors():
        key = ".".join(str(p) for p in (prefix, *err["loc"]) if p != "")
        given = err.get("input")
        shown = repr(given) if not isinstance(given, dict | list) or len(repr(given)) < 60 else ""
        shown = re.sub(r"(://[^/@:\s']*:)[^/@\s']*@", r"\1***@", shown)  # never a password
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden" and key in RETIRED:
            message = f"no longer a setting: {RETIRED[key]}"
        out.append(f"{key}: {message}" + (f" (got {shown})" if shown else ""))
    return "; ".join(out)


def validate(model: type[M], data: Any, *, source: str | Path, prefix: str = "") -> M:
    """`data` as `model`, or ParamsError naming `source` and every bad key."""
    try:
        return model.model_validate(with_added(data, prefix, sections=False))
    except ValidationError as e:
        raise ParamsError(f"{source}: {_problems(e, prefix)}") from None


def section(params: dict[str, Any], name: str, model: type[M], *, source: str | Path) -> M:
    """params[name] validated by `model`; ParamsError naming `source` and each bad key."""
    params = with_added(params)
    if name not in params:
        raise ParamsError(f"{source}: no `{name}:` section")
    return validate(model, params[name], source=source, prefix=name)


def read(path: str | Path, model: type[M], raw: dict | None = None) -> M:
    """The sections of params.yaml that `model` (a stage's Params) names, validated."""
    raw = with_added(load_params(path) if raw is None else raw)
    missing = [name for name in model.model_fields if name not in raw]
    if missing:
        raise ParamsError(f"{path}: no `{missing[0]}:` section")
    return validate(model, {name: raw[name] for name in model.model_fields}, source=path)


def _rules_preset(name: str) -> str:
    from gocore.rules import PRESETS

    if name not in PRESETS:
        raise ValueError(f"unknown rules preset {name!r}; presets: {', '.join(sorted(PRESETS))}")
    return name


def _net(name: str) -> str:
    from nets.config import SIZES

    if name not in SIZES:
        raise ValueError(f"unknown net {name!r}; known: {', '.join(SIZES)}")
    return name


def _number_text(value):
    """A float written as YAML 1.2 reads it (`1e-5`), which PyYAML and `dvc exp run -S` leave
    a string; any other string stays a string, and is refused."""
    if isinstance(value, str) and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", value):
        return float(value)
    return value


Real = Annotated[float, BeforeValidator(_number_text)]
RulesName = Annotated[str, AfterValidator(_rules_preset)]
NetName = Annotated[str, AfterValidator(_net)]
# numpy's SeedSequence (every seed with the generation, shard or game) takes no negatives.
Seed = Annotated[int, Field(ge=0)]
# torch.compile's mode for the net (nets.evaluator.COMPILE_MODES; none: eager).
NetCompile = Literal["none", "default", "reduce-overhead", "max-autotune"]
# Leaves a game's search sends to each network batch (selfplay, gate, evaluate, the engines).
LeavesPerGame = Annotated[int, Field(ge=1, le=64)]


# ---------------------------------------------------------------------------------------------
# The search
# ---------------------------------------------------------------------------------------------


class MatchSearchSection(Section):
    """The search of a match (`gate.search`, the evaluate stage, `tengen gtp`): no noise, so
    no forced playouts and no root-only first-play urgency (in the paper both go with the
    noise of self-play's full searches); params.yaml refuses those keys here rather than
    ignoring them. The root is PUCT's or a Gumbel root (its move the g + logits + sigma(q)
    of sequential halving; deterministic in the GTP engine, g = 0, as mctx's gumbel_scale=0
    for evaluation; drawn in the gate, whose games must differ). SearchSection is this and
    the two noise keys."""

    root: Literal["puct", "gumbel"]
    gumbel_considered: int = Field(ge=1)  # moves a Gumbel root considers (the paper: 16)
    gumbel_c_visit: Real = Field(ge=0)
    gumbel_c_scale: Real = Field(gt=0)
    c_puct: Real = Field(gt=0)
    puct_exponent: Real = Field(gt=0, le=1)
    fpu_reduction: Real = Field(ge=0)
    virtual_loss: Real = Field(ge=0)
    score_utility: Real = Field(ge=0)

    def params(self):
        from gocore.search import SearchParams

        return SearchParams(
            **self.model_dump(exclude={"root", "gumbel_considered"}),
            root_fpu_reduction=self.fpu_reduction,  # unused without noise; the same everywhere
            forced_playouts_k=0.0,
        )

    @property
    def considered(self) -> int:
        """The moves a root considers: 0 for a PUCT root (gocore.search.search's argument)."""
        return self.gumbel_considered if self.root == "gumbel" else 0


class SearchSection(MatchSearchSection):
    """`selfplay.search`: every knob of gocore.search.SearchParams, and the root's rule: PUCT
    (with noise and forced playouts in full searches) or Gumbel (gocore.search)."""

    root_fpu_reduction: Real = Field(ge=0)
    forced_playouts_k: Real = Field(ge=0)

    def params(self):
        from gocore.search import SearchParams

        return SearchParams(**self.model_dump(exclude={"root", "gumbel_considered"}))


# ---------------------------------------------------------------------------------------------
# The stages' sections
# ---------------------------------------------------------------------------------------------


class SelfPlayParams(Section):
    """`selfplay:` (see the comments in params.yaml)."""

    games: int = Field(ge=1)
    slots: int = Field(ge=1)
    leaves_per_game: LeavesPerGame
    seed: Seed
    rows_per_shard: int = Field(ge=1)
    shards: int = Field(ge=1)  # the games split into this many, each its own seed (fanout)
    threads: int = Field(ge=1)  # torch CPU threads
    compile: NetCompile
    full_visits: int = Field(ge=1)
    cheap_visits: int = Field(ge=1)
    full_probability: Real = Probability
    record_cheap_searches: bool
    search: SearchSection
    noise_alpha_total: Real = Field(gt=0)
    noise_epsilon: Real = Probability
    temperature_start: Real = Field(gt=0)
    temperature_end: Real = Field(gt=0)
    opening_moves: Real = Field(ge=0)
    board_sizes: dict[int, Real] = Field(min_length=1)
    rules: dict[str, Real] = Field(min_length=1)
    komi: dict[int, Real]
    komi_stdev: Real = Field(ge=0)
    handicap_probability: Real = Probability
    early_fork_probability: Real = Probability
    early_fork_turn: Real = Field(ge=0)
    side_position_probability: Real = Probability
    side_continue_probability: Real = Probability
    decided_winrate: Real = Probability
    decided_turns: int = Field(ge=1)
    decided_visits: int = Field(ge=1)
    decided_weight: Real = Probability
    max_moves_per_area: Real = Field(gt=0)

    # The stage's own knobs; the rest configure gocore's self-play.
    STAGE_ONLY: ClassVar[frozenset[str]] = frozenset(
        {"games", "slots", "seed", "rows_per_shard", "shards", "threads", "compile"}
    )

    @model_validator(mode="after")
    def _shards(self):
        if self.shards > self.games:
            raise ValueError(
                f"shards ({self.shards}) must not exceed games ({self.games}): every shard "
                "plays at least one game"
            )
        return self

    @field_validator("board_sizes")
    @classmethod
    def _sizes(cls, value: dict[int, Real]) -> dict[int, Real]:
        for size, weight in value.items():
            if not 2 <= size <= 19:
                raise ValueError(f"board size {size} is not within 2..19")
            if not weight >= 0:
                raise ValueError(f"the weight of size {size} must be >= 0 (got {weight})")
        if not sum(value.values()) > 0:
            raise ValueError("the weights must have a positive sum")
        return value

    @field_validator("rules")
    @classmethod
    def _rules(cls, value: dict[str, Real]) -> dict[str, Real]:
        for name, weight in value.items():
            _rules_preset(name)
            if not weight >= 0:
                raise ValueError(f"the weight of {name} must be >= 0 (got {weight})")
        if not sum(value.values()) > 0:
            raise ValueError("the weights must have a positive sum")
        return value

    @field_validator("komi")
    @classmethod
    def _komi(cls, value: dict[int, Real]) -> dict[int, Real]:
        for size, komi in value.items():
            if not 2 <= size <= 19 or (komi * 2) % 1:
                raise ValueError(f"komi {size}: {komi}: sizes 2..19, komi in half points")
        return value

    def config(self):
        """gocore's SelfPlayConfig from this section (mappings as sorted tuples)."""
        from gocore.selfplay import SelfPlayConfig

        values = {k: getattr(self, k) for k in type(self).model_fields if k not in self.STAGE_ONLY}
        values.update(
            search=self.search.params(),
            considered=self.search.considered,
            board_sizes=tuple(sorted(self.board_sizes.items())),
            rules=tuple(self.rules.items()),
            komi=tuple(sorted(self.komi.items())),
        )
        return SelfPlayConfig(**values)


class ShuffleParams(Section):
    """`shuffle:`."""

    window_c: int = Field(ge=1)
    window_alpha: Real = Field(gt=0, le=1)
    window_beta: Real = Field(gt=0)
    rows_per_file: int = Field(ge=1)
    seed: Seed


class TrainParams(Section):
    """`train:`."""

    net: NetName
    tensor: int = Field(ge=2, le=19)  # the input planes' size (the largest board trained on)
    batch_size: int = Field(ge=1)
    samples_per_generation: int = Field(ge=1)
    lr_per_sample: Real = Field(gt=0)
    warmup_samples: int = Field(ge=0)
    warmup_factor: Real = Field(gt=0, le=1)
    momentum: Real = Field(ge=0, lt=1)
    snapshots: int = Field(ge=1)
    seed: Seed
    threads: int = Field(ge=1)  # torch CPU threads of the train and ema stages
    global_pooling: bool  # false: no global pooling in the trunk (the paper's ablation)
    go_features: bool  # false: the net sees no liberties, ladders or pass-alive areas

    def net_config(self):
        """train.net's NetConfig, with this section's switches."""
        from nets.config import net_config

        return net_config(
            self.net, global_pooling=self.global_pooling, go_features=self.go_features
        )


class LossParams(Section):
    """`loss:`: each term's weight (the paper's Appendix B; nets.losses.LossWeights)."""

    policy: Real = Field(ge=0)
    opponent_policy: Real = Field(ge=0)
    outcome: Real = Field(ge=0)
    ownership: Real = Field(ge=0)
    score_pdf: Real = Field(ge=0)
    score_cdf: Real = Field(ge=0)
    score_mean: Real = Field(ge=0)
    score_stdev: Real = Field(ge=0)
    l2: Real = Field(ge=0)

    def weights(self):
        from nets.losses import LossWeights

        return LossWeights(**self.model_dump())


class EmaParams(Section):
    """`ema:`."""

    decay: Real = Field(gt=0, lt=1)  # the older average's weight kept per snapshot
    bn_batches: int = Field(ge=0)
    bn_batch_size: int = Field(ge=1)
    threads: int = Field(ge=1)  # torch CPU threads
    seed: Seed


class GateParams(Section):
    """`gate:`."""

    games: int = Field(ge=0)  # 0: no gate stage, every candidate promoted (as KataGo)
    win_fraction: Real = Field(ge=0, le=1)  # 0: every candidate passes the games it plays
    early_stop: bool
    slots: int = Field(ge=1)
    visits: int = Field(ge=2)
    leaves_per_game: LeavesPerGame
    board_size: int = Field(ge=2, le=19)
    rules: RulesName
    komi: Real
    temperature_start: Real = Field(gt=0)
    temperature_end: Real = Field(gt=0)
    max_moves_per_area: Real = Field(gt=0)
    search: MatchSearchSection
    threads: int = Field(ge=1)  # torch CPU threads
    compile: NetCompile
    seed: Seed


class Rung(Section):
    """An evaluation opponent given as a mapping (`evaluate.opponents`): its GTP command line,
    and the handicap it gives: with `handicap` stones (2 or more) the champion takes Black in
    every game, the stones on GTP's fixed points, at this komi; with 0 the colours alternate
    at this komi. A strong outside opponent giving stones is a rung a weak net can climb
    before it wins an even game. Komi 0.5 is the Japanese and AGA custom for handicap games;
    tengen's area scoring gives White no point per handicap stone as Chinese rules do, so
    under `chinese` the stones are worth that much more."""

    command: str
    handicap: int = Field(ge=0)
    komi: Real


def _opponent_kind(value: Any) -> str:
    return "rung" if isinstance(value, dict | Rung) else "command"


# A command line, or a mapping checked as a Rung alone (not also as a string).
Opponent = Annotated[
    Annotated[str, Tag("command")] | Annotated[Rung, Tag("rung")],
    Discriminator(_opponent_kind),
]


class EvaluateParams(Section):
    """`evaluate:`."""

    every: int = Field(ge=0)  # evaluate every this many generations and after the last; 0: off
    at: list[Annotated[int, Field(ge=0)]]  # and these generations (tengen ablate's points)
    games: int = Field(ge=1)  # per opponent
    board_size: int = Field(ge=2, le=19)
    rules: RulesName
    komi: Real
    visits: int = Field(ge=1)
    leaves_per_game: LeavesPerGame
    search: MatchSearchSection
    opponents: dict[str, Opponent] = Field(min_length=1)  # name: GTP command line, or a Rung
    past_champions: int = Field(ge=0)
    anchor: str
    anchor_elo: Real
    prior_draws: Real = Field(ge=0)
    referee: str | None
    workers: int = Field(ge=1)  # games at once, an engine pair each
    threads: int = Field(ge=1)  # torch CPU threads of each champion engine
    timeout: Real = Field(gt=0)  # seconds an engine may take per command

    @field_validator("opponents")
    @classmethod
    def _opponents(cls, value: dict[str, str | Rung], info: ValidationInfo):
        from gocore.rules import max_fixed_handicap

        size = info.data.get("board_size")  # absent when it failed itself
        most = max_fixed_handicap(size) if size is not None else None
        for name, rung in value.items():
            if not name or not name.replace("-", "").replace("_", "").isalnum():
                raise ValueError(f"opponent name {name!r}: letters, digits, - and _ only")
            if name.startswith("gen-"):
                raise ValueError(f"opponent name {name!r}: gen-N names the run's champions")
            if not (rung if isinstance(rung, str) else rung.command).strip():
                raise ValueError(f"opponent {name}: an empty command line")
            stones = 0 if isinstance(rung, str) else rung.handicap
            if stones and most is not None and not 2 <= stones <= most:
                room = f"2..{most} stones on {size}x{size}, or 0" if most else (
                    f"no fixed handicap on {size}x{size} (7x7 or larger), only 0")  # fmt: skip
                raise ValueError(f"{name}.handicap: {room} (got {stones})")
        return value

    def rungs(self) -> dict[str, Rung]:
        """Every fixed opponent as a Rung: a bare command line plays even at `komi`."""
        return {
            name: Rung(command=rung, handicap=0, komi=self.komi) if isinstance(rung, str) else rung
            for name, rung in self.opponents.items()
        }

    # When it runs, not what it measures: not a DVC params dependency of the evaluate stages,
    # so that adding a generation to the schedule does not redo the evaluations made.
    SCHEDULE: ClassVar[tuple[str, ...]] = ("every", "at")

    @classmethod
    def measured(cls) -> tuple[str, ...]:
        """The keys the evaluate stages depend on (`evaluate.<key>`)."""
        return tuple(f"evaluate.{k}" for k in cls.model_fields if k not in cls.SCHEDULE)


class MlflowParams(Section):
    """`mlflow:` (stages.tracking). Not a DVC params dependency: where results are logged does
    not change them."""

    enabled: bool
    tracking_uri: str
    experiment: str
    registered_model: str

    @field_validator("tracking_uri")
    @classmethod
    def _no_password(cls, value: str) -> str:
        if USERINFO.match(value):
            raise ValueError(
                "a tracking URI with a password in it would be committed with the run; give "
                "the URI without it and the login in MLFLOW_TRACKING_USERNAME and "
                "MLFLOW_TRACKING_PASSWORD (docs/cluster.md)"
            )
        return value


# scheme://user:password@host: a password inside a URI.
USERINFO = re.compile(r"^[a-z][a-z0-9+.-]*://[^/@:]*:[^/@]*@", re.IGNORECASE)


CLUSTER_ADDRESS = re.compile(r"^(local:[1-9][0-9]*|(tcp|tls|ucx|inproc)://\S+)$")
TLS = "tls://"


class TlsFiles(Section):
    """`cluster.security`: the files this process shows a TLS scheduler (`tengen cluster
    certs` makes them): the cluster's CA, and the client's certificate and key, signed by it.
    Paths, never the keys themselves; `~` is the user's home."""

    ca_file: str
    cert: str
    key: str


class ClusterParams(Section):
    """`cluster:` (stages.fanout): where the stages that play games run their shards. Not a
    DVC params dependency: where games were played does not change them."""

    address: str | None  # null: this process; local:N: a LocalCluster; tcp://host:8786
    worker_threads: int = Field(ge=1)  # torch and numba threads of a shard on a worker
    resources: dict[str, Real]  # what a shard asks of its worker (dask resources: GPU: 1)
    security: TlsFiles | None  # a tls:// scheduler's CA and this client's certificate

    @field_validator("address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None and not CLUSTER_ADDRESS.match(value):
            raise ValueError(
                "null (this process), local:N (N worker processes here) or a Dask "
                "scheduler's address such as tls://host:8786"
            )
        return value

    @model_validator(mode="after")
    def _tls(self) -> ClusterParams:
        tls = (self.address or "").startswith(TLS)
        if tls and self.security is None:
            raise ValueError(
                f"security: {self.address} is a TLS scheduler; give the files this client "
                "shows it (ca_file, cert, key: `tengen cluster certs DIR` makes them)"
            )
        if self.security is not None and not tls:
            raise ValueError(
                f"security: TLS files are for a tls:// scheduler, not {self.address} (a "
                "local:N cluster stays on this machine's loopback; null runs here)"
            )
        return self

    @field_validator("resources")
    @classmethod
    def _resources(cls, value: dict[str, Real]) -> dict[str, Real]:
        for name, amount in value.items():
            if not amount > 0:
                raise ValueError(f"{name}: a resource's amount must be > 0")
        return value


class GrowEntry(Section):
    """One entry of `run.grow`: a bigger net that joins the run at a generation."""

    net: NetName
    from_: int = Field(alias="from", ge=1)


class RunParams(Section):
    """`run:`: how many generations dvc.yaml unrolls, the nets that grow into the run,
    `tengen serve`'s schedule, and whether each generation is pushed to the run's remotes."""

    generations: int = Field(ge=1)
    grow: list[GrowEntry]
    serve_cron: str | None
    serve_interval_minutes: Real | None = Field(gt=0)
    serve_generations: int = Field(ge=1)
    push: bool

    @field_validator("serve_interval_minutes", mode="before")
    @classmethod
    def _minutes(cls, value):
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def run_section(raw: dict, source: str | Path) -> RunParams:
    return section(raw, "run", RunParams, source=source)


class EngineSection(BaseModel):
    """What a GTP engine playing a net reads of a match section (`gate`, `evaluate`): its
    search and batch; the stage's other keys are the stage's to check."""

    model_config = ConfigDict(frozen=True, extra="ignore", strict=True, allow_inf_nan=False)

    search: MatchSearchSection
    leaves_per_game: LeavesPerGame
