"""The public APIs: InferenceSession parity with onnxruntime, compile(), input checking, errors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import assert_close, const, make_model, ort_run, tensor
from onnx import TensorProto, helper

import smelt


def _relu_add(opset: int = 17):
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "b"], ["y"], name="add")]
    return make_model(nodes, [tensor("x", [2, 3]), tensor("b", [3])], [tensor("y", [2, 3])], opset=opset)


def test_inference_session_matches_onnxruntime_api():
    model = _relu_add()
    sess = smelt.InferenceSession(model.SerializeToString())
    ins = sess.get_inputs()
    assert [i.name for i in ins] == ["x", "b"]
    assert ins[0].shape == [2, 3] and ins[0].type == "tensor(float)"
    assert [o.name for o in sess.get_outputs()] == ["y"]
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    b = np.arange(3, dtype=np.float32)
    got = sess.run(None, {"x": x, "b": b})
    assert_close(got, ort_run(model, {"x": x, "b": b}))
    assert sess.run(["y"], {"x": x, "b": b})[0].shape == (2, 3)
    with pytest.raises(ValueError, match="unknown output name 'z'"):
        sess.run(["z"], {"x": x, "b": b})


def test_compile_from_path_bytes_and_proto(tmp_path):
    model = _relu_add()
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    x = np.ones((2, 3), np.float32)
    b = -np.ones(3, np.float32)
    for src in (str(path), path, model.SerializeToString(), model):
        cm = smelt.compile(src, threads=1)
        np.testing.assert_array_equal(cm(x, b), np.zeros((2, 3), np.float32))
        np.testing.assert_array_equal(cm(x=x, b=b), np.zeros((2, 3), np.float32))
        assert cm.fallback_nodes == []
        assert cm.source_path is None or cm.source_path.exists()  # kept under SMELT_DEBUG=1


@pytest.mark.parametrize("feeds, message", [
    ({"x": np.ones((2, 3), np.float32), "bb": np.ones(3, np.float32)}, "unknown input name 'bb'"),
    ({"x": np.ones((2, 3), np.float32)}, "missing input 'b'"),
    ({"x": np.ones((2, 4), np.float32), "b": np.ones(3, np.float32)}, r"input 'x': expected shape \[2, 3\], given \[2, 4\]"),
    ({"x": np.ones((2, 3, 1), np.float32), "b": np.ones(3, np.float32)}, r"input 'x': expected shape \[2, 3\] \(rank 2\)"),
    ({"x": np.ones((2, 3), np.float64), "b": np.ones(3, np.float32)}, "input 'x': expected dtype float32.*given float64"),
])
def test_bad_inputs_raise_clear_errors(feeds, message):
    cm = smelt.compile(_relu_add(), threads=1)
    with pytest.raises(ValueError, match=message):
        cm.run(feeds)


def test_malformed_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\x08\x07this is not protobuf \xff\xff\xff")
    with pytest.raises(smelt.ModelLoadError, match="broken.onnx"):
        smelt.compile(bad)
    with pytest.raises(smelt.ModelLoadError, match="not found"):
        smelt.compile(tmp_path / "missing.onnx")
    with pytest.raises(smelt.ModelLoadError):
        smelt.InferenceSession(b"garbage bytes")


def test_unknown_custom_op_names_op_and_node():
    node = helper.make_node("FancyOp", ["x"], ["y"], name="my_fancy_node", domain="com.example")
    model = make_model([node], [tensor("x", [2])], [tensor("y", [2])])
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(smelt.UnsupportedOpError, match=r"my_fancy_node.*FancyOp"):
        smelt.compile(model)


def test_op_the_fallback_lacks_names_op_and_node(tmp_path, monkeypatch):
    """An op with no native kernel that onnx.reference cannot run either (ai.onnx.ml's
    CategoryMapper) is an UnsupportedOpError naming the node, the op and its domain, not onnx's
    traceback, before anything is compiled (a LightGBM model's ZipMap, which runs now, took two
    minutes to say so); ``smelt check`` exits 2."""
    from onnx import TensorProto

    from smelt import cli
    from smelt.codegen import toolchain

    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path / "cache"))
    compiles = []
    real_compile = toolchain._compile
    monkeypatch.setattr(toolchain, "_compile", lambda *a, **k: compiles.append(1) or real_compile(*a, **k))

    nodes = [helper.make_node("Neg", ["x"], ["r"], name="neg"),
             helper.make_node("CategoryMapper", ["r"], ["names"], name="mapper", domain="ai.onnx.ml",
                              cats_int64s=[-1, -2], cats_strings=["a", "b"])]
    model = make_model(nodes, [tensor("x", [2, 3], TensorProto.INT64)],
                       [tensor("names", [2, 3], TensorProto.STRING)])
    model.opset_import.append(helper.make_opsetid("ai.onnx.ml", 1))
    with pytest.raises(smelt.UnsupportedOpError, match=r"mapper.*CategoryMapper.*onnx\.reference.*ai\.onnx\.ml") as err:
        smelt.compile(model)
    assert "ArrayFeatureExtractor" not in str(err.value)  # not onnx's list of what it has
    assert compiles == []
    path = tmp_path / "mapper.onnx"
    path.write_bytes(model.SerializeToString())
    assert cli.main(["check", str(path), "--no-localize", "-q"]) == 2


def test_fallback_is_reported_and_correct():
    # ai.onnx.ml's Binarizer has no native template (nor a function body to expand): it runs
    # through onnx.reference between native blocks
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Binarizer", ["r"], ["h"], name="binarizer", domain="ai.onnx.ml", threshold=0.5),
             helper.make_node("Neg", ["h"], ["y"], name="neg")]
    model = make_model(nodes, [tensor("x", [3, 5])], [tensor("y", [3, 5])])
    model.opset_import.append(helper.make_opsetid("ai.onnx.ml", 3))
    cm = smelt.compile(model, threads=2)
    assert cm.fallback_nodes == ["binarizer"]
    x = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    assert_close([cm(x)], ort_run(model, {"x": x}))
    with pytest.raises(smelt.UnsupportedOpError, match=r"binarizer.*Binarizer"):
        smelt.compile(model, allow_fallback=False)


def test_symbolic_batch_specializes_per_shape():
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu")]
    model = make_model(nodes, [tensor("x", ["N", 4])], [tensor("y", ["N", 4])])
    cm = smelt.compile(model, threads=1)
    assert cm.get_inputs()[0].shape == ["N", 4]
    for n in (1, 3, 1, 7):
        x = np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)
        np.testing.assert_array_equal(cm(x), np.maximum(x, 0))
    assert len(cm._variants) == 3


def test_repeat_calls_take_the_fast_path_and_still_check_what_differs():
    """A call with arrays of the last call's names, shapes and dtypes skips validation and the
    variant lookup; anything else (another shape, a wrong dtype, a strided view, a list, an
    unknown name) goes the full way: checked, converted, or refused as before."""
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu")]
    model = make_model(nodes, [tensor("x", ["N", 4])], [tensor("y", ["N", 4])])
    cm = smelt.compile(model, threads=1)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(cm(x), np.maximum(x, 0))
    assert cm._fast is not None and cm._fast[0] == (("x", (3, 4), np.dtype(np.float32)),)
    np.testing.assert_array_equal(cm(x * 2), np.maximum(x * 2, 0))  # fast
    wide = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_array_equal(cm(wide[:, ::2]), np.maximum(wide[:, ::2], 0))  # strided: converted
    np.testing.assert_array_equal(cm(x[:1]), np.maximum(x[:1], 0))  # another shape: another variant
    with pytest.raises(ValueError, match="expected dtype float32"):
        cm(x.astype(np.float64))
    with pytest.raises(ValueError, match="unknown input name"):
        cm.run({"x": x, "z": x})
    np.testing.assert_array_equal(cm(x), np.maximum(x, 0))  # and the fast path again


def test_unknown_dims_spelled_minus_one_and_question_mark():
    """paddle2onnx declares unknown dims as -1 and as "?" (each "?" its own unknown, not one
    symbol): onnxruntime accepts any size there, and so does smelt (a text-direction classifier
    shipped in a PyPI wheel declared [-1, 3, ?, ?] and was refused). A real named dim still binds."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["y"], name="mean", axes=[2, 3], keepdims=0)]
    model = make_model(nodes, [tensor("x", [-1, 3, "?", "?"])], [tensor("y", [-1, 3])], opset=17)
    cm = smelt.compile(model, threads=1)
    for shape in ((1, 3, 48, 192), (2, 3, 5, 7)):
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        assert_close([cm(x)], ort_run(model, {"x": x}))
    tied = make_model([helper.make_node("Neg", ["a"], ["y"])], [tensor("a", ["n", "n"])], [tensor("y", ["n", "n"])])
    with pytest.raises(ValueError, match="dimension 'n' must be the same size"):
        smelt.compile(tied, threads=1)(np.ones((2, 3), np.float32))


def test_variant_cache_is_bounded(monkeypatch):
    monkeypatch.setenv("SMELT_MAX_VARIANTS", "2")
    model = make_model([helper.make_node("Neg", ["x"], ["y"])], [tensor("x", ["N"])], [tensor("y", ["N"])])
    cm = smelt.compile(model, threads=1)
    for n in range(1, 6):
        np.testing.assert_array_equal(cm(np.ones(n, np.float32)), -np.ones(n, np.float32))
    assert len(cm._variants) == 2


def test_constant_output_and_passthrough_output():
    nodes = [helper.make_node("Add", ["c1", "c2"], ["k"], name="const_add"),
             helper.make_node("Identity", ["x"], ["y"], name="ident")]
    model = make_model(nodes, [tensor("x", [2])], [tensor("k", [2]), tensor("y", [2])],
                       initializers=[const("c1", np.ones(2, np.float32)), const("c2", np.ones(2, np.float32))])
    cm = smelt.compile(model)
    x = np.array([3, 4], np.float32)
    k, y = cm(x)
    np.testing.assert_array_equal(k, [2, 2])
    np.testing.assert_array_equal(y, x)
    y[0] = 99  # outputs are fresh arrays, never views of the input
    assert x[0] == 3


def test_int_and_bool_elementwise_native():
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Greater", ["s", "b"], ["y"])]
    model = make_model(nodes, [tensor("a", [4], TensorProto.INT32), tensor("b", [4], TensorProto.INT32)],
                       [tensor("y", [4], TensorProto.BOOL)])
    cm = smelt.compile(model)
    a = np.array([1, -2, 3, 0], np.int32)
    b = np.array([0, 5, -1, 0], np.int32)
    assert cm.fallback_nodes == []
    np.testing.assert_array_equal(cm(a, b), (a + b) > b)


@pytest.mark.parametrize("opset", [9, 11, 13, 17, 21])
def test_opsets(opset):
    model = _relu_add(opset)
    x = np.random.default_rng(opset).standard_normal((2, 3)).astype(np.float32)
    b = np.ones(3, np.float32)
    np.testing.assert_allclose(smelt.compile(model)(x, b), np.maximum(x, 0) + b, rtol=1e-6)


def test_external_data_is_loaded(tmp_path):
    w = np.random.default_rng(3).standard_normal((64, 64)).astype(np.float32)
    nodes = [helper.make_node("Add", ["x", "w"], ["y"])]
    model = make_model(nodes, [tensor("x", [64, 64])], [tensor("y", [64, 64])], initializers=[const("w", w)])
    path = tmp_path / "ext.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="ext.bin", size_threshold=0)
    assert (tmp_path / "ext.bin").exists()
    x = np.ones((64, 64), np.float32)
    np.testing.assert_array_equal(smelt.compile(path)(x), x + w)


def test_no_compiler_is_a_clear_error(monkeypatch):
    from smelt.codegen import toolchain

    toolchain.find_compiler.cache_clear()
    monkeypatch.setenv("CC", "/nonexistent/cc")
    try:
        with pytest.raises(smelt.CompilerNotFoundError, match="apt install gcc"):
            toolchain.find_compiler()
    finally:
        toolchain.find_compiler.cache_clear()


def test_gather_index_out_of_range_raises_naming_the_node():
    nodes = [helper.make_node("Gather", ["data", "idx"], ["y"], name="lookup", axis=0)]
    model = make_model(nodes, [tensor("data", [5, 3]), tensor("idx", [2], TensorProto.INT64)],
                       [tensor("y", [2, 3])])
    cm = smelt.compile(model, threads=2)
    assert cm.fallback_nodes == []
    data = np.arange(15, dtype=np.float32).reshape(5, 3)
    np.testing.assert_array_equal(cm(data, np.array([4, -5], np.int64)), data[[4, 0]])
    with pytest.raises(smelt.SmeltError, match=r"'lookup' \(Gather\).*out of range"):
        cm(data, np.array([1, 5], np.int64))
    np.testing.assert_array_equal(cm(data, np.array([0, 1], np.int64)), data[[0, 1]])  # still usable


# ----------------------------------------------------------------------------- the ISA cap
def _conv_relu():
    """A 3x3 conv + ReLU big enough for the vector kernels (and gcc's own vectorization)."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    model = make_model(nodes, [tensor("x", [1, 16, 12, 12])], [tensor("y", [1, 32, 12, 12])], [const("w", w)])
    return model, {"x": rng.standard_normal((1, 16, 12, 12)).astype(np.float32)}


def _disassembly(compiled) -> str:
    import subprocess

    lib = compiled._current().lib_path
    return subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(lib)], capture_output=True, text=True,
                          check=True).stdout


def _host_caps():
    from smelt.target import detect

    return detect().isa_caps()


@pytest.mark.parametrize("isa", ["avx2", "scalar"])
def test_isa_cap_generated_code_stays_within_it(isa, tmp_path, monkeypatch):
    """A cap holds every instruction of the library, the ones gcc picks for plain loops included:
    no zmm register (nor AVX-512 mask register) at avx2, no ymm at all for the portable path."""
    import shutil

    if isa not in _host_caps():
        pytest.skip(f"host cannot run {isa}")
    if not shutil.which("objdump"):
        pytest.skip("needs objdump")
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    model, feeds = _conv_relu()
    want = ort_run(model, feeds)
    native = smelt.compile(model, threads=1)
    capped = smelt.compile(model, threads=1, isa=isa)
    # a cap that drops nothing on this host (avx2 on an AVX2 host without AVX-VNNI) is no cap
    assert capped.target.isa == isa and capped.options.isa == (None if capped.target == native.target else isa)
    assert_close(capped.run(feeds), want)
    dis = _disassembly(capped)
    assert "%zmm" not in dis and "%k1" not in dis
    if isa == "scalar":
        assert "%ymm" not in dis
    else:
        assert "%ymm" in dis  # really AVX2 code, not portable C
    if native.target.isa == "avx512":
        assert "%zmm" in _disassembly(native)  # the check above can fail


def test_isa_cap_is_in_the_cache_key_and_native_is_no_cap(tmp_path, monkeypatch):
    if "avx2" not in _host_caps():
        pytest.skip("host has no AVX2")
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    from smelt.target import detect

    model = _relu_add()
    a = smelt.compile(model, threads=1)
    b = smelt.compile(model, threads=1, isa="avx2")
    c = smelt.compile(model, threads=1, isa="native")
    d = smelt.compile(model, threads=1, isa=detect().isa)  # naming the host's ISA is no cap...
    host = detect()
    assert c.options.isa is None
    if host.narrowed(host.isa) == host:  # ...unless it drops a feature ("avx2" on a host with AVX-VNNI)
        assert d.options.isa is None and a.options.key(host) == d.options.key(host)
    if host.narrowed("avx2") != host:
        assert b.options.key(host) != a.options.key(host)
        assert b._current().lib_path != a._current().lib_path
        assert not b.from_cache  # not the native build's artifact


def test_isa_cap_from_the_environment_and_the_argument_wins(monkeypatch, tmp_path):
    if "avx2" not in _host_caps():
        pytest.skip("host has no AVX2")
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    model = _relu_add()
    monkeypatch.setenv("SMELT_ISA", "scalar")
    assert smelt.compile(model, threads=1).target.isa == "scalar"
    assert smelt.compile(model, threads=1, isa="avx2").target.isa == "avx2"
    from smelt.errors import ConfigError

    monkeypatch.setenv("SMELT_ISA", "avx9000")
    with pytest.raises(ConfigError, match="SMELT_ISA='avx9000'.*avx512, avx2_vnni, avx2, scalar, native"):
        smelt.compile(model, threads=1)


def test_isa_cap_errors_name_the_requested_and_the_host_isa(monkeypatch):
    import dataclasses

    from smelt.target import detect

    with pytest.raises(ValueError, match="isa must be one of avx512, avx2_vnni, avx2, scalar, native"):
        smelt.compile(_relu_add(), threads=1, isa="sse9")
    host = detect()
    # an AVX2-only host asked for AVX-512: the requested ISA, the host's model and ISA, the choices
    avx2_host = dataclasses.replace(host, arch="x86_64", isa="avx2", vector_bits=256, vector_registers=16,
                                    flags=("avx", "avx2", "fma"), model_name="AMD EPYC", cpu_family=25,
                                    cpu_model=1)
    with pytest.raises(ValueError) as err:
        avx2_host.narrowed("avx512")
    msg = str(err.value)
    assert "'avx512'" in msg and "runs avx2" in msg and "AMD EPYC (family 25 model 1)" in msg
    assert "avx2, scalar" in msg
    monkeypatch.setattr("smelt.api.detect", lambda: avx2_host)
    with pytest.raises(ValueError, match="'avx512' was requested but this host cannot run it"):
        smelt.compile(_relu_add(), threads=1, isa="avx512")


def test_narrowed_target_describes_the_cap():
    import dataclasses

    from smelt.target import detect

    host = dataclasses.replace(detect(), arch="x86_64", isa="avx512", vector_bits=512, vector_registers=32,
                               flags=("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw",
                                      "avx512vl", "avx512dq", "avx512_vnni"))
    assert host.isa_caps() == ("avx512", "avx2", "scalar")
    assert host.narrowed(None) is host and host.narrowed("native") is host and host.narrowed("avx512") is host
    avx2 = host.narrowed("avx2")
    assert (avx2.isa, avx2.vector_bits, avx2.vector_registers, avx2.native_isa) == ("avx2", 256, 16, "avx512")
    assert not any(f.startswith("avx512") for f in avx2.flags) and avx2.fma
    assert avx2.compiler_flags() == ("-mno-avx512f", "-mno-avxvnni") and host.compiler_flags() == ()
    # a host with AVX-VNNI (Zen 5, Alder Lake): "avx2_vnni" keeps its ymm dot products, "avx2"
    # drops them, also where AVX2 is the host's own ISA (oneDNN's AVX2_VNNI and AVX2)
    vnni = dataclasses.replace(host, flags=host.flags + ("avx_vnni",))
    assert vnni.isa_caps() == ("avx512", "avx2_vnni", "avx2", "scalar")
    assert "avx_vnni" in vnni.narrowed("avx2_vnni").flags and vnni.narrowed("avx2_vnni").isa == "avx2"
    assert "avx_vnni" not in vnni.narrowed("avx2").flags
    client = vnni.narrowed("avx2_vnni")
    assert client.narrowed("avx2_vnni") is client and "avx_vnni" not in client.narrowed("avx2").flags
    scalar = host.narrowed("scalar")
    assert scalar.compiler_flags() == ("-mno-avx",) and not scalar.fma and scalar.flags == ("sse4_2",)
    assert len({host.key(), avx2.key(), scalar.key()}) == 3  # no build is shared across caps
    assert avx2.narrowed("avx2") is avx2
    with pytest.raises(ValueError, match="cannot run"):
        avx2.narrowed("avx512")


def test_cpu_names_family_and_model_when_the_name_is_terse():
    import dataclasses

    from smelt.target import detect

    t = detect()
    assert dataclasses.replace(t, model_name="AMD EPYC", cpu_family=25, cpu_model=17).cpu == \
        "AMD EPYC (family 25 model 17)"
    long_name = "AMD EPYC 9R14 96-Core Processor"
    assert dataclasses.replace(t, model_name=long_name, cpu_family=25, cpu_model=17).cpu == long_name


def test_inference_session_takes_the_cap_as_a_provider_option(tmp_path, monkeypatch):
    if "avx2" not in _host_caps():
        pytest.skip("host has no AVX2")
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    model = _relu_add().SerializeToString()
    sess = smelt.InferenceSession(model, providers=[("SmeltExecutionProvider", {"isa": "avx2"})])
    assert sess.compiled.target.isa == "avx2"
    sess = smelt.InferenceSession(model, providers=["SmeltExecutionProvider"], provider_options=[{"isa": "scalar"}])
    assert sess.compiled.target.isa == "scalar"
    # another provider's options are not smelt's
    sess = smelt.InferenceSession(model, providers=[("CPUExecutionProvider", {"isa": "avx2"})])
    assert sess.compiled.options.isa is None
    with pytest.raises(ValueError, match="unknown SmeltExecutionProvider option 'fast'"):
        smelt.InferenceSession(model, providers=[("SmeltExecutionProvider", {"fast": 1})])


def test_node_lists_before_the_first_build_say_why(tmp_path, monkeypatch, capsys) -> None:
    """A model whose variants depend on an input's value builds at its first call: before it,
    ``fallback_nodes`` is an error naming that input, not an empty list (which a harness read as
    "fully native"); ``smelt compile`` says so; after a call the lists are that variant's."""
    from onnx import TensorProto

    from smelt import cli

    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path / "cache"))
    nodes = [helper.make_node("CumSum", ["x", "axis"], ["y"], name="cumsum")]
    model = make_model(nodes, [tensor("x", [3, 4]), tensor("axis", [], TensorProto.INT64)], [tensor("y", [3, 4])])
    compiled = smelt.compile(model, threads=2)
    assert not compiled.built
    for attr in ("fallback_nodes", "fallback_report", "native_nodes"):
        with pytest.raises(smelt.SmeltError, match=r"no variant.*built yet.*values of input\(s\) axis"):
            getattr(compiled, attr)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(compiled(x, np.array(1, np.int64)), np.cumsum(x, axis=1), rtol=1e-6)
    assert compiled.built and compiled.fallback_nodes == [] and [op for _, op in compiled.native_nodes] == ["CumSum"]
    path = tmp_path / "cumsum.onnx"
    path.write_bytes(model.SerializeToString())
    assert cli.main(["compile", str(path)]) == 0
    assert "not compiled yet" in capsys.readouterr().out


def test_node_lists_after_close_say_close_freed_them(tmp_path, monkeypatch) -> None:
    """A static model is built by compile(); after close() its node lists are an error that says
    close() freed the variants (not "symbolic dimensions ()"), and a call rebuilds it."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    compiled = smelt.compile(_relu_add(), threads=1)
    assert compiled.built and compiled.fallback_nodes == []
    compiled.close()
    assert not compiled.built
    with pytest.raises(smelt.SmeltError, match=r"close\(\) freed its variants"):
        _ = compiled.fallback_nodes
    compiled.run({i.name: np.ones([d.dim_value for d in i.type.tensor_type.shape.dim], np.float32)
                  for i in _relu_add().graph.input})
    assert compiled.built and compiled.fallback_nodes == []
    # symbolic inputs sized by input_shapes build at compile() too: after close() the same words
    # (not "no input_shapes were given")
    sym = make_model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", ["n", 4])], [tensor("y", ["n", 4])])
    compiled = smelt.compile(sym, threads=1, input_shapes={"x": [3, 4]})
    assert compiled.built
    compiled.close()
    with pytest.raises(smelt.SmeltError, match=r"close\(\) freed its variants"):
        _ = compiled.native_nodes
