"""`tengen cluster certs|secrets|users`: the secure cluster's files and MLflow users
(flows.cluster; docs/cluster.md), registered by flows.cli."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

cluster_app = typer.Typer(
    help="A cluster that lets no one else in: TLS certificates, logins, MLflow users."
)


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
    from play.mlflow_store import said

    try:
        done = _cluster("users", lambda: make_users(folder.expanduser(), experiment=experiment,
                                                    model=model))  # fmt: skip
    except MlflowException as e:  # outside a login (the server's answer to none)
        print(f"tengen cluster users: {said(e)}", file=sys.stderr)
        raise typer.Exit(2) from None
    for line in done:
        print(line)
