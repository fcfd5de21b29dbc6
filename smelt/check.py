"""Right or loud: run a compiled model and a reference on the same inputs, compare, and when they
disagree name the first node whose output diverges.

The reference is onnxruntime when it is installed, else ``onnx.reference``. Inputs are the
caller's arrays or seeded random ones (normal floats, zero indices, true booleans: the values
every table size and mask accepts).

**Agreement** (``Tolerance``): for floating values, ``max|smelt - ref| <= atol + rtol * max|ref|``
over the finite positions, and NaN, +Inf and -Inf at the same positions. The error is scaled by
the value's largest magnitude rather than elementwise, because smelt and the reference sum in a
different order: an element near zero that is the difference of large terms carries an absolute
error of the large terms' size, and an elementwise rtol would call that a bug. Integer and
boolean values must be equal.

**Localizing** (only when the outputs disagree). Smelt fuses and folds: a Conv's output that a
fused Relu consumes never exists in memory, so only values some compiled node writes can be
observed without changing the code under test. Those are the *observable* values: the outputs of
the lowered graph's nodes that carry an ONNX value name (a fused group's last output does; its
inner values do not). A probe is a copy of the model with chosen observable values added as graph
outputs, compiled with the model's own options: making a written value an output changes where it
is stored (no arena slot, no concat view, no in-place reuse) but not how it is computed.

1. *All at once*: when the observable values fit ``observe_bytes``, one probe observes all of
   them; the first (topological order) whose value disagrees is the first diverging node, and
   its inputs are observed in the same run.
2. *Bisection*: otherwise, or when the all-at-once probe no longer disagrees at the outputs (the
   changed memory placement hid the bug: an arena or aliasing fault), cut the ONNX graph at
   positions whose live values (produced at or before the cut and read after it) are all
   observable or constant, and binary-search the cuts: a probe observes one cut's live values
   only. A cut that disagrees after one that agrees brackets the culprit: every input of the
   nodes between them agreed, one of their outputs did not. ~log2(cuts) compiles.

The node reported is the ONNX node writing the first disagreeing value; when smelt fused it, the
report names the compiled node that computes it, its template and fused epilogue, and the ONNX
nodes the fused group covers (their own values cannot be observed without unfusing them). A
native node names its template (from the compiled plan); a fallback node names the reason it has
no native kernel (``CompiledModel.fallback_report``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from smelt.errors import SmeltError
from smelt.frontend.onnx_import import model_input_specs
from smelt.frontend.zipmap import as_tensor
from smelt.ir.ops import ops_where
from smelt.progress import stage

if TYPE_CHECKING:
    from smelt.api import CompiledModel

REFERENCES = ("auto", "onnxruntime", "onnx")
DEFAULT_RTOL = 1e-4  # the bench harness's mismatch threshold: fp32 models agree to ~1e-6
DEFAULT_ATOL = 1e-6  # the floor for values that are (nearly) all zero, where rtol * max|ref| is 0
OBSERVE_BYTES = 256 << 20
# ops whose value no input decides (never constant, though they may read none)
_NONDETERMINISTIC = ops_where(lambda t: not t.deterministic)  # above this, observing every value at once costs too much memory: bisect


class CheckError(SmeltError):
    """``compile(..., check=True)``: smelt's outputs disagree with the reference. ``report`` is the
    ``CheckReport``; the message names the first diverging node."""

    def __init__(self, report: CheckReport) -> None:
        super().__init__(report.summary())
        self.report = report


class CheckWarning(UserWarning):
    """``compile(..., check="warn")``: the same finding as ``CheckError``, as a warning."""


@dataclass(frozen=True)
class Tolerance:
    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL

    def rtol_for(self, dtype: np.dtype) -> float:
        # a half-precision value cannot agree closer than its own rounding
        return max(self.rtol, 4 * float(np.finfo(dtype).eps)) if dtype.itemsize < 4 else self.rtol

    def describe(self) -> str:
        return f"|smelt - ref| <= {self.atol:g} + {self.rtol:g} * max|ref|, NaN/Inf at the same positions"


@dataclass
class Comparison:
    """One value compared: errors over finite positions, where NaN/Inf disagree, verdict."""

    name: str
    shape: list[int]
    dtype: str
    max_abs: float
    max_rel: float  # max_abs / max|ref| (the criterion's scale)
    nonfinite_agree: bool
    bad: int  # elements outside the tolerance (or with a NaN/Inf disagreement)
    first_bad: list[int] | None
    ok: bool
    note: str = ""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def compare(name: str, ref: Any, got: Any, tol: Tolerance) -> Comparison:
    """Compare smelt's ``got`` with the reference's ``ref`` under ``tol`` (a ZipMap's maps as
    their probability tensors)."""
    ref, got = np.asarray(as_tensor(ref)), np.asarray(as_tensor(got))
    if ref.shape != got.shape or ref.dtype != got.dtype:
        what = "shape" if ref.shape != got.shape else "dtype"
        return Comparison(name, list(got.shape), got.dtype.name, float("inf"), float("inf"), False, got.size, None,
                          False, f"{what} differs: smelt {list(got.shape)} {got.dtype.name}, reference "
                          f"{list(ref.shape)} {ref.dtype.name}")
    shape, dt = list(ref.shape), ref.dtype.name
    if ref.size == 0:
        return Comparison(name, shape, dt, 0.0, 0.0, True, 0, None, True)
    if ref.dtype.kind not in "fc":  # integers, booleans, strings: exact
        wrong = ref != got
        bad = int(np.count_nonzero(wrong))
        diff = 0.0
        if bad and ref.dtype.kind in "iub":
            diff = float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64))))
        first = [int(i) for i in np.argwhere(wrong)[0]] if bad else None
        return Comparison(name, shape, dt, diff, float("inf") if bad else 0.0, True, bad, first, bad == 0)
    r, g = ref.astype(np.complex128 if ref.dtype.kind == "c" else np.float64), got.astype(
        np.complex128 if ref.dtype.kind == "c" else np.float64)
    nonfinite = (np.isnan(r) != np.isnan(g)) | (np.isposinf(r) != np.isposinf(g)) | (np.isneginf(r) != np.isneginf(g))
    finite = np.isfinite(r) & np.isfinite(g)
    err = np.abs(np.where(finite, g, 0.0) - np.where(finite, r, 0.0))
    max_abs = float(np.max(err))
    scale = float(np.max(np.abs(np.where(finite, r, 0.0))))
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    limit = tol.atol + tol.rtol_for(ref.dtype) * scale
    wrong = nonfinite | (err > limit)
    bad = int(np.count_nonzero(wrong))
    first = [int(i) for i in np.argwhere(wrong)[0]] if bad else None
    return Comparison(name, shape, dt, max_abs, max_rel, not bool(nonfinite.any()), bad, first, bad == 0)


@dataclass
class ValueReport:
    """An input or output of the culprit node: its shape and, where both sides have it, the
    comparison (None with a ``note`` saying why not: a constant, fused away, ...)."""

    name: str
    shape: list[int] | None
    comparison: Comparison | None
    note: str = ""

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": self.shape, "note": self.note,
                "comparison": self.comparison.to_dict() if self.comparison else None}


@dataclass
class Culprit:
    """The first node whose output diverges (see the module doc for how it is found)."""

    node: str
    op: str
    position: int  # index in the ONNX graph's topological order
    of: int  # nodes in the graph
    inputs: list[ValueReport]
    outputs: list[ValueReport]
    execution: str  # "native" or "fallback"
    template: str | None  # the native template (plan step info), None for a fallback node
    fallback_reason: str | None
    compiled_node: str  # the node of the lowered graph that computes the diverging value
    compiled_op: str
    epilogue: list[str]  # ops fused into the compiled node
    covers: list[str]  # ONNX nodes computed inside the compiled node's fused group (besides ``node``)
    reproduced: bool  # one probe run showed its inputs agreeing, its output diverging, the graph outputs disagreeing

    def describe_execution(self) -> str:
        if self.execution == "fallback":
            text = f"onnx.reference fallback ({self.fallback_reason})"
        else:
            text = f"native, template {self.template}"
        if self.compiled_node != self.node:
            text += f"; computed inside compiled node {self.compiled_node!r} ({self.compiled_op})"
        if self.epilogue:
            text += f" with fused epilogue {', '.join(self.epilogue)}"
        if self.covers:
            text += f"; the fused group also covers ONNX nodes {', '.join(repr(c) for c in self.covers)}"
        return text

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["inputs"] = [v.to_dict() for v in self.inputs]
        d["outputs"] = [v.to_dict() for v in self.outputs]
        return d


@dataclass
class CheckReport:
    """What ``smelt check`` found. ``ok``: every output agrees. ``culprit``: the first diverging
    node (None when all agree, or when localizing was not asked for or failed: see ``notes``)."""

    model: str
    reference: str
    inputs: str  # where the inputs came from
    tolerance: Tolerance
    outputs: list[Comparison]
    culprit: Culprit | None = None
    strategy: str = ""
    compiles: int = 0  # probe compiles made to localize
    compile_seconds: float = 0.0  # the checked model's own build
    from_cache: bool = False  # that build was loaded from the cache
    seconds: float = 0.0
    fallback: list[dict] = field(default_factory=list)  # the model's fallback nodes and reasons
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.outputs)

    def summary(self) -> str:
        if self.ok:
            return f"{self.model}: all {len(self.outputs)} outputs agree with {self.reference}"
        bad = [c.name for c in self.outputs if not c.ok]
        text = (f"{self.model}: {len(bad)} of {len(self.outputs)} outputs disagree with {self.reference} "
                f"({', '.join(repr(b) for b in bad)})")
        if self.culprit is not None:
            c = self.culprit
            worst = next((o.comparison for o in c.outputs if o.comparison and not o.comparison.ok), None)
            err = f", max abs {worst.max_abs:.3g}, max rel {worst.max_rel:.3g}" if worst else ""
            text += f"; first diverging node {c.node!r} ({c.op}{err}): {c.describe_execution()}"
        elif self.notes:
            text += "; " + self.notes[-1]
        return text

    def to_dict(self) -> dict:
        return {"model": self.model, "ok": self.ok, "reference": self.reference, "inputs": self.inputs,
                "tolerance": {"rtol": self.tolerance.rtol, "atol": self.tolerance.atol,
                              "criterion": self.tolerance.describe()},
                "outputs": [c.to_dict() for c in self.outputs],
                "culprit": self.culprit.to_dict() if self.culprit else None, "strategy": self.strategy,
                "compiles": self.compiles, "seconds": round(self.seconds, 3),
                "compile_seconds": round(self.compile_seconds, 3), "from_cache": self.from_cache, "fallback": self.fallback,
                "notes": self.notes}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=_json_default)

    def format_text(self) -> str:
        lines = [f"smelt check {self.model}", f"  reference: {self.reference}; inputs: {self.inputs}",
                 f"  tolerance: {self.tolerance.describe()}", ""]
        rows = [("output", "shape", "dtype", "max abs", "max rel", "NaN/Inf", "result")]
        for c in self.outputs:
            rows.append((c.name, str(c.shape), c.dtype, _num(c.max_abs), _num(c.max_rel),
                         "agree" if c.nonfinite_agree else "DIFFER", _verdict(c)))
        lines += _table(rows)
        lines.append("")
        if self.fallback:
            lines.append(f"  {len(self.fallback)} node(s) ran through the onnx.reference fallback: "
                         + ", ".join(f"{f['node']} ({f['op']})" for f in self.fallback))
        if self.ok:
            lines.append(f"OK: all {len(self.outputs)} outputs agree (check {self.seconds:.1f} s; "
                         f"compile {self._compile_text()})")
        else:
            lines.append(f"MISMATCH: {sum(not c.ok for c in self.outputs)} of {len(self.outputs)} outputs disagree")
        c = self.culprit
        if c is not None:
            lines += ["", f"first diverging node: {c.node!r} ({c.op}), position {c.position + 1} of {c.of} "
                      "in topological order",
                      f"  runs: {c.describe_execution()}"]
            for label, vals in (("inputs", c.inputs), ("outputs", c.outputs)):
                for i, v in enumerate(vals):
                    head = f"  {label + ':' if i == 0 else '':<9}"
                    lines.append(f"{head}{v.name} {v.shape if v.shape is not None else '?'}: {_value_text(v)}")
            if not c.reproduced:
                lines.append("  (not reproduced in one run with its inputs and outputs observed: observing "
                             "values changed the result; treat the location as a lead, see the note)")
        for note in self.notes:
            lines.append(f"  note: {note}")
        if not self.ok:
            how = (f"localized with {self.compiles} probe compile(s) ({self.strategy})" if self.strategy
                   else "not localized")
            lines.append(f"{how}; check {self.seconds:.1f} s; compile {self._compile_text()}")
        return "\n".join(lines)

    def _compile_text(self) -> str:
        return f"{self.compile_seconds:.1f} s{' (from cache)' if self.from_cache else ''}"


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Tolerance):
        return obj.__dict__
    if isinstance(obj, float | np.floating):
        return float(obj)
    return str(obj)


def _num(x: float) -> str:
    return "inf" if x == float("inf") else f"{x:.3g}"


def _verdict(c: Comparison) -> str:
    if c.ok:
        return "ok"
    return f"MISMATCH ({c.note})" if c.note else f"MISMATCH ({c.bad} elements, first at {c.first_bad})"


def _value_text(v: ValueReport) -> str:
    if v.comparison is None:
        return v.note
    c = v.comparison
    text = "agrees" if c.ok else "DIVERGES"
    text += f" (max abs {_num(c.max_abs)}, max rel {_num(c.max_rel)}"
    if not c.ok:
        text += f"; {c.note}" if c.note else f"; {c.bad} elements outside tolerance, first at {c.first_bad}"
        if not c.nonfinite_agree:
            text += "; NaN/Inf positions differ"
    return text + ")" + (f" {v.note}" if v.note else "")


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]


# -- inputs ------------------------------------------------------------------------------------
def random_feeds(proto: onnx.ModelProto, shapes: Mapping[str, Sequence[int]] | None = None,
                 given: Mapping[str, np.ndarray] | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """The caller's arrays where given, seeded random ones elsewhere (normal floats, zero
    integers, true booleans); a symbolic dimension needs ``shapes``."""
    rng = np.random.default_rng(seed)
    shapes, given = dict(shapes or {}), dict(given or {})
    feeds: dict[str, np.ndarray] = {}
    for name, dtype, shape in model_input_specs(proto):
        if name in given:
            feeds[name] = np.asarray(given[name])
            continue
        if name in shapes:
            dims = [int(d) for d in shapes[name]]
        elif shape is not None and all(isinstance(d, int) for d in shape):
            dims = list(shape)
        else:
            raise SmeltError(f"input {name!r} has symbolic or unknown dimensions {list(shape or [])}: "
                             f"give its shape (smelt check --shape {name}=d0,d1,...; smelt.check(shapes=...); "
                             "compile(input_shapes=..., check=True)) or an array for it")
        dt = np.dtype(dtype or np.float32)
        if dt.kind in "fc":
            feeds[name] = rng.standard_normal(dims).astype(dt)
        elif dt.kind in "iu":
            feeds[name] = np.zeros(dims, dt)  # valid for every Gather table and every index
        elif dt.kind == "b":
            feeds[name] = np.ones(dims, dt)
        else:
            raise SmeltError(f"input {name!r}: cannot make random data of dtype {dt}; give an array for it")
    unknown = sorted(set(given) - set(feeds))
    if unknown:
        raise SmeltError(f"unknown input name {unknown[0]!r}; the model's inputs are {list(feeds)}")
    return feeds


# -- the reference -----------------------------------------------------------------------------
class Reference:
    """onnxruntime (intermediate values as extra graph outputs) or onnx.reference (its
    ``intermediate`` results)."""

    def __init__(self, proto: onnx.ModelProto, kind: str = "auto", threads: int = 1) -> None:
        if kind not in REFERENCES:
            raise ValueError(f"reference must be one of {', '.join(REFERENCES)}; given {kind!r}")
        self.proto, self.threads = proto, threads
        self.kind = kind
        if kind == "auto":
            try:
                import onnxruntime  # noqa: F401
                self.kind = "onnxruntime"
            except ImportError:
                self.kind = "onnx"
        if self.kind == "onnxruntime":
            import onnxruntime

            self.name = f"onnxruntime {onnxruntime.__version__}"
        else:
            self.name = f"onnx.reference (onnx {onnx.__version__})"
        self._types: dict[str, onnx.ValueInfoProto] | None = None

    def run(self, feeds: Mapping[str, np.ndarray], extra: Sequence[str] = ()) -> dict[str, np.ndarray]:
        """The graph outputs and the ``extra`` values, by name."""
        outputs = [o.name for o in self.proto.graph.output]
        if self.kind == "onnx":
            from onnx.reference import ReferenceEvaluator

            from smelt.runtime.reference_ops import FIXED_OPS

            ev = ReferenceEvaluator(self.proto, new_ops=FIXED_OPS)  # with smelt's corrections
            if not extra:
                return dict(zip(outputs, ev.run(None, dict(feeds)), strict=True))
            values = ev.run(None, dict(feeds), intermediate=True)
            return {k: values[k] for k in [*outputs, *extra] if k in values}
        import onnxruntime as ort

        model = self.proto
        names = list(outputs)
        if extra:
            model = onnx.ModelProto()
            model.CopyFrom(self.proto)
            types = self._value_types()
            for name in extra:
                if name not in names:
                    model.graph.output.append(types.get(name) or onnx.ValueInfoProto(name=name))
                    names.append(name)
        so = ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.log_severity_level = 3  # its warnings about unused initializers are not the user's concern
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return dict(zip(names, sess.run(names, dict(feeds)), strict=True))

    def _value_types(self) -> dict[str, onnx.ValueInfoProto]:
        if self._types is None:  # onnxruntime wants a type on each graph output it is asked for
            try:
                inferred = onnx.shape_inference.infer_shapes(self.proto)
            except Exception:  # noqa: BLE001 - best effort: untyped outputs still work in most models
                inferred = self.proto
            self._types = {}
            for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
                if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
                    typed = onnx.ValueInfoProto()
                    typed.CopyFrom(vi)
                    typed.type.tensor_type.ClearField("shape")  # a stale declared shape must not bind
                    self._types[vi.name] = typed
        return self._types


# -- checking ----------------------------------------------------------------------------------
def check_compiled(model: CompiledModel, inputs: Mapping[str, np.ndarray] | None = None, *,
                   shapes: Mapping[str, Sequence[int]] | None = None, rtol: float = DEFAULT_RTOL,
                   atol: float = DEFAULT_ATOL, reference: str = "auto", seed: int = 0, localize: bool = True,
                   observe_bytes: int = OBSERVE_BYTES, progress: bool = False,
                   name: str | None = None) -> CheckReport:
    """Run ``model`` (a ``CompiledModel``) and the reference once on ``inputs`` (missing ones:
    seeded random, ``shapes`` sizing symbolic dimensions) and compare; when they disagree and
    ``localize``, find the first diverging node (module doc). Never raises for a disagreement:
    read ``report.ok``."""
    start = time.perf_counter()
    tol = Tolerance(rtol, atol)
    feeds = random_feeds(model.graph_proto, shapes, inputs, seed)
    given = sorted(set(inputs or {}))
    source = ("given" if len(given) == len(feeds) else
              f"random (seed {seed})" + (f", given for {', '.join(given)}" if given else ""))
    ref = Reference(model.graph_proto, reference, model.threads)
    label = name or model.graph_proto.graph.name or "model"
    builds = model.compilations
    with stage("check: running smelt", enabled=progress):
        got = model.run_graph(feeds)
    # a model compiled at its first call (symbolic dims, guarded Ifs) built inside run: not check time
    built_here = model.compile_seconds if model.compilations != builds else 0.0
    notes = []
    try:
        with stage(f"check: running {ref.name}", enabled=progress):
            want = ref.run(feeds)
    except Exception as exc:  # noqa: BLE001 - the reference refusing the model is a finding, not a crash
        if reference != "auto" or ref.kind == "onnx":
            raise SmeltError(f"the reference {ref.name} cannot run the model: {type(exc).__name__}: {exc}") from exc
        notes.append(f"{ref.name} cannot run the model ({type(exc).__name__}: {str(exc)[:200]}); "
                     "checked against onnx.reference instead")
        ref = Reference(model.graph_proto, "onnx", model.threads)
        with stage(f"check: running {ref.name}", enabled=progress):
            want = ref.run(feeds)
    out_names = [o.name for o in model.get_outputs()]
    comps = [compare(n, want[n], g, tol) for n, g in zip(out_names, got, strict=True)]
    report = CheckReport(label, ref.name, source, tol, comps, fallback=model.fallback_report,
                         compile_seconds=model.compile_seconds, from_cache=model.from_cache, notes=notes)
    random_ops = sorted({n.op_type for n in model.graph_proto.graph.node if n.op_type in _NONDETERMINISTIC})
    if random_ops:
        report.notes.append(f"the model draws random numbers ({', '.join(random_ops)}): smelt and the reference "
                            "cannot be expected to agree where they flow")
    if not report.ok and localize:
        try:
            _Localizer(model, feeds, ref, tol, dict(zip(out_names, got, strict=True)), want, report,
                       observe_bytes, progress).run()
        except SmeltError as exc:  # a probe that does not compile must not hide the finding itself
            report.notes.append(f"localizing failed: {exc}")
    report.seconds = time.perf_counter() - start - built_here
    return report


class _Localizer:
    """Finds the first diverging node of a model whose outputs disagree (module doc)."""

    def __init__(self, model: CompiledModel, feeds: dict[str, np.ndarray], ref: Reference, tol: Tolerance,
                 baseline: dict[str, np.ndarray], want: dict[str, np.ndarray], report: CheckReport,
                 observe_bytes: int, progress: bool) -> None:
        from smelt.compiler import lower
        from smelt.frontend.control_flow import specialize
        from smelt.frontend.onnx_import import specialize_inputs

        self.model, self.feeds, self.ref, self.tol = model, feeds, ref, tol
        self.baseline, self.report, self.observe_bytes, self.progress = baseline, report, observe_bytes, progress
        self.want = dict(want)  # the reference's values by name: the graph outputs, then as fetched
        self.shapes = {k: list(v.shape) for k, v in feeds.items() if isinstance(v, np.ndarray)}
        guards = model._guards
        # the graph the compiled variant was built from: guarded Ifs decided for these inputs
        self.proto = specialize(model.graph_proto, guards, model._decide(feeds)) if guards else model.graph_proto
        # the lowered graph (deterministic: the one the baseline build compiled) tells which values
        # exist in smelt's code and which node writes each
        self.g = lower(specialize_inputs(self.proto, self.shapes), model.options, model.target)
        self.nodes = list(self.proto.graph.node)
        self.producer = {o: i for i, n in enumerate(self.nodes) for o in n.output if o}
        self.compiled = {o: n for n in self.g.nodes for o in n.outputs if o}
        self.graph_outputs = [o.name for o in self.proto.graph.output]
        plan = model.plan
        self.templates = {s.node: s.schedule.get("template", "") for s in plan.step_infos()} if plan else {}
        self.fallback = {f["node"]: f["reason"] for f in model.fallback_report}
        # values no graph input reaches (Constant nodes and what they compute) are folded at compile
        # time and may be gone from the lowered graph: constants, not blind spots of the cuts
        varying = {i.name for i in self.proto.graph.input} - {t.name for t in self.proto.graph.initializer}
        for n in self.nodes:
            reads = set(n.input)
            for attr in n.attribute:
                for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                    reads |= _outer_reads(sub)
            if n.op_type in _NONDETERMINISTIC or reads & varying:
                varying.update(o for o in n.output if o)
        self.varying = varying

    # which values can be observed, and which are constants in smelt's graph
    def _const(self, name: str) -> bool:
        v = self.g.values.get(name)
        return (v is not None and v.is_const) or name not in self.varying

    def _observable(self, name: str) -> bool:
        v = self.g.values.get(name)
        return (name in self.compiled and name in self.producer and v is not None and v.dtype is not None
                and not v.is_const and v.is_static)

    def _nbytes(self, name: str) -> int:
        v = self.g.values[name]
        return int(v.size) * np.dtype(v.dtype).itemsize

    def probe(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """Compile a copy of the model with ``names`` added as graph outputs and run it."""
        from smelt.compiler import build
        from smelt.runtime.module import LoadedArtifact
        from smelt.target import detect

        proto = onnx.ModelProto()
        proto.CopyFrom(self.proto)
        outs = list(self.graph_outputs)
        for n in names:
            if n not in outs:
                proto.graph.output.append(onnx.ValueInfoProto(name=n))
                outs.append(n)
        self.report.compiles += 1
        result = build(proto, self.shapes, self.model.options, progress=self.progress)
        art = LoadedArtifact(result.directory, result.lib_path, self.model.threads, list(detect().core_cpus))
        try:
            values = art.run(dict(self.feeds))
        finally:
            art.close()
        return dict(zip(outs, values, strict=True))

    def _outputs_disagree(self, got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> bool:
        return any(not compare(n, want[n], got[n], self.tol).ok for n in self.graph_outputs if n in got)

    def _want(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """The reference's values of ``names`` (and the graph outputs), fetched once each: all at
        once for the one-probe strategy, a cut at a time while bisecting (bounded memory)."""
        missing = [v for v in names if v not in self.want]
        if missing:
            try:
                self.want.update(self.ref.run(self.feeds, missing))
            except Exception as exc:  # noqa: BLE001 - onnxruntime may refuse a value as an output
                if self.ref.kind == "onnx":
                    raise
                self.report.notes.append(f"{self.ref.name} cannot output intermediate values "
                                         f"({type(exc).__name__}); took them from onnx.reference")
                self.ref = Reference(self.proto, "onnx", self.model.threads)
                self.want = self.ref.run(self.feeds, [*self.want, *missing])  # one reference throughout
        return self.want

    def run(self) -> None:
        observable = [o for n in self.nodes for o in n.output if o and self._observable(o)]
        total = sum(self._nbytes(o) for o in observable)
        if total <= self.observe_bytes:
            with stage(f"check: {self.ref.name} with all {len(observable)} written values", self.progress):
                self._want(observable)
            with stage(f"check: probe observing all {len(observable)} written values", self.progress):
                got = self.probe(observable)
            reproduced = self._outputs_disagree(got, self.want)
            for name in observable:
                if not compare(name, self.want[name], got[name], self.tol).ok:
                    self.report.strategy = f"all {len(observable)} values smelt writes observed at once"
                    self._blame(name, got, reproduced)
                    if reproduced:
                        return
                    break
            if not reproduced:
                self.report.notes.append("observing every value at once made the outputs agree (the bug depends "
                                         "on where values are stored); bisecting with minimal probes")
        else:
            self.report.notes.append(f"the {len(observable)} written values take {total / 2**20:.0f} MiB, more "
                                     f"than {self.observe_bytes / 2**20:.0f} MiB: bisecting")
        self._bisect()

    def _cuts(self) -> list[tuple[int, list[str]]]:
        """(position, live values) of every clean cut: after node ``position`` of the ONNX order, every
        value produced so far and read later (or a graph output) is observable or constant."""
        last: dict[str, int] = {}
        n = len(self.nodes)
        for i, node in enumerate(self.nodes):
            for x in node.input:
                last[x] = i
            for attr in node.attribute:  # values a subgraph reads from the outer scope
                for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                    for x in _outer_reads(sub):
                        last[x] = i
        for o in self.graph_outputs:
            last[o] = n
        live: set[str] = set()
        cuts = []
        for i, node in enumerate(self.nodes):
            live |= {o for o in node.output if o and last.get(o, -1) > i}
            live = {v for v in live if last.get(v, -1) > i}
            values = sorted((v for v in live if not self._const(v)), key=lambda v: self.producer[v])
            if i < n - 1 and all(self._observable(v) for v in values):
                cuts.append((i, values))
        return cuts

    def _bisect(self) -> None:
        cuts = self._cuts()
        n = len(self.nodes)
        # known: before node 0 everything agrees (the inputs are the same arrays); after the last
        # node the graph outputs disagree (the baseline run)
        lo, hi = -1, len(cuts)
        seen: dict[str, np.ndarray] = {}
        hi_values = dict(self.baseline)
        steps = max(1, (len(cuts)).bit_length())
        self.report.strategy = f"bisection over {len(cuts)} clean cuts of {n} nodes"
        k = 0
        while hi - lo > 1:
            mid = (lo + hi) // 2
            pos, values = cuts[mid]
            k += 1
            with stage(f"check: bisection probe {k}/~{steps} (cut after node {pos + 1} of {n}, "
                       f"{len(values)} values)", self.progress):
                got = self.probe(values)
                self._want(values)
            seen.update(got)
            if any(not compare(v, self.want[v], got[v], self.tol).ok for v in values):
                hi, hi_values = mid, got
            else:
                lo = mid
        lo_pos = cuts[lo][0] if lo >= 0 else -1
        hi_pos, hi_live = (cuts[hi][0], cuts[hi][1]) if hi < len(cuts) else (n - 1, self.graph_outputs)
        bad = [v for v in hi_live if v in hi_values and v in self.want and self.producer.get(v, -1) > lo_pos
               and not compare(v, self.want[v], hi_values[v], self.tol).ok]
        if not bad:
            self.report.notes.append(f"no single node found: the values between nodes {lo_pos + 2} and "
                                     f"{hi_pos + 1} could not be observed apart")
            return
        # the culprit's inputs were seen agreeing in one probe, its output diverging in another:
        # confirm both in one run (one more compile), or say that observing changes the answer
        node = self.nodes[self.producer[bad[0]]]
        names = [v for v in [*node.input, *node.output] if v and self._observable(v)]
        self._want(names)
        with stage(f"check: confirming node {node.name or node.op_type!r} in one probe", self.progress):
            got = self.probe(names)
        seen.update(hi_values)  # what bisection established: inputs agreeing (lo), output diverging (hi)
        ins_ok = all(compare(v, self.want[v], got[v], self.tol).ok for v in node.input if v in names)
        out_bad = any(not compare(v, self.want[v], got[v], self.tol).ok for v in node.output if v in names)
        confirmed = ins_ok and out_bad and self._outputs_disagree(got, self.want)
        if not confirmed:
            readers = [v for v in node.input if v in names]
            self.report.notes.append(
                f"not confirmed: observing {', '.join(repr(v) for v in readers + [bad[0]])} together "
                f"{'makes the outputs agree' if not out_bad else 'shows an input diverging too'}; the fault "
                "depends on which values are observed (how they are stored or fused): suspect the producers of "
                f"{', '.join(repr(v) for v in readers) or 'its inputs'} and the memory plan around them")
        self._blame(bad[0], seen if not confirmed else got, confirmed, lo_pos)

    def _blame(self, value: str, got: Mapping[str, np.ndarray], reproduced: bool, after: int = -1) -> None:
        """Report the ONNX node writing ``value`` (the first diverging value) as the culprit."""
        idx = self.producer[value]
        node = self.nodes[idx]
        cnode = self.compiled[value]
        covers = self._fused_group(idx, after)
        name = node.name or f"{node.op_type}_{idx}"
        fallback = self.fallback.get(cnode.name)

        def report(v: str) -> ValueReport:
            val = self.g.values.get(v)
            shape = list(val.shape) if val is not None and val.shape is not None else None
            if v in self.want and v in got:
                return ValueReport(v, shape, compare(v, self.want[v], got[v], self.tol))
            if v in self.feeds:
                return ValueReport(v, list(np.shape(self.feeds[v])), None, "graph input (the same array on both sides)")
            if self._const(v):
                return ValueReport(v, shape, None, "constant (initializer or folded at compile time)")
            if v in self.producer and not self._observable(v):
                return ValueReport(v, shape, None, "not observable: fused into a compiled node")
            return ValueReport(v, shape, None, "not observed")

        self.report.culprit = Culprit(
            node=name, op=node.op_type if not node.domain else f"{node.domain}::{node.op_type}", position=idx,
            of=len(self.nodes), inputs=[report(v) for v in node.input if v], outputs=[report(v) for v in node.output if v],
            execution="fallback" if fallback is not None else "native",
            template=None if fallback is not None else self.templates.get(cnode.name) or None,
            fallback_reason=fallback, compiled_node=cnode.name, compiled_op=cnode.op,
            epilogue=[s.op for s in cnode.epilogue], covers=covers, reproduced=reproduced)

    def _fused_group(self, idx: int, after: int) -> list[str]:
        """ONNX nodes (after position ``after``) whose values feed node ``idx`` without being
        observable: computed inside the same compiled node, so they share the blame."""
        group: list[int] = []
        todo = [idx]
        while todo:
            i = todo.pop()
            for v in self.nodes[i].input:
                j = self.producer.get(v)
                if j is None or j <= after or j in group or self._observable(v) or self._const(v):
                    continue
                group.append(j)
                todo.append(j)
        return [self.nodes[j].name or f"{self.nodes[j].op_type}_{j}" for j in sorted(group)]


def _outer_reads(graph: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads that it does not define (values of the enclosing scope)."""
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    reads: set[str] = set()
    for n in graph.node:
        reads |= {x for x in n.input if x and x not in defined}
        for attr in n.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                reads |= {x for x in _outer_reads(sub) if x not in defined}
        defined |= set(n.output)
    return reads
