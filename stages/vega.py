"""Charts that draw without a network: vega, vega-lite and vega-embed inlined into the page
(from the vl-convert-python package, which ships them), DVC's plots template, and PNGs.

DVC's own page loads the three scripts from a CDN, so `dvc plots show` on a machine without
internet opens blank. `install_dvc_template(repo)` writes .dvc/plots.html (the scripts inlined,
charts drawn as SVG) and points the repository's local DVC config at it
(`plots.html_template`, in .dvc/config.local, which git ignores), so `dvc plots show` and
`dvc plots diff` draw every chart offline. The loop installs it in every run folder it runs.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from gocore.atomic import write_text

TEMPLATE = "plots.html"  # in .dvc/, the name DVC's config gives relative to that folder
DVC_VEGA_LITE = "5"  # DVC's templates are vega-lite 5 specs: its page gets the newest 5.x
SVG_RENDERER = """<script>
// Every chart drawn as SVG (sharp at any zoom, and its marks are in the page), and no links
// to the online Vega editor: a machine without internet cannot open them.
(function () {
  const embed = window.vegaEmbed;
  window.vegaEmbed = function (el, spec, options) {
    const own = {renderer: "svg", actions: {export: true, source: true, compiled: false,
                                            editor: false}};
    return embed(el, spec, Object.assign(own, options || {})).catch(function (error) {
      const target = typeof el === "string" ? document.querySelector(el) : el;
      const note = document.createElement("pre");
      note.className = "chart-error";
      note.textContent = "this chart could not be drawn: " + error;
      if (target) target.appendChild(note);
      throw error;
    });
  };
})();
</script>"""


def vegalite_version(major: str | None = None) -> str:
    """The newest vega-lite that vl-convert ships (of that major version, if it has one)."""
    import vl_convert

    shipped = vl_convert.get_vegalite_versions()
    matching = [v for v in shipped if major is None or v.split(".")[0] == major]
    return (matching or shipped)[-1]


@functools.cache
def scripts(vegalite_major: str | None = None) -> str:
    """The <script> elements that define vegaEmbed, vega and vegaLite (the newest vega-lite,
    or the newest of a major version), inlined (~0.9 MB)."""
    import vl_convert

    versions = {
        "vega": vl_convert.get_vega_version(),
        "vega-lite": vegalite_version(vegalite_major),
        "vega-embed": vl_convert.get_vega_embed_version(),
    }
    bundle = vl_convert.javascript_bundle(vl_version=versions["vega-lite"])
    # Inside a <script> element only "</script" (any case) and "<!--" can end or change it.
    bundle = re.sub(r"</(script)", r"<\\/\1", bundle, flags=re.IGNORECASE).replace("<!--", "<\\!--")
    named = ", ".join(f"{k} {v}" for k, v in versions.items())
    head = f"<!-- {named}, inlined from vl-convert-python -->"
    return f"{head}\n<script>\n{bundle}\n</script>\n{SVG_RENDERER}"


DVC_PAGE = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
{refresh_tag}
<title>DVC plots</title>
<style>
  body { font-family: sans-serif; }
  table { border-spacing: 15px; }
</style>
<!--tengen:scripts-->
</head>
<body>
{plot_divs}
</body>
</html>
"""


def dvc_template() -> str:
    """DVC's page with the scripts inlined; no {scripts} placeholder, so DVC adds no CDN tags."""
    return DVC_PAGE.replace("<!--tengen:scripts-->", scripts(DVC_VEGA_LITE))


def install_dvc_template(repo: Path) -> Path:
    """.dvc/plots.html and `plots.html_template` in .dvc/config.local (a user's own template,
    set in .dvc/config or config.local, is left alone). Returns the template's path."""
    from dvc.config import Config

    dvc_dir = Path(repo) / ".dvc"
    if not dvc_dir.is_dir():
        raise FileNotFoundError(f"{repo} is not a DVC repository (no .dvc/)")
    path = dvc_dir / TEMPLATE
    text = dvc_template()
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        write_text(text, path)
    ignore = dvc_dir / ".gitignore"
    lines = ignore.read_text().splitlines() if ignore.is_file() else []
    if f"/{TEMPLATE}" not in lines:
        write_text("\n".join([*lines, f"/{TEMPLATE}"]) + "\n", ignore)
    config = Config(dvc_dir=str(dvc_dir))
    if not config.get("plots", {}).get("html_template"):
        with config.edit("local") as local:
            local.setdefault("plots", {})["html_template"] = TEMPLATE
    return path


def png(spec: dict, scale: float = 2.0) -> bytes:
    """A vega-lite chart as PNG, drawn by vega itself (no browser, no network)."""
    import vl_convert

    return vl_convert.vegalite_to_png(spec, scale=scale)
