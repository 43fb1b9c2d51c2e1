"""The `tengen` command line: play through GTP, run matches, benchmark.

Each command imports what it needs when it runs, so `tengen gtp` starts without loading the
rest of the project.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from play.names import PARAMS

app = typer.Typer(
    help="tengen: learn Go from zero by self-play, as a reproducible pipeline.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # a docstring's paragraphs reflowed to the terminal
)
bench_app = typer.Typer(help="Benchmarks, each beside a named baseline measured in the same run.")
app.add_typer(bench_app, name="bench", rich_help_panel="Bench")
nets_app = typer.Typer(help="The networks: sizes and parameter counts.")
app.add_typer(nets_app, name="nets", rich_help_panel="Look")
remote_app = typer.Typer(help="Where a run's data goes off the machine: its DVC remote.")
app.add_typer(remote_app, name="remote", rich_help_panel="Train")
cluster_app = typer.Typer(
    help="A cluster that lets no one else in: TLS certificates, logins, MLflow users."
)
app.add_typer(cluster_app, name="cluster", rich_help_panel="Train")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tengen")
    except PackageNotFoundError:
        return "unknown"


def _rules(name: str, komi: float | None):
    from gocore.rules import RulesError, parse_rules

    try:
        return parse_rules(name, komi=komi)
    except RulesError as e:
        raise typer.BadParameter(str(e), param_hint="--rules") from None


def _said(error: Exception) -> str:
    """An error for the console: an MLflow one in one line (a refused login says whose)."""
    from mlflow.exceptions import MlflowException

    if isinstance(error, MlflowException):
        from play.mlflow_store import said

        return said(error)
    return str(error)


def _prefect_refused(error: Exception) -> str | None:
    """What to say of a Prefect API that refused this client's auth string (None: another
    error)."""
    response = getattr(error, "response", None)
    if getattr(response, "status_code", None) != 401:
        return None
    from prefect.settings import PREFECT_API_URL

    return (
        f"the Prefect API at {PREFECT_API_URL.value()} refused this client (401 Unauthorized): "
        "set PREFECT_API_AUTH_STRING to the server's PREFECT_SERVER_API_AUTH_STRING "
        "(docs/cluster.md)"
    )


def _params_file(given: Path | None) -> Path:
    """params.yaml: the one given, else the working folder's, else the source tree's."""
    if given is not None:
        return given
    here = Path(PARAMS)
    return here if here.is_file() else Path(__file__).resolve().parent.parent / PARAMS


Lineage = Annotated[
    Path | None,
    typer.Option(
        envvar="TENGEN_LINEAGE",
        help="The run's folder, or a clone of its git: a --model fetched from MLflow is "
        "played only if its SHA-256 is in the run's history there (default: the run folder "
        "of a run's own SQLite store).",
    ),
]


def resolve_model(spec: str, store=None, lineage: Path | None = None):
    """The checkpoint `--model` names (None: uniform): a file, a run folder (its newest
    champion, stages.layout), or an MLflow URI in the store of params.yaml's mlflow section,
    played only if the run's lineage (`lineage`, else the run folder of a SQLite store)
    records its SHA-256 (stages.champions.check_against)."""
    from play.mlflow_store import shown
    from play.models import MLFLOW_SCHEMES, ModelError, resolve
    from stages import champions, layout, tracking
    from stages.cli import InputError

    folder = Path(spec).expanduser()
    if folder.is_dir() and not (folder / layout.CHAMPION).is_file():
        found = layout.newest_champion(folder)
        if found is None:
            raise ModelError(
                f"{folder} holds no champion (no {layout.champion('N')}): train a "
                "generation first (tengen run), or give a checkpoint"
            )
        return found
    uri = tracking.store_uri(store, Path.cwd()) if store is not None else None
    path = resolve(spec, tracking_uri=uri)
    if spec.startswith(MLFLOW_SCHEMES):
        import mlflow

        where = shown(uri or mlflow.get_tracking_uri())
        folder = lineage or champions.lineage_of_store(where)
        if folder is None:
            raise ModelError(
                f"--model {spec}: a checkpoint from the MLflow store {where} is played only "
                "once the run's own lineage vouches for it: give --lineage DIR (the run's "
                "folder, or a clone of its git) or set TENGEN_LINEAGE"
            )
        try:
            what = champions.check_against(path, spec, folder, where)
        except InputError as e:
            raise ModelError(str(e)) from None
        print(f"--model {spec}: {what} in the run's lineage at {folder}", file=sys.stderr)
    return path


def net_player(
    model: str,
    *,
    visits: int | None,
    seconds: float | None,
    device: str,
    threads: int,
    leaves: int | None,
    resign_below: float | None,
    resign_after: int,
    seed: int | None,
    params_path: Path | None,
    section_name: str = "gate",
    lineage: Path | None = None,
):
    """The network player for `model`, its search knobs (`search`, `leaves_per_game`) from
    params.yaml's gate or evaluate section; typer.BadParameter (exit status 2) for anything
    that cannot be played."""
    import torch

    from nets.checkpoint import CheckpointError
    from play.models import ModelError, load_evaluator
    from play.netplayer import NetPlayer
    from stages import tracking
    from stages.params import EngineSection, ParamsError, load_params, section

    if section_name not in ("gate", "evaluate"):
        raise typer.BadParameter("must be gate or evaluate", param_hint="--section")

    if threads < 1:
        raise typer.BadParameter("must be >= 1", param_hint="--threads")
    # One thread each: an engine beside another CPU job (GNU Go in a match, a second engine)
    # with torch's default threads runs many times slower (docs/benchmarks.md).
    torch.set_num_threads(threads)
    source = _params_file(params_path)
    try:
        raw = load_params(source)
        gate = section(raw, section_name, EngineSection, source=source)
        store = tracking.settings(raw, source)
    except ParamsError as e:
        raise typer.BadParameter(str(e), param_hint="--params") from None
    try:
        path = resolve_model(model, store, lineage)
        net, model_id = load_evaluator(path, device=device, seed=seed or 0)
        return NetPlayer(
            net,
            params=gate.search.params(),
            visits=visits if visits is not None or seconds is not None else 400,
            seconds=seconds,
            leaves_per_game=leaves or gate.leaves_per_game,
            resign_below=resign_below,
            resign_after=resign_after,
            seed=0 if seed is None else seed,
            model_id=model_id,
            considered=gate.search.considered,
        )
    except (ModelError, CheckpointError, ValueError) as e:
        raise typer.BadParameter(str(e), param_hint="--model") from None


@app.command(rich_help_panel="Play")
def gtp(
    rules: Annotated[
        str, typer.Option(help="Rules preset, KataGo shorthand or JSON.")
    ] = "tromp-taylor",
    model: Annotated[
        str | None,
        typer.Option(
            help="The net to play: a checkpoint, a run folder (its newest champion), an "
            "MLflow model URI (models:/tengen@champion), or uniform (the search on uniform "
            "priors). Without it, --player plays."
        ),
    ] = None,
    lineage: Lineage = None,
    visits: Annotated[
        int | None, typer.Option(help="Visits per move (default 400 without --seconds).")
    ] = None,
    seconds: Annotated[
        float | None, typer.Option(help="Seconds per move at most (the clock may allow less).")
    ] = None,
    device: Annotated[str, typer.Option(help="Where the net runs: cpu or cuda.")] = "cpu",
    threads: Annotated[int, typer.Option(help="torch CPU threads of this engine.")] = 1,
    leaves: Annotated[
        int | None, typer.Option(help="Leaves per network batch (default: gate.leaves_per_game).")
    ] = None,
    resign_below: Annotated[
        float | None, typer.Option(help="Resign when the win rate falls below this (off).")
    ] = None,
    resign_after: Annotated[int, typer.Option(help="No resignation before this move.")] = 20,
    params: Annotated[
        Path | None, typer.Option(help="params.yaml for the search knobs (default: ./params.yaml).")
    ] = None,
    section: Annotated[
        str, typer.Option(help="Its section whose search and leaves_per_game to use.")
    ] = "gate",
    player: Annotated[str, typer.Option(help="Who chooses the moves without --model.")] = "random",
    size: Annotated[int, typer.Option(help="Board size until `boardsize` says otherwise.")] = 19,
    komi: Annotated[float | None, typer.Option(help="Komi (default: the preset's).")] = None,
    seed: Annotated[int | None, typer.Option(help="Random seed, for reproducible games.")] = None,
    name: Annotated[
        str,
        typer.Option(
            help="What `name` answers. Lizzie 0.7 speaks kata-analyze only to a name that "
            "starts with KataGo (e.g. KataGo-protocol-tengen)."
        ),
    ] = "tengen",
) -> None:
    """Speak GTP v2 on stdin/stdout (for Sabaki, GoGui, Lizzie, gogui-twogtp, KGS, GNU Go)."""
    from play.gtp import GtpEngine
    from play.players import make_player

    if not 2 <= size <= 19:
        raise typer.BadParameter("board size must be 2..19", param_hint="--size")
    for value, hint, low in (
        (visits, "--visits", 1),
        (threads, "--threads", 1),
        (leaves, "--leaves", 1),
        (resign_after, "--resign-after", 0),
    ):
        if value is not None and value < low:
            raise typer.BadParameter(f"must be >= {low} (got {value})", param_hint=hint)
    if seconds is not None and not seconds > 0:
        raise typer.BadParameter(f"must be > 0 (got {seconds})", param_hint="--seconds")
    if resign_below is not None and not 0 < resign_below < 1:
        raise typer.BadParameter(
            f"must be in (0, 1) (got {resign_below})", param_hint="--resign-below"
        )
    the_rules = _rules(rules, komi)
    if model is not None:
        chosen = net_player(
            model, visits=visits, seconds=seconds, device=device, threads=threads,
            leaves=leaves, resign_below=resign_below, resign_after=resign_after, seed=seed,
            params_path=params, section_name=section, lineage=lineage,
        )  # fmt: skip
        chosen.warm_up(size)  # numba's kernels ready before the first command is answered
    else:
        try:
            chosen = make_player(player, seed=seed)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--player") from None
    version = _version() + (f" {chosen.model_id}" if model is not None else "")
    engine = GtpEngine(
        chosen, rules=the_rules, size=size, name=name, version=version, log=sys.stderr
    )
    if seed is not None:
        engine.seed = seed
    # Bytes that are not UTF-8 must not kill the engine: they become U+FFFD and, at worst,
    # an unknown command.
    sys.stdin.reconfigure(encoding="utf-8", errors="replace")
    with contextlib.suppress(KeyboardInterrupt):
        engine.serve(sys.stdin, sys.stdout)


@app.command("eval", rich_help_panel="Play")
def evaluate(
    model: Annotated[
        str, typer.Option(help="The net: a checkpoint, a run folder or an MLflow model URI.")
    ],
    lineage: Lineage = None,
    opponent: Annotated[
        list[str],
        typer.Option(
            help="A GTP engine to play, NAME=COMMAND or COMMAND (repeat for a ladder); the "
            "first is the anchor (Elo 0). Default: params.yaml's evaluate.opponents."
        ),
    ] = None,
    games: Annotated[int | None, typer.Option(help="Games per opponent.")] = None,
    visits: Annotated[int | None, typer.Option(help="The net's visits per move.")] = None,
    size: Annotated[int | None, typer.Option(help="Board size.")] = None,
    rules: Annotated[str | None, typer.Option(help="Rules preset.")] = None,
    komi: Annotated[float | None, typer.Option(help="Komi.")] = None,
    workers: Annotated[int | None, typer.Option(help="Games played at once.")] = None,
    out: Annotated[Path, typer.Option(help="Folder for the games and summary.json.")] = Path(
        "runs/eval"
    ),
    params: Annotated[
        Path | None, typer.Option(help="params.yaml (its evaluate section gives the defaults).")
    ] = None,
    device: Annotated[str, typer.Option(help="Where the net runs: cpu or cuda.")] = "cpu",
) -> None:
    """Rate a net against GTP engines (GNU Go by default), outside a run.

    As the evaluate stage does: win rates with 95% intervals and Bradley-Terry Elo against
    the first opponent."""
    from rich.console import Console
    from rich.table import Table

    from nets.checkpoint import CheckpointError
    from play.models import ModelError
    from stages import tracking
    from stages.cli import InputError
    from stages.evaluate import EvaluateIO, Params, run
    from stages.params import EvaluateParams, ParamsError, load_params, section

    console = Console()
    source = _params_file(params)
    try:
        raw = load_params(source)
        base = section(raw, "evaluate", EvaluateParams, source=source)
        store = tracking.settings(raw, source)
        path = resolve_model(model, store, lineage)
    except ParamsError as e:
        raise typer.BadParameter(str(e), param_hint="--params") from None
    except ModelError as e:
        raise typer.BadParameter(str(e), param_hint="--model") from None
    chosen = base.opponents
    if opponent:
        chosen = {}
        for i, text in enumerate(opponent):
            name, _, command = text.partition("=") if "=" in text.split()[0] else ("", "", text)
            chosen[name or f"opponent-{i + 1}"] = command
    overrides = {
        k: v
        for k, v in dict(games=games, visits=visits, board_size=size, rules=rules, komi=komi,
                         workers=workers).items()
        if v is not None
    }  # fmt: skip
    try:
        settings = EvaluateParams.model_validate(
            {**base.model_dump(), **overrides, "opponents": chosen,
             "anchor": next(iter(chosen)), "anchor_elo": 0.0, "past_champions": 0}
        )  # fmt: skip
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    try:
        stage_params = Params(evaluate=settings, device=device)
    except ValueError as e:
        problem = e.errors()[0]["msg"] if hasattr(e, "errors") else str(e)
        raise typer.BadParameter(problem, param_hint="--device") from None
    out = Path(out)
    io = EvaluateIO(
        generation=0, champion=path, out=out / "games", report=out / "summary.json",
        history=out / "history.json", params_path=source, reports=None, name="net",
    )  # fmt: skip

    def progress(summary):
        low, high = summary["a_win_rate_95ci"]
        console.print(
            f"net vs {summary['opponent']}: {summary['a_score']:g} of {summary['games']} "
            f"({summary['a_win_rate']:.0%}, 95% {low:.0%}-{high:.0%})"
        )

    try:
        report = run(stage_params, io, progress=progress, leave_out_missing=False)
    except (InputError, CheckpointError) as e:
        console.print(f"[red]eval: error: {e}")
        raise typer.Exit(2) from None
    n = settings.board_size
    title = f"{path} ({n}x{n}, {settings.rules}, komi {settings.komi:g}, {settings.visits} visits)"
    table = Table(title=title)
    columns = ("opponent", "stones, komi", "games", "net's score", "win rate (95%)",
               "Elo (anchor 0)")  # fmt: skip
    for column in columns:
        table.add_column(column)
    ratings = report["ratings"]
    for p in report["pairings"]:
        low, high = p["a_win_rate_95ci"]
        table.add_row(p["opponent"], f"{p['handicap']}, {p['komi']:g}", str(p["games"]),
                      f"{p['a_score']:g}", f"{p['a_win_rate']:.0%} ({low:.0%}-{high:.0%})",
                      f"{ratings[p['opponent']]['elo']:+.0f}")  # fmt: skip
    table.add_row("net", "", "", "", "", f"{report['elo']:+.0f} ± {report['elo_stderr']:.0f}")
    console.print(table)
    console.print(f"games and summary in {out}")


@app.command(rich_help_panel="Play")
def match(
    engine_a: Annotated[str, typer.Argument(help="Command line of engine A, e.g. 'tengen gtp'.")],
    engine_b: Annotated[
        str, typer.Argument(help="Command line of engine B, e.g. 'gnugo --mode gtp'.")
    ],
    games: Annotated[
        int, typer.Option(min=1, help="Games to play; A takes Black in odd games (or --a-black).")
    ] = 2,
    size: Annotated[int, typer.Option(min=2, max=19)] = 9,
    komi: Annotated[float | None, typer.Option(help="Komi (default: the rules preset's).")] = None,
    rules: Annotated[str, typer.Option(help="Rules preset, KataGo shorthand or JSON.")] = "chinese",
    handicap: Annotated[int, typer.Option(min=0, help="Fixed handicap stones for Black.")] = 0,
    a_black: Annotated[
        bool,
        typer.Option(
            "--a-black", help="A takes Black in every game (with --handicap: B gives A stones)."
        ),
    ] = False,
    max_moves: Annotated[
        int | None, typer.Option(help="Stop and score after this many moves.")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds an engine may take per command.")] = 60.0,
    referee: Annotated[
        str | None, typer.Option(help="GTP engine that settles dead stones when the two disagree.")
    ] = None,
    out: Annotated[Path, typer.Option(help="Folder for games/*.sgf and summary.json.")] = Path(
        "match"
    ),
    show: Annotated[bool, typer.Option(help="Print each final position.")] = False,
) -> None:
    """Play a match between two GTP engines; write one SGF per game and summary.json."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from gocore.rules import max_fixed_handicap
    from play.match import EngineStartError, Match, MatchConfig

    if handicap and not 2 <= handicap <= max_fixed_handicap(size):
        raise typer.BadParameter(
            f"fixed handicap on {size}x{size} is 2..{max_fixed_handicap(size)} stones",
            param_hint="--handicap",
        )
    config = MatchConfig(
        games=games,
        size=size,
        rules=_rules(rules, komi),
        handicap=handicap,
        a_black=a_black,
        max_moves=max_moves,
        timeout=timeout,
        referee=referee,
    )
    console = Console(stderr=True, soft_wrap=True)
    with Progress(
        TextColumn("[bold]match"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("", total=games)

        def report(result, summary) -> None:
            wins = summary["wins"]
            progress.update(
                task,
                advance=1,
                description=f"A {wins['A']} - B {wins['B']} "
                f"(draws {summary['draws']}, void {summary['void']})",
            )
            progress.console.print(
                f"game {result.number}: black {result.black} white {result.white} "
                f"{result.result} ({result.reason}, {result.moves} moves) {result.sgf}"
            )
            if show:
                _show_final_position(out / result.sgf, progress.console)

        try:
            summary = Match(engine_a, engine_b, config, out, progress=report).run()
        except EngineStartError as e:
            progress.stop()
            console.print(f"[red]match: error: {e}; no game played")
            raise typer.Exit(2) from None
    low, high = summary["a_win_rate_95ci"]
    rate = summary["a_win_rate"]
    console.print(
        f"A ({summary['engines']['A']['name']}) {summary['wins']['A']} wins, "
        f"B ({summary['engines']['B']['name']}) {summary['wins']['B']} wins, "
        f"{summary['draws']} draws, {summary['void']} void; "
        + (f"A's win rate {rate:.3f} [95% CI {low:.3f}, {high:.3f}]" if rate is not None else "")
    )
    console.print(f"summary: {out / 'summary.json'}")


def _show_final_position(sgf_path: Path, console) -> None:
    from play.gtp import board_diagram
    from play.sgf import read_sgf, replay

    record = read_sgf(sgf_path)
    console.print(board_diagram(replay(record)), highlight=False)
    console.print(f"result {record.result}: {record.root_comment}", highlight=False)


@nets_app.command("describe")
def nets_describe(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list instead of a table.")
    ] = False,
) -> None:
    """Every network size: blocks, channels, pooling blocks, head widths, parameters, FLOPs."""
    from nets.bench import flops_per_eval
    from nets.config import SIZES
    from nets.model import GoNet, parameter_count

    rows = []
    for name, config in SIZES.items():
        model = GoNet(config)
        rows.append(
            {
                "net": name,
                "kind": config.kind,
                "blocks": config.blocks,
                "channels": config.channels,
                "pool_blocks": list(config.pool_blocks),
                "pool_channels": config.pool_channels,
                "policy_channels": config.policy_channels,
                "value_channels": config.value_channels,
                "value_hidden": config.value_hidden,
                "parameters": parameter_count(model),
                "gflop_per_eval_19x19": round(flops_per_eval(model, 19) / 1e9, 3),
                "gflop_per_eval_9x9": round(flops_per_eval(model, 9) / 1e9, 3),
            }
        )
    if as_json:
        print(json.dumps(rows))
        return
    print(
        f"{'net':>15} {'kind':>6} {'blocks':>6} {'c':>4} {'pooling blocks':>15} {'c_pool':>6} "
        f"{'heads p/v/vfc':>13} {'parameters':>11} {'GFLOP 9x9':>9} {'GFLOP 19x19':>11}"
    )
    for r in rows:
        pools = ",".join(map(str, r["pool_blocks"])) or "-"
        heads = f"{r['policy_channels'] or '-'}/{r['value_channels'] or '-'}/{r['value_hidden']}"
        print(
            f"{r['net']:>15} {r['kind']:>6} {r['blocks']:>6} {r['channels']:>4} {pools:>15} "
            f"{r['pool_channels'] or '-':>6} {heads:>13} {r['parameters']:>11,} "
            f"{r['gflop_per_eval_9x9']:>9.3f} {r['gflop_per_eval_19x19']:>11.3f}"
        )


@bench_app.command("nets")
def bench_nets(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list instead of a table.")
    ] = False,
    seconds: Annotated[float, typer.Option(help="Seconds per measurement.")] = 1.0,
    nets: Annotated[str, typer.Option(help="Net sizes, comma separated, or 'all'.")] = "all",
    sizes: Annotated[str, typer.Option(help="Board sizes, comma separated.")] = "9,19",
    batches: Annotated[str, typer.Option(help="Batch sizes, comma separated.")] = "64,256",
) -> None:
    """Forward evaluations and training samples per second per net, board and batch."""
    from nets.bench import TABLE_HEADER, format_footer, format_row
    from nets.bench import bench_nets as run
    from nets.config import SIZES

    names = list(SIZES) if nets == "all" else [n.strip() for n in nets.split(",")]
    unknown = [n for n in names if n not in SIZES]
    if unknown:
        raise typer.BadParameter(
            f"unknown nets {unknown}; known: {', '.join(SIZES)}", param_hint="--nets"
        )
    try:
        batch_sizes = tuple(int(b) for b in batches.split(","))
    except ValueError:
        raise typer.BadParameter(
            f"expected batches like 64,256 (got {batches!r})", param_hint="--batches"
        ) from None
    rows = []
    if not as_json:
        print(TABLE_HEADER, flush=True)
    for row in run(names, _sizes(sizes), batch_sizes, seconds):
        rows.append(row)
        if not as_json:
            print(format_row(row), flush=True)
    print(json.dumps(rows) if as_json else format_footer(rows))


@bench_app.command("features")
def bench_features(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list instead of a table.")
    ] = False,
    seconds: Annotated[float, typer.Option(help="Seconds per measurement.")] = 2.0,
    sizes: Annotated[str, typer.Option(help="Board sizes, comma separated.")] = "9,19",
    batch: Annotated[int, typer.Option(help="Positions per batch.")] = 256,
) -> None:
    """Positions encoded per second beside one b6c96 forward pass on the same batch."""
    from flows.bench_features import bench_features as run
    from flows.bench_features import format_table

    board_sizes = _sizes(sizes)
    rows = run(sizes=board_sizes, batch=batch, seconds=seconds)
    print(json.dumps(rows) if as_json else format_table(rows))


def _quiet_prefect() -> None:
    """No usage analytics from Prefect's local server (set PREFECT_SERVER_ANALYTICS_ENABLED to
    turn them on): a training run should not phone home, and offline it logs an error."""
    import os

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Prefect gives its local server 20 s to start, which a loaded machine overran ("Timed out
    # while attempting to connect to ephemeral Prefect API server"): ten minutes.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "600")


@app.command("run", rich_help_panel="Train")
def run_loop(
    repo: Annotated[
        str | None,
        typer.Option(
            help="The run's folder, a git repository with DVC (default: here, or "
            "runs/PRESET with --preset)."
        ),
    ] = None,
    preset: Annotated[
        str | None,
        typer.Option(
            help="Make the run folder from params.yaml with this preset on top "
            "(flows/presets: hour, night, long)."
        ),
    ] = None,
    generations: Annotated[
        int | None, typer.Option(help="Set run.generations in the run's params.yaml first.")
    ] = None,
    make_only: Annotated[
        bool,
        typer.Option(
            help="Make the run folder (--preset) and stop, to edit its params.yaml first "
            "(a cluster's address, say)."
        ),
    ] = False,
) -> None:
    """Run the training loop from zero, or resume it where it stopped.

    Every stage of every generation of params.yaml's run, as DVC stages under a Prefect
    flow, logged to MLflow; one run a folder at a time. Ends by saying where the champion,
    the MLflow UI and the reports are."""
    _quiet_prefect()
    from mlflow.exceptions import MlflowException

    from flows.loop import StageError, loop, run_logging
    from flows.runs import RunLocked, create_run, run_lock, where
    from stages.params import ParamsError

    folder = Path(repo or (f"runs/{preset}" if preset else "."))
    try:
        if preset and not (folder / PARAMS).exists():
            create_run(folder, preset)
            print(f"made the run folder {folder} (preset {preset})")
            if make_only:
                print(f"edit {folder / PARAMS}, then: tengen run --repo {folder}")
                return
        elif make_only:
            raise ParamsError("--make-only makes a new run folder: give --preset and a --repo "
                              "that does not exist yet")  # fmt: skip
        elif preset:
            print(f"{folder} exists: going on with its params.yaml (--preset makes new folders)")
        elif not (folder / PARAMS).is_file():
            raise ParamsError(f"{folder.resolve()} holds no params.yaml: not a run folder")
        # The folder is this process's before anything else starts (Prefect, MLflow).
        with run_lock(folder), run_logging(folder) as log:
            print(f"tengen run: the whole log is in {log}", file=sys.stderr, flush=True)
            results = loop(folder, generations=generations)
    except (StageError, RunLocked, ParamsError, MlflowException) as e:
        print(f"tengen run: {_said(e)}", file=sys.stderr)
        raise typer.Exit(2) from None
    except Exception as e:
        refused = _prefect_refused(e)
        if refused is None:
            raise
        print(f"tengen run: {refused}", file=sys.stderr)
        raise typer.Exit(2) from None
    ran = sum(r["ran"] for r in results)
    print(f"{len(results)} stages: {ran} ran, {len(results) - ran} were up to date")
    print(where(folder))


@app.command("check", rich_help_panel="Train")
def check(
    repo: Annotated[
        str | None, typer.Option(help="The run's folder (default: here, or runs/PRESET).")
    ] = None,
    preset: Annotated[
        str | None,
        typer.Option(help="The run of this preset (flows/presets), made or not yet."),
    ] = None,
    install: Annotated[
        bool,
        typer.Option(
            "--install", help="Install what is missing with apt-get (as root or with sudo -n)."
        ),
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", help="Say only what is installed or fails to install.")
    ] = False,
) -> None:
    """Check the outside programs a run plays against (GNU Go), or install them.

    Says where each is, or what the run's evaluations leave out without it and how to
    install it. Exit status 1 while one is missing."""
    import yaml

    from flows.runs import SOURCE, preset_params
    from play.programs import install as install_programs
    from play.programs import which, why_not_install
    from stages.evaluate import missing_programs, needed_programs, without
    from stages.params import EvaluateParams, ParamsError, load_params, section
    from stages.spec import plan_of

    folder = Path(repo or (f"runs/{preset}" if preset else "."))
    source = folder / PARAMS
    try:
        if source.is_file():
            raw = load_params(source)
        elif preset:  # the run `make run PRESET=...` is about to make
            raw = yaml.safe_load(preset_params(preset, SOURCE / PARAMS))
            source = Path(f"preset {preset}")
        else:
            raw = load_params(_params_file(None))
        settings = section(raw, "evaluate", EvaluateParams, source=source)
        evaluation = plan_of(raw, source).evaluation
    except ParamsError as e:
        print(f"tengen check: {e}", file=sys.stderr)
        raise typer.Exit(2) from None
    if not evaluation.scheduled:
        if not quiet:
            print("no evaluation in this run (evaluate.every 0, no evaluate.at): it plays no "
                  "outside program")  # fmt: skip
        return
    missing = missing_programs(settings)
    if install and missing:
        if (why := why_not_install()) is None:
            install_programs(list(missing), log=lambda line: print(f"tengen check: {line}"))
        elif not quiet:
            print(f"tengen check: cannot install here ({why})")
        missing = missing_programs(settings)
    if not quiet:
        for program, names in needed_programs(settings).items():
            if program in missing:
                print(without(program, names))
            else:
                print(f"{program}: {which(program)} (evaluate: {', '.join(names)})")
    if missing:
        raise typer.Exit(1)


@remote_app.command("add")
def remote_add(
    url: Annotated[
        str,
        typer.Argument(
            help="A folder (a shared disk), or s3://bucket/path, gs://..., ssh://... "
            "(pip install dvc-s3, dvc-gs, dvc-ssh for those)."
        ),
    ],
    repo: Annotated[str, typer.Option(help="The run's folder.")] = ".",
    name: Annotated[str, typer.Option(help="The remote's name in .dvc/config.")] = "storage",
) -> None:
    """Make URL the run's DVC remote: each finished generation is pushed there.

    Sets run.push: true in its params.yaml: each generation, once finished, is pushed there
    (`dvc push`), and dvc.lock and the metrics are committed to the run's git (and pushed
    where its branch has an upstream). Another machine then gets the run with `git clone`
    and `dvc pull`."""
    from flows.runs import add_remote
    from stages.params import ParamsError

    try:
        where = add_remote(Path(repo), url, name)
    except ParamsError as e:
        print(f"tengen remote add: {e}", file=sys.stderr)
        raise typer.Exit(2) from None
    print(f"DVC remote {name} (default): {where}")
    print(f"{Path(repo) / PARAMS}: run.push: true (each generation pushed when it ends)")


ClusterFolder = Annotated[
    Path,
    typer.Argument(help="A folder outside every repository, such as ~/.tengen/cluster."),
]
HeadHost = Annotated[
    str,
    typer.Option(
        "--host",
        help="The head machine's address on the cluster's private network (name or IP).",
    ),
]


def _cluster(command: str, work):
    import subprocess

    from flows.cluster import ClusterError

    try:
        return work()
    except (ClusterError, OSError, subprocess.SubprocessError) as e:
        print(f"tengen cluster {command}: {e}", file=sys.stderr)
        raise typer.Exit(2) from None


@cluster_app.command("certs")
def cluster_certs(
    folder: ClusterFolder,
    host: HeadHost,
    also: Annotated[
        list[str] | None,
        typer.Option("--also", help="Another name or address of the head (repeatable)."),
    ] = None,
) -> None:
    """Make the cluster's CA and a TLS certificate and key for the scheduler, the workers and
    the client, and print how to start the scheduler and the workers with them.

    Dask then refuses every connection without a certificate this CA signed (mutual TLS,
    `tls://` addresses): no one else can reach the scheduler to run code on the workers. The
    keys are written mode 600 in a folder of mode 700; nothing is overwritten."""
    from flows.cluster import certs_howto, make_certs

    made = _cluster("certs", lambda: make_certs(folder, [host, *(also or [])]))
    print(certs_howto(made, host))


@cluster_app.command("secrets")
def cluster_secrets(folder: ClusterFolder, host: HeadHost) -> None:
    """Make fresh logins for MLflow and Prefect, in environment files of mode 600, and print
    how to start the servers, the loop and a player with them.

    server.env for the servers on the head, loop.env for `tengen run` (the MLflow user that
    alone writes the registry), worker.env for `dask worker` (Prefect's auth string),
    player.env (a read-only MLflow user), admin.env (MLflow's admin, for `tengen cluster
    users`), and mlflow-auth.ini (`mlflow server --app-name basic-auth`)."""
    from flows.cluster import make_secrets, secrets_howto

    made = _cluster("secrets", lambda: make_secrets(folder, host))
    print(secrets_howto(made, host))


@cluster_app.command("users")
def cluster_users(
    folder: ClusterFolder,
    experiment: Annotated[str, typer.Option(help="The run's mlflow.experiment.")] = "tengen",
    model: Annotated[str, typer.Option(help="The run's mlflow.registered_model.")] = "tengen",
) -> None:
    """Make the loop's and the player's users on the running MLflow server of FOLDER's
    environment files, and the experiment and registered model, managed by the loop's user
    alone (every other user reads them).

    Run it once the server has started with server.env, before anyone else logs in."""
    from mlflow.exceptions import MlflowException

    from flows.cluster import make_users

    try:
        done = _cluster("users", lambda: make_users(folder.expanduser(), experiment=experiment,
                                                    model=model))  # fmt: skip
    except MlflowException as e:  # outside a login (the server's answer to none)
        print(f"tengen cluster users: {_said(e)}", file=sys.stderr)
        raise typer.Exit(2) from None
    for line in done:
        print(line)


@app.command("ablate", rich_help_panel="Train")
def ablate(
    arms: Annotated[
        list[str] | None,
        typer.Argument(
            help="The arms beside the full method: no-forced-playouts, no-global-pooling, "
            "no-opponent-policy, no-ownership-score, no-go-features, gumbel, fixed-cap-VISITS."
        ),
    ] = None,
    name: Annotated[str, typer.Option(help="The ablation: runs/ablate-NAME.")] = "paper",
    budget: Annotated[
        float | None,
        typer.Option(help="Self-play network evaluations per arm (a new ablation needs it)."),
    ] = None,
    points: Annotated[
        int | None, typer.Option(help="Compute points the budget is cut into (default 4).")
    ] = None,
    preset: Annotated[
        str | None, typer.Option(help="The arms start from params.yaml with this preset on top.")
    ] = None,
    base: Annotated[
        Path | None,
        typer.Option(help="The params.yaml the arms start from (default: the source tree's)."),
    ] = None,
    show_report: Annotated[
        bool, typer.Option("--report", help="Print the acceleration factors; run nothing.")
    ] = False,
    list_arms: Annotated[bool, typer.Option("--list", help="List the arms and exit.")] = False,
) -> None:
    """Run the KataGo paper's ablations side by side at matched self-play compute.

    Each arm is a run folder under runs/ablate-NAME, evaluated on the same ladder at the same
    compute points: Elo against compute in MLflow (experiment ablate-NAME) and elo.png. Run
    again to go on (or with a larger --budget)."""
    _quiet_prefect()
    from mlflow.exceptions import MlflowException

    from flows import ablate as A
    from flows.loop import StageError, run_logging
    from flows.runs import RunLocked
    from stages.params import ParamsError

    if list_arms:
        for arm in A.ARMS:
            print(f"{arm:<20} {A.ARMS[arm][0]}")
        print(f"{'fixed-cap-<visits>':<20} {A.arm_change('fixed-cap-1')[0].replace(' 1 ', ' N ')}")
        return
    try:
        if show_report and not (Path("runs") / f"ablate-{name}" / A.SPEC).exists():
            raise A.AblationError(f"no ablation runs/ablate-{name}; run `tengen ablate` first")
        ab = A.open_ablation(
            name, arms, budget=None if show_report else budget, points=points, preset=preset,
            base=base,
        )  # fmt: skip
        if show_report:
            print(A.format_report(A.report(ab)))
            return
        with run_logging(ab.folder):
            rep = A.ablation_flow(name, list(ab.arms), ab.budget, points, preset, ab.base)
        compare = A.compare_link(ab)
    except (ParamsError, StageError, RunLocked, MlflowException) as e:
        print(f"tengen ablate: {_said(e)}", file=sys.stderr)
        raise typer.Exit(2) from None
    print(A.format_report(rep))
    print(f"chart:     {ab.folder / 'elo.png'}   (and: cd {ab.folder} && dvc plots show)")
    print(f"MLflow UI: mlflow ui --backend-store-uri {ab.store()}   (experiment {ab.experiment})")
    print(f"the arms side by side: {compare}")


@app.command("serve", rich_help_panel="Train")
def serve(
    repo: Annotated[str, typer.Option(help="The run's folder.")] = ".",
    cron: Annotated[
        str | None, typer.Option(help='A cron schedule, e.g. "0 2 * * *" (params: run.serve_cron).')
    ] = None,
    interval: Annotated[
        float | None,
        typer.Option(help="Minutes between runs (params: run.serve_interval_minutes)."),
    ] = None,
    more: Annotated[
        int | None,
        typer.Option(help="Generations each scheduled run adds (params: run.serve_generations)."),
    ] = None,
) -> None:
    """Serve the loop on a schedule (a Prefect deployment), adding generations each time.

    Each scheduled run adds generations to the run in --repo. Runs until stopped (Ctrl-C)."""
    _quiet_prefect()
    from prefect import serve as prefect_serve

    from flows.loop import deployment
    from stages.params import ParamsError

    try:
        dep = deployment(repo, cron=cron, interval=interval, more=more)
    except ParamsError as e:
        print(f"tengen serve: {e}", file=sys.stderr)
        raise typer.Exit(2) from None
    prefect_serve(dep)


@app.command("ui", rich_help_panel="Look")
def ui(
    repo: Annotated[str, typer.Option(help="The run's folder (its mlflow.db).")] = ".",
    port: Annotated[int, typer.Option(help="The port to serve on.")] = 5000,
    host: Annotated[str, typer.Option(help="The address to listen on.")] = "127.0.0.1",
) -> None:
    """Open the MLflow UI on the run's tracking store, at its training runs."""
    import os

    from stages.params import ParamsError, load_params
    from stages.tracking import experiment_id_of, runs_url, settings, store_uri

    try:
        params = settings(load_params(Path(repo) / PARAMS), Path(repo) / PARAMS)
    except ParamsError as e:
        print(f"tengen ui: {e}", file=sys.stderr)
        raise typer.Exit(2) from None
    if params is None:
        print("tengen ui: MLflow tracking is off (mlflow.enabled: false)", file=sys.stderr)
        raise typer.Exit(2)
    uri = store_uri(params, Path(repo).resolve())
    mlflow = str(Path(sys.executable).parent / "mlflow")
    found = experiment_id_of(params, Path(repo).resolve())
    page = f"http://{host}:{port}"
    print(f"MLflow UI on {uri}: {runs_url(page, found) if found else page}", flush=True)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # a local UI does not phone home
    args = ["ui", "--backend-store-uri", uri, "--host", host, "--port", str(port)]
    os.execv(mlflow, [mlflow, *args])


@app.command("data", rich_help_panel="Look")
def data_report(
    source: Annotated[
        Path,
        typer.Argument(
            help="A folder of self-play shards (a generation's, a window, or a "
            "run's data/selfplay), one shard (part-K.parquet), or a data report "
            "(reports/data/gen-N.json)."
        ),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Print the data-quality report of self-play rows.

    Game lengths and ends, Black's results per komi and rules, policy-target entropy, value
    calibration, duplicates."""
    from stages import data
    from stages.cli import InputError

    try:
        if source.is_file() and source.suffix != ".parquet":
            report = data.load_report(source)
        else:
            report = data.report(data.shards_of(source))
    except InputError as e:
        print(f"tengen {e}", file=sys.stderr)  # "tengen data: ..."
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(report, indent=1))
    else:
        print(data.format_report(report, f"self-play data: {source}"))


@app.command("report", rich_help_panel="Look")
def report(
    repo: Annotated[
        Path, typer.Argument(help="The run's folder (default: here; `make run`'s run).")
    ] = Path("."),
    out: Annotated[
        Path | None,
        typer.Option(help="Where to write index.html and the PNGs (default: RUN/reports/report)."),
    ] = None,
    games: Annotated[
        int, typer.Option(help="Games of the latest champion against GNU Go to show.")
    ] = 4,
    mlflow_ui: Annotated[
        str,
        typer.Option(
            help="The MLflow UI the links go to (a tracking server's URI is used as it is)."
        ),
    ] = "http://127.0.0.1:5000",
) -> None:
    """Write a run's page: one self-contained HTML file that opens without a network.

    Elo against generation and compute, win rates, losses, window, self-play data, gate,
    nets, games against GNU Go on a board, and links to the MLflow runs and SGF files; a PNG
    per chart."""
    from stages.cli import InputError
    from stages.report import write_report

    try:
        page = write_report(repo, out, games=games, mlflow_ui=mlflow_ui)
    except InputError as e:
        print(f"tengen {e}", file=sys.stderr)  # "tengen report: ..."
        raise typer.Exit(2) from None
    print(f"report: {page.resolve()}")
    if (repo / ".dvc").is_dir():  # a run from before the loop installed it, too
        from stages.vega import install_dvc_template

        try:
            print(f"dvc plots show draws offline: {install_dvc_template(repo)}")
        except Exception as e:  # noqa: BLE001 - the page is written; this is an extra
            print(f"tengen report: DVC's plots template not installed: {e}", file=sys.stderr)


@app.command("pipeline", rich_help_panel="Train")
def pipeline(
    params: Annotated[str, typer.Option(help="The params.yaml to read run.generations from.")] = (
        PARAMS
    ),
    out: Annotated[str, typer.Option(help="Where to write the DVC pipeline.")] = "dvc.yaml",
) -> None:
    """Write dvc.yaml from params.yaml: every stage of every generation, for `dvc repro`.

    In a DVC repository, also the page template with which `dvc plots show` draws
    offline."""
    from flows.pipeline import write_dvc_yaml
    from stages.params import ParamsError
    from stages.vega import install_dvc_template

    try:
        path = write_dvc_yaml(params, out)
    except ParamsError as e:
        raise typer.BadParameter(str(e), param_hint="--params") from None
    print(f"wrote {path}")
    if (Path(out).parent / ".dvc").is_dir():
        print(f"wrote {install_dvc_template(Path(out).parent)} (dvc plots show's page)")


@bench_app.command("selfplay")
def bench_selfplay(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list instead of a table.")
    ] = False,
    seconds: Annotated[float, typer.Option(help="Seconds per measurement.")] = 10.0,
    runs: Annotated[
        str, typer.Option(help="net:board pairs, comma separated.")
    ] = "b6c96:9,b2c16:9,b6c96:19",
    slots: Annotated[
        str, typer.Option(help="Games played at once; several, comma separated, in one process.")
    ] = "32",
    leaves: Annotated[int, typer.Option(help="Leaves per game per network batch.")] = 2,
    params: Annotated[str, typer.Option(help="The params.yaml to take selfplay from.")] = PARAMS,
    device: Annotated[
        str, typer.Option(help="Where the search, the rules and the network run: cpu or cuda.")
    ] = "cpu",
    dtype: Annotated[
        str,
        typer.Option(
            help="The net's arithmetic on a GPU: float32, bfloat16 or float16; several, comma "
            "separated."
        ),
    ] = "float32",
    compile: Annotated[
        str,
        typer.Option(
            help="torch.compile's mode for the net: none (eager), default, reduce-overhead or "
            "max-autotune; several, comma separated, a row each."
        ),
    ] = "none",
    encoder_registers: Annotated[
        str,
        typer.Option(
            help="With --device cuda: at most this many registers a thread for the encoder's "
            "kernels (none: the compiler's choice, 245 for the encoder); several, comma "
            "separated, a row each. Default: TENGEN_CUDA_ENCODER_REGISTERS, else none."
        ),
    ] = "",
    profile: Annotated[
        str | None,
        typer.Option(help="Write a cProfile of the first row's self-play to this file."),
    ] = None,
    lockstep: Annotated[
        int,
        typer.Option(
            help="On the CPU, after the timed runs: model the GPU encoder's lockstep over this "
            "many steps (each row's encode timed alone, a warp of 32 charged its slowest row), "
            "with the rows in row order, packed, and in the GPU's launch order. 0: not modelled."
        ),
    ] = 0,
) -> None:
    """Self-play visits per second beside the same net's evaluations per second, no search."""
    from flows.bench_selfplay import HEADER, format_row
    from flows.bench_selfplay import bench_selfplay as run
    from nets.config import SIZES
    from nets.evaluator import COMPILE_MODES

    slot_counts = [s.strip() for s in slots.split(",")]
    if not all(s.isdigit() and int(s) > 0 for s in slot_counts):
        raise typer.BadParameter(
            f"expected positive game counts, comma separated (got {slots!r})", param_hint="--slots"
        )
    dtypes = [d.strip() for d in dtype.split(",")]
    for d in dtypes:
        if d not in ("float32", "bfloat16", "float16"):
            raise typer.BadParameter(
                f"expected float32, bfloat16 or float16 (got {d!r})", param_hint="--dtype"
            )
        if d != "float32" and device == "cpu":
            raise typer.BadParameter(
                f"{d} runs on a GPU only (--device cuda); the CPU evaluates in float32",
                param_hint="--dtype",
            )

    compiles = [c.strip() for c in compile.split(",")]
    for c in compiles:
        if c not in COMPILE_MODES:
            raise typer.BadParameter(
                f"expected {', '.join(COMPILE_MODES)} (got {c!r})", param_hint="--compile"
            )
    if lockstep < 0 or (lockstep and device != "cpu"):
        raise typer.BadParameter(
            f"expected a count of steps >= 0, modelled with --device cpu (got {lockstep}); on a "
            "GPU the encode phase measures the lockstep itself",
            param_hint="--lockstep",
        )
    caps = [c.strip() for c in encoder_registers.split(",")]
    if device != "cuda":
        if caps not in ([""], ["none"]):
            raise typer.BadParameter(
                "a register cap applies to the CUDA kernels: --device cuda",
                param_hint="--encoder-registers",
            )
        caps = [None]
    else:
        from gocore import cuda

        try:  # none given: the environment's cap (an error names the variable)
            caps = (
                [cuda.parse_registers(c) for c in caps]
                if caps != [""]
                else [cuda.encoder_registers()]
            )
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--encoder-registers") from None
    pairs = []
    for item in runs.split(","):
        net, _, board = item.strip().partition(":")
        if net not in SIZES or not board.isdigit() or not 2 <= int(board) <= 19:
            raise typer.BadParameter(
                f"expected net:board pairs like b6c96:9 with a known net (got {item!r}); "
                f"nets: {', '.join(SIZES)}",
                param_hint="--runs",
            )
        pairs.append((net, int(board)))
    rows = []
    if not as_json:
        print(HEADER, flush=True)
    for row in run(pairs, slots=[int(s) for s in slot_counts], leaves=leaves, seconds=seconds,
                   params_path=params, device=device, dtypes=dtypes, compiles=compiles,
                   encoder_registers=caps, profile=profile, lockstep=lockstep):  # fmt: skip
        rows.append(row)
        if not as_json:
            print(format_row(row), flush=True)
    if as_json:
        print(json.dumps(rows))


@bench_app.command("scale")
def bench_scale(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the result as JSON instead of a table.")
    ] = False,
    net: Annotated[str, typer.Option(help="The net (random init).")] = "b4c32",
    games: Annotated[int, typer.Option(help="Games per measurement.")] = 96,
    shards: Annotated[int, typer.Option(help="Shards on the cluster (one process: 1).")] = 2,
    params: Annotated[str, typer.Option(help="The params.yaml to take selfplay from.")] = PARAMS,
    worker_threads: Annotated[
        int, typer.Option(min=1, help="Torch and numba threads per worker.")
    ] = 1,
) -> None:
    """Self-play in one process and on a Dask LocalCluster of 1 and 2 workers.

    One generation's games: games/s, speed-up against the ideal, time not spent playing."""
    from flows.bench_scale import HEADER, format_row, summary
    from flows.bench_scale import bench_scale as run
    from nets.config import SIZES
    from stages.params import ParamsError

    if net not in SIZES:
        raise typer.BadParameter(
            f"unknown net {net!r}; nets: {', '.join(SIZES)}", param_hint="--net"
        )
    if not 2 <= shards <= games:
        raise typer.BadParameter(
            f"between 2 and --games ({games}) shards (got {shards})", param_hint="--shards"
        )
    log = functools.partial(print, file=sys.stderr, flush=True)
    try:
        result = run(
            net=net, games=games, shards=shards, params_path=params,
            worker_threads=worker_threads, log=log,
        )  # fmt: skip
    except ParamsError as e:
        print(f"tengen bench scale: error: {e}", file=sys.stderr)
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(result))
        return
    print(f"{net}, {games} games a measurement ({shards} shards on the cluster), {params}")
    print(HEADER)
    for row in result["rows"]:
        print(format_row(row))
    print(summary(result))


@bench_app.command("threads")
def bench_threads(
    net: Annotated[str, typer.Option(help="The net.")] = "b4c32",
    board: Annotated[int, typer.Option(help="Board size.")] = 9,
    seconds: Annotated[float, typer.Option(help="Seconds per measurement.")] = 5.0,
    busy: Annotated[int, typer.Option(help="CPU-bound processes beside it.")] = 1,
    params: Annotated[str, typer.Option(help="The params.yaml to take selfplay from.")] = PARAMS,
) -> None:
    """Self-play with torch's default threads (baseline) against one thread.

    Idle and beside a busy process: the two choices of selfplay.threads."""
    from flows.bench_selfplay import bench_beside_a_busy_process
    from nets.config import SIZES

    if net not in SIZES:
        raise typer.BadParameter(f"unknown net {net!r}; known: {', '.join(SIZES)}", "--net")
    if busy < 0 or not 2 <= board <= 19:
        raise typer.BadParameter("--busy must be >= 0 and --board within 2..19")
    rows = bench_beside_a_busy_process(net, board, seconds=seconds, params_path=params, busy=busy)
    print(f"{'setting':>24} {'threads':>7} {'busy':>4} {'visits/s':>9} {'net evals/s':>11}")
    for r in rows:
        rate, net_rate = r["selfplay_visits_per_s"], r["net_only_evals_per_s"]
        print(f"{r['setting']:>24} {r['torch_threads']:>7} {r['busy_processes']:>4} "
              f"{rate:>9,.0f} {net_rate:>11,.0f}")  # fmt: skip
    idle = rows[1]["selfplay_visits_per_s"] / rows[0]["selfplay_visits_per_s"]
    beside = rows[3]["selfplay_visits_per_s"] / rows[2]["selfplay_visits_per_s"]
    print(
        f"idle: one thread gives {idle:.2f}x the visits/s of torch's default threads; beside "
        f"{busy} busy process(es): one thread gives {beside:.2f}x the visits/s of torch's "
        "default threads"
    )


@bench_app.command("shuffle")
def bench_shuffle(
    rows: Annotated[int, typer.Option(help="Rows of the synthetic 9x9 history.")] = 5_000_000,
    rows_per_file: Annotated[int, typer.Option(help="Rows per window file.")] = 20_000,
    work: Annotated[
        Path | None,
        typer.Option(
            help="Folder for the synthetic history (kept, and reused by a run with the "
            "same --rows; the windows are removed); default a temporary folder."
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list instead of a table.")
    ] = False,
) -> None:
    """The window shuffle: the stage's polars engine beside the pyarrow baseline.

    On the same synthetic history (a window of all of it): rows/min and peak resident memory
    of each."""
    import shutil
    import tempfile

    from flows.bench_shuffle import HEADER, format_row
    from flows.bench_shuffle import bench_shuffle as run

    if rows < 1 or rows_per_file < 1:
        raise typer.BadParameter("--rows and --rows-per-file must be at least 1")
    folder = Path(tempfile.mkdtemp(prefix="tengen-bench-shuffle-")) if work is None else work
    try:
        results, made = run(rows, folder, rows_per_file=rows_per_file)
    finally:
        if work is None:
            shutil.rmtree(folder, ignore_errors=True)
    if as_json:
        print(json.dumps(results))
        return
    print(f"synthetic history: {rows:,} rows of 9x9 in 10 generations (made in {made:.0f} s)")
    print(HEADER)
    for r in results:
        print(format_row(r))
    base, ours = results
    same = "the same files" if base["digest"] == ours["digest"] else "DIFFERENT files (a bug)"
    print(f"polars: {ours['rows_per_minute'] / base['rows_per_minute']:.2f}x the baseline's "
          f"rows/min, {ours['peak_rss_bytes'] / base['peak_rss_bytes']:.2f}x its peak memory; "
          f"{same}")  # fmt: skip


@bench_app.command("play")
def bench_play(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list instead of a table.")
    ] = False,
    nets: Annotated[str, typer.Option(help="Nets, comma separated.")] = "b4c32,b6c96",
    visits: Annotated[str, typer.Option(help="Visits per move, comma separated.")] = (
        "64,400,1600"
    ),
    board: Annotated[int, typer.Option(help="Board size.")] = 9,
    moves: Annotated[int, typer.Option(help="Positions measured per figure.")] = 5,
    leaves: Annotated[
        int | None, typer.Option(help="Leaves per network batch (default: gate.leaves_per_game).")
    ] = None,
    params: Annotated[Path | None, typer.Option(help="params.yaml (gate.search).")] = None,
) -> None:
    """Seconds per move of `tengen gtp --model` beside the net alone at the same batch."""
    from flows.bench_play import HEADER, bench_one, format_row
    from nets.config import SIZES
    from stages.params import EngineSection, load_params, section

    source = _params_file(params)
    engine = section(load_params(source), "gate", EngineSection, source=source)
    names = [n.strip() for n in nets.split(",") if n.strip()]
    if bad := [n for n in names if n not in SIZES]:
        raise typer.BadParameter(
            f"unknown nets {bad}; nets: {', '.join(SIZES)}", param_hint="--nets"
        )
    try:
        counts = [int(v) for v in visits.split(",")]
    except ValueError:
        raise typer.BadParameter(f"expected numbers like 64,400 (got {visits!r})") from None
    rows = []
    if not as_json:
        print(HEADER, flush=True)
    for name in names:
        for row in bench_one(name, board, counts, leaves=leaves or engine.leaves_per_game,
                             moves=moves, params=engine.search.params()):  # fmt: skip
            rows.append(row)
            if not as_json:
                print(format_row(row), flush=True)
    if as_json:
        print(json.dumps(rows))


@bench_app.command("rules")
def bench_rules(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list instead of a table.")
    ] = False,
    seconds: Annotated[
        float, typer.Option(help="Seconds of play per board size and engine.")
    ] = 3.0,
    sizes: Annotated[str, typer.Option(help="Board sizes, comma separated.")] = "9,19",
) -> None:
    """Random games per second on one core, beside OpenSpiel's C++ Go in the same run."""
    from gocore.bench import bench_rules as run
    from gocore.bench import format_table

    rows = run(_sizes(sizes), seconds)
    print(json.dumps(rows) if as_json else format_table(rows))


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise typer.BadParameter(
            f"expected sizes like 9,19 (got {text!r})", param_hint="--sizes"
        ) from None
    if not all(2 <= s <= 19 for s in sizes):
        raise typer.BadParameter(f"board sizes are 2..19 (got {text!r})", param_hint="--sizes")
    return sizes


# `tengen` lists its commands by use, in this order (typer keeps the order of registration);
# a command without one of these panels comes last (tests/test_docs.py: there is none).
PANELS = ("Train", "Play", "Look", "Bench")


def _panel_order(command) -> int:
    panel = command.rich_help_panel
    return PANELS.index(panel) if panel in PANELS else len(PANELS)


app.registered_commands.sort(key=_panel_order)


if __name__ == "__main__":
    app()
