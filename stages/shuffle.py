"""The shuffle stage: the moving window over all self-play rows so far, newest first, shuffled
into Parquet window files for training.

    python -m stages.shuffle --generation N [--selfplay data/selfplay] [--out data/windows/gen-N]

The window's size follows the KataGo paper: with n rows played so far,

    window(n) = n                                              for n <= c
    window(n) = c * (1 + beta * ((n / c) ** alpha - 1) / alpha)  beyond

so window(c) = c and its slope at c is beta (the paper: c = 250,000, alpha = 0.75,
beta = 0.4 on 19x19). The newest window(n) rows are taken: whole generations from the newest
back, then a random part of the oldest one reached.

Memory stays bounded by one input shard plus one output file whatever the window's size: a
first pass streams the shards one at a time and deals every kept row to a random output
bucket (appended to that bucket's Parquet file); a second pass loads one bucket at a time,
permutes it, and writes it out. Everything goes to a temporary folder renamed into place at
the end, with a manifest (sources, rows taken, files, their digests, the window's digest).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field

from stages import cli, tracking
from stages.atomic import output_dir, sha256_file, write_json
from stages.cli import InputError
from stages.params import Section, load_params, section
from stages.rows import SCHEMA, ShardError, list_shards, read_shard


class ShuffleParams(Section):
    """params.yaml `shuffle:`."""

    window_c: int = Field(ge=1)
    window_alpha: float = Field(gt=0, le=1)
    window_beta: float = Field(gt=0)
    rows_per_file: int = Field(ge=1)
    seed: int


def window_size(n: int, c: float, alpha: float, beta: float) -> int:
    """The paper's moving window: n rows up to c, then growing sublinearly."""
    if n <= c:
        return int(n)
    return min(int(n), int(round(c * (1.0 + beta * ((n / c) ** alpha - 1.0) / alpha))))


@dataclasses.dataclass(frozen=True)
class ShuffleIO:
    generation: int
    selfplay: Path  # the folder of gen-0 .. gen-N, each with part-K.parquet
    out: Path  # data/windows/gen-N


def _sources(io: ShuffleIO) -> list[tuple[int, Path, int]]:
    """(generation, shard, rows) of every shard of generations 0..N, newest generation first."""
    sources = []
    for gen in range(io.generation, -1, -1):
        folder = io.selfplay / f"gen-{gen}"
        shards = list_shards(folder)
        if not folder.is_dir() or not shards:
            raise InputError(
                f"shuffle: {folder} has no self-play shards (part-K.parquet); "
                f"run the selfplay stage for generation {gen} first"
            )
        for shard in reversed(shards):
            try:
                meta = pq.ParquetFile(shard).metadata
                schema = pq.read_schema(shard)
            except (pa.ArrowException, OSError) as e:
                raise InputError(
                    f"shuffle: shard {shard} is corrupt or truncated ({e}); "
                    f"rerun the selfplay stage for generation {gen}"
                ) from None
            if not schema.equals(SCHEMA, check_metadata=False):
                raise InputError(f"shuffle: shard {shard} does not have the rows schema")
            sources.append((gen, shard, meta.num_rows))
    return sources


def run(params: ShuffleParams, io: ShuffleIO) -> dict:
    """Build generation N's window; returns its metrics (also in the manifest)."""
    sources = _sources(io)
    total = sum(rows for _, _, rows in sources)
    window = window_size(total, params.window_c, params.window_alpha, params.window_beta)
    rng = np.random.default_rng([params.seed, io.generation])
    files = max(1, math.ceil(window / params.rows_per_file))
    with output_dir(io.out) as tmp:
        taken_from = _deal(sources, window, files, rng, tmp)
        written = _shuffle_buckets(files, rng, tmp)
        digest = hashlib.sha256("".join(f["sha256"] for f in written).encode()).hexdigest()
        manifest = {
            "generation": io.generation,
            "total_rows": total,
            "window_rows": window,
            "window": {
                "c": params.window_c,
                "alpha": params.window_alpha,
                "beta": params.window_beta,
            },
            "sources": taken_from,
            "files": written,
            "digest": digest,
        }
        write_json(manifest, tmp / "manifest.json")
    return {
        "generation": io.generation,
        "total_rows": total,
        "window_rows": window,
        "files": len(written),
        "digest": digest,
    }


def _deal(sources, window: int, files: int, rng, tmp: Path) -> list[dict]:
    """Pass 1: the newest `window` rows, each dealt to a random bucket file."""
    writers: dict[int, pq.ParquetWriter] = {}
    taken_from = []
    left = window
    try:
        for gen, shard, rows in sources:
            if left <= 0:
                break
            if rows == 0:
                continue
            keep = rows if rows <= left else left
            try:
                table = read_shard(shard)
            except ShardError as e:
                raise InputError(
                    f"shuffle: {e}; rerun the selfplay stage for generation {gen}"
                ) from None
            if keep < rows:  # the oldest shard reached: a random part of it
                table = table.take(np.sort(rng.choice(rows, keep, replace=False)))
            bucket = rng.integers(0, files, keep)
            for k in np.unique(bucket):
                part = table.take(np.flatnonzero(bucket == k))
                if k not in writers:
                    writers[k] = pq.ParquetWriter(tmp / f".bucket-{k}.parquet", SCHEMA)
                writers[k].write_table(part)
            taken_from.append({"shard": str(shard), "generation": gen, "rows": rows, "taken": keep})
            left -= keep
    finally:
        for w in writers.values():
            w.close()
    return taken_from


def _shuffle_buckets(files: int, rng, tmp: Path) -> list[dict]:
    """Pass 2: each bucket permuted in memory and written as part-K.parquet."""
    written = []
    for k in range(files):
        bucket = tmp / f".bucket-{k}.parquet"
        table = pq.read_table(bucket) if bucket.exists() else SCHEMA.empty_table()
        table = table.take(rng.permutation(table.num_rows))
        path = tmp / f"part-{k}.parquet"
        pq.write_table(table, path, compression="zstd")
        bucket.unlink(missing_ok=True)
        written.append({"name": path.name, "rows": table.num_rows, "sha256": sha256_file(path)})
    return written


def main(argv: list[str] | None = None) -> int:
    p = cli.parser("shuffle", __doc__)
    p.add_argument("--selfplay", type=Path, default=Path("data/selfplay"))
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    def work(tracked):
        params = section(load_params(args.params), "shuffle", ShuffleParams, source=args.params)
        out = args.out or Path(f"data/windows/gen-{args.generation}")
        io = ShuffleIO(args.generation, args.selfplay, out)
        metrics = run(params, io)
        if tracked is not None:
            track(tracked, io)
        return metrics

    return cli.finish("shuffle", work, params=args.params, generation=args.generation)


def track(tracked, io: ShuffleIO) -> None:
    """Lineage: the window's digest and the self-play runs whose rows it holds (found by
    their data's digest, so a generation DVC did not rerun is still found)."""
    manifest = json.loads((io.out / "manifest.json").read_text())
    generations = {source["generation"] for source in manifest["sources"]}
    runs = selfplay_runs(tracked.tracker, io.selfplay, generations)
    tracked.tag(
        {"tengen.window_sha256": manifest["digest"], "tengen.selfplay_runs": ",".join(runs)}
    )
    tracked.log_window(io.out, manifest, context="shuffle")
    tracked.log_artifact(io.out / "manifest.json")


def selfplay_runs(tracker, folder: Path, generations) -> list[str]:
    """The newest self-play run that made each generation's data, oldest generation first."""
    found = []
    for gen in sorted(generations):
        digest = tracking.data_digest(folder / f"gen-{gen}")
        runs = tracker.runs(
            f"tags.`tengen.stage` = 'selfplay' and tags.`tengen.data_sha256` = '{digest}'"
            " and attributes.status = 'FINISHED'",
            max_results=1,
        )
        if runs:
            found.append(runs[0].info.run_id)
    return found


if __name__ == "__main__":
    sys.exit(main())
