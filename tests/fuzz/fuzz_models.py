"""A seeded mutation fuzzer for smelt's front end, passes, planner and code generator.

    python tests/fuzz/fuzz_models.py --iterations 10000 --seconds 600 --seed 0

Each iteration takes one of a few small valid seed models (conv+relu+pool, gemm, element-wise
ops with broadcasting, reshape/transpose/concat/split/gather, an LSTM, normalisation and
pooling odds and ends) and applies one to three mutations: attribute values, types and
presence, input/output/initializer shapes and dtypes, wiring (a node reads or writes another
name), op types, the opset, node order, or the serialized bytes themselves. The contract:

(a) every mutated model goes, in this process and without the C compiler, through load ->
    validation -> passes -> plan -> C generation (for the host's ISA, scalar and AVX-512 in
    turn). It must end in C source or an error of smelt's own classes (``SmeltError``);
    anything else is a failure.
(b) a bounded sample of the models that got through (a) is compiled and run in a forked child
    (a crash or a hang past ``--timeout`` is a failure) and compared with onnxruntime: when
    onnxruntime runs the model, smelt's outputs must equal its (NaN positions included) or
    smelt must refuse with a ``SmeltError``; when onnxruntime refuses the model as invalid at
    session creation, smelt must not have compiled it either (both are failures otherwise).

Iteration ``i`` of seed ``K`` draws from ``random.Random(f"{K}:{i}")``, so ``--replay i``
reproduces one case alone. Failures are written to ``--save`` (default
``/work/fuzz-findings`` when it exists, else a temporary directory) as ``<seed>-<i>.onnx``
plus a ``.txt`` with the traceback. Exit status 1 when there was a failure.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import multiprocessing as mp
import os
import random
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, defs, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (helpers)
from helpers import const, make_model, tensor  # noqa: E402

from smelt.errors import SmeltError  # noqa: E402

# -- seed models -------------------------------------------------------------------------------


def _w(rng: np.random.RandomState, *shape: int) -> np.ndarray:
    return (rng.standard_normal(shape) * 0.5).astype(np.float32)


def seed_models() -> list[onnx.ModelProto]:
    """Small valid models covering the op families smelt has native templates for."""
    r = np.random.RandomState(0)
    h = helper.make_node
    conv = make_model(
        [h("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1], strides=[1, 1], group=1),
         h("Relu", ["c"], ["r"], name="relu"),
         h("MaxPool", ["r"], ["y"], name="pool", kernel_shape=[2, 2], strides=[2, 2])],
        [tensor("x", [1, 3, 8, 8])], [tensor("y", [1, 8, 4, 4])],
        [const("w", _w(r, 8, 3, 3, 3)), const("b", _w(r, 8))], name="conv_relu_pool")
    gemm = make_model(
        [h("Gemm", ["x", "w", "c"], ["g"], name="gemm", transB=1, alpha=1.0, beta=1.0),
         h("Sigmoid", ["g"], ["s"], name="sigmoid"),
         h("MatMul", ["s", "m"], ["y"], name="matmul")],
        [tensor("x", [2, 4])], [tensor("y", [2, 3])],
        [const("w", _w(r, 5, 4)), const("c", _w(r, 5)), const("m", _w(r, 5, 3))], name="gemm")
    eltwise = make_model(
        [h("Add", ["x", "z"], ["a"], name="add"),
         h("Mul", ["a", "k"], ["m"], name="mul"),
         h("LeakyRelu", ["m"], ["l"], name="leaky", alpha=0.1),
         h("Div", ["l", "d"], ["q"], name="div"),
         h("Clip", ["q", "lo", "hi"], ["y"], name="clip")],
        [tensor("x", [2, 3, 4]), tensor("z", [3, 1])], [tensor("y", [2, 3, 4])],
        [const("k", _w(r, 4)), const("d", np.full((1, 4), 2.0, np.float32)),
         const("lo", np.array(-1.0, np.float32)), const("hi", np.array(1.0, np.float32))], name="eltwise")
    movement = make_model(
        [h("Reshape", ["x", "shape"], ["rs"], name="reshape"),
         h("Transpose", ["rs"], ["t"], name="transpose", perm=[1, 0]),
         h("Concat", ["t", "extra"], ["cat"], name="concat", axis=0),
         h("Split", ["cat", "sizes"], ["s0", "s1"], name="split", axis=0),
         h("Gather", ["s0", "idx"], ["g"], name="gather", axis=1),
         h("Flatten", ["s1"], ["y1"], name="flatten", axis=1),
         h("Unsqueeze", ["g", "uaxes"], ["y0"], name="unsqueeze")],
        [tensor("x", [2, 6])], [tensor("y0", None), tensor("y1", None)],
        [const("shape", np.array([3, 4], np.int64)), const("extra", _w(r, 2, 3)),
         const("sizes", np.array([4, 2], np.int64)), const("idx", np.array([2, 0], np.int64)),
         const("uaxes", np.array([0], np.int64))], name="movement")
    lstm = make_model(
        [h("LSTM", ["x", "w", "r", "b"], ["y", "yh"], name="lstm", hidden_size=3, direction="forward")],
        [tensor("x", [3, 2, 4])], [tensor("y", [3, 1, 2, 3]), tensor("yh", [1, 2, 3])],
        [const("w", _w(r, 1, 12, 4)), const("r", _w(r, 1, 12, 3)), const("b", _w(r, 1, 24))], name="lstm")
    norm = make_model(
        [h("BatchNormalization", ["x", "s", "bb", "mu", "var"], ["bn"], name="bn", epsilon=1e-5),
         h("AveragePool", ["bn"], ["ap"], name="avgpool", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
         h("LRN", ["ap"], ["lrn"], name="lrn", size=3),
         h("DepthToSpace", ["lrn"], ["d2s"], name="d2s", blocksize=2),
         h("Softmax", ["d2s"], ["sm"], name="softmax", axis=-1),
         h("ReduceMean", ["sm"], ["y"], name="reduce", axes=[2], keepdims=1)],
        [tensor("x", [1, 4, 5, 5])], [tensor("y", [1, 1, 1, 10])],
        [const("s", np.abs(_w(r, 4)) + 0.5), const("bb", _w(r, 4)), const("mu", _w(r, 4)),
         const("var", np.abs(_w(r, 4)) + 0.5)], opset=17, name="norm")
    slicing = make_model(
        [h("Pad", ["x", "pads"], ["p"], name="pad", mode="constant"),
         h("Slice", ["p", "st", "en", "ax", "sp"], ["sl"], name="slice"),
         h("Tile", ["sl", "reps"], ["tl"], name="tile"),
         h("GlobalAveragePool", ["tl"], ["y"], name="gap")],
        [tensor("x", [1, 2, 4, 4])], [tensor("y", [1, 2, 1, 1])],
        [const("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)),
         const("st", np.array([0, 1], np.int64)), const("en", np.array([6, 5], np.int64)),
         const("ax", np.array([2, 3], np.int64)), const("sp", np.array([2, 1], np.int64)),
         const("reps", np.array([1, 1, 2, 1], np.int64))], name="slicing")
    return [conv, gemm, eltwise, movement, lstm, norm, slicing]


# -- mutations ---------------------------------------------------------------------------------

INTS = (-2, -1, 0, 1, 2, 3, 5, 7, 64, 2**31 - 1, -(2**31))
FLOATS = (0.0, -1.0, 1e-7, 0.5, 2.0, 1e30, float("nan"), float("inf"), float("-inf"))
STRINGS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID", "DCR", "CRD", "constant", "reflect", "edge",
           "wrap", "forward", "reverse", "bidirectional", "Tanh", "Sigmoid", "Relu", "HardSigmoid",
           "none", "tanh", "", "garbage")
SIMILAR_OPS = (
    ("Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Exp", "Sqrt", "Softplus", "Identity", "Floor"),
    ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "PRelu", "Equal", "MatMul"),
    ("MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool"),
    ("LSTM", "GRU", "RNN"),
    ("Conv", "ConvTranspose"),
    ("Reshape", "Expand", "Tile"),
    ("Softmax", "LogSoftmax", "Flatten"),
    ("DepthToSpace", "SpaceToDepth"),
    ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceL2", "ArgMax"),
)
DTYPES = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.INT32, TensorProto.FLOAT16,
          TensorProto.BOOL, TensorProto.UINT8)


def _schema(m: onnx.ModelProto, node: onnx.NodeProto):
    version = next((i.version for i in m.opset_import if i.domain in ("", "ai.onnx")), 17)
    try:
        return defs.get_schema(node.op_type, version, node.domain or "")
    except Exception:
        return None


def _int_value(rng: random.Random, current: int | None) -> int:
    if current is not None and rng.random() < 0.3:
        return current + rng.choice((-1, 1))
    return rng.choice(INTS)


def _ints_value(rng: random.Random, current: list[int]) -> list[int]:
    v = list(current) or [1]
    how = rng.randrange(4)
    if how == 0:
        v[rng.randrange(len(v))] = _int_value(rng, None)
    elif how == 1:
        v.append(rng.choice((0, 1, 2, 3)))
    elif how == 2 and v:
        v.pop(rng.randrange(len(v)))
    else:
        v = [rng.randint(-2, 5) for _ in range(rng.randint(0, 5))]
    return v


def _new_attr(rng: random.Random, name: str, kind: int, current: AttributeProto | None) -> AttributeProto:
    cur = helper.get_attribute_value(current) if current is not None else None
    if kind == AttributeProto.INT:
        return helper.make_attribute(name, _int_value(rng, cur))
    if kind == AttributeProto.INTS:
        return helper.make_attribute(name, _ints_value(rng, list(cur or [])), attr_type=AttributeProto.INTS)
    if kind == AttributeProto.FLOAT:
        return helper.make_attribute(name, rng.choice(FLOATS))
    if kind == AttributeProto.FLOATS:
        return helper.make_attribute(name, [rng.choice(FLOATS) for _ in range(rng.randint(0, 4))],
                                     attr_type=AttributeProto.FLOATS)
    if kind == AttributeProto.STRING:
        return helper.make_attribute(name, rng.choice(STRINGS))
    if kind == AttributeProto.STRINGS:
        return helper.make_attribute(name, [rng.choice(STRINGS) for _ in range(rng.randint(0, 6))],
                                     attr_type=AttributeProto.STRINGS)
    if kind == AttributeProto.TENSOR:
        return helper.make_attribute(name, numpy_helper.from_array(np.asarray(rng.choice(INTS[:8]), np.int64)))
    return helper.make_attribute(name, rng.choice(INTS))


def _set_attr(node: onnx.NodeProto, attr: AttributeProto) -> None:
    kept = [a for a in node.attribute if a.name != attr.name]
    del node.attribute[:]
    node.attribute.extend(kept + [attr])


def mut_attr_value(m: onnx.ModelProto, rng: random.Random) -> None:
    node = rng.choice(m.graph.node)
    schema = _schema(m, node)
    names = [a.name for a in node.attribute]
    if schema is not None and (not names or rng.random() < 0.3):
        names = list(schema.attributes) or names
    if not names:
        return
    name = rng.choice(names)
    current = next((a for a in node.attribute if a.name == name), None)
    kind = current.type if current is not None else int(schema.attributes[name].type.value)
    _set_attr(node, _new_attr(rng, name, kind, current))


def mut_attr_type(m: onnx.ModelProto, rng: random.Random) -> None:
    node = rng.choice(m.graph.node)
    if not node.attribute:
        return
    a = rng.choice(node.attribute)
    kind = rng.choice([k for k in (AttributeProto.INT, AttributeProto.INTS, AttributeProto.FLOAT,
                                   AttributeProto.STRING, AttributeProto.FLOATS) if k != a.type])
    _set_attr(node, _new_attr(rng, a.name, kind, None))


def mut_attr_drop_or_add(m: onnx.ModelProto, rng: random.Random) -> None:
    node = rng.choice(m.graph.node)
    if node.attribute and rng.random() < 0.6:
        del node.attribute[rng.randrange(len(node.attribute))]
    else:
        _set_attr(node, _new_attr(rng, rng.choice(("bogus", "axis", "alpha", "smelt_dynamic")),
                                  rng.choice((AttributeProto.INT, AttributeProto.FLOAT)), None))


def _dims(vi: onnx.ValueInfoProto) -> list:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param or None
            for d in vi.type.tensor_type.shape.dim]


def _set_dims(vi: onnx.ValueInfoProto, dims: list | None) -> None:
    tt = vi.type.tensor_type
    if dims is None:
        tt.ClearField("shape")
        return
    tt.shape.Clear()
    for d in dims:
        dim = tt.shape.dim.add()
        if isinstance(d, int):
            dim.dim_value = d
        elif d:
            dim.dim_param = d


def _mutate_dims(rng: random.Random, dims: list) -> list | None:
    dims = list(dims)
    how = rng.randrange(6)
    if how == 0 or not dims:
        dims.append(rng.choice((1, 2, 3)))
    elif how == 1:
        dims.pop(rng.randrange(len(dims)))
    elif how == 2:
        dims[rng.randrange(len(dims))] = rng.choice(("N", None))
    elif how == 3:
        return None
    else:
        dims[rng.randrange(len(dims))] = rng.choice((0, 1, 2, 3, 5, 7, 9))
    return dims


def mut_io_shape(m: onnx.ModelProto, rng: random.Random) -> None:
    inits = {i.name for i in m.graph.initializer}
    vis = [v for v in m.graph.input if v.name not in inits] + list(m.graph.output)
    vi = rng.choice(vis)
    if rng.random() < 0.2:
        vi.type.tensor_type.elem_type = rng.choice(DTYPES)
    else:
        _set_dims(vi, _mutate_dims(rng, _dims(vi)))


def mut_value_info(m: onnx.ModelProto, rng: random.Random) -> None:
    """Declare a (possibly wrong) type and shape for an intermediate value."""
    outs = [o for n in m.graph.node for o in n.output if o]
    name = rng.choice(outs)
    vi = helper.make_tensor_value_info(name, rng.choice((TensorProto.FLOAT,) * 4 + DTYPES),
                                       [rng.choice((1, 2, 3, 4, 8)) for _ in range(rng.randint(0, 4))])
    m.graph.value_info.append(vi)


def mut_initializer(m: onnx.ModelProto, rng: random.Random) -> None:
    if not m.graph.initializer:
        return
    k = rng.randrange(len(m.graph.initializer))
    t = m.graph.initializer[k]
    arr = numpy_helper.to_array(t)
    how = rng.randrange(5)
    if how == 0 and arr.dtype.kind == "i" and arr.size:  # shapes, sizes, indices, axes, pads
        arr = arr.copy().reshape(-1)
        arr[rng.randrange(arr.size)] = rng.choice((-3, -1, 0, 1, 2, 5, 100))
        arr = arr.reshape(numpy_helper.to_array(t).shape)
    elif how == 1:
        dims = _mutate_dims(rng, list(arr.shape)) or []
        dims = [d if isinstance(d, int) else 1 for d in dims]
        arr = np.random.RandomState(rng.randrange(2**31)).standard_normal(dims).astype(arr.dtype)
    elif how == 2:
        arr = arr.astype(rng.choice((np.float64, np.int64, np.int32, np.float16, np.float32)))
    elif how == 3:  # dims that disagree with the data
        t2 = onnx.TensorProto()
        t2.CopyFrom(t)
        if t2.dims:
            t2.dims[rng.randrange(len(t2.dims))] = rng.choice((-1, 0, 1, 3, 1000))
        else:
            t2.dims.append(rng.choice((-1, 0, 2)))
        m.graph.initializer[k].CopyFrom(t2)
        return
    else:
        arr = np.full(arr.shape, rng.choice(FLOATS), arr.dtype) if arr.dtype.kind == "f" else arr
    m.graph.initializer[k].CopyFrom(numpy_helper.from_array(np.asarray(arr), t.name))


def _names(m: onnx.ModelProto) -> list[str]:
    return ([i.name for i in m.graph.input] + [i.name for i in m.graph.initializer]
            + [o for n in m.graph.node for o in n.output if o])


def mut_rewire(m: onnx.ModelProto, rng: random.Random) -> None:
    node = rng.choice(m.graph.node)
    names = _names(m) + ["", "nowhere"]
    if node.input and rng.random() < 0.7:
        node.input[rng.randrange(len(node.input))] = rng.choice(names)
    elif rng.random() < 0.5:
        node.input.append(rng.choice(names))
    elif node.input:
        node.input.pop()


def mut_outputs(m: onnx.ModelProto, rng: random.Random) -> None:
    node = rng.choice(m.graph.node)
    how = rng.randrange(4)
    if how == 0 and node.output:
        node.output[rng.randrange(len(node.output))] = rng.choice(_names(m))
    elif how == 1:
        node.output.append(rng.choice(("extra", "")))
    elif how == 2 and node.output:
        node.output.pop()
    else:
        out = rng.choice(m.graph.output)
        out.name = rng.choice(_names(m) + ["nowhere"])


def mut_nodes(m: onnx.ModelProto, rng: random.Random) -> None:
    nodes = list(m.graph.node)
    how = rng.randrange(4)
    if how == 0 and len(nodes) > 1:
        nodes.pop(rng.randrange(len(nodes)))
    elif how == 1 and len(nodes) > 1:
        i, j = rng.sample(range(len(nodes)), 2)
        nodes[i], nodes[j] = nodes[j], nodes[i]
    elif how == 2:
        dup = copy.deepcopy(rng.choice(nodes))
        dup.name += "_dup"
        nodes.insert(rng.randrange(len(nodes) + 1), dup)
    else:
        nodes[rng.randrange(len(nodes))].name = nodes[0].name
    del m.graph.node[:]
    m.graph.node.extend(nodes)


def mut_op_type(m: onnx.ModelProto, rng: random.Random) -> None:
    node = rng.choice(m.graph.node)
    family = next((f for f in SIMILAR_OPS if node.op_type in f), None)
    node.op_type = rng.choice(family) if family and rng.random() < 0.8 else rng.choice(
        [op for f in SIMILAR_OPS for op in f] + ["NoSuchOp"])
    if rng.random() < 0.1:
        node.domain = rng.choice(("com.example", "ai.onnx.ml"))


def mut_opset(m: onnx.ModelProto, rng: random.Random) -> None:
    for imp in m.opset_import:
        if imp.domain in ("", "ai.onnx"):
            imp.version = rng.choice((1, 7, 9, 10, 11, 13, 14, 17, 18, 19, 21, 23, 30))


MUTATIONS: list[tuple[Callable[[onnx.ModelProto, random.Random], None], int]] = [
    (mut_attr_value, 30), (mut_attr_type, 5), (mut_attr_drop_or_add, 6), (mut_io_shape, 12),
    (mut_value_info, 5), (mut_initializer, 15), (mut_rewire, 6), (mut_outputs, 5), (mut_nodes, 5),
    (mut_op_type, 8), (mut_opset, 3),
]


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    how = rng.randrange(3)
    if how == 0:
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif how == 1:
        b = b[: rng.randrange(len(b))]
    else:
        i = rng.randrange(len(b))
        b[i:i] = b[rng.randrange(len(b)):][: rng.randint(1, 32)]
    return bytes(b)


def make_case(seeds: list[onnx.ModelProto], seed: int, i: int) -> tuple[bytes, str]:
    """The model bytes of iteration ``i`` and a description of its mutations."""
    rng = random.Random(f"{seed}:{i}")
    k = rng.randrange(len(seeds))
    m = onnx.ModelProto()
    m.CopyFrom(seeds[k])
    done = [seeds[k].graph.name]
    for _ in range(rng.choice((1, 1, 2, 3))):
        fn = rng.choices([f for f, _ in MUTATIONS], weights=[w for _, w in MUTATIONS])[0]
        try:
            fn(m, rng)
        except (ValueError, TypeError, IndexError):  # e.g. an impossible numpy conversion: skip
            continue
        done.append(fn.__name__)
    data = m.SerializeToString()
    if rng.random() < 0.08:
        data = mutate_bytes(data, rng)
        done.append("mutate_bytes")
    return data, " ".join(done)


# -- running a case ----------------------------------------------------------------------------


def input_shapes(proto: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Concrete shapes to compile and feed: symbolic dims become 2, an unknown shape is [2]."""
    from smelt.frontend.onnx_import import model_input_specs

    return {name: tuple(d if isinstance(d, int) else 2 for d in shape) if shape is not None else (2,)
            for name, dtype, shape in model_input_specs(proto) if dtype is not None}


def feeds_for(proto: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    from smelt.frontend.onnx_import import model_input_specs

    rs = np.random.RandomState(seed)
    feeds = {}
    for name, dtype, _ in model_input_specs(proto):
        if dtype is None:
            continue
        arr = rs.standard_normal(shapes[name])
        feeds[name] = (arr > 0) if np.dtype(dtype) == np.bool_ else arr.astype(dtype)
    return feeds


def targets() -> list:
    """The host target and two rendered-only ones (scalar, AVX-512): stage (a) never runs them."""
    from smelt.target import detect

    real = detect()
    return [real, dataclasses.replace(real, isa="scalar", vector_bits=32, vector_registers=16),
            dataclasses.replace(real, isa="avx512", vector_bits=512, vector_registers=32,
                                flags=tuple(sorted(set(real.flags) | {"avx512f"})))]


def generate_c(data: bytes, target) -> str:
    """Stage (a): load -> validate -> passes -> plan -> C source, as ``compiler.build`` does up
    to the C compiler. Returns the source; raises whatever smelt raises."""
    from smelt.codegen.emit import generate
    from smelt.codegen.plan import build_plan
    from smelt.compiler import _check_fallbacks, lower
    from smelt.frontend.onnx_import import load_model, specialize_inputs
    from smelt.options import CompileOptions

    proto = load_model(data)
    options = CompileOptions(threads=2, use_tuning_db=False)
    g = lower(specialize_inputs(proto, input_shapes(proto)), options, target)
    plan = build_plan(g, options.force_fallback)
    _check_fallbacks(plan, options)
    return generate(g, plan, target, options.codegen_threads(target)).source


def _child(data: bytes, feeds: dict, threads: int, conn) -> None:
    import smelt

    try:
        compiled = smelt.compile(data, threads=threads, input_shapes={k: v.shape for k, v in feeds.items()})
        conn.send(("ok", compiled.run(feeds)))
    except SmeltError as exc:
        conn.send(("smelt", f"{type(exc).__name__}: {exc}"))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent as a failure
        conn.send(("other", "".join(traceback.format_exception(exc))))


def run_in_child(data: bytes, feeds: dict, threads: int, timeout: float) -> tuple[str, object]:
    """Compile and run in a forked child: ("ok", outputs) / ("smelt", msg) / ("other", tb) /
    ("crash", exit code) / ("hang", seconds)."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(data, feeds, threads, child), daemon=True)
    proc.start()
    child.close()
    try:
        if parent.poll(timeout):
            try:
                return parent.recv()
            except (EOFError, OSError):
                pass
        if proc.is_alive():
            proc.kill()
            proc.join()
            return "hang", timeout
        proc.join()
        return "crash", proc.exitcode
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        parent.close()


def ort_session(data: bytes):
    """(session, None) or (None, the reason onnxruntime refuses the model)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.intra_op_num_threads = 1
    try:
        return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]), None
    except Exception as exc:  # onnxruntime raises several unrelated types
        return None, str(exc).splitlines()[0] if str(exc) else type(exc).__name__


# onnxruntime refusals that are its limits, not the model's invalidity
ORT_LIMITS = ("NOT_IMPLEMENTED", "not a registered function/op", "is under development",
              "Unsupported model IR version", "Opset", "opset", "layout_ == 0")


# value differences (not shapes or dtypes), which NaN/Inf semantics can explain
NAN_DIFFERENCE = ("NaN positions differ", "infinities differ", "max abs error")


def _non_finite_constants(data: bytes) -> bool:
    proto = onnx.load_from_string(data)
    return any(not np.all(np.isfinite(a)) for a in map(numpy_helper.to_array, proto.graph.initializer)
               if a.dtype.kind == "f")


def compare(got: list, want: list) -> str | None:
    if len(got) != len(want):
        return f"{len(got)} outputs, onnxruntime {len(want)}"
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {k}: {g.dtype}{list(g.shape)}, onnxruntime {w.dtype}{list(w.shape)}"
        if w.dtype.kind not in "fc":
            if not np.array_equal(g, w):
                return f"output {k} differs"
            continue
        if not np.array_equal(np.isnan(g), np.isnan(w)):
            return f"output {k}: NaN positions differ"
        fin = np.isfinite(w)
        if not np.array_equal(g[~fin & ~np.isnan(w)], w[~fin & ~np.isnan(w)]):
            return f"output {k}: infinities differ"
        if fin.any():
            gf, wf = g[fin].astype(np.float64), w[fin].astype(np.float64)
            scale = max(1.0, float(np.max(np.abs(wf))))
            err = float(np.max(np.abs(gf - wf)))
            tol = (1e-3 if w.dtype == np.float16 else 1e-4) * scale
            if not err <= tol:
                return f"output {k}: max abs error {err:.3g} > {tol:.3g}"
    return None


# -- the loop ----------------------------------------------------------------------------------


@dataclass
class Stats:
    iterations: int = 0
    generated: int = 0  # C source produced
    refused: dict[str, int] = field(default_factory=dict)  # SmeltError class -> count
    sampled: int = 0
    agreed: int = 0
    failures: list[str] = field(default_factory=list)
    # NaN/Inf placement that differs from onnxruntime's on models whose constants hold NaN or
    # Inf: NaN/Inf semantics are their own piece of work, so these are reported, and fail the
    # run only with strict_nan
    nan_notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        refused = ", ".join(f"{k} {v}" for k, v in sorted(self.refused.items(), key=lambda kv: -kv[1]))
        return (f"{self.iterations} mutated models in {self.seconds:.0f} s: {self.generated} generated C, "
                f"refused {sum(self.refused.values())} ({refused or '-'}); compiled and ran {self.sampled}, "
                f"{self.agreed} agreed with onnxruntime; {len(self.failures)} failures, "
                f"{len(self.nan_notes)} NaN/Inf differences on non-finite constants")


def _save(save: Path | None, seed: int, i: int, data: bytes, text: str) -> str:
    if save is None:
        return ""
    save.mkdir(parents=True, exist_ok=True)
    (save / f"{seed}-{i}.onnx").write_bytes(data)
    (save / f"{seed}-{i}.txt").write_text(text)
    return f" (saved {save / f'{seed}-{i}.onnx'})"


def fuzz(iterations: int, seconds: float, seed: int, compile_sample: int = 24, timeout: float = 120.0,
         save: Path | None = None, progress: bool = True, only: int | None = None,
         strict_nan: bool = False) -> Stats:
    seeds = seed_models()
    tgts = targets()
    stats = Stats()
    start = time.monotonic()
    every = max(1, iterations // max(1, compile_sample)) if compile_sample else 0
    bar = None
    if progress and sys.stderr.isatty():
        try:
            from tqdm import tqdm

            bar = tqdm(total=iterations, desc="fuzz", file=sys.stderr, dynamic_ncols=True, mininterval=1.0)
        except ImportError:
            bar = None
    rng_pick = random.Random(f"{seed}:sample")
    next_sample = rng_pick.randrange(every) if every else -1
    indices = [only] if only is not None else range(iterations)
    for i in indices:
        if only is None and time.monotonic() - start > seconds:
            break
        data, how = make_case(seeds, seed, i)
        stats.iterations += 1
        target = tgts[i % len(tgts)]
        ok = False
        try:
            generate_c(data, target)
            ok = True
            stats.generated += 1
        except SmeltError as exc:
            stats.refused[type(exc).__name__] = stats.refused.get(type(exc).__name__, 0) + 1
        except Exception as exc:  # noqa: BLE001 - the failure the fuzzer looks for
            text = f"iteration {i} ({how}), target {target.isa}:\n" + "".join(traceback.format_exception(exc))
            stats.failures.append(f"{i} ({how}): {type(exc).__name__}: {exc}"[:300] + _save(save, seed, i, data, text))
        if ok and every and (i >= next_sample or only is not None):
            next_sample = i + every
            failure = _run_and_compare(data, i, stats, timeout)
            if failure:
                text = f"{i} ({how}): {failure}"[:400] + _save(save, seed, i, data, failure)
                nan_only = any(w in failure for w in NAN_DIFFERENCE) and _non_finite_constants(data)
                (stats.nan_notes if nan_only and not strict_nan else stats.failures).append(text)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(refused=sum(stats.refused.values()), ran=stats.sampled, fail=len(stats.failures),
                            refresh=False)
        elif progress and stats.iterations % 1000 == 0:  # a log, not a terminal: a line per 1000
            print(f"fuzz: {stats.iterations}/{iterations} in {time.monotonic() - start:.0f} s, "
                  f"{len(stats.failures)} failures", file=sys.stderr, flush=True)
    if bar is not None:
        bar.close()
    stats.seconds = time.monotonic() - start
    return stats


def _run_and_compare(data: bytes, i: int, stats: Stats, timeout: float = 120.0) -> str | None:
    """Stage (b) for one model that got through stage (a)."""
    from smelt.frontend.onnx_import import load_model

    proto = load_model(data)
    shapes = input_shapes(proto)
    if any(math.prod(s) > 1 << 20 for s in shapes.values()):
        return None
    feeds = feeds_for(proto, shapes, i)
    sess, refusal = ort_session(data)
    stats.sampled += 1
    kind, payload = run_in_child(data, feeds, threads=1 + i % 2, timeout=timeout)
    if kind in ("crash", "hang"):
        return f"{kind} ({payload}) compiling or running in the child"
    if kind == "other":
        return f"not a SmeltError in the child:\n{payload}"
    if sess is None:
        if kind == "ok" and not any(s in refusal for s in ORT_LIMITS):
            return f"onnxruntime refuses the model ({refusal}) but smelt compiled and ran it"
        stats.agreed += 1
        return None
    try:
        want = sess.run(None, feeds)
    except Exception:  # noqa: BLE001 - onnxruntime fails at run time: smelt may answer or refuse
        stats.agreed += 1
        return None
    if kind == "smelt":
        stats.agreed += 1  # a clear refusal of a model onnxruntime runs is allowed
        return None
    why = compare(payload, want)
    if why:
        return f"smelt's answer differs from onnxruntime's: {why}"
    stats.agreed += 1
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=10000)
    ap.add_argument("--seconds", type=float, default=600.0, help="stop after this long (default 600)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile-sample", type=int, default=24,
                    help="models compiled and run in a child, spread over the iterations (default 24)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a child may take (default 120)")
    ap.add_argument("--save", type=Path, default=None, help="directory for failing models")
    ap.add_argument("--replay", type=int, default=None, help="run only iteration N (compiled and run too)")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--strict-nan", action="store_true",
                    help="NaN/Inf differences on models with non-finite constants fail too")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")  # mutated constants overflow casts; onnx.reference warns too
    save = args.save or Path(tempfile.mkdtemp(prefix="smelt-fuzz-"))
    os.environ.setdefault("SMELT_CACHE_DIR", tempfile.mkdtemp(prefix="smelt-fuzz-cache-"))
    stats = fuzz(args.iterations, args.seconds, args.seed, args.compile_sample, args.timeout, save,
                 progress=not args.no_progress, only=args.replay, strict_nan=args.strict_nan)
    for f in stats.nan_notes:
        print("NOTE (NaN/Inf semantics)", f)
    for f in stats.failures:
        print("FAIL", f)
    print(stats.summary())
    # the closing line CI reads
    print(f"fuzz: {stats.iterations - len(stats.failures)} passed, {len(stats.failures)} failed")
    return 1 if stats.failures else 0


if __name__ == "__main__":
    sys.exit(main())
