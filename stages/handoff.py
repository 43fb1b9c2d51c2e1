"""A stage command's side of the stage server (stages.server): `python -m stages.X ...` started
with TENGEN_STAGE_SERVER in its environment hands itself to the server and exits with the
stage's status. Called by stages/__init__.py before anything else of the stage is imported: the
standard library only, nothing the stage would import itself."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import sys

ENV = "TENGEN_STAGE_SERVER"
HEADER = struct.Struct("!I")  # a request's length, before its JSON
PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
REFUSED = "not run by the stage server"  # what a refused command says (the loop looks for it)


def command() -> tuple[str, list[str]] | None:
    """The stage module and arguments of this process's `python -m stages.X ...` line, or
    None when it is not one (while `-m` imports the module's package, sys.argv[0] is "-m")."""
    argv = list(getattr(sys, "orig_argv", ()))
    if sys.argv[:1] != ["-m"] or "-m" not in argv:
        return None
    at = argv.index("-m")
    if at + 1 >= len(argv) or not argv[at + 1].startswith("stages."):
        return None
    return argv[at + 1], argv[at + 2 :]


def request(module: str, args: list[str]) -> dict:
    """What the server needs to run the command as this process would, and to tell whether it
    can: the module and arguments, folder, environment, interpreter and its options, and the
    process's umask, CPUs and niceness (which a forked copy would otherwise take from the
    server)."""
    umask = os.umask(0)
    os.umask(umask)
    return {
        "module": module,
        "args": args,
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "executable": sys.executable,
        "flags": list(sys.flags),
        "warnoptions": list(sys.warnoptions),
        "umask": umask,
        "cpus": sorted(os.sched_getaffinity(0)),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
    }


def forward() -> None:
    """Run this `python -m stages.X` command in the stage server named by TENGEN_STAGE_SERVER
    and exit with its status. Returns (and the command runs here, as without a server) where
    there is no server or the request cannot be sent, and where the server refuses it (said on
    standard error). Once the server has the request the command is the stage's: a server that
    ends before it answers, or before its stage does, ends the command as SIGTERM would (a
    stage `tengen run` tries again), never with a second copy of the stage run here."""
    path = os.environ.get(ENV)
    line = command()
    if not path or line is None or line[0] == "stages.server":
        return
    module, args = line
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        data = json.dumps(request(module, args)).encode()
        sock.connect(path)
        socket.send_fds(sock, [HEADER.pack(len(data)) + data], [0, 1, 2])
    except OSError:  # no server (stopped, or not yet listening), a closed standard stream
        sock.close()
        return
    replies = sock.makefile("rb")
    first = _reply(replies)
    if first is None:
        _end(module, "the stage server closed the connection before it answered")
    if "refused" in first:
        print(f"{module}: {REFUSED} ({first['refused']}); running on its own",
              file=sys.stderr, flush=True)  # fmt: skip
        sock.close()
        return

    def pass_on(signum, frame):  # the server sends it to the stage through its pidfd
        with contextlib.suppress(OSError):
            sock.send(bytes([signum]))

    for signum in PASSED_ON:
        signal.signal(signum, pass_on)
    end = _reply(replies)
    if end is None:
        _end(module, "the stage server ended before the stage did")
    if end["exit"] < 0:  # killed by a signal: so is this process, for whoever waits on it
        _kill_self(-end["exit"])
    os._exit(end["exit"])


def _reply(replies) -> dict | None:
    try:
        line = replies.readline()
    except OSError:
        return None
    return json.loads(line) if line else None


def _end(module: str, why: str) -> None:
    print(f"{module}: {why}; it stopped (tengen run tries it again)", file=sys.stderr,
          flush=True)  # fmt: skip
    _kill_self(signal.SIGTERM)


def _kill_self(signum: int) -> None:
    with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP have no handler
        signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # a signal this process ignores or blocks
