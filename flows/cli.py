"""The `tengen` command line: the app, its Train commands, and the registration of the others
(flows/cli_play.py: gtp, eval, match, analysis, engines; flows/cli_look.py: ui, data, report,
nets; flows/cli_cluster.py: cluster; bench/cli.py: bench).

Each command imports what it needs when it runs, so `tengen gtp` starts without loading the
rest of the project.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from bench.cli import bench_app
from flows import cli_cluster, cli_look, cli_play
from play.names import PARAMS

app = typer.Typer(
    help="tengen: learn Go from zero by self-play, as a reproducible pipeline.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # a docstring's paragraphs reflowed to the terminal
)
app.add_typer(bench_app, name="bench", rich_help_panel="Bench")
app.add_typer(cli_look.nets_app, name="nets", rich_help_panel="Look")
app.add_typer(cli_play.engines_app, name="engines", rich_help_panel="Play")
remote_app = typer.Typer(help="Where a run's data goes off the machine: its DVC remote.")
app.add_typer(remote_app, name="remote", rich_help_panel="Train")
app.add_typer(cli_cluster.cluster_app, name="cluster", rich_help_panel="Train")


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

    from flows.runs import preset_params
    from play.defaults import DEFAULTS
    from play.programs import install as install_programs
    from play.programs import which, why_not_install
    from stages.evaluate import missing_programs, needed_programs, without
    from stages.params import EvaluateParams, ParamsError, load_params, params_file, section
    from stages.spec import plan_of

    folder = Path(repo or (f"runs/{preset}" if preset else "."))
    source = folder / PARAMS
    try:
        if source.is_file():
            raw = load_params(source)
        elif preset:  # the run `make run PRESET=...` is about to make
            raw = yaml.safe_load(preset_params(preset, DEFAULTS))
            source = Path(f"preset {preset}")
        else:
            raw = load_params(params_file(None))
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


# `tengen` lists its commands by use, in this order (typer keeps the order of registration);
# a command without one of these panels comes last (tests/test_docs.py: there is none).
PANELS = ("Train", "Play", "Look", "Bench")


def _panel_order(command) -> int:
    panel = command.rich_help_panel
    return PANELS.index(panel) if panel in PANELS else len(PANELS)


# The commands of the other modules (flows.cli_play, flows.cli_look), each in its panel.
app.registered_commands += [*cli_play.commands.registered_commands,
                            *cli_look.commands.registered_commands]  # fmt: skip
app.registered_commands.sort(key=_panel_order)


if __name__ == "__main__":
    app()
