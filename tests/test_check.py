"""smelt check: agreement, localizing a planted wrong answer, fallback nodes, symbolic dims, the
onnx.reference path, compile(check=...), the CLI.

The wrong answers are planted in smelt, not in the reference: a broken template for one node
(put ahead of the real ones in the registry, accepting only that node), or a fallback runner that
adds to one node's output. Each test uses its own cache directory, so a broken build is never
cached where another test (or a user) could load it.
"""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np
import onnx
import pytest
from helpers import const, make_model, tensor
from onnx import helper

import smelt
from smelt import cli
from smelt.check import CheckError, CheckWarning, Tolerance, check_compiled, compare
from smelt.codegen import registry


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path / "cache"))


def conv_model(batch: int | str = 1, planted: str = "target") -> onnx.ModelProto:
    """x -> Conv(+bias) -> Relu -> Sin(``planted``) -> Mul -> Tanh -> Add(x-shaped residual) -> y,
    plus a second output read from the Mul; the Conv+Relu is a fused group in smelt."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32) * 0.3
    b = rng.standard_normal(8).astype(np.float32) * 0.1
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Sin", ["r"], ["s"], name=planted),
        helper.make_node("Mul", ["s", "k"], ["m"], name="mul"),
        helper.make_node("Tanh", ["m"], ["t"], name="tanh"),
        helper.make_node("Add", ["t", "r"], ["y"], name="add"),
        helper.make_node("Neg", ["m"], ["z"], name="neg"),
    ]
    return make_model(nodes, [tensor("x", [batch, 4, 6, 6])], [tensor("y", None), tensor("z", None)],
                      [const("w", w), const("b", b), const("k", np.float32(1.5))])


def plant_broken(monkeypatch, op: str, node_name: str, add: float = 0.5, unless_observed: bool = False) -> None:
    """Make smelt compute ``op`` wrong (``+ add``) at node ``node_name`` only: a template ahead of
    the real ones whose check takes that node alone (``unless_observed``: only while its output
    is not a graph output, like a fault in how an unobserved value is stored)."""
    registry._load_all()

    def check(n, g):
        if n.name != node_name:
            return "not the planted node"
        out = n.outputs[0]  # observed: a graph output, or read by the transform to one as well
        observed = out in g.outputs or len(g.consumers().get(out, [])) > 1
        return "observed" if unless_observed and observed else None

    def emit(node, g, em):
        x, y = node.inputs[0], node.outputs[0]
        n = int(g.values[y].size)
        em.step(f"const float *X = {em.ptr(x)}; float *Y = (float *){em.ptr(y)};\n"
                f"if (tid == 0) for (long i = 0; i < {n}; i++) Y[i] = sinf(X[i]) + {add}f;")

    broken = registry.Template("broken_sin", (op,), None,
                               check, emit,
                               blocked=True)  # flat indexing is right in any layout: one input, same shape
    monkeypatch.setitem(registry._REGISTRY, op, [broken, *registry._REGISTRY.get(op, [])])


def test_compare_scales_by_magnitude_and_checks_nonfinite():
    tol = Tolerance(1e-4, 1e-6)
    ref = np.array([1000.0, 1e-3, 0.0], np.float32)
    # an error of 1e-2 on a 1e-3 element is fine next to a 1000 (summation order), not alone
    assert compare("v", ref, ref + np.float32([0, 1e-2, 0]), tol).ok
    assert not compare("v", ref[1:2], ref[1:2] + np.float32(1e-2), tol).ok
    nan = np.array([np.nan, 1.0, np.inf], np.float32)
    assert compare("v", nan, nan.copy(), tol).ok
    c = compare("v", nan, np.array([np.nan, 1.0, -np.inf], np.float32), tol)
    assert not c.ok and not c.nonfinite_agree and c.first_bad == [2]
    assert not compare("v", np.zeros(3, np.float32), np.zeros(4, np.float32), tol).ok
    assert not compare("i", np.arange(3), np.arange(3) + np.array([0, 0, 1]), tol).ok


def test_agreeing_model_passes_clean():
    report = smelt.check(conv_model())
    assert report.ok and report.culprit is None and report.compiles == 0
    assert [c.name for c in report.outputs] == ["y", "z"]
    assert all(c.max_rel < 1e-5 for c in report.outputs)
    assert report.reference.startswith("onnxruntime")
    assert "OK: all 2 outputs agree" in report.format_text()


def test_planted_wrong_node_is_named(monkeypatch):
    plant_broken(monkeypatch, "Sin", "target")
    model = smelt.compile(conv_model())
    report = check_compiled(model)
    assert not report.ok
    c = report.culprit
    assert c is not None and c.node == "target" and c.op == "Sin" and c.position == 2
    assert c.execution == "native" and c.template == "broken_sin" and c.reproduced
    assert report.compiles == 1  # small model: every written value observed in one probe
    (out,) = c.outputs
    assert not out.comparison.ok and abs(out.comparison.max_abs - 0.5) < 1e-3
    (inp,) = c.inputs  # its input, the fused Conv+Relu's output, agrees
    assert inp.name == "r" and inp.comparison.ok
    text = report.format_text()
    assert "first diverging node: 'target' (Sin)" in text and "template broken_sin" in text
    assert json.loads(report.to_json())["culprit"]["node"] == "target"


def test_bisection_finds_the_same_node(monkeypatch):
    plant_broken(monkeypatch, "Sin", "target")
    report = check_compiled(smelt.compile(conv_model()), observe_bytes=0)
    assert report.culprit is not None and report.culprit.node == "target"
    assert report.strategy.startswith("bisection") and report.culprit.reproduced
    assert 2 <= report.compiles <= 4  # log2 of the 5 clean cuts (7 nodes), then one confirming probe


def test_a_fault_that_observing_hides_is_not_blamed_silently(monkeypatch):
    """The planted node answers wrong only while its output is not observed: the all-at-once probe
    agrees, bisection brackets the node after it, and the confirming probe (which observes the
    planted node's output, as that node's input) agrees: the report says so and names the
    suspect value instead of claiming a confirmed culprit."""
    plant_broken(monkeypatch, "Sin", "target", unless_observed=True)
    report = check_compiled(smelt.compile(conv_model()))
    assert not report.ok
    assert any("observing every value at once made the outputs agree" in n for n in report.notes)
    c = report.culprit
    assert c is not None and not c.reproduced
    assert any("not confirmed" in n and "'s'" in n for n in report.notes)


def test_fused_group_is_named_with_what_it_covers(monkeypatch):
    """The Relu is fused into the Conv: the Conv's own output is never written, so the first
    diverging value is the Relu's, computed by compiled node 'conv', whose group covers the Conv.
    (The Conv is forced to the fallback, which runs it with its fused epilogue, and that fallback
    is made to answer wrong.)"""
    from smelt.runtime import module

    original = module._FallbackRunner.run

    def wrong(self, env):
        original(self, env)
        if self.model.graph.node[0].name == "conv":
            out = self.model.graph.output[0].name
            env[out] = env[out] + np.float32(1.0)

    monkeypatch.setattr(module._FallbackRunner, "run", wrong)
    report = check_compiled(smelt.compile(conv_model(), force_fallback=["conv"]))
    c = report.culprit
    assert c is not None and c.node == "relu" and c.compiled_node == "conv" and c.compiled_op == "Conv"
    assert c.epilogue == ["Relu"] and c.covers == ["conv"] and c.execution == "fallback"
    assert [v.note for v in c.inputs] == ["not observable: fused into a compiled node"]
    assert [f["node"] for f in report.fallback] == ["conv"]


def test_fallback_node_reported_as_fallback(monkeypatch):
    from smelt.runtime import module

    original = module._FallbackRunner.run

    def wrong(self, env):  # the fallback of node "target" answers wrong
        original(self, env)
        if self.model.graph.node[0].name == "target":
            out = self.model.graph.output[0].name
            env[out] = env[out] * np.float32(2.0)

    monkeypatch.setattr(module._FallbackRunner, "run", wrong)
    report = smelt.check(conv_model(), force_fallback=["target"])
    c = report.culprit
    assert not report.ok and c is not None and c.node == "target"
    assert c.execution == "fallback" and c.template is None and c.fallback_reason
    assert "onnx.reference fallback" in report.format_text()


def test_fallback_node_that_agrees_passes():
    report = smelt.check(conv_model(), force_fallback=["target"])
    assert report.ok and [f["node"] for f in report.fallback] == ["target"]


def test_symbolic_dims_need_a_shape(tmp_path, capsys):
    path = tmp_path / "sym.onnx"
    onnx.save(conv_model(batch="N"), str(path))
    assert cli.main(["check", str(path), "-q", "--shape", "x=2,4,6,6"]) == 0
    assert "OK: all 2 outputs agree" in capsys.readouterr().out
    assert cli.main(["check", str(path), "-q"]) == 2
    assert "--shape x=" in capsys.readouterr().err
    with pytest.raises(smelt.SmeltError, match="symbolic"):
        smelt.check(conv_model(batch="N"))
    with pytest.raises(smelt.SmeltError, match="input_shapes"):
        smelt.compile(conv_model(batch="N"), check=True)
    report = smelt.check(conv_model(batch="N"), shapes={"x": [3, 4, 6, 6]})
    assert report.ok and report.outputs[0].shape == [3, 8, 6, 6]
    assert smelt.compile(conv_model(batch="N"), input_shapes={"x": [2, 4, 6, 6]}, check=True) is not None


def test_cli_inputs_json_and_exit_status(tmp_path, capsys, monkeypatch):
    path = tmp_path / "m.onnx"
    onnx.save(conv_model(), str(path))
    x = np.random.default_rng(5).standard_normal((1, 4, 6, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert cli.main(["check", str(path), "-q", "--input", f"x={tmp_path / 'x.npy'}", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["inputs"] == "given" and data["culprit"] is None
    plant_broken(monkeypatch, "Sin", "target")
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path / "broken"))  # the good build is cached by now
    out = tmp_path / "r.json"
    assert cli.main(["check", str(path), "-q", "--json", str(out)]) == 1
    assert "first diverging node: 'target' (Sin)" in capsys.readouterr().out
    assert json.loads(out.read_text())["culprit"]["template"] == "broken_sin"
    assert cli.main(["check", str(path), "-q", "--bisect"]) == 1
    assert "bisection over 5 clean cuts" in capsys.readouterr().out
    # a tolerance wide enough for the planted error turns it into agreement
    assert cli.main(["check", str(path), "-q", "--rtol", "1", "--atol", "1"]) == 0


def test_cli_npz_inputs(tmp_path, capsys):
    """``--input FILE.npz``: the archive's arrays by input name; a name no input has, an archive of
    several arrays under NAME=, and an unreadable file are errors naming the problem (exit 2)."""
    path = tmp_path / "m.onnx"
    onnx.save(conv_model(), str(path))
    x = np.random.default_rng(6).standard_normal((1, 4, 6, 6)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    assert cli.main(["check", str(path), "-q", "--input", str(tmp_path / "in.npz"), "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"] == "given"
    assert cli.main(["check", str(path), "-q", "--input", f"x={tmp_path / 'in.npz'}"]) == 0
    capsys.readouterr()
    np.savez(tmp_path / "bad.npz", y=x)
    np.savez(tmp_path / "two.npz", x=x, z=x)
    (tmp_path / "junk.npz").write_bytes(b"not an archive")
    for arg, message in ((str(tmp_path / "bad.npz"), "arrays ['y'] of"), (f"x={tmp_path / 'two.npz'}", "holds 2 arrays"),
                         (str(tmp_path / "junk.npz"), "cannot read")):
        assert cli.main(["check", str(path), "-q", "--input", arg]) == 2
        assert message in capsys.readouterr().err


def test_onnx_reference_path_without_onnxruntime(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails: as if not installed
    report = smelt.check(conv_model())
    assert report.ok and report.reference.startswith("onnx.reference")
    plant_broken(monkeypatch, "Sin", "target")
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path / "broken"))  # the good build is cached by now
    report = smelt.check(conv_model(), reference="auto")
    assert report.reference.startswith("onnx.reference")
    assert report.culprit is not None and report.culprit.node == "target"


def test_compile_check_raises_or_warns(monkeypatch, tmp_path):
    assert smelt.compile(conv_model(), check=True) is not None  # agrees: silent
    plant_broken(monkeypatch, "Sin", "target")
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path / "broken"))  # the good build is cached by now
    with pytest.raises(CheckError, match="first diverging node 'target' \\(Sin") as info:
        smelt.compile(conv_model(), check=True)
    assert info.value.report.culprit.template == "broken_sin"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = smelt.compile(conv_model(), check="warn")
    assert model is not None and any(issubclass(w.category, CheckWarning) for w in caught)
    with pytest.raises(ValueError, match="check must be"):
        smelt.compile(conv_model(), check="loud")


def test_public_names():
    assert callable(smelt.check) and smelt.CheckError is CheckError
    assert issubclass(CheckError, smelt.SmeltError)


def test_onnxruntime_refusing_intermediate_outputs_falls_back_to_onnx_reference(monkeypatch):
    from smelt.check import Reference

    original = Reference.run

    def refuse(self, feeds, extra=()):
        if self.kind == "onnxruntime" and extra:
            raise RuntimeError("refused")
        return original(self, feeds, extra)

    monkeypatch.setattr(Reference, "run", refuse)
    plant_broken(monkeypatch, "Sin", "target")
    report = smelt.check(conv_model())
    assert report.reference.startswith("onnxruntime")  # the outputs were compared against it
    assert report.culprit is not None and report.culprit.node == "target"
    assert any("took them from onnx.reference" in n for n in report.notes)
