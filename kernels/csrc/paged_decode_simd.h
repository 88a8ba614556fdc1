/* The vector path of paged decode attention (paged_decode_cpu.c), written once in cpu_simd.h's ops and
 * included once per instruction set: head_dim a multiple of VW (up to 256), float32 or bfloat16 (widened on
 * load, so the arithmetic is float32 either way), over keys [lo, end) of a bundle of rows sharing a context (a
 * decode's one row, a verify step's positions of one sequence): all of them (the output normalized) or one part
 * of a split context (``partial``: per row, each head's score maximum, exp-sum and unnormalized weighted values,
 * for merge_parts). Each row attends to its own keys of the range (row_keys). Works page by page so that a
 * page's rows stay in L1 while every row's query heads run over them with their queries (pass 1) or
 * accumulators (pass 2) held in registers: a bundle reads its context from memory once, not once a row; in
 * bfloat16 the heads of a group that fit in GROUP_VECS vectors walk their KV head's rows together, each row
 * loaded and widened once for all of them (1.13-1.26x, bench/decode_attention_cpu.py --against 4f45751;
 * float32, bound by memory, keeps one head per walk).
 * Same arithmetic as attend_seq up to summation order. Defines V(pick_attend). */

/* Vectors held for the query heads of one walk: GROUP_VECS, or one head's where that is more. */
#define HELD_VECS (GROUP_VECS > 256 / VW ? GROUP_VECS : 256 / VW)

VFN int V(attend)(const Problem *p, int64_t b0, int64_t rows, int64_t lo, int64_t end, float *scores, float *norms,
                  Ahead *next, float *partial, const int64_t dim, const int bf16) {
    const int64_t heads = p->heads, kv_heads = p->kv_heads, bs = p->block_size;
    const int64_t group = heads / kv_heads, row = kv_heads * dim, nv = dim / VW, len = end - lo;
    /* query heads of a group per walk over its KV head's rows, their vectors in registers */
    const int64_t per = bf16 && nv < GROUP_VECS ? GROUP_VECS / nv : 1;
    const int32_t *table = p->block_tables + b0 * p->table_stride; /* the bundle's rows share it (bundle_rows) */
    for (int64_t i = lo / bs; i * bs < end; ++i)
        if (table[i] < 0 || table[i] >= p->num_blocks) return FAIL_BLOCK;
    const vf scale = vset1(p->scale);

    /* `next` is asked for its bytes in step with the (row x query head x key) pairs done in both passes: after
     * each page, and in bfloat16 every four keys too (faster there, on one core most; float32 on two cores was
     * slower that way); bytes per pair in 16.16 fixed point, so that the pacing costs no division */
    const int64_t units = 2 * rows * heads * len, pace = units > 0 ? (next->bytes << 16) / units : 0;
    int64_t done = 0;
    for (int64_t start = lo; start < end;) { /* pass 1: scores, each key row widened once per walk */
        const int64_t off = start % bs, n = end - start < bs - off ? end - start : bs - off;
        const int64_t page = ((int64_t)table[start / bs] * bs + off) * row;
        for (int64_t r = 0; r < rows; ++r) { /* the bundle's rows score the page while it is in L1 */
            const int64_t b = b0 + r;
            for (int64_t h0 = 0, hn; h0 < heads; h0 += hn) {
                const int64_t kvh = h0 / group;
                hn = heads_in_walk(h0, group, per);
                vf q[HELD_VECS];
                for (int64_t g = 0; g < per; ++g)
                    if (g < hn)
                        for (int64_t i = 0; i < nv; ++i)
                            q[g * nv + i] = vmul(
                                vload(p->q, b * p->q_stride_b + (h0 + g) * p->q_stride_h + VW * i, bf16), scale);
                int64_t k = page + kvh * dim;
                float *out = scores + (r * heads + h0) * len + start - lo;
                for (int64_t t = 0; t < n; ++t, k += row) {
                    vf key[256 / VW];
                    for (int64_t i = 0; i < nv; ++i) key[i] = vload(p->k_cache, k + VW * i, bf16);
                    for (int64_t g = 0; g < per; ++g) {
                        if (g >= hn) break;
                        vf a0 = vmul(q[g * nv], key[0]), a1 = vzero(); /* two chains of multiply-adds, not one */
                        for (int64_t i = 1; i + 1 < nv; i += 2) {
                            a1 = vfmadd(q[g * nv + i], key[i], a1);
                            a0 = vfmadd(q[g * nv + i + 1], key[i + 1], a0);
                        }
                        if (nv % 2 == 0) a1 = vfmadd(q[g * nv + nv - 1], key[nv - 1], a1);
                        out[g * len + t] = vreduce_add(vadd(a0, a1));
                    }
                    if (bf16 && (t & 3) == 3) ahead_upto(next, ((done + (t + 1) * hn) * pace) >> 16);
                }
                done += n * hn;
                ahead_upto(next, (done * pace) >> 16);
            }
        }
        start += n;
    }
    for (int64_t r = 0; r < rows; ++r) {
        /* the row's own keys: the bundle's, less those past its end or before its window */
        int64_t row_lo, row_end;
        row_keys(p, b0 + r, lo, end, &row_lo, &row_end);
        float *maxes = partial ? partial + r * PART_FLOATS(p) : NULL, *sums = maxes + heads;
        for (int64_t h = 0; h < heads; ++h) { /* in place */
            float *s = scores + (r * heads + h) * len + row_lo - lo, *nh = norms + r * heads + h;
            if (row_end <= row_lo) { /* nothing of this part: an empty part merges as nothing */
                *nh = 0.0f;
                if (partial) maxes[h] = -INFINITY, sums[h] = 0.0f;
            } else if (partial) {
                *nh = vsoftmax_row_max(s, row_end - row_lo, &maxes[h]);
                sums[h] = 1.0f / *nh;
            } else {
                *nh = vsoftmax_row(s, row_end - row_lo);
            }
        }
        for (int64_t h0 = 0; h0 < heads;) { /* pass 2: weighted values, each value row widened once per walk */
            const int64_t kvh = h0 / group, hn = heads_in_walk(h0, group, per);
            vf acc[HELD_VECS];
            for (int64_t i = 0; i < per * nv; ++i) acc[i] = vzero();
            const float *w = scores + (r * heads + h0) * len;
            for (int64_t start = row_lo; start < row_end;) {
                const int64_t off = start % bs, n = row_end - start < bs - off ? row_end - start : bs - off;
                int64_t v = ((int64_t)table[start / bs] * bs + off) * row + kvh * dim;
                for (int64_t t = 0; t < n; ++t, v += row) {
                    vf value[256 / VW];
                    for (int64_t i = 0; i < nv; ++i) value[i] = vload(p->v_cache, v + VW * i, bf16);
                    for (int64_t g = 0; g < per; ++g) {
                        if (g >= hn) break;
                        const vf wt = vset1(w[g * len + start - lo + t]);
                        for (int64_t i = 0; i < nv; ++i) acc[g * nv + i] = vfmadd(wt, value[i], acc[g * nv + i]);
                    }
                    if (bf16 && (t & 3) == 3) ahead_upto(next, ((done + (t + 1) * hn) * pace) >> 16);
                }
                start += n;
                done += n * hn;
                ahead_upto(next, (done * pace) >> 16);
            }
            for (int64_t g = 0; g < per; ++g) {
                if (g >= hn) break;
                const int64_t h = h0 + g;
                if (partial) { /* unnormalized: merge_parts scales and sums the parts */
                    float *accs = partial + r * PART_FLOATS(p) + 2 * heads;
                    for (int64_t i = 0; i < nv; ++i) vstoreu(accs + h * dim + VW * i, acc[g * nv + i]);
                    continue;
                }
                const vf norm = vset1(norms[r * heads + h]);
                const int64_t o = (b0 + r) * p->out_stride_b + h * p->out_stride_h;
                for (int64_t i = 0; i < nv; ++i) vstore(p->out, o + VW * i, vmul(acc[g * nv + i], norm), bf16);
            }
            h0 += hn;
        }
    }
    return FAIL_NONE;
}
#undef HELD_VECS

/* Entry points per dtype and head_dim: with the head_dim known at compile time the query and accumulator
 * vectors stay in registers (indexed by a variable they would live on the stack, several times slower). */
#define ATTEND_ENTRY(name, dim, bf16)                                                                        \
    VENTRY int V(name)(const Problem *p, int64_t b0, int64_t rows, int64_t lo, int64_t end, float *s, float *n,    \
                       Ahead *a, float *partial) {                                                               \
        return V(attend)(p, b0, rows, lo, end, s, n, a, partial, dim, bf16);                                     \
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
