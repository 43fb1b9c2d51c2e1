"""The loop flow under Prefect: it runs every stage of every generation through DVC, a
second run skips them all, and a loop killed mid-run resumes where it stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from flows.loop import STAGES, StageFailed, StageInterrupted, failure, loop
from tests.conftest import make_run_repo, run_in


@pytest.mark.slow
def test_the_loop_runs_through_dvc_and_resumes(tmp_path, prefect_api):
    repo = make_run_repo(tmp_path / "run", code_deps=False)
    # Killed while generation 0 shuffles (its window written, DVC not yet told): the stages
    # before it are done and stay done.
    from prefect.settings import PREFECT_API_URL

    env = dict(os.environ, PREFECT_API_URL=PREFECT_API_URL.value())
    child = subprocess.Popen(
        [sys.executable, "-c", f"from flows.loop import loop; loop({str(repo)!r})"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.time() + 600
    while not (repo / "data/windows/gen-0").exists() and time.time() < deadline:
        assert child.poll() is None, "the loop ended before it could be killed"
        time.sleep(0.2)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    shard = repo / "data/selfplay/gen-0/part-0.parquet"
    before = shard.stat().st_mtime_ns
    results = loop(str(repo))
    assert [r["stage"] for r in results] == [f"{s}-{n}" for n in (0, 1) for s in STAGES]
    ran = {r["stage"] for r in results if r["ran"]}
    # Self-play finished (and DVC recorded it) before the kill: it is not redone. The stage
    # running when the kill came (shuffle, or the next if DVC had just recorded it) runs again
    # from scratch, past the lock entries its killed dvc left.
    assert "selfplay-0" not in ran
    assert {"gate-1", "promote-1", "selfplay-1"} <= ran
    assert shard.stat().st_mtime_ns == before  # not redone
    assert results[-1]["metrics"]["generation"] == 1
    assert json.loads((repo / "reports/gate/gen-1.json").read_text())["games"] >= 1
    # Everything is in DVC's cache and up to date; a second loop runs nothing.
    assert "up to date" in run_in(repo, "dvc", "status")
    assert not any(r["ran"] for r in loop(str(repo)))


def test_killed_stages_are_retried_and_failed_ones_are_not():
    assert failure(1, "failed to run: python -m stages.train, exited with -9") is StageInterrupted
    assert failure(1, "failed to run: python -m stages.train, exited with 137") is StageInterrupted
    assert failure(-9, "") is StageInterrupted  # dvc itself killed
    assert failure(1, "failed to run: python -m stages.train, exited with 2") is StageFailed
    assert failure(1, "failed to run: python -m stages.train, exited with 1") is StageFailed
    assert failure(255, "ERROR: unexpected error") is StageFailed
