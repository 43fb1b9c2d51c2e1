"""The stage server: the loop's stages without a fresh Python's start-up each.

Every stage is dvc.yaml's command, `python -m stages.<name> ...`, a process of its own: that is
what `dvc repro` runs, and what keeps one stage's state and failure out of the next. But each
of those processes first spends seconds importing the same libraries (torch, MLflow, Prefect,
polars, the project's modules), five or six times a generation. While `tengen run` runs, it
keeps one server process that has imported them once (`serve`). A stage command that DVC starts
finds the server's socket in TENGEN_STAGE_SERVER (stages/__init__.py calls
stages.handoff.forward before anything else is imported) and hands over its module, arguments,
working folder, environment and standard streams; the server forks a copy of itself that runs
the module as `python -m` would (runpy, as __main__) with the command's streams, folder and
environment, and reports its exit status, which the command exits with (a stage killed by a
signal: the command kills itself with that signal). Signals sent to the command (the loop's
stop, Ctrl-C) are passed on to the stage; a command killed outright (SIGKILL) takes its stage
down (SIGTERM, then SIGKILL), and a server that dies takes its stages with it (the kernel's
parent-death signal). DVC sees the same command, output and exit status as without a server.

Nothing changes what a stage computes. The copy comes from a process that has only imported
modules: no torch operation, numba kernel, Python thread or connection has run in it (a server
whose imports started a thread exits instead of serving). The environment that libraries read
when they are imported must be the server's: a command whose environment differs from it other
than in the variables each command has of its own (`PER_COMMAND`) runs itself, as without a
server, and says why on its standard error; so does a command run from another folder (its
module path differs). Each copy gets fresh seeds for Python's and numpy's global random
generators, as a new process would.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys

from stages.handoff import ENV, HEADER

# Variables that differ from one command to the next and that no library reads on import: the
# loop's MLflow run, what DVC and the shell set for a command.
PER_COMMAND = frozenset(
    {"TENGEN_MLFLOW_PARENT", "DVC_ROOT", "DVC_STAGE", "PWD", "OLDPWD", "SHLVL", "_"}
)
# What the server imports before it forks: every stage's libraries and the project's modules.
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
    "stages.cli",
    "stages.tracking",
    "stages.selfplay",
    "stages.shuffle",
    "stages.train",
    "stages.ema",
    "stages.gate",
    "stages.promote",
    "stages.evaluate",
    "nets.model",
    "nets.checkpoint",
    "play.models",
    "gocore.selfplay",
)
STOP_GRACE = 15.0  # seconds a stage whose command vanished has to end before SIGKILL


def serve(path: str, preload: tuple[str, ...] = PRELOAD) -> None:
    """Import `preload`, listen on the Unix socket `path`, and fork a copy to run each command
    that connects, until SIGTERM or SIGINT, or until the process that started this one ends.
    The copies still running then get SIGTERM (and SIGKILL after STOP_GRACE)."""
    import importlib
    import selectors
    import threading

    started = dict(os.environ)  # what the commands' environments are compared with
    for name in preload:
        importlib.import_module(name)
    # What the imports set (MLflow's telemetry session, polars' allocator settings): a command's
    # own imports would have set them too.
    imported = {k: v for k, v in os.environ.items() if started.get(k) != v}
    if threading.active_count() > 1:
        names = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
        raise SystemExit(f"stage server: threads started by the imports ({names}): not forking")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(f"{path}.tmp")
    listener.listen(8)
    os.rename(f"{path}.tmp", path)  # the path appears when it listens: no refused connection
    parent = os.getppid()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _leave)
    select = selectors.DefaultSelector()
    select.register(listener, selectors.EVENT_READ, None)
    stages: dict[int, _Stage] = {}  # by pid
    try:
        while os.getppid() == parent:
            for key, _ in select.select(timeout=1.0):
                if key.data is None:
                    conn, _ = listener.accept()
                    stage = _start(conn, listener, select, started, imported)
                    if stage is not None:
                        stages[stage.pid] = stage
                        select.register(stage.pidfd, selectors.EVENT_READ, ("ended", stage))
                        select.register(conn, selectors.EVENT_READ, ("command", stage))
                elif key.data[0] == "ended":
                    _finish(key.data[1], select)
                    stages.pop(key.data[1].pid)
                elif not key.fileobj.recv(1, socket.MSG_PEEK):  # the command is gone
                    select.unregister(key.fileobj)
                    key.data[1].end(STOP_GRACE)
    finally:
        for stage in stages.values():
            stage.end(STOP_GRACE)
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(path)


def _leave(signum, frame):
    raise SystemExit(128 + signum)


class _Stage:
    """A forked copy running one command: its pid, a pidfd that reads as ready when it ends,
    and the command's connection."""

    def __init__(self, pid: int, conn: socket.socket):
        self.pid, self.conn = pid, conn
        self.pidfd = os.pidfd_open(pid)

    def end(self, grace: float) -> None:
        """SIGTERM, then SIGKILL if it has not ended within `grace` seconds."""
        import select

        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
            if not select.select([self.pidfd], [], [], grace)[0]:
                os.kill(self.pid, signal.SIGKILL)


def _start(
    conn: socket.socket, listener: socket.socket, select, started: dict, imported: dict
) -> _Stage | None:
    """Read a command's request and fork its stage, in the command's environment and what the
    server's imports added to theirs (`imported`); None when the request differs from
    the server's own start (`started`: refused, said to the command)."""
    try:
        data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        while len(data) < HEADER.size or len(data) < HEADER.size + HEADER.unpack_from(data)[0]:
            more = conn.recv(1 << 16)
            if not more:
                raise OSError("the command closed its connection")
            data += more
        request = json.loads(data[HEADER.size :])
        if len(fds) != 3:
            raise OSError("the command sent no standard streams")
    except (OSError, ValueError):
        conn.close()
        return None
    if reason := refusal(request, started, os.getcwd()):
        _send(conn, {"refused": reason})
        conn.close()
        for fd in fds:
            os.close(fd)
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            # Not the other commands' connections and stages: theirs to end. This command's
            # connection stays open here, so that its command waits for this copy to end
            # even if the server goes first.
            for key in list(select.get_map().values()):
                fileobj = key.fileobj
                fileobj.close() if isinstance(fileobj, socket.socket) else os.close(fileobj)
            select.close()
            _run(request | {"env": request["env"] | imported}, fds)
        except BaseException:  # noqa: BLE001 - before the stage began (a folder gone)
            import traceback

            traceback.print_exc()
        finally:
            os._exit(70)  # _run exits; this is for a copy that failed before it could
    for fd in fds:
        os.close(fd)
    stage = _Stage(pid, conn)
    _send(conn, {"pid": pid})
    return stage


def refusal(request: dict, env: dict[str, str], cwd: str) -> str | None:
    """Why the server cannot run a command as its own process would, or None: another folder
    (its module path), or an environment that differs from the server's in a variable some
    library may read when it is imported."""
    if request["cwd"] != cwd:
        return f"it runs in {request['cwd']}, the server in {cwd}"
    theirs = request["env"]
    differ = sorted(
        name
        for name in set(theirs) | set(env)
        if name not in PER_COMMAND and theirs.get(name) != env.get(name)
    )
    if differ:
        return f"its environment differs from the server's in {', '.join(differ[:5])}"
    return None


def _finish(stage: _Stage, select) -> None:
    """Reap an ended stage and send its exit status (or the negated signal) to its command."""
    with contextlib.suppress(KeyError, ValueError):
        select.unregister(stage.pidfd)
    with contextlib.suppress(KeyError, ValueError):
        select.unregister(stage.conn)
    _, status = os.waitpid(stage.pid, 0)
    os.close(stage.pidfd)
    with contextlib.suppress(OSError):
        _send(stage.conn, {"exit": os.waitstatus_to_exitcode(status)})
    stage.conn.close()


def _send(conn: socket.socket, message: dict) -> None:
    conn.sendall((json.dumps(message) + "\n").encode())


def _run(request: dict, fds: list[int]) -> None:
    """In the forked copy: become the command's process and run its module; never returns."""
    import atexit
    import ctypes
    import random
    import runpy
    import threading

    import numpy as np

    # Die with the server (PR_SET_PDEATHSIG), as the command dies with its shell's group.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    random.seed()  # what a new process's generators start from: fresh entropy
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
    # What the interpreter does on its way out (Py_FinalizeEx): threading's own exit hooks
    # (a thread pool's workers told to stop) and a wait for the threads that are not daemons,
    # then the exit handlers, then the streams flushed.
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
def serving(repo, env: dict[str, str], log=None):
    """A stage server for the commands run in `repo` with environment `env`, while the block
    runs: yields the environment those commands should get (`env` with TENGEN_STAGE_SERVER).
    It does not wait for the server: commands that start before it listens (its imports take
    seconds) run on their own. Stopped (SIGTERM) when the block ends; a server that ended
    before, other than by a signal, is said through `log` (the stages ran on their own)."""
    import shutil
    import subprocess
    import tempfile

    folder = tempfile.mkdtemp(prefix="tengen-stages-")  # a short path: sockets allow 107 bytes
    served = dict(env, **{ENV: os.path.join(folder, "socket")})
    process = subprocess.Popen(
        [sys.executable, "-m", "stages.server", served[ENV]],
        cwd=repo,
        env=served,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # a signal to the loop's group reaches it only through the loop
    )
    try:
        yield served
    finally:
        if process.poll() is not None and log is not None:
            log(f"the stage server ended early (exit status {process.returncode}): "
                "stages started on their own")  # fmt: skip
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
