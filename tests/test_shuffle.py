"""The shuffle stage: the paper's window formula, and windows built from real self-play
shards: the newest rows, each once, shuffled, in bounded files, with a manifest."""

from __future__ import annotations

import json
import math
import subprocess
import sys

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
        (broken / f"gen-{g}").mkdir(parents=True)
        for shard in R.list_shards(generations / f"gen-{g}"):
            (broken / f"gen-{g}" / shard.name).write_bytes(shard.read_bytes())
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
