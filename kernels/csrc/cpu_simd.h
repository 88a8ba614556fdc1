/* The vector layer the CPU kernels are written in, for one x86 instruction set at a time, so that each kernel
 * is written once and built for both: define FOLIO_SIMD as 512 (AVX-512F, 16 lanes) or 256 (AVX2 with FMA,
 * 8 lanes) and include this; include it again with the other value to switch. It defines
 *
 *   VW               lanes per vector
 *   VFN              the attributes of a kernel function for this instruction set (static, inline, target)
 *   VENTRY           the same for a kernel's entry point (not forced inline)
 *   V(name)          `name` suffixed for this instruction set (_avx512, _avx2), for what is defined per set
 *   vf, vi, vmask    a vector of VW floats, of VW int32, a lane mask
 *
 * and the ops below, as macros that follow the current set. A kernel body written in them goes in a header
 * of its own that the kernel's .c includes once per set (after this one). After the last include,
 * FOLIO_SIMD_ANY says that some set was built (the caller dispatches with __builtin_cpu_supports). */
#if !defined(FOLIO_SIMD) || (FOLIO_SIMD != 512 && FOLIO_SIMD != 256)
#error "define FOLIO_SIMD as 512 or 256 before including cpu_simd.h"
#endif
#if !defined(FOLIO_X86)
#error "cpu_simd.h needs cpu_vec.h's FOLIO_X86 (GCC or clang on x86-64)"
#endif
#define FOLIO_SIMD_ANY 1

#undef VW
#undef VFN
#undef VENTRY
#undef V
#undef vf
#undef vi
#undef vmask
#undef vzero
#undef vset1
#undef vloadu
#undef vstoreu
#undef vadd
#undef vsub
#undef vmul
#undef vdiv
#undef vmax
#undef vmin
#undef vfmadd
#undef vfnmadd
#undef vround
#undef vcvt_i
#undef vas_i
#undef vas_f
#undef vi_set1
#undef vi_add
#undef vi_sub
#undef vi_and
#undef vi_or
#undef vi_slli
#undef vi_srli
#undef vi_srai
#undef vcmp_ge
#undef vcmp_gt
#undef vcmp_eq
#undef vcmp_unord
#undef vcmp_nlt_uq
#undef vselect
#undef vmask_bits
#undef vmask_none
#undef vmask_or

#if FOLIO_SIMD == 512
#define VW 16
#ifndef FOLIO_SIMD_512_TARGET /* a kernel file may add instructions (fused_cpu.c: AVX512-BF16) */
#define FOLIO_SIMD_512_TARGET "avx512f"
#endif
#define VFN __attribute__((target(FOLIO_SIMD_512_TARGET), always_inline)) static inline
#define VENTRY __attribute__((target(FOLIO_SIMD_512_TARGET))) static
#define V(name) name##_avx512
#define vf __m512
#define vi __m512i
#define vmask __mmask16
#define vzero() _mm512_setzero_ps()
#define vset1(x) _mm512_set1_ps(x)
#define vloadu(p) _mm512_loadu_ps(p)
#define vstoreu(p, x) _mm512_storeu_ps(p, x)
#define vadd _mm512_add_ps
#define vsub _mm512_sub_ps
#define vmul _mm512_mul_ps
#define vdiv _mm512_div_ps
#define vmax _mm512_max_ps
#define vmin _mm512_min_ps
#define vfmadd _mm512_fmadd_ps   /* a * b + c */
#define vfnmadd _mm512_fnmadd_ps /* c - a * b */
#define vround(x) _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define vcvt_i _mm512_cvtps_epi32
#define vas_i _mm512_castps_si512
#define vas_f _mm512_castsi512_ps
#define vi_set1 _mm512_set1_epi32
#define vi_add _mm512_add_epi32
#define vi_sub _mm512_sub_epi32
#define vi_and _mm512_and_si512
#define vi_or _mm512_or_si512
#define vi_slli _mm512_slli_epi32
#define vi_srli _mm512_srli_epi32
#define vi_srai _mm512_srai_epi32
#define vcmp_ge(a, b) _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ)
#define vcmp_gt(a, b) _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ)
#define vcmp_eq(a, b) _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ)
#define vcmp_unord(a, b) _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q)
#define vcmp_nlt_uq(a, b) _mm512_cmp_ps_mask(a, b, _CMP_NLT_UQ) /* a >= b, or either NaN */
#define vselect(m, a, b) _mm512_mask_blend_ps(m, b, a)      /* a where m, else b */
#define vmask_bits(m) ((unsigned)(m))                        /* bit l: lane l */
#define vmask_none() ((__mmask16)0)
#define vmask_or(a, b) ((__mmask16)((a) | (b)))
#else
#define VW 8
#define VFN __attribute__((target("avx2,fma"), always_inline)) static inline
#define VENTRY __attribute__((target("avx2,fma"))) static
#define V(name) name##_avx2
#define vf __m256
#define vi __m256i
#define vmask __m256 /* all ones in a selected lane */
#define vzero() _mm256_setzero_ps()
#define vset1(x) _mm256_set1_ps(x)
#define vloadu(p) _mm256_loadu_ps(p)
#define vstoreu(p, x) _mm256_storeu_ps(p, x)
#define vadd _mm256_add_ps
#define vsub _mm256_sub_ps
#define vmul _mm256_mul_ps
#define vdiv _mm256_div_ps
#define vmax _mm256_max_ps
#define vmin _mm256_min_ps
#define vfmadd _mm256_fmadd_ps
#define vfnmadd _mm256_fnmadd_ps
#define vround(x) _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define vcvt_i _mm256_cvtps_epi32
#define vas_i _mm256_castps_si256
#define vas_f _mm256_castsi256_ps
#define vi_set1 _mm256_set1_epi32
#define vi_add _mm256_add_epi32
#define vi_sub _mm256_sub_epi32
#define vi_and _mm256_and_si256
#define vi_or _mm256_or_si256
#define vi_slli _mm256_slli_epi32
#define vi_srli _mm256_srli_epi32
#define vi_srai _mm256_srai_epi32
#define vcmp_ge(a, b) _mm256_cmp_ps(a, b, _CMP_GE_OQ)
#define vcmp_gt(a, b) _mm256_cmp_ps(a, b, _CMP_GT_OQ)
#define vcmp_eq(a, b) _mm256_cmp_ps(a, b, _CMP_EQ_OQ)
#define vcmp_unord(a, b) _mm256_cmp_ps(a, b, _CMP_UNORD_Q)
#define vcmp_nlt_uq(a, b) _mm256_cmp_ps(a, b, _CMP_NLT_UQ)
#define vselect(m, a, b) _mm256_blendv_ps(b, a, m)
#define vmask_bits(m) ((unsigned)_mm256_movemask_ps(m))
#define vmask_none() _mm256_setzero_ps()
#define vmask_or(a, b) _mm256_or_ps(a, b)
#endif

/* Everything below is written in the ops above; defined once per instruction set. */
#if (FOLIO_SIMD == 512 && !defined(FOLIO_SIMD_DEFINED_512)) || (FOLIO_SIMD == 256 && !defined(FOLIO_SIMD_DEFINED_256))
#if FOLIO_SIMD == 512
#define FOLIO_SIMD_DEFINED_512 1

VFN float V(vreduce_add)(vf x) { return _mm512_reduce_add_ps(x); }
VFN float V(vreduce_max)(vf x) { return _mm512_reduce_max_ps(x); }
/* Lanes 0 .. n-1 of p (0 <= n < VW); the others 0 (nothing past them is read), or `fill`. */
VFN vf V(vload_first)(const float *p, int64_t n) { return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p); }
VFN vf V(vload_first_or)(const float *p, int64_t n, vf fill) {
    return _mm512_mask_loadu_ps(fill, (__mmask16)((1u << n) - 1), p);
}
VFN void V(vstore_first)(float *p, int64_t n, vf x) { _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), x); }
VFN vf V(vkeep_first)(vf x, int64_t n) { return _mm512_maskz_mov_ps((__mmask16)((1u << n) - 1), x); }

/* VW bfloat16 values at p, widened exactly (their bits are a float32's top half). */
VFN vf V(vload_bf16)(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
/* The low 16 bits of each lane (values that fit) stored as VW uint16. */
VFN void V(vstore_u16)(uint16_t *p, vi bits) { _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(bits)); }
#else
#define FOLIO_SIMD_DEFINED_256 1

VFN float V(vreduce_add)(vf x) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
VFN float V(vreduce_max)(vf x) {
    const __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    const __m128 t = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(t, _mm_movehdup_ps(t)));
}
VFN __m256i V(first_lanes)(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
VFN vf V(vload_first)(const float *p, int64_t n) { return _mm256_maskload_ps(p, V(first_lanes)(n)); }
VFN vf V(vload_first_or)(const float *p, int64_t n, vf fill) {
    const __m256i m = V(first_lanes)(n);
    return _mm256_blendv_ps(fill, _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
}
VFN void V(vstore_first)(float *p, int64_t n, vf x) { _mm256_maskstore_ps(p, V(first_lanes)(n), x); }
VFN vf V(vkeep_first)(vf x, int64_t n) { return _mm256_and_ps(x, _mm256_castsi256_ps(V(first_lanes)(n))); }

VFN vf V(vload_bf16)(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
VFN void V(vstore_u16)(uint16_t *p, vi bits) { /* lanes hold 0 .. 0xffff, so the saturating pack is exact */
    _mm_storeu_si128((__m128i *)p, _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1)));
}
#endif

/* cpu_vec.h's exp_mantissa for VW lanes, with multiply-adds. */
VFN vf V(vexp_mantissa)(vf x, vf *n) {
    *n = vround(vmul(x, vset1(1.44269504088896341f)));
    vf r = vfnmadd(*n, vset1(0.693359375f), x);
    r = vfmadd(*n, vset1(2.12194440e-4f), r);
    vf y = vset1(1.9875691500e-4f);
    y = vfmadd(y, r, vset1(1.3981999507e-3f));
    y = vfmadd(y, r, vset1(8.3334519073e-3f));
    y = vfmadd(y, r, vset1(4.1665795894e-2f));
    y = vfmadd(y, r, vset1(1.6666665459e-1f));
    y = vfmadd(y, r, vset1(5.0000001201e-1f));
    return vfmadd(y, vmul(r, r), vadd(r, vset1(1.0f)));
}

/* 2^e per lane for integer exponents in [-126, 127]. */
VFN vf V(vpow2i)(vi e) { return vas_f(vi_slli(vi_add(e, vi_set1(127)), 23)); }

/* exp(x) for x <= 0 (softmax arguments once the max is subtracted): below -87, 0. */
VFN vf V(vexp_nonpositive)(vf x) {
    const vf floor = vset1(-87.0f);
    const vmask keep = vcmp_ge(x, floor);
    vf n;
    const vf y = V(vexp_mantissa)(vmax(x, floor), &n);
    return vselect(keep, vmul(y, V(vpow2i)(vcvt_i(n))), vzero());
}

/* exp(s[l] - max(s)) in place over s[0 .. len-1]; returns 1 / their sum (the softmax's normalizer, for the
 * caller to apply once to its weighted sum) and sets *max to max(s) (a split context's parts merge by it). */
VFN float V(vsoftmax_row_max)(float *s, int64_t len, float *max) {
    vf m = vset1(-INFINITY);
    int64_t l = 0;
    for (; l + VW <= len; l += VW) m = vmax(m, vloadu(s + l));
    if (l < len) m = vmax(m, V(vload_first_or)(s + l, len - l, m));
    *max = V(vreduce_max)(m);
    const vf mx = vset1(*max);
    vf sum = vzero();
    for (l = 0; l + VW <= len; l += VW) {
        const vf e = V(vexp_nonpositive)(vsub(vloadu(s + l), mx));
        vstoreu(s + l, e);
        sum = vadd(sum, e);
    }
    if (l < len) {
        const vf e = V(vkeep_first)(V(vexp_nonpositive)(vsub(V(vload_first)(s + l, len - l), mx)), len - l);
        V(vstore_first)(s + l, len - l, e);
        sum = vadd(sum, e);
    }
    return 1.0f / V(vreduce_add)(sum);
}

/* vsoftmax_row_max without the maximum. */
VFN float V(vsoftmax_row)(float *s, int64_t len) {
    float max;
    return V(vsoftmax_row_max)(s, len, &max);
}

/* VW values as float32 from a float32 or bfloat16 array; `bf16` is a compile-time constant where inlined. */
VFN vf V(vload)(const void *base, int64_t i, const int bf16) {
    return bf16 ? V(vload_bf16)((const uint16_t *)base + i) : vloadu((const float *)base + i);
}

/* The bfloat16 bits (in each lane's low half) of VW float32 values, rounded as f32_to_bf16 rounds. */
VFN vi V(vbf16_bits)(vf x) {
    const vi bits = vas_i(x), magnitude = vi_and(bits, vi_set1(0x7fffffff));
    const vi lsb = vi_and(vi_srli(bits, 16), vi_set1(1));
    const vi rounded = vi_srli(vi_add(bits, vi_add(lsb, vi_set1(0x7fff))), 16);
    const vi quiet = vi_or(vi_srli(bits, 16), vi_set1(0x40)); /* NaN stays a quiet NaN */
#if FOLIO_SIMD == 512
    return _mm512_mask_blend_epi32(_mm512_cmpgt_epu32_mask(magnitude, vi_set1(0x7f800000)), rounded, quiet);
#else
    return _mm256_blendv_epi8(rounded, quiet, _mm256_cmpgt_epi32(magnitude, vi_set1(0x7f800000)));
#endif
}

/* VW results stored as float32, or rounded to bfloat16. */
VFN void V(vstore)(void *base, int64_t i, vf x, const int bf16) {
    if (bf16) V(vstore_u16)((uint16_t *)base + i, V(vbf16_bits)(x));
    else vstoreu((float *)base + i, x);
}
#endif

/* the set's own functions, under names that follow the current set */
#define vreduce_add V(vreduce_add)
#define vreduce_max V(vreduce_max)
#define vload_first V(vload_first)
#define vload_first_or V(vload_first_or)
#define vstore_first V(vstore_first)
#define vkeep_first V(vkeep_first)
#define vexp_mantissa V(vexp_mantissa)
#define vpow2i V(vpow2i)
#define vexp_nonpositive V(vexp_nonpositive)
#define vsoftmax_row V(vsoftmax_row)
#define vsoftmax_row_max V(vsoftmax_row_max)
#define vload V(vload)
#define vbf16_bits V(vbf16_bits)
#define vstore_u16 V(vstore_u16)
#define vstore V(vstore)
