"""`tengen bench scale`: one generation's self-play (the stage's own code, params.yaml's
`selfplay` settings, a random-init net) played three ways in one run: in the stage's process as
today (the named baseline, `selfplay.threads` torch threads, every game in one shard), and in
the same `shards` shards on a Dask LocalCluster of one worker process and of two
(`cluster.worker_threads` threads each), through
prefect-dask as `cluster: tcp://...` sends it. Each row gives games/s; the cluster rows their
speed-up over one worker beside the ideal, and the share of the workers' time not spent in a
shard (scheduling, transfers, the shorter shard waiting for the longer). The cluster's own
start-up (workers importing torch and numba's cached kernels) is timed apart: `local:N` pays
it once per stage, a standing cluster once.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import yaml

from bench.table import Column, Table
from play.names import PARAMS
from stages.params import ClusterParams, load_params


def _champion(folder: Path, net: str) -> Path:
    import torch

    from nets import checkpoint
    from nets.config import net_config
    from nets.model import GoNet

    torch.manual_seed(0)
    return checkpoint.save(GoNet(net_config(net)), folder / f"{net}.pt", {"model_id": net})


def _play(folder: Path, params_path: Path, model: Path, name: str, cluster: ClusterParams):
    from stages import selfplay

    params, io = selfplay.prepare(
        params_path, 1, model=model, out=folder / name, metrics=folder / f"{name}.json"
    )
    return selfplay.run(params, io, cluster=cluster, progress=False)


def bench_scale(
    *,
    net: str = "b4c32",
    games: int = 96,
    shards: int = 2,
    params_path: str | Path = PARAMS,
    worker_threads: int = 1,
    log=print,
) -> dict:
    """The rows (a dict per way of playing) and the cluster start-up times."""
    from distributed import LocalCluster

    from stages import cli
    from stages.fanout import prefect_api, worker_environment

    raw = load_params(params_path)
    raw["selfplay"] = dict(raw["selfplay"], games=games, shards=1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tengen-bench-scale-") as tmp:
        folder = Path(tmp)
        model = _champion(folder, net)
        params_path = folder / PARAMS

        def params_with(shards: int, games_: int = games) -> Path:
            selfplay = dict(raw["selfplay"], shards=shards, games=games_)
            params_path.write_text(yaml.safe_dump({**raw, "selfplay": selfplay}))
            return params_path

        here = ClusterParams(address=None, worker_threads=1, resources={}, security=None)
        cli.set_threads(raw["selfplay"]["threads"])
        log("warming up numba's kernels in this process ...")
        _play(folder, params_with(1, 2), model, "warm", here)
        m = _play(folder, params_with(1), model, "one-process", here)
        rows.append(_row(f"one process, {raw['selfplay']['threads']} threads (today)", m, None))
        with prefect_api(log):  # one API for every row: the stage would start its own
            for workers in (1, 2):
                log(f"starting a LocalCluster of {workers} worker(s) ...")
                start = time.perf_counter()
                with LocalCluster(
                    n_workers=workers, threads_per_worker=1, processes=True,
                    env=worker_environment(worker_threads), dashboard_address=None,
                ) as cluster:  # fmt: skip
                    cluster.get_client().wait_for_workers(workers)
                    up = time.perf_counter() - start
                    there = ClusterParams(
                        address=cluster.scheduler_address, worker_threads=worker_threads,
                        resources={}, security=None,
                    )  # fmt: skip
                    # Each worker's first shard loads torch and numba's cache: not counted.
                    _play(folder, params_with(workers, workers), model, f"warm-{workers}", there)
                    m = _play(folder, params_with(shards), model, f"cluster-{workers}", there)
                    row = _row(f"LocalCluster, {workers} worker(s)", m, workers)
                    row["cluster_start_s"] = round(up, 1)
                    rows.append(row)
    one, two = rows[1]["games_per_s"], rows[2]["games_per_s"]
    return {
        "net": net,
        "games": games,
        "shards": shards,
        "rows": rows,
        "speedup_2_over_1": round(two / one, 3) if one else None,
        "ideal": 2.0,
    }


def _row(name: str, metrics: dict, workers: int | None) -> dict:
    seconds = metrics["seconds"]
    row = {
        "way": name,
        "games": metrics["games"],
        "shards": metrics["shards"],
        "seconds": seconds,
        "games_per_s": round(metrics["games"] / seconds, 3),
        "visits_per_s": metrics["visits_per_s"],
    }
    if workers is not None:
        busy = metrics["shard_seconds"] / (workers * seconds)
        row["not_playing"] = round(1.0 - busy, 4)
    return row


TABLE = Table(
    (
        Column("", 44, "way", align="<"),
        Column("games", 5, "games"),
        Column("shards", 6, "shards"),
        Column("seconds", 8, "seconds", ".1f"),
        Column("games/s", 8, "games_per_s", ".3f"),
        Column("visits/s", 9, "visits_per_s", ",.0f"),
        Column("not playing", 11, lambda r: r.get("not_playing"), ".1%"),
        Column("start-up s", 10, lambda r: r.get("cluster_start_s"), ".1f"),
    )
)


def summary(result: dict) -> str:
    """The speed-up line and what it predicts for N machines."""
    today, one, two = result["rows"]
    speedup = result["speedup_2_over_1"]
    return "\n".join(
        [
            f"2 workers / 1 worker: {speedup:.2f}x (ideal {result['ideal']:.1f}x); 2 workers / "
            f"today's stage: {two['games_per_s'] / today['games_per_s']:.2f}x",
            f"workers' time not in a shard: {one['not_playing']:.1%} with 1, "
            f"{two['not_playing']:.1%} with 2; cluster start-up {two['cluster_start_s']:.1f} s "
            "(local:N pays it each stage; a standing cluster once)",
            f"predicts N machines like this one (2 workers each): N x {two['games_per_s']:.3f} "
            f"games/s, e.g. 8 machines {8 * two['games_per_s']:.2f}, while a generation has at "
            "least 2 shards a machine (a stage ends with its slowest shard) and the shards' "
            "files (~a shard's rows in Parquet) reach this process faster than they are played",
        ]
    )
