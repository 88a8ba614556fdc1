/* The tiles of causal prefill attention (prefill_attention_cpu.c), written once in cpu_simd.h's ops and
 * included once per instruction set. Defines V(pick_tile). */

/* The weighted values of `vb` query vectors u0 .. u0+vb-1 (of TILE in the tile) over keys [lo, hi), for
 * dimensions d0 .. d0+dn-1: their accumulators in registers, each value row's slice loaded once. `vb` and
 * `dn` are compile-time constants. */
VFN void V(weigh_values)(const Prefill *p, int64_t kvh, const float *scores, int64_t span, int64_t key0,
                         int64_t lo, int64_t hi, const float *norms, const int64_t *rows, const int64_t *heads,
                         const int vb, const int64_t d0, const int64_t dn, const int bf16) {
    const int64_t nv = dn / VW, dim = p->dim;
    vf acc[4][256 / VW];
    for (int g = 0; g < vb; ++g)
        for (int64_t i = 0; i < nv; ++i) acc[g][i] = vzero();
    for (int64_t j = lo; j < hi; ++j) {
        vf x[256 / VW];
        for (int64_t i = 0; i < nv; ++i) x[i] = vload(p->v, j * p->v_stride + kvh * dim + d0 + VW * i, bf16);
        for (int g = 0; g < vb; ++g) {
            const vf w = vset1(scores[g * span + j - key0]);
            for (int64_t i = 0; i < nv; ++i) acc[g][i] = vfmadd(w, x[i], acc[g][i]);
        }
    }
    for (int g = 0; g < vb; ++g) {
        if (rows[g] < 0) continue; /* padding past the last query */
        const vf norm = vset1(norms[g]);
        const int64_t o = rows[g] * p->out_stride + heads[g] * p->out_head_stride + d0;
        for (int64_t i = 0; i < nv; ++i) vstore(p->out, o + VW * i, vmul(acc[g][i], norm), bf16);
    }
}

/* Query vectors v .. v+vb-1 of the tile, all their dimensions: AVX-512's 32 registers hold a whole head_dim
 * for several vectors; AVX2's 16 hold two vectors' accumulators for 32 dimensions at a time. */
VFN void V(weigh_group)(const Prefill *p, int64_t kvh, const float *scores, int64_t span, int64_t key0,
                        int64_t lo, int64_t hi, const float *norms, const int64_t *rows, const int64_t *heads,
                        const int vb, const int64_t dim, const int bf16) {
#if FOLIO_SIMD == 512
    V(weigh_values)(p, kvh, scores, span, key0, lo, hi, norms, rows, heads, vb, 0, dim, bf16);
#else
    int64_t d0 = 0;
    for (; d0 + 32 <= dim; d0 += 32)
        V(weigh_values)(p, kvh, scores, span, key0, lo, hi, norms, rows, heads, vb, d0, 32, bf16);
    if (d0 < dim) /* head_dim is a multiple of 16 */
        V(weigh_values)(p, kvh, scores, span, key0, lo, hi, norms, rows, heads, vb, d0, 16, bf16);
#endif
}

/* One tile: TILE query vectors of KV head kvh, vector u = query row * group + head in group. `scores` holds
 * TILE x (len_pad + 16) floats, `qs` TILE x dim. */
VFN void V(attend_tile)(const Prefill *p, int64_t tile, float *scores, float *qs, const int64_t dim, const int bf16) {
    const int64_t group = p->heads / p->kv_heads, per_head = tiles_per_head(p);
    const int64_t kvh = tile / per_head, u0 = (tile % per_head) * TILE, vectors = p->n * group;
    int64_t rows[TILE], heads[TILE], lo[TILE], hi[TILE];
    const vf scale = vset1(p->scale);
    for (int v = 0; v < TILE; ++v) {
        const int64_t u = u0 + v;
        rows[v] = u < vectors ? u / group : -1;
        heads[v] = kvh * group + u % group;
        const int64_t pos = p->len - p->n + (u < vectors ? u / group : p->n - 1);
        lo[v] = first_key(p, pos), hi[v] = pos + 1;
        for (int64_t i = 0; i < dim / VW; ++i) {
            const vf x = rows[v] < 0 ? vzero() : vload(p->q, rows[v] * p->q_stride + heads[v] * p->q_head_stride + VW * i, bf16);
            vstoreu(qs + v * dim + VW * i, vmul(x, scale));
        }
    }
    /* keys [key0, key_end): the union of the vectors' ranges, key0 a multiple of 16 (the transposed rows'
     * vectors are aligned to it) */
    const int64_t key0 = lo[0] / 16 * 16, key_end = hi[TILE - 1], span = p->len_pad + 16;

    /* pass 1: scores, SV vectors x VW keys in registers, one broadcast multiply-add per (vector, dimension) */
    enum { SV = VW == 16 ? 16 : 8 };
    const float *kt = p->kt + kvh * dim * p->len_pad;
    for (int v0 = 0; v0 < TILE; v0 += SV) {
        for (int64_t jb = key0; jb < key_end; jb += VW) {
            vf acc[SV];
            for (int v = 0; v < SV; ++v) acc[v] = vzero();
            for (int64_t d = 0; d < dim; ++d) {
                const vf keys = vloadu(kt + d * p->len_pad + jb);
                for (int v = 0; v < SV; ++v) acc[v] = vfmadd(vset1(qs[(v0 + v) * dim + d]), keys, acc[v]);
            }
            for (int v = 0; v < SV; ++v) vstoreu(scores + (v0 + v) * span + jb - key0, acc[v]);
        }
    }
    /* softmax per vector over its own keys; zero weight elsewhere in the union (pass 2 runs over all of it) */
    float norms[TILE];
    for (int v = 0; v < TILE; ++v) {
        float *s = scores + v * span;
        norms[v] = vsoftmax_row(s + lo[v] - key0, hi[v] - lo[v]);
        for (int64_t j = key0; j < lo[v]; ++j) s[j - key0] = 0.0f;
        for (int64_t j = hi[v]; j < key_end; ++j) s[j - key0] = 0.0f;
    }
    /* pass 2: as many vectors at a time as keep their accumulators in registers */
    const int vb = VW == 8 ? 2 : dim <= 64 ? 4 : dim <= 128 ? 2 : 1;
    for (int v = 0; v < TILE; v += vb) {
        if (rows[v] < 0) break;
        const int64_t first = lo[v], last = hi[v + vb - 1]; /* the keys some vector of these reads */
        const float *s = scores + v * span;
        if (vb == 4) V(weigh_group)(p, kvh, s, span, key0, first, last, norms + v, rows + v, heads + v, 4, dim, bf16);
        else if (vb == 2) V(weigh_group)(p, kvh, s, span, key0, first, last, norms + v, rows + v, heads + v, 2, dim, bf16);
        else V(weigh_group)(p, kvh, s, span, key0, first, last, norms + v, rows + v, heads + v, 1, dim, bf16);
    }
}

VENTRY void V(tile_f32_64)(const Prefill *p, int64_t t, float *s, float *q) { V(attend_tile)(p, t, s, q, 64, 0); }
VENTRY void V(tile_f32_128)(const Prefill *p, int64_t t, float *s, float *q) { V(attend_tile)(p, t, s, q, 128, 0); }
VENTRY void V(tile_f32_any)(const Prefill *p, int64_t t, float *s, float *q) { V(attend_tile)(p, t, s, q, p->dim, 0); }
VENTRY void V(tile_bf16_64)(const Prefill *p, int64_t t, float *s, float *q) { V(attend_tile)(p, t, s, q, 64, 1); }
VENTRY void V(tile_bf16_128)(const Prefill *p, int64_t t, float *s, float *q) { V(attend_tile)(p, t, s, q, 128, 1); }
VENTRY void V(tile_bf16_any)(const Prefill *p, int64_t t, float *s, float *q) { V(attend_tile)(p, t, s, q, p->dim, 1); }

static tile_fn V(pick_tile)(const Prefill *p) {
    const int bf16 = p->dtype == DTYPE_BF16;
    if (p->dim == 64) return bf16 ? V(tile_bf16_64) : V(tile_f32_64);
    if (p->dim == 128) return bf16 ? V(tile_bf16_128) : V(tile_f32_128);
    return bf16 ? V(tile_bf16_any) : V(tile_f32_any);
}
