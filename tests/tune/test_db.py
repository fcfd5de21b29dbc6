"""The tuning database: store/lookup, keep-faster, schema versions, bad files, fingerprints."""

from __future__ import annotations

import sqlite3

import pytest

from smelt.schedule import db as dbmod
from smelt.schedule.db import TuningDB

WL = {"n": 1, "c": 16, "h": 8, "w": 8, "oc": 32, "kh": 3, "kw": 3, "ib": 16, "threads": 2}


def test_store_and_lookup(tmp_path):
    db = TuningDB(tmp_path / "t.sqlite")
    assert db.lookup("conv_nchwc", WL, "tgt") is None
    assert db.store("conv_nchwc", WL, "tgt", {"oc_bn": 16, "reg_n": 7}, 1e-3, tried=5)
    assert db.lookup("conv_nchwc", WL, "tgt") == {"oc_bn": 16, "reg_n": 7}
    # key order of the workload does not matter; target and kind do
    assert db.lookup("conv_nchwc", dict(reversed(list(WL.items()))), "tgt") == {"oc_bn": 16, "reg_n": 7}
    assert db.lookup("conv_nchwc", WL, "other") is None
    assert db.lookup("rnn", WL, "tgt") is None
    rec = db.record("conv_nchwc", WL, "tgt")
    assert rec is not None and rec.tried == 5 and rec.cost_s == 1e-3
    assert len(db) == 1 and [r.config for r in db.records("conv_nchwc")] == [{"oc_bn": 16, "reg_n": 7}]


def test_keeps_the_faster(tmp_path):
    db = TuningDB(tmp_path / "t.sqlite")
    assert db.store("conv_nchwc", WL, "tgt", {"reg_n": 1}, 2e-3)
    assert not db.store("conv_nchwc", WL, "tgt", {"reg_n": 2}, 3e-3)  # slower: ignored
    assert db.lookup("conv_nchwc", WL, "tgt") == {"reg_n": 1}
    assert db.store("conv_nchwc", WL, "tgt", {"reg_n": 3}, 1e-3)
    assert db.lookup("conv_nchwc", WL, "tgt") == {"reg_n": 3}
    with pytest.raises(ValueError, match="positive"):
        db.store("conv_nchwc", WL, "tgt", {"reg_n": 4}, 0.0)


def test_other_schema_versions_are_invisible(tmp_path, monkeypatch):
    path = tmp_path / "t.sqlite"
    db = TuningDB(path)
    monkeypatch.setattr(dbmod, "SCHEMA_VERSION", dbmod.SCHEMA_VERSION + 1)
    db.store("conv_nchwc", WL, "tgt", {"reg_n": 9}, 1e-3)  # written by a "newer" smelt
    monkeypatch.setattr(dbmod, "SCHEMA_VERSION", dbmod.SCHEMA_VERSION - 1)
    assert db.lookup("conv_nchwc", WL, "tgt") is None and len(db) == 0
    with sqlite3.connect(path) as con:  # kept, never misread
        assert con.execute("SELECT COUNT(*) FROM records").fetchone()[0] == 1


def test_bad_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "not-a-db.sqlite"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ValueError, match="not-a-db.sqlite"):
        TuningDB(bad)


def test_fingerprint_changes_on_write(tmp_path):
    db = TuningDB(tmp_path / "t.sqlite")
    fp0 = db.fingerprint("conv_nchwc", "tgt")
    db.store("conv_nchwc", WL, "tgt", {"reg_n": 1}, 2e-3)
    fp1 = db.fingerprint("conv_nchwc", "tgt")
    db.store("conv_nchwc", {**WL, "ib": 8}, "tgt", {"reg_n": 1}, 2e-3)
    fp2 = db.fingerprint("conv_nchwc", "tgt")
    assert len({fp0, fp1, fp2}) == 3
    db.store("conv_nchwc_scheme", WL, "tgt", {"reg_n": 1}, 2e-3)  # another kind: unchanged
    assert db.fingerprint("conv_nchwc", "tgt") == fp2
    assert db.fingerprint("conv_nchwc", "other-target") == fp0


def test_default_path_env(tmp_path, monkeypatch):
    monkeypatch.setenv("SMELT_TUNING_DB", str(tmp_path / "x.sqlite"))
    assert dbmod.default_path() == tmp_path / "x.sqlite"
    monkeypatch.setenv("SMELT_TUNING_DB", "off")
    assert dbmod.default_path() is None and dbmod.open_default() is None


def test_compiling_reads_but_never_creates_the_database(tmp_path, monkeypatch):
    """Compiles only read the database: with none on disk they neither create nor lock one (two
    processes compiling at once used to race on creating it)."""
    from smelt.schedule import db as dbmod

    path = tmp_path / "tuning.sqlite"
    monkeypatch.setenv("SMELT_TUNING_DB", str(path))
    monkeypatch.setattr(dbmod, "_opened", {})
    assert dbmod.open_default(create=False) is None and not path.exists()
    created = dbmod.open_default()
    assert created is not None and path.exists()
    assert dbmod.open_default(create=False) is created
