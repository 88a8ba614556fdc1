/* Causal prefill attention for the CPU: a prompt segment's n queries over its len contiguous keys and values.
 *
 * Query i sits at position len - n + i and sees keys max(0, p - W + 1) .. p (W = 0: no window). q, k, v and
 * out are [tokens, heads, head_dim] with any token stride and contiguous heads, float32 or bfloat16
 * (widened exactly on load; all arithmetic in float32; out rounded to nearest even).
 *
 * SDPA's CPU flash kernel reaches 15-40 GFLOP/s at prompt lengths of a few hundred tokens; this one works in
 * tiles that keep the arithmetic in registers. The keys are transposed once per call into float32
 * [kv_heads][head_dim][len] rows, so that 16 query vectors (a query position x a query head of the KV
 * head's group; 8 at a time on AVX2) are scored against a vector of keys with one broadcast multiply-add
 * per (vector, dimension): no horizontal sums. An exact two-pass softmax per query vector follows, then the weighted values, each value
 * row loaded once for several query vectors whose accumulators stay in registers. Same arithmetic as the
 * reference (folio.kernels.attention_reference) up to summation order.
 *
 * The tiles (prefill_attention_simd.h) are built for AVX-512F and for AVX2, head_dim a multiple of 16 up to
 * 256; `available()` says whether this CPU runs either (elsewhere the engine keeps SDPA). Shares of tiles run on torch's OpenMP workers (cpu_team.h); the GIL is released. No
 * torch headers: the Python wrapper (folio.kernels.prefill_attention_cpu) checks shapes, dtypes and strides.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "cpu_simd_width.h"
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
typedef void (*tile_fn)(const Prefill *, int64_t, float *, float *);

#define FOLIO_SIMD 512
#include "cpu_simd.h"
#include "prefill_attention_simd.h"
#undef FOLIO_SIMD
#define FOLIO_SIMD 256
#include "cpu_simd.h"
#include "prefill_attention_simd.h"

static tile_fn pick(const Prefill *p) { return simd_width() == 512 ? pick_tile_avx512(p) : pick_tile_avx2(p); }

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
static void transpose_keys(const Prefill *p) {
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
    if (simd_width() >= 256) Py_RETURN_TRUE;
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
    if (simd_width() < 256) {
        PyErr_SetString(PyExc_ValueError, "prefill: this CPU has neither AVX-512F nor AVX2 (see available())");
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
    {"available", available, METH_NOARGS, "available() -> whether this CPU runs the kernel (AVX-512F or AVX2)"},
    {"simd", simd, METH_VARARGS, SIMD_DOC},
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
