"""The pipeline's stages, each `python -m stages.<name>` (dvc.yaml's commands).

Under `tengen run` such a command hands itself to the loop's stage server (stages.server),
which runs it without a fresh Python's imports; this check comes before anything else of the
stage is imported, and costs nothing without TENGEN_STAGE_SERVER."""

import os as _os

if _os.environ.get("TENGEN_STAGE_SERVER"):
    from stages.handoff import forward as _forward

    _forward()
