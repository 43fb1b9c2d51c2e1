"""The training row: one self-play position, as a Parquet row. The schema lives here only;
the self-play writer and every reader (shuffle, train) use it.

Coordinates are the board's own: point (x, y) of an n x n board is index y * n + x (y = 0
the top row), a pass is index n * n. Values are from the side of the player to move. Every
page carries a CRC that readers verify, so a flipped bit is an error, not a wrong row.

| column          | type            | meaning                                                     |
|-----------------|-----------------|-------------------------------------------------------------|
| game_id         | string          | unique per game: g<generation>-s<seed>-<index>              |
| generation      | int32           | the self-play generation that played it                     |
| model_id        | string          | the network that played it ("uniform" at generation 0)      |
| turn            | int16           | moves played before this position (passes included)       |
| board_size      | int8            | n                                                           |
| rules           | string          | the rules preset (gocore.rules.PRESETS)                     |
| komi            | float32         | the game's komi                                             |
| to_move         | int8            | 1 Black, 2 White                                            |
| planes          | binary          | the 18 input planes, bit-packed (gocore.features.pack_planes)|
| globals         | float32[10]     | the 10 global inputs                                        |
| policy_target   | list<float32>   | n * n + 1: the root's visits after pruning, summing to 1    |
| policy_weight   | float32         | 1 for a full search (decided games less), 0 for a cheap one |
| opponent_move   | int16           | the opponent's reply (its index), -1 if the game ended      |
| outcome         | float32         | 1 win, -1 loss, 0 draw for the player to move; for a side   |
|                 |                 | position, the search's win value (-1..1)                    |
| final_score     | float32         | the final score, the player to move's lead                  |
| ownership       | list<int8>      | n * n: 1 the player to move's, -1 the opponent's, 0 neither |
| score_weight    | float32         | 1; 0 for a side position (score and ownership not known)    |
| value_weight    | float32         | 1, or the decided-game weight                               |
| visits          | int32           | the root's visits                                           |
| root_value      | float32         | the search's win value at the root, -1..1                   |
| root_score      | float32         | the search's expected lead at the root                      |
| game_length     | int16           | moves in the whole game (passes included)                   |
| game_end        | string          | how it ended: "passes" (two in a row), "move_limit", or     |
|                 |                 | "side" (a side position, stopped after its search)          |
| first_pass      | int16           | the turn of the game's first pass, -1 if none               |
| handicap        | int8            | the game's handicap stones (0 for an even game)             |

The last four are the game's, repeated on each of its rows, so that any folder of rows (a
generation's, a shuffled window's) says how its games went (stages.data).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gocore.atomic import atomic_path, sha256_file
from gocore.features import N_GLOBALS, packed_length
from stages.layout import MANIFEST

SCHEMA_VERSION = "2"  # 2: the game columns (game_length, game_end, first_pass, handicap)

SCHEMA = pa.schema(
    [
        pa.field("game_id", pa.string(), nullable=False),
        pa.field("generation", pa.int32(), nullable=False),
        pa.field("model_id", pa.string(), nullable=False),
        pa.field("turn", pa.int16(), nullable=False),
        pa.field("board_size", pa.int8(), nullable=False),
        pa.field("rules", pa.string(), nullable=False),
        pa.field("komi", pa.float32(), nullable=False),
        pa.field("to_move", pa.int8(), nullable=False),
        pa.field("planes", pa.binary(), nullable=False),
        pa.field("globals", pa.list_(pa.float32(), N_GLOBALS), nullable=False),
        pa.field("policy_target", pa.list_(pa.float32()), nullable=False),
        pa.field("policy_weight", pa.float32(), nullable=False),
        pa.field("opponent_move", pa.int16(), nullable=False),
        pa.field("outcome", pa.float32(), nullable=False),
        pa.field("final_score", pa.float32(), nullable=False),
        pa.field("ownership", pa.list_(pa.int8()), nullable=False),
        pa.field("score_weight", pa.float32(), nullable=False),
        pa.field("value_weight", pa.float32(), nullable=False),
        pa.field("visits", pa.int32(), nullable=False),
        pa.field("root_value", pa.float32(), nullable=False),
        pa.field("root_score", pa.float32(), nullable=False),
        pa.field("game_length", pa.int16(), nullable=False),
        pa.field("game_end", pa.string(), nullable=False),
        pa.field("first_pass", pa.int16(), nullable=False),
        pa.field("handicap", pa.int8(), nullable=False),
    ],
    metadata={"tengen.rows": SCHEMA_VERSION},
)


class ShardError(ValueError):
    """A Parquet shard that cannot be used: missing, truncated, corrupt, or another schema."""


def _lists(values: np.ndarray, widths: np.ndarray, arrow_type) -> pa.Array:
    """Rows of a padded 2-D array, each cut to its own width, as an Arrow list column."""
    offsets = np.concatenate([[0], np.cumsum(widths)]).astype(np.int32)
    keep = np.arange(values.shape[1])[None, :] < widths[:, None]
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values[keep], arrow_type))


def table_from_columns(
    cols: dict[str, np.ndarray], games: dict[str, np.ndarray], *, generation: int, model_id: str
):
    """A table in SCHEMA from the column arrays of gocore.selfplay (padded to the largest
    board) and `games`: each row's game columns (game_id, rules, komi, game_length, game_end,
    first_pass, handicap)."""
    sizes = cols["board_size"].astype(np.int64)
    planes = cols["planes"]
    packed = [planes[i, : packed_length(int(n))].tobytes() for i, n in enumerate(sizes)]
    return pa.table(
        {
            "game_id": pa.array(games["game_id"], pa.string()),
            "generation": pa.array(np.full(len(sizes), generation, np.int32)),
            "model_id": pa.array([model_id] * len(sizes), pa.string()),
            "turn": pa.array(cols["turn"].astype(np.int16)),
            "board_size": pa.array(sizes.astype(np.int8)),
            "rules": pa.array(games["rules"], pa.string()),
            "komi": pa.array(np.asarray(games["komi"], np.float32)),
            "to_move": pa.array(cols["to_move"].astype(np.int8)),
            "planes": pa.array(packed, pa.binary()),
            "globals": pa.FixedSizeListArray.from_arrays(
                pa.array(cols["globals"].astype(np.float32).ravel()), N_GLOBALS
            ),
            "policy_target": _lists(cols["policy_target"], sizes * sizes + 1, pa.float32()),
            "policy_weight": pa.array(cols["policy_weight"].astype(np.float32)),
            "opponent_move": pa.array(cols["opponent_move"].astype(np.int16)),
            "outcome": pa.array(cols["outcome"].astype(np.float32)),
            "final_score": pa.array(cols["final_score"].astype(np.float32)),
            "ownership": _lists(cols["ownership"], sizes * sizes, pa.int8()),
            "score_weight": pa.array(cols["score_weight"].astype(np.float32)),
            "value_weight": pa.array(cols["value_weight"].astype(np.float32)),
            "visits": pa.array(cols["visits"].astype(np.int32)),
            "root_value": pa.array(cols["root_value"].astype(np.float32)),
            "root_score": pa.array(cols["root_score"].astype(np.float32)),
            "game_length": pa.array(np.asarray(games["game_length"], np.int16)),
            "game_end": pa.array(games["game_end"], pa.string()),
            "first_pass": pa.array(np.asarray(games["first_pass"], np.int16)),
            "handicap": pa.array(np.asarray(games["handicap"], np.int8)),
        },
        schema=SCHEMA,
    )


def write_shard(table: pa.Table, path: str | Path) -> Path:
    """Write atomically (a temporary file in the same folder, then a rename)."""
    if not table.schema.equals(SCHEMA, check_metadata=False):
        raise ValueError(f"{path}: table does not have the rows schema")
    path = Path(path)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, **WRITE_OPTIONS)
    return path


WRITE_OPTIONS = {"compression": "zstd", "write_page_checksum": True}


def shard_bytes(table: pa.Table) -> bytes:
    """The file write_shard would write, as bytes: what a shard played on another machine
    sends back (byte for byte the file written here)."""
    if not table.schema.equals(SCHEMA, check_metadata=False):
        raise ValueError("table does not have the rows schema")
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **WRITE_OPTIONS)
    return sink.getvalue().to_pybytes()


def read_shard(
    path: str | Path, columns: list[str] | None = None, schema: pa.Schema = SCHEMA
) -> pa.Table:
    """Read one shard, checking it is whole and has this schema (or `schema`, for a stage's
    scratch files); ShardError naming the file."""
    path = Path(path)
    try:
        table = pq.read_table(path, columns=columns, page_checksum_verification=True)
    except FileNotFoundError:
        raise ShardError(f"shard {path} does not exist") from None
    except (pa.ArrowException, OSError, ValueError) as e:
        raise ShardError(f"shard {path} is corrupt or truncated ({e})") from None
    expected = schema if columns is None else pa.schema([schema.field(c) for c in columns])
    if not table.schema.equals(expected, check_metadata=False):
        raise ShardError(
            f"shard {path} does not have the rows schema (version {SCHEMA_VERSION}): "
            f"got {table.schema}"
        )
    return table


def shard_info(path: str | Path) -> int:
    """A shard's row count from its footer, checking the file is whole (every column chunk
    inside the file) and has this schema, without reading its rows; ShardError naming it."""
    path = Path(path)
    try:
        f = pq.ParquetFile(path)
        meta, schema = f.metadata, f.schema_arrow
        size = path.stat().st_size
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for c in range(group.num_columns):
                chunk = group.column(c)
                start = min(chunk.data_page_offset, chunk.dictionary_page_offset or 1 << 62)
                if start + chunk.total_compressed_size > size:
                    raise ShardError(f"shard {path} is truncated (a column ends past the file)")
    except FileNotFoundError:
        raise ShardError(f"shard {path} does not exist") from None
    except (pa.ArrowException, OSError, ValueError) as e:
        raise ShardError(f"shard {path} is corrupt or truncated ({e})") from None
    if not schema.equals(SCHEMA, check_metadata=False):
        raise ShardError(
            f"shard {path} does not have the rows schema (version {SCHEMA_VERSION}; a shard of an "
            "older tengen needs its self-play rerun)"
        )
    return meta.num_rows


class ShardWriter:
    """Rows appended to one shard in pieces (row groups), in this schema (or `schema`, for a
    stage's scratch files); the file is whole once closed (a stage writes it inside its
    temporary output folder)."""

    def __init__(self, path: str | Path, schema: pa.Schema = SCHEMA):
        self.path = Path(path)
        self.schema = schema
        self._writer = pq.ParquetWriter(
            self.path, schema, compression="zstd", write_page_checksum=True
        )

    def write(self, table: pa.Table) -> None:
        if not table.schema.equals(self.schema, check_metadata=False):
            raise ValueError(f"{self.path}: table does not have the rows schema")
        self._writer.write_table(table)

    def close(self) -> None:
        self._writer.close()


def list_shards(folder: str | Path) -> list[Path]:
    """The shards of a folder, in order (part-0.parquet, part-1.parquet, ...); other files
    (part-0-copy.parquet) are not shards."""
    named = (re.fullmatch(r"part-(\d+)\.parquet", p.name) for p in Path(folder).glob("part-*"))
    return [Path(folder) / m[0] for m in sorted((m for m in named if m), key=lambda m: int(m[1]))]


# A folder of shards (a generation's self-play, a window) has a manifest.json whose "files"
# list each shard's name, rows and SHA-256: readers check them before reading, so that a
# reader that does not verify Parquet's page checksums (polars) still never takes a changed
# or damaged shard.


def manifest_entries(shards: list[Path]) -> list[dict]:
    """The manifest's "files" of these (whole, just written) shards."""
    return [{"name": p.name, "rows": shard_info(p), "sha256": sha256_file(p)} for p in shards]


def manifest_shards(folder: str | Path) -> tuple[list[tuple[Path, int]], dict]:
    """The (shard, rows) its manifest lists, each checked: there, whole, in this schema, with
    the rows and SHA-256 listed; and the manifest. ShardError naming what is wrong."""
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise ShardError(f"manifest {path} does not exist") from None
    except OSError as e:
        raise ShardError(f"manifest {path} cannot be read ({e.strerror or e})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ShardError(f"manifest {path} is not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
        raise ShardError(f'manifest {path} does not list its shards (no "files")')
    out = []
    for entry in manifest["files"]:
        if not isinstance(entry, dict):
            raise ShardError(f"manifest {path} has a bad entry: {entry!r}")
        shard = Path(folder) / str(entry.get("name"))
        rows = shard_info(shard)
        if rows != entry.get("rows"):
            raise ShardError(
                f"shard {shard} holds {rows} rows, its manifest says {entry.get('rows')}"
            )
        if sha256_file(shard) != entry.get("sha256"):
            raise ShardError(
                f"shard {shard} is not the file its manifest names (its SHA-256 differs: changed "
                "or damaged)"
            )
        out.append((shard, rows))
    return out, manifest


# ---------------------------------------------------------------------------------------------
# Rows -> training arrays
# ---------------------------------------------------------------------------------------------


def _symmetric_index(n: int, sym: int) -> np.ndarray:
    """[n * n]: where each point index of an n x n board goes under symmetry `sym` (bit 0
    mirrors x, bit 1 mirrors y, bit 2 then transposes: gocore.features.symmetric_xy)."""
    y, x = np.divmod(np.arange(n * n), n)
    if sym & 1:
        x = n - 1 - x
    if sym & 2:
        y = n - 1 - y
    if sym & 4:
        x, y = y, x
    return y * n + x


def training_arrays(table: pa.Table, tensor: int, symmetry: np.ndarray) -> dict[str, np.ndarray]:
    """The rows of `table` as the network's inputs and the loss's targets (nets.losses), each
    board in the top-left of a tensor x tensor plane and turned by its row's symmetry (0..7):
    planes [B, 18, T, T], globals [B, 10], policy_target [B, T*T + 1], opponent_move [B]
    (T-layout index, -1 for none), outcome [B, 3] (win, loss, no result), final_score,
    ownership [B, T, T], and the
    policy, value and score weights [B]."""
    from gocore.features import N_PLANES, unpack_planes

    b = table.num_rows
    sizes = table.column("board_size").to_numpy().astype(np.int64)
    if b and sizes.max() > tensor:
        raise ValueError(f"a {sizes.max()}x{sizes.max()} row does not fit a {tensor} tensor")
    planes = np.zeros((b, N_PLANES, tensor, tensor), np.float32)
    policy = np.zeros((b, tensor * tensor + 1), np.float32)
    ownership = np.zeros((b, tensor, tensor), np.float32)
    opponent = np.full(b, -1, np.int64)
    packed = table.column("planes").to_numpy(zero_copy_only=False)
    policy_lists = table.column("policy_target").combine_chunks()
    owner_lists = table.column("ownership").combine_chunks()
    policy_flat = policy_lists.flatten().to_numpy()
    owner_flat = owner_lists.flatten().to_numpy()
    policy_at = policy_lists.offsets.to_numpy()
    owner_at = owner_lists.offsets.to_numpy()
    reply = table.column("opponent_move").to_numpy().astype(np.int64)
    for n in np.unique(sizes):
        n = int(n)
        area = n * n
        grid = (np.arange(area) // n) * tensor + np.arange(area) % n  # local -> tensor index
        for sym in np.unique(symmetry[sizes == n]):
            rows = np.flatnonzero((sizes == n) & (symmetry == sym))
            moved = _symmetric_index(n, int(sym))
            raw = np.frombuffer(b"".join(packed[rows]), np.uint8).reshape(len(rows), -1)
            local = unpack_planes(raw, n).reshape(len(rows), N_PLANES, area)
            turned = np.zeros_like(local)
            turned[:, :, moved] = local
            planes[rows, :, :n, :n] = turned.reshape(len(rows), N_PLANES, n, n)
            target = policy_flat[policy_at[rows][:, None] + np.arange(area + 1)[None, :]]
            policy[rows[:, None], grid[moved][None, :]] = target[:, :area]
            policy[rows, tensor * tensor] = target[:, area]
            owned = owner_flat[owner_at[rows][:, None] + np.arange(area)[None, :]]
            ownership.reshape(b, -1)[rows[:, None], grid[moved][None, :]] = owned
            r = reply[rows]
            on_board = (r >= 0) & (r < area)
            opponent[rows] = np.where(
                on_board, grid[moved][np.clip(r, 0, area - 1)], np.where(r == area, tensor**2, -1)
            )
    outcome = table.column("outcome").to_numpy().astype(np.float32)
    return {
        "planes": planes,
        "globals": table.column("globals")
        .combine_chunks()
        .flatten()
        .to_numpy()
        .astype(np.float32)
        .reshape(b, -1),
        "policy_target": policy,
        "policy_weight": table.column("policy_weight").to_numpy().astype(np.float32),
        "opponent_move": opponent,
        "outcome": np.stack([(1 + outcome) / 2, (1 - outcome) / 2, np.zeros(b, np.float32)], 1),
        "final_score": table.column("final_score").to_numpy().astype(np.float32),
        "ownership": ownership,
        "value_weight": table.column("value_weight").to_numpy().astype(np.float32),
        "score_weight": table.column("score_weight").to_numpy().astype(np.float32),
    }
