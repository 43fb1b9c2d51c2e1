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

    from flows.cli import app

    command = typer.main.get_command(app)
    reference = get_docs_for_click(obj=command, ctx=typer.Context(command), indent=1,
                                   name="tengen")  # fmt: skip
    return markdown.replace(MARKER, reference)
