"""KaTrain reviews a game with tengen's net: its own non-GUI classes (KaTrainBase,
KataGoEngine, Game, as KaTrain's tests drive them) start `tengen analysis` through the engine
setting a user changes (`altcommand`), and read what KaTrain shows: win rate, score lead,
points lost, candidate moves, ownership."""

from __future__ import annotations

import os
import shlex
import sys
import time

import pytest

KATRAIN_HOWTO = "KaTrain is not installed: pip install 'tengen[katrain]' (make test does)"


@pytest.fixture(scope="module")
def katrain_classes(tmp_path_factory):
    home = tmp_path_factory.mktemp("kivy")
    os.environ.update(KIVY_NO_ARGS="1", KIVY_NO_CONSOLELOG="1", KIVY_HOME=str(home))
    try:
        from katrain.core.base_katrain import KaTrainBase
        from katrain.core.engine import KataGoEngine
        from katrain.core.game import Game
        from pysgf import Move
    except ImportError as e:
        if os.environ.get("TENGEN_REQUIRE_KATRAIN"):  # CI installs it: missing is a failure
            pytest.fail(f"{KATRAIN_HOWTO} ({e})")
        pytest.skip(f"{KATRAIN_HOWTO} ({e})")
    return KaTrainBase, KataGoEngine, Game, Move


def test_katrain_reviews_a_game_with_tengen_analysis(katrain_classes, tiny_model, tmp_path):
    KaTrainBase, KataGoEngine, Game, Move = katrain_classes
    config_file = tmp_path / "analysis.cfg"
    config_file.write_text("numSearchThreadsPerAnalysisThread = 1\n")
    katrain = KaTrainBase(force_package_config=True, debug_level=0)
    config = dict(katrain.config("engine"))
    config.update(
        altcommand=shlex.join([sys.executable, "-m", "flows.cli", "analysis", "-model",
                               str(tiny_model), "-config", str(config_file)]),  # fmt: skip
        max_visits=24, fast_visits=8, max_time=30.0,
    )  # fmt: skip
    engine = KataGoEngine(katrain, config)
    try:
        game = Game(katrain, engine, game_properties={"SZ": 9, "KM": 7.5, "RU": "chinese"})
        for i, gtp in enumerate(["E5", "C3", "G7", "D7", "pass"]):
            game.play(Move.from_gtp(gtp, player="BW"[i % 2]))
        nodes = list(game.root.nodes_in_tree)
        deadline = time.monotonic() + 300
        while not all(n.analysis_complete for n in nodes) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all(n.analysis_complete for n in nodes), [n.analysis_complete for n in nodes]
        for node in nodes:
            assert 0.0 <= node.winrate <= 1.0 and isinstance(node.score, float)
            assert node.root_visits >= 24
            candidates = node.candidate_moves
            assert candidates and all(c["visits"] > 0 for c in candidates)
            assert {"move", "winrate", "scoreLead", "pv", "pointsLost", "prior"} <= set(
                candidates[0]
            )
            assert len(node.ownership) == 81 and all(-1 <= v <= 1 for v in node.ownership)
            assert len(node.policy) == 82
            if node.move is not None:  # the move played: how many points it lost
                assert isinstance(node.points_lost, float)
    finally:
        # KaTrain's shutdown joins reader threads that may wait on a pipe: stop the engine
        # ourselves (its threads are daemons and end with the process's pipes).
        process, engine.katago_process = engine.katago_process, None
        if process is not None:
            process.kill()
            process.wait(timeout=60)
