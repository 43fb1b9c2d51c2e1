"""The shuffle stage: the moving window over all self-play rows so far, newest first, shuffled
into Parquet window files for training.

    python -m stages.shuffle --generation N [--selfplay data/selfplay] [--out data/windows/gen-N]

The window's size follows the KataGo paper: with n rows played so far,

    window(n) = n                                              for n <= c
    window(n) = c * (1 + beta * ((n / c) ** alpha - 1) / alpha)  beyond

so window(c) = c and its slope at c is beta (the paper: c = 250,000, alpha = 0.75,
beta = 0.4 on 19x19). The newest window(n) rows are taken: whole generations from the newest
back, then a random part of the oldest one reached.

Two passes, as polars lazy queries, keep memory bounded whatever the window's size. Every
row has two keys from the seed, the window's generation and its place among the window's
rows (`row_keys`). Pass 1 streams the kept rows of every shard (of the oldest shard reached, its
rows of smallest key) into bucket files, each row to bucket `order mod files`
(`sink_parquet` partitioned by bucket); pass 2 loads one bucket at a time, sorts it by
`order`, and writes it as part-K.parquet through stages.rows. The same seed and inputs give
the same files. Everything goes to a temporary folder renamed into place at the end, with a
manifest (sources, rows taken, files, their digests, the window's digest).

The stage also writes generation N's data report (stages.data) of its own self-play rows.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from gocore.atomic import output_dir, write_json
from stages import cli, data, layout, tracking
from stages.cli import InputError
from stages.params import Section, ShuffleParams, read
from stages.rows import SCHEMA, ShardError, manifest_entries, manifest_shards, write_shard
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
    report: Path | None = None  # generation N's data report (layout.data_report); None: none

    def __post_init__(self):
        if self.out is None:
            object.__setattr__(self, "out", layout.window_dir(self.generation))


def dvc(n: int, plan: Plan) -> list[DvcStage]:
    return [
        DvcStage(
            f"shuffle-{n}", "stages.shuffle", f"--generation {n}", sections(Params),
            deps=tuple(str(layout.selfplay_dir(g)) for g in range(n + 1)),
            outs=(str(layout.window_dir(n)),),
            metrics=(str(layout.data_report(n)),),
        )
    ]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Source:
    """One input shard of the window: its rows, how many the window takes, and where its rows
    start in the window's row order (newest shard first; see row_keys)."""

    generation: int
    shard: Path
    rows: int
    keep: int
    offset: int


def _sources(io: ShuffleIO) -> list[tuple[int, Path, int]]:
    """(generation, shard, rows) of every shard of generations 0..N, newest generation first,
    each checked against its folder's manifest (rows, SHA-256)."""
    sources = []
    for gen in range(io.generation, -1, -1):
        folder = io.selfplay / layout.selfplay_dir(gen).name
        if not folder.is_dir():
            raise InputError(
                f"shuffle: {folder} does not exist; run the selfplay stage for generation {gen}"
                " first"
            )
        try:
            shards, _ = manifest_shards(folder)
        except ShardError as e:
            raise InputError(
                f"shuffle: self-play {e}; rerun the selfplay stage for generation {gen}"
            ) from None
        sources += [(gen, shard, rows) for shard, rows in reversed(shards)]
    return sources


def plan_window(sources, window: int) -> list[Source]:
    """The shards the newest `window` rows come from, newest first."""
    plan, left, offset = [], window, 0
    for gen, shard, rows in sources:
        if left <= 0:
            break
        if rows == 0:
            continue
        keep = min(rows, left)
        plan.append(Source(gen, shard, rows, keep, offset))
        left -= keep
        offset += rows
    return plan


# Row keys: splitmix64 (Steele, Lea and Flood 2014) over the rows of the window's shards in
# plan order, from a base fixed by the seed and the window's generation. A row's `key` picks
# the oldest shard's part (its rows of smallest key: keys are distinct, splitmix64 being a
# bijection); its `order`, the key mixed again, picks its bucket (order mod files) and its
# place in the bucket (sorted by order). The same formula runs as numpy arithmetic and as
# polars expressions (both wrap modulo 2^64), so both give every row the same keys.
_GOLDEN = 0x9E3779B97F4A7C15
_MIX = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
BUCKET_SCHEMA = SCHEMA.append(pa.field("key", pa.uint64(), nullable=False)).append(
    pa.field("order", pa.uint64(), nullable=False)
)


def key_base(seed: int, generation: int) -> int:
    return int(np.random.SeedSequence([seed, generation]).generate_state(1, np.uint64)[0])


def _mix(z, const):
    """splitmix64's finalizer over numpy uint64 arrays or polars UInt64 expressions."""
    z = (z ^ (z // const(1 << 30))) * const(_MIX[0])
    z = (z ^ (z // const(1 << 27))) * const(_MIX[1])
    return z ^ (z // const(1 << 31))


def row_keys(base: int, offset: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The (key, order) of the window's rows offset .. offset + rows - 1 (numpy)."""
    with np.errstate(over="ignore"):
        i = np.arange(offset + 1, offset + rows + 1, dtype=np.uint64)
        key = _mix(np.uint64(base) + i * np.uint64(_GOLDEN), np.uint64)
        return key, _mix(key, np.uint64)


def _row_keys_expr(base: int) -> tuple[pl.Expr, pl.Expr]:
    """row_keys as polars expressions over the window's row index column `i` (0-based)."""

    def const(c):
        return pl.lit(c, pl.UInt64)

    i = pl.col("i").cast(pl.UInt64) + const(1)
    key = _mix(const(base) + i * const(_GOLDEN), const)
    return key, _mix(key, const)


def oldest_cut(plan: list[Source], base: int) -> int | None:
    """The largest key the oldest shard's kept rows have (None: it is taken whole)."""
    last = plan[-1] if plan else None
    if last is None or last.keep == last.rows:
        return None
    key, _ = row_keys(base, last.offset, last.rows)
    return int(np.partition(key, last.keep - 1)[last.keep - 1])


def polars_deal(plan: list[Source], files: int, base: int, tmp: Path) -> None:
    """Pass 1 as one polars lazy query: one scan of every shard the window takes, each row
    with its keys, streamed into its bucket's file (tmp/.bucket-K-J.parquet). One scan, not
    one per shard: the streaming engine's memory then stays flat as the window grows."""
    if not plan:
        return
    key, order = _row_keys_expr(base)
    rows = pl.scan_parquet([s.shard for s in plan], row_index_name="i", glob=False).with_columns(
        key=key, order=order
    )
    cut = oldest_cut(plan, base)
    if cut is not None:  # the oldest shard reached: its rows of smallest key
        rows = rows.filter((pl.col("i") < plan[-1].offset) | (pl.col("key") <= cut))

    folder = Path(tmp).resolve()  # polars joins a relative provider's path to the base's

    def bucket_file(args) -> Path:
        return (
            folder / f".bucket-{args.partition_keys.item(0, 0)}-{args.index_in_partition}.parquet"
        )

    with pl.Config(streaming_chunk_size=_MORSEL_ROWS):
        rows.drop("i").sink_parquet(
            pl.PartitionBy(
                folder, key=(pl.col("order") % files).alias("bucket"), include_key=False,
                file_path_provider=bucket_file,
            ),
            row_group_size=max(1024, min(65_536, _BUFFER_ROWS // files)),
            maintain_order=False,
            compression="lz4",  # scratch files, read once: 30% faster than zstd here
        )  # fmt: skip


# Pass 1's memory grows with the streaming engine's morsels times the open buckets: morsels of
# this many rows hold its peak well below the engine's default ones at a small cost in speed,
# smaller ones cost much more (docs/benchmarks.md, `tengen bench shuffle`). Each bucket's row
# groups: about _BUFFER_ROWS rows over all of them, at least 1,024 each.
_MORSEL_ROWS = 10_000
_BUFFER_ROWS = 100_000


def polars_gather(k: int, tmp: Path) -> pa.Table:
    """Pass 2 for bucket k: its rows sorted by their order key, as a table in SCHEMA."""
    paths = sorted(tmp.glob(f".bucket-{k}-*.parquet"))
    if not paths:
        return SCHEMA.empty_table()
    frame = (
        pl.scan_parquet(paths, glob=False).sort(["order", "key"]).drop(["key", "order"]).collect()
    )
    for path in paths:
        path.unlink()
    return frame.to_arrow()


def run(params: Params, io: ShuffleIO, *, deal=polars_deal, gather=polars_gather) -> dict:
    """Build generation N's window; returns its metrics (also in the manifest). `deal` and
    `gather` are its two passes (bench.shuffle times pyarrow's beside them)."""
    params = params.shuffle
    sources = _sources(io)
    total = sum(rows for _, _, rows in sources)
    window = window_size(total, params.window_c, params.window_alpha, params.window_beta)
    plan = plan_window(sources, window)
    files = max(1, math.ceil(window / params.rows_per_file))
    with output_dir(io.out) as tmp:
        try:
            deal(plan, files, key_base(params.seed, io.generation), tmp)
        except (pl.exceptions.PolarsError, OSError, ShardError) as e:
            # The shards were just checked against their manifests: more likely the window's
            # folder (a full disk, permissions) than the shards.
            raise InputError(
                f"shuffle: the window of generations {plan[-1].generation}..{plan[0].generation}"
                f" could not be built in {io.out.parent} ({e})"
            ) from None
        for k in range(files):
            table = gather(k, tmp).cast(SCHEMA).combine_chunks()  # the list items' names too
            write_shard(table, tmp / f"part-{k}.parquet")
        written = manifest_entries([tmp / f"part-{k}.parquet" for k in range(files)])
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
            "sources": [
                {"shard": str(s.shard), "generation": s.generation, "rows": s.rows, "taken": s.keep}
                for s in plan
            ],  # fmt: skip
            "files": written,
            "digest": digest,
        }
        write_json(manifest, tmp / layout.MANIFEST)
    if io.report is not None:  # generation N's own rows (checked above), whatever was taken
        shards = [shard for gen, shard, _ in reversed(sources) if gen == io.generation]
        write_json(data.report(shards, "shuffle"), io.report)
    return {
        "generation": io.generation,
        "total_rows": total,
        "window_rows": window,
        "files": len(written),
        "digest": digest,
    }


def main(argv: list[str] | None = None) -> int:
    p = cli.parser("shuffle", __doc__)
    p.add_argument("--selfplay", type=Path, default=layout.SELFPLAY)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--report", type=Path, default=None, help="reports/data/gen-N.json")
    args = p.parse_args(argv)

    def work(tracked):
        params = read(args.params, Params)
        report = args.report or layout.data_report(args.generation)
        io = ShuffleIO(args.generation, args.selfplay, args.out, report)
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
    if io.report is not None and io.report.exists():
        figures = json.loads(io.report.read_text())
        tracked.log_metrics({"data": _scalars(figures)}, step=io.generation)
        tracked.log_artifact(io.report, "data")


def _scalars(figures: dict) -> dict:
    """The report's single figures (no per-komi, per-rules or per-bin lists)."""
    return {k: v for k, v in figures.items() if not isinstance(v, list)}


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
