"""Outputs that appear whole or not at all: every stage writes into a temporary path next to
its output and renames it into place at the end, so a killed stage leaves nothing half
written (and the previous output stays until the new one is complete)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def file_mode() -> int:
    """The mode a new file gets under this process's umask (mkstemp's files are 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def output_dir(out: str | os.PathLike) -> Iterator[Path]:
    """A temporary folder beside `out`, renamed to `out` when the block ends without an
    error (replacing an older `out`), removed when it raises."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    os.chmod(tmp, file_mode() | 0o111)  # mkdtemp's 0700 would hide outputs on a shared machine
    try:
        yield tmp
        old = None
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_text(text: str, path: str | os.PathLike) -> Path:
    """Write a file atomically: a temporary file beside it, then a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(data, path: str | os.PathLike) -> Path:
    return write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", path)


def sha256_file(path: str | os.PathLike) -> str:
    """The file's SHA-256, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
