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

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.context import get_run_context

from flows.pipeline import generation, write_dvc_yaml
from flows.runs import (
    PushError,
    RunLocked,
    check_push,
    completed_generations,
    is_source_tree,
    push_generation,
    run_lock,
    set_generations,
)
from gocore.atomic import write_text
from stages import data, layout
from stages.handoff import ENV as SERVER_ENV
from stages.handoff import REFUSED
from stages.params import ParamsError, load_params, run_section
from stages.report import write_report
from stages.server import serving
from stages.spec import plan_of
from stages.tracking import ENV_PARENT, Tracker, settings
from stages.vega import install_dvc_template

STAGES = ("selfplay", "shuffle", "train", "ema", "gate", "promote")  # of train.net's line


class StageError(RuntimeError):
    """A stage that stopped the run; its message is what `tengen run` says, whole."""


class StageFailed(StageError):
    """A stage that failed on its inputs or its code: retrying cannot help."""


class StageInterrupted(StageError):
    """A stage killed from outside (a signal, out of memory): worth another try."""


# DVC's own lines in a stage's output, which say that it failed but not why.
_DVC_LINE = re.compile(r"^(ERROR: failed to reproduce|Having any troubles\?|Running stage |"
                       r"Updating lock file|Stage '.*' didn't change|Use `dvc push`)")  # fmt: skip
_STAGE_ERROR = re.compile(r"^[\w.-]+: (error|MLflow error|stopped)\b")
_STAGE_WARNING = re.compile(r"^[\w.-]+: warning: (.*)$")


def last_error(output: str, killed: bool = False) -> str:
    """The line of a stage's output that says why it failed: its own last error line (a
    stage's `<stage>: error: ...`), else, for one that was not `killed` (whose last lines
    are whatever it was doing), its last line that is not DVC's, else DVC's."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in reversed(lines):
        if _STAGE_ERROR.match(line):
            return line
    for line in reversed(lines):
        if not killed and not _DVC_LINE.match(line):
            return line
        if killed and line.startswith("ERROR: "):
            return line
    return lines[-1] if lines else "(no output)"


def stage_error(name: str, returncode: int, output: str, log: Path | None) -> StageError:
    """The error of a stage that ended with `returncode`: StageInterrupted or StageFailed
    (failure()), its message one block: the stage and its exit status, its own last error
    line, where its whole output is, and that running again resumes there."""
    kind = failure(returncode, output)
    code = re.search(r"exited with (-?\d+)", output)  # the stage's own status, as dvc says it
    status = int(code.group(1)) if code else returncode
    how = f"killed by signal {-status}" if status < 0 else f"exit status {status}"
    lines = [f"{name} failed ({how}): {last_error(output, kind is StageInterrupted)}"]
    if log is not None:
        lines.append(f"  its whole output: {log}")
    lines.append(f"  Run again to resume at {name}; the stages before it are kept.")
    return kind("\n".join(lines))


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
    if api := _prefect_api_url():  # a stage's shards report to this loop's Prefect API
        env["PREFECT_API_URL"] = api
    return env


def _prefect_api_url() -> str | None:
    """The Prefect API this process uses: PREFECT_API_URL, or the temporary local server
    Prefect started for it."""
    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:
            return str(client.api_url).rstrip("/")
    except Exception:  # noqa: BLE001 - no API here: the stage starts its own if it needs one
        return None


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


def lock_holders(repo: str | Path) -> set[int]:
    """The live processes holding entries of DVC's read/write lock."""
    path = Path(repo) / ".dvc" / "tmp" / "rwlock"
    try:
        lock = json.loads(path.read_text() or "{}")
    except (FileNotFoundError, json.JSONDecodeError):
        return set()
    pids = {info["pid"] for info in lock.get("write", {}).values()}
    pids |= {info["pid"] for infos in lock.get("read", {}).values() for info in infos}
    return {pid for pid in pids if _alive(pid) and _runs_dvc(pid)}


def _runs_dvc(pid: int) -> bool:
    """Whether the process is a dvc (not another that got a dead dvc's pid)."""
    import psutil

    try:
        return any("dvc" in part for part in psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def wait_for_lock_holders(repo: str | Path, timeout: float, log=None) -> set[int]:
    """Wait, up to `timeout` seconds, for the live processes that hold DVC's lock to end: a
    loop killed with SIGKILL leaves its stage's dvc running on its own (DVC starts it in a
    session of its own) until the stage ends (stopped by the dying stage server, or run to its
    end without one), and the next loop would fail on its lock ("is busy"). Returns the
    holders still alive."""
    import time

    holders = lock_holders(repo)
    if holders and log is not None:
        log(f"waiting for DVC processes still holding the run's lock: {sorted(holders)}")
    deadline = time.monotonic() + timeout
    while holders and time.monotonic() < deadline:
        time.sleep(0.5)
        holders = lock_holders(repo)
    return holders


LOCK_WAIT = 900.0  # seconds a loop waits for a stage left running by a killed loop


def failure(returncode: int, output: str) -> type[RuntimeError]:
    """StageInterrupted for a stage killed by a signal: dvc itself (a negative status), or
    the stage's command, which dvc reports as a negative status or, through a shell that does
    not exec it, as 128 + the signal. StageFailed for the rest."""
    code = re.search(r"exited with (-?\d+)", output)
    if returncode < 0 or (code and not 0 <= int(code.group(1)) <= 128):
        return StageInterrupted
    return StageFailed


@task(
    name="stage",
    task_run_name="{name}",
    retries=2,
    retry_delay_seconds=5,
    retry_condition_fn=_retry_interrupted,
)
def run_stage(
    name: str,
    repo: Path,
    parent_run: str | None = None,
    metrics: str | None = None,
    *,
    server: str | None = None,
    force: bool = False,
    said: tuple[str, ...] = (),
) -> dict:
    """Reproduce one DVC stage; returns {"stage", "ran", "metrics"}. With `server` (a stage
    server's socket, stages.server), the stage's command runs in it; with `force`, it runs
    even where DVC finds it up to date. Its output goes to its log (layout.stage_log), and
    its warnings to the loop's, but for those that start with what the loop has `said`."""
    logger = get_run_logger()
    env = _environment(parent_run)
    if server:
        env[SERVER_ENV] = server
    command = ["dvc", "repro", *(["--force"] if force else []), "--single-item", name]
    # Its own session, so that a signal to this process's group reaches the stage only through
    # `stop` below (which waits for it to end cleanly) and not twice.
    process = subprocess.Popen(
        command,
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    _running["stage"] = process
    try:
        output, _ = process.communicate()
    finally:
        _running["stage"] = None
    log = _log_output(repo, name, command, process.returncode, output)
    if process.returncode != 0:
        error = stage_error(name, process.returncode, output, log)
        tries = get_run_context().task_run.run_count
        if isinstance(error, StageInterrupted) and tries <= run_stage.retries:
            logger.warning("%s; trying again", str(error).splitlines()[0])
        raise error
    ran = f"Running stage '{name}'" in output
    for line in output.splitlines():
        warning = _STAGE_WARNING.match(line)
        if REFUSED in line:  # the stage server could not take it: why (it ran anyway)
            logger.warning("%s", line)
        elif warning and not warning.group(1).startswith(said):
            logger.warning("%s", line.strip())
    logger.info("%s: %s", name, "ran" if ran else "up to date, skipped")
    values = {}
    if metrics and (repo / metrics).exists():
        values = json.loads((repo / metrics).read_text())
    return {"stage": name, "ran": ran, "metrics": values}


def _log_output(repo: Path, name: str, command: list[str], returncode: int, output: str):
    """Append a stage's output to its log; the log's absolute path (None where it cannot be
    written: the stage's outcome stands)."""
    from datetime import datetime

    path = (repo / layout.stage_log(name)).resolve()
    when = datetime.now().astimezone().isoformat(timespec="seconds")
    try:
        _logs_folder(repo)
        with open(path, "a") as f:
            f.write(f"=== {when}: {' '.join(command)} (exit status {returncode})\n{output}\n")
    except OSError:
        return None
    return path


def _logs_folder(repo: Path) -> Path:
    """The run's logs/, made where missing, ignored by the run's git whatever its .gitignore
    says (run folders made before it, the source tree): a log is no result to commit."""
    folder = repo / layout.LOGS
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / ".gitignore").exists():
        write_text("*\n", folder / ".gitignore")
    return folder


@task(name="push", task_run_name="push gen-{generation}", retries=2, retry_delay_seconds=10)
def push(repo: Path, generation: int, message: str | None = None) -> list[str]:
    """A finished generation to the run's remotes (run.push): flows.runs.push_generation. A
    push that fails three times stops the run (its generation stays done here)."""
    logger = get_run_logger()
    try:
        done = push_generation(repo, generation, message)
    except PushError as e:
        raise StageFailed(str(e)) from None
    for line in done:
        logger.info("generation %d: %s", generation, line)
    return done


@flow(name="tengen-loop")
def loop(
    repo: Path = Path("."),
    generations: int | None = None,
    more: int | None = None,
    start: int = 0,
    resume_run: bool = False,
    report: bool = True,
) -> list[dict]:
    """Run (or resume) the run in `repo` (a git repository with DVC): dvc.yaml is written
    from its params.yaml (run.generations), then every stage of every generation, in order.
    In the source tree the stages depend on the code too; in a run folder outside it, with
    tengen installed, they do not.

    `generations` sets run.generations in params.yaml first; `more` sets it to the
    generations already promoted plus `more` (what a scheduled run does each time). `start`
    skips the stages of the generations before it, which the caller knows are done (tengen
    ablate, growing a run one generation at a time, would otherwise ask DVC about every
    earlier stage again). `resume_run` logs to the run folder's latest loop run in MLflow
    instead of a new one (what the ablation does, whose arms grow by loops of a generation:
    one run for the arm, its run.generations a tag, since a param cannot change). With
    `report`, a run that finishes ends by writing its page (stages.report), logged to the
    loop's MLflow run. With run.push, each generation is pushed when it ends (DVC remote and
    a git commit: flows.runs.push_generation), and the page after it."""
    with run_lock(repo):
        return _loop(repo, generations, more, start, resume_run, report)


def _loop(repo: Path, generations, more, start, resume_run, report) -> list[dict]:
    logger = get_run_logger()
    params_path = repo / layout.PARAMS
    if more is not None:
        generations = completed_generations(repo) + more
    if generations is not None:
        set_generations(params_path, generations)
    raw = load_params(params_path)
    plan = plan_of(raw, params_path)
    count = plan.generations
    pushed = run_section(raw, params_path).push
    if pushed:
        check_push(repo)
    tracking = settings(raw, params_path)  # a bad `mlflow:` section fails here, before a wait
    # A killed loop's stage may still be ending (its dvc holds the lock): it writes its MLflow
    # run as it ends, and the store is not opened beside it.
    if dropped := clear_stale_locks(repo):
        logger.info("resuming: dropped %d DVC lock entries of a killed run", dropped)
    if still := wait_for_lock_holders(repo, LOCK_WAIT, logger.info):
        logger.warning("DVC processes %s still hold the run's lock", sorted(still))
    replay, said = check_programs(repo, raw, params_path, plan, start, logger)
    tracker = Tracker(tracking, repo.resolve()) if tracking is not None else None
    in_source = is_source_tree(repo)
    write_dvc_yaml(params_path, repo / "dvc.yaml", code_deps=in_source)
    try:  # `dvc plots show` draws offline: the chart scripts inlined in DVC's page
        install_dvc_template(repo)
    except Exception as e:  # noqa: BLE001 - a page template never stops a training run
        logger.warning("DVC's plots template not installed: %s", e)
    parent = None
    if tracker is not None:
        if closed := tracker.close_dead_runs():
            logger.info("MLflow: marked %d runs of a killed loop KILLED", closed)
        flow_run = get_run_context().flow_run
        parent = tracker.start_loop(
            f"loop {flow_run.name}", {"prefect.flow_run_id": str(flow_run.id)}, resume_run
        )
    results = []
    status = "FAILED"
    _running.update(tracker=tracker, parent=parent)
    previous = _stop_on_signals()
    # One process that has imported what the stages import, forking a copy for each stage's
    # command: about 4 s of start-up saved a stage (stages.server).
    stack = contextlib.ExitStack()
    try:
        served = stack.enter_context(serving(repo, _environment(parent), log=logger.warning))
        if tracker is not None:
            if resume_run:
                tracker.client.set_tag(parent, "run.generations", str(count))
            else:
                tracker.client.log_param(parent, "run.generations", count)
            logger.info("MLflow: run %s in %s", parent, tracker.uri)
        for n in range(start, count):
            stages = generation(n, plan)
            for stage in stages:
                server, force = served.get(SERVER_ENV), stage.name in replay
                done = run_stage(
                    stage.name, repo, parent, stage.report, server=server, force=force,
                    said=said,
                )  # fmt: skip
                results.append(done)
                if stage.name == f"shuffle-{n}" and results[-1]["ran"]:  # figures out of range
                    for line in results[-1]["metrics"].get("warnings", []):
                        logger.warning("generation %d's self-play data: %s", n, line)
            # A resumed run has this generation's figures already but for the stages that ran
            # now (tengen ablate's loop that adds an evaluation): one point per step.
            summary = generation_summary(results[-len(stages) :], ran_only=resume_run)
            if tracker is not None:
                for key, value in summary.items():
                    tracker.client.log_metric(parent, key, value, step=n)
            promoted = next(r for r in results[-len(stages) :] if r["stage"] == f"promote-{n}")
            promoted = promoted["metrics"]
            champion = promoted.get("champion") or {}
            logger.info(
                "generation %d: %s, champion %s",
                n,
                (
                    "no promotion"
                    if not promoted.get("promoted")
                    else "a candidate passed its gate"
                    if plan.gated
                    else "its candidate promoted (no gate)"
                ),
                f"{champion['id']} ({champion.get('net', '?')})" if champion else "none yet",
            )
            if pushed:
                push(repo, n)
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        stack.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _running.update(tracker=None, parent=None)
        if tracker is not None:
            tracker.client.set_terminated(parent, status)
    if report:  # the run is done (and its MLflow run FINISHED): its page
        report_run(repo, tracker, parent, logger)
        if pushed:
            push(repo, count - 1, "the run's page")
    return results


def check_programs(
    repo: Path, raw: dict, params_path: Path, plan, start: int, logger
) -> tuple[set[str], tuple[str, ...]]:
    """Before the first stage: one warning for each outside program the evaluations need
    that this machine lacks (what they leave out, the command that installs it), once a
    process (an ablation's loops); and the evaluate stages from `start` on to play again
    because a program they left out is installed now (their names). Returns those, and what
    was said, which the evaluate stage would say again. On a cluster the workers' programs
    count, so only a local one is checked here."""
    from play.programs import KNOWN
    from stages import evaluate
    from stages.params import ClusterParams, EvaluateParams, section

    if not plan.evaluation.scheduled:
        return set(), ()
    said = []
    cluster = section(raw, "cluster", ClusterParams, source=params_path)
    if cluster.address is None or cluster.address.startswith("local:"):
        settings = section(raw, "evaluate", EvaluateParams, source=params_path)
        for program, names in evaluate.missing_programs(settings).items():
            line = evaluate.without(program, names)
            said.append(line)
            if line not in _warned:
                logger.warning("%s; the next `tengen run` after that plays them", line)
                _warned.add(line)
    replay = set()
    for n, entries in evaluate.replays(repo, plan).items():
        if n < start:
            continue
        programs = sorted({e["program"] for e in entries})
        titles = [KNOWN[p].title if p in KNOWN else p for p in programs]
        opponents = sorted({e["opponent"] for e in entries})
        logger.info(
            "%s installed now: evaluate-%d plays again (it left out %s)",
            " and ".join(titles) + (" is" if len(titles) == 1 else " are"), n,
            ", ".join(opponents),
        )  # fmt: skip
        replay.add(f"evaluate-{n}")
    return replay, tuple(said)


_warned: set[str] = set()  # the missing programs this process has named


# A record that carries one of these is said by `tengen run` itself, once.
_SAID = "StageFailed|StageInterrupted|RunLocked|ParamsError|MlflowException"
_SAID_ONCE = re.compile(rf"\b({_SAID})\b")


class _SaidOnce(logging.Filter):
    """Prefect's console handler without the records of an error that `tengen run` says
    itself, in one block (a failed stage, a held folder, a bad params.yaml value, MLflow's):
    the task's failure, its traceback and the flow's, each repeating its message; the run's
    log keeps them whole."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, StageError | RunLocked | ParamsError):
            return False
        return not _SAID_ONCE.search(record.getMessage())


@contextlib.contextmanager
def run_logging(repo: Path):
    """While a run goes on: everything Prefect and the libraries log, tracebacks included, to
    the run's log (layout.RUN_LOG, appended), and Prefect's console without the repeats of a
    failed stage (_SaidOnce). Yields the log's path."""
    from prefect.logging.configuration import ensure_logging_setup
    from prefect.logging.handlers import PrefectConsoleHandler

    ensure_logging_setup()
    path = (repo / layout.RUN_LOG).resolve()
    _logs_folder(repo)
    to_file = logging.FileHandler(path, encoding="utf-8")
    to_file.setLevel(logging.INFO)
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(to_file)
    quiet = _SaidOnce()
    consoles = [h for h in root.handlers if isinstance(h, PrefectConsoleHandler)]
    for handler in consoles:
        handler.addFilter(quiet)
    try:
        yield path
    finally:
        for handler in consoles:
            handler.removeFilter(quiet)
        root.removeHandler(to_file)
        to_file.close()


def report_run(repo: Path, tracker, parent: str | None, logger) -> Path | None:
    """The run's page (stages.report), logged to the loop's MLflow run under report/. A page
    that cannot be written is a warning: the run itself is done."""
    try:
        page = write_report(repo)
        if tracker is not None and parent is not None:
            tracker.client.log_artifacts(parent, str(page.parent), "report")
    except Exception as e:  # noqa: BLE001 - any failure: said, and the run still finishes
        logger.warning("the run's report was not written: %s", e)
        return None
    logger.info("report: %s", page.resolve())
    return page


# What a stop must reach: the stage's process, the MLflow run of the loop.
_running: dict = {"stage": None, "tracker": None, "parent": None}
# And what runs the loop (an ablation's MLflow runs): stop() ends the process with os._exit,
# past every `finally` of its callers.
_stop_hooks: list[Callable[[], None]] = []


@contextlib.contextmanager
def when_stopped(hook: Callable[[], None]):
    """Call `hook` if a signal stops a loop run inside this block (its errors ignored)."""
    _stop_hooks.append(hook)
    try:
        yield
    finally:
        _stop_hooks.remove(hook)


STOP_GRACE = 15.0  # seconds a stage has to end its MLflow run and clean up before SIGKILL


def stop(signum: int, frame=None) -> None:
    """Ctrl-C or SIGTERM: the stage's processes get SIGTERM (it ends its MLflow run as
    KILLED and removes its temporary output), then every process this one started (Prefect's
    local server among them) is ended, the loop's MLflow run is marked KILLED, and the process
    exits with 128 + the signal, without Prefect's own shutdown (which would retry a server
    the same signal took down). The next `tengen run` resumes from the stage it was in."""
    import psutil

    everything = psutil.Process().children(recursive=True)  # while dvc still holds its stage
    stage, stage_tree = _running.get("stage"), []
    if stage is not None and stage.poll() is None:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(stage.pid)
            stage_tree = [root, *root.children(recursive=True)]
    # First the stage (its dvc and its command, which DVC may start in a session of its own),
    # so that it ends its MLflow run and removes its temporary output; then the rest.
    for group, grace in ((stage_tree, STOP_GRACE), ([p for p in everything if p not in
                                                      stage_tree], 5.0)):  # fmt: skip
        for p in group:
            with contextlib.suppress(psutil.Error):
                p.terminate()
        _, alive = psutil.wait_procs(group, timeout=grace)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
    tracker, parent = _running.get("tracker"), _running.get("parent")
    if tracker is not None and parent is not None:
        with contextlib.suppress(Exception):
            tracker.client.set_terminated(parent, "KILLED")
    for hook in reversed(_stop_hooks):
        with contextlib.suppress(Exception):
            hook()
    name = signal.Signals(signum).name
    print(f"tengen run: stopped by {name}; `tengen run` resumes where it stopped",
          file=sys.stderr, flush=True)  # fmt: skip
    os._exit(128 + signum)


def _stop_on_signals() -> dict:
    """Install `stop` for SIGINT and SIGTERM (over Prefect's own, while the loop runs);
    returns the handlers to put back. Only the main thread can."""
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[signum] = signal.signal(signum, stop)
        except ValueError:  # not the main thread: leave signals to whoever runs it
            break
    return previous


def generation_summary(results: list[dict], ran_only: bool = False) -> dict[str, float]:
    """One generation's headline figures, from its stages' metrics files: train.net's
    losses, and the gate of the candidate that decided the promotion (promotion.json). With
    `ran_only`, only the figures of the stages that ran (not those DVC skipped)."""
    by = {r["stage"].rsplit("-", 1)[0]: r["metrics"] for r in results if r["ran"] or not ran_only}
    out = {
        **data.history_row(by.get("shuffle") or {}),
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
    params_path = repo / layout.PARAMS
    run = run_section(load_params(params_path), params_path)
    if cron is None and interval is None:
        cron, interval = run.serve_cron, run.serve_interval_minutes
    if (cron is None) == (interval is None):
        raise ParamsError(
            f"{params_path}: give the schedule as a cron line or an interval in minutes, not "
            "both or neither (--cron / --interval, or run.serve_cron / "
            "run.serve_interval_minutes)"
        )
    if interval is not None and not interval > 0:
        raise ParamsError(f"{params_path}: the interval must be > 0 minutes (got {interval})")
    more = more if more is not None else run.serve_generations
    if more < 1:
        raise ParamsError(f"{params_path}: the generations to add must be >= 1 (got {more})")
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
