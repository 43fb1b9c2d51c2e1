"""`tengen ui`, `tengen data`, `tengen report` and `tengen nets describe`: the commands that
show a run, its data and the nets (flows.cli registers them)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from play.names import PARAMS

commands = typer.Typer()  # registered into flows.cli.app
nets_app = typer.Typer(help="The networks: sizes and parameter counts.")


@nets_app.command("describe")
def nets_describe(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list instead of a table.")
    ] = False,
) -> None:
    """Every network size: blocks, channels, pooling blocks, head widths, parameters, FLOPs."""
    from bench.nets import flops_per_eval
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


@commands.command("ui", rich_help_panel="Look")
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


@commands.command("data", rich_help_panel="Look")
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


@commands.command("report", rich_help_panel="Look")
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
