/* smelt_vec.h: vector helpers of the ISA descriptions (smelt/codegen/kernels/isa.py) that are
 * more than one intrinsic: horizontal sum/max, and THE vector math of smelt, one implementation
 * per vector width: exp, the reciprocal, sigmoid, tanh, erf and GELU on __m256 (AVX2 + FMA) and __m512
 * (AVX-512F). Every user calls these: the fused GEMM/conv epilogues (the ISA descriptions name
 * them: exp_fn, sigmoid_fn, tanh_fn, erf_fn, gelu_fn; codegen/kernels/epilogue.py renders the calls) and the RNN
 * headers (csrc/rnn_vec_avx2.h, rnn_vec_avx512.h: VX_exp/VX_sigmoid/VX_tanh). Portable C (no
 * vector ISA) uses libm expf/tanhf and needs nothing here.
 *
 * Embedded into every generated translation unit after smelt_rt.h (codegen/toolchain.py
 * source_with_runtime); an RNN chunk embeds it again (kernels/rnn_vec.py vmath_source) so that the
 * chunk stands alone too, hence the include guard. static inline, so unused ones cost nothing.
 *
 * The 256- and 512-bit math functions are the same operations in the same order, so they give
 * the same bits lane for lane (tests/kernels/test_activation_numerics.py checks it). */
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

/* the 8 x 8 float tile at src (rows ss floats apart) transposed into dst (rows ds floats apart):
 * the blocked <-> plain layout transform's body (templates/blocked.py); unaligned rows */
static inline void smelt_transpose8x8_ps(const float *src, long ss, float *dst, long ds) {
    __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + ss), r2 = _mm256_loadu_ps(src + 2 * ss),
           r3 = _mm256_loadu_ps(src + 3 * ss), r4 = _mm256_loadu_ps(src + 4 * ss), r5 = _mm256_loadu_ps(src + 5 * ss),
           r6 = _mm256_loadu_ps(src + 6 * ss), r7 = _mm256_loadu_ps(src + 7 * ss);
    const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
                 t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
                 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
                 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
                 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
                 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    _mm256_storeu_ps(dst, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_storeu_ps(dst + ds, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_storeu_ps(dst + 2 * ds, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_storeu_ps(dst + 3 * ds, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_storeu_ps(dst + 4 * ds, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_storeu_ps(dst + 5 * ds, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_storeu_ps(dst + 6 * ds, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_storeu_ps(dst + 7 * ds, _mm256_permute2f128_ps(u3, u7, 0x31));
}
#endif

#if defined(__AVX512F__)
/* the 16 x 16 float tile at src (rows ss floats apart) transposed into dst (rows ds floats
 * apart): unpacks within 128-bit lanes, then two rounds of 128-bit lane shuffles */
static inline void smelt_transpose16x16_ps(const float *src, long ss, float *dst, long ds) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * ss);
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {  /* 4 x 4 blocks inside each 128-bit lane */
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; ++i) {  /* 128-bit lanes: rows i, 4+i, 8+i, 12+i hold lane blocks */
        t[i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0x88);
        t[4 + i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0xDD);
        t[8 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0x88);
        t[12 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0xDD);
    }
    for (int i = 0; i < 4; ++i) {
        _mm512_storeu_ps(dst + i * ds, _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88));
        _mm512_storeu_ps(dst + (i + 4) * ds, _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0x88));
        _mm512_storeu_ps(dst + (i + 8) * ds, _mm512_shuffle_f32x4(t[i], t[8 + i], 0xDD));
        _mm512_storeu_ps(dst + (i + 12) * ds, _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0xDD));
    }
}
#endif

#if defined(__AVX512F__)
static inline float smelt_hmax512(__m512 v) {
    if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) return __builtin_nanf("");
    return _mm512_reduce_max_ps(v);
}
#endif

/* Shared numerics.
 * exp: x clamped to [-104, 89] with the value second (max_ps/min_ps return their second operand
 *   when either is NaN, so NaN is kept), n = round(x log2 e), r = x - n ln2 in two FMAs (Cody-Waite,
 *   |r| <= ln2/2), Cephes' degree-6 polynomial e^r ~ 1 + r + r^2 q(r), scaled by 2^n exactly:
 *   error <= 1.25 ulp (normal and denormal results). 2^n is applied in one correctly rounded step, so
 *   results above FLT_MAX round to +Inf (e^x for x > 88.72284, e^+Inf = +Inf), denormal results
 *   (x in [-103.97, -87.34]) are correctly rounded from the polynomial's value, and smaller ones
 *   round to 0 (e^-104 < 2^-150: e^-Inf = 0 exactly).
 * recip: 1/d as a correctly rounded division. rcp + one Newton step is 2 ulp off near 1 on AVX2,
 *   where 1 - sigmoid(x) (a GRU's 1 - z) turns 2 ulp of 1 into a 15% error of a 1e-6 hidden state
 *   (onnx's test_gru_bidirectional); and rcp14 + Newton gives NaN at d = +Inf (Inf * 0 in the
 *   step). The same division on every width: one vdivps per vector, its latency that of rcp14 +
 *   two FMAs.
 * sigmoid: recip(1 + exp(0 - x)): sigmoid(+Inf) = 1, sigmoid(-Inf) = 1/Inf = 0 exactly, NaN kept;
 *   error <= 3.2 ulp for x >= -88.7, 9e-8 absolute; for x < -88.7 e^-x is +Inf and the result 0
 *   where the exact one is a denormal e^x (an absolute error below 1.2e-38).
 * tanh: the odd rational x P(x^2) / Q(x^2) with Eigen's float coefficients on x clamped to
 *   +-7.99881 (value second: NaN kept; the rational rounds to exactly 1 there, so tanh(+-Inf) =
 *   +-1), evaluated as (P / Q) * x: P / Q is ~1 near 0, so tanh(-0) = -0, tiny and denormal x
 *   keep their full relative accuracy (P * x first, as before, underflowed for |x| < 2e-36:
 *   102 ulp, and 0 for the smallest denormals). Error <= 4.4 ulp everywhere, 2.6e-7 absolute.
 * erf: on a = |x| clamped to 3.925 (value second: NaN kept; erf rounds to exactly 1 from 3.84 on,
 *   so erf(+-Inf) = +-1), two fits made for smelt (weighted least squares in float64, coefficients
 *   rounded to float): below 0.921875 a + a P(a^2) (P ~ erf(a)/a - 1, degree 5 in a^2, 1.6e-8 relative;
 *   a * (1 + P) rounded 1 + P to 2^-23 and was 2.4 ulp off below 0.5: erf(+-0) = +-0,
 *   denormal x stay denormal, relative accuracy near 0), above it 1 - e^Q(a) (Q of degree 8 fit to
 *   log erfc, 8.5e-9 absolute; e^Q by the exp above), both evaluated and one selected per lane; the
 *   sign of x put back with an OR. The exact GELU x/2 (1 + erf(x/sqrt2)) of exported transformers
 *   calls it (the fused epilogue "Gelu").
 * GELU, x/2 (1 + erf(x/sqrt2)) (the fused epilogue "Gelu"): its erf on a = |x|/sqrt2 clamped to
 *   3.925 (value second: NaN kept) as 16 polynomials of degree 5 in u = a - (i/4 + 1/8) on the
 *   intervals [i/4, (i+1)/4), coefficients picked per lane by a table permute (least squares on
 *   Chebyshev nodes in float64, rounded to float from the top coefficient down with the lower ones
 *   refit; the last interval gives exactly 1 at the clamp, so GELU(x) = x and -0 for |x| >= 5.551):
 *   5.9e-8 absolute, ~3x cheaper than erf above (no exp, one polynomial). Its relative accuracy
 *   near a = 0 is not erf's (it is added to 1); GELU's error: <= 2 ulp for x >= 0, <= 1.5e-7
 *   absolute for x < 0 (where 1 + erf cancels, as in every erf-based GELU), tested by
 *   tests/kernels/test_encoder.py. AVX2 picks the 16 coefficients by two 8-lane permutes and a
 *   blend: the same values, the same bits as AVX-512.
 * Measured over a dense grid by tests/kernels/test_activation_numerics.py (which states the
 * bounds it holds them to): exp 1.25 ulp, sigmoid 3.13 ulp (x >= -88.7), tanh 4.31 ulp, erf 1.08 ulp. */

#if defined(__AVX2__) || defined(__AVX512F__)
/* GELU's erf polynomials (numerics above): coefficient k of interval i at [k][i] */
static const float smelt_gelu_erf_tab[6][16] __attribute__((aligned(64), unused)) = {
    {0.1403162032365799f, 0.4041168987751007f, 0.6232408881187439f, 0.7840750813484192f, 0.8883882164955139f, 0.9481700658798218f, 0.9784437417984009f, 0.9919900298118591f, 0.9973459839820862f, 0.9992170333862305f, 0.999794602394104f, 0.9999521374702454f, 0.9999901056289673f, 0.9999982118606567f, 0.9999997019767761f, 0.9999999403953552f},
    {1.1108852624893188f, 0.9803528189659119f, 0.7634995579719543f, 0.5247450470924377f, 0.31827396154403687f, 0.1703597754240036f, 0.08047225326299667f, 0.03354582563042641f, 0.012340819463133812f, 0.004006478004157543f, 0.001147875445894897f, 0.0002902284904848784f, 6.47587949060835e-05f, 1.2751783287967555e-05f, 2.2159335912874667e-06f, 5.275168390994622e-08f},
    {-0.13885755836963654f, -0.3676254451274872f, -0.4771815538406372f, -0.459150493144989f, -0.3580603301525116f, -0.23424771428108215f, -0.13076940178871155f, -0.06289899349212646f, -0.02622399851679802f, -0.009514959529042244f, -0.0030128636863082647f, -0.0008342493092641234f, -0.00020230839436408132f, -4.3016836571041495e-05f, -8.027215699257795e-06f, -4.266060386726167e-06f},
    {-0.35871827602386475f, -0.23487502336502075f, -0.05567479133605957f, 0.09291964769363403f, 0.16245028376579285f, 0.15793800354003906f, 0.11484193056821823f, 0.0674421414732933f, 0.033037807792425156f, 0.013730509206652641f, 0.004890281707048416f, 0.0015024231979623437f, 0.000399962707888335f, 9.256100020138547e-05f, 1.8666954929358326e-05f, 0.00018027931218966842f},
    {0.06817832589149475f, 0.16541381180286407f, 0.17549368739128113f, 0.11215278506278992f, 0.02833487279713154f, -0.029983025044202805f, -0.04938126727938652f, -0.04216305911540985f, -0.026402927935123444f, -0.013205945491790771f, -0.005466938484460115f, -0.0019085382809862494f, -0.0005682226037606597f, -0.00014534294314216822f, -3.2103664125315845e-05f, 0.003150289412587881f},
    {0.1035279929637909f, 0.045326150953769684f, -0.027035048231482506f, -0.06670918315649033f, -0.06106119602918625f, -0.030643915757536888f, -0.0023032519966363907f, 0.011328021995723248f, 0.012444212101399899f, 0.008360578678548336f, 0.004236414097249508f, 0.001727707334794104f, 0.0005842620157636702f, 0.0001665798044996336f, 4.045960304210894e-05f, 0.01365865208208561f},
};
#endif

#if defined(__AVX2__) && defined(__FMA__)
/* e^x, 8 lanes (numerics above). 2^n in two exponent-field factors 2^(n>>1) * 2^(n-(n>>1)): n
 * reaches 128 and -150, beyond one normal power of two; y * 2^(n>>1) is exact (a normal result),
 * so the second product rounds once, as AVX-512's scalef does. */
static inline __m256 smelt_vexp256(__m256 x0) {
    const __m256 x = _mm256_max_ps(_mm256_set1_ps(-104.0f), _mm256_min_ps(_mm256_set1_ps(89.0f), x0));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 q = _mm256_set1_ps(1.9875691500E-4f);
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.3981999507E-3f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(8.3334519073E-3f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(4.1665795894E-2f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.6666665459E-1f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(5.0000001201E-1f));
    const __m256 y = _mm256_fmadd_ps(_mm256_mul_ps(q, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i ni = _mm256_cvtps_epi32(n), bias = _mm256_set1_epi32(127);
    const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(y, s1), s2);
}
/* 1/d, 8 lanes, correctly rounded (numerics above) */
static inline __m256 smelt_vrecip256(__m256 d) {
    return _mm256_div_ps(_mm256_set1_ps(1.0f), d);
}
/* 1/(1 + e^-x), 8 lanes (numerics above) */
static inline __m256 smelt_vsigmoid256(__m256 x) {
    return smelt_vrecip256(_mm256_add_ps(_mm256_set1_ps(1.0f), smelt_vexp256(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}
/* tanh, 8 lanes: the rational (P(x^2) / Q(x^2)) x (numerics above) */
static inline __m256 smelt_vtanh256(__m256 x0) {
    const __m256 x = _mm256_max_ps(_mm256_set1_ps(-7.99881172180175781f), _mm256_min_ps(_mm256_set1_ps(7.99881172180175781f), x0));
    const __m256 z = _mm256_mul_ps(x, x);
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
    return _mm256_mul_ps(_mm256_div_ps(p, q), x);
}
/* erf, 8 lanes (numerics above) */
static inline __m256 smelt_verf256(__m256 x) {
    const __m256 sign = _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u)));
    const __m256 ax = _mm256_xor_ps(x, sign);
    const __m256 a = _mm256_min_ps(_mm256_set1_ps(3.925f), ax);
    const __m256 z = _mm256_mul_ps(a, a);
    __m256 p = _mm256_set1_ps(-5.99094899e-04f);
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(4.99320310e-03f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-2.67666373e-02f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.12818167e-01f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-3.76124948e-01f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.28379151e-01f));
    const __m256 small = _mm256_fmadd_ps(a, p, a);
    __m256 q = _mm256_set1_ps(1.63065886e-06f);
    q = _mm256_fmadd_ps(q, a, _mm256_set1_ps(-4.58937502e-05f));
    q = _mm256_fmadd_ps(q, a, _mm256_set1_ps(5.95112797e-04f));
    q = _mm256_fmadd_ps(q, a, _mm256_set1_ps(-4.75020334e-03f));
    q = _mm256_fmadd_ps(q, a, _mm256_set1_ps(2.63902508e-02f));
    q = _mm256_fmadd_ps(q, a, _mm256_set1_ps(-1.10018276e-01f));
    q = _mm256_fmadd_ps(q, a, _mm256_set1_ps(-6.31899655e-01f));
    q = _mm256_fmadd_ps(q, a, _mm256_set1_ps(-1.13018572e+00f));
    q = _mm256_fmadd_ps(q, a, _mm256_set1_ps(3.07212380e-04f));
    const __m256 big = _mm256_sub_ps(_mm256_set1_ps(1.0f), smelt_vexp256(q));
    const __m256 r = _mm256_blendv_ps(big, small, _mm256_cmp_ps(a, _mm256_set1_ps(0.921875f), _CMP_LT_OQ));
    return _mm256_or_ps(r, sign);
}
/* table[i] for 16-entry tables, 8 lanes: two permutes and a blend on bit 3 of i (``hi``: i << 28) */
static inline __m256 smelt_tab16_256(const float *table, __m256i i, __m256 hi) {
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(_mm256_load_ps(table), i),
                            _mm256_permutevar8x32_ps(_mm256_load_ps(table + 8), i), hi);
}
/* GELU x/2 (1 + erf(x/sqrt2)), 8 lanes (numerics above) */
static inline __m256 smelt_vgelu256(__m256 x) {
    const __m256 s = _mm256_mul_ps(x, _mm256_set1_ps(0.70710678118654752f));
    const __m256 sign = _mm256_and_ps(s, _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u)));
    const __m256 a = _mm256_min_ps(_mm256_set1_ps(3.925f), _mm256_xor_ps(s, sign));
    const __m256i i = _mm256_cvttps_epi32(_mm256_mul_ps(a, _mm256_set1_ps(4.0f)));
    const __m256 hi = _mm256_castsi256_ps(_mm256_slli_epi32(i, 28));
    const __m256 u = _mm256_sub_ps(_mm256_fnmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(0.25f), a), _mm256_set1_ps(0.125f));
    __m256 p = smelt_tab16_256(smelt_gelu_erf_tab[5], i, hi);
    p = _mm256_fmadd_ps(p, u, smelt_tab16_256(smelt_gelu_erf_tab[4], i, hi));
    p = _mm256_fmadd_ps(p, u, smelt_tab16_256(smelt_gelu_erf_tab[3], i, hi));
    p = _mm256_fmadd_ps(p, u, smelt_tab16_256(smelt_gelu_erf_tab[2], i, hi));
    p = _mm256_fmadd_ps(p, u, smelt_tab16_256(smelt_gelu_erf_tab[1], i, hi));
    p = _mm256_fmadd_ps(p, u, smelt_tab16_256(smelt_gelu_erf_tab[0], i, hi));
    const __m256 erf = _mm256_or_ps(p, sign);
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), _mm256_add_ps(_mm256_set1_ps(1.0f), erf));
}
#endif

#if defined(__AVX512F__)
/* e^x, 16 lanes (numerics above); 2^n by scalef (one rounding, overflow to Inf, gradual underflow) */
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
    const __m512 y = _mm512_fmadd_ps(_mm512_mul_ps(q, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);
}
/* 1/d, 16 lanes, correctly rounded (numerics above) */
static inline __m512 smelt_vrecip512(__m512 d) {
    return _mm512_div_ps(_mm512_set1_ps(1.0f), d);
}
/* 1/(1 + e^-x), 16 lanes (numerics above) */
static inline __m512 smelt_vsigmoid512(__m512 x) {
    return smelt_vrecip512(_mm512_add_ps(_mm512_set1_ps(1.0f), smelt_vexp512(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}
/* tanh, 16 lanes: the rational (P(x^2) / Q(x^2)) x (numerics above) */
static inline __m512 smelt_vtanh512(__m512 x0) {
    const __m512 x = _mm512_max_ps(_mm512_set1_ps(-7.99881172180175781f), _mm512_min_ps(_mm512_set1_ps(7.99881172180175781f), x0));
    const __m512 z = _mm512_mul_ps(x, x);
    __m512 p = _mm512_set1_ps(-2.76076847742355e-16f);
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.00018790482477e-13f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-8.60467152213735e-11f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(5.12229709037114e-08f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.48572235717979e-05f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(6.37261928875436e-04f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(4.89352455891786e-03f));
    __m512 q = _mm512_set1_ps(1.19825839466702e-06f);
    q = _mm512_fmadd_ps(q, z, _mm512_set1_ps(1.18534705686654e-04f));
    q = _mm512_fmadd_ps(q, z, _mm512_set1_ps(2.26843463243900e-03f));
    q = _mm512_fmadd_ps(q, z, _mm512_set1_ps(4.89352518554385e-03f));
    return _mm512_mul_ps(_mm512_div_ps(p, q), x);
}
/* erf, 16 lanes (numerics above) */
static inline __m512 smelt_verf512(__m512 x) {
    const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u));
    const __m512 ax = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), sign));
    const __m512 a = _mm512_min_ps(_mm512_set1_ps(3.925f), ax);
    const __m512 z = _mm512_mul_ps(a, a);
    __m512 p = _mm512_set1_ps(-5.99094899e-04f);
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(4.99320310e-03f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-2.67666373e-02f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.12818167e-01f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.76124948e-01f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.28379151e-01f));
    const __m512 small = _mm512_fmadd_ps(a, p, a);
    __m512 q = _mm512_set1_ps(1.63065886e-06f);
    q = _mm512_fmadd_ps(q, a, _mm512_set1_ps(-4.58937502e-05f));
    q = _mm512_fmadd_ps(q, a, _mm512_set1_ps(5.95112797e-04f));
    q = _mm512_fmadd_ps(q, a, _mm512_set1_ps(-4.75020334e-03f));
    q = _mm512_fmadd_ps(q, a, _mm512_set1_ps(2.63902508e-02f));
    q = _mm512_fmadd_ps(q, a, _mm512_set1_ps(-1.10018276e-01f));
    q = _mm512_fmadd_ps(q, a, _mm512_set1_ps(-6.31899655e-01f));
    q = _mm512_fmadd_ps(q, a, _mm512_set1_ps(-1.13018572e+00f));
    q = _mm512_fmadd_ps(q, a, _mm512_set1_ps(3.07212380e-04f));
    const __m512 big = _mm512_sub_ps(_mm512_set1_ps(1.0f), smelt_vexp512(q));
    const __m512 r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(0.921875f), _CMP_LT_OQ), big, small);
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r), sign));
}
/* GELU x/2 (1 + erf(x/sqrt2)), 16 lanes (numerics above) */
static inline __m512 smelt_vgelu512(__m512 x) {
    const __m512 s = _mm512_mul_ps(x, _mm512_set1_ps(0.70710678118654752f));
    const __m512i sign = _mm512_and_si512(_mm512_castps_si512(s), _mm512_set1_epi32((int)0x80000000u));
    const __m512 a = _mm512_min_ps(_mm512_set1_ps(3.925f), _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(s), sign)));
    const __m512i i = _mm512_cvttps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(4.0f)));
    const __m512 u = _mm512_sub_ps(_mm512_fnmadd_ps(_mm512_cvtepi32_ps(i), _mm512_set1_ps(0.25f), a), _mm512_set1_ps(0.125f));
    __m512 p = _mm512_permutexvar_ps(i, _mm512_load_ps(smelt_gelu_erf_tab[5]));
    p = _mm512_fmadd_ps(p, u, _mm512_permutexvar_ps(i, _mm512_load_ps(smelt_gelu_erf_tab[4])));
    p = _mm512_fmadd_ps(p, u, _mm512_permutexvar_ps(i, _mm512_load_ps(smelt_gelu_erf_tab[3])));
    p = _mm512_fmadd_ps(p, u, _mm512_permutexvar_ps(i, _mm512_load_ps(smelt_gelu_erf_tab[2])));
    p = _mm512_fmadd_ps(p, u, _mm512_permutexvar_ps(i, _mm512_load_ps(smelt_gelu_erf_tab[1])));
    p = _mm512_fmadd_ps(p, u, _mm512_permutexvar_ps(i, _mm512_load_ps(smelt_gelu_erf_tab[0])));
    const __m512 erf = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(p), sign));
    return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), x), _mm512_add_ps(_mm512_set1_ps(1.0f), erf));
}
#endif
#endif
