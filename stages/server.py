"""The stage server: the loop's stages without a fresh Python's start-up each.

Every stage is dvc.yaml's command, `python -m stages.<name> ...`, a process of its own: that is
what `dvc repro` runs, and what keeps one stage's state and failure out of the next. But each
of those processes first spent 3-5 s importing the same libraries (torch, MLflow, Prefect,
polars, the project's modules), five times a generation. While `tengen run` runs, it keeps one
server process that has imported them once (`serve`, started by `serving`). A stage command
that DVC starts finds the server's socket in TENGEN_STAGE_SERVER (stages/__init__.py calls
stages.handoff.forward before anything else is imported) and hands over its module, arguments,
folder, environment and standard streams; the server forks a copy of itself that runs the
module as `python -m` would (runpy, as __main__) with the command's streams, folder,
environment, umask, CPUs and niceness, and sends back its exit status, which the command exits
with (a stage killed by a signal: the command kills itself with that signal). Signals sent to
the command (the loop's stop, Ctrl-C) go on to the stage; a command that is killed outright
(SIGKILL) takes its stage down (SIGTERM, then SIGKILL after STOP_GRACE); a server that ends
takes its stages with it (the kernel's parent-death signal) and their commands end as SIGTERM
would end them, which `tengen run` retries.

Nothing should change what a stage computes, and what could is refused: the command then runs
on its own, as without a server, and says why on its standard error (the loop logs it as a
warning). The copy comes from a process that has only imported modules: no torch operation,
numba kernel, polars query or connection has run in it, and no Python thread (a server whose
imports started one exits instead of serving; the native thread pools that exist after import,
OpenBLAS's, re-create themselves after a fork). Refused: another folder (its module path), an
environment that differs from the one the server started with other than in the variables
each command has of its own (`PER_COMMAND`: libraries read the rest when they are imported),
another interpreter or interpreter options, and any change to a source file of the project
since the server imported it (every module of gocore, nets, play and stages is imported, so no
stage mixes old and new code). What the copy shares with its siblings and a new process would
not: Python's hash seed, and MLflow's telemetry session (set on import).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import pkgutil
import select
import selectors
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from stages.handoff import ENV, HEADER, PASSED_ON

# Variables that differ from one command to the next and that no library reads on import: what
# DVC and the shell set for a command (and the loop's MLflow run: stages.tracking.ENV_PARENT).
PER_COMMAND = frozenset({"DVC_ROOT", "DVC_STAGE", "PWD", "OLDPWD", "SHLVL", "_"})
# What the server imports before it forks: the stages' libraries, then every project module.
PRELOAD = (
    "numpy",
    "numba",
    "torch",
    "polars",
    "pyarrow.parquet",
    "yaml",
    "pydantic",
    "mlflow",
    "mlflow.store.tracking.sqlalchemy_store",
    "prefect",
    "distributed",
    "prefect_dask",
)
PACKAGES = ("gocore", "nets", "play", "stages")  # the project's, as far as the stages reach
STOP_GRACE = 15.0  # seconds a stage whose command vanished has to end before SIGKILL
REQUEST_TIMEOUT = 10.0  # seconds a connected command has to send its request
PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent ends
FOLDER_PREFIX = "tengen-stages-"


def serve(path: str, preload: tuple[str, ...] = PRELOAD) -> None:
    """Import `preload` and the project's modules, listen on the Unix socket `path`, and fork a
    copy to run each command that connects, until SIGTERM or SIGINT, or until the process
    that started this one ends. The copies still running then get SIGTERM (and SIGKILL after
    STOP_GRACE)."""
    parent = os.getppid()
    _die_with_parent()
    started = dict(os.environ)  # what the commands' environments are compared with
    for name in preload:
        importlib.import_module(name)
    for package in PACKAGES:
        for module in pkgutil.walk_packages(importlib.import_module(package).__path__,
                                            f"{package}."):  # fmt: skip
            importlib.import_module(module.name)
    # What the imports set (MLflow's telemetry session, polars' allocator settings): a command's
    # own imports would have set them too.
    imported = {k: v for k, v in os.environ.items() if started.get(k) != v}
    sources = _sources()
    if threading.active_count() > 1:
        names = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
        raise SystemExit(f"stage server: threads started by the imports ({names}): not forking")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(f"{path}.tmp")
    listener.listen(8)
    os.rename(f"{path}.tmp", path)  # the path appears when it listens: no refused connection
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _leave)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    stages: dict[int, _Stage] = {}  # by pid
    server = _Server(listener, selector, stages, started, imported, sources)
    left = False
    try:
        while os.getppid() == parent:
            for key, _ in selector.select(timeout=1.0):
                if not _registered(selector, key.fileobj):
                    continue  # closed by an earlier event of this batch
                try:
                    server.handle(key)
                except OSError as e:  # one command's trouble (it vanished): not the server's
                    print(f"stage server: {e!r}", file=sys.stderr, flush=True)
            now = time.monotonic()
            for stage in stages.values():
                if stage.kill_at is not None and now > stage.kill_at:
                    stage.signal(signal.SIGKILL)
        left = True  # the loop is gone
    except SystemExit:
        left = True  # stopped by a signal
        raise
    finally:
        for stage in stages.values():
            stage.signal(signal.SIGTERM)
        for stage in stages.values():
            if not select.select([stage.pidfd], [], [], STOP_GRACE)[0]:
                stage.signal(signal.SIGKILL)
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
        folder = Path(path).parent
        # Stopped or orphaned: the loop may be ending with os._exit (flows.loop.stop), past
        # serving()'s own clean-up. A server that failed keeps its folder: serving() reads
        # the error output there.
        if left and folder.name.startswith(FOLDER_PREFIX):
            import shutil

            shutil.rmtree(folder, ignore_errors=True)


def _registered(selector, fileobj) -> bool:
    try:
        selector.get_key(fileobj)
        return True
    except (KeyError, ValueError):
        return False


def _leave(signum, frame):
    raise SystemExit(128 + signum)


def _die_with_parent() -> None:
    """SIGTERM to this process when the one that started it ends (Linux; elsewhere nothing)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _sources() -> dict[str, tuple[int, int]]:
    """The project's source files this process has imported, with their mtime and size."""
    roots = tuple(str(Path(importlib.import_module(p).__file__).parent) + os.sep for p in PACKAGES)
    out = {}
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if file and file.startswith(roots):
            out[file] = _stat(file)
    return out


def _stat(file: str) -> tuple[int, int]:
    try:
        st = os.stat(file)
    except OSError:
        return (-1, -1)
    return (st.st_mtime_ns, st.st_size)


class _Stage:
    """A forked copy running one command: its pid, a pidfd (readable when it ends, and what
    signals go through: never a reused pid), its command's connection, and when it is to be
    killed if it has not ended."""

    def __init__(self, pid: int, conn: socket.socket):
        self.pid, self.conn = pid, conn
        self.pidfd = os.pidfd_open(pid)
        self.kill_at: float | None = None

    def signal(self, signum: int) -> None:
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self.pidfd, signum)

    def stop(self) -> None:
        """SIGTERM now, SIGKILL after STOP_GRACE (the server's tick) if it has not ended."""
        self.signal(signal.SIGTERM)
        self.kill_at = time.monotonic() + STOP_GRACE


class _Server:
    """The server's state and what it does with each ready file: a command connecting, a
    copy ending, a command's signal or its end."""

    def __init__(self, listener, selector, stages, started, imported, sources):
        self.listener, self.selector, self.stages = listener, selector, stages
        self.started, self.imported, self.sources = started, imported, sources

    def handle(self, key) -> None:
        if key.data is None:
            conn, _ = self.listener.accept()
            stage = self.start(conn)
            if stage is not None:
                self.stages[stage.pid] = stage
                self.selector.register(stage.pidfd, selectors.EVENT_READ, ("ended", stage))
                self.selector.register(conn, selectors.EVENT_READ, ("command", stage))
        elif key.data[0] == "ended":
            self.finish(key.data[1])
        else:  # the command sent signals, or it is gone
            stage = key.data[1]
            try:
                data = stage.conn.recv(64)
            except OSError:
                data = b""
            if not data:
                self.selector.unregister(stage.conn)
                stage.stop()
            for signum in data:
                if signum in PASSED_ON:
                    stage.signal(signum)

    def start(self, conn: socket.socket) -> _Stage | None:
        """Read a command's request and fork its stage; None when the request is broken or
        refused (said to the command)."""
        fds: list[int] = []
        try:
            conn.settimeout(REQUEST_TIMEOUT)
            data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
            while len(data) < HEADER.size or len(data) < HEADER.size + HEADER.unpack_from(data)[0]:
                more = conn.recv(1 << 16)
                if not more:
                    raise OSError("the command closed its connection")
                data += more
            request = json.loads(data[HEADER.size :])
            if len(fds) != 3:
                raise OSError("the command sent no standard streams")
            conn.settimeout(None)
            reason = refusal(request, self.started, os.getcwd(), self.sources)
        except (OSError, ValueError):
            reason = "a broken request"
        if reason:
            with contextlib.suppress(OSError):  # a command still there runs on its own
                _send(conn, {"refused": reason})
            conn.close()
            for fd in fds:
                os.close(fd)
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        # No signal between the fork and the copy's own handlers: the server's would run there.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        pid = os.fork()
        if pid == 0:
            try:
                self.close_all()
                _run(request | {"env": request["env"] | self.imported}, fds, mask)
            except BaseException:  # noqa: BLE001 - before the stage began (its folder gone)
                import traceback

                traceback.print_exc()
            finally:
                os._exit(70)  # _run exits; this is for a copy that failed before it could
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for fd in fds:
            os.close(fd)
        stage = _Stage(pid, conn)
        try:
            _send(conn, {"pid": pid})
        except OSError:  # the command is gone: so is its stage
            stage.stop()
        return stage

    def close_all(self) -> None:
        """In a forked copy: the server's files, but for this command's connection, which stays
        open so that the command waits for this copy even if the server ends first."""
        for stage in self.stages.values():
            stage.conn.close()
            os.close(stage.pidfd)
        self.listener.close()
        self.selector.close()

    def finish(self, stage: _Stage) -> None:
        """Reap an ended copy and send its exit status (or the negated signal) to its command."""
        for fileobj in (stage.pidfd, stage.conn):
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(fileobj)
        _, status = os.waitpid(stage.pid, 0)
        os.close(stage.pidfd)
        del self.stages[stage.pid]
        with contextlib.suppress(OSError):
            _send(stage.conn, {"exit": os.waitstatus_to_exitcode(status)})
        stage.conn.close()


def refusal(
    request: dict, env: dict[str, str], cwd: str, sources: dict[str, tuple[int, int]]
) -> str | None:
    """Why the server cannot run a command as its own process would, or None (module
    docstring)."""
    from stages.tracking import ENV_PARENT  # imported by the server already

    if request["cwd"] != cwd:
        return f"it runs in {request['cwd']}, the server in {cwd}"
    if request["executable"] != sys.executable:
        return f"it runs {request['executable']}, the server {sys.executable}"
    if request["flags"] != list(sys.flags) or request["warnoptions"] != sys.warnoptions:
        return "its interpreter options differ from the server's"
    theirs, own = request["env"], PER_COMMAND | {ENV_PARENT}
    differ = sorted(
        name
        for name in set(theirs) | set(env)
        if name not in own and theirs.get(name) != env.get(name)
    )
    if differ:
        return f"its environment differs from the server's in {', '.join(differ[:5])}"
    if changed := [file for file, stat in sources.items() if _stat(file) != stat]:
        return f"the code changed since the server started: {', '.join(sorted(changed)[:3])}"
    return None


def _send(conn: socket.socket, message: dict) -> None:
    conn.sendall((json.dumps(message) + "\n").encode())


def _run(request: dict, fds: list[int], mask) -> None:
    """In the forked copy: become the command's process and run its module; never returns."""
    import atexit
    import random
    import runpy

    import numpy as np

    signal.signal(signal.SIGINT, signal.default_int_handler)  # a new Python's handlers
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    server = os.getppid()
    _die_with_parent()
    if os.getppid() != server:  # the server ended before the line above
        os._exit(128 + signal.SIGTERM)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    for target, stream in ((1, sys.stdout), (2, sys.stderr)):
        with contextlib.suppress(Exception):  # line-buffered on a terminal, as Python starts
            stream.reconfigure(line_buffering=os.isatty(target) or target == 2)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, request["cpus"])
    with contextlib.suppress(OSError):  # raising a niceness the server has needs privilege
        os.setpriority(os.PRIO_PROCESS, 0, request["nice"])
    random.seed()  # a new process's global generators start from fresh entropy
    np.random.seed()  # noqa: NPY002 - the legacy global one, which a new process seeds
    sys.argv = [request["module"], *request["args"]]
    sys.modules.pop(request["module"], None)  # preloaded: run afresh as __main__, as -m does
    code = 0
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code = -signal.SIGINT
    except BaseException:  # noqa: BLE001 - reported as Python would, exit status 1
        sys.excepthook(*sys.exc_info())
        code = 1
    # What the interpreter does on its way out (Py_FinalizeEx, CPython 3.11): threading's own
    # exit hooks (a thread pool's workers told to stop) and a wait for the threads that are not
    # daemons, then the exit handlers, then the streams flushed. Both are private functions of
    # the standard library, what the interpreter itself calls.
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if code < 0:  # Ctrl-C not handled by the stage: ended by SIGINT, as Python ends then
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


@contextlib.contextmanager
def serving(repo, env: dict[str, str], *, log=None):
    """A stage server for the commands run in `repo` with environment `env`, while the block
    runs: yields the environment those commands should get (`env` with TENGEN_STAGE_SERVER).
    It does not wait for the server: commands that start before it listens (its imports take
    seconds) run on their own. Stopped (SIGTERM) when the block ends; a server that could not
    start, or ended before, is said through `log` with the end of its error output (the
    stages then ran on their own)."""
    import shutil
    import subprocess
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))  # short: sockets allow 107 bytes
    served = dict(env, **{ENV: str(folder / "socket")})
    errors = folder / "server.log"
    try:
        with errors.open("w") as stderr:  # not the loop's terminal: a stage writes to a pipe
            process = subprocess.Popen(
                [sys.executable, "-m", "stages.server", served[ENV]], cwd=repo, env=served,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                start_new_session=True,  # a signal to the loop's group reaches it through the loop
            )  # fmt: skip
    except OSError as e:
        if log is not None:
            log(f"the stage server did not start ({e}): stages start on their own")
        shutil.rmtree(folder, ignore_errors=True)
        yield env
        return
    try:
        yield served
    finally:
        if process.poll() is not None and log is not None:
            tail = errors.read_text(errors="replace")[-2000:] if errors.exists() else ""
            log(f"the stage server ended early (exit status {process.returncode}): stages "
                f"started on their own\n{tail}")  # fmt: skip
        process.terminate()
        try:
            process.wait(STOP_GRACE + 5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m stages.server SOCKET", file=sys.stderr)
        return 2
    serve(args[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
