"""Outside programs a run plays against (GNU Go): where they are found, how each is installed,
and installing the missing ones where this machine lets us (root, or sudo without a password).

A program is looked for on PATH and then in the folders of TENGEN_PROGRAM_DIRS (os.pathsep
between them; /usr/games by default, where Debian puts GNU Go): an empty TENGEN_PROGRAM_DIRS
looks on PATH alone.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

ENV_DIRS = "TENGEN_PROGRAM_DIRS"
DEFAULT_DIRS = "/usr/games"


@dataclasses.dataclass(frozen=True)
class Program:
    """An outside program the project knows how to install."""

    name: str  # the command's first word
    title: str  # what a person calls it
    debian: str | None  # its Debian package
    brew: str | None = None  # its Homebrew formula
    installer: str | None = None  # the command that installs it, where no package does


KNOWN = {
    "gnugo": Program("gnugo", "GNU Go", "gnugo", "gnu-go"),
    # From PyPI's katrain wheel, into the user's cache (play.katago).
    "katago": Program("katago", "KataGo", None, installer="tengen engines install katago"),
}

# How a report names what was left out for want of a program (stages.evaluate's `left_out`,
# the run's page): the referee among the opponents, and this machine among a cluster's hosts.
REFEREE = "referee"
HERE = "here"


def program_dirs() -> list[str]:
    """The folders looked in after PATH (TENGEN_PROGRAM_DIRS)."""
    return [d for d in os.environ.get(ENV_DIRS, DEFAULT_DIRS).split(os.pathsep) if d]


def which(program: str) -> str | None:
    """The path of `program` (a name or a path): on PATH, else in program_dirs(); KataGo also
    where `tengen engines install katago` put it."""
    found = shutil.which(program)
    if found is not None or "/" in program:
        return found
    if program == "katago":
        from play import katago

        installed = katago.installed()
        if installed is not None:
            return str(installed.program)
    for folder in program_dirs():
        found = shutil.which(program, path=folder)
        if found is not None:
            return found
    return None


def find_program(command: str) -> list[str]:
    """A command line's words, its program found on PATH or else in program_dirs(); unchanged
    when neither has it (starting it then fails). ValueError: an unclosed quote."""
    argv = shlex.split(command)
    if argv and "/" not in argv[0] and shutil.which(argv[0]) is None:
        found = which(argv[0])
        if found is not None:
            argv[0] = found
    return argv


def program_of(command: str) -> str | None:
    """The program a command line starts (its first word), None for an empty line."""
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    return argv[0] if argv else None


def install_command(program: str) -> str | None:
    """The command that installs a known program here (apt-get on Debian and Ubuntu, brew on
    macOS), with sudo where this process is not root; None for a program we do not know."""
    known = KNOWN.get(Path(program).name)
    if known is None:
        return None
    if known.installer:
        return known.installer
    if sys.platform == "darwin" and known.brew:
        return f"brew install {known.brew}"
    sudo = "" if _is_root() else "sudo "
    return f"{sudo}apt-get install -y {known.debian}"


def install_hint(program: str) -> str:
    """` (apt-get install -y gnugo)` for a known program, for an error message; else ''."""
    command = install_command(program)
    return f" ({command})" if command else ""


def missing_line(program: str, what: str, where: str | None = None) -> str:
    """One line naming a missing program (here, or on the machines `where`), what a run does
    without it, and how to install it."""
    known = KNOWN.get(Path(program).name)
    title = f"{known.title} (`{program}`)" if known else f"`{program}`"
    on = f" on {where}" if where else ""
    command = install_command(program)
    how = f"; install it with `{command}`" if command else ""
    return f"{title} is not installed{on}: {what}{how}"


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _can_sudo() -> bool:
    """Whether sudo runs without asking for a password."""
    if shutil.which("sudo") is None:
        return False
    try:
        done = subprocess.run(["sudo", "-n", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def why_not_install() -> str | None:
    """Why install() cannot work here (None: it can): it needs apt-get, and root or sudo
    without a password."""
    if shutil.which("apt-get") is None:
        return "no apt-get on this machine"
    if not (_is_root() or _can_sudo()):
        return "not root, and no sudo without a password"
    return None


APT_TIMEOUT = 900  # seconds for apt-get's update, then for its install


def install(programs: Iterable[str], log: Callable[[str], None] = print) -> list[str]:
    """Install the known `programs` with apt-get (as root, or through sudo -n), each said in
    one line; apt-get's output goes to the log only where it fails; KataGo with play.katago
    (PyPI's katrain wheel, Debian's OpenCL). Returns those found afterwards. Unknown programs
    and a machine where we cannot install are left as they are."""
    programs = list(programs)
    packages = {KNOWN[p].debian: p for p in programs
                if p in KNOWN and KNOWN[p].debian and which(p) is None}  # fmt: skip
    if packages and why_not_install() is None:
        apt_install(list(packages), log)
    if "katago" in programs and which("katago") is None:
        from play import katago

        try:
            katago.install(log)
        except katago.InstallError as e:
            log(f"KataGo was not installed: {e}")
    return [p for p in programs if which(p) is not None]


def apt_install(packages: list[str], log: Callable[[str], None] = print) -> bool:
    """apt-get install -y `packages` (as root, or through sudo -n), after apt-get update;
    said in one line, apt-get's output logged only where a step fails. Whether the install
    step succeeded (False too where why_not_install() says it cannot)."""
    if why_not_install() is not None:
        return False
    # sudo resets the environment: the variable goes inside it, through env.
    sudo = [] if _is_root() else ["sudo", "-n", "env", "DEBIAN_FRONTEND=noninteractive"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    names = " ".join(packages)
    log(f"installing {names} (apt-get install -y {names})")
    # The package lists first (a fresh machine has none); a failed update still tries the
    # install, from lists that may be there.
    ok = False
    for step in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *packages]):
        try:
            done = subprocess.run(
                [*sudo, *step], capture_output=True, text=True, env=env, timeout=APT_TIMEOUT,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as e:
            log(f"{' '.join(step)} failed: {e}")
            continue
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            log(f"{' '.join(step)} failed (exit status {done.returncode}): {' / '.join(tail)}")
        ok = done.returncode == 0
    return ok
