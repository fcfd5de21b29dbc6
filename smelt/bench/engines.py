"""The engines `smelt bench` compares: smelt itself and its peers, behind one small interface.

Every engine gets the same ONNX model, the same input arrays and the same thread count, and
answers with a list of numpy arrays in graph-output order, so the harness can check outputs
before timing anything. A peer that is not installed raises :class:`EngineUnavailable`: the
harness reports it as skipped, with the reason and how to install it, and goes on.

Thread settings follow what each peer's documentation recommends for latency at a fixed thread
count: onnxruntime's intra-op pool (inter-op 1, sequential execution); OpenVINO's LATENCY hint
with ``INFERENCE_NUM_THREADS`` and f32 inference precision (it would otherwise pick bf16 on
AMX machines, which changes the numbers); ``torch.set_num_threads`` under ``inference_mode``.

ISA: every runner records the ISA it ran in ``details["isa"]`` (the name the peak is looked up
by) and how that was established in ``details["isa_note"]``. smelt: the ISA it compiled for (its
cap, ``smelt.compile(isa=...)``, which ``smelt bench --isa`` passes through SMELT_ISA). PyTorch:
``torch.backends.cpu.get_cpu_capability()`` after import (ATEN_CPU_CAPABILITY and oneDNN's
ONEDNN_MAX_CPU_ISA cap it). OpenVINO: the ISA its compiled model's kernels name (its oneDNN
kernels honour ONEDNN_MAX_CPU_ISA; its own JIT kernels do not in release builds).
onnxruntime: MLAS picks kernels by cpuid with no cap, so the host's ISA.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from smelt.runtime.artifact import ArtifactPlan
from smelt.target import ISA_CAPS, detect, isa_named_in

PEERS = ("onnxruntime", "openvino", "torch")
INSTALL_HINT = 'pip install -e ".[peers]"'


class EngineUnavailable(RuntimeError):
    """The engine cannot run here (not installed, or no definition for this model)."""


@dataclass
class BenchModel:
    """A model as every engine sees it: the proto, its concrete input arrays, its zoo name."""

    name: str
    proto: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    zoo_name: str | None = None  # set for built-in models: PyTorch then runs the zoo's definition
    output_names: list[str] = field(default_factory=list)
    # the model's own floor on the relative-error tolerance (a QDQ-quantized model: one rounding
    # flip moves an output by a quantization step, and onnxruntime differs from itself that much)
    tolerance: float | None = None

    def __post_init__(self) -> None:
        if not self.output_names:
            self.output_names = [o.name for o in self.proto.graph.output]


@dataclass
class Runner:
    """A prepared engine: ``run(feeds)`` returns the outputs in graph-output order."""

    engine: str
    version: str
    run: Callable[[Mapping[str, np.ndarray]], list[np.ndarray]]
    close: Callable[[], None] = lambda: None
    details: dict = field(default_factory=dict)  # settings worth recording in the report


def executed_flops(plan: ArtifactPlan | None) -> int | None:
    """The FLOPs a compiled model's kernels execute, where they differ from the model's nominal
    (direct-algorithm) FLOPs: a Winograd F(m x m, r x r) step multiplies (m+r-1)^2 transformed
    values per m x m output tile instead of m^2 r^2 (16 instead of 36 for F(2x2,3x3)), so its
    nominal GFLOPS overstate what the FMA units did, and a share of peak computed from them can
    pass 100% (ResNet-18 was reported at 113%). The transforms' few adds are not counted."""
    if plan is None:
        return None
    # a multi-step node (phased Winograd: transform, GEMM, transform) carries its FLOPs on every
    # step (StepInfo): count them once, on its first part
    total = sum(step_executed_flops(step.flops, step.schedule) for block in plan.native_blocks
                for step in block.step_info if step.part == 0)
    return total + sum(s.flops for s in plan.fallback_steps)


def step_executed_flops(flops: int, schedule: Mapping[str, str]) -> int:
    """One step's nominal ``flops`` as its kernel executes them (see ``executed_flops``)."""
    m = _WINOGRAD.search(schedule.get("algorithm", ""))
    if not m:
        return flops
    out, ker = int(m.group(1)), int(m.group(2))
    return flops * (out + ker - 1) ** 2 // (out * ker) ** 2


_WINOGRAD = re.compile(r"Winograd F\((\d+)x\d+,\s*(\d+)x\d+\)")


def _smelt(model: BenchModel, threads: int, layout: str = "propagate", engine: str = "smelt",
           winograd: bool = True, isa: str | None = None) -> Runner:
    import sys

    import smelt

    if isa is not None:
        try:
            detect().narrowed(isa)
        except ValueError as exc:  # an ISA this host cannot run: the engine is skipped, with why
            raise EngineUnavailable(str(exc)) from exc
    # without ``isa`` the cap comes from SMELT_ISA (``smelt bench --isa`` sets it with the peers'
    # variables)
    compiled = smelt.compile(model.proto, threads=threads, input_shapes={k: v.shape for k, v in model.feeds.items()},
                             progress=sys.stderr.isatty(), layout=layout, winograd=winograd, isa=isa)
    target = compiled.target
    if not compiled.built:  # variants decided by input values build at the first call: the
        compiled.run(model.feeds)  # details below are that variant's (they read "native" before)
    return Runner(engine, smelt.__version__, compiled.run, compiled.close,
                  {"fallback_nodes": len(compiled.fallback_nodes),
                   # each node onnx.reference runs, named with why: the report lists them (a suite's
                   # acceptance is "fully native, or every fallback named with its reason")
                   "fallbacks": compiled.fallback_report,
                   "native_nodes": len(compiled.native_nodes),
                   "compile_seconds": round(compiled.compile_seconds, 3),
                   "from_cache": compiled.from_cache,
                   "arena_bytes": compiled.arena_bytes,
                   "layout": layout, "winograd": winograd,
                   "isa": target.isa,
                   "isa_note": f"capped (host: {target.native_isa})" if target.native_isa else "native",
                   "executed_flops": executed_flops(compiled.plan)})


def _smelt_variant(mode: str) -> Callable[[BenchModel, int], Runner]:
    """smelt compiled with another layout mode, as a peer: ``smelt:nchw`` etc. (the ablation).
    Direct convolutions only, so the steps measure layouts alone (NeoCPU's Table 3)."""
    return lambda model, threads: _smelt(model, threads, layout=mode, engine=f"smelt:{mode}", winograd=False)


def _smelt_at(isa: str) -> Callable[[BenchModel, int], Runner]:
    """smelt held to ``isa`` as a peer of the default build: ``smelt@avx2`` etc. Timed interleaved
    with it in one process, so its share of its own ISA's peak compares with the default build's
    share of the host's peak under the same machine state (two separate runs on a shared VM moved
    both engines' times by up to 2x between them)."""
    return lambda model, threads: _smelt(model, threads, engine=f"smelt@{isa}", isa=isa)


def _onnxruntime(model: BenchModel, threads: int) -> Runner:
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise EngineUnavailable(f"onnxruntime is not installed ({INSTALL_HINT})") from exc
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(model.proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = model.output_names

    def run(feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return sess.run(names, dict(feeds))

    return Runner("onnxruntime", ort.__version__, run, details={
        "intra_op_num_threads": threads, "isa": detect().isa,
        # MLAS dispatches on cpuid at load; there is no variable or option that lowers it
        "isa_note": "native ISA (cannot be capped)"})


def _openvino(model: BenchModel, threads: int) -> Runner:
    try:
        import openvino as ov
    except ImportError as exc:
        raise EngineUnavailable(f"openvino is not installed ({INSTALL_HINT})") from exc
    core = ov.Core()
    # OpenVINO reads ONNX from a file; external data would need the file's directory, so the
    # proto (weights inline) goes through a private temporary file.
    with tempfile.TemporaryDirectory(prefix="smelt-ov-") as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save(model.proto, str(path))
        ov_model = core.read_model(str(path))
    ov_model.reshape({name: list(arr.shape) for name, arr in model.feeds.items()})
    config = {
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_NUM_THREADS": threads,
        "NUM_STREAMS": 1,
        "INFERENCE_PRECISION_HINT": "f32",
    }
    compiled = core.compile_model(ov_model, "CPU", config)
    request = compiled.create_infer_request()
    by_name = {}
    for i, port in enumerate(compiled.outputs):
        for n in port.get_names():
            by_name[n] = i
    try:
        order = [by_name[n] for n in model.output_names]
    except KeyError as exc:
        raise EngineUnavailable(f"openvino renamed output {exc} of the model") from exc

    def run(feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        request.infer(dict(feeds))
        return [request.get_output_tensor(i).data.copy() for i in order]

    # the kernels the plugin chose ("brgconv_avx512_f32", "jit_avx2_FP32"): what ISA actually ran
    kernels = sorted({str(op.get_rt_info()["primitiveType"].astype(str)) for op in compiled.get_runtime_model().get_ops()
                      if "primitiveType" in op.get_rt_info()})
    capped = os.environ.get("ONEDNN_MAX_CPU_ISA")
    details = {k: str(compiled.get_property(k)) for k in ("INFERENCE_NUM_THREADS", "INFERENCE_PRECISION_HINT",
                                                           "PERFORMANCE_HINT")}
    named = isa_named_in(kernels)
    if named is None:  # "ref_any_f32", "unknown_f32": OpenVINO's own kernels, which no variable caps
        note = "its kernels name no ISA; OpenVINO's own kernels run the host's"
    elif capped:
        note = (f"oneDNN kernels capped by ONEDNN_MAX_CPU_ISA={capped}; OpenVINO's own JIT kernels are not "
                "(OV_CPU_MAX_ISA is debug builds only)")
    else:
        note = "native ISA (from its kernels' names)"
    details.update(isa=named or detect().isa, kernels=kernels, isa_note=note)
    # ov.__version__ carries the build tag ("2026.4.1-22982-e213a14-releases/..."): keep the release.
    return Runner("openvino", ov.__version__.split("-")[0], run, details=details)


def _torch(model: BenchModel, threads: int) -> Runner:
    try:
        import torch
    except ImportError as exc:
        raise EngineUnavailable(f"torch is not installed ({INSTALL_HINT}; torch==2.13.0)") from exc
    from smelt.frontend.zoo import torch_models

    if model.zoo_name is None or not torch_models.has_torch_definition(model.zoo_name):
        raise EngineUnavailable(f"no PyTorch definition for {model.name!r} (only zoo models have one)")
    module = torch_models.torch_model_for(model.zoo_name, model.proto)
    input_names = list(model.feeds)  # graph-input order, which the zoo's torch forward() takes

    def run(feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        # torch's thread count is process-wide and other code may change it between calls.
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        with torch.inference_mode():
            outs = module(*[torch.from_numpy(feeds[n]) for n in input_names])
        if isinstance(outs, torch.Tensor):
            outs = (outs,)
        return [o.numpy() for o in outs]

    torch.set_num_threads(threads)
    capability = torch.backends.cpu.get_cpu_capability()  # "AVX512", "AVX2", "DEFAULT"
    capped = os.environ.get("ATEN_CPU_CAPABILITY")
    return Runner("torch", torch.__version__, run, details={
        "num_threads": threads, "mode": "eager", "isa": isa_named_in(capability) or detect().isa,
        "cpu_capability": capability,
        "isa_note": (f"capped by ATEN_CPU_CAPABILITY={capped} and ONEDNN_MAX_CPU_ISA="
                     f"{os.environ.get('ONEDNN_MAX_CPU_ISA', '-')}" if capped else "native ISA")})


ENGINES: dict[str, Callable[[BenchModel, int], Runner]] = {
    "smelt": _smelt,
    "onnxruntime": _onnxruntime,
    "openvino": _openvino,
    "torch": _torch,
}

ALIASES = {"ort": "onnxruntime", "ov": "openvino", "pytorch": "torch"}

# NeoCPU Table 3's steps, as peers of the default build, all with direct convolutions: the NCHW
# baseline, layout-optimized convolutions with a transform pair around each, transform
# elimination (``smelt:direct``: the default layout "propagate") and the global search. The
# default build adds Winograd F(2x2,3x3) on top.
SMELT_VARIANTS = ("nchw", "conv", "global")
for _mode in SMELT_VARIANTS:
    ENGINES[f"smelt:{_mode}"] = _smelt_variant(_mode)
ENGINES["smelt:direct"] = lambda model, threads: _smelt(model, threads, engine="smelt:direct", winograd=False)
LAYOUT_ABLATION = "smelt:nchw,smelt:conv,smelt:direct,smelt:global"
# smelt held to each ISA cap (``smelt@avx2``): the "AVX2 at parity" comparison in one run
ISA_VARIANT_PREFIX = "smelt@"
for _cap in ISA_CAPS:
    ENGINES[f"{ISA_VARIANT_PREFIX}{_cap}"] = _smelt_at(_cap)


def is_smelt_build(name: str) -> bool:
    """True for smelt and its variants (``smelt:nchw``, ``smelt@avx2``): not peers to beat."""
    return name == "smelt" or name.startswith(("smelt:", ISA_VARIANT_PREFIX))


def isa_of_variant(name: str) -> str | None:
    """The ISA an ``smelt@ISA`` engine is held to, else None."""
    return name.removeprefix(ISA_VARIANT_PREFIX) if name.startswith(ISA_VARIANT_PREFIX) else None


def parse_engines(spec: str | None) -> list[str]:
    """``"onnxruntime,openvino"`` → canonical peer names; unknown names are an error."""
    if spec is None:
        return list(PEERS)
    names = []
    for raw in spec.split(","):
        name = ALIASES.get(raw.strip().lower(), raw.strip().lower())
        if not name:
            continue
        if name not in ENGINES or name == "smelt":
            raise ValueError(f"unknown peer engine {raw.strip()!r}; choose from {', '.join(PEERS)} "
                             f"(or the ablation's {LAYOUT_ABLATION}, or smelt held to an ISA: "
                             f"{', '.join(ISA_VARIANT_PREFIX + i for i in ISA_CAPS)})")
        if name not in names:
            names.append(name)
    return names

