"""The shuffle stage: the paper's window formula, and windows built from real self-play
shards: the newest rows, each once, shuffled, in bounded files, with a manifest."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from stages import rows as R
from stages import shuffle
from tests.conftest import REPO


def test_window_formula_against_hand_values():
    c, alpha, beta = 250_000, 0.75, 0.4
    assert shuffle.window_size(1000, c, alpha, beta) == 1000
    assert shuffle.window_size(c, c, alpha, beta) == c
    # 2c: c (1 + 0.4 (2^0.75 - 1) / 0.75) = 1.363623 c = 340,906 for c = 250,000
    assert shuffle.window_size(2 * c, c, alpha, beta) == round(c * (1 + 0.4 * 0.681793 / 0.75))
    assert shuffle.window_size(2 * c, c, alpha, beta) == pytest.approx(340_906, abs=1)
    # Its slope at c is beta, and it grows more slowly beyond.
    slope = (shuffle.window_size(c + 1000, c, alpha, beta) - c) / 1000
    assert slope == pytest.approx(beta, abs=0.001)
    # 10c: c (1 + 0.4 (10^0.75 - 1) / 0.75) = 3.46582 c, a third of the rows played.
    assert shuffle.window_size(10 * c, c, alpha, beta) == pytest.approx(866_455, abs=1)


@pytest.fixture(scope="module")
def generations(selfplay_generations):
    return selfplay_generations


def _params(**kw):
    values = dict(window_c=40, window_alpha=0.75, window_beta=0.4, rows_per_file=25, seed=0)
    values.update(kw)
    return shuffle.Params(shuffle=shuffle.ShuffleParams(**values))


def _rows(folder):
    return [r for s in R.list_shards(folder) for r in R.read_shard(s).to_pylist()]


def test_window_takes_the_newest_rows_each_once_shuffled(generations, tmp_path):
    out = tmp_path / "gen-2"
    metrics = shuffle.run(_params(), shuffle.ShuffleIO(2, generations, out))
    per_gen = {g: _rows(generations / f"gen-{g}") for g in range(3)}
    total = sum(len(r) for r in per_gen.values())
    window = shuffle.window_size(total, 40, 0.75, 0.4)
    assert 40 < window < total and metrics["window_rows"] == window
    rows = _rows(out)
    assert len(rows) == window
    keys = [(r["game_id"], r["turn"]) for r in rows]
    assert len(set(keys)) == window  # each row once
    # Newest first: all of generation 2, then generation 1's, then part of generation 0.
    taken = {g: sum(r["generation"] == g for r in rows) for g in range(3)}
    newest = len(per_gen[2])
    assert taken[2] == min(newest, window)
    if window > newest:
        assert taken[1] == min(len(per_gen[1]), window - newest)
    source = {(r["game_id"], r["turn"]): r for g in range(3) for r in per_gen[g]}
    assert all(r == source[(r["game_id"], r["turn"])] for r in rows)  # rows unchanged
    # Shuffled across the window, in files of about rows_per_file.
    assert keys != sorted(keys, key=lambda k: (k[0], k[1]))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["window_rows"] == window and manifest["total_rows"] == total
    assert len(manifest["files"]) == math.ceil(window / 25)
    assert sum(f["rows"] for f in manifest["files"]) == window
    assert sum(s["taken"] for s in manifest["sources"]) == window
    for f in manifest["files"]:
        assert pq.ParquetFile(out / f["name"]).metadata.num_rows == f["rows"]
    # The same inputs and seed give the same window.
    again = shuffle.run(_params(), shuffle.ShuffleIO(2, generations, tmp_path / "again"))
    assert again["digest"] == metrics["digest"]
    other = shuffle.run(_params(seed=1), shuffle.ShuffleIO(2, generations, tmp_path / "other"))
    assert other["digest"] != metrics["digest"]


def test_a_window_under_c_is_everything(generations, tmp_path):
    metrics = shuffle.run(_params(window_c=10**6), shuffle.ShuffleIO(1, generations, tmp_path))
    assert (
        metrics["window_rows"]
        == metrics["total_rows"]
        == sum(len(_rows(generations / f"gen-{g}")) for g in (0, 1))
    )


@pytest.mark.slow
def test_missing_and_corrupt_inputs_name_the_stage(generations, tmp_path):
    with pytest.raises(shuffle.InputError, match="run the selfplay stage for generation 3"):
        shuffle.run(_params(), shuffle.ShuffleIO(3, generations, tmp_path / "w"))
    broken = tmp_path / "selfplay"
    for g in range(2):
        shutil.copytree(generations / f"gen-{g}", broken / f"gen-{g}")
    shard = R.list_shards(broken / "gen-1")[0]
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(shuffle.InputError, match=f"{shard} is corrupt or truncated"):
        shuffle.run(_params(), shuffle.ShuffleIO(1, broken, tmp_path / "w"))
    assert not (tmp_path / "w").exists() and not list(tmp_path.glob(".w.*"))
    result = subprocess.run(
        [sys.executable, "-m", "stages.shuffle", "--generation", "1", "--selfplay", str(broken),
         "--out", str(tmp_path / "w"), "--params", str(REPO / "params.yaml")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2 and "rerun the selfplay stage for generation 1" in result.stderr


def test_polars_and_pyarrow_passes_write_the_same_window(generations, tmp_path):
    """The stage's polars passes and the pyarrow baseline's (bench.shuffle) deal the
    same rows to the same buckets in the same order: the same manifest, the same files."""
    from bench.shuffle import pyarrow_deal, pyarrow_gather

    ours = shuffle.run(_params(), shuffle.ShuffleIO(2, generations, tmp_path / "polars"))
    base = shuffle.run(
        _params(), shuffle.ShuffleIO(2, generations, tmp_path / "pyarrow"),
        deal=pyarrow_deal, gather=pyarrow_gather,
    )  # fmt: skip
    assert ours == base and ours["window_rows"] < ours["total_rows"]  # part of gen-0 taken
    manifests = [json.loads((tmp_path / e / "manifest.json").read_text()) for e in
                 ("polars", "pyarrow")]  # fmt: skip
    assert manifests[0] == manifests[1]
    for f in manifests[0]["files"]:
        assert (tmp_path / "polars" / f["name"]).read_bytes() == (
            tmp_path / "pyarrow" / f["name"]
        ).read_bytes()
    # The oldest generation's part is the same rows as the key order says, not its first rows.
    taken = [s for s in manifests[0]["sources"] if s["taken"] < s["rows"]]
    assert len(taken) == 1
    assert not list((tmp_path / "polars").glob(".bucket-*"))


def test_the_window_report_of_the_generation(generations, tmp_path, monkeypatch):
    """The stage's data report is of generation N's own rows (stages.data), every one; paths
    relative to the working folder, as dvc.yaml gives them."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(generations, "selfplay")
    report = Path("data/gen-1.json")
    shuffle.run(_params(), shuffle.ShuffleIO(1, Path("selfplay"), Path("w"), report))
    manifest = json.loads(Path("w/manifest.json").read_text())
    assert sum(f["rows"] for f in manifest["files"]) == manifest["window_rows"] > 40
    figures = json.loads(report.read_text())
    assert figures["rows"] == len(_rows(generations / "gen-1"))
    assert figures["games"] == 4 and isinstance(figures["warnings"], list)


@pytest.mark.slow
def test_memory_stays_bounded_on_a_window_larger_than_the_cap(tmp_path):
    """600,000 9x9 rows (about 440 MB in memory) shuffled in 30 files: the shuffle's process
    peaks under its imports' resident memory plus a 200 MB cap."""
    from bench.shuffle import _in_a_process, synthetic_history

    rows = 600_000
    selfplay = synthetic_history(tmp_path / "selfplay", rows, rows_per_shard=20_000)
    in_memory = sum(R.read_shard(s).nbytes for s in R.list_shards(selfplay / "gen-0")) * 10
    cap = 200 * 2**20
    assert in_memory > 2 * cap
    imports = subprocess.run(
        [sys.executable, "-c", "import resource, stages.shuffle, bench.shuffle; "
         "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)"],
        capture_output=True, text=True, check=True, cwd=REPO,
    )  # fmt: skip
    params = dict(window_c=10 * rows, window_alpha=0.75, window_beta=0.4, rows_per_file=20_000,
                  seed=0)  # fmt: skip
    m = _in_a_process("polars", selfplay, tmp_path / "window", 9, params)
    assert m["window_rows"] == rows and m["files"] == 30
    assert m["peak_rss_bytes"] < int(imports.stdout) + cap, (m, imports.stdout)
