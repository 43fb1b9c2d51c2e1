"""`tengen bench selfplay`: visits per second of self-play (search, rules, features and the
network together) beside network evaluations per second of the same net, at the same batch
size, with no search, measured in the same run on the same cores. Their ratio is the share of
the time the network gets: the search and everything around it cost the rest.

Self-play runs with params.yaml's `selfplay` settings (playout cap randomization, noise,
the score utility, tree reuse, game randomization off the board size), on one board size, with
a random-init net: its speed does not depend on its weights.
"""

from __future__ import annotations

import time

import numpy as np

from bench.table import Column, Table, board_text
from gocore import selfplay as SP
from play.names import PARAMS
from stages.params import SelfPlayParams, load_params, section


def _net(name: str, device: str, dtype: str = "float32", compile: str = "none"):
    import torch

    from nets.config import net_config
    from nets.evaluator import Evaluator
    from nets.model import GoNet

    torch.manual_seed(0)
    return Evaluator(GoNet(net_config(name)), device=device, dtype=dtype, compile=compile)


def _net_inputs(sp: SP.SelfPlay, board: int, device: str):
    """(planes, glob, legal, sync) of self-play's whole batch, where its buffers are."""
    if device == "cpu":
        planes, glob = sp.planes.copy(), sp.glob.copy()
        return planes, glob, np.ones((planes.shape[0], board * board + 1), np.bool_), lambda: None
    import torch

    planes = torch.as_tensor(sp.planes, device="cuda").clone()
    glob = torch.as_tensor(sp.glob, device="cuda").clone()
    legal = torch.ones((planes.shape[0], board * board + 1), dtype=torch.bool, device="cuda")
    return planes, glob, legal, torch.cuda.synchronize


def bench_one(
    net: str,
    board: int,
    *,
    slots: int,
    leaves: int,
    seconds: float,
    params_path: str = PARAMS,
    device: str = "cpu",
    dtype: str = "float32",
    compile: str = "none",
    encoder_registers: int | None = None,
    profile: str | None = None,
    until_a_game_ends: bool = False,
    lockstep: int = 0,
) -> dict:
    params = section(load_params(params_path), "selfplay", SelfPlayParams, source=params_path)
    params = params.model_copy(
        update={"board_sizes": {board: 1.0}, "slots": slots, "leaves_per_game": leaves}
    )
    evaluator = _net(net, device, dtype, compile)
    if device == "cuda":
        from gocore import cuda

        cuda.set_encoder_registers(encoder_registers)  # this row's encoder kernel
    sp = SP.SelfPlay(params.config(), evaluator, games=10**9, slots=slots, seed=0, device=device)
    # Warm up: compile, fill the trees, get games past their openings. Progress goes to stderr
    # as it happens (on a GPU the first step compiles the kernels, which can take minutes).
    label = f"{net} {board}x{board}, {slots} games, {device} {dtype}, compile {compile}"
    if encoder_registers is not None:
        label += f", encoder at most {encoder_registers} registers"
    start = time.perf_counter()
    sp.step()
    first = f"{label}: first step (compiles what is not cached) {time.perf_counter() - start:.1f} s"
    if device == "cuda":
        from gocore import cuda

        first += (
            f"; CUDA kernels' first launches in this process so far "
            f"{sum(cuda.FIRST_LAUNCH.values()):.1f} s"
        )
    _note(first)
    # With `until_a_game_ends` (a process's first row), until a game has ended too, at most a
    # minute more: the first game end compiles the scoring's CPU kernels (Benson's cleanup),
    # seconds that would land in the timed loop.
    start = time.perf_counter()
    while (
        (elapsed := time.perf_counter() - start) < min(seconds, 5.0)
        or sp.steps < 5
        or (until_a_game_ends and sp.finished == 0 and elapsed < 60.0)
    ):
        sp.step()
    _note(
        f"{label}: warmed up, {sp.steps} steps, the last {time.perf_counter() - start:.1f} s, "
        f"{sp.finished} games ended"
    )
    visits0, moves0, evals0, steps0 = sp.visits_done, sp.moves_done, sp.evaluations, sp.steps
    mirrored0 = sp.roots_mirrored
    reads0 = int(sp.xp.to_numpy(sp.leaf_work.past_reads).sum())
    elapsed = _step_for(sp, seconds)
    # The timed loop's counts, before the runs below add to them.
    visits, moves, evals, steps = (sp.visits_done - visits0, sp.moves_done - moves0,
                                   sp.evaluations - evals0, sp.steps - steps0)  # fmt: skip
    mirrored = sp.roots_mirrored - mirrored0
    past_reads = int(sp.xp.to_numpy(sp.leaf_work.past_reads).sum()) - reads0
    # Where a step's time goes: a shorter second run with each phase timed (the device is
    # synchronized around each, which removes any overlap of host and device work; a step's
    # own bookkeeping between the phases is the rest of `step`).
    sp.phase_seconds = {}
    steps1 = sp.steps
    phase_elapsed = _step_for(sp, max(1.0, seconds / 2))
    phase_steps = sp.steps - steps1
    phases = {k: round(1000 * v / phase_steps, 3) for k, v in sp.phase_seconds.items()}
    phases["step"] = round(1000 * phase_elapsed / phase_steps, 3)
    sp.phase_seconds = None
    if profile:  # a third run under cProfile, so that its overhead touches no figure above
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
        _step_for(sp, max(1.0, seconds / 2))
        profiler.disable()
        _write_profile(profiler, profile, label)
    modelled = _lockstep(sp, lockstep) if lockstep else None
    visit_rate = visits / elapsed
    # The network alone, on the batch self-play just encoded (on the GPU: its device buffer).
    planes, glob, legal, sync = _net_inputs(sp, board, device)
    evaluator(planes, glob, legal=legal)
    calls = 0
    sync()
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        evaluator(planes, glob, legal=legal)
        calls += 1
    sync()
    net_rate = calls * planes.shape[0] / (time.perf_counter() - start)
    return {
        "net": net,
        "board": board,
        "games_in_parallel": slots,
        "leaves_per_game": leaves,
        "batch": slots * leaves,
        "device": device,
        "dtype": dtype,
        # A compile that failed (the net fell back to eager, with a warning) says so.
        "compile": compile
        if compile == "none" or evaluator.compiled
        else f"none ({compile} failed)",
        "encoder_registers": encoder_registers,
        "steps_per_s": round(steps / elapsed, 2),
        "selfplay_visits_per_s": round(visit_rate, 1),
        "selfplay_moves_per_s": round(moves / elapsed, 2),
        "evaluations_per_visit": round(evals / max(1, visits), 3),
        "net_only_evals_per_s": round(net_rate, 1),
        "efficiency": round(visit_rate / net_rate, 4),
        "ms_per_step": phases,
        # The games whose root changed, a step: on a GPU, their rows of the roots cross to the
        # device (all of them where they are more than half the games).
        "roots_changed_per_step": round(mirrored / steps, 1),
        "root_bytes": sum(a.nbytes for a in sp.roots if isinstance(a, np.ndarray)) // sp.slots,
        # Positions 1 or 2 turns ago whose ladders a leaf read (not in its game's memo; up to 2
        # a leaf): on a GPU, a warp of 32 rows waits for any of its rows that reads.
        "past_reads_per_step": round(past_reads / steps, 2),
        "evaluations_per_step": round(evals / steps, 1),
        # The GPU encoder's lockstep modelled on the CPU (`lockstep` steps), us a row: None
        # unless asked.
        "encoder_lockstep_us_per_row": modelled,
    }


_timed_rows = None


def _time_rows():
    """A CPU driver that encodes each marked row alone, three times, and keeps its fastest
    time (seconds), less the fastest of three empty timings (the clock's own cost, two calls
    out of numba's compiled code), for the lockstep model."""
    global _timed_rows
    if _timed_rows is None:
        import numba

        from gocore import features as F

        @numba.njit
        def timed_rows(b, w, which, symmetry, planes, glob, out):
            clock = 1e9
            for _ in range(3):
                with numba.objmode(start="f8"):
                    start = time.perf_counter()
                with numba.objmode(stop="f8"):
                    stop = time.perf_counter()
                clock = min(clock, stop - start)
            for g in range(b.color.shape[0]):
                if not which[g]:
                    continue
                best = 1e9
                for _ in range(3):
                    with numba.objmode(start="f8"):
                        start = time.perf_counter()
                    F.encode(b, g, w, symmetry[g], planes[g], glob[g])
                    with numba.objmode(stop="f8"):
                        stop = time.perf_counter()
                    best = min(best, stop - start)
                out[g] = max(best - clock, 0.0)

        _timed_rows = timed_rows
    return _timed_rows


def warp_seconds(seconds: np.ndarray) -> float:
    """Thread-seconds a GPU spends on rows taking `seconds` each, thread i the i-th, in warps of
    32 threads that run in lockstep: each warp 32 times its slowest (the last warp padded with
    idle threads)."""
    t = np.concatenate([seconds, np.zeros(-len(seconds) % 32)])
    return 32 * float(t.reshape(-1, 32).max(axis=1).sum())


def _lockstep(sp: SP.SelfPlay, steps: int) -> dict:
    """The encoder on a GPU, modelled on this CPU over `steps` self-play steps: a warp's 32
    threads run in lockstep, so a warp takes as long as its slowest row. Each row the step
    encodes is encoded again alone (_time_rows; `remember` has run), and each warp charged
    (warp_seconds), in us a row encoded: with the rows in row order (a thread a row of the
    batch, those not encoded idle: the encoder's launch before features.encode_order), packed
    in row order (only the rows encoded, no idle thread), in encode_order's (the GPU's launch
    now: packed and sorted), sorted by their own times (no order does better), and their mean
    (no lockstep at all). An estimate: a GPU's memory and scheduling are not modelled."""
    import dataclasses

    from gocore import features as F

    timed_rows = _time_rows()
    encode_some = sp.xp.encode_some
    if encode_some is not F.encode_some:
        raise ValueError("the lockstep model times the CPU's encoder: --device cpu")
    charged = dict.fromkeys(("row_order", "packed", "encode_order", "best_order", "mean"), 0.0)
    rows = 0

    def timed(b, work, which, planes, glob, symmetry=None, *, phase=F.untimed):
        nonlocal rows
        encode_some(b, work, which, planes, glob, symmetry, phase=phase)
        symmetry = F.check_symmetries(symmetry, b.games)
        seconds = np.zeros(b.games)
        timed_rows(b, work, which, symmetry, planes, glob, seconds)
        order = F.encode_order(which, work.row_work)
        charged["row_order"] += warp_seconds(np.where(which, seconds, 0.0))
        charged["packed"] += warp_seconds(seconds[np.flatnonzero(which)])
        charged["encode_order"] += warp_seconds(seconds[order])
        charged["best_order"] += warp_seconds(np.sort(seconds[order])[::-1])
        charged["mean"] += float(seconds[order].sum())
        rows += len(order)

    xp = sp.xp
    sp.xp = dataclasses.replace(xp, encode_some=timed)
    try:
        for _ in range(steps):
            sp.step()
    finally:
        sp.xp = xp
    return {k: round(1e6 * v / max(rows, 1), 2) for k, v in charged.items()}


def _step_for(sp: SP.SelfPlay, seconds: float) -> float:
    """Step self-play for `seconds` (at least one step); returns the seconds it took."""
    start = time.perf_counter()
    while True:
        sp.step()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return elapsed


def _log_compiles() -> None:
    """gocore's compile log (numba's CPU compiles of a second or more, each CUDA kernel's first
    launch) on stderr."""
    import logging
    import sys

    from gocore import jit

    logger = logging.getLogger("gocore")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    jit.log_compiles(1.0)


def _note(text: str) -> None:
    import sys

    print(text, file=sys.stderr, flush=True)


def _write_profile(profiler, path: str, title: str) -> None:
    """The profile's 40 costliest functions by own time and by cumulative time, as text: where
    a self-play step's host time goes (on a GPU, waits for the device show in the copies)."""
    import io
    import pstats

    text = io.StringIO()
    text.write(f"self-play under cProfile, after the timed runs: {title}\n")
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(40)
    with open(path, "w") as f:
        f.write(text.getvalue())


def bench_selfplay(
    runs=(("b6c96", 9), ("b2c16", 9), ("b6c96", 19)),
    *,
    slots=(32,),
    leaves: int = 2,
    seconds: float = 10.0,
    params_path: str = PARAMS,
    device: str = "cpu",
    dtypes=("float32",),
    compiles=("none",),
    encoder_registers=(None,),
    profile: str | None = None,
    lockstep: int = 0,
):
    """One row per run, slot count, dtype, torch.compile mode (nets.evaluator.COMPILE_MODES)
    and register cap of the CUDA encoder (gocore.cuda.set_encoder_registers) in one process
    (the kernels compile once, the encoder once a cap);
    `profile` writes the first row's cProfile (of a run after its timed ones) to that file.
    What compiles, and for how long, goes to stderr as it happens."""
    _log_compiles()
    first = True
    for net, board in runs:
        for n in slots:
            for dtype in dtypes:
                for compile in compiles:
                    for registers in encoder_registers:
                        yield bench_one(
                            net, board, slots=n, leaves=leaves, seconds=seconds,
                            params_path=params_path, device=device, dtype=dtype,
                            compile=compile, encoder_registers=registers,
                            profile=profile if first else None, until_a_game_ends=first,
                            lockstep=lockstep,
                        )  # fmt: skip
                        first = False


TABLE = Table(
    (
        Column("net", 7, "net"),
        Column("board", 5, board_text),
        Column("games", 5, "games_in_parallel"),
        Column("batch", 5, "batch"),
        Column("device", 6, "device"),
        Column("dtype", 8, "dtype"),
        Column("compile", 15, "compile"),
        Column("regs", 4, "encoder_registers"),
        Column("visits/s", 9, "selfplay_visits_per_s", ",.0f"),
        Column("moves/s", 8, "selfplay_moves_per_s", ",.1f"),
        Column("net evals/s", 11, "net_only_evals_per_s", ",.0f"),
        Column("efficiency", 10, "efficiency", ".1%"),
    )
)


# `bench threads`: the same self-play measured with each choice of torch's threads.
THREADS_TABLE = Table(
    (
        Column("setting", 24, "setting"),
        Column("threads", 7, "torch_threads"),
        Column("busy", 4, "busy_processes"),
        Column("visits/s", 9, "selfplay_visits_per_s", ",.0f"),
        Column("net evals/s", 11, "net_only_evals_per_s", ",.0f"),
    )
)


def format_row(r: dict) -> str:
    """The table's row, and under it where a step's time went."""
    return (
        TABLE.row(r)
        + f"\n    {r['steps_per_s']:,.1f} steps/s; timed apart, ms a step: "
        + ", ".join(f"{k} {v:.2f}" for k, v in r["ms_per_step"].items())
        + f"\n    roots changed a step: {r['roots_changed_per_step']:,.1f} games of "
        f"{r['games_in_parallel']:,} ({r['roots_changed_per_step'] * r['root_bytes'] / 1e6:,.2f}"
        f" MB to a GPU; all: {r['games_in_parallel'] * r['root_bytes'] / 1e6:,.2f} MB)"
        + f"\n    past positions' ladders read a step: {r['past_reads_per_step']:,.2f} (of 2 a "
        f"leaf encoded, {r['evaluations_per_step']:,.1f} leaves a step)"
        + _lockstep_line(r["encoder_lockstep_us_per_row"])
    )


def _lockstep_line(m: dict | None) -> str:
    if m is None:
        return ""
    return (
        f"\n    the encoder in lockstep warps of 32 (modelled on this CPU), us a row: rows in row "
        f"order {m['row_order']:.2f}, packed {m['packed']:.2f}, in encode_order "
        f"{m['encode_order']:.2f}, sorted by their own times {m['best_order']:.2f}, the mean "
        f"{m['mean']:.2f}"
    )


def bench_beside_a_busy_process(
    net: str = "b4c32",
    board: int = 9,
    *,
    seconds: float = 5.0,
    params_path: str = PARAMS,
    busy: int = 1,
) -> list[dict]:
    """Self-play's visits/s on an idle machine and with `busy` CPU-bound processes beside it
    (another job: GNU Go, a second engine, a build), with torch's default thread count (one
    per core: the named baseline) and with one thread: what `selfplay.threads` chooses
    between."""
    import subprocess
    import sys

    import torch

    params = section(load_params(params_path), "selfplay", SelfPlayParams, source=params_path)
    default = torch.get_num_threads()
    rows = []

    def measure(label: str, threads: int, beside: int) -> None:
        torch.set_num_threads(threads)
        burners = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(beside)
        ]
        try:
            row = bench_one(net, board, slots=params.slots, leaves=params.leaves_per_game,
                            seconds=seconds, params_path=params_path)  # fmt: skip
        finally:
            for b in burners:
                b.kill()
                b.wait()
        rows.append({"setting": label, "torch_threads": threads, "busy_processes": beside, **row})

    measure("torch default, idle", default, 0)
    measure("one thread, idle", 1, 0)
    measure("torch default, busy", default, busy)
    measure("one thread, busy", 1, busy)
    return rows
