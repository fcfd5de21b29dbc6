"""Is a refactor of code generation speed-neutral? Compare the object code it produces.

Renders zoo models for the host's AVX2 target and for an AVX-512 target (compiled, never run,
with ``-mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma``, so any x86 host with gcc can check
the AVX-512 rendering), disassembles each object, and compares two checkouts after removing
what cannot matter: addresses and the source-hash suffix of kernel names.

    python benchmarks/compare_object_code.py --before /path/to/old/checkout --models resnet18 mobilenet_v2

Each checkout renders in its own process (``PYTHONPATH`` pointing at it). Output: per model and
ISA, the number of differing instruction lines (0 = identical code) and the C line counts.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

RENDER = r'''
import dataclasses, subprocess, sys
from pathlib import Path
from smelt.codegen import toolchain
from smelt.codegen.emit import generate
from smelt.codegen.plan import build_plan
from smelt.compiler import lower
try:
    from smelt.options import CompileOptions
except ImportError:  # checkouts before smelt/options.py
    from smelt.compiler import CompileOptions
from smelt.frontend.zoo import load_model_or_zoo
from smelt.target import detect

out, layout = Path(sys.argv[1]), sys.argv[2]
real = detect()
avx512 = dataclasses.replace(real, isa="avx512", vector_bits=512, vector_registers=32,
                             flags=tuple(sorted(set(real.flags) | {"avx512f", "avx512bw", "avx512vl", "avx512dq"})))
targets = {"avx2": (dataclasses.replace(real, isa="avx2", vector_bits=256, vector_registers=16), ["-mavx2", "-mfma"]),
           "avx512": (avx512, ["-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"])}
for model in sys.argv[3:]:
    proto, _, _ = load_model_or_zoo("zoo:" + model)
    for isa, (t, flags) in targets.items():
        opts = CompileOptions(threads=2, layout=layout, use_tuning_db=False)
        g = lower(proto, opts, t)
        src = toolchain.source_with_runtime(generate(g, build_plan(g, ()), t, opts.codegen_threads(t)).source)
        c = out / f"{model}-{isa}.c"
        c.write_text(src)
        o = c.with_suffix(".o")
        # every flag the real build uses (-O3 included) but the host ISA, set explicitly per target
        base = [f for f in toolchain.compile_flags(t) if not f.startswith("-march") and not f.startswith("-mtune")]
        subprocess.run(["gcc", *base, "-march=x86-64-v3", *flags, "-c", "-o", str(o), str(c)], check=True)
        dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(o)], capture_output=True, text=True,
                             check=True).stdout
        c.with_suffix(".dis").write_text(dis)
'''

_ADDR = re.compile(r"^\s*[0-9a-f]+:\t")
_HASH = re.compile(r"_[0-9a-f]{10}(?=[._+> ]|$)")
_SYM = re.compile(r"^[0-9a-f]{16} <")


def _normalized(path: Path) -> list[str]:
    lines = []
    for line in path.read_text().splitlines():
        if "file format" in line:
            continue
        line = _SYM.sub("<", _HASH.sub("_H", _ADDR.sub("", line)))
        line = re.sub(r"\b[0-9a-f]+ <", "<", line)  # jump targets are addresses too
        lines.append(re.sub(r"step_\w+?_H\b", "step_H", line))  # a step function is named for its template
    return lines


def _render(checkout: Path, out: Path, layout: str, models: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(checkout), SMELT_TUNING_DB="off",
               SMELT_CACHE_DIR=str(out / "cache"))
    # cwd: the output directory, since "-c" puts the working directory first on sys.path
    subprocess.run([sys.executable, "-c", RENDER, str(out), layout, *models], check=True, env=env, cwd=out)


def _diff_count(a: list[str], b: list[str]) -> int:
    import difflib

    return sum(1 for d in difflib.ndiff(a, b) if d[:1] in "+-")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, type=Path, help="the old checkout (a git worktree)")
    ap.add_argument("--after", type=Path, default=Path(__file__).resolve().parents[1], help="default: this checkout")
    ap.add_argument("--models", nargs="+", default=["resnet18", "mobilenet_v2"])
    ap.add_argument("--layout", default="propagate")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sides = {}
        for side, checkout in (("before", args.before), ("after", args.after)):
            print(f"rendering {side} ({checkout}) ...", file=sys.stderr, flush=True)
            sides[side] = Path(tmp) / side
            _render(checkout.resolve(), sides[side], args.layout, args.models)
        for model in args.models:
            for isa in ("avx2", "avx512"):
                name = f"{model}-{isa}"
                n = _diff_count(_normalized(sides["before"] / f"{name}.dis"), _normalized(sides["after"] / f"{name}.dis"))
                ca = len((sides["before"] / f"{name}.c").read_text().splitlines())
                cb = len((sides["after"] / f"{name}.c").read_text().splitlines())
                print(f"{name:28s} differing instruction lines: {n:6d}   C lines {ca} -> {cb}")


if __name__ == "__main__":
    main()
