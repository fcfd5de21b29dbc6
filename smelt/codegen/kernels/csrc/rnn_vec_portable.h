/* RNN vector math, portable: the 16-lane logical vector is a struct of 16 floats, libm
 * for exp/sigmoid/tanh (no vector ISA; non-x86 hosts and the forced "scalar" target).
 * Names start with VX_, replaced by the including chunk's unique prefix
 * (smelt/codegen/kernels/rnn_vec.py). Needs the headers smelt_rt.h includes. */
typedef struct { float f[16]; } VX_v;
typedef unsigned VX_m;
#define VX_MAP1(expr) VX_v r; for (int l = 0; l < 16; ++l) { float x = a.f[l]; r.f[l] = (expr); } return r
#define VX_MAP2(expr) VX_v r; for (int l = 0; l < 16; ++l) { float x = a.f[l], y = b.f[l]; r.f[l] = (expr); } return r
static inline VX_v VX_load(const float *p) { VX_v r; memcpy(r.f, p, sizeof r.f); return r; }
static inline VX_v VX_loadu(const float *p) { VX_v r; memcpy(r.f, p, sizeof r.f); return r; }
static inline void VX_store(float *p, VX_v v) { memcpy(p, v.f, sizeof v.f); }
static inline void VX_storeu(float *p, VX_v v) { memcpy(p, v.f, sizeof v.f); }
static inline void VX_mstoreu(float *p, VX_m m, VX_v v) { for (int l = 0; l < 16; ++l) if (m >> l & 1u) p[l] = v.f[l]; }
static inline VX_v VX_set1(float x) { VX_v r; for (int l = 0; l < 16; ++l) r.f[l] = x; return r; }
static inline VX_v VX_zero(void) { return VX_set1(0.0f); }
static inline VX_v VX_add(VX_v a, VX_v b) { VX_MAP2(x + y); }
static inline VX_v VX_sub(VX_v a, VX_v b) { VX_MAP2(x - y); }
static inline VX_v VX_mul(VX_v a, VX_v b) { VX_MAP2(x * y); }
static inline VX_v VX_div(VX_v a, VX_v b) { VX_MAP2(x / y); }
static inline VX_v VX_fma(VX_v a, VX_v b, VX_v c) { VX_v r; for (int l = 0; l < 16; ++l) r.f[l] = fmaf(a.f[l], b.f[l], c.f[l]); return r; }
static inline VX_v VX_min(VX_v a, VX_v b) { VX_MAP2(x < y ? x : y); }
static inline VX_v VX_max(VX_v a, VX_v b) { VX_MAP2(x > y ? x : y); }
static inline VX_v VX_abs(VX_v a) { VX_MAP1(fabsf(x)); }
static inline VX_v VX_maskz(VX_m m, VX_v a) { VX_v r; for (int l = 0; l < 16; ++l) r.f[l] = (m >> l & 1u) ? a.f[l] : 0.0f; return r; }
static inline VX_v VX_select(VX_m m, VX_v a, VX_v b) { VX_v r; for (int l = 0; l < 16; ++l) r.f[l] = (m >> l & 1u) ? a.f[l] : b.f[l]; return r; }
static inline VX_m VX_ge(VX_v a, VX_v b) { VX_m m = 0; for (int l = 0; l < 16; ++l) m |= (VX_m)(a.f[l] >= b.f[l]) << l; return m; }
static inline VX_m VX_gt(VX_v a, VX_v b) { VX_m m = 0; for (int l = 0; l < 16; ++l) m |= (VX_m)(a.f[l] > b.f[l]) << l; return m; }
static inline VX_v VX_exp(VX_v a) { VX_MAP1(expf(x)); }
static inline VX_v VX_sigmoid(VX_v a) { VX_MAP1(1.0f / (1.0f + expf(-x))); }
static inline VX_v VX_tanh(VX_v a) { VX_MAP1(tanhf(x)); }
