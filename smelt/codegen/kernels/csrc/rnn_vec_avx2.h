/* RNN vector math, AVX2 + FMA: the 16-lane logical vector (the packing unit of hidden blocks)
 * is two __m256 halves, so the packing is the AVX-512 one and the register-tile budget counts
 * two ymm registers per vector (smelt/codegen/kernels/rnn_vec.py). Same numerics as the
 * AVX-512 header: exp as Cephes' polynomial (2^n built in two exponent-field halves instead of
 * scalef), 1/x as a division (correctly rounded, as AVX-512's rcp14 + Newton is in effect), sigmoid =
 * 1/(1+exp(-x)), tanh the odd rational on x clamped to +-7.99881. min/max are min_ps/max_ps
 * (the second operand when either is NaN), so NaN behaves as on AVX-512.
 * Masks (VX_m) stay 16-bit integers, bit l = lane l, as in the other headers.
 * Names start with VX_, replaced by the including chunk's unique prefix
 * (smelt/codegen/kernels/rnn_vec.py). Needs the headers smelt_rt.h includes. */
#if !defined(__AVX2__) || !defined(__FMA__)
#error "rnn_vec_avx2.h needs AVX2 and FMA (-mavx2 -mfma)"
#endif
typedef struct { __m256 lo, hi; } VX_v;
typedef unsigned VX_m;
static inline VX_v VX_mk(__m256 lo, __m256 hi) { VX_v r; r.lo = lo; r.hi = hi; return r; }
/* 8 mask bits -> 8 lanes of all-ones / zeros */
static inline __m256i VX_lanes(unsigned m) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)m), bit), bit);
}
static inline VX_v VX_load(const float *p) { return VX_mk(_mm256_load_ps(p), _mm256_load_ps(p + 8)); }
static inline VX_v VX_loadu(const float *p) { return VX_mk(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)); }
static inline void VX_store(float *p, VX_v v) { _mm256_store_ps(p, v.lo); _mm256_store_ps(p + 8, v.hi); }
static inline void VX_storeu(float *p, VX_v v) { _mm256_storeu_ps(p, v.lo); _mm256_storeu_ps(p + 8, v.hi); }
static inline void VX_mstoreu(float *p, VX_m m, VX_v v) {
    _mm256_maskstore_ps(p, VX_lanes(m & 0xFFu), v.lo);
    _mm256_maskstore_ps(p + 8, VX_lanes(m >> 8 & 0xFFu), v.hi);
}
static inline VX_v VX_set1(float x) { __m256 b = _mm256_set1_ps(x); return VX_mk(b, b); }
static inline VX_v VX_zero(void) { return VX_mk(_mm256_setzero_ps(), _mm256_setzero_ps()); }
static inline VX_v VX_add(VX_v a, VX_v b) { return VX_mk(_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)); }
static inline VX_v VX_sub(VX_v a, VX_v b) { return VX_mk(_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)); }
static inline VX_v VX_mul(VX_v a, VX_v b) { return VX_mk(_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)); }
static inline VX_v VX_div(VX_v a, VX_v b) { return VX_mk(_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)); }
static inline VX_v VX_fma(VX_v a, VX_v b, VX_v c) {
    return VX_mk(_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi));
}
static inline VX_v VX_min(VX_v a, VX_v b) { return VX_mk(_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)); }
static inline VX_v VX_max(VX_v a, VX_v b) { return VX_mk(_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)); }
static inline VX_v VX_abs(VX_v a) {
    const __m256 s = _mm256_set1_ps(-0.0f);
    return VX_mk(_mm256_andnot_ps(s, a.lo), _mm256_andnot_ps(s, a.hi));
}
static inline VX_v VX_maskz(VX_m m, VX_v a) {
    return VX_mk(_mm256_and_ps(_mm256_castsi256_ps(VX_lanes(m & 0xFFu)), a.lo),
                 _mm256_and_ps(_mm256_castsi256_ps(VX_lanes(m >> 8 & 0xFFu)), a.hi));
}
static inline VX_v VX_select(VX_m m, VX_v a, VX_v b) {
    return VX_mk(_mm256_blendv_ps(b.lo, a.lo, _mm256_castsi256_ps(VX_lanes(m & 0xFFu))),
                 _mm256_blendv_ps(b.hi, a.hi, _mm256_castsi256_ps(VX_lanes(m >> 8 & 0xFFu))));
}
static inline VX_m VX_ge(VX_v a, VX_v b) {
    return (VX_m)_mm256_movemask_ps(_mm256_cmp_ps(a.lo, b.lo, _CMP_GE_OQ))
         | (VX_m)_mm256_movemask_ps(_mm256_cmp_ps(a.hi, b.hi, _CMP_GE_OQ)) << 8;
}
static inline VX_m VX_gt(VX_v a, VX_v b) {
    return (VX_m)_mm256_movemask_ps(_mm256_cmp_ps(a.lo, b.lo, _CMP_GT_OQ))
         | (VX_m)_mm256_movemask_ps(_mm256_cmp_ps(a.hi, b.hi, _CMP_GT_OQ)) << 8;
}
/* exp(x) of 8 lanes: Cephes expf polynomial on x - n*ln2, |x - n*ln2| <= ln2/2; 2^n as two
 * exponent-field factors 2^(n>>1) * 2^(n-(n>>1)), since n reaches 128 (x = 88.72283) and
 * -126, beyond one normal power of two. NaN propagates through p. */
static inline __m256 VX_exp8(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(-87.33654f), _mm256_min_ps(_mm256_set1_ps(88.72283f), x)); /* x second: NaN kept */
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}
/* 1/d of 8 lanes, correctly rounded: rcp (12 bits) plus one Newton step was 2 ulp off near 1,
 * where 1 - sigmoid(x) (a GRU's 1 - z) turns 2 ulp of 1 into a 15% error of a 1e-6 hidden state
 * (onnx's test_gru_bidirectional); AVX-512's rcp14 + Newton is exact there. vdivps costs one
 * instruction per gate vector, beside the step's GEMM. */
static inline __m256 VX_recip8(__m256 d) {
    return _mm256_div_ps(_mm256_set1_ps(1.0f), d);
}
static inline __m256 VX_sigmoid8(__m256 x) {
    return VX_recip8(_mm256_add_ps(_mm256_set1_ps(1.0f), VX_exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}
/* tanh: the AVX-512 header's odd rational x*P(x^2)/Q(x^2) (Eigen's float coefficients) */
static inline __m256 VX_tanh8(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(-7.99881172180175781f), _mm256_min_ps(_mm256_set1_ps(7.99881172180175781f), x));
    __m256 z = _mm256_mul_ps(x, x);
    __m256 p = _mm256_set1_ps(-2.76076847742355e-16f);
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.00018790482477e-13f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-8.60467152213735e-11f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(5.12229709037114e-08f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.48572235717979e-05f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(6.37261928875436e-04f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(4.89352455891786e-03f));
    __m256 q = _mm256_set1_ps(1.19825839466702e-06f);
    q = _mm256_fmadd_ps(q, z, _mm256_set1_ps(1.18534705686654e-04f));
    q = _mm256_fmadd_ps(q, z, _mm256_set1_ps(2.26843463243900e-03f));
    q = _mm256_fmadd_ps(q, z, _mm256_set1_ps(4.89352518554385e-03f));
    return _mm256_mul_ps(_mm256_mul_ps(p, x), VX_recip8(q));
}
static inline VX_v VX_exp(VX_v x) { return VX_mk(VX_exp8(x.lo), VX_exp8(x.hi)); }
static inline VX_v VX_sigmoid(VX_v x) { return VX_mk(VX_sigmoid8(x.lo), VX_sigmoid8(x.hi)); }
static inline VX_v VX_tanh(VX_v x) { return VX_mk(VX_tanh8(x.lo), VX_tanh8(x.hi)); }
