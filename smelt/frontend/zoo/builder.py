"""A small, shape-tracking builder for ONNX inference graphs.

The zoo needs a few dozen reference networks that are (a) faithful to the
published architectures, so benchmark numbers are comparable with other
runtimes, (b) bit-identical from run to run, so results and caches are
reproducible, and (c) free of any heavyweight framework dependency, so the
zoo works wherever ``smelt`` itself does.  Exporting from a training
framework gives (a) but not (b) or (c); writing ``onnx.helper`` calls by hand
gives (b) and (c) but makes (a) error-prone because every layer needs its
input channel count and spatial size spelled out.

:class:`ModelBuilder` closes that gap: it records the shape of every value it
creates, so a layer only states what changes (``conv(x, 64, 3)``), and it
draws every weight from one seeded generator in program order.  Weights are
random but *statistically* realistic (He-normal convolutions, BatchNorm
statistics of trained nets), because an optimizer that folds BatchNorm or
fuses activations must be tested on numbers that look like real ones.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
# IR 8 is the version that introduced opset 17; every onnxruntime since 1.12
# accepts it, while the newest IR that onnx itself defaults to may not be.
IR_VERSION = 8

Dim = int | str
Shape = tuple[Dim, ...]
IntOrPair = int | Sequence[int]

# Initializer input slots that hold statistics or constants, not learned
# parameters.  Used to count parameters the way PyTorch/torchvision do.
_NON_PARAMETER_SLOTS = {
    ("BatchNormalization", 3),
    ("BatchNormalization", 4),
    ("Clip", 1),
    ("Clip", 2),
    ("Dropout", 1),
    ("Dropout", 2),
}


def count_parameters(model: onnx.ModelProto) -> int:
    """Count learnable parameters in ``model`` the way torchvision reports them.

    BatchNorm running statistics, Clip bounds, dropout ratios and integer
    shape/axes tensors are excluded so the number is directly comparable with
    ``sum(p.numel() for p in torch_model.parameters())``.
    """
    excluded: set[str] = set()
    used_as_param: set[str] = set()
    for node in model.graph.node:
        for slot, name in enumerate(node.input):
            if (node.op_type, slot) in _NON_PARAMETER_SLOTS:
                excluded.add(name)
            else:
                used_as_param.add(name)
    float_types = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}
    total = 0
    for init in model.graph.initializer:
        if init.data_type not in float_types:
            continue
        if init.name in excluded and init.name not in used_as_param:
            continue
        total += math.prod(init.dims)
    return total


def _pair(v: IntOrPair, n: int = 2) -> tuple[int, ...]:
    if isinstance(v, int):
        return (v,) * n
    t = tuple(int(i) for i in v)
    if len(t) != n:
        raise ValueError(f"expected {n} values, got {t}")
    return t


def _pool_out(size: Dim, k: int, s: int, p0: int, p1: int, d: int = 1, ceil: bool = False) -> Dim:
    """Output extent of a conv/pool window along one axis (ONNX semantics)."""
    if isinstance(size, str):
        # Spatial dims are always concrete in the zoo; keep symbolic ones opaque.
        return f"{size}_out"
    span = size + p0 + p1 - d * (k - 1) - 1
    if ceil:
        out = -(-span // s) + 1
        # ONNX/PyTorch: the last window must start inside the (left-padded) input.
        if (out - 1) * s >= size + p0:
            out -= 1
        return out
    return span // s + 1


class ModelBuilder:
    """Build an ONNX graph layer by layer while tracking shapes and dtypes.

    Values are plain tensor-name strings.  Every method takes an optional
    ``name``; with :meth:`scope` the names nest like PyTorch module paths
    (``layer1.0.conv1``), so a profile or a fused kernel can be traced back to
    the layer it came from.  Weight initializers get PyTorch-style suffixes
    (``.weight``, ``.bias``, ``.running_mean`` ...).
    """

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self._nodes: list[onnx.NodeProto] = []
        self._inputs: list[onnx.ValueInfoProto] = []
        self._outputs: list[str] = []
        # Weights stay numpy arrays until build(): validation runs on a
        # weightless skeleton, so a 500 MB model is serialized zero times.
        self._weights: list[tuple[str, np.ndarray]] = []
        self._small: list[TensorProto] = []  # shared constants: clip bounds, axes ...
        self._consts: dict[tuple[str, bytes, tuple[int, ...]], str] = {}
        self._shapes: dict[str, Shape | None] = {}
        self._dtypes: dict[str, int] = {}
        self._producer: dict[str, onnx.NodeProto] = {}
        self._used: set[str] = set()
        self._scope: list[str] = []
        self.num_params = 0

    # ------------------------------------------------------------------ names
    @contextlib.contextmanager
    def scope(self, name: str | int) -> Iterator[None]:
        """Prefix names created inside the block with ``name.`` (module path)."""
        self._scope.append(str(name))
        try:
            yield
        finally:
            self._scope.pop()

    def _unique(self, base: str) -> str:
        name = base
        i = 1
        while name in self._used:
            name = f"{base}_{i}"
            i += 1
        self._used.add(name)
        return name

    def _qualify(self, name: str | None, default: str) -> str:
        leaf = name if name is not None else default
        return self._unique(".".join([*self._scope, leaf]))

    # ----------------------------------------------------------------- shapes
    def shape(self, value: str) -> Shape:
        """Shape of ``value`` (ints, or strings for symbolic dims)."""
        shp = self._shapes.get(value)
        if shp is None:
            shp = self._infer_shape(value)
        return shp

    def channels(self, value: str) -> int:
        """Size of axis 1 (channels for NCHW, features for [N, F])."""
        c = self.shape(value)[1]
        if not isinstance(c, int):
            raise ValueError(f"channel dim of {value!r} is symbolic: {c!r}")
        return c

    def _infer_shape(self, value: str) -> Shape:
        """Fall back to ONNX shape inference for values made by :meth:`op`."""
        inferred = onnx.shape_inference.infer_shapes(
            self._skeleton("probe", []), strict_mode=True, data_prop=True
        )
        for vi in inferred.graph.value_info:
            if vi.name == value and vi.type.tensor_type.HasField("shape"):
                shp = _shape_of(vi)
                self._shapes[value] = shp
                self._dtypes[value] = vi.type.tensor_type.elem_type
                return shp
        raise ValueError(f"cannot infer the shape of {value!r}")

    def _skeleton(
        self, name: str, outputs: list[onnx.ValueInfoProto], doc: str = ""
    ) -> onnx.ModelProto:
        """The model with weights turned into typed graph inputs (no data).

        Checking and shape inference only need weight *types*; serializing
        hundreds of MB of weights for them would dominate build time.
        Shared constants keep their data so Reshape/Squeeze shapes infer.
        """
        weight_inputs = [
            helper.make_tensor_value_info(n, self._dtypes[n], list(a.shape))
            for n, a in self._weights
        ]
        graph = helper.make_graph(
            self._nodes, name, [*self._inputs, *weight_inputs], outputs, self._small, doc_string=doc
        )
        return self._wrap(graph)

    # -------------------------------------------------------- inputs/outputs
    def input(self, name: str, shape: Sequence[Dim], dtype: Any = np.float32) -> str:
        """Declare a graph input; string entries in ``shape`` are symbolic dims."""
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        if name in self._used:
            raise ValueError(f"name {name!r} already used")
        self._used.add(name)
        self._inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        self._shapes[name] = tuple(shape)
        self._dtypes[name] = elem
        return name

    def output(self, value: str, name: str | None = None) -> str:
        """Mark ``value`` as a graph output, renaming its tensor to ``name``."""
        self.shape(value)  # resolve type/shape before the tensor changes name
        if name is not None and name != value:
            if name in self._used:
                raise ValueError(f"name {name!r} already used")
            node = self._producer.get(value)
            if node is None:
                # Graph inputs and initializers cannot be renamed; alias them.
                self._used.add(name)
                self._nodes.append(helper.make_node("Identity", [value], [name], name=name))
            else:
                self._used.add(name)
                self._rename(value, name, node)
            self._shapes[name] = self._shapes.get(value)
            self._dtypes[name] = self._dtypes[value]
            value = name
        self._outputs.append(value)
        return value

    def _rename(self, old: str, new: str, producer: onnx.NodeProto) -> None:
        for i, o in enumerate(producer.output):
            if o == old:
                producer.output[i] = new
        for node in self._nodes:
            for i, inp in enumerate(node.input):
                if inp == old:
                    node.input[i] = new
        self._outputs = [new if o == old else o for o in self._outputs]
        self._producer[new] = self._producer.pop(old)

    # ------------------------------------------------------------ constants
    def initializer(self, array: np.ndarray, name_hint: str, *, learnable: bool = True) -> str:
        """Add ``array`` as an initializer named after ``name_hint`` (made unique).

        ``learnable=False`` marks statistics (BatchNorm running mean/var) that
        do not count towards :attr:`num_params`.
        """
        name = self._unique(name_hint)
        arr = np.asarray(array, order="C")  # kept by reference until build()
        self._weights.append((name, arr))
        self._shapes[name] = tuple(arr.shape)
        self._dtypes[name] = helper.np_dtype_to_tensor_dtype(arr.dtype)
        if learnable and np.issubdtype(arr.dtype, np.floating):
            self.num_params += int(arr.size)
        return name

    def const(self, value: Any, dtype: Any = np.float32) -> str:
        """A shared, named constant (Clip bounds, axes, shapes ...); deduplicated."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.tobytes(), arr.shape)
        if key not in self._consts:
            flat = "_".join(str(v) for v in arr.reshape(-1).tolist()).replace("-", "m")
            name = self._unique(f"const.{flat}")
            self._small.append(numpy_helper.from_array(arr, name))
            self._shapes[name] = tuple(arr.shape)
            self._dtypes[name] = self._small[-1].data_type
            self._consts[key] = name
        return self._consts[key]

    # ------------------------------------------------------------ random init
    def he_normal(self, shape: Sequence[int], fan_in: int) -> np.ndarray:
        """He/Kaiming-normal weights: keep activation variance ~constant through ReLUs."""
        w = self.rng.standard_normal(tuple(shape), dtype=np.float32)
        w *= np.float32(math.sqrt(2.0 / fan_in))
        return w

    def uniform(self, shape: Sequence[int], bound: float) -> np.ndarray:
        """Uniform(-bound, bound) float32 weights (PyTorch RNN default init)."""
        return self.rng.uniform(-bound, bound, size=tuple(shape)).astype(np.float32)

    def small_bias(self, n: int, std: float = 0.01) -> np.ndarray:
        """Small nonzero biases: zero biases would hide bias-folding bugs."""
        b = self.rng.standard_normal(n, dtype=np.float32)
        b *= np.float32(std)
        return b

    # ------------------------------------------------------------------ nodes
    def op(
        self,
        op_type: str,
        inputs: Sequence[str],
        attrs: dict[str, Any] | None = None,
        n_outputs: int = 1,
        name: str | None = None,
        out_shapes: Sequence[Shape | None] | None = None,
        out_dtype: int | None = None,
    ) -> Any:
        """Append a node of any type.  Returns one name, or a tuple for ``n_outputs > 1``.

        Output shapes may be given; otherwise they are inferred on demand.
        An empty string in ``inputs`` marks an omitted optional input.
        """
        node_name = self._qualify(name, op_type.lower())
        shapes = list(out_shapes) if out_shapes is not None else [None] * n_outputs
        if len(shapes) != n_outputs:
            raise ValueError("op: len(out_shapes) != n_outputs")
        outs = self._emit_multi(
            op_type, list(inputs), dict(attrs or {}), node_name, shapes, out_dtype
        )
        for o, shp in zip(outs, shapes, strict=True):
            if shp is None and out_dtype is None:
                del self._dtypes[o]  # unknown until inferred; don't guess
        return outs[0] if n_outputs == 1 else outs

    def conv(
        self,
        x: str,
        out_channels: int,
        kernel: IntOrPair,
        stride: IntOrPair = 1,
        pad: IntOrPair = 0,
        groups: int = 1,
        dilation: IntOrPair = 1,
        bias: bool = False,
        name: str | None = None,
    ) -> str:
        """2-D convolution with He-normal weights; ``pad`` is symmetric per axis."""
        n, c, h, w = self.shape(x)
        if not isinstance(c, int) or c % groups or out_channels % groups:
            raise ValueError(
                f"conv: channels {c} / {out_channels} not divisible by groups {groups}"
            )
        k, s, p, d = _pair(kernel), _pair(stride), _pair(pad), _pair(dilation)
        node_name = self._qualify(name, "conv")
        cin_g = c // groups
        wt = self.he_normal((out_channels, cin_g, *k), fan_in=cin_g * k[0] * k[1])
        inputs = [x, self.initializer(wt, f"{node_name}.weight")]
        if bias:
            inputs.append(self.initializer(self.small_bias(out_channels), f"{node_name}.bias"))
        oh = _pool_out(h, k[0], s[0], p[0], p[0], d[0])
        ow = _pool_out(w, k[1], s[1], p[1], p[1], d[1])
        attrs = {
            "kernel_shape": list(k),
            "strides": list(s),
            "pads": [p[0], p[1], p[0], p[1]],
            "dilations": list(d),
            "group": groups,
        }
        return self._emit("Conv", inputs, attrs, node_name, (n, out_channels, oh, ow))

    def batchnorm(
        self,
        x: str,
        name: str | None = None,
        gamma: tuple[float, float] = (0.8, 1.2),
        eps: float = 1e-5,
    ) -> str:
        """Inference BatchNormalization with statistics that look like a trained net's.

        ``gamma`` is the uniform range of the scale; residual branches pass a
        small range (e.g. (0.1, 0.5)) so the skip path dominates and deep
        networks keep O(1) activations, as they do after training.
        """
        c = self.channels(x)
        node_name = self._qualify(name, "bn")
        rng = self.rng
        scale = rng.uniform(*gamma, size=c).astype(np.float32)
        beta = (rng.standard_normal(c) * 0.05).astype(np.float32)
        mean = (rng.standard_normal(c) * 0.1).astype(np.float32)
        var = rng.uniform(0.5, 2.0, size=c).astype(np.float32)
        inputs = [
            x,
            self.initializer(scale, f"{node_name}.weight"),
            self.initializer(beta, f"{node_name}.bias"),
            self.initializer(mean, f"{node_name}.running_mean", learnable=False),
            self.initializer(var, f"{node_name}.running_var", learnable=False),
        ]
        return self._emit("BatchNormalization", inputs, {"epsilon": eps}, node_name, self.shape(x))

    def relu(self, x: str, name: str | None = None) -> str:
        """Elementwise ReLU."""
        return self._emit("Relu", [x], {}, self._qualify(name, "relu"), self.shape(x))

    def clip(self, x: str, lo: float, hi: float, name: str | None = None) -> str:
        """Opset-11+ Clip with bounds as (shared) initializer inputs, e.g. ReLU6."""
        inputs = [x, self.const(lo), self.const(hi)]
        return self._emit("Clip", inputs, {}, self._qualify(name, "clip"), self.shape(x))

    def add(self, a: str, b: str, name: str | None = None) -> str:
        """Elementwise Add (residual connections); shapes must match exactly."""
        if self.shape(a) != self.shape(b):
            raise ValueError(f"add: shape mismatch {self.shape(a)} vs {self.shape(b)}")
        return self._emit("Add", [a, b], {}, self._qualify(name, "add"), self.shape(a))

    def _pool(
        self,
        op_type: str,
        x: str,
        kernel: IntOrPair,
        stride: IntOrPair | None,
        pad: IntOrPair,
        ceil_mode: bool,
        extra: dict[str, Any],
        name: str | None,
    ) -> str:
        n, c, h, w = self.shape(x)
        k = _pair(kernel)
        s = _pair(stride) if stride is not None else k
        p = _pair(pad)
        oh = _pool_out(h, k[0], s[0], p[0], p[0], ceil=ceil_mode)
        ow = _pool_out(w, k[1], s[1], p[1], p[1], ceil=ceil_mode)
        attrs = {
            "kernel_shape": list(k),
            "strides": list(s),
            "pads": [p[0], p[1], p[0], p[1]],
            **extra,
        }
        if ceil_mode:
            attrs["ceil_mode"] = 1
        return self._emit(op_type, [x], attrs, self._qualify(name, op_type.lower()), (n, c, oh, ow))

    def maxpool(
        self,
        x: str,
        kernel: IntOrPair,
        stride: IntOrPair | None = None,
        pad: IntOrPair = 0,
        ceil_mode: bool = False,
        name: str | None = None,
    ) -> str:
        """MaxPool; ``stride`` defaults to the kernel size like PyTorch.

        With ``ceil_mode`` the output size follows PyTorch/onnxruntime (a last
        window starting in the right padding is dropped).  onnx's shape
        inference omits that rule, so build() rejects the rare shapes where the
        two disagree instead of emitting a model whose declared shapes are wrong.
        """
        return self._pool("MaxPool", x, kernel, stride, pad, ceil_mode, {}, name)

    def avgpool(
        self,
        x: str,
        kernel: IntOrPair,
        stride: IntOrPair | None = None,
        pad: IntOrPair = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        name: str | None = None,
    ) -> str:
        """AveragePool; counts padding by default, matching PyTorch's AvgPool2d."""
        extra = {"count_include_pad": int(count_include_pad)}
        return self._pool("AveragePool", x, kernel, stride, pad, ceil_mode, extra, name)

    def global_avgpool(self, x: str, name: str | None = None) -> str:
        """GlobalAveragePool to [N, C, 1, 1]."""
        n, c, *_ = self.shape(x)
        return self._emit(
            "GlobalAveragePool", [x], {}, self._qualify(name, "avgpool"), (n, c, 1, 1)
        )

    def concat(self, xs: Sequence[str], axis: int = 1, name: str | None = None) -> str:
        """Concat along ``axis`` (channels by default)."""
        shapes = [self.shape(x) for x in xs]
        out = list(shapes[0])
        for s in shapes[1:]:
            if len(s) != len(out) or any(
                a != b for i, (a, b) in enumerate(zip(s, out, strict=True)) if i != axis % len(out)
            ):
                raise ValueError(f"concat: incompatible shapes {shapes}")
        ax = axis % len(out)
        if all(isinstance(s[ax], int) for s in shapes):
            out[ax] = sum(int(s[ax]) for s in shapes)
        else:
            out[ax] = f"concat_{ax}"
        return self._emit(
            "Concat", list(xs), {"axis": axis}, self._qualify(name, "concat"), tuple(out)
        )

    def flatten(self, x: str, axis: int = 1, name: str | None = None) -> str:
        """Flatten to 2-D at ``axis``."""
        shp = self.shape(x)
        tail = shp[axis:]
        inner: Dim = math.prod(tail) if all(isinstance(d, int) for d in tail) else "flat"  # type: ignore[arg-type]
        head = shp[:axis]
        outer: Dim = (
            head[0]
            if len(head) == 1
            else (math.prod(head) if all(isinstance(d, int) for d in head) else "flat0")
        )  # type: ignore[arg-type]
        return self._emit(
            "Flatten", [x], {"axis": axis}, self._qualify(name, "flatten"), (outer, inner)
        )

    def gemm(self, x: str, out_features: int, bias: bool = True, name: str | None = None) -> str:
        """Fully connected layer as Gemm with a PyTorch-layout [out, in] weight (transB=1)."""
        n, f = self.shape(x)
        if not isinstance(f, int):
            raise ValueError(f"gemm: symbolic feature dim {f!r}")
        node_name = self._qualify(name, "fc")
        inputs = [
            x,
            self.initializer(self.he_normal((out_features, f), fan_in=f), f"{node_name}.weight"),
        ]
        if bias:
            inputs.append(self.initializer(self.small_bias(out_features), f"{node_name}.bias"))
        return self._emit("Gemm", inputs, {"transB": 1}, node_name, (n, out_features))

    def dropout(self, x: str, ratio: float = 0.5, name: str | None = None) -> str:
        """Inference-mode Dropout (an identity) with an explicit ratio input.

        Kept in the graph on purpose: exporters differ on whether they strip
        it, and the optimizer's dropout elimination must see one.
        """
        inputs = [x, self.const(ratio)]
        return self._emit("Dropout", inputs, {}, self._qualify(name, "dropout"), self.shape(x))

    def transpose(self, x: str, perm: Sequence[int], name: str | None = None) -> str:
        """Transpose with an explicit permutation."""
        shp = self.shape(x)
        return self._emit(
            "Transpose",
            [x],
            {"perm": list(perm)},
            self._qualify(name, "transpose"),
            tuple(shp[p] for p in perm),
        )

    def reshape(self, x: str, shape: Sequence[int], name: str | None = None) -> str:
        """Reshape to a constant target (ONNX rules: 0 copies a dim, -1 infers one)."""
        src = self.shape(x)
        out: list[Dim] = [src[i] if d == 0 else d for i, d in enumerate(shape)]
        if -1 in out:
            known = [d for d in out if d != -1]
            # Symbolic dims cancel if both sides carry the same ones (e.g. T, B).
            if sorted(d for d in src if isinstance(d, str)) == sorted(
                d for d in known if isinstance(d, str)
            ):
                num = math.prod(d for d in src if isinstance(d, int))
                den = math.prod(d for d in known if isinstance(d, int))
                out[out.index(-1)] = num // den
            else:
                out[out.index(-1)] = "reshaped"
        target = self.const(list(shape), np.int64)
        return self._emit("Reshape", [x, target], {}, self._qualify(name, "reshape"), tuple(out))

    def squeeze(self, x: str, axes: Sequence[int], name: str | None = None) -> str:
        """Opset-13+ Squeeze with axes as a (shared) initializer input."""
        shp = self.shape(x)
        ax = {a % len(shp) for a in axes}
        out = tuple(d for i, d in enumerate(shp) if i not in ax)
        return self._emit(
            "Squeeze",
            [x, self.const(list(axes), np.int64)],
            {},
            self._qualify(name, "squeeze"),
            out,
        )

    def _rnn(
        self,
        op_type: str,
        gates: int,
        x: str,
        hidden_size: int,
        direction: str,
        name: str | None,
        attrs: dict[str, Any],
        states: Sequence[str | None],
    ) -> tuple[str, ...]:
        if direction not in ("forward", "reverse", "bidirectional"):
            raise ValueError(f"{op_type}: bad direction {direction!r}")
        t, b, e = self.shape(x)
        if not isinstance(e, int):
            raise ValueError(f"{op_type}: symbolic input size {e!r}")
        nd = 2 if direction == "bidirectional" else 1
        node_name = self._qualify(name, op_type.lower())
        bound = 1.0 / math.sqrt(hidden_size)
        gh = gates * hidden_size
        w = self.initializer(self.uniform((nd, gh, e), bound), f"{node_name}.W")
        r = self.initializer(self.uniform((nd, gh, hidden_size), bound), f"{node_name}.R")
        bias = self.initializer(self.uniform((nd, 2 * gh), bound), f"{node_name}.B")
        inputs = [x, w, r, bias]
        if any(st is not None for st in states):
            inputs += ["", *(st or "" for st in states)]  # "" = omitted sequence_lens
            while inputs[-1] == "":
                inputs.pop()
        all_attrs = {"hidden_size": hidden_size, "direction": direction, "layout": 0, **attrs}
        n_out = 3 if op_type == "LSTM" else 2
        state_shape = (nd, b, hidden_size)
        shapes = [(t, nd, b, hidden_size), state_shape, state_shape][:n_out]
        # Readable output names: <node>, <node>.Y_h, <node>.Y_c.
        outs = [node_name] + [
            self._unique(f"{node_name}.{sfx}") for sfx in ("Y_h", "Y_c")[: n_out - 1]
        ]
        self._nodes.append(helper.make_node(op_type, inputs, outs, name=node_name, **all_attrs))
        for o, shp in zip(outs, shapes, strict=True):
            self._producer[o] = self._nodes[-1]
            self._shapes[o] = shp
            self._dtypes[o] = self._dtypes.get(x, TensorProto.FLOAT)
        return tuple(outs)

    def lstm(
        self,
        x: str,
        hidden_size: int,
        direction: str = "forward",
        initial_h: str | None = None,
        initial_c: str | None = None,
        name: str | None = None,
    ) -> tuple[str, str, str]:
        """ONNX LSTM (layout 0, gate order i,o,f,c) -> (Y [T,D,B,H], Y_h, Y_c).

        ``x`` is [T, B, E].  Weights are uniform(-1/sqrt(H), 1/sqrt(H)),
        PyTorch's default, so gate pre-activations sit in the non-saturated
        range like a real model's.  Initial states ([D, B, H]) are optional.
        """
        return self._rnn(
            "LSTM",
            4,
            x,
            hidden_size,
            direction,
            name,
            {},  # type: ignore[return-value]
            [initial_h, initial_c],
        )

    def gru(
        self,
        x: str,
        hidden_size: int,
        direction: str = "forward",
        initial_h: str | None = None,
        linear_before_reset: int = 1,
        name: str | None = None,
    ) -> tuple[str, str]:
        """ONNX GRU (layout 0, gate order z,r,h) -> (Y [T,D,B,H], Y_h).

        ``linear_before_reset=1`` by default because that is the cuDNN/PyTorch
        formulation, i.e. what exported real-world GRUs use.
        """
        return self._rnn(
            "GRU",
            3,
            x,
            hidden_size,
            direction,
            name,  # type: ignore[return-value]
            {"linear_before_reset": linear_before_reset},
            [initial_h],
        )

    def _emit(
        self, op_type: str, inputs: list[str], attrs: dict[str, Any], node_name: str, shape: Shape
    ) -> str:
        return self._emit_multi(op_type, inputs, attrs, node_name, [shape])[0]

    def _emit_multi(
        self,
        op_type: str,
        inputs: list[str],
        attrs: dict[str, Any],
        node_name: str,
        shapes: Sequence[Shape | None],
        dtype: int | None = None,
    ) -> tuple[str, ...]:
        outs = [node_name] + [self._unique(f"{node_name}.output{i}") for i in range(1, len(shapes))]
        self._nodes.append(helper.make_node(op_type, inputs, outs, name=node_name, **attrs))
        if dtype is None:
            first = next((i for i in inputs if i), None)
            if first and first not in self._dtypes:
                self.shape(first)  # an untyped op() output: infer it now
            dtype = self._dtypes[first] if first else TensorProto.FLOAT
        for o, s in zip(outs, shapes, strict=True):
            self._producer[o] = self._nodes[-1]
            self._shapes[o] = s
            self._dtypes[o] = dtype
        return tuple(outs)

    # ------------------------------------------------------------------ build
    @staticmethod
    def _wrap(graph: onnx.GraphProto) -> onnx.ModelProto:
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name="smelt.zoo",
            producer_version="1",
        )
        model.ir_version = IR_VERSION
        return model

    def build(self, name: str, doc: str = "") -> onnx.ModelProto:
        """Assemble, validate and shape-infer the model.

        Runs the ONNX checker and strict shape inference (on the weightless
        skeleton, see :meth:`_skeleton`; the weights themselves are dense
        numpy arrays and valid by construction), then cross-checks the
        inferred shapes against the builder's own bookkeeping so an
        architecture typo (wrong pad/stride) fails here, not in a benchmark.
        The returned model carries ``value_info`` for every intermediate.
        """
        if not self._outputs:
            raise ValueError("model has no outputs")
        outputs = []
        for o in self._outputs:
            shp = self.shape(o)  # infers (and fixes the dtype of) untracked values
            outputs.append(helper.make_tensor_value_info(o, self._dtypes[o], list(shp)))
        skeleton = self._skeleton(name, outputs, doc)
        onnx.checker.check_model(skeleton)
        inferred = onnx.shape_inference.infer_shapes(
            skeleton, check_type=True, strict_mode=True, data_prop=True
        )
        for vi in [*inferred.graph.value_info, *inferred.graph.output]:
            mine = self._shapes.get(vi.name)
            if mine is None or not vi.type.tensor_type.HasField("shape"):
                continue
            theirs = _shape_of(vi)
            if len(mine) != len(theirs) or any(
                isinstance(a, int) and isinstance(b, int) and a != b
                for a, b in zip(mine, theirs, strict=True)
            ):
                raise AssertionError(f"{vi.name}: builder shape {mine} != inferred {theirs}")

        model = inferred
        graph = model.graph
        del graph.input[len(self._inputs) :]
        for wname, arr in self._weights:
            t = graph.initializer.add()
            t.name = wname
            t.data_type = self._dtypes[wname]
            t.dims.extend(arr.shape)
            t.raw_data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        return model


def _shape_of(vi: onnx.ValueInfoProto) -> Shape:
    dims: list[Dim] = []
    for d in vi.type.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        else:
            dims.append(d.dim_param or "?")
    return tuple(dims)
