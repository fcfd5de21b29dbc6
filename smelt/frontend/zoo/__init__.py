"""smelt's built-in model zoo: reference networks built with smelt's own builder.

Benchmarks, tests and the CLI need standard models without downloading
files or depending on a training framework.  Every model here is generated
on demand, deterministically from ``seed`` (same bytes on every run and
machine), and matches the published architecture's parameter count, so the
numbers it produces are comparable with other runtimes' numbers for the
same network.

Usage::

    from smelt.frontend import zoo
    zoo.list_models()                      # ['resnet18', ..., 'gru-stacked']
    model = zoo.get_model("resnet50")      # onnx.ModelProto
    model = zoo.get_model("zoo:lstm-E1024-H1024-B10-T100-L2-bi")

Importing this package is cheap: onnx and the model definitions are loaded
only when a model is actually requested.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

__all__ = [
    "list_models",
    "get_model",
    "describe",
    "load_model_or_zoo",
    "parse_rnn_name",
    "paper_rnn_models",
    "RnnSpec",
    # lazily imported, see __getattr__
    "ModelBuilder",
    "count_parameters",
    "lstm_model",
    "deepcpu_table1",
    "text_similarity_model",
    "bidaf_lstms_model",
    "modelcompiler_fig4a",
    "REFERENCE_PARAMS",
    "CNN_MODELS",
]

_CNN_DESCRIPTIONS = {
    "resnet18": "ResNet-18 (BasicBlock [2,2,2,2]); input [N,3,224,224]; 11.69M params",
    "resnet50": "ResNet-50 v1.5 (Bottleneck [3,4,6,3], stride on 3x3); input [N,3,224,224]; "
    "25.56M params",
    "vgg16": "VGG-16 (config D, two Dropouts in the classifier); input [N,3,224,224]; "
    "138.36M params",
    "mobilenet_v2": "MobileNetV2 1.0 (inverted residuals, depthwise convs, ReLU6 as Clip); "
    "input [N,3,224,224]; 3.50M params",
    "squeezenet1_1": "SqueezeNet 1.1 (Fire modules, conv classifier, ceil-mode pools); "
    "input [N,3,224,224]; 1.235M params",
    "densenet121": "DenseNet-121 (growth 32, blocks [6,12,24,16], Concat, AvgPool transitions); "
    "input [N,3,224,224]; 7.98M params",
    "inception_v3": "Inception-v3 without aux head (1x7/7x1 convs, AvgPool/MaxPool branches); "
    "input [N,3,299,299]; 23.83M params",
}

# Recurrent models from the papers (see rnn.py): name -> description
_PAPER_RNN_DESCRIPTIONS = {
    "text-similarity": "DeepCPU's text similarity model: two bidirectional GRU encoders (input 200, hidden "
    "512, length 20) and cosine similarity; inputs q [20,1,200], d [20,B,200]; output sim [B]",
    "bidaf-lstms": "BiDAF's three LSTM layers (DeepCPU Table 2): phrase embedding bi-LSTM (50->100, "
    "question 15 / context 100), 2-layer modeling bi-LSTM (800->100), output bi-LSTM (1400->100); batch 1",
}

_DEFAULT_E = _DEFAULT_H = 256
_DEFAULT_T = 100


@dataclass(frozen=True)
class RnnSpec:
    """A parsed recurrent-model name: cell, sizes, batch, steps, layers, direction."""

    cell: str
    E: int
    H: int
    B: int | str
    T: int
    layers: int = 1
    bidirectional: bool = False

    @property
    def name(self) -> str:
        """Canonical parametric name, e.g. ``lstm-E256-H256-B1-T100-L2-bi``."""
        return (
            f"{self.cell}-E{self.E}-H{self.H}-B{self.B}-T{self.T}"
            + (f"-L{self.layers}" if self.layers != 1 else "")
            + ("-bi" if self.bidirectional else "")
        )

    def num_params(self) -> int:
        """Parameter count (W, R and both bias vectors of every layer/direction)."""
        gates = 4 if self.cell == "lstm" else 3
        nd = 2 if self.bidirectional else 1
        total, e = 0, self.E
        for _ in range(self.layers):
            total += nd * gates * self.H * (e + self.H + 2)
            e = nd * self.H
        return total


# Named RNN presets: (cell, layers, bidirectional) with E=H=256, T=100.
_RNN_PRESETS: dict[str, tuple[str, int, bool]] = {
    "lstm": ("lstm", 1, False),
    "gru": ("gru", 1, False),
    "lstm-stacked": ("lstm", 2, False),
    "lstm-bidirectional": ("lstm", 1, True),
    "gru-bidirectional": ("gru", 1, True),
    "gru-stacked": ("gru", 2, False),
}

_RNN_PATTERN = re.compile(
    r"^(?P<cell>lstm|gru)-E(?P<E>\d+)-H(?P<H>\d+)(?:-B(?P<B>\d+))?-T(?P<T>\d+)"
    r"(?:-L(?P<L>\d+))?(?P<bi>-bi)?$",
    re.IGNORECASE,
)
_PATTERN_HELP = "lstm|gru-E<E>-H<H>[-B<B>]-T<T>[-L<layers>][-bi]"


def list_models() -> list[str]:
    """Names accepted by :func:`get_model` (parametric RNN names excluded)."""
    return [*_CNN_DESCRIPTIONS, *_RNN_PRESETS]


def paper_rnn_models() -> list[str]:
    """The recurrent models from the DeepCPU paper (also accepted by :func:`get_model`): its text
    similarity model and BiDAF's LSTM layers. ModelCompiler's Fig. 4(a) stacks are parametric
    names (``rnn.modelcompiler_fig4a()``)."""
    return list(_PAPER_RNN_DESCRIPTIONS)


def _normalize(name: str) -> str:
    name = name.strip()
    if name.startswith("zoo:"):
        name = name[4:]
    return name.lower()


def _unknown(name: str) -> ValueError:
    return ValueError(
        f"unknown zoo model {name!r}; valid names: {', '.join(list_models() + paper_rnn_models())}, "
        f"or parametric {_PATTERN_HELP} (e.g. lstm-E256-H256-B1-T100-L2-bi); "
        "a 'zoo:' prefix is accepted"
    )


def parse_rnn_name(name: str, batch: int | str = 1) -> RnnSpec | None:
    """Resolve an RNN preset or parametric name to an :class:`RnnSpec`; None if not an RNN.

    ``batch`` fills in B for presets and for parametric names without ``-B``;
    a name that spells out B conflicting with a non-default ``batch`` is an error
    rather than a silent choice.
    """
    key = _normalize(name)
    if key in _RNN_PRESETS:
        cell, layers, bi = _RNN_PRESETS[key]
        return RnnSpec(cell, _DEFAULT_E, _DEFAULT_H, batch, _DEFAULT_T, layers, bi)
    m = _RNN_PATTERN.match(key)
    if m is None:
        return None
    b: int | str = batch
    if m["B"] is not None:
        b = int(m["B"])
        if batch not in (1, b):
            raise ValueError(f"{name!r} fixes batch {b} but batch={batch!r} was requested")
    spec = RnnSpec(
        m["cell"].lower(),
        int(m["E"]),
        int(m["H"]),
        b,
        int(m["T"]),
        int(m["L"]) if m["L"] else 1,
        m["bi"] is not None,
    )
    if min(spec.E, spec.H, spec.T, spec.layers) < 1 or (isinstance(b, int) and b < 1):
        raise ValueError(f"{name!r}: sizes must be positive")
    return spec


def get_model(name: str, batch: int | str = 1, seed: int = 0) -> onnx.ModelProto:
    """Build zoo model ``name`` (optionally ``zoo:``-prefixed) as an ``onnx.ModelProto``.

    ``batch`` is the batch size (an int, or a string for a symbolic dim);
    ``seed`` selects the deterministic random weights.  Raises ``ValueError``
    listing the valid names for an unknown name.
    """
    key = _normalize(name)
    if key in _CNN_DESCRIPTIONS:
        from .cnn import CNN_MODELS

        return CNN_MODELS[key](batch=batch, seed=seed)
    if key == "text-similarity":
        from .rnn import text_similarity_model

        return text_similarity_model(B=batch, seed=seed)
    if key == "bidaf-lstms":
        from .rnn import bidaf_lstms_model

        return bidaf_lstms_model(seed=seed)
    spec = parse_rnn_name(key, batch)
    if spec is None:
        raise _unknown(name)
    from .rnn import lstm_model

    return lstm_model(
        spec.E,
        spec.H,
        spec.B,
        spec.T,
        layers=spec.layers,
        bidirectional=spec.bidirectional,
        cell=spec.cell,
        seed=seed,
    )


def load_model_or_zoo(spec: str, batch: int | str = 1, seed: int = 0) -> tuple[onnx.ModelProto, str, str | None]:
    """What a command-line MODEL argument names: ``(proto, display name, zoo name or None)``.

    ``zoo:NAME`` is always a zoo model; otherwise an existing file wins, and a name with no file
    behind it is looked up in the zoo. Raises ``ValueError`` naming both readings when neither works.
    """
    from pathlib import Path

    if spec.startswith("zoo:"):
        return get_model(spec, batch=batch, seed=seed), spec[4:], _normalize(spec)
    path = Path(spec)
    if path.exists():
        from smelt.frontend.onnx_import import load_model

        return load_model(path), path.stem, None
    try:
        return get_model(spec, batch=batch, seed=seed), spec, _normalize(spec)
    except ValueError as exc:
        raise ValueError(f"no model file {spec!r}, and no zoo model of that name: {exc}") from None


def describe(name: str) -> str:
    """One-line human description of zoo model ``name`` (no model is built)."""
    key = _normalize(name)
    if key in _CNN_DESCRIPTIONS:
        return f"{key}: {_CNN_DESCRIPTIONS[key]}; output logits [N,1000]"
    if key in _PAPER_RNN_DESCRIPTIONS:
        return f"{key}: {_PAPER_RNN_DESCRIPTIONS[key]}"
    spec = parse_rnn_name(key)
    if spec is None:
        raise _unknown(name)
    if key not in _RNN_PRESETS:
        key = spec.name
    nd = 2 if spec.bidirectional else 1
    kind = ("bidirectional " if spec.bidirectional else "") + spec.cell.upper()
    layers = f"{spec.layers}-layer " if spec.layers > 1 else ""
    return (
        f"{key}: {layers}{kind} E={spec.E} H={spec.H} B={spec.B} T={spec.T}; "
        f"input x [T,B,E]=[{spec.T},{spec.B},{spec.E}]; outputs y [{spec.T},{spec.B},"
        f"{nd * spec.H}], y_h [{nd},{spec.B},{spec.H}]; {spec.num_params():,} params"
    )


def __getattr__(attr: str) -> Any:
    """Lazy re-exports so ``import smelt.frontend.zoo`` does not import onnx."""
    if attr in ("ModelBuilder", "count_parameters"):
        from . import builder

        return getattr(builder, attr)
    if attr in ("lstm_model", "deepcpu_table1", "text_similarity_model", "bidaf_lstms_model",
                "modelcompiler_fig4a"):
        from . import rnn

        return getattr(rnn, attr)
    if attr in ("REFERENCE_PARAMS", "CNN_MODELS"):
        from . import cnn

        return getattr(cnn, attr)
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
