/* RNN vector math, AVX2 + FMA: the 16-lane logical vector (the packing unit of hidden blocks)
 * is two __m256 halves, so the packing is the AVX-512 one and the register-tile budget counts
 * two ymm registers per vector (smelt/codegen/kernels/rnn_vec.py). exp/sigmoid/tanh are
 * smelt_vec.h's smelt_v*256, the same bits as the AVX-512 header's smelt_v*512. min/max are
 * min_ps/max_ps (the second operand when either is NaN), so NaN behaves as on AVX-512.
 * Masks (VX_m) stay 16-bit integers, bit l = lane l, as in the other headers.
 * Names start with VX_, replaced by the including chunk's unique prefix
 * (smelt/codegen/kernels/rnn_vec.py). Needs the headers smelt_rt.h includes and smelt_vec.h. */
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
/* the math of one 8-lane half: smelt_vec.h's (the one implementation the fused epilogues use
 * too; its comments say the numerics) */
static inline VX_v VX_exp(VX_v x) { return VX_mk(smelt_vexp256(x.lo), smelt_vexp256(x.hi)); }
static inline VX_v VX_sigmoid(VX_v x) { return VX_mk(smelt_vsigmoid256(x.lo), smelt_vsigmoid256(x.hi)); }
static inline VX_v VX_tanh(VX_v x) { return VX_mk(smelt_vtanh256(x.lo), smelt_vtanh256(x.hi)); }
