"""The pipeline's stages as Prefect tasks. Each task runs the stage's `run(params, io)` in
this process, on the section of params.yaml it reads; the loop flow chains them."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from stages import selfplay as selfplay_stage
from stages.fanout import cluster_params
from stages.params import DEFAULT_PATH


@task(name="selfplay", task_run_name="selfplay gen-{generation}")
def selfplay(
    generation: int,
    *,
    params_path: str | Path = DEFAULT_PATH,
    model: str | Path | None = None,
    out: str | Path | None = None,
    metrics: str | Path | None = None,
) -> dict:
    """Play one generation's self-play games, its shards where params.yaml's `cluster:`
    says; returns the stage's metrics."""
    params, io = selfplay_stage.prepare(
        params_path, generation, model=model, out=out, metrics=metrics
    )
    return selfplay_stage.run(params, io, cluster=cluster_params(params_path), progress=False)
