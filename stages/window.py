"""Reading a window (stages.shuffle's output): its manifest and files, checked, and endless
training batches from it; what the train and ema stages share."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from stages.cli import InputError
from stages.layout import MANIFEST
from stages.rows import ShardError, manifest_shards, read_shard, training_arrays


def window_files(window: Path, stage: str) -> tuple[list[Path], dict]:
    """The window's non-empty files and its manifest, checked against each other (every file
    listed is there, whole, with the rows and SHA-256 it should have); InputError naming
    `stage`."""
    if not (Path(window) / MANIFEST).exists():
        raise InputError(
            f"{stage}: {Path(window) / MANIFEST} does not exist; run the shuffle stage first"
        )
    try:
        shards, manifest = manifest_shards(window)
    except ShardError as e:
        raise InputError(f"{stage}: window {e}; rerun the shuffle stage") from None
    files = [path for path, rows in shards if rows]
    if not files:
        raise InputError(f"{stage}: the window {window} has no rows; rerun the shuffle stage")
    return files, manifest


def check_window(manifest: dict, batch_size: int, stage: str, key: str) -> None:
    rows = int(manifest.get("window_rows") or 0)
    if rows < batch_size:
        raise InputError(
            f"{stage}: the window has {rows} rows, fewer than one batch ({key} = {batch_size}); "
            "play more self-play games or lower the batch size"
        )


def batches(files: list[Path], batch_size: int, tensor: int, rng: np.random.Generator, stage: str):
    """Endless training batches: the files in a random order, each one's rows permuted, each
    row under a random symmetry; a file's last rows fill the next batch with the next file's.
    One file in memory at a time (plus less than a batch of the one before). The window must
    hold a batch (see `check_window`)."""
    leftover = None
    while True:
        for i in rng.permutation(len(files)):
            try:
                table = read_shard(files[i])
            except ShardError as e:
                raise InputError(f"{stage}: window {e}; rerun the shuffle stage") from None
            table = table.take(rng.permutation(table.num_rows))
            if leftover is not None:
                table = pa.concat_tables([leftover, table])
            full = table.num_rows - table.num_rows % batch_size
            for start in range(0, full, batch_size):
                part = table.slice(start, batch_size)
                try:
                    arrays = training_arrays(part, tensor, rng.integers(0, 8, batch_size))
                except ValueError as e:
                    raise InputError(f"{stage}: {e} (params.yaml train.tensor)") from None
                yield arrays
            leftover = table.slice(full)


def window_lineage(tracker, manifest: dict) -> dict[str, str]:
    """The tags that tie a model to its window (its manifest): the window's digest, the
    shuffle run that made it and the self-play runs it draws from (looked up by digest)."""
    digest = manifest.get("digest", "")
    tags = {"tengen.window_sha256": digest}
    runs = tracker.runs(
        f"tags.`tengen.stage` = 'shuffle' and tags.`tengen.window_sha256` = '{digest}'"
        " and attributes.status = 'FINISHED'",
        max_results=1,
    )
    if runs:
        tags["tengen.shuffle_run"] = runs[0].info.run_id
        tags["tengen.selfplay_runs"] = runs[0].data.tags.get("tengen.selfplay_runs", "")
    return tags
