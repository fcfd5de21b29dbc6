"""`smelt tune` end to end on a tiny model with a tiny budget."""

from __future__ import annotations

import onnx
import pytest
from tune_models import chain_model

from smelt.cli import main, parse_budget
from smelt.errors import SmeltError
from smelt.schedule.db import TuningDB
from smelt.target import detect


def test_parse_budget():
    assert parse_budget("30s") == 30 and parse_budget("10m") == 600 and parse_budget("1.5h") == 5400
    assert parse_budget("45") == 45
    for bad in ("", "10x", "-3m", "0s", "m"):
        with pytest.raises(SmeltError, match="--budget"):
            parse_budget(bad)


def test_bad_budget_is_a_clear_error(capsys):
    assert main(["tune", "zoo:resnet18", "--budget", "ten minutes"]) == 2
    assert "--budget" in capsys.readouterr().err


@pytest.mark.skipif(detect().isa not in ("avx512", "avx2"), reason="NCHWc needs AVX2/AVX-512")
def test_tune_tiny_model(tune_env, tmp_path, capsys):
    model, _ = chain_model(c=8, hw=(6, 7))
    path = tmp_path / "tiny.onnx"
    onnx.save(model, str(path))
    assert main(["tune", str(path), "--budget", "10s", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "distinct conv workloads" in out and "speedup" in out
    assert f"tuning database: {tune_env}" in out
    assert len(TuningDB(tune_env)) > 0


@pytest.mark.skipif("avx2" not in detect().isa_caps() or detect().isa == "avx2",
                    reason="needs a host above AVX2 to hold to it")
def test_tune_held_to_an_isa_stores_under_that_isa(tune_env, tmp_path, capsys):
    """`smelt tune --isa avx2` measures the AVX2 code and stores its records under the AVX2
    target's key, which is where a compile held to AVX2 looks them up."""
    model, _ = chain_model(c=8, hw=(6, 7))
    path = tmp_path / "tiny.onnx"
    onnx.save(model, str(path))
    assert main(["tune", str(path), "--budget", "10s", "--threads", "1", "--isa", "avx2"]) == 0
    assert "target avx2" in capsys.readouterr().out
    db = TuningDB(tune_env)
    keys = {r.target for r in db.records()}
    assert keys == {detect().narrowed("avx2").key()}, keys
