"""Shards fanned out: a stage that plays games runs its shards in its own process, or as
Prefect tasks on a Dask cluster through prefect-dask's DaskTaskRunner (params.yaml `cluster:`).

- `address: null`: the shards run here, one after another (what a stage did before shards).
- `local:N`: a `distributed.LocalCluster` of N worker processes, started for the stage and
  closed after it.
- `tls://host:8786` (any Dask scheduler address): the shards go to that cluster's workers,
  which must have the same tengen installed. A `tls://` scheduler is reached with
  `cluster.security`'s CA and client certificate (`tengen cluster certs`), and refuses any
  client without a certificate its CA signed.

A shard is a call of a module-level function with plain arguments (pickled to the worker) that
returns plain data (its files as bytes): no shared filesystem is needed, and the stage writes
what comes back into its output folder. The Prefect tasks report to the API this process uses
(PREFECT_API_URL; when there is none, a temporary local server is started here and the workers
started here are pointed at it, instead of one temporary server per worker). A task that
raises is retried by Prefect (not for bad input: a ValueError); a worker that dies mid-shard
has its shard rescheduled by Dask on another worker (the scheduler's
`distributed.scheduler.allowed-failures`, 3 by default). Workers' torch and numba threads are
`cluster.worker_threads` each.

This module lives in stages (not flows, where the loop's Prefect flows are) because the
fan-out happens inside a stage's own process, which `dvc repro` starts as well as the loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from stages.params import ClusterParams, ParamsError, load_params, section

LOCAL = "local:"
IN_PROCESS = ClusterParams(address=None, worker_threads=1, resources={}, security=None)


def cluster_params(params_path) -> ClusterParams:
    """params.yaml's `cluster:` section (null in a file from before it existed)."""
    return section(load_params(params_path), "cluster", ClusterParams, source=params_path)


def worker_environment(threads: int) -> dict[str, str]:
    """What a worker process started here runs with: its thread counts (numba's batched
    drivers read TENGEN_THREADS; torch's by the shard itself)."""
    return {
        "TENGEN_THREADS": str(threads),
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
    }


def on_worker(threads: int | None) -> None:
    """A shard's first step on a cluster's worker (`threads`: cluster.worker_threads; None in
    the stage's own process, whose threads are set): torch's threads, and numba's batched
    drivers' (TENGEN_THREADS, read by gocore.jit)."""
    if threads is not None:
        from stages.cli import set_threads

        os.environ["TENGEN_THREADS"] = str(threads)
        set_threads(threads)


def worker_name() -> str:
    """Where a shard ran: host and process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def fan_out(
    work: Callable[..., Any],
    calls: Sequence[dict],
    *,
    cluster: ClusterParams,
    name: str,
    log: Callable[[str], None] | None = None,
) -> list[Any]:
    """[work(**call) for call in calls], in that order, wherever `cluster` says. Each call has
    an `index` (its shard's); `name` names the Prefect flow run and its tasks ("selfplay
    gen-3": tasks "selfplay gen-3 shard-K"). Each result has the `index` of its call, and
    comes back exactly once (checked)."""
    if cluster.address is None:
        results = [work(**call) for call in calls]
    else:
        results = _on_dask(work, list(calls), cluster=cluster, name=name,
                           log=log or (lambda _: None))  # fmt: skip
    return each_shard_once(results, [call["index"] for call in calls], name)


def each_shard_once(results: list, indices: list[int], name: str) -> list:
    """The results in the order of `indices`, after checking that each index came back
    exactly once (a rescheduled shard must replace its lost run, never add to it)."""
    back = sorted(r.index for r in results)
    if back != sorted(indices):
        raise RuntimeError(
            f"{name}: shards {back} came back; expected each of {sorted(indices)} exactly once"
        )
    by_index = {r.index: r for r in results}
    return [by_index[i] for i in indices]


@contextlib.contextmanager
def prefect_api(log: Callable[[str], None]) -> Iterator[str | None]:
    """The Prefect API the tasks report to: PREFECT_API_URL if this process has one (the
    loop passes its own to its stages), else a temporary local server started here for the
    stage, exported to the workers started here. Yields the URL (None: Prefect's own)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    url = PREFECT_API_URL.value()
    if url:
        yield url
        return
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    server.start()
    log(f"Prefect: a temporary API for this stage at {server.api_url}")
    previous = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = server.api_url
    try:
        with temporary_settings({PREFECT_API_URL: server.api_url}):
            yield server.api_url
    finally:
        if previous is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = previous
        _drain_prefect()
        server.stop()


def _drain_prefect(timeout: float = 30.0) -> None:
    """Send this process's queued Prefect logs and events while the temporary API still
    answers. Left to Prefect's exit hook, they would be sent to the stopped server and
    retried for over a minute after the stage's work was done."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (APILogWorker, EventsWorker):
        service.drain_all(timeout=timeout)


def task_runner(cluster: ClusterParams, api_url: str | None):
    """prefect-dask's DaskTaskRunner for `cluster.address`."""
    from prefect_dask import DaskTaskRunner

    address = cluster.address
    if address.startswith(LOCAL):
        env = worker_environment(cluster.worker_threads)
        if api_url:
            env["PREFECT_API_URL"] = api_url
        return DaskTaskRunner(
            cluster_kwargs={
                "n_workers": int(address[len(LOCAL) :]),
                "threads_per_worker": 1,  # one shard at a time per worker process
                "processes": True,
                "resources": dict(cluster.resources) or None,
                "silence_logs": logging.ERROR,
                "env": env,
            }
        )
    security = dask_security(cluster)
    client = {"security": security} if security is not None else None
    return DaskTaskRunner(address=address, client_kwargs=client)


def dask_security(cluster: ClusterParams):
    """distributed's Security for `cluster.security` (None: a plain scheduler): mutual TLS,
    this process showing the client certificate. ParamsError for a file that is missing or
    that this user cannot read."""
    tls = cluster.security
    if tls is None:
        return None
    from distributed.security import Security

    files = {}
    for key in ("ca_file", "cert", "key"):
        path = Path(getattr(tls, key)).expanduser()
        if not path.is_file() or not os.access(path, os.R_OK):
            why = "cannot be read by this user" if path.is_file() else "does not exist"
            raise ParamsError(
                f"cluster.security.{key}: {path} {why} (`tengen cluster certs DIR` makes the "
                "CA and the certificates; docs/cluster.md)"
            )
        files[key] = str(path)
    return Security(
        tls_ca_file=files["ca_file"],
        tls_client_cert=files["cert"],
        tls_client_key=files["key"],
        require_encryption=True,
    )


def _transient(task, task_run, state) -> bool:
    """Prefect retries a shard that failed on anything but its input (a ValueError: a bad
    checkpoint or parameter would fail again)."""
    try:
        state.result()
    except ValueError:
        return False
    except Exception:  # noqa: BLE001 - any other failure may pass on another try
        return True
    return False


def _on_dask(work, calls: list[dict], *, cluster: ClusterParams, name: str, log) -> list:
    import dask
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE

    shard = task(
        work,
        name=name,
        task_run_name=name + " shard-{index}",
        retries=2,
        retry_delay_seconds=1,
        retry_condition_fn=_transient,
        cache_policy=NO_CACHE,  # DVC owns caching by content; a shard's bytes are not kept
        persist_result=False,
    )

    def shards() -> list:
        annotations = {"resources": dict(cluster.resources)} if cluster.resources else {}
        with dask.annotate(**annotations):
            futures = [shard.submit(**call) for call in calls]
        return [f.result() for f in futures]

    if not cluster.address.startswith(LOCAL):
        _answers(cluster)
    with prefect_api(log) as api_url:
        runner = task_runner(cluster, api_url)
        # Dask's own INFO lines (scheduler, nannies, workers) would fill the stage's log. Set
        # after task_runner, whose import of distributed sets its loggers' levels from Dask's
        # config.
        logging.getLogger("distributed").setLevel(logging.WARNING)
        start = time.perf_counter()
        results = flow(
            shards, name="tengen-shards", flow_run_name=name, task_runner=runner,
            log_prints=False, validate_parameters=False,
        )()  # fmt: skip
        log(f"{len(calls)} shards on {cluster.address} in {time.perf_counter() - start:.1f} s")
    return results


CONNECT_TIMEOUT = "10s"


def _answers(cluster: ClusterParams) -> None:
    """ParamsError unless a Dask scheduler answers at `cluster.address` (before any Prefect
    API is started or shard sent)."""
    from distributed import Client

    security = dask_security(cluster)
    try:
        with Client(cluster.address, timeout=CONNECT_TIMEOUT, set_as_default=False,
                    security=security):  # fmt: skip
            pass
    except OSError as e:
        tls = " with cluster.security's certificate" if security else ""
        raise ParamsError(
            f"cluster.address {cluster.address}: no Dask scheduler answered{tls} ({e}); start "
            "one and its workers as docs/cluster.md says (a TLS scheduler refuses a client "
            "whose certificate another CA signed, and a plain tcp:// one)"
        ) from None
