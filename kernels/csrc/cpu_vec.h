/* What the CPU kernels (paged_decode_cpu.c, prefill_attention_cpu.c, fused_cpu.c) share in scalar code: dtype
 * codes, float32 <-> bfloat16 with PyTorch's rounding, and the exponential's core; cpu_simd.h has their
 * vector forms. */
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

/* Element i of a float32 or bfloat16 array as float32; `bf16` is a compile-time constant where inlined. */
static inline __attribute__((always_inline)) float load(const void *base, int64_t i, const int bf16) {
    return bf16 ? bf16_to_f32(((const uint16_t *)base)[i]) : ((const float *)base)[i];
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

#endif

#endif
