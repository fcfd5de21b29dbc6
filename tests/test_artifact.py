"""The artifact contract (smelt.runtime.artifact): a compiled model's plan.json is written by one
writer and read back, validated, by one reader into the same typed plan; a recurrent node's
run-time dims travel as a typed field; a plan.json that does not fit the schema names its file
and field, and in the cache it is a damaged entry that is rebuilt with a CacheWarning."""

from __future__ import annotations

import copy
import json
import warnings

import numpy as np
import pytest
from helpers import assert_close, ort_run

import smelt
from smelt import cache
from smelt.codegen import toolchain
from smelt.compiler import build
from smelt.errors import ArtifactError
from smelt.frontend.zoo.builder import ModelBuilder
from smelt.frontend.zoo.rnn import lstm_model
from smelt.options import CompileOptions
from smelt.runtime import artifact
from smelt.runtime.artifact import DynamicDims, FallbackStepEntry, NativeBlockEntry


def _conv_model():
    """A small CNN with a forced fallback in the middle: two native blocks and a fallback step."""
    b = ModelBuilder(seed=3)
    x = b.input("x", [1, 3, 12, 12])
    y = b.relu(b.conv(x, 8, 3, pad=1, bias=True, name="conv1"))
    y = b.maxpool(y, 2, 2)
    y = b.op("Neg", [y], name="neg")
    y = b.relu(b.conv(y, 16, 3, pad=1, name="conv2"))
    b.output(b.gemm(b.flatten(b.global_avgpool(y)), 10, name="fc"), "logits")
    return b.build("artifact_cnn")


@pytest.fixture(scope="module")
def conv_build():
    proto = _conv_model()
    result = build(proto, {"x": [1, 3, 12, 12]}, CompileOptions(threads=1, force_fallback=frozenset({"neg"})))
    return proto, result


def test_conv_plan_round_trips(conv_build):
    _, result = conv_build
    plan = result.plan
    # the one reader gives back what the one writer wrote, through the file and through JSON
    assert artifact.load(result.directory) == plan
    text = (result.directory / artifact.PLAN_FILE).read_text()
    assert json.loads(text) == plan.to_json()
    assert artifact.from_json(json.loads(json.dumps(plan.to_json())), result.directory) == plan
    kinds = [type(s) for s in plan.steps]
    assert kinds == [NativeBlockEntry, FallbackStepEntry, NativeBlockEntry]
    (fb,) = plan.fallback_steps
    assert (fb.node, fb.op) == ("neg", "Neg") and fb.inputs and (result.directory / fb.model).exists()
    assert fb.outputs[0] is not None and fb.outputs[0].is_static
    convs = [i for i in plan.step_infos() if i.op == "Conv"]
    assert len(convs) == 2 and all(i.flops > 0 and i.schedule["template"] for i in convs)
    assert all(isinstance(d, int) for s in plan.inputs + plan.outputs for d in s.shape)
    assert plan.lib is not None and plan.lib_path(toolchain.cache_dir()) == result.lib_path
    assert json.loads(text)["version"] == artifact.SCHEMA_VERSION


def test_conv_plan_through_the_api(conv_build):
    proto, _ = conv_build
    compiled = smelt.compile(proto, threads=1, force_fallback=["neg"])
    x = np.random.default_rng(0).standard_normal((1, 3, 12, 12)).astype(np.float32)
    assert_close([compiled(x)], ort_run(proto, {"x": x}))
    assert compiled.fallback_report == [{"node": "neg", "op": "Neg", "reason": compiled.plan.fallback_steps[0].reason}]
    assert ("conv1", "Conv") in compiled.native_nodes
    assert compiled.arena_bytes == compiled.plan.arena_bytes + compiled.plan.scratch_bytes
    compiled.close()


def test_dynamic_lstm_dims_are_a_typed_field():
    model = lstm_model(8, 12, "B", "T")
    compiled = smelt.compile(model, threads=1, max_dims={"T": 8, "B": 4})
    rng = np.random.default_rng(2)
    for T, B in ((5, 3), (8, 1), (1, 4)):
        x = rng.standard_normal((T, B, 8)).astype(np.float32)
        assert_close(compiled.run({"x": x}), ort_run(model, {"x": x}), rel=1e-5)
    plan = compiled.plan
    dims = [d for b in plan.native_blocks for d in b.dynamic]
    assert len(dims) == 1
    (d,) = dims
    assert isinstance(d, DynamicDims) and (d.x, d.layout, d.max_t, d.max_b) == ("x", 0, 8, 4)
    assert sorted(map(list, d.outputs.values()), key=len) == [[1, "B", 12], ["T", 1, "B", 12]]
    assert d.output_shapes(5, 3) == {k: tuple(5 if v == "T" else 3 if v == "B" else v for v in s)
                                     for k, s in d.outputs.items()}
    # no JSON string in the schedule text any more
    assert all("dynamic" not in i.schedule and "{" not in "".join(i.schedule.values()) for i in plan.step_infos())
    assert plan.inputs[0].shape == (8, 4, 8)  # compiled for the bounds
    art = compiled._current()
    assert artifact.load(art.directory) == plan
    compiled.close()


def _mutations() -> list[tuple[str, str]]:
    return [("version", "missing"), ("version_old", "version"), ("arena_bytes_str", "arena_bytes"),
            ("profile_int", "profile"), ("flops_missing", "steps[0].step_info[0].flops"),
            ("schedule_value", "steps[0].step_info[0].schedule.template"), ("kind", "steps[1].kind"),
            ("fallback_model_path", "steps[1].model"), ("shape_float", "inputs[0].shape[1]"),
            ("dtype", "outputs[0].dtype"), ("not_an_object", None)]


def _mutate(data: dict, what: str):
    if what == "version":
        del data["version"]
    elif what == "version_old":
        data["version"] = 1
    elif what == "arena_bytes_str":
        data["arena_bytes"] = "4096"
    elif what == "profile_int":
        data["profile"] = 0
    elif what == "flops_missing":
        del data["steps"][0]["step_info"][0]["flops"]
    elif what == "schedule_value":
        data["steps"][0]["step_info"][0]["schedule"]["template"] = 3
    elif what == "kind":
        data["steps"][1]["kind"] = "gpu"
    elif what == "fallback_model_path":
        data["steps"][1]["model"] = "../../elsewhere.onnx"
    elif what == "shape_float":
        data["inputs"][0]["shape"][1] = 3.0
    elif what == "dtype":
        data["outputs"][0]["dtype"] = "float77"
    elif what == "not_an_object":
        return [data]
    return data


@pytest.mark.parametrize("what,field", _mutations())
def test_reader_error_names_file_and_field(conv_build, tmp_path, what, field):
    _, result = conv_build
    data = _mutate(copy.deepcopy(result.plan.to_json()), what)
    (tmp_path / artifact.PLAN_FILE).write_text(json.dumps(data))
    with pytest.raises(ArtifactError) as info:
        artifact.load(tmp_path)
    err = info.value
    assert str(tmp_path / artifact.PLAN_FILE) in str(err)
    if field == "missing":  # the field is "version", and the message says it is missing
        assert err.field == "version" and "missing" in str(err)
    else:
        assert err.field == field and (field is None or f"field {field}" in str(err))


def test_unreadable_plan_names_the_file(tmp_path):
    (tmp_path / artifact.PLAN_FILE).write_text('{"steps": [garbage')
    with pytest.raises(ArtifactError, match="plan.json.*unreadable") as info:
        artifact.load(tmp_path)
    assert info.value.field is None


@pytest.mark.parametrize("what", ["version_old", "flops_missing"])
def test_old_schema_or_misfit_plan_in_the_cache_is_rebuilt_with_a_warning(tmp_path, monkeypatch, what):
    """A plan.json whose checksum is right (the manifest is rewritten) but that does not fit the
    schema: the cache entry is damaged, a CacheWarning names the field, the model is rebuilt."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    proto = _conv_model()
    x = np.random.default_rng(1).standard_normal((1, 3, 12, 12)).astype(np.float32)
    first = smelt.compile(proto, threads=1, force_fallback=["neg"])
    want = first(x)
    directory = first._current().directory
    first.close()
    data = _mutate(json.loads((directory / artifact.PLAN_FILE).read_text()), what)
    (directory / artifact.PLAN_FILE).write_text(json.dumps(data))
    cache.write_manifest(directory)  # intact as far as the checksums go
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = smelt.compile(proto, threads=1, force_fallback=["neg"])
        got = again(x)
    messages = [str(w.message) for w in caught if issubclass(w.category, cache.CacheWarning)]
    field = "version" if what == "version_old" else "steps[0].step_info[0].flops"
    assert len(messages) == 1 and f"field {field}" in messages[0], messages
    assert again.from_cache is False
    np.testing.assert_array_equal(got, want)
    assert artifact.load(directory).to_json()["version"] == artifact.SCHEMA_VERSION  # rewritten whole
    again.close()
