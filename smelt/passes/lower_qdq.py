"""Pass: lower QDQ-quantized Conv and MatMul to their integer ops.

Needs: shapes inferred; runs before constant folding (which would fold the weights'
DequantizeLinear into float constants and hide the pattern).
Guarantees: ``Q(op(DQ(x), DQ(W)[, DQ(bias)]))`` — the "QDQ" format onnxruntime's
``quantize_static`` writes, optionally with a Relu or a constant-bound Clip (Relu6) before the
Q — becomes ``QLinearConv`` / ``QLinearMatMul`` on the integer tensors, as onnxruntime's own QDQ
transformer does, so the model runs on the integer kernels and answers what onnxruntime answers
(it runs the same integer op, not the float graph). 1-D convs too: ``lift_1d_integer_convs``
runs them as 2-D ones of height one. The quantization is monotonic, so
``Q(clip(v, lo, hi))`` = ``min(max(Q(v), Q(lo)), Q(hi))`` exactly: a Relu or Clip between the op
and the Q is dropped where Q's saturation already makes its bounds (Q(lo) the type's minimum, as
with a zero point there, and Q(hi) its maximum: onnxruntime's ReluQuantFusion and
ClipQuantFusion drop it then), else becomes ``Max(q, Q(lo))`` (a Relu: the zero point); a Clip
whose upper bound the saturation does not make is not lowered.

The same holds for the other patterns onnxruntime's QDQ transformer rewrites (its selectors and
actions, checked against onnxruntime running the same QDQ file in tests/test_lower_qdq_more.py):
``Q(Add|Mul(DQ(a), DQ(b)))`` becomes ``com.microsoft`` QLinearAdd/QLinearMul,
``Q(Sigmoid|LeakyRelu|GlobalAveragePool|AveragePool(DQ(x)))`` QLinearSigmoid/QLinearLeakyRelu/
QLinearGlobalAveragePool/QLinearAveragePool, ``Q(Concat(DQ(x_i)...))`` QLinearConcat; a Relu or
Clip between the op and its Q only where it is dropped, as above. And ops that do not change values (MaxPool, Reshape,
Flatten, Transpose, Squeeze, Unsqueeze, Slice) between a DQ and a Q of the same scale and zero
point run on the 8-bit tensor itself, as onnxruntime's DropQDQ rules make them: the pair is
``Q(op(DQ(x)))`` = ``op(x)`` exactly, since DQ is monotonic and Q inverts it on its image.
``Q(Clip|Relu(DQ(x)))`` (an activation quantized on both sides) becomes smelt's own
``ai.smelt`` QLinearClip: a table of the float graph over the 256 codes, so exact too; and
``Q(Softmax(DQ(x)))`` over the last axis smelt's ``QDQSoftmax``, the float graph's arithmetic in
one pass per row (``_lower_softmax``).

Only what is exact is lowered: per-tensor activation scales and zero points, weights constant
(per tensor, or per output channel on the axis onnxruntime uses) or, for MatMul, a second
per-tensor activation (attention's ``Q K^T`` and ``P V`` in a QDQ transformer: onnxruntime runs
them as QLinearMatMul too), a bias only when it is the
int32 ``DQ(bias_q, x_scale * w_scale)`` the quantizer writes (a float bias would have to be
rounded, which the float graph does not do). Anything else stays the float graph the model
spells, which runs as written.
"""

from __future__ import annotations

import numpy as np

from smelt.ir.graph import Graph, Node, Value

EIGHT_BIT = ("int8", "uint8")


def _dq(g: Graph, producers: dict[str, Node], name: str) -> Node | None:
    n = producers.get(name)
    return n if n is not None and n.op == "DequantizeLinear" and n.domain in ("", "ai.onnx") else None


def _scalar(g: Graph, name: str) -> bool:
    v = g.values.get(name)
    return v is not None and v.const is not None and v.const.size == 1


def _dtype(g: Graph, name: str) -> str | None:
    v = g.values.get(name)
    return None if v is None or v.dtype is None else np.dtype(v.dtype).name


def _activation(g: Graph, dq: Node | None) -> tuple[str, str, str] | None:
    """(x_q, scale, zero point) of a per-tensor DequantizeLinear of 8-bit data, else None."""
    if dq is None or len(dq.present_inputs()) < 2 or int(dq.attr("block_size", 0)):
        return None
    xq, xs = dq.inputs[0], dq.inputs[1]
    xz = dq.inputs[2] if len(dq.inputs) > 2 else ""
    if _dtype(g, xq) not in EIGHT_BIT or not _scalar(g, xs) or _dtype(g, xs) != "float32":
        return None
    if xz and not _scalar(g, xz):
        return None
    return xq, xs, xz


def _weights(g: Graph, dq: Node | None, channels: int, axis: int) -> tuple[str, str, str] | None:
    """(W_q, scale, zero point) of a DequantizeLinear of constant 8-bit weights, per tensor or
    per ``channels`` along ``axis``, else None."""
    if dq is None or int(dq.attr("block_size", 0)):
        return None
    wq, ws = dq.inputs[0], dq.inputs[1]
    wz = dq.inputs[2] if len(dq.inputs) > 2 else ""
    if _dtype(g, wq) not in EIGHT_BIT or g.const(wq) is None or g.const(ws) is None or _dtype(g, ws) != "float32":
        return None
    if wz and g.const(wz) is None:
        return None
    size = g.const(ws).size
    if size != 1:
        rank = g.const(wq).ndim
        dq_axis = int(dq.attr("axis", 1))
        if size != channels or (dq_axis + rank) % rank != axis:
            return None
    return wq, ws, wz


def _output_q(g: Graph, consumers: dict[str, list[Node]], y: str) -> tuple[Node, Node | None] | None:
    """The QuantizeLinear that alone reads ``y`` (through one Relu, or one Clip with constant
    bounds whose upper bound the Q's saturation makes (``_act_codes``), at most), and that Relu
    or Clip."""
    if y in g.outputs:
        return None
    readers = consumers.get(y, [])
    act = None
    bounds = _clip_bounds(g, readers[0]) if len(readers) == 1 and readers[0].op in ("Relu", "Clip") else None
    if (bounds is not None and not np.isnan(bounds).any() and readers[0].domain in ("", "ai.onnx")
            and readers[0].outputs[0] not in g.outputs):
        act = readers[0]
        readers = consumers.get(act.outputs[0], [])
    if len(readers) != 1 or readers[0].op != "QuantizeLinear" or int(readers[0].attr("block_size", 0)):
        return None
    q = readers[0]
    ys, yz = q.inputs[1], q.inputs[2] if len(q.inputs) > 2 else ""
    if not _scalar(g, ys) or _dtype(g, ys) != "float32" or not yz or not _scalar(g, yz):
        return None
    if _dtype(g, q.outputs[0]) not in EIGHT_BIT:
        return None
    if act is not None and _act_codes(g, q, act)[1] is not None:
        return None  # its upper bound is below the Q's: not a Max on the code
    return q, act


def _quantize_scalar(g: Graph, q: Node, x: float) -> int:
    """What QuantizeLinear ``q`` (per tensor) writes for ``x``: saturate(round_half_even(x / scale)
    + zero point), the division in float32."""
    info = np.iinfo(np.dtype(g.values[q.outputs[0]].dtype))
    if np.isinf(x):
        return int(info.max if x > 0 else info.min)
    scale = np.float32(g.const(q.inputs[1]).reshape(-1)[0])
    zero = int(g.const(q.inputs[2]).reshape(-1)[0])
    return int(np.clip(float(np.rint(np.float32(x) / scale)) + zero, info.min, info.max))


def _act_codes(g: Graph, q: Node, act: Node) -> tuple[int | None, int | None]:
    """The clamps Relu/Clip ``act`` adds to the codes Q writes after it, as (low, high), None
    where the Q's own saturation already is that bound. Q is monotonic, so Q(clip(v, lo, hi)) =
    min(max(Q(v), Q(lo)), Q(hi)) exactly: with Q(lo) the type's minimum the low clamp is the
    saturation (onnxruntime's ReluQuantFusion / ClipQuantFusion drop the node then), else it is
    a Max on the code (a Relu: at the zero point)."""
    lo, hi = _clip_bounds(g, act)
    info = np.iinfo(np.dtype(g.values[q.outputs[0]].dtype))
    c_lo, c_hi = _quantize_scalar(g, q, lo), _quantize_scalar(g, q, hi)
    return (None if c_lo <= info.min else c_lo), (None if c_hi >= info.max else c_hi)


def _bias(g: Graph, producers: dict[str, Node], name: str, xs: str, ws: str) -> str | None:
    """The int32 bias of ``DQ(bias_q, x_scale * w_scale)``; "" when there is none; None when
    the bias is something else."""
    if not name:
        return ""
    dq = _dq(g, producers, name)
    if dq is None or _dtype(g, dq.inputs[0]) != "int32" or g.const(dq.inputs[0]) is None:
        return None
    scale = g.const(dq.inputs[1])
    zero = g.const(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2] else np.zeros(1, np.int32)
    if scale is None or zero is None or np.any(zero != 0):
        return None
    want = (np.float32(g.const(xs).reshape(-1)[0]) * g.const(ws).astype(np.float32)).reshape(-1)
    if scale.size != want.size or not np.array_equal(scale.astype(np.float32).reshape(-1), want):
        return None
    return dq.inputs[0]


def _zero_point(g: Graph, name: str, like: str) -> str:
    """``name``, or a 0 of ``like``'s dtype where the zero point was omitted (the integer ops
    require the input)."""
    return name or g.add_const(np.zeros((), g.values[like].dtype), f"{like}_zero")


def _finish(g: Graph, node: Node, q: Node, act: Node | None, op: str, inputs: list[str], dead: list[Node]) -> None:
    """Turn ``node`` into the integer ``op`` writing what ``q`` wrote (through Max on the code
    for a Relu or Clip whose low bound the saturation does not make)."""
    inputs[2] = _zero_point(g, inputs[2], inputs[0])
    inputs[5] = _zero_point(g, inputs[5], inputs[3])
    out = q.outputs[0]
    node.op, node.inputs = op, inputs
    low = None if act is None else _act_codes(g, q, act)[0]
    if act is not None and low is None:  # the requantization's saturation is the activation
        dead.append(act)
        act = None
    if act is None:
        node.outputs = [out]
    else:
        tmp = g.fresh_name(out)  # "<q output>__k": the numeric debug report maps its counter back
        v = g.values[out]
        g.add_value(Value(tmp, v.dtype, v.shape))
        node.outputs = [tmp]
        zero = int(g.const(q.inputs[2]).reshape(-1)[0])
        bound = q.inputs[2] if low == zero else g.add_const(np.array(low, v.dtype), f"{out}_low")
        act.op, act.inputs, act.outputs = "Max", [tmp, bound], [out]
        act.attrs, act.attr_protos = {}, []
    dead.append(q)


MS_DOMAIN = "com.microsoft"
SMELT_DOMAIN = "ai.smelt"  # smelt's own ops
# value-preserving ops onnxruntime runs on the integer tensor between a DQ and a Q of equal
# parameters (its DropQDQNodes selector), with their data input
MOVEMENT = ("MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Slice")
UNARY = {"Sigmoid": "QLinearSigmoid", "LeakyRelu": "QLinearLeakyRelu",
         "GlobalAveragePool": "QLinearGlobalAveragePool", "AveragePool": "QLinearAveragePool"}
BINARY = {"Add": "QLinearAdd", "Mul": "QLinearMul"}


def _q_after(g: Graph, consumers: dict[str, list[Node]], y: str) -> tuple[Node, Node | None] | None:
    """The QuantizeLinear after ``y`` (through a Relu or Clip only where the Q's saturation makes
    it a no-op, which onnxruntime then removes)."""
    out = _output_q(g, consumers, y)
    if out is None or (out[1] is not None and _act_codes(g, out[0], out[1])[0] is not None):
        return None
    return out


def _same_params(g: Graph, a: tuple[str, str, str], q: Node) -> bool:
    """Whether activation ``a`` (x_q, scale, zero point) and ``q`` quantize alike."""
    qz = q.inputs[2] if len(q.inputs) > 2 else ""
    if _dtype(g, a[0]) != _dtype(g, q.outputs[0]):
        return False
    if not np.array_equal(g.const(a[1]).reshape(-1), g.const(q.inputs[1]).reshape(-1)):
        return False
    za = g.const(a[2]).reshape(-1) if a[2] else np.zeros(1)
    zq = g.const(qz).reshape(-1) if qz else np.zeros(1)
    return bool(np.array_equal(za.astype(np.int64), zq.astype(np.int64)))


def _retarget(g: Graph, node: Node, q: Node, act: Node | None, dead: list[Node]) -> None:
    """``node`` writes what ``q`` wrote; ``q`` (and the no-op Relu or Clip) go."""
    node.outputs = [q.outputs[0]]
    dead.append(q)
    if act is not None:
        dead.append(act)


def _clip_bounds(g: Graph, node: Node) -> tuple[float, float] | None:
    """(min, max) of a Clip or Relu with constant bounds, else None."""
    if node.op == "Relu":
        return 0.0, float("inf")
    if "min" in node.attrs or "max" in node.attrs:  # opset < 11
        return float(node.attr("min", float("-inf"))), float(node.attr("max", float("inf")))
    bounds = []
    for i, default in ((1, float("-inf")), (2, float("inf"))):
        name = node.inputs[i] if len(node.inputs) > i else ""
        c = g.const(name) if name else None
        if name and (c is None or c.size != 1 or _dtype(g, name) != "float32"):
            return None
        bounds.append(float(c.reshape(-1)[0]) if name else default)
    return bounds[0], bounds[1]


def _plain_average_pool(node: Node) -> bool:
    """An AveragePool the native QLinearAveragePool computes: 1-D or 2-D, explicit pads, floor
    mode, no dilation."""
    kernel = node.attr("kernel_shape", [])
    return (len(kernel) in (1, 2) and not int(node.attr("ceil_mode", 0))
            and str(node.attr("auto_pad", "NOTSET")) in ("NOTSET", "VALID")
            and all(int(d) == 1 for d in node.attr("dilations", [1] * len(kernel))))


def _lower_elementwise(g: Graph, producers: dict[str, Node], consumers: dict[str, list[Node]],
                       dead: list[Node]) -> None:
    """The element-wise, pooling, concatenation and value-preserving patterns (module doc)."""
    gone = {id(n) for n in dead}
    for node in list(g.nodes):
        if id(node) in gone or node.domain not in ("", "ai.onnx") or node.epilogue:
            continue
        op = node.op
        if op not in BINARY and op not in UNARY and op not in MOVEMENT and op not in ("Concat", "Clip", "Relu",
                                                                                    "Softmax"):
            continue
        if op in ("Clip", "Relu"):
            _lower_clip(g, producers, consumers, node, dead, gone)
            continue
        if op == "Softmax":
            _lower_softmax(g, producers, consumers, node, dead, gone)
            continue
        if op in MOVEMENT and (len([o for o in node.outputs if o]) != 1
                               or (op == "MaxPool" and g.opset.get("", 0) < 12)):
            continue
        out = _q_after(g, consumers, node.outputs[0])
        if out is None:
            continue
        q, act = out
        if op in MOVEMENT and act is not None:
            continue
        if op == "AveragePool" and not _plain_average_pool(node):
            continue
        data = node.present_inputs() if op in BINARY or op == "Concat" else [node.inputs[0]]
        acts = [_activation(g, _dq(g, producers, x)) for x in data]
        if any(a is None for a in acts) or any(_dtype(g, a[0]) != _dtype(g, q.outputs[0]) for a in acts):
            continue
        ys, yz = q.inputs[1], q.inputs[2]
        if op in MOVEMENT:
            if not _same_params(g, acts[0], q):
                continue
            node.inputs = [acts[0][0]] + node.inputs[1:]
        elif op in BINARY:
            (a, sa, za), (b, sb, zb) = acts
            node.inputs = [a, sa, _zero_point(g, za, a), b, sb, _zero_point(g, zb, b), ys, yz]
            node.op, node.domain = BINARY[op], MS_DOMAIN
        elif op in UNARY:
            x, xs, xz = acts[0]
            node.inputs = [x, xs, _zero_point(g, xz, x), ys, yz]
            node.op, node.domain = UNARY[op], MS_DOMAIN
            if op == "GlobalAveragePool":
                node.attrs, node.attr_protos = {"channels_last": 0}, []
            elif op == "AveragePool":
                node.attrs = {k: node.attr(k) for k in ("kernel_shape", "strides", "pads", "count_include_pad",
                                                        "ceil_mode", "auto_pad") if node.attr(k) is not None}
                node.attrs["channels_last"] = 0
                node.attr_protos = []
            elif op == "LeakyRelu":
                node.attrs = {"alpha": float(node.attr("alpha", 0.01))}
                node.attr_protos = []
        else:
            node.inputs = [ys, yz] + [n for x, s, z in acts for n in (x, s, _zero_point(g, z, x))]
            node.op, node.domain = "QLinearConcat", MS_DOMAIN
        if node.domain == MS_DOMAIN:
            g.opset.setdefault(MS_DOMAIN, 1)
        _retarget(g, node, q, act, dead)
        gone.update({id(q), id(act)})


def _lower_gemm(g: Graph, producers: dict[str, Node], node: Node, x: tuple[str, str, str], q: Node,
                act: Node | None, dead: list[Node]) -> None:
    """``Q(Gemm(DQ(a), DQ(W)[, DQ(bias)]))`` → ``com.microsoft`` QGemm, as onnxruntime's QDQ
    transformer rewrites it: weights per tensor or per output column, the bias only as the int32
    ``DQ(bias_q, a_scale * w_scale)`` (with beta 1)."""
    bv = g.values.get(node.inputs[1])
    if bv is None or bv.shape is None or len(bv.shape) != 2 or int(node.attr("transA", 0)):
        return
    trans_b = int(node.attr("transB", 0))
    w = _weights(g, _dq(g, producers, node.inputs[1]), int(bv.shape[0 if trans_b else 1]), 0 if trans_b else 1)
    if w is None or _dtype(g, q.outputs[0]) != _dtype(g, x[0]):
        return
    c = node.inputs[2] if len(node.inputs) > 2 else ""
    if c and float(node.attr("beta", 1.0)) != 1.0:
        return
    bias = _bias(g, producers, c, x[1], w[1])
    if bias is None:
        return
    ys, yz = q.inputs[1], q.inputs[2]
    node.attrs = {"alpha": float(node.attr("alpha", 1.0)), "transA": 0, "transB": trans_b}
    node.attr_protos = []
    node.domain = MS_DOMAIN
    g.opset.setdefault(MS_DOMAIN, 1)
    _finish(g, node, q, act, "QGemm", [x[0], x[1], x[2], w[0], w[1], w[2], bias, ys, yz], dead)


def _native_or_undo(g: Graph, node: Node, before: tuple) -> None:
    """Keep ``node``'s rewrite into an integer op only where a native template runs it (an A of
    rank 1, K past the exact int32 range): else it goes back to the float op it was, which is
    native, rather than to a fallback."""
    from smelt.codegen.registry import find_template  # (the registry imports the templates)

    if find_template(node, g)[0] is None:
        node.op, node.domain, node.inputs, node.attrs, node.attr_protos = before


def _lower_gemm_float(g: Graph, producers: dict[str, Node], node: Node, x: tuple[str, str, str]) -> None:
    """``Gemm(DQ(a), DQ(W)[, DQ(bias)])`` with a float output (no Q after it: a classifier
    writing the model's logits) → ``com.microsoft`` QGemm without y_scale, float out, as
    onnxruntime's QDQ transformer rewrites it: the product in exact int32 over 8-bit weights
    (a quarter of the float weights' bytes), then ``float(acc + C) * (alpha * a_scale *
    w_scale[j])``."""
    if _dtype(g, node.outputs[0]) != "float32" or _dtype(g, x[0]) not in ("uint8", "int8"):
        return
    bv = g.values.get(node.inputs[1])
    if bv is None or bv.shape is None or len(bv.shape) != 2 or int(node.attr("transA", 0)):
        return
    trans_b = int(node.attr("transB", 0))
    w = _weights(g, _dq(g, producers, node.inputs[1]), int(bv.shape[0 if trans_b else 1]), 0 if trans_b else 1)
    c = node.inputs[2] if len(node.inputs) > 2 else ""
    if w is None or (c and float(node.attr("beta", 1.0)) != 1.0):
        return
    bias = _bias(g, producers, c, x[1], w[1])
    if bias is None:
        return
    before = (node.op, node.domain, list(node.inputs), dict(node.attrs), list(node.attr_protos))
    node.attrs = {"alpha": float(node.attr("alpha", 1.0)), "transA": 0, "transB": trans_b}
    node.attr_protos = []
    node.op, node.domain = "QGemm", MS_DOMAIN
    node.inputs = [x[0], x[1], _zero_point(g, x[2], x[0]), w[0], w[1], _zero_point(g, w[2], w[0]), bias]
    g.opset.setdefault(MS_DOMAIN, 1)
    _native_or_undo(g, node, before)


def _lower_matmul_float(g: Graph, producers: dict[str, Node], node: Node, x: tuple[str, str, str]) -> None:
    """``MatMul(DQ(a), DQ(W))`` with a float output → ``com.microsoft`` MatMulIntegerToFloat, as
    onnxruntime's QDQ transformer rewrites it: the product in exact int32 over the 8-bit
    weights, then ``float(acc) * (a_scale * w_scale[j])``. Constant 2-D weights per tensor or
    per column only (an activation B or a batched one stays float, as there)."""
    bv = g.values.get(node.inputs[1])
    if (_dtype(g, node.outputs[0]) != "float32" or _dtype(g, x[0]) not in ("uint8", "int8")
            or bv is None or bv.shape is None or len(bv.shape) != 2):
        return
    w = _weights(g, _dq(g, producers, node.inputs[1]), int(bv.shape[1]), 1)
    if w is None:
        return
    before = (node.op, node.domain, list(node.inputs), dict(node.attrs), list(node.attr_protos))
    node.op, node.domain = "MatMulIntegerToFloat", MS_DOMAIN
    node.inputs = [x[0], w[0], x[1], w[1], _zero_point(g, x[2], x[0]), _zero_point(g, w[2], w[0])]
    g.opset.setdefault(MS_DOMAIN, 1)
    _native_or_undo(g, node, before)


def _lower_clip(g: Graph, producers: dict[str, Node], consumers: dict[str, list[Node]], node: Node,
                dead: list[Node], gone: set[int]) -> None:
    """``Q(Clip|Relu(DQ(x)))`` → smelt's ``QLinearClip``: each of the 256 codes through the float
    graph (dequantize, clamp, quantize) at compile time, so a byte lookup at run time answers
    what the float DQ, Clip and Q kernels answer, element by element (what smelt's quantizer
    wrote around MobileNet's Relu6 before it folded a Clip into the op's output)."""
    bounds = _clip_bounds(g, node)
    readers = consumers.get(node.outputs[0], [])
    if bounds is None or node.outputs[0] in g.outputs or len(readers) != 1 or readers[0].op != "QuantizeLinear":
        return
    q = readers[0]
    out = _output_q(g, consumers, node.outputs[0])
    act = _activation(g, _dq(g, producers, node.inputs[0]))
    if out is None or out[1] is not None or act is None or _dtype(g, act[0]) != _dtype(g, q.outputs[0]):
        return
    x, xs, xz = act
    node.inputs = [x, xs, _zero_point(g, xz, x), q.inputs[1], q.inputs[2]]
    node.op, node.domain = "QLinearClip", SMELT_DOMAIN
    node.attrs, node.attr_protos = {"min": bounds[0], "max": bounds[1]}, []
    g.opset.setdefault(SMELT_DOMAIN, 1)
    _retarget(g, node, q, None, dead)
    gone.add(id(q))


def _lower_softmax(g: Graph, producers: dict[str, Node], consumers: dict[str, list[Node]], node: Node,
                   dead: list[Node], gone: set[int]) -> None:
    """``Q(Softmax(DQ(x)))`` over the last axis → smelt's ``QDQSoftmax``: one pass per row that
    dequantizes, normalizes and quantizes with the three kernels' own arithmetic in their order
    (templates/softmax.py), so the codes are the float graph's, where the graph made two more
    passes over a float tensor four times the codes' size (a QDQ transformer's attention
    probabilities: smart-turn's [6, 400, 400] four times). Not onnxruntime's QLinearSoftmax,
    whose lookup table rounds otherwise: onnxruntime runs that one for this pattern, within one
    code of this."""
    from smelt.codegen.registry import find_template  # (the registry imports the templates)

    xv = g.values.get(node.inputs[0])
    if xv is None or xv.shape is None or not xv.shape:
        return
    rank = len(xv.shape)
    axis = int(node.attr("axis", -1 if g.opset.get("", 13) >= 13 else 1))
    if (axis + rank) % rank != rank - 1:  # the last axis (opset < 13 coerces there too then)
        return
    out = _output_q(g, consumers, node.outputs[0])
    act = _activation(g, _dq(g, producers, node.inputs[0]))
    if out is None or out[1] is not None or act is None:
        return
    q = out[0]
    x, xs, xz = act
    before = (node.op, node.domain, list(node.inputs), dict(node.attrs), list(node.attr_protos))
    node.inputs = [x, xs, _zero_point(g, xz, x), q.inputs[1], q.inputs[2]]
    node.op, node.domain = "QDQSoftmax", SMELT_DOMAIN
    node.attrs, node.attr_protos = {}, []
    g.opset.setdefault(SMELT_DOMAIN, 1)
    outputs = list(node.outputs)
    node.outputs = [q.outputs[0]]
    if find_template(node, g)[0] is None:
        node.op, node.domain, node.inputs, node.attrs, node.attr_protos = before
        node.outputs = outputs
        return
    dead.append(q)
    gone.add(id(q))


def _integer_matmul_shapes(a: tuple, b: tuple) -> bool:
    """Operand shapes the native integer MatMul takes (templates/int_matmul.py): both at least
    2-D, B 2-D or with A's batch dims, K within the exact int32 range. Others stay float rather
    than lower to an integer op that would run on the fallback."""
    return (len(a) >= 2 and len(b) >= 2 and (len(b) == 2 or tuple(b[:-2]) == tuple(a[:-2]))
            and a[-1] == b[-2] and int(a[-1]) <= 1 << 15)


def lower_qdq(g: Graph) -> Graph:
    producers = g.producers()
    consumers = g.consumers()
    dead: list[Node] = []
    for node in g.iter_op("Conv", "MatMul", "Gemm"):
        if node.epilogue:
            continue
        out = _output_q(g, consumers, node.outputs[0])
        x = _activation(g, _dq(g, producers, node.inputs[0]))
        if x is None:
            continue
        if out is None:
            if node.op == "Gemm":
                _lower_gemm_float(g, producers, node, x)
            elif node.op == "MatMul":
                _lower_matmul_float(g, producers, node, x)
            continue
        q, act = out
        ys, yz = q.inputs[1], q.inputs[2]
        if node.op == "Conv":
            wv = g.values.get(node.inputs[1])
            # 1-D convs too (a Whisper encoder's front): lift_1d_integer_convs makes them 2-D
            if wv is None or wv.shape is None or len(wv.shape) not in (3, 4):
                continue
            w = _weights(g, _dq(g, producers, node.inputs[1]), int(wv.shape[0]), 0)
            if w is None:
                continue
            bias = _bias(g, producers, node.inputs[2] if len(node.inputs) > 2 else "", x[1], w[1])
            if bias is None:
                continue
            _finish(g, node, q, act, "QLinearConv", [x[0], x[1], x[2], w[0], w[1], w[2], ys, yz]
                    + ([bias] if bias else []), dead)
        elif node.op == "Gemm":
            _lower_gemm(g, producers, node, x, q, act, dead)
        else:
            bv, av = g.values.get(node.inputs[1]), g.values.get(node.inputs[0])
            if bv is None or bv.shape is None or av is None or av.shape is None:
                continue
            w = (_weights(g, _dq(g, producers, node.inputs[1]), int(bv.shape[1]), 1) if len(bv.shape) == 2
                 else None)
            if w is None:  # B an activation too (attention's Q K^T and P V): both per tensor
                w = _activation(g, _dq(g, producers, node.inputs[1]))
                if w is None or not _integer_matmul_shapes(tuple(av.shape), tuple(bv.shape)):
                    continue
            _finish(g, node, q, act, "QLinearMatMul", [x[0], x[1], x[2], w[0], w[1], w[2], ys, yz], dead)
    _lower_elementwise(g, producers, consumers, dead)
    g.remove_nodes(dead)
    g.prune_values()
    return g
