"""Files and folders that appear whole or not at all, the one helper every package writes
through (gocore is the bottom layer: nets, play and stages all may import it).

- A file is written to a temporary name beside it (`.<name>.<pid>-<random>.tmp`), flushed to
  disk, and renamed over the old one, so a reader sees the old file or the new, never a part.
- A folder (a stage's output) is built in `.<name>.tmp-<pid>-<random>` and swapped in with
  one atomic exchange (Linux's renameat2 RENAME_EXCHANGE), so there is no moment when neither
  the old nor the new output is in place; where the exchange is not available, the old folder
  is renamed aside first and put back by the next run if the process died between the renames.
- Leftovers of a killed process (temporary files and folders whose process is gone) are removed
  the next time the same path is written.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

_TMP = re.compile(r"\.(?P<name>.+)\.(?:tmp-|old-)?(?P<pid>\d+)-[0-9a-f]+(?:\.tmp)?")


def file_mode() -> int:
    """The mode a new file gets under this process's umask (temporary files start at 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited: its leftovers are leftovers
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def remove_leftovers(path: str | os.PathLike) -> list[Path]:
    """Remove the temporary files and folders beside `path` that a dead process left while
    writing it; put back an old output folder that a dead process had renamed aside when no
    new one took its place. Returns what was removed."""
    path = Path(path)
    if not path.parent.is_dir():
        return []
    removed = []
    for entry in path.parent.iterdir():
        m = _TMP.fullmatch(entry.name)
        if not m or m["name"] != path.name or _alive(int(m["pid"])):
            continue
        if ".old-" in entry.name and not path.exists():
            os.replace(entry, path)  # the swap died half way: the old output stays
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def _tmp_name(path: Path, kind: str = "") -> Path:
    token = secrets.token_hex(4)
    if kind:
        return path.with_name(f".{path.name}.{kind}-{os.getpid()}-{token}")
    return path.with_name(f".{path.name}.{os.getpid()}-{token}.tmp")


def _fsync(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside `path` for the block to write a file to; renamed to `path`
    when the block ends without an error, removed when it raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(path)
    tmp = _tmp_name(path)
    try:
        yield tmp
        os.chmod(tmp, file_mode())
        _fsync(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes(data: bytes, path: str | os.PathLike) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(text: str, path: str | os.PathLike) -> Path:
    return write_bytes(text.encode("utf-8"), path)


def write_json(data, path: str | os.PathLike) -> Path:
    return write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", path)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2); False where the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
    renameat2.argtypes += [ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False  # this file system or kernel cannot exchange
    raise OSError(code, os.strerror(code), str(a))


@contextlib.contextmanager
def output_dir(out: str | os.PathLike) -> Iterator[Path]:
    """A temporary folder beside `out` for the block to fill; swapped in for `out` when the
    block ends without an error (the older `out` removed after), removed when it raises."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(out)
    tmp = _tmp_name(out, "tmp")
    tmp.mkdir()
    os.chmod(tmp, file_mode() | 0o111)
    try:
        yield tmp
        if out.exists() and _exchange(tmp, out):
            shutil.rmtree(tmp, ignore_errors=True)  # now the old output
            return
        old = None
        if out.exists():
            old = _tmp_name(out, "old")
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def sha256_file(path: str | os.PathLike) -> str:
    """The file's SHA-256, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
