"""The networks: shapes, board masks, gradients, each loss term, learning a fixed batch,
checkpoints (round trip, refusals, export), the evaluator and its symmetries."""

from __future__ import annotations

import dataclasses
import fractions
import json

import numpy as np
import pytest
import torch

from nets import checkpoint
from nets.config import SIZES, NetConfig, net_config
from nets.evaluator import (
    COMPILE_MODES,
    MIN_COMPILED_ROWS,
    Evaluator,
    bucket,
    transform,
    untransform,
)
from nets.losses import LossWeights, loss_terms
from nets.model import GoNet, score_values
from tests.conftest import loss_weights, run_cli

WEIGHTS = loss_weights()

SMALL = ["b2c16", "mobile-b4c32"]

# These nets are tiny: one thread is fastest, and several threads spin-waiting on a busy 2-core
# machine made a training step 60 times slower.
torch.set_num_threads(1)


def inputs(batch: int, tensor: int, board: int | None = None, seed: int = 0):
    """Random binary planes on a board x board board in the top-left of the tensor."""
    board = tensor if board is None else board
    g = torch.Generator().manual_seed(seed)
    planes = torch.zeros(batch, 18, tensor, tensor)
    planes[:, 1:, :board, :board] = (torch.rand(batch, 17, board, board, generator=g) < 0.2).float()
    planes[:, 0, :board, :board] = 1.0
    glob = torch.rand(batch, 10, generator=g)
    return planes, glob


def targets(batch: int, tensor: int, board: int | None = None, seed: int = 1):
    board = tensor if board is None else board
    g = torch.Generator().manual_seed(seed)
    on_board = torch.zeros(tensor, tensor)
    on_board[:board, :board] = 1
    legal = torch.cat([on_board.flatten(), torch.ones(1)])
    policy = torch.rand(batch, tensor * tensor + 1, generator=g) * legal
    moves = torch.nonzero(legal).flatten()
    return {
        "policy_target": policy / policy.sum(dim=1, keepdim=True),
        "policy_weight": torch.ones(batch),
        "opponent_move": moves[torch.randint(0, len(moves), (batch,), generator=g)],
        "outcome": torch.eye(3)[torch.randint(0, 2, (batch,), generator=g)],
        "final_score": torch.randint(-20, 20, (batch,), generator=g).float() + 0.5,
        "ownership": torch.randint(-1, 2, (batch, tensor, tensor), generator=g).float() * on_board,
        "value_weight": torch.ones(batch),
    }


@pytest.mark.parametrize("name", list(SIZES))
def test_output_shapes_for_every_size_and_board(name):
    model = GoNet(SIZES[name]).eval()
    for tensor, board in [(19, 19), (9, 9), (19, 7)]:
        planes, glob = inputs(2, tensor, board)
        with torch.no_grad():
            out = model(planes, glob)
        t = tensor * tensor
        bins = 4 * (t + 40) + 1  # every score of a board that fits, 40 points to spare
        assert out["policy"].shape == (2, t + 1) and out["opponent_policy"].shape == (2, t + 1)
        assert out["outcome"].shape == (2, 3) and out["score_belief"].shape == (2, bins)
        assert out["score_mean"].shape == (2,) and (out["score_stdev"] > 0).all()
        assert out["ownership"].shape == (2, tensor, tensor)
        assert out["ownership"].abs().max() <= 1
        # Off the board: no policy mass and no ownership.
        off = planes[:, 0].flatten(1) == 0
        assert (out["policy"][:, :-1][off] < -1000).all()
        assert (out["ownership"][planes[:, 0] == 0] == 0).all()


@pytest.mark.parametrize("name", SMALL)
@pytest.mark.parametrize("training", [False, True])
def test_a_small_board_in_a_large_tensor_gives_the_same_outputs(name, training):
    """The 9x9 tensor takes the full-board path (no masks, torch's batch norm), the 19x19 one
    the masked path: the same outputs, and in training the same running statistics."""
    torch.manual_seed(0)
    model = GoNet(SIZES[name])
    twin = GoNet(SIZES[name])
    twin.load_state_dict(model.state_dict())
    model.train(training)
    twin.train(training)
    small_planes, glob = inputs(3, 9)
    large_planes = torch.zeros(3, 18, 19, 19)
    large_planes[:, :, :9, :9] = small_planes
    with torch.no_grad():
        small = model(small_planes, glob)
        large = twin(large_planes, glob)
    close = {"rtol": 1e-4, "atol": 1e-4}
    board_policy = large["policy"][:, :-1].reshape(3, 19, 19)[:, :9, :9].reshape(3, 81)
    assert torch.allclose(small["policy"][:, :-1], board_policy, **close)
    assert torch.allclose(small["policy"][:, -1], large["policy"][:, -1], **close)
    assert torch.allclose(small["ownership"], large["ownership"][:, :9, :9], **close)
    for key in ("outcome", "score_mean", "score_stdev"):
        assert torch.allclose(small[key], large[key], **close), key
    # The 9x9 tensor's score bins are the middle of the 19x19 one's: -121..121 of -401..401.
    assert small["score_belief"].shape[1] == 4 * 121 + 1
    cut = 2 * (401 - 121)
    assert torch.allclose(small["score_belief"], large["score_belief"][:, cut:-cut], **close)
    for (key, a), b in zip(model.state_dict().items(), twin.state_dict().values(), strict=True):
        assert torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-5), key


@pytest.mark.parametrize("name", SMALL)
def test_the_gradient_reaches_every_parameter(name):
    torch.manual_seed(0)
    model = GoNet(SIZES[name]).train()
    planes, glob = inputs(4, 7)
    loss = loss_terms(model(planes, glob), targets(4, 7), planes[:, 0], model, weights=WEIGHTS)[
        "total"
    ]
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()]
    assert not missing


def _perfect_outputs(target: dict, tensor: int) -> dict:
    """Outputs that predict `target` as well as outputs can."""
    values = score_values(SIZES["b2c16"])
    score_bin = ((target["final_score"] - values[0]) * 2).long()
    belief = torch.full((len(target["final_score"]), len(values)), -1e4)
    belief[torch.arange(len(score_bin)), score_bin] = 0.0
    reply = torch.full_like(target["policy_target"], -1e4)
    reply[torch.arange(len(reply)), target["opponent_move"]] = 0.0
    return {
        "policy": torch.log(target["policy_target"].clamp(min=1e-30)),
        "opponent_policy": reply,
        "outcome": torch.log(target["outcome"].clamp(min=1e-30)),
        "ownership": target["ownership"],
        "score_belief": belief,
        "score_mean": target["final_score"].clone(),
        "score_stdev": torch.zeros_like(target["final_score"]),
    }


def test_each_loss_term_is_zero_or_minimal_on_a_perfect_prediction():
    tensor = 7
    target = targets(5, tensor)
    mask = torch.ones(5, tensor, tensor)
    perfect = loss_terms(_perfect_outputs(target, tensor), target, mask, weights=WEIGHTS)
    entropy = (
        -(target["policy_target"] * torch.log(target["policy_target"].clamp(min=1e-30)))
        .sum(1)
        .mean()
    )
    assert perfect["policy"].item() == pytest.approx(entropy.item(), rel=1e-5)
    for term in ("opponent_policy", "outcome", "ownership", "score_pdf", "score_cdf"):
        assert perfect[term].item() == pytest.approx(0.0, abs=1e-4), term
    assert perfect["score_mean"].item() == pytest.approx(0.0, abs=1e-4)
    assert perfect["score_stdev"].item() == pytest.approx(0.0, abs=1e-4)
    # Any disturbance costs: each term rises when its output moves away from the target.
    for key, change in [
        ("policy", lambda x: x.flip(1)),
        ("opponent_policy", lambda x: x.roll(1, dims=1)),
        ("outcome", lambda x: x.roll(1, dims=1)),
        ("ownership", lambda x: -x),
        ("score_belief", lambda x: x.roll(7, dims=1)),
        ("score_mean", lambda x: x + 5),
        ("score_stdev", lambda x: x + 5),
    ]:
        disturbed = dict(_perfect_outputs(target, tensor))
        disturbed[key] = change(disturbed[key])
        worse = loss_terms(disturbed, target, mask, weights=WEIGHTS)
        assert worse["total"] > perfect["total"], key


def _row_weight_case(column: str):
    """An untrained net's loss on 4 rows, all weights 1 and with `column` = [1, 0, 1, 0]."""
    torch.manual_seed(0)
    model = GoNet(SIZES["b2c16"]).eval()
    planes, glob = inputs(4, 7)
    target = targets(4, 7)
    with torch.no_grad():
        out = model(planes, glob)
    full = loss_terms(out, target, planes[:, 0], weights=WEIGHTS)
    target[column] = torch.tensor([1.0, 0.0, 1.0, 0.0])
    return full, loss_terms(out, target, planes[:, 0], weights=WEIGHTS), (out, target, planes[:, 0])


def test_a_policy_weight_of_zero_removes_only_the_policy_terms():
    full, cheap, _ = _row_weight_case("policy_weight")
    assert cheap["policy"] < full["policy"] and cheap["opponent_policy"] < full["opponent_policy"]
    for term in ("outcome", "ownership", "score_pdf", "score_cdf", "score_mean"):
        assert cheap[term] == full[term], term


def test_a_score_weight_of_zero_removes_only_the_score_and_ownership_terms():
    """A side position's row: outcome from its search, final score and ownership unknown."""
    full, side, (out, target, mask) = _row_weight_case("score_weight")
    for term in ("ownership", "score_pdf", "score_cdf"):
        assert side[term] < full[term], term
    for term in ("policy", "opponent_policy", "outcome", "score_mean", "score_stdev"):
        assert side[term] == full[term], term
    target["score_weight"] = torch.ones(4)
    assert loss_terms(out, target, mask, weights=WEIGHTS)["total"] == full["total"]


@pytest.mark.slow
def test_training_on_a_fixed_batch_lowers_the_loss():
    torch.manual_seed(0)
    model = GoNet(SIZES["b2c16"]).train()
    planes, glob = inputs(16, 7)
    target = targets(16, 7)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    losses = []
    for _ in range(300):
        terms = loss_terms(model(planes, glob), target, planes[:, 0], model, weights=WEIGHTS)
        optimizer.zero_grad()
        terms["total"].backward()
        optimizer.step()
        losses.append(terms["total"].item())
    assert np.mean(losses[-20:]) < 0.6 * np.mean(losses[:5])


def test_loss_weights_from_params():
    from stages.params import LossParams, ParamsError, validate

    given = dict(dataclasses.asdict(WEIGHTS), policy=1, ownership=0.5)
    weights = validate(LossParams, given, source="p.yaml", prefix="loss").weights()
    assert weights.ownership == 0.5 and weights.opponent_policy == WEIGHTS.opponent_policy
    with pytest.raises(ParamsError, match=r"p.yaml: loss.polcy: Extra inputs are not permitted"):
        validate(LossParams, {**given, "polcy": 1.0}, source="p.yaml", prefix="loss")
    with pytest.raises(ParamsError, match=r"loss.l2: Input should be greater than or equal to 0"):
        validate(LossParams, {**given, "l2": -1}, source="p.yaml", prefix="loss")
    with pytest.raises(ParamsError, match=r"loss: Input should be a valid dictionary"):
        validate(LossParams, 5, source="p.yaml", prefix="loss")


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SMALL)
def test_checkpoint_round_trip_is_bit_exact(tmp_path, name):
    torch.manual_seed(3)
    model = GoNet(SIZES[name])
    # Move the batch-norm statistics off their defaults.
    model.train()
    model(*inputs(4, 9))
    model.eval()
    path = checkpoint.save(model, tmp_path / "net.pt", meta={"generation": 3})
    loaded, meta = checkpoint.load(path, expect=SIZES[name])
    assert meta == {"generation": 3}
    for (k1, v1), (k2, v2) in zip(
        model.state_dict().items(), loaded.state_dict().items(), strict=True
    ):
        assert k1 == k2 and torch.equal(v1, v2), k1
    planes, glob = inputs(2, 9, seed=5)
    with torch.no_grad():
        a, b = model(planes, glob), loaded(planes, glob)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_malformed_checkpoints_are_refused(tmp_path):
    model = GoNet(SIZES["b2c16"])
    good = checkpoint.save(model, tmp_path / "good.pt")
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[:200])
    with pytest.raises(checkpoint.CheckpointError, match="truncated.pt cannot be read"):
        checkpoint.load(truncated)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint at all")
    with pytest.raises(checkpoint.CheckpointError, match="cannot be read"):
        checkpoint.load(garbage)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(3)}, foreign)
    with pytest.raises(checkpoint.CheckpointError, match="is not a tengen-net-1 file"):
        checkpoint.load(foreign)
    with pytest.raises(checkpoint.CheckpointError, match="holds net b2c16, not b4c32"):
        checkpoint.load(good, expect=SIZES["b4c32"])
    with pytest.raises(checkpoint.CheckpointError, match="does not exist"):
        checkpoint.load(tmp_path / "missing.pt")
    # A file that would run code when unpickled is refused (weights_only=True).
    evil = tmp_path / "evil.pt"
    torch.save({"format": "tengen-net-1", "payload": fractions.Fraction(1, 3)}, evil)
    with pytest.raises(checkpoint.CheckpointError, match="cannot be read"):
        checkpoint.load(evil)
    # Weights that do not fit the config.
    bad = torch.load(good, weights_only=True)
    bad["state_dict"].pop("stem.weight")
    torch.save(bad, tmp_path / "bad.pt")
    with pytest.raises(checkpoint.CheckpointError, match="weights do not fit b2c16"):
        checkpoint.load(tmp_path / "bad.pt")


def test_export_to_torchscript_and_onnx(tmp_path):
    torch.manual_seed(0)
    model = GoNet(SIZES["b2c16"]).eval()
    planes, glob = inputs(3, 9)
    with torch.no_grad():
        expected = model(planes, glob)
    scripted = torch.jit.load(str(checkpoint.export_torchscript(model, tmp_path / "net.ts", 9)))
    with torch.no_grad():
        got = scripted(planes, glob)
    for name, value in zip(checkpoint._Exported.OUTPUTS, got, strict=True):
        assert torch.allclose(expected[name], value, atol=1e-5), name
    # Traced on full boards, the export still masks a smaller board in its tensor.
    planes, glob = inputs(3, 9, 7)
    with torch.no_grad():
        expected, got = model(planes, glob), scripted(planes, glob)
    for name, value in zip(checkpoint._Exported.OUTPUTS, got, strict=True):
        assert torch.allclose(expected[name], value, atol=1e-5), name
    onnx = pytest.importorskip("onnx")
    path = checkpoint.export_onnx(model, tmp_path / "net.onnx", 9)
    graph = onnx.load(str(path))
    onnx.checker.check_model(graph)
    assert [i.name for i in graph.graph.input] == ["planes", "globals"]


def test_net_config_names_and_dicts():
    assert net_config("b6c96").channels == 96
    with pytest.raises(ValueError, match="unknown net 'b7c7'"):
        net_config("b7c7")
    config = SIZES["b10c128"]
    assert NetConfig.from_dict(config.as_dict()) == config
    with pytest.raises(ValueError, match="unknown net config keys"):
        NetConfig.from_dict({**config.as_dict(), "dropout": 0.1})


def test_the_ablation_switches_of_a_net(tmp_path):
    from gocore import features as F
    from nets.config import GO_FEATURE_PLANES
    from nets.model import GlobalPoolBlock

    # nets does not import gocore: its list of Go-specific planes is checked against gocore's.
    assert GO_FEATURE_PLANES == (
        F.LIBERTIES_1, F.LIBERTIES_2, F.LIBERTIES_3, F.LADDERED, F.LADDERED + 1, F.LADDERED + 2,
        F.LADDER_CATCH, F.OWN_PASS_ALIVE, F.OPPONENT_PASS_ALIVE,
    )  # fmt: skip
    plain = GoNet(net_config("b4c32", global_pooling=False))
    assert not any(isinstance(m, GlobalPoolBlock) for m in plain.modules())
    assert sum(isinstance(m, GlobalPoolBlock) for m in GoNet(net_config("b4c32")).modules()) == 2
    torch.manual_seed(0)
    blind = GoNet(net_config("b2c16", go_features=False)).eval()
    planes, glob = inputs(4, 7)
    with torch.no_grad():
        out = blind(planes, glob)["policy"]
        changed = planes.clone()
        changed[:, list(GO_FEATURE_PLANES)] = 1.0 - changed[:, list(GO_FEATURE_PLANES)]
        assert torch.equal(blind(changed, glob)["policy"], out)  # blind to those planes
        stones = planes.clone()
        stones[:, F.OWN] = 1.0 - stones[:, F.OWN]
        assert not torch.allclose(blind(stones, glob)["policy"], out)  # not to the stones
    # The switch travels in the checkpoint: a loaded net is as blind.
    checkpoint.save(blind, tmp_path / "blind.pt")
    loaded, _ = checkpoint.load(tmp_path / "blind.pt")
    assert loaded.config.go_features is False and loaded.config == blind.config
    with torch.no_grad():
        assert torch.equal(loaded(changed, glob)["policy"], out)


# ---------------------------------------------------------------------------------------------
# The evaluator
# ---------------------------------------------------------------------------------------------


def test_transform_and_untransform_are_inverse():
    x = torch.arange(2 * 5 * 5).reshape(2, 5, 5)
    images = {tuple(transform(x, s).flatten().tolist()) for s in range(8)}
    assert len(images) == 8
    for s in range(8):
        assert torch.equal(untransform(transform(x, s), s), x)


def test_evaluator_masks_illegal_moves_and_maps_symmetries_back():
    torch.manual_seed(0)
    model = GoNet(SIZES["b2c16"]).eval()
    evaluate = Evaluator(model)
    planes, glob = inputs(8, 7)
    legal = np.ones((8, 50), np.bool_)
    legal[:, 10:20] = False
    out = evaluate(planes.numpy(), glob.numpy(), legal=legal, symmetry=np.arange(8))
    assert isinstance(out["policy"], np.ndarray)
    assert np.allclose(out["policy"].sum(1), 1) and (out["policy"][:, 10:20] == 0).all()
    assert np.allclose(out["value"].sum(1), 1)
    # Evaluating a transformed board without a symmetry, then mapping back, is what the
    # evaluator does with that symmetry.
    for s in range(8):
        moved = transform(planes, s)
        plain = evaluate(moved, glob, symmetry=0)
        board = plain["policy"][:, :-1].reshape(8, 7, 7)
        with_sym = evaluate(planes, glob, symmetry=s)
        assert torch.allclose(untransform(board, s).reshape(8, 49), with_sym["policy"][:, :-1])
        assert torch.allclose(untransform(plain["ownership"], s), with_sym["ownership"])
    random = evaluate(planes, glob, symmetry="random", rng=np.random.default_rng(1))
    assert random["policy"].shape == (8, 50)


def test_each_row_takes_its_own_symmetry():
    """A batch of mixed symmetries gives each row what a batch of that row alone, under its
    symmetry, gives: the rows' cells are gathered, and their outputs scattered back, row by
    row. On a 9x9 board filling its tensor and a 5x5 one in the corner of a 7x7 tensor."""
    torch.manual_seed(0)
    evaluate = Evaluator(GoNet(SIZES["b2c16"]))
    for tensor, board in ((9, 9), (7, 5)):
        planes, glob = inputs(16, tensor, board)
        syms = np.array([3, 0, 7, 1, 5, 2, 6, 4] * 2)
        mixed = evaluate(planes, glob, symmetry=syms)
        for row, s in enumerate(syms):
            alone = evaluate(planes[row : row + 1], glob[row : row + 1], symmetry=int(s))
            for key, value in alone.items():
                assert torch.allclose(mixed[key][row], value[0], atol=1e-6), (tensor, row, key)


def test_bucket_pads_a_batch_by_at_most_an_eighth_to_few_sizes():
    sizes = {b: bucket(b) for b in range(1, 20_000)}
    assert all(sizes[b] == b for b in range(1, 9))
    assert all(b <= s <= b + b // 8 for b, s in sizes.items())
    assert all(bucket(s) == s for s in sizes.values())
    for k in range(3, 14):  # 8 sizes an octave: above 2^k, up to 2^(k + 1)
        assert len({sizes[b] for b in range(2**k + 1, 2 ** (k + 1) + 1)}) == 8
    assert bucket(96) == 96 and bucket(97) == 104 and bucket(65_000) == 65_536


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_a_compiled_net_gives_the_eager_nets_outputs(mode):
    """torch.compile's net: the eager net's outputs to float rounding, for boards that fill
    the tensor and boards that do not, under mixed symmetries, at every batch size through
    one compiled graph (batches under 16 rows padded). With reduce-overhead, batches padded
    to `bucket` sizes as they are on a GPU (CUDA graphs)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # no graph compiled by an earlier test is reused
    torch.manual_seed(0)
    model = GoNet(SIZES["b2c16"]).eval()
    eager = Evaluator(model)
    compiled = Evaluator(GoNet(SIZES["b2c16"]), compile=mode)
    compiled.model.load_state_dict(model.state_dict())
    compiled.cuda_graphs = mode == "reduce-overhead"  # as on a GPU: bucket sizes, copied outputs
    graphs = counters["stats"]["unique_graphs"]
    rng = np.random.default_rng(0)
    for batch, board in ((37, 9), (MIN_COMPILED_ROWS - 1, 7), (1, 9), (97, 5), (16, 9)):
        planes, glob = inputs(batch, 9, board, seed=batch)
        legal = np.ones((batch, 82), np.bool_)
        legal[:, rng.integers(0, 81, 5)] = False
        syms = rng.integers(0, 8, batch)
        want = eager(planes.numpy(), glob.numpy(), legal=legal, symmetry=syms)
        got = compiled(planes.numpy(), glob.numpy(), legal=legal, symmetry=syms)
        for key in want:
            assert got[key].shape == want[key].shape, key
            assert np.allclose(got[key], want[key], atol=1e-5), (batch, board, key)
    assert compiled.compiled  # compiled, not fallen back to eager
    assert counters["stats"]["unique_graphs"] == graphs + 1


@pytest.mark.slow
def test_a_net_that_cannot_compile_runs_eager_and_says_why(caplog):
    """No working C++ compiler (a laptop without one): the first call warns, naming the
    reason, and the net runs as it would uncompiled."""
    import torch._inductor.config as inductor

    torch._dynamo.reset()  # no graph compiled by an earlier test is reused
    torch.manual_seed(0)
    model = GoNet(SIZES["b2c16"]).eval()
    planes, glob = inputs(20, 9)
    want = Evaluator(model)(planes, glob, symmetry=2)
    compiled = Evaluator(model, compile="default")
    broken = {"cpp.cxx": ("no-such-c++-compiler",), "fx_graph_cache": False}
    with inductor.patch(broken), caplog.at_level("WARNING", logger="nets.evaluator"):
        got = compiled(planes, glob, symmetry=2)
    assert not compiled.compiled
    assert "torch.compile (default) failed, so the net runs uncompiled" in caplog.text
    assert "no-such-c++-compiler" in caplog.text
    for key in want:
        assert torch.equal(got[key], want[key]), key


def test_evaluator_refuses_half_precision_on_the_cpu():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        Evaluator(GoNet(SIZES["b2c16"]), dtype="bfloat16")
    with pytest.raises(ValueError, match="compile must be one of none, default, "):
        Evaluator(GoNet(SIZES["b2c16"]), compile="fast")
    # params.yaml's selfplay.compile and gate.compile take the evaluator's modes.
    from typing import get_args

    from stages.params import NetCompile

    assert get_args(NetCompile) == COMPILE_MODES


# ---------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------


def test_nets_describe_lists_every_size():
    result = run_cli("nets", "describe", "--json")
    assert result.returncode == 0, result.stderr
    rows = {r["net"]: r for r in json.loads(result.stdout)}
    assert set(rows) == set(SIZES)
    assert rows["b6c96"]["parameters"] == sum(p.numel() for p in GoNet(SIZES["b6c96"]).parameters())
    assert rows["b20c256"]["parameters"] > rows["b15c192"]["parameters"] > 1_000_000


@pytest.mark.slow
def test_bench_nets_json_shape():
    result = run_cli(
        "bench",
        "nets",
        "--json",
        "--nets",
        "b2c16,mobile-b4c32",
        "--sizes",
        "5",
        "--batches",
        "2",
        "--seconds",
        "0.01",
    )
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [r["net"] for r in rows] == ["b2c16", "mobile-b4c32"]
    for r in rows:
        assert {
            "net",
            "board",
            "batch",
            "device",
            "evals_per_s",
            "train_samples_per_s",
            "gflop_per_eval",
        } <= set(r)
        assert r["evals_per_s"] > 0 and r["train_samples_per_s"] > 0 and r["gflop_per_eval"] > 0
    bad = run_cli("bench", "nets", "--nets", "b9c9")
    assert bad.returncode != 0 and "unknown nets ['b9c9']" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_params_yaml_loss_section_gives_the_paper_weights():
    import yaml

    from tests.conftest import REPO

    section = yaml.safe_load((REPO / "params.yaml").read_text())["loss"]
    # Appendix B of the paper (ownership divided by the area, summed over the points).
    paper = LossWeights(policy=1.0, opponent_policy=0.15, outcome=1.5, ownership=1.5,
                        score_pdf=0.02, score_cdf=0.02, score_mean=0.004, score_stdev=0.004,
                        l2=3e-5)  # fmt: skip
    assert paper == WEIGHTS
    assert set(section) == {f.name for f in dataclasses.fields(LossWeights)}


def test_gocore_features_into_the_evaluator_and_back_to_points():
    """The path self-play will take: gocore encodes (under symmetries) and masks, the net
    evaluates, gocore maps the policy back to board points."""
    from gocore import board as gb
    from gocore import features as gf

    b = gb.new_boards(4, [9, 7, 9, 5], max_moves=80)
    pick = np.random.default_rng(0)
    for _ in range(12):
        legal = gb.legal_all(b)
        legal[:, gb.PASS] = False
        gb.play_all(b, np.array([pick.choice(np.flatnonzero(row)) for row in legal]))
    symmetry = np.array([0, 1, 5, 7])
    planes = np.zeros((4, gf.N_PLANES, 9, 9), np.float32)
    glob = np.zeros((4, gf.N_GLOBALS), np.float32)
    gf.encode_all(b, gf.new_work(b), planes, glob, symmetry)
    mask = gf.legal_tensor_all(b, 9, symmetry)
    out = Evaluator(GoNet(SIZES["b2c16"]))(planes, glob, legal=mask)
    points = gf.policy_all(b, out["policy"], symmetry)
    legal = gb.legal_all(b)
    assert np.allclose(points.sum(axis=1), 1.0, atol=1e-5)
    assert (points[~legal] == 0).all() and (points[legal] > 0).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_half_precision_on_the_gpu_agrees_with_float32():
    torch.manual_seed(0)
    model = GoNet(SIZES["b6c96"]).eval()
    planes, glob = inputs(16, 19)
    full = Evaluator(model, device="cuda")(planes.cuda(), glob.cuda())
    for dtype in ("bfloat16", "float16"):
        half = Evaluator(model, device="cuda", dtype=dtype)(planes.cuda(), glob.cuda())
        assert torch.allclose(full["policy"], half["policy"], atol=2e-2), dtype
        assert torch.allclose(full["value"], half["value"], atol=2e-2), dtype


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_a_compiled_net_on_the_gpu_agrees_with_the_eager_net(mode):
    """On a GPU: the compiled net (with reduce-overhead, CUDA graphs recorded for bucket
    sizes) gives the eager net's outputs, over batch sizes that record more than one graph,
    and a call's outputs stay as they were after later calls (a CUDA graph writes its outputs
    over the last ones; score_mean comes out of the net as it is, so it would show that)."""
    torch.manual_seed(0)
    model = GoNet(SIZES["b6c96"]).eval()
    eager = Evaluator(model, device="cuda")
    compiled = Evaluator(GoNet(SIZES["b6c96"]), device="cuda", compile=mode)
    compiled.model.load_state_dict(model.state_dict())
    assert compiled.cuda_graphs == (mode == "reduce-overhead")
    kept = []
    for batch in (300, 37, 300, 5, 1000, 300):  # twice or more a size: recorded, then replayed
        planes, glob = inputs(batch, 9, seed=batch)
        syms = np.arange(batch) % 8
        want = eager(planes.cuda(), glob.cuda(), symmetry=syms)
        got = compiled(planes.cuda(), glob.cuda(), symmetry=syms)
        for key in ("policy", "value", "score_mean", "ownership"):
            assert torch.allclose(got[key], want[key], atol=1e-2, rtol=1e-2), (batch, key)
        kept.append((got["score_mean"].clone(), got))
    assert compiled.compiled
    for before, got in kept:
        assert torch.equal(got["score_mean"], before)
