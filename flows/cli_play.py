"""`tengen gtp`, `tengen eval` and `tengen match`: the commands that play a net (flows.cli
registers them), and what they share: which checkpoint `--model` names and the net player."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Annotated

import typer

commands = typer.Typer()  # registered into flows.cli.app


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
    from stages.params import EngineSection, ParamsError, load_params, params_file, section

    if section_name not in ("gate", "evaluate"):
        raise typer.BadParameter("must be gate or evaluate", param_hint="--section")

    if threads < 1:
        raise typer.BadParameter("must be >= 1", param_hint="--threads")
    # One thread each: an engine beside another CPU job (GNU Go in a match, a second engine)
    # with torch's default threads runs many times slower (docs/benchmarks.md).
    torch.set_num_threads(threads)
    source = params_file(params_path)
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


@commands.command(rich_help_panel="Play")
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


@commands.command("eval", rich_help_panel="Play")
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
    from stages.params import EvaluateParams, ParamsError, load_params, params_file, section

    console = Console()
    source = params_file(params)
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


@commands.command(rich_help_panel="Play")
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
    from stages.evaluate import KATAGO, MissingProgram, engine_command

    if handicap and not 2 <= handicap <= max_fixed_handicap(size):
        raise typer.BadParameter(
            f"fixed handicap on {size}x{size} is 2..{max_fixed_handicap(size)} stones",
            param_hint="--handicap",
        )
    # `{katago}`: the installed KataGo's GTP engine (tengen engines install katago).
    try:
        engine_a, engine_b = (engine_command(e) if KATAGO in e else e for e in (engine_a, engine_b))
    except MissingProgram as e:
        raise typer.BadParameter(f"{e.command}: KataGo is not installed; run `tengen engines "
                                 "install katago`", param_hint="ENGINE") from None  # fmt: skip
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


@commands.command(
    "analysis",
    rich_help_panel="Play",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def analysis(ctx: typer.Context) -> None:
    """KataGo's JSON analysis engine on stdin/stdout (for KaTrain), with KataGo's command line.

    tengen analysis -model M [-config C] [-override-config K=V,...] [-analysis-threads N]
    [-quit-without-waiting] [-params P] [-device cpu|cuda] [-seed S]. M as `tengen gtp
    --model` takes it; C in KataGo's `key = value` form (maxVisits, maxTime,
    reportAnalysisWinratesAs, numAnalysisThreads and tengenBoardSizes are used, KataGo's other
    keys accepted and ignored). The search's knobs are params.yaml's gate section."""
    import argparse

    from play.analysis import AnalysisEngine, Settings, parse_config, parse_overrides
    from stages.params import ParamsError, load_params, params_file

    parser = argparse.ArgumentParser(prog="tengen analysis", add_help=True)
    parser.add_argument("-model", required=True)
    parser.add_argument("-config")
    parser.add_argument("-override-config", dest="override", default="")
    parser.add_argument("-analysis-threads", dest="threads", type=int)
    parser.add_argument("-quit-without-waiting", dest="quit", action="store_true")
    parser.add_argument("-params", type=Path)
    parser.add_argument("-device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("-seed", type=int, default=0)
    parser.add_argument("-lineage", type=Path)
    opts = parser.parse_args(ctx.args)  # exit status 2 with argparse's message

    def refuse(message: str) -> None:
        print(f"tengen analysis: {message}", file=sys.stderr)
        raise typer.Exit(2)

    try:
        config = {}
        if opts.config is not None:
            path = Path(opts.config)
            if not path.is_file():
                refuse(f"-config {path}: no such file")
            config = parse_config(path.read_text(errors="replace"), str(path))
        config.update(parse_overrides(opts.override))
        threads = opts.threads
        if threads is None:
            threads = int(config.get("numAnalysisThreads", "1"))
        if threads < 1:
            refuse(f"analysis threads must be >= 1 (got {threads})")
        source = params_file(opts.params)
        trained = load_params(source)["selfplay"]["board_sizes"]
        settings = Settings.from_config(config, (int(size) for size in trained))
    except (ValueError, TypeError, ParamsError, KeyError) as e:
        refuse(str(e))
    try:
        player = net_player(
            opts.model, visits=settings.max_visits, seconds=None, device=opts.device, threads=1,
            leaves=None, resign_below=None, resign_after=20, seed=opts.seed,
            params_path=opts.params, section_name="gate", lineage=opts.lineage,
        )  # fmt: skip
    except typer.BadParameter as e:  # named as KataGo's command line names it: -model, -params
        hint = "-" + str(e.param_hint or "--model").lstrip("-")
        message = e.message.replace(f"-{hint}", hint)
        refuse(message if hint in message else f"{hint}: {message}")
    player.warm_up(min(settings.board_sizes))
    if settings.ignored:
        print(f"tengen analysis: config keys with no meaning to tengen, ignored: "
              f"{', '.join(settings.ignored)}", file=sys.stderr)  # fmt: skip
    engine = AnalysisEngine(
        lambda i: player if i == 0 else player.fork(opts.seed + i), settings, out=sys.stdout,
        threads=threads, version=_version() + f" {player.model_id}".rstrip(), model_name=opts.model,
        log=lambda message: print(message, file=sys.stderr, flush=True),
    )  # fmt: skip
    print("tengen analysis: started, ready to begin handling requests", file=sys.stderr,
          flush=True)  # fmt: skip
    sys.stdin.reconfigure(encoding="utf-8", errors="replace")
    with contextlib.suppress(KeyboardInterrupt):
        engine.serve(sys.stdin, wait=not opts.quit)


engines_app = typer.Typer(help="Outside engines to play against: KataGo (installed from PyPI).")


@engines_app.command("install")
def engines_install(
    engine: Annotated[str, typer.Argument(help="The engine: katago.")],
    board_size: Annotated[
        int, typer.Option(help="The board size it is set up for (faster than any size).")
    ] = 9,
) -> None:
    """Install an engine into the user's cache and print its GTP command line."""
    from play import katago

    if engine != "katago":
        raise typer.BadParameter(f"unknown engine {engine!r}; known: katago", param_hint="ENGINE")
    if not 2 <= board_size <= 19:
        raise typer.BadParameter("must be within 2..19", param_hint="--board-size")
    try:
        found = katago.install(lambda line: print(f"tengen engines install: {line}", flush=True),
                               board_size=board_size)  # fmt: skip
    except katago.InstallError as e:
        print(f"tengen engines install: {e}", file=sys.stderr)
        raise typer.Exit(2) from None
    print(f"KataGo {found.version()} in {found.home}")
    print(f"GTP at 1 visit a move: {found.gtp_command(visits=1)}")
    print(f"analysis engine: {found.analysis_command()}")


@engines_app.command("list")
def engines_list() -> None:
    """The outside engines this machine has, and their GTP command lines."""
    from play import katago, programs

    gnugo = programs.which("gnugo")
    print(f"gnugo   {gnugo or 'not installed (tengen check installs it)'}")
    found = katago.installed()
    if found is None:
        print(f"katago  not installed (tengen engines install katago; {katago.home()})")
    else:
        print(f"katago  {found.version()}, {found.board_size()}x{found.board_size()}: "
              f"{found.gtp_command(visits=1)}")  # fmt: skip
