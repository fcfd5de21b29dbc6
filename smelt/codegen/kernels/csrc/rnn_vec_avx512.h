/* RNN vector math, AVX-512F: the 16-lane logical vector is one __m512.
 * Names start with VX_, replaced by the including chunk's unique prefix
 * (smelt/codegen/kernels/rnn_vec.py). Needs the headers smelt_rt.h includes. */
#if !defined(__AVX512F__)
#error "rnn_vec_avx512.h needs AVX-512F (-mavx512f)"
#endif
typedef __m512 VX_v;
typedef __mmask16 VX_m;
static inline VX_v VX_load(const float *p) { return _mm512_load_ps(p); }
static inline VX_v VX_loadu(const float *p) { return _mm512_loadu_ps(p); }
static inline void VX_store(float *p, VX_v v) { _mm512_store_ps(p, v); }
static inline void VX_storeu(float *p, VX_v v) { _mm512_storeu_ps(p, v); }
static inline void VX_mstoreu(float *p, VX_m m, VX_v v) { _mm512_mask_storeu_ps(p, m, v); }
static inline VX_v VX_set1(float x) { return _mm512_set1_ps(x); }
static inline VX_v VX_zero(void) { return _mm512_setzero_ps(); }
static inline VX_v VX_add(VX_v a, VX_v b) { return _mm512_add_ps(a, b); }
static inline VX_v VX_sub(VX_v a, VX_v b) { return _mm512_sub_ps(a, b); }
static inline VX_v VX_mul(VX_v a, VX_v b) { return _mm512_mul_ps(a, b); }
static inline VX_v VX_div(VX_v a, VX_v b) { return _mm512_div_ps(a, b); }
static inline VX_v VX_fma(VX_v a, VX_v b, VX_v c) { return _mm512_fmadd_ps(a, b, c); }
static inline VX_v VX_min(VX_v a, VX_v b) { return _mm512_min_ps(a, b); }
static inline VX_v VX_max(VX_v a, VX_v b) { return _mm512_max_ps(a, b); }
static inline VX_v VX_abs(VX_v a) { return _mm512_abs_ps(a); }
static inline VX_v VX_maskz(VX_m m, VX_v a) { return _mm512_maskz_mov_ps(m, a); }
static inline VX_v VX_select(VX_m m, VX_v a, VX_v b) { return _mm512_mask_blend_ps(m, b, a); }
static inline VX_m VX_ge(VX_v a, VX_v b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
static inline VX_m VX_gt(VX_v a, VX_v b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
/* exp(x): Cephes expf polynomial on x - n*ln2, |x - n*ln2| <= ln2/2; 2^n via scalef. */
static inline VX_v VX_exp(VX_v x) {
    x = _mm512_max_ps(_mm512_set1_ps(-87.33654f), _mm512_min_ps(_mm512_set1_ps(88.72283f), x)); /* x second: NaN kept */
    VX_v n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    VX_v r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    VX_v p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}
/* 1/d: rcp14 plus one Newton step (relative error ~2^-27, far cheaper than vdivps) */
static inline VX_v VX_recip(VX_v d) {
    VX_v r = _mm512_rcp14_ps(d);
    return _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(1.0f)), r);
}
static inline VX_v VX_sigmoid(VX_v x) {
    return VX_recip(_mm512_add_ps(_mm512_set1_ps(1.0f), VX_exp(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}
/* tanh: odd rational minimax approximation x*P(x^2)/Q(x^2) on x clamped to +-7.99881 (Eigen's
 * float tanh coefficients; tanh(7.99881) = 1 - 2.3e-7), 1/Q by rcp14 + Newton. Half the
 * operations of the exp form 1 - 2/(exp(2x)+1) with a polynomial near 0 (which evaluated both),
 * and relative accuracy near 0 by construction. */
static inline VX_v VX_tanh(VX_v x) {
    x = _mm512_max_ps(_mm512_set1_ps(-7.99881172180175781f), _mm512_min_ps(_mm512_set1_ps(7.99881172180175781f), x));
    VX_v z = _mm512_mul_ps(x, x);
    VX_v p = _mm512_set1_ps(-2.76076847742355e-16f);
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.00018790482477e-13f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-8.60467152213735e-11f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(5.12229709037114e-08f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.48572235717979e-05f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(6.37261928875436e-04f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(4.89352455891786e-03f));
    VX_v q = _mm512_set1_ps(1.19825839466702e-06f);
    q = _mm512_fmadd_ps(q, z, _mm512_set1_ps(1.18534705686654e-04f));
    q = _mm512_fmadd_ps(q, z, _mm512_set1_ps(2.26843463243900e-03f));
    q = _mm512_fmadd_ps(q, z, _mm512_set1_ps(4.89352518554385e-03f));
    return _mm512_mul_ps(_mm512_mul_ps(p, x), VX_recip(q));
}
