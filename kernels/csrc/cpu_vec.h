/* What the CPU kernels (paged_decode_cpu.c, prefill_attention_cpu.c, fused_cpu.c) share: dtype codes, float32 <-> bfloat16 with
 * PyTorch's rounding, and 16-lane AVX-512 loads and stores of either dtype. */
#ifndef FOLIO_CPU_VEC_H
#define FOLIO_CPU_VEC_H

#include <math.h>
#include <stdint.h>
#include <string.h>

enum { DTYPE_F32 = 0, DTYPE_BF16 = 1 };

/* Multi-versioned so that one build uses AVX-512 or AVX2 where the machine has them. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HOT __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define HOT
#endif

static inline float bf16_to_f32(uint16_t x) {
    uint32_t bits = (uint32_t)x << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, as torch does; NaN stays a quiet NaN */
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* Cephes' expf without its final scaling: exp(x) = 2^n * the result, with n = rint(x / ln 2) stored in *n and
 * r = x - n ln2 (ln2 split in two for exactness) fed to a degree-7 polynomial; about 1 ulp. The callers
 * clamp x and apply 2^n for their own ranges. */
static inline float exp_mantissa(float x, float *n) {
    *n = rintf(x * 1.44269504088896341f);
    const float r = x - *n * 0.693359375f + *n * 2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    return y * r * r + r + 1.0f;
}

/* 2^e for an integer exponent e in [-126, 127], as a float. */
static inline float pow2i(int32_t e) {
    const int32_t bits = (e + 127) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define FOLIO_X86 1

/* exp_mantissa for 16 lanes, with multiply-adds. */
__attribute__((target("avx512f"), always_inline)) static inline __m512 exp_mantissa16(__m512 x, __m512 *n) {
    *n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(*n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fmadd_ps(*n, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    return _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
}

/* 2^e per lane for integer exponents in [-126, 127]. */
__attribute__((target("avx512f"), always_inline)) static inline __m512 pow2i16(__m512i e) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(127)), 23));
}

/* exp(x) for x <= 0 in 16 lanes (softmax arguments once the max is subtracted): below -87, 0. */
__attribute__((target("avx512f"), always_inline)) static inline __m512 exp_nonpositive16(__m512 x) {
    const __m512 zero_below = _mm512_set1_ps(-87.0f);
    __mmask16 keep = _mm512_cmp_ps_mask(x, zero_below, _CMP_GE_OQ);
    __m512 n;
    const __m512 y = exp_mantissa16(_mm512_max_ps(x, zero_below), &n);
    return _mm512_maskz_mul_ps(keep, y, pow2i16(_mm512_cvtps_epi32(n)));
}

/* exp(s[l] - max(s)) in place over s[0 .. len-1]; returns 1 / their sum (the softmax's normalizer, for the
 * caller to apply once to its weighted sum). */
__attribute__((target("avx512f"), always_inline)) static inline float softmax_row16(float *s, int64_t len) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    int64_t l = 0;
    for (; l + 16 <= len; l += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(s + l));
    if (l < len) m = _mm512_max_ps(m, _mm512_mask_loadu_ps(m, (__mmask16)((1u << (len - l)) - 1), s + l));
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(m));
    __m512 sum = _mm512_setzero_ps();
    for (l = 0; l + 16 <= len; l += 16) {
        const __m512 e = exp_nonpositive16(_mm512_sub_ps(_mm512_loadu_ps(s + l), mx));
        _mm512_storeu_ps(s + l, e);
        sum = _mm512_add_ps(sum, e);
    }
    if (l < len) {
        const __mmask16 tail = (__mmask16)((1u << (len - l)) - 1);
        const __m512 e = _mm512_maskz_mov_ps(tail, exp_nonpositive16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + l), mx)));
        _mm512_mask_storeu_ps(s + l, tail, e);
        sum = _mm512_add_ps(sum, e);
    }
    return 1.0f / _mm512_reduce_add_ps(sum);
}

/* 16 values as float32: float32 loaded as is, bfloat16 widened exactly (its bits are a float32's top half).
 * `bf16` is a compile-time constant wherever this is inlined. */
__attribute__((target("avx512f"), always_inline)) static inline __m512 load16(const void *base, int64_t i,
                                                                              const int bf16) {
    if (!bf16) return _mm512_loadu_ps((const float *)base + i);
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

/* The bfloat16 bits (in each lane's low half) of 16 float32 values, rounded as f32_to_bf16 rounds. */
__attribute__((target("avx512f"), always_inline)) static inline __m512i bf16_bits16(__m512 x) {
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
}

/* 16 results stored as float32, or rounded to bfloat16. */
__attribute__((target("avx512f"), always_inline)) static inline void store16(void *base, int64_t i, __m512 x,
                                                                             const int bf16) {
    if (!bf16) _mm512_storeu_ps((float *)base + i, x);
    else _mm256_storeu_si256((__m256i *)((uint16_t *)base + i), _mm512_cvtepi32_epi16(bf16_bits16(x)));
}

#endif

#endif
