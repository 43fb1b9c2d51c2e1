"""params.yaml's defaults ship inside the package: an installed tengen, started from a folder
with no params.yaml (as a GUI starts `tengen gtp`), reads the same defaults as the source
tree."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from stages.params import load_params

ROOT = Path(__file__).resolve().parent.parent

_PROBE = """
import json, sys
from play.defaults import DEFAULTS, params_file
from stages.params import load_params
path = params_file(None)
print(json.dumps({"path": str(path), "link": path.is_symlink(), "params": load_params(path)}))
"""


def test_an_installed_tengen_reads_the_defaults_it_ships(tmp_path):
    wheels, site, elsewhere = tmp_path / "wheels", tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    # The checkout's files (links as links), built outside it: a build leaves build/ behind.
    source = tmp_path / "source"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_symlink() or (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name, follow_symlinks=False)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    built = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    [wheel] = wheels.glob("tengen-*.whl")
    installed = subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(site), str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, cwd=elsewhere, env=env,
        timeout=120,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-2000:]
    found = json.loads(probe.stdout)
    # The installed package's own file (not the source tree's, not a link to it).
    assert Path(found["path"]) == site / "play" / "params.yaml" and not found["link"]
    assert found["params"] == json.loads(json.dumps(load_params(ROOT / "params.yaml")))
