"""The data report (stages.data): every figure against a hand-built shard of known games,
the sane-range warnings, `tengen data` on a folder and on a report, and the game columns
self-play writes against its own SGF records."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pyarrow as pa
import pytest

from gocore.features import N_GLOBALS, packed_length
from stages import data, tracking
from stages.rows import SCHEMA, list_shards, manifest_shards, read_shard, write_shard
from tests.conftest import run_cli

N = 5  # a 5x5 board: 25 points, pass is index 25


def _policy(entries: dict[int, float]) -> list[float]:
    p = [0.0] * (N * N + 1)
    for i, v in entries.items():
        p[i] = v
    return p


def _row(game, turn, to_move, *, outcome, score, root_value, policy, full=True, side=False):
    """One row of game `game` (a dict of its own columns)."""
    return {
        "game_id": game["id"], "generation": 0, "model_id": "uniform", "turn": turn,
        "board_size": N, "rules": game["rules"], "komi": game["komi"], "to_move": to_move,
        "planes": bytes(packed_length(N)), "globals": [0.0] * N_GLOBALS,
        "policy_target": policy, "policy_weight": 1.0 if full else 0.0,
        "opponent_move": -1, "outcome": outcome, "final_score": 0.0 if side else score,
        "ownership": [0] * (N * N), "score_weight": 0.0 if side else 1.0, "value_weight": 1.0,
        "visits": 10, "root_value": root_value, "root_score": 0.0,
        "game_length": game["length"], "game_end": game["end"],
        "first_pass": game["first_pass"], "handicap": game["handicap"],
    }  # fmt: skip


def _game(gid, length, end, first_pass, komi, rules, handicap=0):
    return dict(id=gid, length=length, end=end, first_pass=first_pass, komi=komi, rules=rules,
                handicap=handicap)  # fmt: skip


def known_rows() -> list[dict]:
    """Four played games, a side position and one duplicated row (see test_figures)."""
    a = _game("g0-s0-000000", 30, "passes", 28, 7.5, "chinese")  # Black +2.5
    b = _game("g0-s0-000001", 8, "passes", 6, 7.5, "japanese")  # White +7.5, passes early
    c = _game("g0-s0-000002", 75, "move_limit", -1, 6.5, "chinese")  # Black +0.5
    d = _game("g0-s0-000003", 40, "passes", 30, 0.5, "chinese", handicap=2)  # White +3
    s = _game("g0-s0-000004", 13, "side", -1, 7.5, "chinese")
    one_hot = _policy({3: 1.0})
    on_pass = _policy({N * N: 1.0})
    a4 = _row(a, 4, 1, outcome=1, score=2.5, root_value=0.0, policy=on_pass)
    return [
        _row(a, 0, 1, outcome=1, score=2.5, root_value=0.5, policy=_policy({0: 0.5, 1: 0.5})),
        _row(a, 1, 2, outcome=-1, score=-2.5, root_value=-0.5, policy=one_hot),
        a4,
        dict(a4),  # the duplicate
        _row(b, 0, 1, outcome=-1, score=-7.5, root_value=0.0, policy=one_hot),
        _row(b, 1, 2, outcome=1, score=7.5, root_value=0.0, policy=_policy({}), full=False),
        _row(c, 2, 1, outcome=1, score=0.5, root_value=0.75, policy=one_hot),
        _row(d, 1, 2, outcome=1, score=3.0, root_value=-0.75, policy=one_hot),
        _row(s, 12, 1, outcome=0.25, score=0.0, root_value=0.25, side=True,
             policy=_policy({0: 0.25, 1: 0.25, 2: 0.25, 4: 0.25})),
    ]  # fmt: skip


@pytest.fixture
def known(tmp_path):
    folder = tmp_path / "gen-0"
    folder.mkdir()
    rows = known_rows()
    write_shard(pa.Table.from_pylist(rows[:5], schema=SCHEMA), folder / "part-0.parquet")
    write_shard(pa.Table.from_pylist(rows[5:], schema=SCHEMA), folder / "part-1.parquet")
    return folder


def test_figures_of_known_games(known):
    r = data.report(data.shards_of(known))
    assert (r["shards"], r["rows"], r["games"], r["side_positions"]) == (2, 9, 4, 1)
    assert r["board_sizes"] == [5]
    # Full-search rows: a 4 (its duplicate too), b 1, c 1, d 1; b's second row is cheap.
    assert r["rows_per_game"] == {"full": 1.75, "cheap": 0.25, "side_position": 1.0}
    g = r["game_length"]
    assert g["mean"] == 38.25 and (g["min"], g["max"]) == (8, 75)  # 30, 8, 75, 40
    assert (g["p10"], g["p90"]) == (8, 75) and g["p50"] in (30, 40)
    assert g["per_area"] == pytest.approx(1.53)  # (30 + 8 + 75 + 40) / 25 / 4
    assert r["ends"] == {"passes": 0.75, "move_limit": 0.25}
    # b ended by two passes at move 8, and its first pass was move 7 (turn 6): both before
    # move 2 x 5; a's first pass was move 29.
    assert r["early_end_games"] == 0.25 and r["early_pass_games"] == 0.25
    # Even games a, b, c (d has two handicap stones): Black wins a and c.
    assert r["even_games"] == 3
    assert r["black_win_rate"] == pytest.approx(0.6667)
    assert r["draw_rate"] == 0 and r["mean_black_score"] == pytest.approx(-1.5)
    assert r["by_komi"] == [
        {"komi": 6.5, "games": 1, "black_win_rate": 1.0, "mean_black_score": 0.5,
         "mean_length": 75.0},
        {"komi": 7.5, "games": 2, "black_win_rate": 0.5, "mean_black_score": -2.5,
         "mean_length": 19.0},
    ]  # fmt: skip
    assert [(x["rules"], x["games"], x["black_win_rate"]) for x in r["by_rules"]] == [
        ("chinese", 2, 1.0), ("japanese", 1, 0.0)
    ]  # fmt: skip
    # Eight full rows: entropies ln 2 (a's first), ln 4 (the side position), 0 for the six
    # one-hot targets (two of them on pass).
    p = r["policy"]
    assert p["rows"] == 8
    assert p["entropy"] == pytest.approx(3 * math.log(2) / 8, abs=1e-4)
    assert p["entropy_of_uniform_share"] == pytest.approx(
        3 * math.log(2) / 8 / math.log(26), abs=1e-4
    )
    assert p["top"] == pytest.approx((0.5 + 6 + 0.25) / 8, abs=1e-4)
    assert p["pass_mass"] == 0.25
    # Calibration over the eight played-out rows: predicted (1 + v) / 2 against the outcome.
    c = r["value_calibration"]
    assert c["rows"] == 8
    assert [(b["bin"], b["rows"], b["predicted"], b["observed"]) for b in c["bins"]] == [
        ("0.1-0.2", 1, 0.125, 1.0),
        ("0.2-0.3", 1, 0.25, 0.0),
        ("0.5-0.6", 4, 0.5, 0.75),
        ("0.7-0.8", 1, 0.75, 1.0),
        ("0.8-0.9", 1, 0.875, 1.0),
    ]
    assert c["error"] == pytest.approx((0.875 + 0.25 + 4 * 0.25 + 0.25 + 0.125) / 8)
    assert (r["duplicate_rows"], r["duplicate_game_ids"]) == (1, 1)
    # Four games are too few for the rates to warn; the rest do.
    assert [w.split(" = ")[0] for w in r["warnings"]] == [
        "policy.pass_mass", "value_calibration.error", "duplicate_rows"
    ]  # fmt: skip


def test_warnings_need_enough_games():
    sane = {"games": 100, "even_games": 100, "game_length": {"per_area": 1.4},
            "ends": {"move_limit": 0.0}, "early_pass_games": 0.02, "black_win_rate": 0.45,
            "policy": {"pass_mass": 0.01}, "value_calibration": {"error": 0.05},
            "duplicate_rows": 0}  # fmt: skip
    assert data.warnings(sane) == []
    short = json.loads(json.dumps(sane))
    short["game_length"]["per_area"] = 0.55
    short["black_win_rate"] = 0.15
    assert [w.split(" = ")[0] for w in data.warnings(short)] == [
        "game_length.per_area", "black_win_rate"
    ]  # fmt: skip
    short.update(games=10, even_games=10)
    assert data.warnings(short) == []
    drawn = dict(sane, draw_rate=0.36, early_end_games=0.2)
    assert [w.split(" = ")[0] for w in data.warnings(drawn)] == ["early_end_games", "draw_rate"]
    assert "is above 0.2" in data.warnings(drawn)[1]


@pytest.mark.slow
def test_tengen_data_on_a_folder_a_report_and_bad_input(known, tmp_path):
    result = run_cli("data", str(known))
    assert result.returncode == 0, result.stderr
    assert "games (side positions)" in result.stdout and "4 (1)" in result.stdout
    assert "warning: duplicate_rows = 1" in result.stdout
    as_json = run_cli("data", str(known), "--json")
    report = json.loads(as_json.stdout)
    assert report["games"] == 4
    path = tmp_path / "gen-0.json"
    path.write_text(as_json.stdout)
    again = run_cli("data", str(path))
    assert again.returncode == 0 and again.stdout.splitlines()[1:] == result.stdout.splitlines()[1:]
    # Bad input: a truncated shard, an empty folder, a JSON that is not a report.
    shard = known / "part-1.parquet"
    shard.write_bytes(shard.read_bytes()[:200])
    broken = run_cli("data", str(known))
    assert broken.returncode == 2 and f"{shard} is corrupt or truncated" in broken.stderr
    (tmp_path / "empty").mkdir()
    assert "holds no shards" in run_cli("data", str(tmp_path / "empty")).stderr
    path.write_text("[1, 2]")
    bad = run_cli("data", str(path))
    assert bad.returncode == 2 and "is not a data report" in bad.stderr
    path.write_text('{"version": 1, "games": 3}')
    assert "is not a data report" in run_cli("data", str(path)).stderr


def test_what_shards_a_path_has(known, tmp_path):
    """One shard; a folder; a stray copy beside the shards; the windows of a run (refused:
    they overlap); a shard whose pages do not match their checksums, with no manifest."""
    assert data.shards_of(known / "part-0.parquet") == [known / "part-0.parquet"]
    (known / "part-0-copy.parquet").write_bytes((known / "part-0.parquet").read_bytes())
    assert data.shards_of(known) == [known / "part-0.parquet", known / "part-1.parquet"]
    windows = tmp_path / "windows"
    for g in range(2):
        (windows / f"gen-{g}").mkdir(parents=True)
        (windows / f"gen-{g}" / "manifest.json").write_text(
            json.dumps({"window_rows": 0, "files": []})
        )
    with pytest.raises(data.InputError, match="is a window, and the windows of"):
        data.shards_of(windows)
    shard = known / "part-1.parquet"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 3] ^= 0x10  # inside the data pages, the footer intact
    shard.write_bytes(bytes(raw))
    with pytest.raises(data.InputError, match=f"{shard} is corrupt"):
        data.shards_of(known)


def test_game_columns_match_the_sgf_records(selfplay_generations):
    """Each game's game_length, game_end and first_pass against its SGF file (parsed by
    sgfmill), over three real generations of self-play."""
    from sgfmill import sgf

    checked = 0
    for gen in range(3):
        folder = selfplay_generations / f"gen-{gen}"
        listed, _ = manifest_shards(folder)  # self-play's manifest: every shard, checked
        assert [s for s, _ in listed] == list_shards(folder)
        # The lineage digest read from it is the one hashing the shards gives.
        hashed = hashlib.sha256()
        for shard in sorted(folder.glob("part-*.parquet")):
            hashed.update(
                f"{shard.name}\0{hashlib.sha256(shard.read_bytes()).hexdigest()}\n".encode()
            )
        assert tracking.data_digest(folder) == hashed.hexdigest()
        table = pa.concat_tables(read_shard(s) for s in list_shards(folder))
        first = {}
        for row in table.select(["game_id", "game_length", "game_end", "first_pass"]).to_pylist():
            first.setdefault(row["game_id"], row)
        for gid, row in first.items():
            game = sgf.Sgf_game.from_bytes((folder / "sgf" / f"{gid}.sgf").read_bytes())
            moves = [node.get_move()[1] for node in game.get_main_sequence()[1:]]
            passes = [i for i, m in enumerate(moves) if m is None]
            assert row["game_length"] == len(moves), gid
            assert row["first_pass"] == (passes[0] if passes else -1), gid
            side = "side position" in game.get_root().get("C")
            end = "side" if side else "passes" if moves[-2:] == [None, None] else "move_limit"
            assert row["game_end"] == end, gid
            checked += 1
    assert checked >= 12
    report = data.report(data.shards_of(selfplay_generations))  # a run's data/selfplay
    assert report["shards"] == sum(len(list_shards(selfplay_generations / f"gen-{g}"))
                                   for g in range(3))  # fmt: skip
    assert report["games"] == 12 and np.isfinite(report["game_length"]["mean"])
