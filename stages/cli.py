"""What every stage's command line shares: `--generation` and `--params`, and one way to
fail: a clear message naming the file and the stage that should have made it, exit status 2,
no traceback."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from mlflow.exceptions import MlflowException

from nets.checkpoint import CheckpointError
from stages.params import DEFAULT_PATH, ParamsError
from stages.tracking import StageRun, stage_run


class InputError(ValueError):
    """A missing, empty or corrupt input, named with the stage that should have made it."""


def parser(stage: str, doc: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python -m stages.{stage}", description=(doc or "").split("\n")[0]
    )
    p.add_argument("--generation", type=int, required=True)
    p.add_argument("--params", type=Path, default=DEFAULT_PATH)
    return p


def finish(
    stage: str,
    work: Callable[[StageRun | None], dict],
    *,
    params: Path,
    generation: int,
    net: str | None = None,
) -> int:
    """Run the stage inside its MLflow run (None when tracking is off), log its metrics
    there, and print them as JSON; or print its error (exit status 2)."""
    try:
        with stage_run(params, stage, generation, net) as run:
            metrics = work(run)
            if run is not None:
                run.log_metrics(metrics)
    except (ParamsError, InputError, CheckpointError) as e:
        print(f"{stage}: error: {e}", file=sys.stderr)
        return 2
    except MlflowException as e:
        print(f"{stage}: MLflow error ({params}: mlflow section): {e}", file=sys.stderr)
        return 2
    print(json.dumps(metrics, indent=2, sort_keys=True))
    return 0
