"""Generated C built with AddressSanitizer and UBSan, run on zoo models and under concurrency:
no report allowed.

The sanitizer runtimes must be loaded first, so each model runs in a child Python started with
LD_PRELOAD; the onnxruntime reference is computed here, in the parent, and handed over as .npy.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers import ort_run, run_python

pytestmark = pytest.mark.sanitize


def _runtime_libs() -> str:
    libs = []
    for name in ("libasan.so", "libubsan.so"):
        out = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
        if not os.path.isabs(out):
            pytest.skip(f"gcc has no {name}")
        libs.append(out)
    return ":".join(libs)


def _sanitizer_env(tmp_path) -> dict[str, str]:
    return dict(os.environ, LD_PRELOAD=_runtime_libs(), SMELT_SANITIZE="1",
                ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:halt_on_error=1",
                UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
                SMELT_CACHE_DIR=str(tmp_path / "cache"))


def _run_child(code: str, tmp_path) -> subprocess.CompletedProcess:
    return run_python(textwrap.dedent(code), env=_sanitizer_env(tmp_path), timeout=900)


def _assert_clean(proc: subprocess.CompletedProcess) -> None:
    report = proc.stderr
    assert "AddressSanitizer" not in report and "runtime error" not in report, report[-4000:]
    assert proc.returncode == 0, report[-4000:]


@pytest.mark.parametrize("name", ["squeezenet1_1", "resnet18", "lstm-E32-H48-B3-T7-bi"])
def test_zoo_model_clean_under_sanitizers(name, tmp_path):
    from smelt.frontend import zoo

    model = zoo.get_model(name)
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    rng = np.random.default_rng(0)
    feeds = {}
    for inp in model.graph.input:
        shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        feeds[inp.name] = rng.standard_normal(shape).astype(np.float32)
    np.savez(tmp_path / "feeds.npz", **feeds)
    np.savez(tmp_path / "ref.npz", *ort_run(model, feeds, threads=2))
    proc = _run_child(f"""
        import numpy as np, smelt
        feeds = dict(np.load({str(tmp_path / 'feeds.npz')!r}))
        ref = np.load({str(tmp_path / 'ref.npz')!r})
        for threads in (1, 2):
            cm = smelt.compile({str(path)!r}, threads=threads)
            assert cm.fallback_nodes == [], cm.fallback_nodes
            outs = cm.run(feeds)
            for i, out in enumerate(outs):
                want = ref[f"arr_{{i}}"]
                err = float(np.max(np.abs(out - want))) / max(1.0, float(np.max(np.abs(want))))
                assert err <= 1e-4, (threads, i, err)
        print("ok")
    """, tmp_path)
    _assert_clean(proc)
    assert "ok" in proc.stdout


def test_sanitizer_build_does_report_a_real_overflow(tmp_path):
    """Negative control: the sanitized toolchain must catch an out-of-bounds write."""
    proc = _run_child("""
        import ctypes
        from smelt.codegen.toolchain import build_shared_library
        src = '#include "smelt_rt.h"\\n' + '''
        __attribute__((visibility("default"))) int overflow(int n) {
            int *p = (int *)malloc(sizeof(int) * n);
            p[n] = 1;  /* one past the end */
            int r = p[0];
            free(p);
            return r;
        }'''
        lib = ctypes.CDLL(str(build_shared_library(src, name="overflow", sanitize=True)))
        lib.overflow(4)
    """, tmp_path)
    assert "heap-buffer-overflow" in proc.stderr


def test_concurrency_stress_clean_under_sanitizers(tmp_path):
    """tests/concurrency_stress.py for 10 s on sanitized builds: variants evicted, closed and
    replaced while other threads run them, two instances of one library, a bound growing
    mid-run. A pool, arena or library freed under a call would be a use-after-free report."""
    from concurrency_stress import write_references

    refs = tmp_path / "refs.npz"
    write_references(str(refs))
    proc = run_python(Path(__file__).parent / "concurrency_stress.py", "10", str(refs),
                      env=_sanitizer_env(tmp_path), extra_env={"SMELT_MAX_VARIANTS": "2"}, timeout=1800)
    _assert_clean(proc)
    assert "stress ok" in proc.stdout
