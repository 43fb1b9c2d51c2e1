"""`tengen bench`: the benchmarks' commands, each beside a named baseline measured in the same
run (docs/benchmarks.md). Each imports its benchmark when it runs."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from play.names import PARAMS

bench_app = typer.Typer(help="Benchmarks, each beside a named baseline measured in the same run.")


@bench_app.command("nets")
def bench_nets(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list instead of a table.")
    ] = False,
    seconds: Annotated[float, typer.Option(help="Seconds per measurement.")] = 1.0,
    nets: Annotated[str, typer.Option(help="Net sizes, comma separated, or 'all'.")] = "all",
    sizes: Annotated[str, typer.Option(help="Board sizes, comma separated.")] = "9,19",
    batches: Annotated[str, typer.Option(help="Batch sizes, comma separated.")] = "64,256",
) -> None:
    """Forward evaluations and training samples per second per net, board and batch."""
    from bench.nets import TABLE, format_footer, format_row
    from bench.nets import bench_nets as run
    from nets.config import SIZES

    names = list(SIZES) if nets == "all" else [n.strip() for n in nets.split(",")]
    unknown = [n for n in names if n not in SIZES]
    if unknown:
        raise typer.BadParameter(
            f"unknown nets {unknown}; known: {', '.join(SIZES)}", param_hint="--nets"
        )
    try:
        batch_sizes = tuple(int(b) for b in batches.split(","))
    except ValueError:
        raise typer.BadParameter(
            f"expected batches like 64,256 (got {batches!r})", param_hint="--batches"
        ) from None
    _stream(run(names, _sizes(sizes), batch_sizes, seconds), TABLE.header(), format_row, as_json,
            footer=format_footer)  # fmt: skip


@bench_app.command("features")
def bench_features(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list instead of a table.")
    ] = False,
    seconds: Annotated[float, typer.Option(help="Seconds per measurement.")] = 2.0,
    sizes: Annotated[str, typer.Option(help="Board sizes, comma separated.")] = "9,19",
    batch: Annotated[int, typer.Option(help="Positions per batch.")] = 256,
) -> None:
    """Positions encoded per second beside one b6c96 forward pass on the same batch."""
    from bench.features import TABLE
    from bench.features import bench_features as run

    board_sizes = _sizes(sizes)
    rows = run(sizes=board_sizes, batch=batch, seconds=seconds)
    print(json.dumps(rows) if as_json else TABLE.render(rows))


@bench_app.command("selfplay")
def bench_selfplay(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list instead of a table.")
    ] = False,
    seconds: Annotated[float, typer.Option(help="Seconds per measurement.")] = 10.0,
    runs: Annotated[
        str, typer.Option(help="net:board pairs, comma separated.")
    ] = "b6c96:9,b2c16:9,b6c96:19",
    slots: Annotated[
        str, typer.Option(help="Games played at once; several, comma separated, in one process.")
    ] = "32",
    leaves: Annotated[int, typer.Option(help="Leaves per game per network batch.")] = 2,
    params: Annotated[str, typer.Option(help="The params.yaml to take selfplay from.")] = PARAMS,
    device: Annotated[
        str, typer.Option(help="Where the search, the rules and the network run: cpu or cuda.")
    ] = "cpu",
    dtype: Annotated[
        str,
        typer.Option(
            help="The net's arithmetic on a GPU: float32, bfloat16 or float16; several, comma "
            "separated."
        ),
    ] = "float32",
    compile: Annotated[
        str,
        typer.Option(
            help="torch.compile's mode for the net: none (eager), default, reduce-overhead or "
            "max-autotune; several, comma separated, a row each."
        ),
    ] = "none",
    encoder_registers: Annotated[
        str,
        typer.Option(
            help="With --device cuda: at most this many registers a thread for the encoder's "
            "kernels (none: the compiler's choice, 245 for the encoder); several, comma "
            "separated, a row each. Default: TENGEN_CUDA_ENCODER_REGISTERS, else none."
        ),
    ] = "",
    profile: Annotated[
        str | None,
        typer.Option(help="Write a cProfile of the first row's self-play to this file."),
    ] = None,
    lockstep: Annotated[
        int,
        typer.Option(
            help="On the CPU, after the timed runs: model the GPU encoder's lockstep over this "
            "many steps (each row's encode timed alone, a warp of 32 charged its slowest row), "
            "with the rows in row order, packed, and in the GPU's launch order. 0: not modelled."
        ),
    ] = 0,
) -> None:
    """Self-play visits per second beside the same net's evaluations per second, no search."""
    from bench.selfplay import TABLE, format_row
    from bench.selfplay import bench_selfplay as run
    from nets.config import SIZES
    from nets.evaluator import COMPILE_MODES

    slot_counts = [s.strip() for s in slots.split(",")]
    if not all(s.isdigit() and int(s) > 0 for s in slot_counts):
        raise typer.BadParameter(
            f"expected positive game counts, comma separated (got {slots!r})", param_hint="--slots"
        )
    dtypes = [d.strip() for d in dtype.split(",")]
    for d in dtypes:
        if d not in ("float32", "bfloat16", "float16"):
            raise typer.BadParameter(
                f"expected float32, bfloat16 or float16 (got {d!r})", param_hint="--dtype"
            )
        if d != "float32" and device == "cpu":
            raise typer.BadParameter(
                f"{d} runs on a GPU only (--device cuda); the CPU evaluates in float32",
                param_hint="--dtype",
            )

    compiles = [c.strip() for c in compile.split(",")]
    for c in compiles:
        if c not in COMPILE_MODES:
            raise typer.BadParameter(
                f"expected {', '.join(COMPILE_MODES)} (got {c!r})", param_hint="--compile"
            )
    if lockstep < 0 or (lockstep and device != "cpu"):
        raise typer.BadParameter(
            f"expected a count of steps >= 0, modelled with --device cpu (got {lockstep}); on a "
            "GPU the encode phase measures the lockstep itself",
            param_hint="--lockstep",
        )
    caps = [c.strip() for c in encoder_registers.split(",")]
    if device != "cuda":
        if caps not in ([""], ["none"]):
            raise typer.BadParameter(
                "a register cap applies to the CUDA kernels: --device cuda",
                param_hint="--encoder-registers",
            )
        caps = [None]
    else:
        from gocore import cuda

        try:  # none given: the environment's cap (an error names the variable)
            caps = (
                [cuda.parse_registers(c) for c in caps]
                if caps != [""]
                else [cuda.encoder_registers()]
            )
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--encoder-registers") from None
    pairs = []
    for item in runs.split(","):
        net, _, board = item.strip().partition(":")
        if net not in SIZES or not board.isdigit() or not 2 <= int(board) <= 19:
            raise typer.BadParameter(
                f"expected net:board pairs like b6c96:9 with a known net (got {item!r}); "
                f"nets: {', '.join(SIZES)}",
                param_hint="--runs",
            )
        pairs.append((net, int(board)))
    rows = run(pairs, slots=[int(s) for s in slot_counts], leaves=leaves, seconds=seconds,
               params_path=params, device=device, dtypes=dtypes, compiles=compiles,
               encoder_registers=caps, profile=profile, lockstep=lockstep)  # fmt: skip
    _stream(rows, TABLE.header(), format_row, as_json)


@bench_app.command("scale")
def bench_scale(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the result as JSON instead of a table.")
    ] = False,
    net: Annotated[str, typer.Option(help="The net (random init).")] = "b4c32",
    games: Annotated[int, typer.Option(help="Games per measurement.")] = 96,
    shards: Annotated[int, typer.Option(help="Shards on the cluster (one process: 1).")] = 2,
    params: Annotated[str, typer.Option(help="The params.yaml to take selfplay from.")] = PARAMS,
    worker_threads: Annotated[
        int, typer.Option(min=1, help="Torch and numba threads per worker.")
    ] = 1,
) -> None:
    """Self-play in one process and on a Dask LocalCluster of 1 and 2 workers.

    One generation's games: games/s, speed-up against the ideal, time not spent playing."""
    from bench.scale import TABLE, summary
    from bench.scale import bench_scale as run
    from nets.config import SIZES
    from stages.params import ParamsError

    if net not in SIZES:
        raise typer.BadParameter(
            f"unknown net {net!r}; nets: {', '.join(SIZES)}", param_hint="--net"
        )
    if not 2 <= shards <= games:
        raise typer.BadParameter(
            f"between 2 and --games ({games}) shards (got {shards})", param_hint="--shards"
        )
    log = functools.partial(print, file=sys.stderr, flush=True)
    try:
        result = run(
            net=net, games=games, shards=shards, params_path=params,
            worker_threads=worker_threads, log=log,
        )  # fmt: skip
    except ParamsError as e:
        print(f"tengen bench scale: error: {e}", file=sys.stderr)
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(result))
        return
    print(f"{net}, {games} games a measurement ({shards} shards on the cluster), {params}")
    print(TABLE.render(result["rows"]))
    print(summary(result))


@bench_app.command("threads")
def bench_threads(
    net: Annotated[str, typer.Option(help="The net.")] = "b4c32",
    board: Annotated[int, typer.Option(help="Board size.")] = 9,
    seconds: Annotated[float, typer.Option(help="Seconds per measurement.")] = 5.0,
    busy: Annotated[int, typer.Option(help="CPU-bound processes beside it.")] = 1,
    params: Annotated[str, typer.Option(help="The params.yaml to take selfplay from.")] = PARAMS,
) -> None:
    """Self-play with torch's default threads (baseline) against one thread.

    Idle and beside a busy process: the two choices of selfplay.threads."""
    from bench.selfplay import THREADS_TABLE, bench_beside_a_busy_process
    from nets.config import SIZES

    if net not in SIZES:
        raise typer.BadParameter(f"unknown net {net!r}; known: {', '.join(SIZES)}", "--net")
    if busy < 0 or not 2 <= board <= 19:
        raise typer.BadParameter("--busy must be >= 0 and --board within 2..19")
    rows = bench_beside_a_busy_process(net, board, seconds=seconds, params_path=params, busy=busy)
    print(THREADS_TABLE.render(rows))
    idle = rows[1]["selfplay_visits_per_s"] / rows[0]["selfplay_visits_per_s"]
    beside = rows[3]["selfplay_visits_per_s"] / rows[2]["selfplay_visits_per_s"]
    print(
        f"idle: one thread gives {idle:.2f}x the visits/s of torch's default threads; beside "
        f"{busy} busy process(es): one thread gives {beside:.2f}x the visits/s of torch's "
        "default threads"
    )


@bench_app.command("shuffle")
def bench_shuffle(
    rows: Annotated[int, typer.Option(help="Rows of the synthetic 9x9 history.")] = 5_000_000,
    rows_per_file: Annotated[int, typer.Option(help="Rows per window file.")] = 20_000,
    work: Annotated[
        Path | None,
        typer.Option(
            help="Folder for the synthetic history (kept, and reused by a run with the "
            "same --rows; the windows are removed); default a temporary folder."
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list instead of a table.")
    ] = False,
) -> None:
    """The window shuffle: the stage's polars engine beside the pyarrow baseline.

    On the same synthetic history (a window of all of it): rows/min and peak resident memory
    of each."""
    import shutil
    import tempfile

    from bench.shuffle import TABLE
    from bench.shuffle import bench_shuffle as run

    if rows < 1 or rows_per_file < 1:
        raise typer.BadParameter("--rows and --rows-per-file must be at least 1")
    folder = Path(tempfile.mkdtemp(prefix="tengen-bench-shuffle-")) if work is None else work
    try:
        results, made = run(rows, folder, rows_per_file=rows_per_file)
    finally:
        if work is None:
            shutil.rmtree(folder, ignore_errors=True)
    if as_json:
        print(json.dumps(results))
        return
    print(f"synthetic history: {rows:,} rows of 9x9 in 10 generations (made in {made:.0f} s)")
    print(TABLE.render(results))
    base, ours = results
    same = "the same files" if base["digest"] == ours["digest"] else "DIFFERENT files (a bug)"
    print(f"polars: {ours['rows_per_minute'] / base['rows_per_minute']:.2f}x the baseline's "
          f"rows/min, {ours['peak_rss_bytes'] / base['peak_rss_bytes']:.2f}x its peak memory; "
          f"{same}")  # fmt: skip


@bench_app.command("play")
def bench_play(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list instead of a table.")
    ] = False,
    nets: Annotated[str, typer.Option(help="Nets, comma separated.")] = "b4c32,b6c96",
    visits: Annotated[str, typer.Option(help="Visits per move, comma separated.")] = (
        "64,400,1600"
    ),
    board: Annotated[int, typer.Option(help="Board size.")] = 9,
    moves: Annotated[int, typer.Option(help="Positions measured per figure.")] = 5,
    leaves: Annotated[
        int | None, typer.Option(help="Leaves per network batch (default: gate.leaves_per_game).")
    ] = None,
    params: Annotated[Path | None, typer.Option(help="params.yaml (gate.search).")] = None,
) -> None:
    """Seconds per move of `tengen gtp --model` beside the net alone at the same batch."""
    from bench.play import TABLE, bench_one
    from nets.config import SIZES
    from stages.params import EngineSection, load_params, params_file, section

    source = params_file(params)
    engine = section(load_params(source), "gate", EngineSection, source=source)
    names = [n.strip() for n in nets.split(",") if n.strip()]
    if bad := [n for n in names if n not in SIZES]:
        raise typer.BadParameter(
            f"unknown nets {bad}; nets: {', '.join(SIZES)}", param_hint="--nets"
        )
    try:
        counts = [int(v) for v in visits.split(",")]
    except ValueError:
        raise typer.BadParameter(f"expected numbers like 64,400 (got {visits!r})") from None
    rows = (row for name in names
            for row in bench_one(name, board, counts, leaves=leaves or engine.leaves_per_game,
                                 moves=moves, params=engine.search.params()))  # fmt: skip
    _stream(rows, TABLE.header(), TABLE.row, as_json)


@bench_app.command("rules")
def bench_rules(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list instead of a table.")
    ] = False,
    seconds: Annotated[
        float, typer.Option(help="Seconds of play per board size and engine.")
    ] = 3.0,
    sizes: Annotated[str, typer.Option(help="Board sizes, comma separated.")] = "9,19",
) -> None:
    """Random games per second on one core, beside OpenSpiel's C++ Go in the same run."""
    from bench.rules import bench_rules as run
    from bench.rules import format_table

    rows = run(_sizes(sizes), seconds)
    print(json.dumps(rows) if as_json else format_table(rows))


def _stream(rows, header: str, format_row, as_json: bool, footer=None) -> None:
    """Each row printed as it is measured, under `header` (and `footer(rows)` at the end), or
    the whole list as JSON once measured."""
    done = []
    if not as_json:
        print(header, flush=True)
    for row in rows:
        done.append(row)
        if not as_json:
            print(format_row(row), flush=True)
    if as_json:
        print(json.dumps(done))
    elif footer is not None:
        print(footer(done))


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise typer.BadParameter(
            f"expected sizes like 9,19 (got {text!r})", param_hint="--sizes"
        ) from None
    if not all(2 <= s <= 19 for s in sizes):
        raise typer.BadParameter(f"board sizes are 2..19 (got {text!r})", param_hint="--sizes")
    return sizes
