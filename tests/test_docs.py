"""The documents: README.md is the front door (short, every link resolving), docs/ builds into
the MkDocs site with no broken link or anchor (`mkdocs build --strict`), and the site's CLI
reference holds every command of the typer app."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import typer

from flows.cli import PANELS, app
from tests.conftest import REPO

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _slug(heading: str) -> str:
    """MkDocs's toc slug of a heading (and GitHub's, for the headings we write)."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return re.sub(r"\s+", "-", text)


def _anchors(markdown: Path) -> set[str]:
    headings = re.findall(r"^#+\s+(.+?)\s*$", markdown.read_text(), flags=re.M)
    return {_slug(h) for h in headings}


def test_the_readme_is_a_front_door_whose_links_all_resolve():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert "make run" in text and "make test" in text
    links = [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]
    assert links, "the README links into docs/"
    for target in links:
        path, _, anchor = target.partition("#")
        resolved = (REPO / path).resolve() if path else REPO / "README.md"
        assert REPO in resolved.parents or resolved == REPO, f"{target}: outside the repository"
        assert resolved.exists(), f"README.md links to {target}, which does not exist"
        if anchor and resolved.suffix == ".md":
            assert anchor in _anchors(resolved), f"README.md: no heading #{anchor} in {path}"


def test_the_docs_site_builds_strictly_with_the_whole_cli_reference(tmp_path):
    # --strict: a broken link, image or anchor between the pages, a page missing from the
    # nav or a nav entry without its page fails the build (mkdocs.yml's validation).
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr[-3000:]
    page = (site / "cli" / "index.html").read_text()
    command = typer.main.get_command(app)

    def names(group, prefix="tengen"):
        for name, sub in group.commands.items():
            yield f"{prefix} {name}"
            if hasattr(sub, "commands"):
                yield from names(sub, f"{prefix} {name}")

    every = list(names(command))
    assert {"tengen run", "tengen check", "tengen gtp", "tengen bench selfplay"} <= set(every)
    for name in every:
        assert f"<code>{name}</code>" in page, f"the CLI reference lacks {name}"
    assert "--generations" in page  # the options too
    # The commands by use, as `tengen` lists them: every one in one of the panels.
    for info in [*app.registered_commands, *app.registered_groups]:
        assert info.rich_help_panel in PANELS, f"{info.name}: no panel of {PANELS}"
    assert "<strong>Train</strong>: <code>run</code>, <code>check</code>" in page
