"""A stage command's side of the stage server (stages.server): `python -m stages.X ...` started
with TENGEN_STAGE_SERVER in its environment hands itself to the server and exits with the
stage's status. Imported by stages/__init__.py before anything else of the stage: the standard
library only, nothing the stage would import itself."""

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


def command() -> tuple[str, list[str]] | None:
    """The stage module and arguments of this process's `python -m stages.X ...` line, or
    None when it is not one."""
    argv = list(getattr(sys, "orig_argv", ()))
    if "-m" not in argv:
        return None
    at = argv.index("-m")
    if at + 1 >= len(argv) or not argv[at + 1].startswith("stages."):
        return None
    return argv[at + 1], argv[at + 2 :]


def forward() -> None:
    """Run this `python -m stages.X` command in the stage server named by TENGEN_STAGE_SERVER
    and exit with its status; return (and the command runs here, as without a server) where
    there is no server, it does not answer, or it refuses the command."""
    path = os.environ.get(ENV)
    line = command()
    if not path or line is None or line[0] == "stages.server":
        return
    module, args = line
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return  # no server (the loop stopped it, or it died): run here
    request = json.dumps(
        {"module": module, "args": args, "cwd": os.getcwd(), "env": dict(os.environ)}
    ).encode()
    with sock:
        socket.send_fds(sock, [HEADER.pack(len(request)) + request], [0, 1, 2])
        replies = sock.makefile("r")
        first = _reply(replies)
        if first is None or "pid" not in first:
            reason = (first or {}).get("refused", "it did not answer")
            print(f"{module}: not run by the stage server ({reason}); running on its own",
                  file=sys.stderr, flush=True)  # fmt: skip
            return
        pid = first["pid"]

        def pass_on(signum, frame):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(signum, pass_on)
        end = _reply(replies)
    if end is None:  # the server ended first; its parent-death signal ends the stage
        print(f"{module}: the stage server ended before the stage did", file=sys.stderr)
        os._exit(1)
    status = end["exit"]
    if status < 0:  # killed by a signal: so is this process, for whoever waits on it
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status)


def _reply(replies) -> dict | None:
    try:
        line = replies.readline()
    except OSError:
        return None
    return json.loads(line) if line else None
