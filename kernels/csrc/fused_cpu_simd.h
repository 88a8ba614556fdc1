/* The vector ops of fused_cpu.c, written once in cpu_simd.h's ops and included once per instruction set: a
 * row's whole vectors here, its last width % VW values through the scalar helpers of fused_cpu.c. Defines
 * V(kernels_f32) and V(kernels_bf16). */

#if FOLIO_SIMD == 512
/* vcvtneps2bf16 rounds to nearest even as f32_to_bf16 does, NaN included, but flushes subnormals to zero:
 * the rare vector that holds one takes the integer rounding instead. */
VFN __m256i V(pack)(__m512 x) {
    const __m512i magnitude = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff));
    const __mmask16 subnormal = /* 0 < |x| < 2^-126, as unsigned integers: |x| - 1 < 0x7fffff */
        _mm512_cmplt_epu32_mask(_mm512_sub_epi32(magnitude, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fffff));
    if (__builtin_expect(subnormal != 0, 0)) return _mm512_cvtepi32_epi16(vbf16_bits(x));
    return (__m256i)_mm512_cvtneps_pbh(x);
}

/* vstore with the fast rounding; and x as the tensor dtype would hold it (PyTorch rounds the result of every
 * bfloat16 op). */
VFN void V(put)(void *base, int64_t i, vf x, const int bf16) {
    if (bf16) _mm256_storeu_si256((__m256i *)((uint16_t *)base + i), V(pack)(x));
    else vstoreu((float *)base + i, x);
}

VFN vf V(rnd)(vf x, const int bf16) {
    return bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(V(pack)(x)), 16)) : x;
}
#else
VFN void V(put)(void *base, int64_t i, vf x, const int bf16) { vstore(base, i, x, bf16); }

VFN vf V(rnd)(vf x, const int bf16) { return bf16 ? vas_f(vi_slli(vbf16_bits(x), 16)) : x; }
#endif

/* exp_full for VW lanes. */
VFN vf V(exp_full)(vf x) {
    vf n;
    const vf y = vexp_mantissa(vmin(vmax(x, vset1(-103.0f)), vset1(89.0f)), &n);
    const vi ni = vcvt_i(n);
    const vi half = vi_srai(vi_add(ni, vi_srli(ni, 31)), 1); /* n / 2 as C rounds it */
    const vf e = vmul(vmul(y, vpow2i(half)), vpow2i(vi_sub(ni, half)));
    const vf big = vselect(vcmp_gt(x, vset1(88.72283935546875f)), vset1(INFINITY), e);
    return vselect(vcmp_nlt_uq(x, vset1(-103.0f)), big, vzero()); /* NaN stays */
}

VFN void V(norm_rows)(const Norm *n, const int bf16) {
    const int64_t hidden = n->hidden, full = hidden / VW * VW;
    for (int64_t row = 0; row < n->rows; ++row) {
        const int64_t xi = row * n->x_stride, oi = row * hidden;
        const void *src = n->x;
        int64_t si = xi;
        if (n->residual) {
            const int64_t ri = row * n->residual_stride;
            int64_t d = 0;
            for (; d < full; d += VW)
                V(put)(n->residual_out, oi + d, vadd(vload(n->x, xi + d, bf16), vload(n->residual, ri + d, bf16)), bf16);
            for (; d < hidden; ++d)
                store(n->residual_out, oi + d, load(n->x, xi + d, bf16) + load(n->residual, ri + d, bf16), bf16);
            src = n->residual_out;
            si = oi;
        }
        vf acc = vzero();
        int64_t d = 0;
        for (; d < full; d += VW) {
            const vf v = vload(src, si + d, bf16);
            acc = vadd(acc, vmul(v, v));
        }
        float sum = vreduce_add(acc);
        for (; d < hidden; ++d) sum += load(src, si + d, bf16) * load(src, si + d, bf16);
        const float rs = 1.0f / sqrtf(sum / (float)hidden + n->eps);
        const vf r = vset1(rs);
        for (d = 0; d < full; d += VW)
            V(put)(n->out, oi + d, vmul(V(rnd)(vmul(vload(src, si + d, bf16), r), bf16), vload(n->weight, d, bf16)), bf16);
        for (; d < hidden; ++d)
            store(n->out, oi + d, round_to(load(src, si + d, bf16) * rs, bf16) * load(n->weight, d, bf16), bf16);
    }
}

VFN void V(silu_mul_rows)(const void *gate_up, int64_t stride, void *out, int64_t rows, int64_t width, const int bf16) {
    const int64_t full = width / VW * VW;
    const vf one = vset1(1.0f);
    for (int64_t row = 0; row < rows; ++row) {
        const int64_t g = row * stride, o = row * width;
        int64_t j = 0;
        for (; j < full; j += VW) {
            const vf x = vload(gate_up, g + j, bf16);
            const vf silu = V(rnd)(vdiv(x, vadd(one, V(exp_full)(vsub(vzero(), x)))), bf16);
            V(put)(out, o + j, vmul(silu, vload(gate_up, g + width + j, bf16)), bf16);
        }
        for (; j < width; ++j) {
            const float x = load(gate_up, g + j, bf16);
            store(out, o + j, round_to(x / (1.0f + exp_full(-x)), bf16) * load(gate_up, g + width + j, bf16), bf16);
        }
    }
}

VFN void V(rotate_rows)(const Rotary *p, const int bf16) {
    const int64_t half = p->half, full = half / VW * VW;
    for (int64_t t = 0; t < p->tokens; ++t) {
        const int64_t c = t * p->cs_stride;
        for (int64_t h = 0; h < p->heads; ++h) {
            const int64_t base = t * p->token_stride + h * p->head_stride;
            int64_t j = 0;
            for (; j < full; j += VW) {
                const vf x1 = vload(p->x, base + j, bf16), x2 = vload(p->x, base + half + j, bf16);
                const vf cs = vload(p->cos, c + j, bf16), sn = vload(p->sin, c + j, bf16);
                V(put)(p->x, base + j, vsub(V(rnd)(vmul(x1, cs), bf16), V(rnd)(vmul(x2, sn), bf16)), bf16);
                V(put)(p->x, base + half + j, vadd(V(rnd)(vmul(x2, cs), bf16), V(rnd)(vmul(x1, sn), bf16)), bf16);
            }
            for (; j < half; ++j) {
                const float x1 = load(p->x, base + j, bf16), x2 = load(p->x, base + half + j, bf16);
                const float cs = load(p->cos, c + j, bf16), sn = load(p->sin, c + j, bf16);
                store(p->x, base + j, round_to(x1 * cs, bf16) - round_to(x2 * sn, bf16), bf16);
                store(p->x, base + half + j, round_to(x2 * cs, bf16) + round_to(x1 * sn, bf16), bf16);
            }
        }
    }
}

/* The index of each row's first maximum, as torch's max(dim=-1) gives it: a NaN counts as the maximum (the
 * first NaN wins). One pass finds the maximum (and whether there is a NaN), a second finds where it first
 * is; a row of logits fits in L2, so the second pass reads no DRAM. bfloat16 compares exactly as float32. */
VFN void V(argmax_rows)(const void *x, int64_t stride, int64_t *out, int64_t rows, int64_t cols, const int bf16) {
    const int64_t full = cols / VW * VW;
    for (int64_t row = 0; row < rows; ++row) {
        const int64_t base = row * stride;
        vf m = vset1(-INFINITY);
        vmask nan = vmask_none();
        int64_t j = 0;
        for (; j < full; j += VW) {
            const vf v = vload(x, base + j, bf16);
            nan = vmask_or(nan, vcmp_unord(v, v));
            m = vmax(m, v);
        }
        float best = vreduce_max(m);
        int has_nan = vmask_bits(nan) != 0;
        for (; j < cols; ++j) {
            const float v = load(x, base + j, bf16);
            has_nan |= v != v;
            best = v > best ? v : best;
        }
        const vf target = vset1(best);
        int64_t at = -1;
        for (j = 0; j < full && at < 0; j += VW) {
            const vf v = vload(x, base + j, bf16);
            const unsigned hit = vmask_bits(has_nan ? vcmp_unord(v, v) : vcmp_eq(v, target));
            if (hit) at = j + __builtin_ctz(hit);
        }
        for (j = full; j < cols && at < 0; ++j) {
            const float v = load(x, base + j, bf16);
            if (has_nan ? v != v : v == best) at = j;
        }
        out[row] = at;
    }
}

/* The columns j of each row r whose value can still reach the row's floor once its error bound is added,
 * x[r][j] + rel * |x[r][j]| + slope[r] * col[j] >= floor[r] (NaN never does), in increasing order: up to
 * `cap` of them go to idx[r * cap ...], and counts[r] says how many there are in all (more than cap: the
 * caller cannot use the row). One pass over the row, `col` (read by every row) staying in cache. */
VFN void V(reaching_rows)(const void *x, int64_t stride, const float *floor, const float *slope, const float *col,
                          float rel, int64_t rows, int64_t cols, int64_t *idx, int64_t cap, int64_t *counts,
                          const int bf16) {
    const int64_t full = cols / VW * VW;
    const vf r = vset1(rel);
    for (int64_t row = 0; row < rows; ++row) {
        const int64_t base = row * stride;
        const vf lo = vset1(floor[row]), k = vset1(slope[row]);
        int64_t *out = idx + row * cap, n = 0;
        int64_t j = 0;
        for (; j < full; j += VW) {
            const vf v = vload(x, base + j, bf16);
            const vf bound = vfmadd(k, vloadu(col + j), vfmadd(r, vmax(v, vsub(vzero(), v)), v));
            unsigned hit = vmask_bits(vcmp_ge(bound, lo));
            for (; hit; hit &= hit - 1, ++n)
                if (n < cap) out[n] = j + __builtin_ctz(hit);
        }
        for (; j < cols; ++j) {
            const float v = load(x, base + j, bf16);
            if (v + rel * (v < 0 ? -v : v) + slope[row] * col[j] >= floor[row]) {
                if (n < cap) out[n] = j;
                ++n;
            }
        }
        counts[row] = n;
    }
}

VENTRY void V(norm_f32)(const Norm *n) { V(norm_rows)(n, 0); }
VENTRY void V(norm_bf16)(const Norm *n) { V(norm_rows)(n, 1); }
VENTRY void V(silu_mul_f32)(const void *gu, int64_t s, void *o, int64_t r, int64_t w) { V(silu_mul_rows)(gu, s, o, r, w, 0); }
VENTRY void V(silu_mul_bf16)(const void *gu, int64_t s, void *o, int64_t r, int64_t w) { V(silu_mul_rows)(gu, s, o, r, w, 1); }
VENTRY void V(rotate_f32)(const Rotary *p) { V(rotate_rows)(p, 0); }
VENTRY void V(rotate_bf16)(const Rotary *p) { V(rotate_rows)(p, 1); }
VENTRY void V(argmax_f32)(const void *x, int64_t s, int64_t *o, int64_t r, int64_t c) { V(argmax_rows)(x, s, o, r, c, 0); }
VENTRY void V(argmax_bf16)(const void *x, int64_t s, int64_t *o, int64_t r, int64_t c) { V(argmax_rows)(x, s, o, r, c, 1); }
VENTRY void V(reaching_f32)(const Reaching *p) {
    V(reaching_rows)(p->x, p->stride, p->floor, p->slope, p->col, p->rel, p->rows, p->cols, p->idx, p->cap, p->counts, 0);
}
VENTRY void V(reaching_bf16)(const Reaching *p) {
    V(reaching_rows)(p->x, p->stride, p->floor, p->slope, p->col, p->rel, p->rows, p->cols, p->idx, p->cap, p->counts, 1);
}

static const Kernels V(kernels_f32) = {V(norm_f32), V(silu_mul_f32), V(rotate_f32), V(argmax_f32), V(reaching_f32)};
static const Kernels V(kernels_bf16) = {V(norm_bf16), V(silu_mul_bf16), V(rotate_bf16), V(argmax_bf16), V(reaching_bf16)};
