"""The Go core's CUDA target gives exactly what the CPU gives: every entry point (reset, play,
legal moves, playouts, encoding with ladders and Benson, policy mapping, the search's select,
expand and back up, noise, targets and tree reuse) on random positions.

Under the CUDA simulator (the default in tests, see conftest) these run the CUDA code path as
Python; with TENGEN_GPU=1 on a machine with a GPU they run on the GPU, and the tests marked
`gpu` add larger batches. `test_kernels_compile_to_ptx` checks what the simulator cannot: that
every kernel is valid CUDA code (it compiles them with NVVM, no GPU needed).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gocore import board as gb
from gocore import features as F
from gocore.device import backend
from gocore.playout import new_rng
from gocore.rules import PRESETS, Rules
from tests.conftest import search_params

cuda_mod = pytest.importorskip("gocore.cuda", reason="numba-cuda is not installed")

# The simulator runs the kernels as Python over numpy scalars, whose uint64 arithmetic (the
# playouts' generator, the Zobrist keys) warns where the compiled kernels wrap by design.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

requires_gpu = pytest.mark.skipif(
    cuda_mod.simulated() or not cuda_mod.available(), reason="needs a CUDA GPU (TENGEN_GPU=1)"
)


@pytest.fixture(scope="module")
def gpu():
    if not cuda_mod.available():
        pytest.skip("no CUDA GPU and the simulator is off")
    return backend("cuda")


def _mixed_rules(games: int) -> np.ndarray:
    names = ["chinese", "tromp-taylor", "new-zealand", "japanese", "aga"]
    return np.stack([PRESETS[names[g % len(names)]].as_row() for g in range(games)])


def _play_both(gpu, games, sizes, steps, seed):
    rules = _mixed_rules(games)
    host = gb.new_boards(games, sizes, rules, max_moves=steps + 8)
    device = gpu.new_boards(games, sizes, rules, max_moves=steps + 8)
    pick = np.random.default_rng(seed)
    for _ in range(steps):
        legal = gb.legal_all(host)
        assert np.array_equal(legal, gpu.to_numpy(gpu.legal_all(device)))
        moves = np.array([pick.choice(np.flatnonzero(row)) for row in legal])
        # Now and then an illegal move, which both must refuse the same way.
        if pick.random() < 0.2:
            moves[0] = pick.integers(0, host.color.shape[1])
        status = gb.play_all(host, moves)
        assert np.array_equal(status, gpu.to_numpy(gpu.play_all(device, moves)))
    return host, device


def _assert_same_boards(host, device):
    copied = cuda_mod.to_host(device)
    for name in gb.Boards._fields:
        assert np.array_equal(getattr(host, name), getattr(copied, name)), name


def test_play_and_legal_moves_match_the_cpu(gpu):
    host, device = _play_both(gpu, 5, [5, 7, 9, 7, 6], steps=40, seed=1)
    _assert_same_boards(host, device)
    gb.reset_all(host)
    gpu.reset_all(device)
    _assert_same_boards(host, device)


def test_each_kernels_first_launch_is_timed_and_logged(gpu, caplog):
    """The first launch of an entry point (its compile, or its load from the disk cache) is
    logged before and after, with its seconds, and only the first."""
    import logging

    cuda_mod.FIRST_LAUNCH.pop("_legal_entry", None)
    device = gpu.new_boards(3, 5, Rules())
    with caplog.at_level(logging.INFO, logger="gocore.cuda"):
        gpu.legal_all(device)
        gpu.legal_all(device)
    logged = [r.getMessage() for r in caplog.records if "_legal_entry" in r.getMessage()]
    assert logged[0] == "CUDA kernel _legal_entry: first launch"
    how = "ran" if cuda_mod.simulated() else "(compiled|loaded from the disk cache)"
    # On a GPU, what its machine code takes (the simulator's kernels have none).
    code = "" if cuda_mod.simulated() else r", \d+ registers a thread, \d+ bytes of local memory"
    assert re.fullmatch(
        rf"CUDA kernel _legal_entry: {how} and launched in \d+\.\d s{code}", logged[1]
    )
    assert len(logged) == 2 and cuda_mod.FIRST_LAUNCH["_legal_entry"] >= 0


def test_playouts_match_the_cpu(gpu):
    from gocore.playout import play_out_all

    host = gb.new_boards(4, 5, Rules(), max_moves=120)
    device = gpu.new_boards(4, 5, Rules(), max_moves=120)
    rng_host = new_rng(4, 9)
    rng_device = cuda_mod.cuda.to_device(rng_host.copy())
    play_out_all(host, rng_host, True)
    gpu.play_out_all(device, rng_device, True)
    _assert_same_boards(host, device)
    assert np.array_equal(rng_host, rng_device.copy_to_host())


def test_encoding_matches_the_cpu(gpu):
    games, tensor = 5, 9
    host, device = _play_both(gpu, games, [9, 7, 9, 8, 9], steps=45, seed=2)
    symmetry = np.arange(games) % 8
    planes = np.zeros((games, F.N_PLANES, tensor, tensor), np.float32)
    glob = np.zeros((games, F.N_GLOBALS), np.float32)
    F.encode_all(host, F.new_work(host), planes, glob, symmetry)
    d_planes = gpu.zeros(planes.shape, np.float32)
    d_glob = gpu.zeros(glob.shape, np.float32)
    gpu.encode_all(device, gpu.new_work(device), d_planes, d_glob, symmetry)
    assert np.array_equal(planes, gpu.to_numpy(d_planes))
    assert np.array_equal(glob, gpu.to_numpy(d_glob))
    # The positions are not trivial: stones, liberties and history all show.
    assert planes[:, F.OWN].sum() > 0 and planes[:, F.LIBERTIES_1 : F.LIBERTIES_3 + 1].sum() > 0


def test_the_encoders_ladders_and_benson_alone_match_the_cpu(gpu):
    """The current position's ladder read and Benson's area, each a kernel of its own on the
    device (`bench features` times them apart from the encoder), give the CPU's: the laddered
    stones and catching moves of random mid-game positions, the pass-alive area of random games
    played out (each side's eyes kept, so most of the board is someone's)."""
    from gocore import playout

    games = 8
    host, device = _play_both(gpu, games, [9, 7, 9, 8, 9, 9, 7, 9], steps=45, seed=4)
    laddered, catches = F.ladders_all(host)
    d_laddered, d_catches = cuda_mod.ladders_all(device, gpu.new_work(device))
    assert np.array_equal(laddered, gpu.to_numpy(d_laddered))
    assert np.array_equal(catches, gpu.to_numpy(d_catches))
    assert laddered.sum() > 0 and catches.sum() > 0
    ended = gb.new_boards(games, [7, 9] * (games // 2), _mixed_rules(games))
    playout.play_out_all(ended, new_rng(games, 3), True)
    area = F.pass_alive_all(ended)
    d_ended = cuda_mod.to_device(ended)
    assert np.array_equal(
        area, gpu.to_numpy(cuda_mod.pass_alive_all(d_ended, gpu.new_work(d_ended)))
    )
    assert (area & F.AREA_BLACK).any() and (area & F.AREA_WHITE).any()


def test_a_shared_memo_of_ladders_matches_the_cpu(gpu, monkeypatch):
    """Rows in groups of 2 sharing a memo (the `remember` kernel, a thread a group, then the
    encoder, a thread a row, the rows launched in encode_order), encoded move after move as
    their games go on: the CPU's planes (a fresh work space's) and expected work, and ladders
    of the past read exactly where the position was not encoded or read before (the rows'
    games are all different, and none passes)."""
    games, tensor = 6, 9
    host, device = _play_both(gpu, games, [9, 9, 7, 7, 9, 9], steps=20, seed=8)
    work, d_work = F.new_work(host, share=2), gpu.new_work(device, share=2)
    symmetry = np.arange(games) % 8
    pick = np.random.default_rng(1)
    encoded = []  # which rows each call encoded
    orders = []  # the rows the encoder's threads took, thread by thread
    launched = []
    launch = cuda_mod._launch

    def spy(entry, games, *args):
        if entry is cuda_mod.ENTRIES["encode"]:
            launched.append(gpu.to_numpy(args[2]))
        launch(entry, games, *args)

    monkeypatch.setattr(cuda_mod, "_launch", spy)
    for _ in range(8):  # room for 8 more moves (_play_both's max_moves)
        planes = np.zeros((games, F.N_PLANES, tensor, tensor), np.float32)
        glob = np.zeros((games, F.N_GLOBALS), np.float32)
        which = pick.random(games) < 0.8
        encoded.append(which)
        F.encode_some(host, work, which, planes, glob, symmetry)
        d_planes = gpu.zeros(planes.shape, np.float32)
        gpu.encode_some(device, d_work, which, d_planes, gpu.zeros(glob.shape, np.float32),
                        symmetry)  # fmt: skip
        assert np.array_equal(planes[which], gpu.to_numpy(d_planes)[which])
        assert np.array_equal(work.past_reads, gpu.to_numpy(d_work.past_reads))
        assert np.array_equal(work.row_work[which], gpu.to_numpy(d_work.row_work)[which])
        # The encoder's threads took the marked rows, the most work expected first.
        [rows] = launched
        launched.clear()
        assert rows.tolist() == F.encode_order(which, work.row_work).tolist()
        orders.append(rows)
        fresh = np.zeros(planes.shape, np.float32)
        F.encode_some(host, F.new_work(host), which, fresh, glob, symmetry)
        assert np.array_equal(planes[which], fresh[which])
        legal = gb.legal_all(host)
        legal[:, gb.PASS] = False  # a pass keeps the stones: the memo would answer for them
        moves = np.array([pick.choice(np.flatnonzero(row)) for row in legal])
        gb.play_all(host, moves)
        gpu.play_all(device, moves)
    # A row reads a position of its game 1 or 2 turns ago unless it has read it, or encoded it
    # as the current one, before.
    reads = np.zeros(games, np.int64)
    for g in range(games):
        known = set()
        for t, which in enumerate(encoded):
            if which[g]:
                reads[g] += len({t - 2, t - 1} - known)
                known |= {t - 2, t - 1, t}
    assert np.array_equal(work.past_reads, reads)
    assert 0 < reads.sum() < sum(2 * which.sum() for which in encoded) / 3
    # The device encoded its rows out of row order (the most work expected first).
    assert any((np.diff(order) < 0).any() for order in orders)


def test_ladders_and_pass_alive_area_match_the_cpu(gpu):
    from tests.conftest import game_from_diagram
    from tests.test_features import LADDERS

    diagrams = [case[1] for case in LADDERS if case[0].startswith(("runs", "two_liberties_at"))]
    diagrams.append(
        ". X . X O . . . .\nX X X X O . . . .\nO O O O O . . . .\n"
        + "\n".join([" ".join("." * 9)] * 6)
    )
    for diagram in diagrams:
        game = game_from_diagram(diagram)
        planes = np.zeros((1, F.N_PLANES, 9, 9), np.float32)
        glob = np.zeros((1, F.N_GLOBALS), np.float32)
        F.encode_all(game.b, F.new_work(game.b), planes, glob)
        device = cuda_mod.to_device(game.b)
        d_planes = gpu.zeros(planes.shape, np.float32)
        d_glob = gpu.zeros(glob.shape, np.float32)
        gpu.encode_all(device, gpu.new_work(device), d_planes, d_glob)
        got = gpu.to_numpy(d_planes)
        assert np.array_equal(planes, got)
        assert got[0, F.LADDERED].any() or got[0, F.OWN_PASS_ALIVE].any()


def test_policy_mapping_matches_the_cpu(gpu):
    host, device = _play_both(gpu, 3, 7, steps=10, seed=3)
    policy = np.random.default_rng(0).random((3, 7 * 7 + 1)).astype(np.float32)
    symmetry = np.array([0, 5, 7])
    expected = F.policy_all(host, policy, symmetry)
    got = gpu.to_numpy(gpu.policy_all(device, cuda_mod.cuda.to_device(policy), symmetry))
    assert np.array_equal(expected, got)


def test_policy_mask_matches_the_cpu(gpu):
    host, device = _play_both(gpu, 4, [7, 9, 9, 5], steps=15, seed=5)
    symmetry = np.array([0, 3, 6, 7])
    expected = F.legal_tensor_all(host, 9, symmetry)
    assert np.array_equal(expected, gpu.to_numpy(gpu.legal_tensor_all(device, 9, symmetry)))


def test_device_buffers_are_refused_as_numpy(gpu):
    device = gpu.new_boards(1, 5)
    with pytest.raises(TypeError, match="pass a device array"):
        gpu.encode_all(
            device,
            gpu.new_work(device),
            np.zeros((1, 18, 5, 5), np.float32),
            np.zeros((1, 10), np.float32),
        )


def test_mirror_sends_only_the_rows_of_the_games_marked(gpu):
    """`mirror(host, device, which)`: the marked games' rows of every array of the batch cross
    (pinned staging, one scatter a field) and the others stay as the device had them; with most
    games marked, everything crosses; with none, nothing."""
    import gc

    host, _ = _play_both(gpu, 6, 5, steps=4, seed=2)
    device = cuda_mod.mirror(host)
    stale = cuda_mod.to_host(device)
    pick = np.random.default_rng(4)
    for _ in range(3):  # the host's games go on; the device's copy does not follow
        legal = gb.legal_all(host)
        gb.play_all(host, np.array([pick.choice(np.flatnonzero(row)) for row in legal]))

    def copied():
        return {name: getattr(cuda_mod.to_host(device), name) for name in gb.Boards._fields}

    assert gpu.mirror(host, device, np.zeros(6, np.bool_)) is device
    for name, value in copied().items():
        assert np.array_equal(value, getattr(stale, name)), name
    which = np.array([True, False, False, True, False, True])  # half: row by row
    cuda_mod.mirror(host, device, which)
    arrays = 0
    for name, value in copied().items():
        if isinstance(value, np.ndarray):
            arrays += 1
            assert np.array_equal(value[which], getattr(host, name)[which]), name
            assert np.array_equal(value[~which], getattr(stale, name)[~which]), name
    assert arrays == len(gb.Boards._fields) - 1  # all but the stride
    assert not np.array_equal(stale.color[which], host.color[which])  # rows did change
    # The same device arrays take a second partial upload (their staging is kept)...
    cuda_mod.mirror(host, device, ~which)
    _assert_same_boards(host, device)
    # ... and give it back when they go.
    staged = len(cuda_mod._staging)
    del device
    gc.collect()
    assert len(cuda_mod._staging) == staged - arrays
    # Most games marked: the whole arrays cross, the unmarked rows with them.
    device = cuda_mod.mirror(stale)
    cuda_mod.mirror(host, device, np.array([True] * 4 + [False] * 2))
    _assert_same_boards(host, device)


@pytest.mark.parametrize("where", ["numpy", "device"])
def test_put_rows_writes_the_rows_where_the_array_is(gpu, where):
    """`put_rows(values, rows, out)`: out[rows] = values, the other rows as they were, on either
    backend; on the device from numpy or from values already there (the net's policy)."""
    values = np.arange(24, dtype=np.float32).reshape(2, 3, 4) + 1
    rows = np.array([3, 1])
    expected = np.full((5, 3, 4), -1.0, np.float32)
    expected[rows] = values
    host = np.full((5, 3, 4), -1.0, np.float32)
    backend("cpu").put_rows(values, rows, host)
    assert np.array_equal(host, expected)
    out = cuda_mod.cuda.to_device(np.full((5, 3, 4), -1.0, np.float32))
    gpu.put_rows(values if where == "numpy" else cuda_mod.cuda.to_device(values), rows, out)
    assert np.array_equal(gpu.to_numpy(out), expected)
    gpu.put_rows(values[:0], rows[:0], out)  # no rows: nothing to launch
    assert np.array_equal(gpu.to_numpy(out), expected)
    # What would write past the rows, or past the array, is refused before any launch.
    for bad_values, bad_rows, says in [
        (values, rows[:1], "for 1 rows"),
        (values[:, :2], rows, "for 2 rows"),
        (values, np.array([3, 5]), "outside 0..4"),
        (values, np.array([-1, 0]), "outside 0..4"),
    ]:
        with pytest.raises(ValueError, match=says):
            gpu.put_rows(bad_values, bad_rows, out)
    assert np.array_equal(gpu.to_numpy(out), expected)


@pytest.mark.slow
def test_selfplays_device_roots_follow_the_hosts_step_by_step(gpu, monkeypatch):
    """After every step of self-play on the device, its copy of the roots is the host's (the
    rows of the games that moved or started crossed, the others had not changed), every array
    but the flood fills' work space; side positions copied in, games ended and slots idle."""
    import dataclasses

    from gocore.selfplay import SelfPlay, UniformNet
    from tests.conftest import default_section

    config = dataclasses.replace(
        default_section("selfplay").config(), board_sizes=((5, 1.0),), full_visits=4,
        cheap_visits=2, decided_visits=2, side_position_probability=0.3,
    )  # fmt: skip
    row_by_row = []
    real = cuda_mod._mirror_array_rows
    monkeypatch.setattr(
        cuda_mod, "_mirror_array_rows", lambda *args: row_by_row.append(1) or real(*args)
    )
    sp = SelfPlay(config, UniformNet(0), games=3, slots=2, seed=5, device="cuda")
    while sp.finished < sp.games or sp.side_info or sp.active.any():
        sp.step()
        assert not sp.roots_changed.any()  # each step's select brought them over
        copied = cuda_mod.to_host(sp.device_roots)
        for name in gb.Boards._fields:
            if name not in ("stride", "scratch"):
                assert np.array_equal(getattr(copied, name), getattr(sp.roots, name)), name
    assert sp.finished == 3 and sp.sides_started > 0
    # Steps where one of the two games moved: its rows only, of each of the board's arrays.
    assert len(row_by_row) > 10 * (len(gb.Boards._fields) - 1)


def test_selfplay_on_the_device_times_remember_and_the_encoder_apart(gpu):
    """Timed by phase (bench selfplay's columns), a step on the device gives the `remember`
    kernel and the encoder each a phase of its own, the rest of the step's phases beside them."""
    import dataclasses

    from gocore.selfplay import SelfPlay, UniformNet
    from tests.conftest import default_section

    config = dataclasses.replace(
        default_section("selfplay").config(), board_sizes=((5, 1.0),), full_visits=4,
        cheap_visits=2, decided_visits=2,
    )  # fmt: skip
    sp = SelfPlay(config, UniformNet(0), games=2, slots=2, seed=5, device="cuda")
    sp.phase_seconds = {}
    for _ in range(3):
        sp.step()
    phases = {"select", "remember", "encode", "legal", "net", "leaf values", "backup"}
    assert phases <= set(sp.phase_seconds)
    assert all(sp.phase_seconds[k] > 0 for k in phases)


def test_select_keeps_its_work_arrays_on_the_device_while_the_leaves_live(gpu):
    """The select kernel's [B, A] arrays (no dead stones, the owners of a terminal leaf's
    scoring) are made on the device once for a set of leaf boards, not sent every step, and
    go with them."""
    import gc

    from tests.conftest import search_params

    roots = gpu.new_boards(3, 5)
    leaves = gpu.new_leaves(roots, 2)
    tree = gpu.new_tree(3, 8, 8 * 26, 2, roots.color.shape[1])
    params = search_params()
    before = len(cuda_mod._select_arrays)
    for _ in range(2):
        gpu.select_all(tree, roots, leaves, params, np.ones(3, np.int64))
        assert len(cuda_mod._select_arrays) == before + 1
    no_marks, _ = cuda_mod._select_arrays[id(leaves.color)]
    assert not no_marks.copy_to_host().any()
    del leaves, no_marks
    gc.collect()
    assert len(cuda_mod._select_arrays) == before


def test_backend_names():
    assert backend("cpu").name == "cpu"
    with pytest.raises(ValueError, match="device must be one of cpu, cuda"):
        backend("tpu")


@requires_gpu
@pytest.mark.gpu
def test_large_batch_on_the_gpu_matches_the_cpu(gpu):
    host, device = _play_both(gpu, 512, 19, steps=120, seed=4)
    _assert_same_boards(host, device)
    planes = np.zeros((512, F.N_PLANES, 19, 19), np.float32)
    glob = np.zeros((512, F.N_GLOBALS), np.float32)
    symmetry = np.arange(512) % 8
    F.encode_all(host, F.new_work(host), planes, glob, symmetry)
    d_planes = gpu.zeros(planes.shape, np.float32)
    d_glob = gpu.zeros(glob.shape, np.float32)
    gpu.encode_all(device, gpu.new_work(device), d_planes, d_glob, symmetry)
    assert np.array_equal(planes, gpu.to_numpy(d_planes))


@requires_gpu
@pytest.mark.gpu
def test_feature_buffer_goes_to_torch_without_a_copy(gpu):
    torch = pytest.importorskip("torch")
    device = gpu.new_boards(4, 9)
    planes = torch.zeros((4, F.N_PLANES, 9, 9), device="cuda")
    glob = torch.zeros((4, F.N_GLOBALS), device="cuda")
    gpu.encode_all(device, gpu.new_work(device), planes, glob)
    assert planes[:, F.ON_BOARD].sum().item() == 4 * 81


@requires_gpu
@pytest.mark.gpu
def test_put_rows_takes_the_nets_cuda_tensor(gpu):
    torch = pytest.importorskip("torch")
    out = gpu.zeros((4, 3), np.float32)
    values = torch.arange(1, 7, dtype=torch.float32, device="cuda").reshape(2, 3)
    gpu.put_rows(values, np.array([2, 0]), out)
    assert gpu.to_numpy(out).tolist() == [[4, 5, 6], [0, 0, 0], [1, 2, 3], [0, 0, 0]]


@pytest.mark.slow
def test_kernels_compile_to_ptx():
    """Compile every CUDA entry point to PTX with NVVM, in a process without the simulator."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        load_nvidia_dynamic_lib("nvvm")
    except Exception:  # noqa: BLE001 - any failure to find NVVM means: cannot check here
        pytest.skip("NVVM (the CUDA toolkit's compiler library) is not installed")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    result = subprocess.run(
        [sys.executable, "-m", "gocore.cuda", "--ptx"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    compiled = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert set(compiled) == set(cuda_mod.ENTRIES)
    # Constant data within the GPU's 64 KiB (a Zobrist table copied into each device function
    # that read it once took the play kernel to 67 KiB: ptxas refused it on a real GPU).
    for name, line in compiled.items():
        const = int(re.search(r"(\d+) bytes of constant data", line).group(1))
        assert const <= cuda_mod.CONST_LIMIT, (name, const)


def test_constant_data_is_counted_from_ptx():
    ptx = """
.const .align 8 .b8 _cudapy_cmem$9[13472] = {73, 178};
.const .align 4 .b32 table[10];
.visible .const .align 8 .u64 one_key;
.global .align 8 .b8 not_constant[4096];
"""
    assert cuda_mod.const_bytes(ptx) == 13472 + 40 + 8


def test_resident_warps_follow_cudas_occupancy_rules():
    """Warps of 64-thread blocks an SM holds, worked by hand from CUDA's rules: 65,536
    registers in 4 sub-partitions of 16,384, each holding whole warps, a warp's registers
    rounded up to 256; at most 64 warps and 32 blocks on sm_90, 48 warps and 16 blocks on
    sm_86."""
    cases = {
        255: 8,  # 255 x 32 = 8,160 -> 8,192 a warp: 2 warps a sub-partition
        128: 16,  # 4,096 a warp: 4
        108: 16,  # 3,456 -> 3,584: still 4 (16,384 / 3,584 = 4.6)
        96: 20,  # 3,072: 5
        76: 24,  # 2,432 -> 2,560: 6
        40: 48,  # 1,280: 12
        24: 64,  # 768: 21 a sub-partition, 84 warps, past the SM's 64 (32 blocks)
    }
    for registers, warps in cases.items():
        assert cuda_mod.resident_warps(registers) == warps, registers
    assert cuda_mod.resident_warps(24, (8, 6)) == 32  # its 16 blocks of 2 warps
    assert cuda_mod.resident_warps(255, (8, 6)) == 8
    with pytest.raises(ValueError, match="compute capability 6.1"):
        cuda_mod.resident_warps(32, (6, 1))


# nvJitLink's verbose log for one kernel (function names shortened): ptxas's lines for each
# function of the module (here the entry and one device function it calls), then the linker's.
_LINK_LOG = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_ZN6gocore4cuda13_encode_entry' for 'sm_90'
ptxas info    : Function properties for _ZN6gocore4cuda13_encode_entry
ptxas         .     32 bytes stack frame, 44 bytes spill stores, 92 bytes spill loads
ptxas info    : Function properties for _ZN6gocore8features5helper
ptxas         .     40 bytes stack frame, 8 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers
ptxas info    : Compile time = 10894.306 ms
info    : 408 bytes gmem, 24 bytes cmem[3]
info    : Function properties for '_ZN6gocore4cuda13_encode_entry':
info    : used 255 registers, used 5 barriers, 72 stack, 0 bytes smem, 5744 bytes cmem[0], 0 bytes lmem
"""  # noqa: E501


def test_the_linkers_log_is_read():
    r = cuda_mod.parse_link_log(_LINK_LOG)
    assert (r.registers, r.stack, r.spill_stores, r.spill_loads) == (255, 72, 52, 108)
    assert (r.warps, r.occupancy) == (8, 0.125)
    with pytest.raises(ValueError, match="no register count"):
        cuda_mod.parse_link_log("ptxas info    : 0 bytes gmem\n")
    # Linked from LTO-IR the linker adds no line of its own: the stack is the largest frame.
    lto = "\n".join(line for line in _LINK_LOG.splitlines() if not line.startswith("info"))
    r = cuda_mod.parse_link_log(lto)
    assert (r.registers, r.stack, r.spill_stores, r.spill_loads) == (255, 40, 52, 108)


def test_encoder_register_caps_are_read_and_refused(monkeypatch):
    assert cuda_mod.parse_registers("none") is None
    assert cuda_mod.parse_registers(" ") is None
    assert cuda_mod.parse_registers("128") == 128
    for bad in ("31", "256", "12x", "-64"):
        with pytest.raises(ValueError, match=rf"THE_VAR: '{re.escape(bad)}' is not a register"):
            cuda_mod.parse_registers(bad, "THE_VAR")
    # The environment's cap, read at the first launch; a bad one names the variable.
    monkeypatch.setattr(cuda_mod, "_encoder_registers", None)
    monkeypatch.setattr(cuda_mod, "_encoder_registers_read", False)
    monkeypatch.setenv(cuda_mod.ENCODER_REGISTERS_ENV, "96")
    assert cuda_mod.encoder_registers() == 96
    monkeypatch.setattr(cuda_mod, "_encoder_registers_read", False)
    monkeypatch.setenv(cuda_mod.ENCODER_REGISTERS_ENV, "lots")
    with pytest.raises(ValueError, match=cuda_mod.ENCODER_REGISTERS_ENV):
        cuda_mod.encoder_registers()
    cuda_mod.set_encoder_registers(None)
    assert cuda_mod.encoder_registers() is None
    with pytest.raises(ValueError):
        cuda_mod.set_encoder_registers(300)


def test_a_capped_encoder_plays_the_cpus_rows(gpu, monkeypatch):
    """The encoder launched under a register cap (on a GPU, a kernel of its own; the
    simulator runs the same Python, uncapped) writes what the CPU writes."""
    monkeypatch.setattr(cuda_mod, "_encoder_registers", None)
    monkeypatch.setattr(cuda_mod, "_encoder_registers_read", True)
    games, tensor = 3, 9
    host, device = _play_both(gpu, games, [9, 9, 7], steps=30, seed=5)
    planes = np.zeros((games, F.N_PLANES, tensor, tensor), np.float32)
    glob = np.zeros((games, F.N_GLOBALS), np.float32)
    F.encode_all(host, F.new_work(host), planes, glob)
    cuda_mod.set_encoder_registers(64)
    d_planes = gpu.zeros(planes.shape, np.float32)
    d_glob = gpu.zeros(glob.shape, np.float32)
    gpu.encode_all(device, gpu.new_work(device), d_planes, d_glob)
    assert np.array_equal(planes, gpu.to_numpy(d_planes))
    assert np.array_equal(glob, gpu.to_numpy(d_glob))
    # The cap names the kernel's first launch (off the simulator, where it applies).
    capped = "_encode_entry" if cuda_mod.simulated() else "_encode_entry (at most 64 registers)"
    assert capped in cuda_mod.FIRST_LAUNCH


@pytest.mark.slow
def test_kernel_resources_are_counted_without_a_gpu():
    """NVVM's PTX linked by nvJitLink for sm_90 (no GPU): the encoder under a cap of 128
    registers keeps to it and so holds at least 16 warps an SM; another kernel is left as
    the compiler made it."""
    try:
        from cuda.bindings import nvjitlink  # noqa: F401
        from cuda.pathfinder import load_nvidia_dynamic_lib

        load_nvidia_dynamic_lib("nvvm")
        load_nvidia_dynamic_lib("nvJitLink")
    except Exception:  # noqa: BLE001 - any failure to find them means: cannot check here
        pytest.skip("NVVM or nvJitLink (the CUDA toolkit's libraries) is not installed")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    result = subprocess.run(
        [sys.executable, "-m", "gocore.cuda", "--resources", "--kernels", "encode,gather",
         "--encoder-registers", "128"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert "the encoder's register cap: 128" in lines[0]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == {"encode", "gather"}
    encode, gather = rows["encode"], rows["gather"]
    assert 0 < int(encode[1]) <= 128 and int(encode[5]) >= 16
    assert 0 < int(gather[1]) <= 64 and int(gather[5]) >= 32
    bad = subprocess.run(
        [sys.executable, "-m", "gocore.cuda", "--resources", "--kernels", "encoder"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "no kernel encoder" in bad.stderr


_CACHE_PROBE = """
import json, os, warnings
from numba import cuda
from gocore import cuda as gpu, jit
paths = {}
for name, entry in gpu.ENTRIES.items():
    cache = gpu.disk_cache(gpu._rebuilt_entry(entry.py_func))
    paths[name] = None if cache is None else cache.cache_path
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    cache = gpu.disk_cache(gpu._rebuilt_entry(gpu.ENTRIES["play"].py_func))
    if cache is not None:
        cache.save_overload((), object())  # not a kernel: numba cannot pickle it
print(json.dumps({"folder": str(jit.CACHE_DIR), "paths": paths,
                  "warned": [str(w.message) for w in caught]}))
"""


@pytest.mark.parametrize("enabled", ["1", "0"])
def test_cuda_kernels_are_cached_only_in_the_digest_named_folder(tmp_path, enabled):
    """Off the simulator (a process without it; no GPU needed to make the cache objects):
    every entry's disk cache lives in gocore.jit's folder, whose name covers every kernel
    source, and a failing write warns instead of failing a stage; TENGEN_CUDA_CACHE=0 turns
    the cache off."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env.update(NUMBA_CACHE_DIR=str(tmp_path), TENGEN_CUDA_CACHE=enabled)
    result = subprocess.run(
        [sys.executable, "-c", _CACHE_PROBE], capture_output=True, text=True, env=env,
        timeout=300, cwd=str(Path(__file__).resolve().parent.parent),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    probe = json.loads(result.stdout)
    if enabled == "0":
        assert set(probe["paths"].values()) == {None} and probe["warned"] == []
        return
    folder = Path(probe["folder"])
    assert folder.parent == tmp_path and folder.name.startswith("gocore-")
    assert set(probe["paths"]) == set(cuda_mod.ENTRIES)
    for name, path in probe["paths"].items():
        assert path is not None and Path(path).is_relative_to(folder), (name, path)
    assert any("could not be cached" in w for w in probe["warned"]), probe["warned"]


@pytest.mark.parametrize("root", ["puct", "gumbel"])
def test_search_matches_the_cpu(gpu, root):
    """Select, expand and back up, root noise (or a Gumbel root: its draw, sequential halving,
    completed-Q targets and move), pruned targets and tree reuse: the CUDA search kernels build
    the same trees as the CPU ones, step by step, on mixed sizes and rules."""
    from gocore import search as S

    games, per = 3, 2
    rules = _mixed_rules(games)
    roots = gb.new_boards(games, [5, 7, 7], rules, max_moves=80)
    pick = np.random.default_rng(4)
    for _ in range(6):
        legal = gb.legal_all(roots)
        legal[:, gb.PASS] = False
        gb.play_all(roots, np.array([pick.choice(np.flatnonzero(row)) for row in legal]))
    area = roots.color.shape[1]
    host = S.new_tree(games, 40, 40 * 50, per, area)
    host.centre[:] = [0.0, 2.5, np.nan]
    host.explore[:] = [1, 0, 1]
    device = cuda_mod.to_device(host)
    device_roots = cuda_mod.to_device(roots)
    host_leaves = S.new_leaves(roots, per)
    device_leaves = cuda_mod.new_leaves(device_roots, per)
    params = search_params(score_utility=0.5)
    host_rng, device_rng = new_rng(games, 1), cuda_mod.cuda.to_device(new_rng(games, 1))
    for step in range(14):
        budget = np.array([2, 1, 2]) if step else np.ones(games, np.int64)
        S.select_all(host, roots, host_leaves, params, budget)
        gpu.select_all(device, device_roots, device_leaves, params, budget)
        assert np.array_equal(host.leaf, device.leaf.copy_to_host())
        assert np.array_equal(host_leaves.color, device_leaves.color.copy_to_host())
        policy = pick.random((games * per, area)).astype(np.float32)
        value, win, score = (pick.uniform(-1, 1, games * per).astype(np.float32) for _ in "vws")
        S.expand_and_backup_all(host, host_leaves, policy, value, win, score)
        gpu.expand_and_backup_all(device, device_leaves, policy, value, win, score)
        if step == 0 and root == "puct":
            S.add_noise_all(host, host_rng, np.array([1, 0, 1], bool), alpha_total=10.83,
                            epsilon=0.25)  # fmt: skip
            gpu.add_noise_all(device, device_rng, np.array([1, 0, 1], bool),
                                   alpha_total=10.83, epsilon=0.25)  # fmt: skip
        elif step == 0:
            host.budget[:] = 24
            device.budget.copy_to_device(host.budget)
            S.add_gumbel_all(host, host_rng, np.array([1, 1, 0], bool), 4)
            gpu.add_gumbel_all(device, device_rng, np.array([1, 1, 0], bool), 4)
    back = cuda_mod.to_host(device)
    for name in S.Tree._fields:
        assert np.allclose(getattr(host, name), getattr(back, name), equal_nan=True), name
    targets, kept = S.policy_targets_all(host, params, area)
    device_targets, device_kept = gpu.policy_targets_all(device, params, area)
    assert np.allclose(targets, device_targets.copy_to_host())
    assert np.allclose(kept, device_kept.copy_to_host())
    if root == "gumbel":
        assert (host.considered == [4, 4, 0]).all()
        targets, kept = S.gumbel_targets_all(host, params, area)
        device_targets, device_kept = gpu.gumbel_targets_all(device, params, area)
        assert np.allclose(targets, device_targets.copy_to_host(), atol=1e-6)
        assert np.allclose(kept, device_kept.copy_to_host())
        moves = S.gumbel_moves_all(host, params)
        assert np.array_equal(moves, gpu.gumbel_moves_all(device, params).copy_to_host())
    moves = targets.argmax(axis=1)
    which = np.array([1, 1, 0], bool)
    S.reroot_some(host, S.new_tree(games, 40, 40 * 50, per, area), moves, which)
    spare = cuda_mod.new_tree(games, 40, 40 * 50, per, area)
    gpu.reroot_some(device, spare, moves, which)
    back = cuda_mod.to_host(device)
    for name in ("visits", "value_sum", "win_sum", "score_sum", "edge_move", "node_count"):
        assert np.array_equal(getattr(host, name), getattr(back, name)), name


@pytest.mark.slow
@pytest.mark.parametrize("root", ["gumbel", "puct"])
def test_selfplay_on_the_device_plays_the_games_of_the_cpu(gpu, tiny_model, root):
    """A small self-play generation with `device: cuda` (a real net; handicaps, early forks and
    side positions drawn often): the trees, leaf boards and feature buffer live on the device,
    and the games, their rows and the counters are the CPU's, the policy targets to float32
    rounding (the simulator divides in float64)."""
    import dataclasses

    from gocore.selfplay import SelfPlay
    from play.models import load_evaluator
    from tests.conftest import default_section

    section = default_section("selfplay")
    considered = section.search.model_copy(update={"root": root}).considered
    config = dataclasses.replace(
        section.config(), considered=considered, board_sizes=((5, 1.0),),
        full_visits=8, cheap_visits=3, decided_visits=3, handicap_probability=0.3,
        early_fork_probability=0.5, side_position_probability=0.3,
    )  # fmt: skip
    net, _ = load_evaluator(tiny_model)
    played = {}
    for device in ("cpu", "cuda"):
        sp = SelfPlay(config, net, games=3, slots=2, seed=5, device=device)
        played[device] = (sp, list(sp.run()))
    (cpu, cpu_games), (dev, dev_games) = played["cpu"], played["cuda"]
    # Where the work happened.
    assert isinstance(cpu.planes, np.ndarray) and not isinstance(dev.planes, np.ndarray)
    assert not isinstance(dev.tree.visits, np.ndarray)
    assert not isinstance(dev.leaves.color, np.ndarray)
    counters = ("steps", "visits_done", "evaluations", "moves_done", "finished", "sides_started")
    assert [getattr(dev, k) for k in counters] == [getattr(cpu, k) for k in counters]
    assert cpu.finished == 3 and cpu.evaluations > 0
    assert len(dev_games) == len(cpu_games) > 3  # side positions too
    for a, b in zip(cpu_games, dev_games, strict=True):
        assert a.info.moves.tolist() == b.info.moves.tolist()
        assert a.info.kinds.tolist() == b.info.kinds.tolist()
        assert a.info.visits.tolist() == b.info.visits.tolist()
        assert np.array_equal(a.info.black_lead, b.info.black_lead, equal_nan=True)
        assert sorted(a.rows) == sorted(b.rows)
        for column, values in a.rows.items():
            if column == "policy_target":
                assert np.allclose(values, b.rows[column], atol=1e-6)
            else:
                assert np.array_equal(values, b.rows[column], equal_nan=True), column
        weighted = a.rows["policy_weight"] > 0
        assert np.allclose(b.rows["policy_target"][weighted].sum(axis=1), 1.0, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("considered", [0, 4])
def test_matches_on_the_device_play_the_games_of_the_cpu(gpu, tiny_model, considered):
    """The gate's arena with `device: cuda` (two real nets, PUCT and Gumbel roots): the same
    games as on the CPU, move for move, and the same scores."""
    from gocore.arena import play_match
    from gocore.rules import PRESETS
    from gocore.selfplay import UniformNet
    from play.models import load_evaluator
    from tests.conftest import default_section

    net, _ = load_evaluator(tiny_model)
    gate = default_section("gate")
    played = {}
    for device in ("cpu", "cuda"):
        games = play_match(
            net, UniformNet(2), np.array([True, False]), size=5,
            rules=PRESETS["chinese"].with_komi(0.5), visits=6, params=gate.search.params(),
            leaves_per_game=2, seed=7, temperature_start=0.8, temperature_end=0.2,
            max_moves_per_area=gate.max_moves_per_area, considered=considered, device=device,
        )  # fmt: skip
        played[device] = [(g.a_is_black, g.black_lead, g.moves.tolist()) for g in games]
    assert played["cuda"] == played["cpu"]
    assert all(len(moves) > 2 for _, _, moves in played["cpu"])
