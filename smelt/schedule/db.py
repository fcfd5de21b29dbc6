"""The tuning database: measured schedules per (template kind, workload, target), in sqlite.

A record says "on this target, this workload of this template ran fastest with this
configuration, at this cost". Workloads are plain dicts of the numbers that define a kernel
(shapes, strides, pads, thread count); their canonical JSON is the key, so a ResNet-50 layer and
an identical layer of another model share one record. The schema carries a version: a database
written by an older smelt whose configurations no longer mean the same thing is ignored (its
records are kept, never read), never misread.

The default location is ``<cache dir>/tuning.sqlite``; ``SMELT_TUNING_DB`` overrides it (a path,
or ``off`` to disable lookups). Writers use one transaction per record, so concurrent tuners
cannot corrupt it; the last measurement of a (kind, workload, target) wins only if it is faster.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# Record kinds (who writes them: smelt.tune; who reads them: the schedule stage)
CONV_KIND = "conv_nchwc"  # an NCHWc conv's tile, when it beat the cost model's default
SCHEME_KIND = "conv_nchwc_scheme"  # best tile and time per (input block, output block): global search costs
TRANSFORM_KIND = "layout_transform"  # measured LayoutTransform times: global search costs
RNN_KIND = "rnn"  # a recurrence's thread grid (smelt.tune.rnn_calibrate)


def transform_key(n: int, c: int, h: int, w: int, src: int, dst: int, threads: int) -> dict:
    """The workload of a LayoutTransform record."""
    return {"n": n, "c": c, "h": h, "w": w, "src": src, "dst": dst, "threads": threads}


def fingerprint(db: TuningDB | None, target_key: str, kinds: tuple[str, ...]) -> str:
    """What a build read from the database (part of its artifact key): tuning rebuilds the
    models it affects."""
    return "" if db is None else "|".join(db.fingerprint(k, target_key) for k in kinds)


# Bump when a template's configuration fields change meaning; records of other versions are
# invisible to lookups.
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    version   INTEGER NOT NULL,
    kind      TEXT    NOT NULL,   -- template family, e.g. "conv_nchwc", "rnn"
    workload  TEXT    NOT NULL,   -- canonical JSON of the workload dict
    target    TEXT    NOT NULL,   -- Target.key()
    config    TEXT    NOT NULL,   -- canonical JSON of the chosen configuration
    cost_s    REAL    NOT NULL,   -- measured median seconds per call
    tried     INTEGER NOT NULL,   -- configurations measured to find it
    created   REAL    NOT NULL,
    PRIMARY KEY (version, kind, workload, target)
);
"""


def canonical(obj: dict) -> str:
    """Key text for a dict of numbers/strings: sorted keys, no spaces."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Record:
    kind: str
    workload: dict
    target: str
    config: dict
    cost_s: float
    tried: int
    created: float


def default_path() -> Path | None:
    """Where the database lives, or None when ``SMELT_TUNING_DB=off`` (``smelt.settings``)."""
    from smelt import settings

    return settings.tuning_db()


class TuningDB:
    """A sqlite file of tuning records (see the module docstring)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self._connect() as con:
                con.executescript(_SCHEMA)
        except sqlite3.OperationalError:
            raise  # locked or unwritable: a real error, not a broken file
        except sqlite3.DatabaseError as exc:
            raise ValueError(f"tuning database {self.path} is not a readable sqlite file: {exc}") from exc

    def _connect(self) -> sqlite3.Connection:
        # the default rollback journal: switching to WAL needs an exclusive lock that sqlite's busy
        # timeout does not wait for, so two processes opening a new database at once could fail;
        # writes are rare (one per tuned workload), so readers waiting on them cost nothing
        return sqlite3.connect(self.path, timeout=30.0)

    def lookup(self, kind: str, workload: dict, target: str) -> dict | None:
        """The stored configuration for this workload on this target, or None."""
        rec = self.record(kind, workload, target)
        return None if rec is None else rec.config

    def record(self, kind: str, workload: dict, target: str) -> Record | None:
        with self._connect() as con:
            row = con.execute(
                "SELECT config, cost_s, tried, created FROM records "
                "WHERE version = ? AND kind = ? AND workload = ? AND target = ?",
                (SCHEMA_VERSION, kind, canonical(workload), target)).fetchone()
        if row is None:
            return None
        return Record(kind, workload, target, json.loads(row[0]), row[1], row[2], row[3])

    def store(self, kind: str, workload: dict, target: str, config: dict, cost_s: float,
              tried: int = 1) -> bool:
        """Keep ``config`` unless a faster one is already stored; True when it was written."""
        if not (cost_s > 0):
            raise ValueError(f"tuning cost must be a positive number of seconds, got {cost_s!r}")
        key = (SCHEMA_VERSION, kind, canonical(workload), target)
        with self._connect() as con:
            con.execute("BEGIN IMMEDIATE")
            row = con.execute("SELECT cost_s FROM records WHERE version = ? AND kind = ? AND workload = ? "
                              "AND target = ?", key).fetchone()
            if row is not None and row[0] <= cost_s:
                return False
            con.execute("INSERT OR REPLACE INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (*key, canonical(config), float(cost_s), int(tried), time.time()))
        return True

    def records(self, kind: str | None = None) -> Iterator[Record]:
        """Every record of the current schema version (optionally of one kind)."""
        q = "SELECT kind, workload, target, config, cost_s, tried, created FROM records WHERE version = ?"
        args: tuple = (SCHEMA_VERSION,)
        if kind is not None:
            q += " AND kind = ?"
            args += (kind,)
        with self._connect() as con:
            rows = con.execute(q, args).fetchall()
        for k, w, t, c, cost, tried, created in rows:
            yield Record(k, json.loads(w), t, json.loads(c), cost, tried, created)

    def fingerprint(self, kind: str, target: str) -> str:
        """Changes whenever a record of ``kind`` for ``target`` is written (part of artifact keys,
        so a model compiled before tuning is rebuilt with the tuned schedules)."""
        with self._connect() as con:
            n, last = con.execute("SELECT COUNT(*), MAX(created) FROM records WHERE version = ? AND kind = ? "
                                  "AND target = ?", (SCHEMA_VERSION, kind, target)).fetchone()
        return f"{n}:{last or 0}"

    def __len__(self) -> int:
        with self._connect() as con:
            return int(con.execute("SELECT COUNT(*) FROM records WHERE version = ?",
                                   (SCHEMA_VERSION,)).fetchone()[0])


_opened: dict[Path, TuningDB] = {}


def open_default(create: bool = True) -> TuningDB | None:
    """The default database, or None when disabled. ``create=False`` (compiling: read only) also
    gives None while no database exists, so a plain compile never creates or locks one."""
    path = default_path()
    if path is None or (not create and path not in _opened and not path.exists()):
        return None
    if path not in _opened:
        _opened[path] = TuningDB(path)
    return _opened[path]
