"""The EMA stage: the moving average by hand, batch-norm statistics measured again for the
averaged weights, and a candidate per generation carried into the next."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nets.checkpoint import load
from nets.model import MaskedBatchNorm
from stages import ema, shuffle, train
from stages.window import batches, window_files
from tests.conftest import default_section

torch.set_num_threads(1)


def test_average_against_a_hand_computation():
    snaps = [{"w": torch.tensor([float(k)]), "n": torch.tensor(k)} for k in (1, 2, 3, 4, 5)]
    # Without a previous average it starts at the first snapshot; the second moves it a
    # quarter of the way (decay 0.75 per snapshot): 1 + 0.25 * (2 - 1).
    got = ema.average(None, snaps[:2], 0.75)
    assert got["w"].item() == pytest.approx(1.25)
    assert got["n"].item() == 2  # integer buffers take the newest
    # Four snapshots of 1 move an average of 0 to 1 - 0.75^4: the paper's candidate every four
    # snapshots keeps 0.31640625 of the previous candidate.
    ones = [{"w": torch.ones(3)}] * 4
    assert ema.average({"w": torch.zeros(3)}, ones, 0.75)["w"].tolist() == pytest.approx(
        [0.68359375] * 3
    )
    # 0 -> 0.25 -> 0.6875 -> 1.265625 -> 1.94921875 -> 2.7119140625 after snapshots 1..5.
    assert ema.average({"w": torch.zeros(1), "n": torch.tensor(0)}, snaps, 0.75)[
        "w"
    ].item() == pytest.approx(2.7119140625)


@pytest.fixture(scope="module")
def trained(selfplay_generations, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    window = root / "window"
    shuffle.run(
        shuffle.Params(shuffle=shuffle.ShuffleParams(
            window_c=60, window_alpha=0.75, window_beta=0.4, rows_per_file=40, seed=0)),
        shuffle.ShuffleIO(2, selfplay_generations, window),
    )  # fmt: skip
    params = train.Params(train=TRAIN, loss=default_section("loss"), device="cpu")
    for gen in (0, 1):
        previous = root / f"gen-{gen - 1}" / "train" if gen else None
        io = train.TrainIO(gen, window, root / f"gen-{gen}" / "train", root / "m.json", previous)
        train.run(params, io)
    return root, window


TRAIN = train.TrainParams(
    net="b2c16", tensor=5, batch_size=16, samples_per_generation=64, lr_per_sample=1e-3,
    warmup_samples=0, warmup_factor=1.0, momentum=0.9, snapshots=4, seed=0, threads=1,
    global_pooling=True, go_features=True,
)  # fmt: skip


def _params(**kw):
    values = dict(decay=0.75, bn_batches=3, bn_batch_size=16, threads=1, seed=0)
    values.update(kw)
    return ema.Params(ema=ema.EmaParams(**values), train=TRAIN, device="cpu")


def test_candidates_average_the_snapshots_and_carry_on(trained):
    root, window = trained

    def io(gen, previous=None):
        return ema.EmaIO(gen, root / f"gen-{gen}/train/snapshots", window,
                         root / f"gen-{gen}/ema", previous)  # fmt: skip

    first = ema.run(_params(bn_batches=0), io(0))
    assert first == {"generation": 0, "net": "b2c16", "snapshots": 4, "continued": False,
                     "bn_batches": 0}  # fmt: skip
    snaps = [
        load(root / f"gen-0/train/snapshots/snap-{k}.pt")[0].state_dict() for k in (1, 2, 3, 4)
    ]
    candidate, meta = load(root / "gen-0/ema/candidate.pt")
    expected = ema.average(None, snaps, 0.75)
    for name, value in candidate.state_dict().items():
        assert torch.allclose(value, expected[name]), name
    assert meta["generation"] == 0 and meta["model_id"] == "gen-0-b2c16"
    # Generation 1 starts from generation 0's average.
    second = ema.run(_params(bn_batches=0), io(1, root / "gen-0/ema"))
    assert second["continued"]
    snaps1 = [
        load(root / f"gen-1/train/snapshots/snap-{k}.pt")[0].state_dict() for k in (1, 2, 3, 4)
    ]
    expected1 = ema.average(expected, snaps1, 0.75)
    got = load(root / "gen-1/ema/candidate.pt")[0].state_dict()
    key = next(k for k in got if got[k].is_floating_point() and "running" not in k)
    assert torch.allclose(got[key], expected1[key])
    with pytest.raises(train.InputError, match="run the ema stage of the previous generation"):
        ema.run(_params(), io(1, root / "gen-7/ema"))
    with pytest.raises(train.InputError, match="run the train stage first"):
        ema.run(_params(), ema.EmaIO(0, root / "none", window, root / "x"))


def test_batch_norm_statistics_are_those_of_the_averaged_net(trained):
    """After the update, each norm's running mean is the mean of its inputs' per-batch means
    over the batches used (equal weights), measured on the averaged weights."""
    root, window = trained
    model = load(root / "gen-0/train/snapshots/snap-4.pt")[0]
    files, _ = window_files(window, "test")
    data = list(
        zip(range(3), batches(files, 16, 5, np.random.default_rng(0), "test"), strict=False)
    )
    norm = next(m for m in model.modules() if isinstance(m, MaskedBatchNorm))
    seen = []

    def hook(module, args):
        x, board = args
        seen.append(((x * board.mask).sum(dim=(0, 2, 3)) / board.count).detach())

    handle = norm.register_forward_pre_hook(hook)
    used = ema.update_batch_norm(model, iter(arrays for _, arrays in data), 3)
    handle.remove()
    assert used == 3 and len(seen) == 3
    assert torch.allclose(norm.running_mean, torch.stack(seen).mean(0), atol=1e-6)
    assert norm.momentum == 0.1  # restored


def test_a_run_folder_with_the_retired_every_is_told_what_to_do(tmp_path):
    """ema.every (decay per `every` snapshots) is gone: a params.yaml written with it is
    refused with what to write instead, not only 'extra input'."""
    import yaml

    from stages.params import ParamsError, read
    from tests.conftest import REPO

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["ema"]["every"] = 4
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(ParamsError, match=r"ema\.every: no longer a setting: delete it.*0\.9306"):
        read(tmp_path / "params.yaml", ema.Params)


@pytest.mark.parametrize("stage", ["selfplay", "shuffle", "train", "ema", "gate"])
def test_a_negative_seed_is_refused_naming_its_key(tmp_path, stage):
    """Every seed goes into numpy's SeedSequence with the generation, which takes no
    negatives: -1 is refused when params.yaml is read, not as a traceback mid-stage (a
    hypothesis example found ema.seed: -1 failing so)."""
    import importlib

    import yaml

    from stages.params import ParamsError, read
    from tests.conftest import REPO

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params[stage]["seed"] = -1
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(ParamsError, match=rf"{stage}\.seed: .*greater than or equal to 0"):
        read(tmp_path / "params.yaml", importlib.import_module(f"stages.{stage}").Params)
