"""The MLflow store that a block of code in this process talks to, put back afterwards.

Used by the stages' runs (stages.tracking) and by fetching a model by URI (play.models);
it lives here, below both, and imports nothing else of ours.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def tracking_uri_for(uri: str | None) -> Iterator[None]:
    """MLflow's fluent API (and its model registry) on `uri` for the block; None leaves
    them as they are. mlflow.set_tracking_uri also exports MLFLOW_TRACKING_URI to child
    processes, so both are put back afterwards: a later stage, loop or model fetch in this
    process must not use this block's store."""
    import mlflow

    if uri is None:
        yield
        return
    before_env = os.environ.get("MLFLOW_TRACKING_URI")
    before = mlflow.get_tracking_uri() if before_env else None
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        if before_env is not None:
            mlflow.set_tracking_uri(before)
            os.environ["MLFLOW_TRACKING_URI"] = before_env
        else:
            mlflow.set_tracking_uri(None)  # back to MLflow's default, and unexported
            os.environ.pop("MLFLOW_TRACKING_URI", None)
