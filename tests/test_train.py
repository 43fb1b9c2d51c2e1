"""The train stage: rows decoded into the network's inputs and targets under each symmetry
exactly as the encoder would have written them, and a generation trained, snapshotted and
resumed by the next."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from gocore import features as F
from nets.checkpoint import load
from play.sgf import read_sgf, replay
from stages import rows as R
from stages import shuffle, train
from tests.conftest import REPO, default_section

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def window(selfplay_generations, tmp_path_factory):
    out = tmp_path_factory.mktemp("windows") / "gen-2"
    params = shuffle.Params(shuffle=shuffle.ShuffleParams(
        window_c=60, window_alpha=0.75, window_beta=0.4, rows_per_file=40, seed=0
    ))  # fmt: skip
    shuffle.run(params, shuffle.ShuffleIO(2, selfplay_generations, out))
    return out


def test_rows_decode_to_what_the_encoder_writes_under_each_symmetry(selfplay_generations):
    folder = selfplay_generations / "gen-1"
    table = R.read_shard(R.list_shards(folder)[0]).slice(0, 8)
    symmetry = np.arange(8)
    arrays = R.training_arrays(table, 7, symmetry)  # 5x5 boards in a 7x7 tensor
    for i, row in enumerate(table.to_pylist()):
        n = row["board_size"]
        game = replay(read_sgf(folder / "sgf" / f"{row['game_id']}.sgf"), upto=row["turn"])
        planes = np.zeros((1, F.N_PLANES, 7, 7), np.float32)
        glob = np.zeros((1, F.N_GLOBALS), np.float32)
        F.encode_all(game.b, F.new_work(game.b), planes, glob, np.array([symmetry[i]]))
        assert np.array_equal(arrays["planes"][i], planes[0]), i
        np.testing.assert_allclose(arrays["globals"][i], glob[0])
        # The policy target, ownership and reply move land on the same points as the planes:
        # through the encoder's own policy mapping back to the board.
        policy = arrays["policy_target"][i]
        assert policy.sum() == pytest.approx(sum(row["policy_target"]), abs=1e-5)
        back = F.policy_all(game.b, policy[None, :], np.array([symmetry[i]]))[0]
        for y in range(n):
            for x in range(n):
                point = (y + 1) * game.b.stride + x + 1
                assert back[point] == pytest.approx(row["policy_target"][y * n + x])
        own = arrays["ownership"][i]
        assert own.sum() == sum(row["ownership"]) and not own[n:, :].any()
        assert arrays["outcome"][i].tolist() == pytest.approx(
            [(1 + row["outcome"]) / 2, (1 - row["outcome"]) / 2, 0.0]
        )
        reply = row["opponent_move"]
        if reply == n * n:
            assert arrays["opponent_move"][i] == 49
        elif reply >= 0:
            hot = np.zeros(50, np.float32)
            hot[arrays["opponent_move"][i]] = 1
            back = F.policy_all(game.b, hot[None, :], np.array([symmetry[i]]))[0]
            assert back[((reply // n) + 1) * game.b.stride + reply % n + 1] == 1


def _params(**kw):
    values = dict(
        net="b2c16", tensor=5, batch_size=16, samples_per_generation=64, lr_per_sample=1e-4,
        warmup_samples=32, warmup_factor=0.5, momentum=0.9, snapshots=2, seed=0, threads=1,
        global_pooling=True, go_features=True,
    )  # fmt: skip
    values.update(kw)
    return train.Params(
        train=train.TrainParams(**values), loss=default_section("loss"), device="cpu"
    )


def test_a_generation_trains_snapshots_and_the_next_resumes(window, tmp_path):
    io0 = train.TrainIO(0, window, tmp_path / "gen-0", tmp_path / "reports" / "gen-0.json")
    m0 = train.run(_params(), io0)
    assert m0["steps"] == 4 and m0["samples_total"] == 64
    snaps = sorted((tmp_path / "gen-0" / "snapshots").glob("snap-*.pt"))
    assert [p.name for p in snaps] == ["snap-1.pt", "snap-2.pt"]
    model, meta = load(snaps[-1])
    assert meta["samples"] == 64 and meta["window_digest"] == m0["window_digest"]
    for term in ("policy", "outcome", "ownership", "score_pdf", "total"):
        assert np.isfinite(m0["loss"][term]) and m0["loss"][term] > 0
    assert [s["samples"] for s in m0["snapshots"]] == [32, 64]
    assert json.loads(io0.metrics.read_text()) == m0
    # The same seed, the same weights.
    again = train.run(_params(), train.TrainIO(0, window, tmp_path / "again",
                                                              tmp_path / "again.json"))  # fmt: skip
    assert again["loss"] == m0["loss"]
    # Generation 1 resumes: the samples count goes on, and its first step starts from the
    # saved weights and momentum.
    io1 = train.TrainIO(1, window, tmp_path / "gen-1", tmp_path / "m1.json", tmp_path / "gen-0")
    m1 = train.run(_params(), io1)
    assert m1["samples_total"] == 128
    state0 = torch.load(tmp_path / "gen-0" / "state.pt", weights_only=True)
    assert state0["optimizer"]["state"], "momentum buffers are saved"
    # With a vanishing learning rate and no momentum, generation 1 ends where generation 0
    # did: it started from generation 0's weights, not from a fresh net.
    still = train.TrainIO(1, window, tmp_path / "still", tmp_path / "m2.json", tmp_path / "gen-0")
    train.run(_params(lr_per_sample=1e-12, momentum=0.0), still)
    resumed = load(tmp_path / "still" / "snapshots" / "snap-2.pt")[0].state_dict()
    for name, value in model.state_dict().items():
        if value.is_floating_point() and "running" not in name:
            assert torch.allclose(resumed[name], value, atol=1e-6), name


@pytest.mark.slow
def test_missing_inputs_name_the_stage(window, tmp_path):
    with pytest.raises(train.InputError, match="run the shuffle stage first"):
        train.run(_params(), train.TrainIO(0, tmp_path / "none", tmp_path / "o",
                                                          tmp_path / "m.json"))  # fmt: skip
    io = train.TrainIO(1, window, tmp_path / "o", tmp_path / "m.json", tmp_path / "g0")
    with pytest.raises(train.InputError, match="train stage of the previous generation"):
        train.run(_params(), io)
    assert not (tmp_path / "o").exists()
    result = subprocess.run(
        [sys.executable, "-m", "stages.train", "--generation", "3", "--window",
         str(tmp_path / "none"), "--out", str(tmp_path / "o"), "--params",
         str(REPO / "params.yaml")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2 and "run the shuffle stage first" in result.stderr


def test_small_window_files_still_fill_batches(selfplay_generations, tmp_path):
    """Window files smaller than a batch: batches are filled across files (no endless wait)."""
    out = tmp_path / "window"
    params = shuffle.Params(shuffle=shuffle.ShuffleParams(
        window_c=60, window_alpha=0.75, window_beta=0.4, rows_per_file=5, seed=0))  # fmt: skip
    shuffle.run(params, shuffle.ShuffleIO(2, selfplay_generations, out))
    io = train.TrainIO(0, out, tmp_path / "gen-0", tmp_path / "m.json")
    assert train.run(_params(), io)["steps"] == 4
    # A window smaller than one batch, or too few samples for the snapshots, is refused.
    with pytest.raises(train.InputError, match="fewer than one batch"):
        train.run(_params(batch_size=10_000, samples_per_generation=20_000), io)
    with pytest.raises(train.ParamsError, match="every one of the 2 snapshots"):
        train.run(_params(samples_per_generation=16), io)
