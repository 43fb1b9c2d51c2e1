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

from gocore.atomic import output_dir, sha256_file, write_json
from stages import cli, layout, tracking
from stages.cli import InputError
from stages.params import Section, ShuffleParams, read
from stages.rows import (
    SCHEMA,
    ShardError,
    ShardWriter,
    list_shards,
    read_shard,
    shard_info,
    write_shard,
)
from stages.spec import DvcStage, Plan, sections


class Params(Section):
    """What the shuffle stage reads of params.yaml."""

    shuffle: ShuffleParams


def window_size(n: int, c: float, alpha: float, beta: float) -> int:
    """The paper's moving window: n rows up to c, then growing sublinearly."""
    if n <= c:
        return int(n)
    return min(int(n), int(round(c * (1.0 + beta * ((n / c) ** alpha - 1.0) / alpha))))


@dataclasses.dataclass(frozen=True)
class ShuffleIO:
    generation: int
    selfplay: Path = layout.SELFPLAY  # the folder of gen-0 .. gen-N, each with part-K.parquet
    out: Path | None = None  # data/windows/gen-N (layout.window_dir)

    def __post_init__(self):
        if self.out is None:
            object.__setattr__(self, "out", layout.window_dir(self.generation))


def dvc(n: int, plan: Plan) -> list[DvcStage]:
    return [
        DvcStage(
            f"shuffle-{n}", "stages.shuffle", f"--generation {n}", sections(Params),
            deps=tuple(str(layout.selfplay_dir(g)) for g in range(n + 1)),
            outs=(str(layout.window_dir(n)),),
        )
    ]  # fmt: skip


def _sources(io: ShuffleIO) -> list[tuple[int, Path, int]]:
    """(generation, shard, rows) of every shard of generations 0..N, newest generation first."""
    sources = []
    for gen in range(io.generation, -1, -1):
        folder = io.selfplay / layout.selfplay_dir(gen).name
        shards = list_shards(folder)
        if not folder.is_dir() or not shards:
            raise InputError(
                f"shuffle: {folder} has no self-play shards (part-K.parquet); "
                f"run the selfplay stage for generation {gen} first"
            )
        for shard in reversed(shards):
            try:
                rows = shard_info(shard)
            except ShardError as e:
                raise InputError(
                    f"shuffle: {e}; rerun the selfplay stage for generation {gen}"
                ) from None
            sources.append((gen, shard, rows))
    return sources


def run(params: Params, io: ShuffleIO) -> dict:
    """Build generation N's window; returns its metrics (also in the manifest)."""
    params = params.shuffle
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
        write_json(manifest, tmp / layout.MANIFEST)
    return {
        "generation": io.generation,
        "total_rows": total,
        "window_rows": window,
        "files": len(written),
        "digest": digest,
    }


def _deal(sources, window: int, files: int, rng, tmp: Path) -> list[dict]:
    """Pass 1: the newest `window` rows, each dealt to a random bucket file."""
    writers: dict[int, ShardWriter] = {}
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
                    writers[k] = ShardWriter(tmp / f".bucket-{k}.parquet")
                writers[k].write(part)
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
        table = read_shard(bucket) if bucket.exists() else SCHEMA.empty_table()
        table = table.take(rng.permutation(table.num_rows))
        path = write_shard(table, tmp / f"part-{k}.parquet")
        bucket.unlink(missing_ok=True)
        written.append({"name": path.name, "rows": table.num_rows, "sha256": sha256_file(path)})
    return written


def main(argv: list[str] | None = None) -> int:
    p = cli.parser("shuffle", __doc__)
    p.add_argument("--selfplay", type=Path, default=layout.SELFPLAY)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    def work(tracked):
        params = read(args.params, Params)
        io = ShuffleIO(args.generation, args.selfplay, args.out)
        metrics = run(params, io)
        if tracked is not None:
            track(tracked, io)
        return metrics

    return cli.finish("shuffle", work, Params, params=args.params, generation=args.generation)


def track(tracked, io: ShuffleIO) -> None:
    """Lineage: the window's digest and the self-play runs whose rows it holds (found by
    their data's digest, so a generation DVC did not rerun is still found)."""
    manifest = json.loads((io.out / layout.MANIFEST).read_text())
    generations = {source["generation"] for source in manifest["sources"]}
    runs = selfplay_runs(tracked.tracker, io.selfplay, generations)
    tracked.tag(
        {"tengen.window_sha256": manifest["digest"], "tengen.selfplay_runs": ",".join(runs)}
    )
    tracked.log_window(io.out, manifest, context="shuffle")
    tracked.log_artifact(io.out / layout.MANIFEST)


def selfplay_runs(tracker, folder: Path, generations) -> list[str]:
    """The newest self-play run that made each generation's data, oldest generation first."""
    found = []
    for gen in sorted(generations):
        digest = tracking.data_digest(folder / layout.selfplay_dir(gen).name)
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
