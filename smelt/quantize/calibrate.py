"""Calibration: activation ranges from the fp32 model run over calibration inputs.

The inputs are a folder of .npz files (one array per input name) or .npy files (a single-input
model), or any iterable of feed dicts (a list, a generator, a data loader). The model runs
compiled by smelt, with the tensors to calibrate added as outputs; the statistics are numpy
(offline tooling, not a compiled model's hot path). Methods:

- ``minmax``: the extremes seen over all samples.
- ``percentile``: per sample the given percentile of each side, averaged over samples (trims
  outliers that a single sample carries).
- ``entropy``: TensorRT's KL-divergence threshold: a 2048-bin histogram of |x| over all samples
  (a first pass finds max|x|, a second fills the histogram; exact zeros left out, see
  ``collect_ranges``), then the clipping threshold T whose
  quantized histogram (``levels`` bins) is closest in KL divergence to the clipped reference;
  the range is [max(min, -T), min(max, T)].

Every range includes 0 (a zero point must represent 0 exactly).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from smelt.errors import SmeltError

METHODS = ("minmax", "percentile", "entropy")
BINS = 2048


def calibration_inputs(source: str | Path | Iterable[Mapping[str, np.ndarray] | np.ndarray],
                       input_names: list[str]) -> Iterator[dict[str, np.ndarray]]:
    """Calibration feeds from a folder of .npz files (arrays by input name) or .npy files (the
    model's single input), or from an iterable (a list, a generator, a data loader) of feed dicts
    or, for a single-input model, of arrays."""
    if isinstance(source, (str, Path)):
        folder = Path(source)
        files = sorted(p for p in folder.iterdir() if p.suffix in (".npz", ".npy")) if folder.is_dir() else []
        if not files:
            raise SmeltError(f"calibration folder {str(folder)!r} has no .npz or .npy files")
        for path in files:
            if path.suffix == ".npz":
                with np.load(path) as npz:
                    yield {k: npz[k] for k in npz.files}
            elif len(input_names) == 1:
                yield {input_names[0]: np.load(path)}
            else:
                raise SmeltError(f"{path.name}: a .npy file feeds a single-input model; this one has inputs "
                                 f"{input_names}: use .npz files with one array per input name")
        return
    for feed in source:
        if isinstance(feed, Mapping):
            yield {k: np.asarray(v) for k, v in feed.items()}
        elif len(input_names) == 1:  # a bare array (or array-like) feeds a single-input model
            yield {input_names[0]: np.asarray(feed)}
        else:
            raise SmeltError(f"a calibration item of type {type(feed).__name__} feeds a single-input model; this "
                             f"one has inputs {input_names}: yield dicts of arrays by input name")


def graph_inputs(model: onnx.ModelProto) -> list[str]:
    inits = {i.name for i in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def _over_samples(model: onnx.ModelProto, tensors: list[str], feeds: list[dict[str, np.ndarray]],
                  threads: int | None, visit: Callable[[str, np.ndarray], None]) -> None:
    """Run ``model`` (with ``tensors`` as extra outputs) over ``feeds``; ``visit`` each tensor's
    finite values (float64)."""
    from smelt.api import compile as smelt_compile

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    present = {o.name for o in probe.graph.output}
    probe.graph.output.extend(helper.make_empty_tensor_value_info(t) for t in tensors if t not in present)
    names = [o.name for o in probe.graph.output]
    compiled = None
    try:
        for feed in feeds:
            if compiled is None:
                compiled = smelt_compile(probe, threads=threads,
                                         input_shapes={k: list(np.shape(v)) for k, v in feed.items()})
            outs = dict(zip(names, compiled.run_graph(feed), strict=True))
            for t in tensors:
                a = np.asarray(outs[t], np.float64)
                visit(t, a[np.isfinite(a)])
    finally:
        if compiled is not None:
            compiled.close()


def kl_threshold(hist: np.ndarray, levels: int) -> int:
    """TensorRT's entropy calibration: the number of bins ``i`` (>= levels) to keep so that the
    histogram clipped at bin ``i`` (outliers added to its last bin) and its quantization into
    ``levels`` bins (each bin's mass spread over its nonzero source bins) are closest in KL."""
    hist = np.asarray(hist, np.float64)
    nbins = hist.size
    if nbins <= levels or hist.sum() == 0:
        return nbins
    tail = np.concatenate([np.cumsum(hist[::-1])[::-1], [0.0]])  # tail[i] = sum(hist[i:])
    best_kl, best_i = np.inf, nbins
    for i in range(levels, nbins + 1):
        src = hist[:i]
        p = src.copy()
        p[-1] += tail[i]
        idx = (np.arange(i) * levels) // i
        nz = src > 0
        chunk_sum = np.bincount(idx, weights=src, minlength=levels)
        chunk_nz = np.bincount(idx, weights=nz.astype(np.float64), minlength=levels)
        q = np.where(nz, chunk_sum[idx] / np.maximum(chunk_nz[idx], 1.0), 0.0)
        ps, qs = p / p.sum(), q / max(q.sum(), 1e-300)
        m = ps > 0
        kl = float(np.sum(ps[m] * np.log(ps[m] / np.maximum(qs[m], 1e-12))))
        if kl < best_kl:
            best_kl, best_i = kl, i
    return best_i


def collect_ranges(model: onnx.ModelProto, tensors: list[str], feeds: list[dict[str, np.ndarray]], *,
                   method: str = "minmax", percentile: float = 99.99, threads: int | None = None,
                   bits: Mapping[str, tuple[int, bool]] | None = None) -> dict[str, tuple[float, float]]:
    """Per tensor the calibrated range [lo, hi] (including 0). ``bits``: per tensor its (bits,
    symmetric), for entropy's level count (default (8, False)): a tensor that is never negative,
    quantized asymmetrically, spends all 2^bits codes on [0, T]; otherwise 2^(bits-1) codes cover
    each side."""
    if method not in METHODS:
        raise SmeltError(f"unknown calibration method {method!r}; choose one of {', '.join(METHODS)}")
    if not feeds:
        raise SmeltError("no calibration samples: give a folder of .npz/.npy files or an iterable of feeds")
    lo: dict[str, list[float]] = {t: [] for t in tensors}
    hi: dict[str, list[float]] = {t: [] for t in tensors}

    def extremes(t: str, a: np.ndarray) -> None:
        if a.size:
            if method == "percentile":
                lo[t].append(float(np.percentile(a, 100.0 - percentile)))
                hi[t].append(float(np.percentile(a, percentile)))
            else:
                lo[t].append(float(a.min()))
                hi[t].append(float(a.max()))

    _over_samples(model, tensors, feeds, threads, extremes)
    if method == "percentile":
        ranges = {t: (float(np.mean(lo[t])) if lo[t] else 0.0, float(np.mean(hi[t])) if hi[t] else 0.0)
                  for t in tensors}
    else:
        ranges = {t: (min(lo[t], default=0.0), max(hi[t], default=0.0)) for t in tensors}
    if method == "entropy":
        amax = {t: max(abs(ranges[t][0]), abs(ranges[t][1])) for t in tensors}
        hists = {t: np.zeros(BINS, np.float64) for t in tensors}

        def histogram(t: str, a: np.ndarray) -> None:
            a = np.abs(a[a != 0])  # exact zeros (a Relu's half) are exact at any scale; left in, that
            if a.size and amax[t] > 0:  # spike smears into its chunk and drags the threshold down
                hists[t] += np.histogram(a, bins=BINS, range=(0.0, amax[t]))[0]

        _over_samples(model, tensors, feeds, threads, histogram)
        for t in tensors:
            if amax[t] > 0:
                width, symmetric = (bits or {}).get(t, (8, False))
                levels = 2**width if ranges[t][0] >= 0 and not symmetric else 2 ** (width - 1)
                edge = kl_threshold(hists[t], min(levels, BINS)) * amax[t] / BINS
                ranges[t] = (max(ranges[t][0], -edge), min(ranges[t][1], edge))
    return {t: (min(0.0, a), max(0.0, b)) for t, (a, b) in ranges.items()}
