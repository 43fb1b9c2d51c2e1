"""params.yaml's defaults, shipped inside the package (play/params.yaml, a link to the source
tree's params.yaml, which a wheel carries as a file): the one home of every default, read the
same way from a source checkout and from an installed tengen, so that `tengen gtp` started by
a GUI from any folder, or a run made from a wheel, has them."""

from __future__ import annotations

from pathlib import Path

from play.names import PARAMS

# The package's copy (the source tree's params.yaml in a checkout or an editable install).
DEFAULTS = Path(__file__).resolve().parent / PARAMS


def params_file(given: Path | str | None) -> Path:
    """The params.yaml a command reads: the one given, else the working folder's, else the
    defaults that ship with tengen."""
    if given is not None:
        return Path(given)
    here = Path(PARAMS)
    return here if here.is_file() else DEFAULTS
