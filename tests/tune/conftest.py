"""Fixtures of the tuning tests: a private cache directory and tuning database per test."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tune_models.py (tests use --import-mode=importlib)


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory):
    # one compile cache for the whole directory: the tests share measurement libraries
    return tmp_path_factory.mktemp("smelt-tune-cache")


@pytest.fixture
def tune_env(tmp_path, monkeypatch, shared_cache):
    """SMELT_CACHE_DIR shared, SMELT_TUNING_DB a fresh file; returns the database path."""
    from smelt.schedule import db as dbmod

    path = tmp_path / "tuning.sqlite"
    monkeypatch.setenv("SMELT_CACHE_DIR", str(shared_cache))
    monkeypatch.setenv("SMELT_TUNING_DB", str(path))
    monkeypatch.setattr(dbmod, "_opened", {})
    return path
