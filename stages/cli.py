"""What every stage's command line shares: `--generation` and `--params`, and one way to
fail: a clear message naming the file and the stage that should have made it, exit status 2,
no traceback."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from stages.params import DEFAULT_PATH, ParamsError


class InputError(ValueError):
    """A missing, empty or corrupt input, named with the stage that should have made it."""


def read_report(path: Path, reader: str, writer: str):
    """The JSON of a report another stage wrote: InputError from `reader` (the stage or
    command reading it) naming the file and what to run (`writer`: "selfplay-3", "the gate
    stage") where it is missing or cannot be read."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{reader}: {path} does not exist; run {writer} first") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{reader}: {path} cannot be read ({e}); rerun {writer}") from None


def parser(stage: str, doc: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python -m stages.{stage}", description=(doc or "").split("\n")[0]
    )
    p.add_argument("--generation", type=int, required=True)
    p.add_argument("--params", type=Path, default=DEFAULT_PATH)
    return p


def finish(
    stage: str,
    work: Callable,
    model,
    *,
    params: Path,
    generation: int,
    net: str | None = None,
) -> int:
    """Run the stage inside its MLflow run (None when tracking is off; `model` is the stage's
    Params, whose sections the run logs), log its metrics there, and print them as JSON; or
    print its error (exit status 2)."""
    from mlflow.exceptions import MlflowException

    from nets.errors import CheckpointError  # not nets.checkpoint: no torch import
    from stages.tracking import stage_run

    # SIGTERM (the loop stopping, `kill`) as Ctrl-C: the temporary output is removed and the
    # MLflow run ends KILLED, instead of a process that vanishes mid-write.
    previous = None
    with contextlib.suppress(ValueError):  # not the main thread
        previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with stage_run(params, stage, generation, net, sections=tuple(model.model_fields)) as run:
            metrics = work(run)
            if run is not None:
                run.log_metrics(metrics)
    except (ParamsError, InputError) as e:
        print(f"{stage}: error: {e}", file=sys.stderr)
        return 2
    except CheckpointError as e:
        print(f"{stage}: error: {e}; {_rerun(e.path)}", file=sys.stderr)
        return 2
    except MlflowException as e:
        from play.mlflow_store import said

        print(f"{stage}: MLflow error ({params}: mlflow section): {said(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{stage}: stopped; nothing of this run was kept", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    print(json.dumps(metrics, indent=2, sort_keys=True))
    return 0


def _rerun(path) -> str:
    from stages.layout import made_by

    writer = made_by(path) if path is not None else None
    return f"rerun {writer}" if writer else "rerun the stage that wrote it"


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def set_threads(threads: int) -> None:
    """The torch CPU threads of this stage's process (its section's `threads`). torch's default,
    one per core, makes the stages' small evaluations many times slower with any other CPU
    job beside them (docs/benchmarks.md, `tengen bench threads`)."""
    import torch

    torch.set_num_threads(threads)
