"""The nets package's errors, importable without torch: a stage that never loads a net (the
shuffle) still reports a bad checkpoint the same way, without paying torch's import."""

from __future__ import annotations

from pathlib import Path


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: unreadable, not ours, or not the expected net."""

    def __init__(self, message: str, path: Path | None = None):
        super().__init__(message)
        self.path = path
