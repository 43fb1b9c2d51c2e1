"""The loop flow: generation after generation, each stage a Prefect task that runs the DVC
stage of dvc.yaml (`dvc repro --single-item <stage>-<N>`), so the loop and `dvc repro` are
one execution path: after the loop every output is in DVC's cache and `dvc status` is clean.

Resuming is DVC's: a stage whose deps, params and outs are unchanged is skipped, and since
every stage writes its outputs whole or not at all, a loop killed at any point continues from
the stage it was in, without redoing or losing work. A stage that fails on its inputs (exit
status 2: a missing or broken file, a bad params key) fails the loop at once; one killed from
outside (a signal, out of memory) is retried.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.context import get_run_context

from flows.pipeline import evaluation_of, generations_of, stages_of, write_dvc_yaml
from flows.runs import completed_generations, set_generations
from stages.atomic import write_text
from stages.lines import lines
from stages.params import load_params
from stages.tracking import ENV_PARENT, open_tracker

STAGES = ("selfplay", "shuffle", "train", "ema", "gate", "promote")  # of train.net's line


class StageFailed(RuntimeError):
    """A stage that failed on its inputs or its code: retrying cannot help."""


class StageInterrupted(RuntimeError):
    """A stage killed from outside (a signal, out of memory): worth another try."""


def _retry_interrupted(task_, task_run, state) -> bool:
    return isinstance(state.data, StageInterrupted)


def _environment(parent_run: str | None = None) -> dict[str, str]:
    """This environment's bin first on PATH: the stages' `python` and `dvc` are this Python's
    and its dvc, whichever Python the shell would find. With the loop's MLflow run, which
    the stages nest their runs under."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = dict(os.environ, PATH=path)
    # What this process inherited must not steer the stages: another loop's parent run, an
    # MLflow run to resume, another DVC repository's root.
    for name in (ENV_PARENT, "MLFLOW_RUN_ID", "DVC_ROOT"):
        env.pop(name, None)
    if parent_run:
        env[ENV_PARENT] = parent_run
    return env


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def clear_stale_locks(repo: str | Path) -> int:
    """Drop the entries of DVC's read/write lock (.dvc/tmp/rwlock) held by processes that no
    longer run: a loop killed mid-stage leaves its dvc's entries behind, and DVC would refuse
    to touch those outputs again. Returns the entries dropped."""
    path = Path(repo) / ".dvc" / "tmp" / "rwlock"
    if not path.exists():
        return 0
    try:
        lock = json.loads(path.read_text() or "{}")
    except json.JSONDecodeError:
        return 0  # being written by a running dvc: not ours to touch
    dropped = 0
    for path_key, info in list(lock.get("write", {}).items()):
        if not _alive(info["pid"]):
            del lock["write"][path_key]
            dropped += 1
    for path_key, infos in list(lock.get("read", {}).items()):
        alive = [info for info in infos if _alive(info["pid"])]
        dropped += len(infos) - len(alive)
        if alive:
            lock["read"][path_key] = alive
        else:
            del lock["read"][path_key]
    if dropped:
        write_text(json.dumps(lock), path)
    return dropped


def failure(returncode: int, output: str) -> type[RuntimeError]:
    """StageInterrupted for a stage killed by a signal: dvc itself (a negative status), or
    the stage's command, which dvc reports as a negative status or, through a shell that does
    not exec it, as 128 + the signal. StageFailed for the rest."""
    code = re.search(r"exited with (-?\d+)", output)
    if returncode < 0 or (code and not 0 <= int(code.group(1)) <= 128):
        return StageInterrupted
    return StageFailed


def metrics_file(stage: dict) -> str | None:
    """The JSON a dvc.yaml stage reports its results in: its metrics file, or promote's
    promotion.json."""
    for entry in stage.get("metrics", []):
        return next(iter(entry)) if isinstance(entry, dict) else entry
    for out in stage.get("outs", []):
        if isinstance(out, str) and out.endswith("/champion"):
            return f"{out}/promotion.json"
    return None


@task(
    name="stage",
    task_run_name="{name}",
    retries=2,
    retry_delay_seconds=5,
    retry_condition_fn=_retry_interrupted,
)
def run_stage(
    name: str, repo: str, parent_run: str | None = None, metrics: str | None = None
) -> dict:
    """Reproduce one DVC stage; returns {"stage", "ran", "metrics"}."""
    logger = get_run_logger()
    result = subprocess.run(
        ["dvc", "repro", "--single-item", name],
        cwd=repo,
        capture_output=True,
        text=True,
        env=_environment(parent_run),
    )
    output = result.stdout + result.stderr
    if result.returncode != 0:
        raise failure(result.returncode, output)(f"{name} failed:\n{output[-3000:]}")
    ran = f"Running stage '{name}'" in output
    logger.info("%s: %s", name, "ran" if ran else "up to date, skipped")
    values = {}
    if metrics and (Path(repo) / metrics).exists():
        values = json.loads((Path(repo) / metrics).read_text())
    return {"stage": name, "ran": ran, "metrics": values}


@flow(name="tengen-loop")
def loop(repo: str = ".", generations: int | None = None, more: int | None = None) -> list[dict]:
    """Run (or resume) the run in `repo` (a git repository with DVC): dvc.yaml is written
    from its params.yaml (run.generations), then every stage of every generation, in order.
    In the source tree the stages depend on the code too; in a run folder outside it, with
    tengen installed, they do not.

    `generations` sets run.generations in params.yaml first; `more` sets it to the
    generations already promoted plus `more` (what a scheduled run does each time)."""
    logger = get_run_logger()
    params_path = Path(repo) / "params.yaml"
    if more is not None:
        generations = completed_generations(Path(repo)) + more
    if generations is not None:
        set_generations(params_path, generations)
    raw = load_params(params_path)
    count = generations_of(raw, params_path)
    nets = lines(raw, params_path)
    evaluation = evaluation_of(raw, params_path)
    tracker = open_tracker(raw, params_path, base=Path(repo).resolve())
    in_source = (Path(repo) / "gocore").is_dir()
    write_dvc_yaml(params_path, Path(repo) / "dvc.yaml", code_deps=in_source)
    if dropped := clear_stale_locks(repo):
        logger.info("resuming: dropped %d DVC lock entries of a killed run", dropped)
    parent = None
    if tracker is not None:
        if closed := tracker.close_dead_runs():
            logger.info("MLflow: marked %d runs of a killed loop KILLED", closed)
        flow_run = get_run_context().flow_run
        parent = tracker.start_loop(
            f"loop {flow_run.name}", {"prefect.flow_run_id": str(flow_run.id)}
        )
    results = []
    status = "FAILED"
    try:
        if tracker is not None:
            tracker.client.log_param(parent, "run.generations", count)
            logger.info("MLflow: run %s in %s", parent, tracker.uri)
        for n in range(count):
            stages = stages_of(n, in_source, nets, evaluation)
            for name, stage in stages.items():
                results.append(run_stage(name, str(repo), parent, metrics_file(stage)))
            summary = generation_summary(results[-len(stages) :])
            if tracker is not None:
                for key, value in summary.items():
                    tracker.client.log_metric(parent, key, value, step=n)
            promoted = next(r for r in results[-len(stages) :] if r["stage"] == f"promote-{n}")
            promoted = promoted["metrics"]
            champion = promoted.get("champion") or {}
            logger.info(
                "generation %d: %s, champion %s",
                n,
                "a candidate passed its gate" if promoted.get("promoted") else "no promotion",
                f"{champion['id']} ({champion.get('net', '?')})" if champion else "none yet",
            )
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        if tracker is not None:
            tracker.client.set_terminated(parent, status)
    return results


def generation_summary(results: list[dict]) -> dict[str, float]:
    """One generation's headline figures, from its stages' metrics files: train.net's
    losses, and the gate of the candidate that decided the promotion (promotion.json)."""
    by = {r["stage"].rsplit("-", 1)[0]: r["metrics"] for r in results}
    out = {
        "selfplay_games": by.get("selfplay", {}).get("games"),
        "window_rows": by.get("train", {}).get("window_rows"),
        **{f"loss_{k}": v for k, v in (by.get("train", {}).get("loss") or {}).items()},
    }
    promotion = by.get("promote", {})
    evaluation = by.get("evaluate", {})
    out["elo"] = evaluation.get("elo")
    out["elo_stderr"] = evaluation.get("elo_stderr")
    out["gate_win_rate"] = (promotion.get("decision") or {}).get("win_rate")
    if "promoted" in promotion:
        out["promoted"] = float(promotion["promoted"])
    numbers = {k: v for k, v in out.items() if isinstance(v, int | float)}
    return {k: float(v) for k, v in numbers.items() if not isinstance(v, bool)}


def deployment(
    repo: str | Path = ".",
    *,
    cron: str | None = None,
    interval: float | None = None,
    more: int | None = None,
):
    """The loop as a scheduled Prefect deployment of the run in `repo`: on a cron schedule or
    every `interval` minutes (else params.yaml's run.serve_cron / run.serve_interval_minutes),
    each run adding `more` generations (run.serve_generations). One run at a time: a run that
    comes due while another is going waits for it (DVC's lock would refuse it)."""
    from datetime import timedelta

    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy

    from stages.params import ParamsError

    repo = Path(repo).resolve()
    params_path = repo / "params.yaml"
    run = load_params(params_path).get("run") or {}
    if cron is None and interval is None:
        cron, interval = run.get("serve_cron"), run.get("serve_interval_minutes")
    if (cron is None) == (interval is None):
        raise ParamsError(
            f"{params_path}: give the schedule as a cron line or an interval in minutes, not "
            "both or neither (--cron / --interval, or run.serve_cron / "
            "run.serve_interval_minutes)"
        )
    if interval is not None and (
        isinstance(interval, bool) or not isinstance(interval, int | float)
    ):
        raise ParamsError(f"{params_path}: the interval must be a number of minutes ({interval!r})")
    if cron is not None and not isinstance(cron, str):
        raise ParamsError(f"{params_path}: the cron schedule must be a string ({cron!r})")
    if interval is not None and not interval > 0:
        raise ParamsError(f"{params_path}: the interval must be > 0 minutes (got {interval})")
    more = more if more is not None else run.get("serve_generations", 1)
    if isinstance(more, bool) or not isinstance(more, int) or more < 1:
        raise ParamsError(f"{params_path}: run.serve_generations must be >= 1 (got {more!r})")
    try:
        return loop.to_deployment(
            name=f"tengen-{repo.name}",
            cron=cron,
            interval=timedelta(minutes=interval) if interval is not None else None,
            parameters={"repo": str(repo), "more": more},
            concurrency_limit=ConcurrencyLimitConfig(
                limit=1, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE
            ),
            description=f"tengen: {more} more generation(s) of the run in {repo} each time",
            tags=["tengen"],
        )
    except ValueError as e:  # a cron line Prefect cannot parse
        raise ParamsError(f"{params_path}: bad schedule: {e}") from None
