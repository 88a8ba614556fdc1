/* Causal prefill attention for the CPU: a prompt segment's n queries over its len contiguous keys and values.
 *
 * Query i sits at position len - n + i and sees keys max(0, p - W + 1) .. p (W = 0: no window). q, k, v and
 * out are [tokens, heads, head_dim] with any token stride and contiguous heads, float32 or bfloat16
 * (widened exactly on load; all arithmetic in float32; out rounded to nearest even).
 *
 * SDPA's CPU flash kernel reaches 15-40 GFLOP/s at prompt lengths of a few hundred tokens; this one works in
 * tiles that keep the arithmetic in registers. The keys are transposed once per call into float32
 * [kv_heads][head_dim][len] rows, so that 16 query vectors (a query position x a query head of the KV
 * head's group) are scored against 16 keys with one broadcast multiply-add per (vector, dimension): no
 * horizontal sums. An exact two-pass softmax per query vector follows, then the weighted values, each value
 * row loaded once for several query vectors whose accumulators stay in registers. Same arithmetic as the
 * reference (folio.kernels.attention_reference) up to summation order.
 *
 * AVX-512F, head_dim a multiple of 16 up to 256; `available()` says whether this CPU runs it (elsewhere the
 * engine keeps SDPA). Shares of tiles run on torch's OpenMP workers (cpu_team.h); the GIL is released. No
 * torch headers: the Python wrapper (folio.kernels.prefill_attention_cpu) checks shapes, dtypes and strides.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "cpu_team.h"
#include "cpu_vec.h"

#define TILE 16 /* query vectors scored together */

typedef struct {
    const void *q, *k, *v;
    void *out;
    int64_t n, len, heads, kv_heads, dim, window;
    int64_t q_stride, q_head_stride, k_stride, v_stride, out_stride, out_head_stride; /* in elements */
    float scale;
    int dtype;
    float *kt;      /* [kv_heads][dim][len_pad] float32: the keys transposed, zero past len */
    int64_t len_pad; /* len rounded up to 16 */
} Prefill;

typedef struct {
    const Prefill *p;
    int64_t first, last; /* tiles [first, last) in (kv head, tile) order */
    int failed;
} Share;

static inline int64_t tiles_per_head(const Prefill *p) {
    return (p->n * (p->heads / p->kv_heads) + TILE - 1) / TILE;
}

/* The first key position p sees. */
static inline int64_t first_key(const Prefill *p, int64_t pos) {
    return p->window > 0 && pos + 1 > p->window ? pos + 1 - p->window : 0;
}

#if defined(FOLIO_X86)
#define KERNEL __attribute__((target("avx512f"), always_inline)) static inline

/* The weighted values of `vb` query vectors u0 .. u0+vb-1 (of TILE in the tile) over keys [lo, hi): their
 * accumulators in registers, each value row loaded once. `vb` and `dim` are compile-time constants. */
KERNEL void weigh_values(const Prefill *p, int64_t kvh, const float *scores, int64_t span, int64_t key0,
                         int64_t lo, int64_t hi, const float *norms, const int64_t *rows, const int64_t *heads,
                         const int vb, const int64_t dim, const int bf16) {
    const int64_t nv = dim / 16;
    __m512 acc[4][16];
    for (int g = 0; g < vb; ++g)
        for (int64_t i = 0; i < nv; ++i) acc[g][i] = _mm512_setzero_ps();
    for (int64_t j = lo; j < hi; ++j) {
        __m512 x[16];
        for (int64_t i = 0; i < nv; ++i) x[i] = load16(p->v, j * p->v_stride + kvh * dim + 16 * i, bf16);
        for (int g = 0; g < vb; ++g) {
            const __m512 w = _mm512_set1_ps(scores[g * span + j - key0]);
            for (int64_t i = 0; i < nv; ++i) acc[g][i] = _mm512_fmadd_ps(w, x[i], acc[g][i]);
        }
    }
    for (int g = 0; g < vb; ++g) {
        if (rows[g] < 0) continue; /* padding past the last query */
        const __m512 norm = _mm512_set1_ps(norms[g]);
        const int64_t o = rows[g] * p->out_stride + heads[g] * p->out_head_stride;
        for (int64_t i = 0; i < nv; ++i) store16(p->out, o + 16 * i, _mm512_mul_ps(acc[g][i], norm), bf16);
    }
}

/* One tile: TILE query vectors of KV head kvh, vector u = query row * group + head in group. `scores` holds
 * TILE x (len_pad + 16) floats, `qs` TILE x dim. */
KERNEL void attend_tile(const Prefill *p, int64_t tile, float *scores, float *qs, const int64_t dim,
                        const int bf16) {
    const int64_t group = p->heads / p->kv_heads, per_head = tiles_per_head(p);
    const int64_t kvh = tile / per_head, u0 = (tile % per_head) * TILE, vectors = p->n * group;
    int64_t rows[TILE], heads[TILE], lo[TILE], hi[TILE];
    const __m512 scale = _mm512_set1_ps(p->scale);
    for (int v = 0; v < TILE; ++v) {
        const int64_t u = u0 + v;
        rows[v] = u < vectors ? u / group : -1;
        heads[v] = kvh * group + u % group;
        const int64_t pos = p->len - p->n + (u < vectors ? u / group : p->n - 1);
        lo[v] = first_key(p, pos), hi[v] = pos + 1;
        for (int64_t i = 0; i < dim / 16; ++i) {
            const __m512 x = rows[v] < 0 ? _mm512_setzero_ps()
                                         : load16(p->q, rows[v] * p->q_stride + heads[v] * p->q_head_stride + 16 * i, bf16);
            _mm512_storeu_ps(qs + v * dim + 16 * i, _mm512_mul_ps(x, scale));
        }
    }
    /* keys [key0, key_end): the union of the vectors' ranges, key0 a multiple of 16 (the transposed rows'
     * vectors are aligned to it) */
    const int64_t key0 = lo[0] / 16 * 16, key_end = hi[TILE - 1], span = p->len_pad + 16;

    /* pass 1: scores, 16 vectors x 16 keys in registers */
    const float *kt = p->kt + kvh * dim * p->len_pad;
    for (int64_t jb = key0; jb < key_end; jb += 16) {
        __m512 acc[TILE];
        for (int v = 0; v < TILE; ++v) acc[v] = _mm512_setzero_ps();
        for (int64_t d = 0; d < dim; ++d) {
            const __m512 keys = _mm512_loadu_ps(kt + d * p->len_pad + jb);
            for (int v = 0; v < TILE; ++v) acc[v] = _mm512_fmadd_ps(_mm512_set1_ps(qs[v * dim + d]), keys, acc[v]);
        }
        for (int v = 0; v < TILE; ++v) _mm512_storeu_ps(scores + v * span + jb - key0, acc[v]);
    }
    /* softmax per vector over its own keys; zero weight elsewhere in the union (pass 2 runs over all of it) */
    float norms[TILE];
    for (int v = 0; v < TILE; ++v) {
        float *s = scores + v * span;
        norms[v] = softmax_row16(s + lo[v] - key0, hi[v] - lo[v]);
        for (int64_t j = key0; j < lo[v]; ++j) s[j - key0] = 0.0f;
        for (int64_t j = hi[v]; j < key_end; ++j) s[j - key0] = 0.0f;
    }
    /* pass 2: as many vectors at a time as keep their accumulators in registers */
    const int vb = dim <= 64 ? 4 : dim <= 128 ? 2 : 1;
    for (int v = 0; v < TILE; v += vb) {
        if (rows[v] < 0) break;
        const int64_t first = lo[v], last = hi[v + vb - 1]; /* the keys some vector of these reads */
        if (vb == 4) weigh_values(p, kvh, scores + v * span, span, key0, first, last, norms + v, rows + v, heads + v, 4, dim, bf16);
        else if (vb == 2) weigh_values(p, kvh, scores + v * span, span, key0, first, last, norms + v, rows + v, heads + v, 2, dim, bf16);
        else weigh_values(p, kvh, scores + v * span, span, key0, first, last, norms + v, rows + v, heads + v, 1, dim, bf16);
    }
}

#define ATTEND(name, dim, bf16)                                                                              \
    __attribute__((target("avx512f"))) static void name(const Prefill *p, int64_t t, float *s, float *q) {  \
        attend_tile(p, t, s, q, dim, bf16);                                                                  \
    }
ATTEND(tile_f32_64, 64, 0)
ATTEND(tile_f32_128, 128, 0)
ATTEND(tile_f32_any, p->dim, 0)
ATTEND(tile_bf16_64, 64, 1)
ATTEND(tile_bf16_128, 128, 1)
ATTEND(tile_bf16_any, p->dim, 1)

typedef void (*tile_fn)(const Prefill *, int64_t, float *, float *);

static tile_fn pick(const Prefill *p) {
    const int bf16 = p->dtype == DTYPE_BF16;
    if (p->dim == 64) return bf16 ? tile_bf16_64 : tile_f32_64;
    if (p->dim == 128) return bf16 ? tile_bf16_128 : tile_f32_128;
    return bf16 ? tile_bf16_any : tile_f32_any;
}

static void *run_share(void *arg) {
    Share *w = (Share *)arg;
    const Prefill *p = w->p;
    float *buf = malloc(sizeof(float) * TILE * ((size_t)p->len_pad + 16 + (size_t)p->dim));
    if (!buf) {
        w->failed = 1;
        return NULL;
    }
    const tile_fn attend = pick(p);
    for (int64_t t = w->first; t < w->last; ++t) attend(p, t, buf, buf + TILE * (p->len_pad + 16));
    free(buf);
    return NULL;
}

/* Each KV head's keys as float32 rows of one dimension each, zero-padded to len_pad. */
__attribute__((target("avx512f"))) static void transpose_keys(const Prefill *p) {
    const int bf16 = p->dtype == DTYPE_BF16;
    for (int64_t kvh = 0; kvh < p->kv_heads; ++kvh) {
        float *kt = p->kt + kvh * p->dim * p->len_pad;
        for (int64_t j = 0; j < p->len; ++j) {
            const int64_t at = j * p->k_stride + kvh * p->dim;
            for (int64_t d = 0; d < p->dim; ++d)
                kt[d * p->len_pad + j] = bf16 ? bf16_to_f32(((const uint16_t *)p->k)[at + d]) : ((const float *)p->k)[at + d];
        }
        for (int64_t d = 0; d < p->dim; ++d)
            for (int64_t j = p->len; j < p->len_pad; ++j) kt[d * p->len_pad + j] = 0.0f;
    }
}

/* Below this many (query vector x key) pairs a thread costs more to start than it saves. */
#define MIN_PAIRS_PER_THREAD 16384

static int run(Prefill *p, int threads) {
    p->len_pad = (p->len + 15) / 16 * 16;
    p->kt = malloc(sizeof(float) * (size_t)(p->kv_heads * p->dim * p->len_pad));
    if (!p->kt) return 1;
    transpose_keys(p);
    const int64_t per_head = tiles_per_head(p), tiles = per_head * p->kv_heads;
    const int64_t pairs = p->n * p->heads * p->len / 2 / MIN_PAIRS_PER_THREAD;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > pairs) threads = pairs > 1 ? (int)pairs : 1;
    if (threads > tiles) threads = (int)(tiles > 0 ? tiles : 1);
    /* A tile's cost grows with its last query's position: split the (kv head, tile) order at equal sums of
     * it, which are the same for every head. */
    Share shares[MAX_THREADS];
    const int64_t total = p->kv_heads * per_head * (per_head + 1) / 2;
    int64_t t = 0, seen = 0;
    for (int i = 0; i < threads; ++i) {
        shares[i] = (Share){p, t, t, 0};
        const int64_t goal = total * (i + 1) / threads;
        while (t < tiles && (i == threads - 1 || seen < goal)) seen += t++ % per_head + 1;
        shares[i].last = t;
    }
    run_shares(run_share, shares, sizeof(Share), threads);
    free(p->kt);
    int failed = 0;
    for (int i = 0; i < threads; ++i) failed |= shares[i].failed;
    return failed;
}
#endif

static PyObject *available(PyObject *self, PyObject *args) {
    (void)self, (void)args;
#if defined(FOLIO_X86)
    if (__builtin_cpu_supports("avx512f")) Py_RETURN_TRUE;
#endif
    Py_RETURN_FALSE;
}

static PyObject *prefill(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long q, k, v, out;
    long long n, len, heads, kv_heads, dim, window, qs, qhs, ks, vs, os, ohs;
    float scale;
    int dtype, threads;
    if (!PyArg_ParseTuple(args, "KKKKLLLLLLLLLLLLfii", &q, &k, &v, &out, &n, &len, &heads, &kv_heads, &dim,
                          &window, &qs, &qhs, &ks, &vs, &os, &ohs, &scale, &dtype, &threads))
        return NULL;
    if (n < 0 || len < n || heads < 1 || kv_heads < 1 || heads % kv_heads || dim < 16 || dim % 16 || dim > 256 ||
        window < 0 || (dtype != DTYPE_F32 && dtype != DTYPE_BF16)) {
        PyErr_SetString(PyExc_ValueError, "prefill: inconsistent problem sizes or dtype");
        return NULL;
    }
#if defined(FOLIO_X86)
    if (!__builtin_cpu_supports("avx512f")) {
        PyErr_SetString(PyExc_ValueError, "prefill: this CPU has no AVX-512F (see available())");
        return NULL;
    }
    Prefill p = {(const void *)(uintptr_t)q, (const void *)(uintptr_t)k, (const void *)(uintptr_t)v,
                 (void *)(uintptr_t)out, n, len, heads, kv_heads, dim, window, qs, qhs, ks, vs, os, ohs, scale, dtype,
                 NULL, 0};
    if (n == 0) Py_RETURN_NONE;
    int failed;
    Py_BEGIN_ALLOW_THREADS failed = run(&p, threads < 1 ? 1 : threads);
    Py_END_ALLOW_THREADS if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
#else
    (void)q, (void)k, (void)v, (void)out, (void)qs, (void)qhs, (void)ks, (void)vs, (void)os, (void)ohs, (void)scale;
    (void)threads;
    PyErr_SetString(PyExc_ValueError, "prefill: built without the x86 path (see available())");
    return NULL;
#endif
}

static PyMethodDef methods[] = {
    {"available", available, METH_NOARGS, "available() -> whether this CPU runs the kernel (AVX-512F)"},
    {"use_openmp", use_openmp, METH_VARARGS, USE_OPENMP_DOC},
    {"prefill", prefill, METH_VARARGS,
     "prefill(q, k, v, out, n, len, heads, kv_heads, head_dim, window, q_stride, q_head_stride, k_stride, "
     "v_stride, out_stride, out_head_stride, scale, dtype, threads): strides in elements; pointers and sizes "
     "already checked by folio.kernels.prefill_attention_cpu"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_cpu_prefill", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__cpu_prefill(void) { return PyModule_Create(&module); }
