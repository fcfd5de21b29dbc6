/* smelt_vec.h: vector helpers of the ISA descriptions (smelt/codegen/kernels/isa.py) that are
 * more than one intrinsic. Embedded into every generated translation unit after smelt_rt.h
 * (codegen/toolchain.py source_with_runtime); static inline, so unused ones cost nothing. */
#ifndef SMELT_VEC_H
#define SMELT_VEC_H
#include <immintrin.h>

#if defined(__AVX__)
/* sum of the 8 lanes (pairwise: (l0+l4)+(l2+l6) ...) */
static inline float smelt_hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* max of the 8 lanes; NaN in any lane gives NaN (max_ps returns its second operand when either
 * is NaN, so each step also checks the first operand) */
static inline float smelt_hmax256(__m256 v) {
    const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    if (_mm256_movemask_ps(nan)) return __builtin_nanf("");
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}
#endif

#if defined(__AVX512F__)
static inline float smelt_hmax512(__m512 v) {
    if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) return __builtin_nanf("");
    return _mm512_reduce_max_ps(v);
}
#endif

/* vector expf: Cephes' degree-6 polynomial on x - n*ln2, scaled by 2^n; max relative error ~2 ulp.
 * NaN propagates (the clamp keeps it: the value is the second operand of max/min), e^+Inf = +Inf
 * and e^-Inf = 0 exactly, so Sigmoid(-Inf) = 0 and SiLU(-Inf) = NaN as in onnxruntime. AVX-512
 * clamps x to [-104, 89] and lets scalef overflow to Inf and underflow to 0; AVX2 builds 2^n in
 * the exponent bits, valid for x in [-87.3, 88.0], and blends in Inf above ln(FLT_MAX) and 0
 * below -87.3. */
#if defined(__AVX2__) && defined(__FMA__)
static inline __m256 smelt_vexp256(__m256 x0) {
    const __m256 x = _mm256_max_ps(_mm256_set1_ps(-87.3f), _mm256_min_ps(_mm256_set1_ps(88.0f), x0));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 q = _mm256_set1_ps(1.9875691500E-4f);
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.3981999507E-3f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(8.3334519073E-3f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(4.1665795894E-2f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.6666665459E-1f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(5.0000001201E-1f));
    __m256 y = _mm256_fmadd_ps(_mm256_mul_ps(q, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23)));
    /* 0 below the clamp (an unordered compare keeps NaN), Inf above ln(FLT_MAX) */
    y = _mm256_and_ps(y, _mm256_cmp_ps(x0, _mm256_set1_ps(-87.3f), _CMP_NLT_UQ));
    return _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x0, _mm256_set1_ps(88.7228394f), _CMP_GT_OQ));
}
#endif
#if defined(__AVX512F__)
static inline __m512 smelt_vexp512(__m512 x0) {
    const __m512 x = _mm512_max_ps(_mm512_set1_ps(-104.0f), _mm512_min_ps(_mm512_set1_ps(89.0f), x0));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 q = _mm512_set1_ps(1.9875691500E-4f);
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.3981999507E-3f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(8.3334519073E-3f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(4.1665795894E-2f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.6666665459E-1f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(5.0000001201E-1f));
    __m512 y = _mm512_fmadd_ps(_mm512_mul_ps(q, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);
}
#endif
#endif
