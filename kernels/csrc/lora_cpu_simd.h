/* The shrink and the expand of lora_cpu.c, written once in cpu_simd.h's ops and included once per instruction
 * set. Defines V(run_share). A share's work: its groups (tokens of one slot each) against that slot's pair,
 * over its columns of the output. */

/* h[t][r0 .. r0 + rr) = x[t] . a[r] for tt tokens of `rows`: tt * rr <= 16 accumulators, kept in registers
 * because tt and rr are compile-time constants where this is inlined (V(shrink_rows)'s switch); whole
 * vectors of k here, the last k % VW scalar. */
VFN void V(shrink_tile)(const LoRA *p, const void *a, const int32_t *rows, const int tt, int64_t r0, const int rr,
                        float *h, const int bf16) {
    vf acc[4][8];
    for (int t = 0; t < tt; ++t)
        for (int r = 0; r < rr; ++r) acc[t][r] = vzero();
    const int64_t k = p->k, whole = k - k % VW;
    for (int64_t i = 0; i < whole; i += VW) {
        vf w[8];
        for (int r = 0; r < rr; ++r) w[r] = vload(a, (r0 + r) * k + i, bf16);
        for (int t = 0; t < tt; ++t) {
            const vf xv = vload(p->x, rows[t] * p->x_stride + i, bf16);
            for (int r = 0; r < rr; ++r) acc[t][r] = vfmadd(xv, w[r], acc[t][r]);
        }
    }
    for (int t = 0; t < tt; ++t)
        for (int r = 0; r < rr; ++r) {
            float sum = vreduce_add(acc[t][r]);
            for (int64_t i = whole; i < k; ++i)
                sum += load(p->x, rows[t] * p->x_stride + i, bf16) * load(a, (r0 + r) * k + i, bf16);
            h[(int64_t)t * p->rt + r0 + r] = sum;
        }
}

/* The shrink of tt (1-4) tokens over all Rt ranks: 8 ranks at a time for one or two tokens (a decode step's
 * usual group: more rows of a in flight), 4 for three or four. */
VFN void V(shrink_rows)(const LoRA *p, const void *a, const int32_t *rows, const int tt, float *h, const int bf16) {
    const int rr = tt <= 2 ? 8 : 4;
    int64_t r0 = 0;
    for (; r0 + rr <= p->rt; r0 += rr) {
        switch (tt) {
        case 1: V(shrink_tile)(p, a, rows, 1, r0, 8, h, bf16); break;
        case 2: V(shrink_tile)(p, a, rows, 2, r0, 8, h, bf16); break;
        case 3: V(shrink_tile)(p, a, rows, 3, r0, 4, h, bf16); break;
        default: V(shrink_tile)(p, a, rows, 4, r0, 4, h, bf16);
        }
    }
    for (; r0 < p->rt; ++r0) {
        switch (tt) {
        case 1: V(shrink_tile)(p, a, rows, 1, r0, 1, h, bf16); break;
        case 2: V(shrink_tile)(p, a, rows, 2, r0, 1, h, bf16); break;
        case 3: V(shrink_tile)(p, a, rows, 3, r0, 1, h, bf16); break;
        default: V(shrink_tile)(p, a, rows, 4, r0, 1, h, bf16);
        }
    }
}

/* out[t][c .. c + cw VW) += sum over ranks [r0, r1) of h[t][r] * b[r][c ..] for tt tokens (tt * cw <= 16
 * accumulators, compile-time constants where inlined): each rank's row of b loaded once for all of them. */
VFN void V(expand_tile)(const LoRA *p, const void *b, const int32_t *rows, const int tt, const float *h, int64_t r0,
                        int64_t r1, int64_t c, const int cw, const int bf16) {
    vf acc[8][4];
    for (int t = 0; t < tt; ++t)
        for (int v = 0; v < cw; ++v) acc[t][v] = vzero();
    for (int64_t r = r0; r < r1; ++r) {
        vf w[4];
        for (int v = 0; v < cw; ++v) w[v] = vload(b, r * p->n + c + v * VW, bf16);
        for (int t = 0; t < tt; ++t) {
            const vf ht = vset1(h[(int64_t)t * p->rt + r]);
            for (int v = 0; v < cw; ++v) acc[t][v] = vfmadd(ht, w[v], acc[t][v]);
        }
    }
    for (int t = 0; t < tt; ++t)
        for (int v = 0; v < cw; ++v) {
            const int64_t at = rows[t] * p->out_stride + c + v * VW;
            vstore(p->out, at, vadd(vload(p->out, at, bf16), acc[t][v]), bf16);
        }
}

/* The columns [c0, c1) of one block no whole vector covers, one at a time. */
VFN void V(expand_tail)(const LoRA *p, const void *b, const int32_t *rows, int tt, const float *h, int64_t r0,
                        int64_t r1, int64_t c0, int64_t c1, const int bf16) {
    for (int t = 0; t < tt; ++t)
        for (int64_t c = c0; c < c1; ++c) {
            float sum = 0.0f;
            for (int64_t r = r0; r < r1; ++r) sum += h[(int64_t)t * p->rt + r] * load(b, r * p->n + c, bf16);
            const int64_t at = rows[t] * p->out_stride + c;
            store_to(p->out, at, load(p->out, at, bf16) + sum, bf16);
        }
}

/* `switch (tt)` over a tile's compile-time token counts 1 .. 8, with `cw` vectors of columns each. */
#define EXPAND_CASES(CW)                                                                                      \
    switch (tt) {                                                                                             \
    case 1: V(expand_tile)(p, b, rows, 1, h, r0, r1, c, CW, bf16); break;                                    \
    case 2: V(expand_tile)(p, b, rows, 2, h, r0, r1, c, CW, bf16); break;                                    \
    case 3: V(expand_tile)(p, b, rows, 3, h, r0, r1, c, CW, bf16); break;                                    \
    case 4: V(expand_tile)(p, b, rows, 4, h, r0, r1, c, CW, bf16); break;                                    \
    case 5: V(expand_tile)(p, b, rows, 5, h, r0, r1, c, CW, bf16); break;                                    \
    case 6: V(expand_tile)(p, b, rows, 6, h, r0, r1, c, CW, bf16); break;                                    \
    case 7: V(expand_tile)(p, b, rows, 7, h, r0, r1, c, CW, bf16); break;                                    \
    default: V(expand_tile)(p, b, rows, 8, h, r0, r1, c, CW, bf16);                                          \
    }

/* Columns [lo, hi) of the output for tt (1-8) tokens from ranks [r0, r1): four vectors of columns at a time
 * up to four tokens, two from five on, then single vectors, then the last columns one by one. */
VFN void V(expand_rows)(const LoRA *p, const void *b, const int32_t *rows, const int tt, const float *h,
                        int64_t r0, int64_t r1, int64_t lo, int64_t hi, const int bf16) {
    const int64_t step = (tt <= 4 ? 4 : 2) * VW;
    int64_t c = lo;
    for (; c + step <= hi; c += step) {
        if (tt <= 4) {
            EXPAND_CASES(4)
        } else {
            EXPAND_CASES(2)
        }
    }
    for (; c + VW <= hi; c += VW) {
        EXPAND_CASES(1)
    }
    if (c < hi) V(expand_tail)(p, b, rows, tt, h, r0, r1, c, hi, bf16);
}
#undef EXPAND_CASES

VFN void V(group)(const LoRA *p, const Share *s, int64_t g, const int bf16) {
    const int64_t slot = p->group_slot[g], size = bf16 ? 2 : 4;
    const void *a = (const char *)p->a + slot * p->rt * p->k * size;
    const void *b = (const char *)p->b + slot * p->rt * p->n * size;
    const int32_t *tokens = p->order + p->group_start[g];
    const int64_t count = p->group_start[g + 1] - p->group_start[g];
    float *h = p->h + p->group_start[g] * p->rt;
    if (s->shrink)
        for (int64_t t0 = 0; t0 < count; t0 += 4)
            V(shrink_rows)(p, a, tokens + t0, (int)(count - t0 < 4 ? count - t0 : 4), h + t0 * p->rt, bf16);
    const int64_t rank = p->rt / p->blocks;
    for (int64_t j = 0; j < p->blocks; ++j) { /* block j: ranks [j R, (j+1) R) into its own rows of the output */
        const int64_t lo = p->rows[j][0] > s->c0 ? p->rows[j][0] : s->c0;
        const int64_t hi = p->rows[j][1] < s->c1 ? p->rows[j][1] : s->c1;
        for (int64_t t0 = 0; t0 < count; t0 += 8)
            V(expand_rows)(p, b, tokens + t0, (int)(count - t0 < 8 ? count - t0 : 8), h + t0 * p->rt, j * rank,
                           (j + 1) * rank, lo, hi, bf16);
    }
}

VENTRY void V(run_share_f32)(const LoRA *p, const Share *s) {
    for (int64_t g = s->g0; g < s->g1; ++g) V(group)(p, s, g, 0);
}

VENTRY void V(run_share_bf16)(const LoRA *p, const Share *s) {
    for (int64_t g = s->g0; g < s->g1; ++g) V(group)(p, s, g, 1);
}
