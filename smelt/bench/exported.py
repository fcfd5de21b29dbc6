"""Transformer encoders exported at run time: the wild suite's ``wild:<name>`` entries that no
wheel ships, built from a ``transformers`` config with seeded random weights and exported with
``torch.onnx.export`` into the cache directory on first use.

Why exported, not downloaded: trained encoder weights live on a model hub, which this project
does not reach; the *graphs* are what smelt is measured on, and an export from the library
everyone uses spells them as they are spelled in the wild (GELU as ``x*0.5*(1+erf(x/sqrt2))``,
LayerNormalization at opset 17, the attention mask as Sub/Mul/Add before Softmax). Random
weights with a fixed seed give the same bytes for the same torch and transformers versions
(both are part of the file's directory name, so another version exports anew).

Nothing is exported when torch or transformers is missing: the suite then lists none of these
entries and says so once, and naming one is an error saying what to install.

Sizes (batch 1, 2 cores in mind):

- ``bert-minilm-l6``: BERT at all-MiniLM-L6-v2's shape (hidden 384, 6 layers, 12 heads of 32,
  FFN 1536), sequence 128. The base-class layout (post-LayerNorm BERT blocks, token-type
  embeddings), at the size people deploy on CPUs; BERT-base itself (768 x 12) is ~22 GFLOP a
  call, a second on two shared cores per engine per round.
- ``distilbert-base``: DistilBERT at its real size (dim 768, 6 layers, 12 heads of 64, FFN
  3072), sequence 128: the 768-wide GEMMs of BERT-base at half its depth.
- ``vit-small``: ViT at DeiT-S's shape (hidden 384, 12 layers, 6 heads, FFN 1536), image 224,
  patch 16: 197 tokens (196 patches + CLS).
- ``whisper-tiny-encoder``: Whisper-tiny's audio encoder (d_model 384, 4 layers, 6 heads, FFN
  1536, two Conv1d), log-mel input 80 x 3000 (Whisper always pads to 30 s): 1500 positions,
  whose 1500 x 1500 attention per head is the heaviest attention of the set.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from smelt.errors import SmeltError

OPSET = 17  # LayerNormalization is a single op from 17 on; pinned so the graph never drifts
SEED = 0


@dataclass(frozen=True)
class ExportedModel:
    name: str  # the suite's name for it: ``wild:<name>``
    family: str  # "bert", "distilbert", "vit", "whisper-encoder": which exporter builds it
    config: dict  # the transformers config's arguments (everything else is the class default)
    what: str
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    vocab: int = 0  # token-id inputs are drawn from [0, vocab): ids of 0 everywhere attend uniformly
    licence: str = "Apache-2.0 (transformers' model code; random weights)"
    # what the harness reads of any wild entry (``wild.WildModel``): the default bound, in the suite
    tolerance: float | None = None
    in_suite: bool = True


EXPORTED_MODELS: tuple[ExportedModel, ...] = (
    ExportedModel("bert-minilm-l6", "bert",
                  {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536,
                   "vocab_size": 30522},
                  "BERT encoder at all-MiniLM-L6-v2's shape (384 x 6 layers, 12 heads), seq 128",
                  {"input_ids": (1, 128), "attention_mask": (1, 128)}, vocab=30522),
    ExportedModel("distilbert-base", "distilbert",
                  {"dim": 768, "n_layers": 6, "n_heads": 12, "hidden_dim": 3072, "vocab_size": 30522},
                  "DistilBERT-base encoder (768 x 6 layers, 12 heads), seq 128",
                  {"input_ids": (1, 128), "attention_mask": (1, 128)}, vocab=30522),
    ExportedModel("vit-small", "vit",
                  {"hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 6, "intermediate_size": 1536,
                   "image_size": 224, "patch_size": 16},
                  "ViT at DeiT-S's shape (384 x 12 layers, 6 heads), 224x224 image, patch 16 (197 tokens)",
                  {"pixel_values": (1, 3, 224, 224)}),
    ExportedModel("whisper-tiny-encoder", "whisper-encoder",
                  {"d_model": 384, "encoder_layers": 4, "encoder_attention_heads": 6, "encoder_ffn_dim": 1536,
                   "decoder_layers": 4, "decoder_attention_heads": 6, "decoder_ffn_dim": 1536, "num_mel_bins": 80,
                   "max_source_positions": 1500},
                  "Whisper-tiny audio encoder (384 x 4 layers, 6 heads), log-mel 80 x 3000 (1500 positions)",
                  {"input_features": (1, 80, 3000)}),
)
BY_NAME = {m.name: m for m in EXPORTED_MODELS}


def missing_exporter() -> str | None:
    """Why nothing can be exported here (None when torch and transformers are importable)."""
    absent = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if absent:
        return (f"{' and '.join(absent)} not installed: the exported encoders "
                f"({', '.join(BY_NAME)}) are skipped; pip install torch transformers to include them")
    return None


def suite_names(prefix: str) -> list[str]:
    """``prefix + name`` for every entry, or none (with the reason on stderr) without an exporter."""
    why = missing_exporter()
    if why is not None:
        print(f"wild suite: {why}", file=sys.stderr)
        return []
    return [prefix + m.name for m in EXPORTED_MODELS]


def export_path(model: ExportedModel, cache_dir: Path | None = None) -> Path:
    """Where the export lives: keyed by the torch and transformers versions (they decide the bytes)."""
    import torch
    import transformers

    if cache_dir is None:
        from smelt.cache import root

        cache_dir = root()
    tag = f"torch-{torch.__version__}-transformers-{transformers.__version__}-opset{OPSET}"
    return Path(cache_dir) / "exported" / tag / f"{model.name}.onnx"


def export(model: ExportedModel, cache_dir: Path | None = None) -> Path:
    """The model file, exported on first use (seeded random weights, opset ``OPSET``)."""
    why = missing_exporter()
    if why is not None:
        raise SmeltError(f"wild:{model.name}: {why}")
    path = export_path(model, cache_dir)
    if path.is_file():
        return path
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    module, args, names, outputs = _BUILDERS[model.family](model)
    module.eval()
    tmp = path.with_suffix(".part.onnx")
    with torch.no_grad():
        torch.onnx.export(module, args, str(tmp), input_names=names, output_names=outputs,
                          opset_version=OPSET, dynamo=False, do_constant_folding=True)
    tmp.replace(path)
    return path


def fixed_values(model: ExportedModel, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs that must be meaningful: token ids spread over the vocabulary (all-zero ids make
    every position the same vector, so attention is uniform and a wrong softmax still passes),
    and a mask of ones with the last eighth masked out, so the mask path is exercised."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in model.shapes.items():
        if name == "input_ids":
            out[name] = rng.integers(0, model.vocab, shape).astype(np.int64)
        elif name == "attention_mask":
            mask = np.ones(shape, np.int64)
            mask[..., shape[-1] - shape[-1] // 8:] = 0
            out[name] = mask
    return out


# ----------------------------------------------------------------------------- the exporters
def _text_encoder(cls_name: str, config_name: str, **kwargs) -> Callable:
    def build(model: ExportedModel):
        import torch
        import transformers

        inner = getattr(transformers, cls_name)(getattr(transformers, config_name)(**model.config), **kwargs)

        class Wrap(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, ids, mask):
                return self.m(input_ids=ids, attention_mask=mask).last_hidden_state

        ids = torch.zeros(model.shapes["input_ids"], dtype=torch.long)
        mask = torch.ones(model.shapes["attention_mask"], dtype=torch.long)
        return Wrap(inner), (ids, mask), ["input_ids", "attention_mask"], ["last_hidden_state"]

    return build


def _vit(model: ExportedModel):
    import torch
    import transformers

    inner = transformers.ViTModel(transformers.ViTConfig(**model.config), add_pooling_layer=False)

    class Wrap(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, pixels):
            return self.m(pixel_values=pixels).last_hidden_state

    return Wrap(inner), (torch.zeros(model.shapes["pixel_values"]),), ["pixel_values"], ["last_hidden_state"]


def _whisper_encoder(model: ExportedModel):
    import torch
    import transformers

    inner = transformers.WhisperModel(transformers.WhisperConfig(**model.config)).get_encoder()

    class Wrap(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, features):
            return self.m(input_features=features).last_hidden_state

    return Wrap(inner), (torch.zeros(model.shapes["input_features"]),), ["input_features"], ["last_hidden_state"]


_BUILDERS: dict[str, Callable] = {
    "bert": _text_encoder("BertModel", "BertConfig", add_pooling_layer=False),
    "distilbert": _text_encoder("DistilBertModel", "DistilBertConfig"),
    "vit": _vit,
    "whisper-encoder": _whisper_encoder,
}
