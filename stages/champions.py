"""The champions of a run: where each generation's is (stages.layout), the one a stage plays
against or from, and how big it is; what selfplay, gate, promote and evaluate share."""

from __future__ import annotations

from pathlib import Path

from stages import layout
from stages.cli import InputError, read_report


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


# The lineage files' keys that give a checkpoint's SHA-256 (stages.promote.digests).
DIGEST_KEYS = ("champion_sha256", "candidate_sha256")


def lineage(folder: Path) -> dict[str, str]:
    """Every checkpoint the run at `folder` (its run folder, or a clone of its git) made, by
    SHA-256: what its lineage files (reports/lineage/, committed with dvc.lock) record of
    each generation's champion and candidates. InputError where there are none."""
    folder = Path(folder).expanduser()
    files = sorted((folder / layout.lineage(0)).parent.glob("gen-*.json"))
    if not files:
        raise InputError(
            f"--lineage {folder}: no {layout.lineage('N')} there; give the run's folder or a "
            "clone of its git (`git clone head:runs/night`), brought up to date (`git pull`)"
        )
    known: dict[str, str] = {}
    newest = (-1, None)  # the newest generation's champion, by (generation, digest)
    for path in files:
        rows = read_report(path, f"--lineage {folder}", "the promote stage that wrote it")
        for row in rows if isinstance(rows, list) else [rows]:
            if not isinstance(row, dict):
                continue
            # A champion is named so before the candidate it was (keys are sorted on disk).
            for key, value in sorted(row.items(), key=lambda kv: not kv[0].startswith("champ")):
                if key.startswith(DIGEST_KEYS) and isinstance(value, str):
                    what = "champion" if key.startswith("champion") else "candidate"
                    net = key[len(f"{what}_sha256") :].lstrip("_")
                    known.setdefault(value, f"generation {row.get('generation')}'s {what}"
                                     + (f" ({net})" if net else ""))  # fmt: skip
                    generation = row.get("generation")
                    if key == DIGEST_KEYS[0] and isinstance(generation, int):
                        newest = max(newest, (generation, value), key=lambda g: g[0])
    if newest[1] is not None:
        known[NEWEST] = newest[1]
    return known


# lineage()'s key for the digest of the newest champion it records.
NEWEST = "newest champion"


def check_against(path: Path, spec: str, folder: Path, where: str) -> str:
    """What `path` (the checkpoint `spec` fetched from the MLflow store `where`) is in the
    run's lineage at `folder`; InputError if its SHA-256 is not there."""
    from gocore.atomic import sha256_file

    known = lineage(folder)
    newest = known.pop(NEWEST, None)
    digest = sha256_file(path)
    if spec.endswith("@champion") and digest in known and digest != newest:
        # An older champion or a beaten candidate under the alias: a rollback.
        raise InputError(
            f"--model {spec}: refused: the checkpoint {where} gave is {known[digest]} in the "
            f"run's lineage at {folder}, not its newest champion: someone who can write to the "
            "MLflow store may have moved the alias back; or the lineage is ahead of the store "
            "(play an older champion by its version, models:/NAME/VERSION)"
        )
    if digest in known:
        return known[digest]
    said = (
        "it records no SHA-256 (written before tengen recorded them)"
        if not known
        else f"it is none of the {len(known)} checkpoints it records"
    )
    raise InputError(
        f"--model {spec}: refused: the checkpoint {where} gave (SHA-256 {digest[:16]}...) is "
        f"not in the run's lineage at {folder}: {said}. Someone who can write to the MLflow "
        "store may have replaced it; or the lineage is behind the store (`git pull` there)"
    )


def lineage_of_store(uri: str | None) -> Path | None:
    """The run folder whose own SQLite store `uri` is (its lineage beside it), or None."""
    prefix = "sqlite:///"
    if not uri or not uri.startswith(prefix):
        return None
    folder = Path(uri[len(prefix) :]).parent
    return folder if (folder / layout.lineage(0)).parent.is_dir() else None
