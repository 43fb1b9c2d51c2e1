"""`tengen bench rules` runs both sides and reports the documented shape (no timing asserts)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from tests.conftest import run_cli


def test_bench_rules_json_shape():
    pytest.importorskip(
        "pyspiel", reason="OpenSpiel is the bench extra: pip install 'tengen[bench]'"
    )
    result = run_cli("bench", "rules", "--json", "--seconds", "0.2", "--sizes", "5,9")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [r["board"] for r in rows] == ["5x5", "9x9"]
    for r in rows:
        assert {"board", "tengen_games_per_s", "openspiel_games_per_s", "ratio"} <= set(r)
        assert r["tengen_games_per_s"] > 0 and r["openspiel_games_per_s"] > 0
        assert r["ratio"] == pytest.approx(
            r["tengen_games_per_s"] / r["openspiel_games_per_s"], rel=0.01
        )
        # Both sides play the same kind of game: similar lengths (uniform moves incl. pass).
        assert 0.5 < r["tengen_moves_per_game"] / r["openspiel_moves_per_game"] < 2


def test_bench_rules_table():
    result = run_cli("bench", "rules", "--seconds", "0.1", "--sizes", "5")
    assert result.returncode == 0, result.stderr
    assert "random games per second" in result.stdout and "5x5" in result.stdout


@pytest.mark.slow
def test_bench_features_json_shape():
    result = run_cli(
        "bench", "features", "--json", "--seconds", "0.05", "--sizes", "5,7", "--batch", "8"
    )
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert {r["board"] for r in rows} == {"5x5", "7x7"}
    for r in rows:
        assert {
            "board",
            "device",
            "positions_per_s",
            "ladders_positions_per_s",
            "benson_positions_per_s",
            "forward_positions_per_s",
            "encode_fraction",
        } <= set(r)
        assert r["device"] in ("cpu", "cuda") and r["positions_per_s"] > 0
        assert r["ladders_positions_per_s"] > 0 and r["benson_positions_per_s"] > 0
        assert r["encode_fraction"] == pytest.approx(
            r["forward_positions_per_s"] / r["positions_per_s"], rel=0.01
        )
    assert {r["threads"] for r in rows if r["device"] == "cpu"} >= {1}


def test_bench_features_rejects_bad_sizes():
    result = run_cli("bench", "features", "--sizes", "9,twenty")
    assert result.returncode != 0 and "expected sizes like 9,19" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_bench_selfplay_json_shape():
    result = run_cli(
        "bench", "selfplay", "--json", "--seconds", "0.5", "--runs", "b2c16:5",
        "--slots", "4,6", "--leaves", "2", "--compile", "none,default", "--lockstep", "3",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    row, compiled, six, _ = json.loads(result.stdout)
    assert (six["games_in_parallel"], six["batch"]) == (6, 12)
    # A row for each compile mode; the compiled net's did compile (no fallback to eager).
    assert (row["compile"], compiled["compile"], six["compile"]) == ("none", "default", "none")
    assert row["encoder_registers"] is None  # the CUDA encoder's cap: none on the CPU
    assert compiled["selfplay_visits_per_s"] > 0 and compiled["net_only_evals_per_s"] > 0
    # The step's phases, each timed: the search's, the encoder's, the net's and the host's.
    phases = {"moves", "select", "remember", "encode", "legal", "net", "leaf values", "backup"}
    assert set(row["ms_per_step"]) == phases | {"step"}
    assert all(ms > 0 for ms in row["ms_per_step"].values())
    assert sum(row["ms_per_step"][k] for k in phases) <= row["ms_per_step"]["step"]
    # What of the roots a GPU receives a step: the games that moved or started, some of the 4.
    assert 0 < row["roots_changed_per_step"] < 4 and row["root_bytes"] > 1000
    # The leaves' past positions (2 a leaf) mostly come from their game's memo of ladders.
    assert 0 <= row["past_reads_per_step"] < 2 * row["evaluations_per_step"] <= 16
    # The GPU encoder's lockstep, modelled: no order of the rows in warps does better than
    # sorted by their own times, and none beats their mean (each row timed apart, all > 0).
    m = row["encoder_lockstep_us_per_row"]
    assert set(m) == {"row_order", "packed", "encode_order", "best_order", "mean"}
    assert 0 < m["mean"] <= m["best_order"] <= min(m["encode_order"], m["packed"], m["row_order"])
    assert "first step" in result.stderr and "warmed up" in result.stderr
    assert {
        "net", "board", "games_in_parallel", "device", "selfplay_visits_per_s",
        "net_only_evals_per_s", "efficiency",
    } <= set(row)  # fmt: skip
    assert (row["net"], row["board"], row["games_in_parallel"], row["batch"]) == ("b2c16", 5, 4, 8)
    assert row["selfplay_visits_per_s"] > 0 and row["net_only_evals_per_s"] > 0
    assert row["efficiency"] == pytest.approx(
        row["selfplay_visits_per_s"] / row["net_only_evals_per_s"], rel=0.01
    )


def test_warps_are_charged_their_slowest_thread():
    from bench.selfplay import warp_seconds

    assert warp_seconds(np.ones(33)) == 64  # two warps, the second one thread and 31 idle
    assert warp_seconds(np.arange(40.0)) == 32 * (31 + 39)
    # Rows of like time in a warp waste less: the same 64 rows, sorted or interleaved.
    light_heavy = np.tile([1.0, 9.0], 32)
    assert warp_seconds(light_heavy) == 32 * 18
    assert warp_seconds(np.sort(light_heavy)) == 32 * 10


def test_bench_selfplay_rejects_bad_runs():
    result = run_cli("bench", "selfplay", "--runs", "b6c96:nine")
    assert result.returncode != 0 and "net:board pairs" in result.stderr
    result = run_cli("bench", "selfplay", "--slots", "32,none")
    assert result.returncode == 2 and "positive game counts" in result.stderr
    result = run_cli("bench", "selfplay", "--dtype", "bfloat16")
    assert result.returncode == 2 and "runs on a GPU only" in result.stderr
    result = run_cli("bench", "selfplay", "--compile", "none,fast")
    assert result.returncode == 2 and "(got 'fast')" in result.stderr

    def said(result) -> str:  # rich's error box, its borders and line breaks taken out
        return " ".join(re.sub("[│╭╮╰╯─]", " ", result.stderr).split())

    result = run_cli("bench", "selfplay", "--encoder-registers", "128")
    assert result.returncode == 2 and "applies to the CUDA kernels" in said(result)
    result = run_cli("bench", "selfplay", "--device", "cuda", "--encoder-registers", "none,300")
    assert result.returncode == 2 and "'300' is not a register cap" in said(result)
    result = run_cli("bench", "selfplay", "--device", "cuda", "--lockstep", "5")
    assert result.returncode == 2 and "modelled with --device cpu" in said(result)


@pytest.mark.slow
def test_bench_threads_measures_beside_a_busy_process():
    import psutil

    before = {p.pid for p in psutil.process_iter()}
    result = run_cli("bench", "threads", "--net", "b2c16", "--board", "5", "--seconds", "0.5")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for setting in ("torch default, idle", "one thread, idle", "torch default, busy",
                    "one thread, busy"):  # fmt: skip
        [row] = [line for line in lines if line.strip().startswith(setting)]
        assert float(row.split()[-2].replace(",", "")) > 0, row
    assert "gives" in lines[-1] and "visits/s of torch's default threads" in lines[-1]
    # The busy processes are gone.
    burners = [p for p in psutil.process_iter(["cmdline"]) if p.pid not in before
               and "while True: pass" in " ".join(p.info["cmdline"] or [])]  # fmt: skip
    assert burners == []


@pytest.mark.slow
def test_bench_play_json_shape():
    result = run_cli("bench", "play", "--json", "--nets", "b2c16", "--visits", "8,16",
                     "--board", "7", "--moves", "2")  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [(r["net"], r["visits"]) for r in rows] == [("b2c16", 8), ("b2c16", 16)]
    for r in rows:
        assert r["seconds_per_move_full"] > 0 and r["net_only_evals_per_s"] > 0
        assert 0 < r["genmove_visits"] <= r["visits"]
        assert r["efficiency"] == pytest.approx(
            r["visits_per_s"] / r["net_only_evals_per_s"], rel=0.01
        )
    bad = run_cli("bench", "play", "--nets", "b9c9")
    assert bad.returncode == 2 and "unknown nets" in bad.stderr


@pytest.mark.slow
def test_bench_scale_plays_in_one_process_and_on_one_and_two_workers(tmp_path):
    import yaml

    from tests.test_selfplay import small_params

    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(small_params()))
    result = run_cli(
        "bench", "scale", "--json", "--net", "b2c16", "--games", "4", "--shards", "2",
        "--params", str(params),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout)
    today, one, two = out["rows"]
    assert (today["shards"], one["shards"], two["shards"]) == (1, 2, 2)
    assert {r["games"] for r in out["rows"]} == {4}
    for row in (one, two):
        assert 0 <= row["not_playing"] < 1 and row["cluster_start_s"] > 0
    assert out["speedup_2_over_1"] == pytest.approx(
        two["games_per_s"] / one["games_per_s"], rel=0.01
    )


def test_bench_scale_rejects_more_shards_than_games():
    result = run_cli("bench", "scale", "--games", "4", "--shards", "5")
    assert result.returncode != 0 and "between 2 and --games (4) shards" in result.stderr
