"""The MLflow store that a block of code in this process talks to, put back afterwards.

Used by the stages' runs (stages.tracking) and by fetching a model by URI (play.models);
it lives here, below both, and imports nothing else of ours.
"""

from __future__ import annotations

import contextlib
import os
import re
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


def said(error) -> str:
    """An MLflow error in one line; a login or a write that the tracking server refused says
    whose and what to set (never the password)."""
    code = getattr(error, "error_code", "")
    text = str(getattr(error, "message", error))
    user = os.environ.get("MLFLOW_TRACKING_USERNAME")
    if code == "UNAUTHENTICATED" or "error code 401" in text:
        who = f"the login of user {user!r}" if user else "a request without a login"
        return (
            f"the MLflow tracking server refused {who} (401 Unauthorized): set "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD to one of its users "
            "(docs/cluster.md)"
        )
    if code == "PERMISSION_DENIED" or "error code 403" in text:
        return (
            f"the MLflow tracking server denied user {user!r} a write (403 Forbidden): only "
            "the loop's user writes the run's experiment and registered model (docs/cluster.md)"
        )
    return text.splitlines()[0] if text else type(error).__name__


def shown(uri: str) -> str:
    """A tracking URI as it may be printed: a password in it masked."""
    return re.sub(r"^([a-z][a-z0-9+.-]*://[^/@:]*:)[^/@]*@", r"\1***@", uri, flags=re.I)
