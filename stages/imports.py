"""The project's own source files a stage runs, from its import graph: every `import` and
`from ... import` of a project module (gocore, nets, play, stages, flows), at the top of a
module or inside a function (imports made when a function runs are code the stage runs too),
followed to the end. dvc.yaml's code deps are this set, so an edit to gocore/board.py reruns
every stage that reaches it through gocore/features.py, and nothing else.

An entry is a module (`stages.train`), a function of one (`flows.cli_play:gtp`, a command the
stage starts as a process of its own) or an object one builds (`flows.cli:app`, the command
line that process starts in): for a function, the module's top-level imports and those of the
function and of the module's functions it calls, not the module's every command; for an
object, the module's top-level imports.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent
PACKAGES = ("gocore", "nets", "play", "stages", "flows")


def module_file(name: str, root: Path = SOURCE) -> Path | None:
    """The file of a project module (a package's __init__.py), or None."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = root.joinpath(*name.split("."))
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _imported(node: ast.AST, root: Path) -> set[str]:
    """The project modules one import statement loads (with their parent packages)."""
    names = []
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        names = [node.module]
        # `from stages import cli`: stages.cli is a module of its own.
        names += [f"{node.module}.{a.name}" for a in node.names
                  if module_file(f"{node.module}.{a.name}", root)]  # fmt: skip
    out = set()
    for name in names:
        parts = name.split(".")
        for k in range(1, len(parts) + 1):  # importing a.b.c runs a and a.b first
            if module_file(".".join(parts[:k]), root):
                out.add(".".join(parts[:k]))
    return out


def _imports_in(nodes, root: Path) -> set[str]:
    out = set()
    for top in nodes:
        for node in ast.walk(top):
            out |= _imported(node, root)
    return out


def _entry_imports(entry: str, root: Path) -> set[str]:
    """The project modules an entry imports directly."""
    module, _, function = entry.partition(":")
    tree = _tree(module_file(module, root))
    if not function:
        return _imports_in(tree.body, root)
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    top = [n for n in tree.body if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    out = _imports_in(top, root)
    if function not in defs:
        names = {t.id for n in top if isinstance(n, ast.Assign) for t in n.targets
                 if isinstance(t, ast.Name)}  # fmt: skip
        if function not in names:
            raise ValueError(f"{entry}: {module} has no function or object {function}")
        return out  # an object the module builds as it is imported: its top level
    seen, todo = set(), [function]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        out |= _imports_in([defs[name]], root)
        called = {n.id for n in ast.walk(defs[name]) if isinstance(n, ast.Name)}
        todo += [c for c in called if c in defs]
    return out


@functools.cache
def code_files(entries: tuple[str, ...], root: Path = SOURCE) -> tuple[str, ...]:
    """Every project source file the entries reach, relative to `root`, sorted."""
    done: set[str] = set()
    todo = list(entries)
    while todo:
        entry = todo.pop()
        if entry in done:
            continue
        done.add(entry)
        parts = entry.partition(":")[0].split(".")
        todo += [".".join(parts[:k]) for k in range(1, len(parts))]  # its packages run first
        todo += [m for m in _entry_imports(entry, root) if m not in done]
    files = {module_file(e.partition(":")[0], root) for e in done}
    return tuple(sorted(str(f.relative_to(root)) for f in files if f is not None))
