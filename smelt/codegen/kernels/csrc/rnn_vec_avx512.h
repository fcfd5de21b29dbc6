/* RNN vector math, AVX-512F: the 16-lane logical vector is one __m512.
 * Names start with VX_, replaced by the including chunk's unique prefix
 * (smelt/codegen/kernels/rnn_vec.py). Needs the headers smelt_rt.h includes and smelt_vec.h. */
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
/* the math: smelt_vec.h's (the one implementation the fused epilogues use too; its comments say
 * the numerics) */
static inline VX_v VX_exp(VX_v x) { return smelt_vexp512(x); }
static inline VX_v VX_sigmoid(VX_v x) { return smelt_vsigmoid512(x); }
static inline VX_v VX_tanh(VX_v x) { return smelt_vtanh512(x); }
