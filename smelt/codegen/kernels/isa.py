"""The vector ISAs smelt renders C for, as data: one ``VectorIsa`` per instruction set.

Templates never compare ISA names: they ask the description for a C spelling (``v.fmadd(a, b, c)``,
``v.masked_load(ptr, m)``), a size (``v.lanes``, ``v.registers``) or a shape (``v.gemm_kernel``).
Adding an ISA (AVX-VNNI, NEON, ...) is one more description here plus its tests
(tests/kernels/test_isa.py), not edits in every template. Helper C functions that are more than one
intrinsic (horizontal sum/max; the vector exp, sigmoid and tanh: ``exp_fn``, ``sigmoid_fn``,
``tanh_fn``, ``erf_fn``, ``gelu_fn``) live in ``csrc/smelt_vec.h``, embedded into every generated translation unit like
the runtime header (codegen/toolchain.py ``source_with_runtime``).

Every spelling is a format string with ``{p}`` (pointer), ``{a}``/``{b}``/``{c}`` (operands),
``{m}`` (tail mask), ``{n}`` (lane count) placeholders; the portable description has no vector
type (``vtype`` empty): templates render plain C loops for it, ``lanes`` being the width of those
loops (the compiler vectorizes them at whatever the host has).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from smelt.target import Target

VEC_HEADER = Path(__file__).resolve().parent / "csrc" / "smelt_vec.h"

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class VectorIsa:
    """One vector ISA for f32 kernels: sizes, C types and the C spelling of each operation."""

    name: str  # the tag in kernel names ("avx512", "avx2", "scalar"); never compared by templates
    lanes: int  # f32 lanes per vector (portable C: the width of its unrolled inner loops)
    registers: int  # architectural vector registers (register-tile budgets)
    vtype: str  # C vector type ("" for portable C)
    prefix: str  # intrinsic prefix ("_mm512"); "" for portable C
    mask_type: str  # C type of a tail mask
    tail_mask: str  # mask of the first {n} lanes, 0 <= n <= lanes
    masked_load_fmt: str  # {p} under mask {m}, zero in masked-off lanes
    masked_store_fmt: str  # store {a} to {p} under mask {m} (a statement)
    select_ge_zero_fmt: str  # lane-wise {a} >= 0 ? {b} : {c} (ordered: NaN takes {c})
    any_eq_fmt: str  # C truth value: some lane of {a} equals that of {b} (ordered)
    hsum_fn: str  # C function (csrc/smelt_vec.h or an intrinsic): sum of the lanes
    hmax_fn: str  # max of the lanes (NaN in any lane gives NaN)
    # the vector math (csrc/smelt_vec.h, one implementation per width; needs FMA): expf, the
    # sigmoid 1/(1 + e^-x) and tanhf, each a C function of one vector
    exp_fn: str
    broadcast_fmt: str  # the float at {p} in every lane
    cflags: tuple[str, ...]  # gcc flags enabling the ISA (when the host default does not)
    features: tuple[str, ...]  # /proc/cpuinfo flags the host must have to run it
    gemm_kernel: tuple[int, int]  # GEMM micro-kernel (MR rows, NR columns), NR a multiple of lanes
    sigmoid_fn: str = ""
    tanh_fn: str = ""
    erf_fn: str = ""  # erf (ONNX's Erf)
    gelu_fn: str = ""  # the exact GELU x/2 (1 + erf(x/sqrt2)) of exported transformers (its own erf)
    fma: bool = True  # fused multiply-add available (else mul + add: two roundings)
    # tail masks are integer bit masks (lane i under bit i: shifts and ANDs build them) rather
    # than vectors of all-ones lanes
    bit_masks: bool = False
    # AVX-512 folds a broadcast of a scalar in memory into the FMA's memory operand
    # (``vfmadd231ps zmm, zmm, [mem]{1to16}``): the conv kernels rely on it
    embedded_broadcast: bool = False
    # AVX-512 hosts prefer 512-bit auto-vectorization of plain loops only when asked
    prefer_vector_width: int = 0
    # the C header (csrc/) implementing the RNN template's 16-lane logical vector ``VX_v`` and
    # its math (exp, sigmoid, tanh) on this ISA; the portable struct where none is native
    rnn_header: str = "rnn_vec_portable.h"
    c_header: str = "immintrin.h"  # where the intrinsics are declared
    # spellings only some ISAs have, by name (``has``/``x``): int32 lane vectors, masked gathers,
    # merge-masked loads, two-source permutes (the conv im2col and depthwise kernels use them)
    extra: tuple[tuple[str, str], ...] = ()

    # ---- sizes ------------------------------------------------------------------------------
    @property
    def vector(self) -> bool:
        """Intrinsics available (False: portable C loops)."""
        return bool(self.vtype)

    @property
    def bytes(self) -> int:
        return 4 * self.lanes

    # the short spellings templates use inside f-strings
    @property
    def t(self) -> str:
        return self.vtype

    @property
    def w(self) -> int:
        return self.lanes

    @property
    def isa(self) -> str:
        return self.name

    # ---- values -----------------------------------------------------------------------------
    def zero(self) -> str:
        return f"{self.prefix}_setzero_ps()"

    def set1(self, x: str) -> str:
        return f"{self.prefix}_set1_ps({x})"

    def broadcast(self, ptr: str) -> str:
        """The float at ``ptr`` in every lane (folded into an FMA's memory operand where the ISA
        has embedded broadcast)."""
        return self.broadcast_fmt.format(p=ptr)

    # ---- memory -----------------------------------------------------------------------------
    def load(self, ptr: str) -> str:
        return f"{self.prefix}_load_ps({ptr})"

    def loadu(self, ptr: str) -> str:
        return f"{self.prefix}_loadu_ps({ptr})"

    def store(self, ptr: str, v: str) -> str:
        return f"{self.prefix}_store_ps({ptr}, {v});"

    def storeu(self, ptr: str, v: str) -> str:
        return f"{self.prefix}_storeu_ps({ptr}, {v});"

    def lane_mask(self, n: str) -> str:
        """C expression: the mask of the first ``n`` lanes (0 <= n <= lanes)."""
        return self.tail_mask.format(n=n if _IDENT.match(n) else f"({n})")

    def masked_load(self, ptr: str, mask: str | None) -> str:
        """``ptr`` loaded in the lanes of ``mask`` (others 0; nothing read there); None: all lanes."""
        return self.loadu(ptr) if mask is None else self.masked_load_fmt.format(p=ptr, m=mask)

    def masked_store(self, ptr: str, v: str, mask: str | None) -> str:
        """Statement: ``v`` stored to the lanes of ``mask`` at ``ptr``; None: all lanes."""
        return self.storeu(ptr, v) if mask is None else self.masked_store_fmt.format(p=ptr, a=v, m=mask)

    def prefetch(self, ptr: str) -> str:
        """Statement: bring the cache line at ``ptr`` into L1."""
        return f"_mm_prefetch((const char *)({ptr}), _MM_HINT_T0);"

    def prefetch_l2(self, ptr: str) -> str:
        """Statement: bring the cache line at ``ptr`` into L2 (not L1)."""
        return f"_mm_prefetch((const char *)({ptr}), _MM_HINT_T1);"

    # ---- arithmetic -------------------------------------------------------------------------
    def op(self, name: str, a: str, b: str) -> str:
        """``name`` in add, sub, mul, div, max, min. max/min return their SECOND operand when
        either is NaN: put the value second to keep NaN (codegen/kernels/epilogue.py)."""
        return f"{self.prefix}_{name}_ps({a}, {b})"

    def fmadd(self, a: str, b: str, c: str) -> str:
        """a * b + c (one rounding with FMA; mul then add without)."""
        if self.fma:
            return f"{self.prefix}_fmadd_ps({a}, {b}, {c})"
        return self.op("add", self.op("mul", a, b), c)

    def fnmadd(self, a: str, b: str, c: str) -> str:
        """c - a * b."""
        if self.fma:
            return f"{self.prefix}_fnmadd_ps({a}, {b}, {c})"
        return self.op("sub", c, self.op("mul", a, b))

    def ge_zero_select(self, v: str, if_ge: str, if_lt: str) -> str:
        """Lane-wise ``v >= 0 ? if_ge : if_lt`` (ordered compare: NaN takes ``if_lt``)."""
        return self.select_ge_zero_fmt.format(a=v, b=if_ge, c=if_lt)

    def any_eq(self, a: str, b: str) -> str:
        """C truth value: some lane of ``a`` equals the same lane of ``b``."""
        return self.any_eq_fmt.format(a=a, b=b)

    def has(self, name: str) -> bool:
        """The ISA has the optional operation ``name`` (see ``extra``)."""
        return any(k == name for k, _ in self.extra)

    def x(self, name: str, **args: str) -> str:
        """The optional operation ``name`` with its placeholders filled (``has(name)`` first)."""
        return next(f for k, f in self.extra if k == name).format(**args)

    def hsum(self, v: str) -> str:
        """C float: the sum of the lanes of ``v``."""
        return f"{self.hsum_fn}({v})"

    def hmax(self, v: str) -> str:
        """C float: the max of the lanes of ``v``."""
        return f"{self.hmax_fn}({v})"

    def fn_attributes(self) -> str:
        """Attributes for a function whose plain loops gcc should vectorize at full width."""
        if self.prefer_vector_width:
            return f'__attribute__((target("prefer-vector-width={self.prefer_vector_width}"))) '
        return ""


# the integer kernels' operand broadcast (``word_set1``, int_conv_nchwc): the four bytes at {p} (u8
# quads, or two int16 of a pair; any alignment: through memcpy, which gcc turns into one load) as
# the int32 of every lane
_LOAD32 = "({{ int32_t w_; __builtin_memcpy(&w_, (const void *)({p}), 4); w_; }})"


AVX512 = VectorIsa(
    rnn_header="rnn_vec_avx512.h",
    name="avx512", lanes=16, registers=32, vtype="__m512", prefix="_mm512", mask_type="__mmask16",
    tail_mask="(__mmask16)((1u << {n}) - 1u)",
    masked_load_fmt="_mm512_maskz_loadu_ps({m}, {p})",
    masked_store_fmt="_mm512_mask_storeu_ps({p}, {m}, {a});",
    select_ge_zero_fmt="_mm512_mask_blend_ps(_mm512_cmp_ps_mask({a}, _mm512_setzero_ps(), _CMP_GE_OQ), {c}, {b})",
    any_eq_fmt="_mm512_cmp_ps_mask({a}, {b}, _CMP_EQ_OQ)",
    hsum_fn="_mm512_reduce_add_ps", hmax_fn="smelt_hmax512",
    exp_fn="smelt_vexp512", sigmoid_fn="smelt_vsigmoid512", tanh_fn="smelt_vtanh512", erf_fn="smelt_verf512",
    gelu_fn="smelt_vgelu512",
    broadcast_fmt="_mm512_set1_ps(*({p}))",
    cflags=("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma"),
    features=("avx512f", "avx512bw", "avx512vl", "avx512dq"),
    gemm_kernel=(8, 48), embedded_broadcast=True, prefer_vector_width=512, bit_masks=True,
    extra=(("itype", "__m512i"),
           # the lanes x lanes float tile at {src} (rows {ss} apart) transposed into {dst} (rows {ds} apart)
           ("f32_transpose", "smelt_transpose16x16_ps({src}, {ss}, {dst}, {ds});"),
           # two output columns per vector (the NCHWc conv's column pairs): the float {a} in the
           # low 8 lanes and {b} in the high 8; one of them, the other half zero
           ("f32_pair_set1", "_mm512_mask_broadcastss_ps(_mm512_set1_ps({a}), (__mmask16)0xFF00, _mm_set_ss({b}))"),
           ("f32_low_set1", "_mm512_maskz_broadcastss_ps((__mmask16)0x00FF, _mm_set_ss({a}))"),
           ("f32_high_set1", "_mm512_maskz_broadcastss_ps((__mmask16)0xFF00, _mm_set_ss({b}))"),
           ("i32_set1", "_mm512_set1_epi32({a})"),
           ("i32_setr", "_mm512_setr_epi32({a})"),
           ("i32_add", "_mm512_add_epi32({a}, {b})"),
           ("i32_sub", "_mm512_sub_epi32({a}, {b})"),
           ("i32_mullo", "_mm512_mullo_epi32({a}, {b})"),
           ("i32_mask_add", "_mm512_mask_add_epi32({a}, {m}, {b}, {c})"),
           ("i32_ge0_mask", "_mm512_cmpge_epi32_mask({a}, _mm512_setzero_si512())"),
           ("i32_lt_mask", "_mm512_cmplt_epi32_mask({a}, {b})"),
           ("i32_loadu", "_mm512_loadu_si512((const void *)({p}))"),
           ("i32_storeu", "_mm512_storeu_si512((void *)({p}), {a});"),
           ("mask_loadu", "_mm512_mask_loadu_ps({a}, {m}, {p})"),  # merge: lanes off keep {a}
           ("mask_mov", "_mm512_mask_mov_ps({a}, {m}, {b})"),
           ("mask3_fmadd", "_mm512_mask3_fmadd_ps({a}, {b}, {c}, {m})"),  # {a}*{b}+{c} in lanes {m}, else {c}
           ("permute2", "_mm512_permutex2var_ps({a}, {i}, {b})"),  # lanes of {a}:{b} by index {i}
           ("maskz_permute2", "_mm512_maskz_permutex2var_ps({m}, {a}, {i}, {b})"),
           ("gather", "_mm512_mask_i32gather_ps({a}, {m}, {i}, {p}, 4)"),  # {p}[{i}] in lanes {m}, else {a}
           # {c} + per int32 lane the two int16 products of {a} and {b} summed (exact: no
           # saturation); VNNI hosts fuse it (``with_int_dot``)
           ("i16_dot_acc", "_mm512_add_epi32({c}, _mm512_madd_epi16({a}, {b}))"),
           ("u8s7_dot_acc", "_mm512_add_epi32({c}, _mm512_madd_epi16(_mm512_maddubs_epi16({a}, {b}), "
                            "_mm512_set1_epi16(1)))"),
           ("word_set1", "_mm512_set1_epi32(" + _LOAD32 + ")"),
           # the 16 bytes at {p} zero-extended into the int32 lanes (the int8 depthwise conv's
           # input: one channel per lane, the high int16 of each lane 0 for i16_dot_acc)
           ("u8_to_i32", "_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)({p})))"),
           # the 16 bytes at {p} and at {q} zero-extended into the low and the high int16 of the
           # int32 lanes (two kernel rows of the depthwise conv's input: one i16_dot_acc does both)
           ("u8x2_to_i16_pairs", "({{ const __m128i a_ = _mm_loadu_si128((const __m128i *)({p})), "
                                 "b_ = _mm_loadu_si128((const __m128i *)({q})); _mm512_cvtepu8_epi16("
                                 "_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi8(a_, b_)), "
                                 "_mm_unpackhi_epi8(a_, b_), 1)); }})"),
           ("i32_to_f32", "_mm512_cvtepi32_ps({a})"),
           ("f32_round_even", "_mm512_roundscale_ps({a}, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)"),
           ("f32_to_i32", "_mm512_cvttps_epi32({a})"),
           # rounded half to even in the conversion itself (embedded rounding: not MXCSR's mode)
           ("f32_to_i32_even", "_mm512_cvt_roundps_epi32({a}, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)"),
           # int32 lane counters {c} plus one where {a} is not >= {b} (NaN counts) / where {a} > {b}
           ("f32_nge_count", "_mm512_mask_add_epi32({c}, _mm512_cmp_ps_mask({a}, {b}, _CMP_NGE_UQ), {c}, "
                             "_mm512_set1_epi32(1))"),
           ("f32_gt_count", "_mm512_mask_add_epi32({c}, _mm512_cmp_ps_mask({a}, {b}, _CMP_GT_OQ), {c}, "
                            "_mm512_set1_epi32(1))"),
           # four int32 vectors {a} {b} {c} {d} saturated to [0, 255] and stored as 64 consecutive
           # bytes at {p} (two saturating packs, then the dwords back in order)
           ("i32x4_store_u8", "{{ __m512i q_ = _mm512_packus_epi16(_mm512_packs_epi32({a}, {b}), "
                              "_mm512_packs_epi32({c}, {d})); _mm512_storeu_si512((void *)({p}), "
                              "_mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, "
                              "3, 7, 11, 15), q_)); }}"),
           # two int32 vectors {a} {b} saturated to [0, 255] and stored as 32 consecutive bytes at
           # {p}: per 128-bit lane k the packs leave a's dword k in dword 4k and b's in 4k + 1
           ("i32x2_store_u8", "{{ __m512i q_ = _mm512_packs_epi32({a}, {b}); q_ = _mm512_packus_epi16(q_, q_); "
                              "_mm256_storeu_si256((__m256i *)({p}), _mm512_castsi512_si256(_mm512_permutexvar_epi32("
                              "_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0), q_))); }}"),
           # int32 lanes already within [0, 255] stored as bytes at {p}
           ("i32_store_u8", "_mm_storeu_si128((__m128i *)({p}), _mm512_cvtepi32_epi8({a}));"),
           # int32 lanes within [-128, 127] stored as int8 at {p} (vpmovdb keeps the low byte)
           ("i32_store_i8", "_mm_storeu_si128((__m128i *)({p}), _mm512_cvtepi32_epi8({a}));"),
           ("i8_to_i32", "_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)({p})))"),
           ("f32_abs", "_mm512_abs_ps({a})"),
           # C truth value: some lane of {a} <= that of {b} (ordered: a NaN lane is not)
           ("f32_any_le", "_mm512_cmp_ps_mask({a}, {b}, _CMP_LE_OQ)")))

AVX2 = VectorIsa(
    rnn_header="rnn_vec_avx2.h",
    name="avx2", lanes=8, registers=16, vtype="__m256", prefix="_mm256", mask_type="__m256i",
    tail_mask="_mm256_cmpgt_epi32(_mm256_set1_epi32({n}), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))",
    masked_load_fmt="_mm256_maskload_ps({p}, {m})",
    masked_store_fmt="_mm256_maskstore_ps({p}, {m}, {a});",
    select_ge_zero_fmt="_mm256_blendv_ps({c}, {b}, _mm256_cmp_ps({a}, _mm256_setzero_ps(), _CMP_GE_OQ))",
    any_eq_fmt="_mm256_movemask_ps(_mm256_cmp_ps({a}, {b}, _CMP_EQ_OQ))",
    hsum_fn="smelt_hsum256", hmax_fn="smelt_hmax256",
    exp_fn="smelt_vexp256", sigmoid_fn="smelt_vsigmoid256", tanh_fn="smelt_vtanh256", erf_fn="smelt_verf256",
    gelu_fn="smelt_vgelu256",
    broadcast_fmt="_mm256_broadcast_ss({p})",
    cflags=("-mavx2", "-mfma"), features=("avx2", "fma"), gemm_kernel=(6, 16),
    extra=(("itype", "__m256i"),
           ("f32_transpose", "smelt_transpose8x8_ps({src}, {ss}, {dst}, {ds});"),
           ("i32_set1", "_mm256_set1_epi32({a})"),
           ("i32_loadu", "_mm256_loadu_si256((const __m256i *)({p}))"),
           ("i32_add", "_mm256_add_epi32({a}, {b})"),
           ("i32_sub", "_mm256_sub_epi32({a}, {b})"),
           ("i32_mullo", "_mm256_mullo_epi32({a}, {b})"),
           ("i32_storeu", "_mm256_storeu_si256((__m256i *)({p}), {a});"),
           ("i16_dot_acc", "_mm256_add_epi32({c}, _mm256_madd_epi16({a}, {b}))"),
           # u8 x s8 quads through vpmaddubsw, whose int16 pair sums saturate: exact ONLY for
           # weights in [-64, 63] (2 * 255 * 64 <= 32767); the schedule checks the constant weights
           ("u8s7_dot_acc", "_mm256_add_epi32({c}, _mm256_madd_epi16(_mm256_maddubs_epi16({a}, {b}), "
                            "_mm256_set1_epi16(1)))"),
           ("word_set1", "_mm256_set1_epi32(" + _LOAD32 + ")"),
           ("u8_to_i32", "_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)({p})))"),
           ("u8x2_to_i16_pairs", "_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)({p})), "
                                 "_mm_loadl_epi64((const __m128i *)({q}))))"),
           ("i32_to_f32", "_mm256_cvtepi32_ps({a})"),
           ("f32_round_even", "_mm256_round_ps({a}, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)"),
           ("f32_to_i32", "_mm256_cvttps_epi32({a})"),
           ("f32_to_i32_even", "_mm256_cvttps_epi32(_mm256_round_ps({a}, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))"),
           # a true compare lane is all ones (-1): subtracting it counts one
           ("f32_nge_count", "_mm256_sub_epi32({c}, _mm256_castps_si256(_mm256_cmp_ps({a}, {b}, _CMP_NGE_UQ)))"),
           ("f32_gt_count", "_mm256_sub_epi32({c}, _mm256_castps_si256(_mm256_cmp_ps({a}, {b}, _CMP_GT_OQ)))"),
           ("i32x4_store_u8", "{{ __m256i q_ = _mm256_packus_epi16(_mm256_packs_epi32({a}, {b}), "
                              "_mm256_packs_epi32({c}, {d})); _mm256_storeu_si256((__m256i *)({p}), "
                              "_mm256_permutevar8x32_epi32(q_, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))); }}"),
           # two vectors as 16 bytes: per 128-bit lane k the packs leave a's dword in 4k, b's in 4k + 1
           ("i32x2_store_u8", "{{ __m256i q_ = _mm256_packs_epi32({a}, {b}); q_ = _mm256_packus_epi16(q_, q_); "
                              "_mm_storeu_si128((__m128i *)({p}), _mm256_castsi256_si128("
                              "_mm256_permutevar8x32_epi32(q_, _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0)))); }}"),
           # no vpmovdb before AVX-512: saturating packs (exact for in-range lanes), two dwords out
           ("i32_store_u8", "{{ __m256i t_ = _mm256_packs_epi32({a}, {a}); t_ = _mm256_packus_epi16(t_, t_); "
                            "int32_t l_ = _mm256_cvtsi256_si32(t_), h_ = _mm256_extract_epi32(t_, 4); "
                            "__builtin_memcpy({p}, &l_, 4); __builtin_memcpy((char *)({p}) + 4, &h_, 4); }}"),
           # the same with signed packs for int8 lanes within [-128, 127]
           ("i32_store_i8", "{{ __m256i t_ = _mm256_packs_epi32({a}, {a}); t_ = _mm256_packs_epi16(t_, t_); "
                            "int32_t l_ = _mm256_cvtsi256_si32(t_), h_ = _mm256_extract_epi32(t_, 4); "
                            "__builtin_memcpy({p}, &l_, 4); __builtin_memcpy((char *)({p}) + 4, &h_, 4); }}"),
           ("i8_to_i32", "_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)({p})))"),
           ("f32_abs", "_mm256_andnot_ps(_mm256_set1_ps(-0.0f), {a})"),
           ("f32_any_le", "_mm256_movemask_ps(_mm256_cmp_ps({a}, {b}, _CMP_LE_OQ))")))

# AVX-512 hosts running 8-channel (ymm) blocks: the AVX2 spelling (vector masks, blendv: the code
# those blocks always had) with AVX-512's 32 registers and embedded broadcast
AVX512_YMM = dataclasses.replace(AVX2, registers=32, cflags=AVX512.cflags, features=AVX512.features,
                                 embedded_broadcast=True)

# portable C: plain loops of 8 (the compiler vectorizes them); no intrinsics, no masks
PORTABLE = VectorIsa(
    name="scalar", lanes=8, registers=16, vtype="", prefix="", mask_type="int", tail_mask="{n}",
    masked_load_fmt="", masked_store_fmt="", select_ge_zero_fmt="", any_eq_fmt="", hsum_fn="", hmax_fn="", exp_fn="", broadcast_fmt="",
    cflags=(), features=(), gemm_kernel=(4, 16), fma=False)

DESCRIPTIONS = (AVX512, AVX2, AVX512_YMM, PORTABLE)


def vector_isa(target: Target, lanes: int | None = None) -> VectorIsa:
    """The description for ``target`` at ``lanes`` f32 lanes (None: the widest it has). A lane
    count the target has no vectors for gives the portable description."""
    if target.isa == "avx512":
        found = {16: AVX512, 8: AVX512_YMM}.get(lanes or 16)  # AVX-512F implies FMA
    elif target.isa == "avx2":
        found = AVX2 if lanes in (None, 8) else None
        if found is not None and not target.fma:
            found = _without_fma(found)
    else:
        found = None
    return found or PORTABLE


# AVX512-VNNI: vpdpwssd (the int16 pair dot product and the accumulation in one instruction) and
# vpdpbusd (four unsigned-by-signed byte products summed into each int32 lane, exact: no
# saturation, unlike AVX2's vpmaddubsw, which is why hosts without VNNI have no u8s8_dot_acc).
# As inline asm, not the _mm512_dpwssd/dpbusd_epi32 builtins: gcc 12 stored every accumulator of
# a register tile built on those builtins to the stack after each dot product (a 6x4 tile: 24
# stores per 24 products, the integer GEMM 1.5x slower); the asm keeps them in registers.
_VNNI_ASM = '({{{{ __m512i acc_ = {{c}}; __asm__("{op} %2, %1, %0" : "+v"(acc_) : "v"({{a}}), "vm"({{b}})); acc_; }}}})'
_VNNI_DOTS = (("i16_dot_acc", _VNNI_ASM.format(op="vpdpwssd")),
              ("u8s8_dot_acc", _VNNI_ASM.format(op="vpdpbusd")))


# AVX-VNNI (Intel cores since Alder Lake, Zen 5): the same two dot products on ymm registers,
# VEX-encoded, on CPUs without AVX-512. gas encodes a bare ``vpdpbusd`` on ymm in AVX512-VNNI's
# EVEX form, which such a CPU cannot run; the "{vex}" pseudo-prefix picks the AVX-VNNI encoding
# (written "%{vex%}" in GCC's extended asm, where braces separate assembler dialects, and with
# its braces doubled for the ``str.format`` that fills the operands). A test on a host with
# AVX512-VNNI + VL but not AVX-VNNI renders the EVEX form instead (""): the same instruction and
# result, so the ymm quad path runs there too.
AVX_VNNI_ENCODING = "%{{vex%}} "
_VNNI_YMM_ASM = ('({{{{ __m256i acc_ = {{c}}; __asm__("{enc}{op} %2, %1, %0" : "+x"(acc_) : "x"({{a}}), "xm"({{b}})); '
                 'acc_; }}}})')


def _int_dots(d: VectorIsa, target: Target) -> tuple[tuple[str, str], ...]:
    """The fused dot products ``target`` has at ``d``'s width (none: ``d``'s own forms stay)."""
    if d.lanes == 16 and "avx512_vnni" in target.flags:
        return _VNNI_DOTS
    if d.lanes == 8 and "avx_vnni" in target.flags:
        return tuple((name, _VNNI_YMM_ASM.format(enc=AVX_VNNI_ENCODING, op=op))
                     for name, op in (("i16_dot_acc", "vpdpwssd"), ("u8s8_dot_acc", "vpdpbusd")))
    return ()


# AVX512-VBMI (Ice Lake and later Intel cores, Zen 4 and 5): two kernel rows' 16 bytes as int16
# pairs in one byte permute, zeroing the high bytes under a mask (dword k = [a_k, 0, b_k, 0]),
# where the AVX-512F form takes four shuffles (two unpacks, an insert, the widening): the int8
# depthwise conv's inner loop ran on the one shuffle port Intel's cores have for 512-bit vectors
_PAIR_INDEX = ", ".join(f"0x{(16 + k) << 16 | k:x}" for k in range(16))
_VBMI_FORMS = (("u8x2_to_i16_pairs",
                "_mm512_maskz_permutexvar_epi8(0x5555555555555555ULL, _mm512_setr_epi32(" + _PAIR_INDEX + "), "
                "_mm512_zextsi256_si512(_mm256_inserti128_si256(_mm256_castsi128_si256("
                "_mm_loadu_si128((const __m128i *)({p}))), _mm_loadu_si128((const __m128i *)({q})), 1)))"),)


def _byte_permutes(d: VectorIsa, target: Target) -> tuple[tuple[str, str], ...]:
    """The byte-permute spellings ``target`` has at ``d``'s width (none: ``d``'s own stay)."""
    return _VBMI_FORMS if d.lanes == 16 and d.has("u8x2_to_i16_pairs") and "avx512vbmi" in target.flags else ()


def with_int_dot(d: VectorIsa, target: Target) -> VectorIsa:
    """``d`` with the host's integer dot products: the fused int16 pair form (vpdpwssd) and the
    exact u8 x s8 quad form (vpdpbusd) of AVX512-VNNI on 512-bit descriptions, of AVX-VNNI on
    256-bit ones; and with AVX512-VBMI's byte permute for the int16 pairs of two rows."""
    forms = (_int_dots(d, target) if d.has("i16_dot_acc") else ()) + _byte_permutes(d, target)
    if not forms:
        return d
    names = {k for k, _ in forms}
    return dataclasses.replace(d, extra=tuple(e for e in d.extra if e[0] not in names) + forms)


def exact_byte_products(target: Target) -> bool:
    """Whether ``target`` multiplies full-range u8 x s8 bytes exactly (VNNI's quad form); without
    it 8-bit weights run as int16 pairs, and only weights within 7 bits take the byte form
    (``u8s7_dot_acc``: vpmaddubsw cannot saturate on them)."""
    return with_int_dot(vector_isa(target), target).has("u8s8_dot_acc")


def with_lanes(lanes: int) -> VectorIsa:
    """The description with ``lanes`` f32 lanes (for 8: the AVX2 spelling, which AVX-512 hosts
    run too); portable C when no vector ISA has that width."""
    return next((d for d in DESCRIPTIONS if d.vector and d.lanes == lanes), PORTABLE)


def half_width(d: VectorIsa) -> VectorIsa | None:
    """The description of half ``d``'s width on the same host (AVX-512: its ymm form), or None."""
    return {AVX512: AVX512_YMM}.get(d)


def by_name(name: str, fma: bool = True, lanes: int | None = None) -> VectorIsa:
    """The description named ``name`` at ``lanes`` (None: its widest); portable when none is."""
    found = next((d for d in DESCRIPTIONS if d.name == name and d.lanes == (lanes or d.lanes)), PORTABLE)
    return found if fma or not found.vector else _without_fma(found)


def _without_fma(d: VectorIsa) -> VectorIsa:
    # the RNN headers are written with FMA intrinsics: without FMA the portable struct
    return dataclasses.replace(d, fma=False, rnn_header=PORTABLE.rnn_header)
