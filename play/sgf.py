"""SGF (FF[4]) game records: read, write, and replay through the rules engine.

Parsing and serialising are sgfmill's; this module maps records to tengen's terms (points are
(x, y) with y = 0 the top row, None a pass) and gives errors that name the file and the move.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
from pathlib import Path

from sgfmill import sgf as sgfmill_sgf

from gocore.atomic import write_bytes
from gocore.board import BLACK, MAX_SIZE, MIN_SIZE, WHITE
from gocore.rules import Rules, rules_from_sgf
from play.game import Game, IllegalMoveError, Move, Point

_COLOUR = {"b": BLACK, "w": WHITE}
_SGF_COLOUR = {BLACK: "b", WHITE: "w"}


class SgfError(ValueError):
    """A record that cannot be read or replayed; the message names the source and the place."""


@dataclasses.dataclass
class GameRecord:
    """The main line of a game record."""

    size: int = 19
    komi: float = 7.5
    komi_given: bool = True  # False: the file has no KM[] (komi above is then 0)
    rules: str | None = None  # RU[] as written
    handicap: int = 0
    setup: list[tuple[int, Point]] = dataclasses.field(default_factory=list)  # root AB/AW
    first_player: int | None = None  # PL[]
    moves: list[tuple[int, Move]] = dataclasses.field(default_factory=list)
    comments: list[str | None] = dataclasses.field(default_factory=list)  # one per move
    result: str | None = None  # RE[]
    black: str | None = None  # PB[]
    white: str | None = None  # PW[]
    root_comment: str | None = None
    # Other root properties, raw SGF values (escapes kept), written back as they came.
    extra: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    source: str = "<sgf>"

    def game_rules(self, rules: Rules | None = None) -> Rules:
        """The rules to replay under: `rules` if given, else those RU[] names, with this komi."""
        return (
            rules.with_komi(self.komi)
            if rules is not None
            else rules_from_sgf(self.rules, komi=self.komi)
        )


MAX_SGF_BYTES = 8 << 20  # far beyond any game record: 19x19 with every variation of a book


def read_sgf(path: str | os.PathLike, *, max_bytes: int = MAX_SGF_BYTES) -> GameRecord:
    """A game record from a regular file of at most `max_bytes` (a FIFO, a device or a huge
    file is refused rather than read: an engine must not hang on `loadsgf /dev/zero`)."""
    path = Path(path)
    try:
        with open(path, "rb", opener=_open_regular) as f:
            if os.fstat(f.fileno()).st_size > max_bytes:
                raise SgfError(f"{path}: larger than {max_bytes >> 20} MB: not a game record")
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise SgfError(f"{path}: cannot read: {e.strerror}") from None
    if len(data) > max_bytes:
        raise SgfError(f"{path}: larger than {max_bytes >> 20} MB: not a game record")
    return parse_sgf(data, source=str(path))


def _open_regular(path, flags):
    """Open without blocking (a FIFO with no writer would wait forever), then refuse what is
    not a regular file."""
    fd = os.open(path, flags | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file")
    os.set_blocking(fd, True)
    return fd


def parse_sgf(data: bytes | str, *, source: str = "<sgf>") -> GameRecord:
    """Parse an SGF game record (the first game of a collection, its main line)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    try:
        game = sgfmill_sgf.Sgf_game.from_bytes(data)
    except ValueError as e:
        raise SgfError(f"{source}: malformed SGF: {e}") from None
    root = game.get_root()
    try:
        size = game.get_size()
    except ValueError as e:
        raise SgfError(f"{source}: bad SZ property: {e}") from None
    if not MIN_SIZE <= size <= MAX_SIZE:
        raise SgfError(f"{source}: board size {size} is not supported ({MIN_SIZE}..{MAX_SIZE})")
    record = GameRecord(size=size, source=source)
    komi = _komi(root, source)
    record.komi, record.komi_given = (0.0, False) if komi is None else (komi, True)
    record.rules = _text(root, "RU")
    record.result = _text(root, "RE")
    record.black = _text(root, "PB")
    record.white = _text(root, "PW")
    record.root_comment = _text(root, "C")
    if root.has_property("HA"):
        try:
            record.handicap = int(root.get("HA"))
        except ValueError:
            raise SgfError(f"{source}: bad HA property {root.get_raw('HA')!r}") from None
    if root.has_property("PL"):
        record.first_player = _COLOUR[root.get("PL")]
    try:
        black, white, empty = root.get_setup_stones()
    except ValueError as e:
        raise SgfError(f"{source}: bad setup stones in the root node: {e}") from None
    if empty:
        raise SgfError(f"{source}: AE (clearing points) in the root node is not supported")
    record.setup = [(BLACK, _point(rc, size)) for rc in sorted(black)] + [
        (WHITE, _point(rc, size)) for rc in sorted(white)
    ]
    known = {
        "SZ",
        "KM",
        "KO",
        "RU",
        "RE",
        "PB",
        "PW",
        "C",
        "HA",
        "PL",
        "AB",
        "AW",
        "AE",
        "FF",
        "GM",
        "CA",
        "AP",
    }
    record.extra = {
        ident: [v.decode("utf-8", "replace") for v in root.get_raw_list(ident)]
        for ident in root.properties()
        if ident not in known
    }
    for number, node in enumerate(game.get_main_sequence()[1:], start=1):
        if node.has_setup_stones():
            raise SgfError(
                f"{source}: node {number} adds or removes stones (AB/AW/AE) after the root; "
                "only moves are supported there"
            )
        try:
            colour, rc = node.get_move()
        except ValueError:
            ident = "B" if node.has_property("B") else "W"
            raw = node.get_raw(ident).decode("ascii", "replace")
            raise SgfError(
                f"{source}: node {number}: bad move {ident}[{raw}] on a {size}x{size} board"
            ) from None
        if colour is None:
            continue
        record.moves.append((_COLOUR[colour], None if rc is None else _point(rc, size)))
        record.comments.append(_text(node, "C"))
    return record


def _text(node, ident: str) -> str | None:
    if not node.has_property(ident):
        return None
    value = node.get(ident)
    return value if value != "" else None


def _komi(root, source: str) -> float | None:
    # KM is FF[4]'s komi; some files (e.g. from YuanYu) write it as KO[] instead.
    for ident in ("KM", "KO"):
        if root.has_property(ident):
            raw = root.get_raw(ident).decode("ascii", "replace").strip()
            if raw == "":
                continue
            try:
                return float(raw)
            except ValueError:
                raise SgfError(f"{source}: bad komi {ident}[{raw}]") from None
    return None


def _point(rc: tuple[int, int], size: int) -> Point:
    """sgfmill's (row, col), row 0 at the bottom, as tengen's (x, y), y = 0 at the top."""
    row, col = rc
    return col, size - 1 - row


def _rc(p: Point, size: int) -> tuple[int, int]:
    x, y = p
    return size - 1 - y, x


def replay(record: GameRecord, rules: Rules | None = None, *, upto: int | None = None) -> Game:
    """The game after its setup and its first `upto` moves (all by default), under `rules`
    (default: the record's). An illegal move raises SgfError naming the file and move number.
    """
    game = Game(record.size, record.game_rules(rules))
    for color, p in record.setup:
        try:
            game.add_setup_stones(color, [p])
        except IllegalMoveError as e:
            raise SgfError(f"{record.source}: setup stone {p} is invalid ({e.reason})") from None
    if record.first_player is not None:
        game.set_to_move(record.first_player)
    elif record.setup and all(c == BLACK for c, _ in record.setup) and record.handicap >= 2:
        game.set_to_move(WHITE)
    moves = record.moves if upto is None else record.moves[:upto]
    for number, (color, move) in enumerate(moves, start=1):
        try:
            game.play(color, move)
        except IllegalMoveError as e:
            raise SgfError(
                f"{record.source}: move {number} ({'B' if color == BLACK else 'W'} "
                f"{to_sgf_point(move, record.size) or 'pass'}) is illegal: {e.reason}"
            ) from None
    return game


def to_sgf_point(p: Move, size: int) -> str:
    if p is None:
        return ""
    x, y = p
    return "abcdefghijklmnopqrstuvwxyz"[x] + "abcdefghijklmnopqrstuvwxyz"[y]


def record_from_game(game: Game, **fields) -> GameRecord:
    """A record of a Game's setup and moves; `fields` fill the rest (result, players, ...)."""
    record = GameRecord(
        size=game.size,
        komi=game.komi,
        rules=game.rules.name,
        setup=list(game.setup),
        moves=list(game.moves),
        handicap=sum(1 for c, _ in game.setup if c == BLACK) if game.setup else 0,
    )
    for key, value in fields.items():
        setattr(record, key, value)
    return record


def write_sgf(record: GameRecord) -> bytes:
    """Serialise a record as FF[4] (UTF-8)."""
    game = sgfmill_sgf.Sgf_game(record.size, encoding="UTF-8")
    root = game.get_root()
    root.set("AP", ("tengen", "0.1"))
    root.set("KM", record.komi)
    for ident, value in (
        ("RU", record.rules),
        ("RE", record.result),
        ("PB", record.black),
        ("PW", record.white),
        ("C", record.root_comment),
    ):
        if value:
            root.set(ident, value)
    if record.handicap >= 2:
        root.set("HA", record.handicap)
    if record.first_player is not None:
        root.set("PL", _SGF_COLOUR[record.first_player])
    for ident, values in record.extra.items():
        root.set_raw_list(ident, [v.encode("utf-8") for v in values])
    if record.setup:
        black = {_rc(p, record.size) for c, p in record.setup if c == BLACK}
        white = {_rc(p, record.size) for c, p in record.setup if c == WHITE}
        root.set_setup_stones(black, white)
    comments = record.comments + [None] * (len(record.moves) - len(record.comments))
    for (color, move), comment in zip(record.moves, comments, strict=True):
        node = game.extend_main_sequence()
        if move is None:
            node.set_raw(_SGF_COLOUR[color].upper(), b"")  # FF[4]'s pass; sgfmill would write [tt]
        else:
            node.set_move(_SGF_COLOUR[color], _rc(move, record.size))
        if comment:
            node.set("C", comment)
    return game.serialise()


def save_sgf(record: GameRecord, path: str | os.PathLike) -> Path:
    """Write atomically: a temporary file in the same folder, then a rename."""
    return write_bytes(write_sgf(record), path)
