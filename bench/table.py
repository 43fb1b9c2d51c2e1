"""The one printer of the benchmarks' tables. A table names its columns once (title, width,
where the value comes from, its number format), and its header and every row are made from
that list, so that a column's title, width and format cannot drift apart."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Column:
    title: str
    width: int
    value: str | Callable[[dict], object]  # a row's key, or a function of the row
    format: str = ""  # the value's format spec (",.0f", ".1%"), applied before the width
    align: str = ">"
    missing: str = "-"  # shown where the value is None
    gap: int = 1  # spaces before it (the first column's are not printed)

    def cell(self, row: dict) -> str:
        value = row[self.value] if isinstance(self.value, str) else self.value(row)
        text = self.missing if value is None else format(value, self.format)
        return format(text, f"{self.align}{self.width}")

    def head(self) -> str:
        return format(self.title, f"{self.align}{self.width}")


@dataclasses.dataclass(frozen=True)
class Table:
    columns: tuple[Column, ...]
    title: str = ""  # a line above the header, if any

    def header(self) -> str:
        head = self._line([c.head() for c in self.columns])
        return f"{self.title}\n{head}" if self.title else head

    def row(self, row: dict) -> str:
        return self._line([c.cell(row) for c in self.columns])

    def _line(self, cells: list[str]) -> str:
        spaced = [" " * c.gap + cell for c, cell in zip(self.columns, cells, strict=True)]
        return "".join(spaced)[self.columns[0].gap :].rstrip()

    def render(self, rows: list[dict], footer: str = "") -> str:
        lines = [self.header(), *(self.row(r) for r in rows)]
        return "\n".join(lines + ([footer] if footer else []))


def board_text(row: dict) -> str:
    """A row's board as "9x9"."""
    return f"{row['board']}x{row['board']}"
