"""The champions of a run: where each generation's is (stages.layout), the one a stage plays
against or from, and how big it is; what selfplay, gate, promote and evaluate share."""

from __future__ import annotations

from pathlib import Path

from stages import layout
from stages.cli import InputError


def champion_in(folder: Path) -> Path | None:
    """The checkpoint a champion folder holds, or None (no promotion yet)."""
    path = Path(folder) / layout.CHAMPION
    return path if path.is_file() else None


def previous_champion(generation: int, stage: str) -> Path | None:
    """The champion after generation N - 1 (None at generation 0, or before any promotion);
    InputError if that generation's promote stage has not run."""
    if generation == 0:
        return None
    promotion = layout.promotion(generation - 1)
    if not promotion.is_file():
        raise InputError(
            f"{stage}: {promotion} does not exist; run the promote stage of "
            f"generation {generation - 1} first (or pass the model explicitly)"
        )
    return champion_in(layout.champion_dir(generation - 1))
