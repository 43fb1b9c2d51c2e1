"""An MkDocs hook (mkdocs.yml's `hooks:`): the CLI reference page made from the typer app when
the site is built, with Typer's own Markdown generator (`typer ... utils docs`), so the page
says what `tengen --help` says and cannot drift from it."""

from __future__ import annotations

MARKER = "<!-- the commands, made by scripts/mkdocs_cli.py -->"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    import typer
    from typer.cli import get_docs_for_click

    from flows.cli import PANELS, app

    # The commands by use, as `tengen` lists them, then each command in full.
    panels: dict[str, list[str]] = {panel: [] for panel in PANELS}
    for info in [*app.registered_commands, *app.registered_groups]:
        name = info.name or info.callback.__name__
        panels.setdefault(info.rich_help_panel or "Other", []).append(f"`{name}`")
    uses = "\n".join(f"- **{panel}**: {', '.join(names)}" for panel, names in panels.items())
    command = typer.main.get_command(app)
    reference = get_docs_for_click(obj=command, ctx=typer.Context(command), indent=1,
                                   name="tengen")  # fmt: skip
    return markdown.replace(MARKER, f"{uses}\n\n{reference}")
