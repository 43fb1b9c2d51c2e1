"""`tengen bench shuffle`: the moving window's shuffle on a synthetic self-play history of the
real row schema, timed with the stage's engine (polars lazy queries streaming into bucket
files) beside the baseline it replaced (the same two passes over pyarrow tables, numpy doing
the dealing), in the same run: rows per minute and peak resident memory of each, each in a
fresh process of its own.

Both shuffles deal the same rows to the same buckets in the same order (stages.shuffle's row
keys), so they write the same files; the benchmark checks that their window digests agree.

The synthetic rows are shaped like 9x9 self-play's: 40 rows a game, sparse bit-packed planes
(a fifth of the bits set), policy targets with a dozen non-zero entries, ownership of +-1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench.table import Column, Table
from gocore.atomic import write_json
from gocore.features import N_GLOBALS, N_PLANES, packed_length
from stages import layout
from stages.rows import SCHEMA, ShardWriter, list_shards, manifest_entries, read_shard, write_shard

ROWS_PER_GAME = 40


def synthetic_shard(rows: int, generation: int, first_game: int, size: int, seed: int):
    """`rows` rows of the real schema, shaped like self-play's (see the module's doc)."""
    rng = np.random.default_rng([seed, generation, first_game])
    area = size * size
    game = first_game + np.arange(rows) // ROWS_PER_GAME
    turn = (np.arange(rows) % ROWS_PER_GAME) * 2
    width = packed_length(size)
    bits = rng.random((rows, N_PLANES * area), dtype=np.float32) < 0.2
    packed = np.ascontiguousarray(np.packbits(bits, axis=1)[:, :width])
    planes = pa.Array.from_buffers(
        pa.binary(), rows,
        [None, pa.py_buffer(np.arange(rows + 1, dtype=np.int32) * width), pa.py_buffer(packed)],
    )  # fmt: skip
    policy = np.zeros((rows, area + 1), np.float32)
    cols = rng.integers(0, area + 1, (rows, 12))
    policy[np.arange(rows)[:, None], cols] = rng.random((rows, 12), dtype=np.float32) + 0.01
    policy /= policy.sum(axis=1, keepdims=True)
    games = np.unique(game)
    ids = np.array([f"g{generation}-s{seed}-{g:06d}" for g in games], dtype=object)
    length = np.full(rows, ROWS_PER_GAME * 2 + 2, np.int16)
    rules = np.array(["tromp-taylor", "chinese", "japanese"])[game % 3]

    def lists(values, arrow_type):
        width = values.shape[1]
        offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * width)
        return pa.ListArray.from_arrays(offsets, pa.array(values.ravel(), arrow_type))

    table = pa.table(
        {
            "game_id": pa.array(ids[game - games[0]], pa.string()),
            "generation": pa.array(np.full(rows, generation, np.int32)),
            "model_id": pa.array(np.full(rows, f"gen-{generation}", dtype=object), pa.string()),
            "turn": pa.array(turn.astype(np.int16)),
            "board_size": pa.array(np.full(rows, size, np.int8)),
            "rules": pa.array(rules, pa.string()),
            "komi": pa.array(np.full(rows, 7.5, np.float32)),
            "to_move": pa.array((1 + turn % 2).astype(np.int8)),
            "planes": planes,
            "globals": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.random(rows * N_GLOBALS, dtype=np.float32)), N_GLOBALS
            ),
            "policy_target": lists(policy, pa.float32()),
            "policy_weight": pa.array(np.ones(rows, np.float32)),
            "opponent_move": pa.array(rng.integers(0, area, rows).astype(np.int16)),
            "outcome": pa.array(rng.choice([-1.0, 1.0], rows).astype(np.float32)),
            "final_score": pa.array(rng.normal(0, 10, rows).astype(np.float32)),
            "ownership": lists(rng.choice([-1, 1], (rows, area)).astype(np.int8), pa.int8()),
            "score_weight": pa.array(np.ones(rows, np.float32)),
            "value_weight": pa.array(np.ones(rows, np.float32)),
            "visits": pa.array(np.full(rows, 100, np.int32)),
            "root_value": pa.array(rng.uniform(-1, 1, rows).astype(np.float32)),
            "root_score": pa.array(rng.normal(0, 10, rows).astype(np.float32)),
            "game_length": pa.array(length),
            "game_end": pa.array(np.full(rows, "passes", dtype=object), pa.string()),
            "first_pass": pa.array(length - 2),
            "handicap": pa.array(np.zeros(rows, np.int8)),
        },
        schema=SCHEMA,
    )
    return table


def synthetic_history(
    folder: Path, rows: int, *, generations: int = 10, rows_per_shard: int = 50_000,
    size: int = 9, seed: int = 0,
) -> Path:  # fmt: skip
    """A self-play folder (gen-0 .. gen-{generations-1}, part-K.parquet) of `rows` rows in
    all, spread evenly over the generations; returns it."""
    per_gen = -(-rows // generations)
    left = rows
    for gen in range(generations):
        out = folder / layout.selfplay_dir(gen).name
        out.mkdir(parents=True, exist_ok=True)
        gen_rows, shard, game = min(per_gen, left), 0, 0
        while gen_rows > 0 or shard == 0:
            n = min(rows_per_shard, gen_rows)
            write_shard(synthetic_shard(n, gen, game, size, seed), out / f"part-{shard}.parquet")
            game += -(-n // ROWS_PER_GAME)
            gen_rows -= n
            left -= n
            shard += 1
        files = manifest_entries(list_shards(out))
        write_json({"generation": gen, "files": files}, out / layout.MANIFEST)
    return folder


def _in_a_process(engine: str, selfplay: Path, out: Path, generation: int, params: dict):
    """One shuffle in a fresh process; its result, wall seconds and peak resident bytes."""
    code = (
        "import json, sys, time\n"
        "from pathlib import Path\n"
        "from bench.shuffle import shuffle_with\n"
        "a = json.loads(sys.argv[1])\n"
        "t = time.perf_counter()\n"
        "m = shuffle_with(a['engine'], Path(a['selfplay']), Path(a['out']), a['generation'],"
        " a['params'])\n"
        "m['seconds'] = time.perf_counter() - t\n"
        "print(json.dumps(m))\n"
    )
    arg = json.dumps(
        {"engine": engine, "selfplay": str(selfplay), "out": str(out),
         "generation": generation, "params": params}
    )  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", code, arg], stdout=subprocess.PIPE, text=True)
    stdout = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"the {engine} shuffle failed (exit status {proc.returncode})")
    metrics = json.loads(stdout.strip().splitlines()[-1])
    metrics["peak_rss_bytes"] = usage.ru_maxrss * 1024  # Linux: kilobytes
    return metrics


def shuffle_with(engine: str, selfplay: Path, out: Path, generation: int, params: dict) -> dict:
    """Generation `generation`'s window of `selfplay` into `out` with one engine."""
    from stages import shuffle

    p = shuffle.Params(shuffle=shuffle.ShuffleParams(**params))
    io = shuffle.ShuffleIO(generation, selfplay, out)
    if engine == "polars":
        return shuffle.run(p, io)
    if engine == "pyarrow":
        return shuffle.run(p, io, deal=pyarrow_deal, gather=pyarrow_gather)
    raise ValueError(f"unknown shuffle engine {engine!r}")


def pyarrow_deal(plan, files: int, base: int, tmp: Path) -> None:
    """The baseline's pass 1: each shard read whole with pyarrow, its kept rows dealt to their
    buckets with numpy (the same keys as the polars pass), appended to bucket files."""
    from stages import shuffle

    writers: dict[int, ShardWriter] = {}
    try:
        for source in plan:
            table = read_shard(source.shard)
            key, order = shuffle.row_keys(base, source.offset, source.rows)
            if source.keep < source.rows:
                chosen = np.sort(np.argpartition(key, source.keep - 1)[: source.keep])
                table, key, order = table.take(chosen), key[chosen], order[chosen]
            for name, values in (("key", key), ("order", order)):
                table = table.append_column(shuffle.BUCKET_SCHEMA.field(name), pa.array(values))
            bucket = (order % np.uint64(files)).astype(np.int64)
            for k in np.unique(bucket):
                if k not in writers:
                    writers[k] = ShardWriter(tmp / f".bucket-{k}.parquet", shuffle.BUCKET_SCHEMA)
                writers[k].write(table.take(np.flatnonzero(bucket == k)))
    finally:
        for w in writers.values():
            w.close()


def pyarrow_gather(k: int, tmp: Path) -> pa.Table:
    """The baseline's pass 2 for bucket k: read, sorted by the row order key with numpy."""
    from stages import shuffle

    path = tmp / f".bucket-{k}.parquet"
    if not path.exists():
        return SCHEMA.empty_table()
    table = read_shard(path, schema=shuffle.BUCKET_SCHEMA)
    by = np.lexsort((table["key"].to_numpy(), table["order"].to_numpy()))
    path.unlink()
    return table.take(by).drop_columns(["key", "order"])


def bench_shuffle(rows: int, work: Path, *, rows_per_file: int = 20_000, keep: bool = False):
    """Both engines on one synthetic history of `rows` rows (a window of all of them)."""
    selfplay = work / "selfplay"
    start = time.perf_counter()
    marker = work / "synthetic-rows.txt"  # what a kept work folder holds
    if not marker.exists() or marker.read_text() != str(rows):
        if selfplay.exists():
            shutil.rmtree(selfplay)
        synthetic_history(selfplay, rows)
        marker.write_text(str(rows))
    made = time.perf_counter() - start
    params = dict(window_c=10 * rows, window_alpha=0.75, window_beta=0.4,
                  rows_per_file=rows_per_file, seed=0)  # fmt: skip
    results = []
    for engine in ("pyarrow", "polars"):
        out = work / f"window-{engine}"
        m = _in_a_process(engine, selfplay, out, 9, params)
        m["engine"] = engine
        m["rows_per_minute"] = m["window_rows"] / m["seconds"] * 60
        results.append(m)
        if not keep:
            for f in out.iterdir():
                f.unlink()
            out.rmdir()
    return results, made


TABLE = Table(
    (
        Column(
            "engine",
            21,
            lambda m: "pyarrow (baseline)" if m["engine"] == "pyarrow" else "polars (the stage's)",
            align="<",
        ),
        Column("rows", 11, "window_rows", ","),
        Column("seconds", 8, "seconds", ".1f"),
        Column("rows/min", 12, "rows_per_minute", ",.0f"),
        Column("peak RSS", 10, lambda m: f"{m['peak_rss_bytes'] / 2**30:.2f} GB"),
        Column("digest", 12, lambda m: m["digest"][:12], align="<", gap=2),
    )
)
