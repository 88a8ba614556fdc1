/* The vector path of paged decode attention (paged_decode_cpu.c), written once in cpu_simd.h's ops and
 * included once per instruction set: head_dim a multiple of VW (up to 256), float32 or bfloat16 (widened on
 * load, so the arithmetic is float32 either way), over keys [lo, end) of a sequence: all of them (the output
 * normalized) or one part of a split context (``partial``: each head's score maximum, exp-sum and
 * unnormalized weighted values, for merge_parts). Works page by page so that a page's rows stay in L1 while
 * each query head runs over them with its query (pass 1) or accumulator (pass 2) held in registers. Same
 * arithmetic as attend_seq up to summation order. Defines V(pick_attend). */

VFN int V(attend)(const Problem *p, int64_t b, int64_t lo, int64_t end, float *scores, float *norms, Ahead *next,
                  float *partial, const int64_t dim, const int bf16) {
    const int64_t heads = p->heads, kv_heads = p->kv_heads, bs = p->block_size;
    const int64_t group = heads / kv_heads, row = kv_heads * dim, nv = dim / VW, len = end - lo;
    const int32_t *table = p->block_tables + b * p->table_stride;
    for (int64_t i = lo / bs; i * bs < end; ++i)
        if (table[i] < 0 || table[i] >= p->num_blocks) return FAIL_BLOCK;
    const vf scale = vset1(p->scale);

    const int64_t units = 2 * heads * len; /* (query head x key) pairs in both passes: the pace of `next` */
    int64_t done = 0;
    for (int64_t start = lo; start < end;) { /* pass 1: scores */
        const int64_t off = start % bs, n = end - start < bs - off ? end - start : bs - off;
        const int64_t page = ((int64_t)table[start / bs] * bs + off) * row;
        for (int64_t h = 0; h < heads; ++h) {
            const int64_t qh = b * p->q_stride_b + h * p->q_stride_h;
            int64_t k = page + (h / group) * dim;
            vf q[256 / VW];
            for (int64_t i = 0; i < nv; ++i) q[i] = vmul(vload(p->q, qh + VW * i, bf16), scale);
            float *out = scores + h * len + start - lo;
            for (int64_t t = 0; t < n; ++t, k += row) { /* two chains of multiply-adds, not one */
                vf a0 = vmul(q[0], vload(p->k_cache, k, bf16)), a1 = vzero();
                for (int64_t i = 1; i + 1 < nv; i += 2) {
                    a1 = vfmadd(q[i], vload(p->k_cache, k + VW * i, bf16), a1);
                    a0 = vfmadd(q[i + 1], vload(p->k_cache, k + VW * (i + 1), bf16), a0);
                }
                if (nv % 2 == 0) a1 = vfmadd(q[nv - 1], vload(p->k_cache, k + VW * (nv - 1), bf16), a1);
                out[t] = vreduce_add(vadd(a0, a1));
            }
            done += n;
            ahead_upto(next, next->bytes * done / units);
        }
        start += n;
    }
    float *maxes = partial, *sums = partial + heads, *accs = partial + 2 * heads; /* a part's results */
    for (int64_t h = 0; h < heads; ++h) { /* in place */
        if (partial) {
            norms[h] = vsoftmax_row_max(scores + h * len, len, &maxes[h]);
            sums[h] = 1.0f / norms[h];
        } else {
            norms[h] = vsoftmax_row(scores + h * len, len);
        }
    }
    for (int64_t h = 0; h < heads; ++h) { /* pass 2: weighted values, the accumulator in registers */
        vf acc[256 / VW];
        for (int64_t i = 0; i < nv; ++i) acc[i] = vzero();
        const float *w = scores + h * len;
        for (int64_t start = lo; start < end;) {
            const int64_t off = start % bs, n = end - start < bs - off ? end - start : bs - off;
            int64_t v = ((int64_t)table[start / bs] * bs + off) * row + (h / group) * dim;
            for (int64_t t = 0; t < n; ++t, v += row) {
                const vf wt = vset1(w[start - lo + t]);
                for (int64_t i = 0; i < nv; ++i) acc[i] = vfmadd(wt, vload(p->v_cache, v + VW * i, bf16), acc[i]);
            }
            start += n;
            done += n;
            ahead_upto(next, next->bytes * done / units);
        }
        if (partial) { /* unnormalized: merge_parts scales and sums the parts */
            for (int64_t i = 0; i < nv; ++i) vstoreu(accs + h * dim + VW * i, acc[i]);
            continue;
        }
        const vf norm = vset1(len > 0 ? norms[h] : 0.0f);
        const int64_t o = b * p->out_stride_b + h * p->out_stride_h;
        for (int64_t i = 0; i < nv; ++i) vstore(p->out, o + VW * i, vmul(acc[i], norm), bf16);
    }
    return FAIL_NONE;
}

/* Entry points per dtype and head_dim: with the head_dim known at compile time the query and accumulator
 * vectors stay in registers (indexed by a variable they would live on the stack, several times slower). */
#define ATTEND_ENTRY(name, dim, bf16)                                                                        \
    VENTRY int V(name)(const Problem *p, int64_t b, int64_t lo, int64_t end, float *s, float *n, Ahead *a,         \
                       float *partial) {                                                                         \
        return V(attend)(p, b, lo, end, s, n, a, partial, dim, bf16);                                            \
    }
ATTEND_ENTRY(attend_f32_64, 64, 0)
ATTEND_ENTRY(attend_f32_128, 128, 0)
ATTEND_ENTRY(attend_f32_any, p->head_dim, 0)
ATTEND_ENTRY(attend_bf16_64, 64, 1)
ATTEND_ENTRY(attend_bf16_128, 128, 1)
ATTEND_ENTRY(attend_bf16_any, p->head_dim, 1)
#undef ATTEND_ENTRY

static attend_vec_fn V(pick_attend)(const Problem *p) {
    const int bf16 = p->dtype == DTYPE_BF16;
    if (p->head_dim == 64) return bf16 ? V(attend_bf16_64) : V(attend_f32_64);
    if (p->head_dim == 128) return bf16 ? V(attend_bf16_128) : V(attend_f32_128);
    return bf16 ? V(attend_bf16_any) : V(attend_f32_any);
}
