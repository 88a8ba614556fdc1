/* The projections of a CPU decode step with few rows: out[M, N] = x[M, K] @ W[N, K]^T (+ bias), M <= 64.
 *
 * With a handful of rows a projection is a pass over its weights: each weight is read once from memory and
 * used M times, so the time is the weights' bytes over the memory bandwidth the kernel sustains. oneDNN's
 * GEMM, blocked for large batches, sustains about 20 GB/s on two cores of the development machine there,
 * where a plain sum over the same bytes reaches 31. This kernel reads the weights as one sequential stream
 * per thread, in a layout of its own ("panels" of W's rows 16 at a time, made by the Python wrapper,
 * folio.kernels.decode_gemm_cpu: float32 [N/16][K][16], bfloat16 in pairs of k [N/16][K/2][16][2], 64 bytes
 * a step either way), prefetched ahead into L2, and broadcasts each row of x across the 16 output columns of
 * a panel, so that no horizontal sum is needed. Up to 8 rows, where the weights' bytes bound the time: two
 * panels at a time and up to 8 rows of x per pass (16 accumulators), two streams of weights in flight. From
 * 9 rows on the multiply-adds bound it as much as the bytes do (Zen 4 issues one 512-bit multiply-add a
 * cycle): one panel at a time and up to 16 rows per pass (16 accumulators), so each weight comes from memory
 * once and serves all 16 rows, where two 8-row passes over two panels read it once from memory and once
 * more from L2; later passes take rows 17-64 from L1 or L2. bench/decode_gemm.py has the rates against
 * oneDNN's.
 *
 * Arithmetic: float32 multiply-adds (fused), the sum over K in order for each output, the bias added last
 * and a bfloat16 result rounded to nearest even once. bfloat16 runs on AVX512-BF16's dot products where the
 * CPU has them (each step adds a pair's two products to the float32 sum, in the instruction's order;
 * subnormal inputs read as zero), else widened exactly to float32 and multiply-added in order. Products of
 * bfloat16 values are exact in float32, so either way the result differs from oneDNN's only in summation
 * order and is at least as close to the exact one.
 *
 * AVX-512F only (the panel is one vector wide); elsewhere `available()` is false and the engine keeps
 * oneDNN. Pairs of panels split over torch's OpenMP workers (cpu_team.h). No torch headers: the Python
 * wrapper checks shapes, dtypes and strides and passes data pointers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

#include "cpu_simd_width.h"
#include "cpu_team.h"
#include "cpu_vec.h"

#define PANEL 16     /* output columns per panel: one AVX-512 vector of float32 */
#define MAX_ROWS 64  /* rows of x this kernel takes; larger batches go to oneDNN */
#define TILE_ROWS 8  /* rows of x per register tile of two panels: 2 x 8 = 16 accumulators */
#define WIDE_ROWS 16 /* rows of x per register tile of one panel, from 9 rows on: 16 accumulators */
#define PREFETCH 128 /* panel steps (64 bytes each) ahead to prefetch: 8 KiB */

/* How a panel step (64 bytes: the 16 columns' float32 weights at k, or their bfloat16 weights at k = 2j and
 * 2j + 1, paired per column) meets x: float32 multiply-adds; bfloat16 widened exactly to float32 and
 * multiply-added; or AVX512-BF16 dot products of the pairs (vdpbf16ps: twice the multiply-adds per
 * instruction, products exact, each added in float32, input subnormals read as zero). */
enum { KIND_F32 = 0, KIND_BF16 = 1, KIND_BF16_DOT = 2 };

typedef struct {
    const float *xt;    /* KIND_F32, KIND_BF16: x widened to float32 and transposed, [steps * (1 or 2)][M] */
    const uint32_t *xp; /* KIND_BF16_DOT: x's bfloat16 pairs (k = 2j low, 2j + 1 high) transposed, [steps][M] */
    const void *panels; /* [N_pad / 16][steps][64 bytes] in the weight dtype */
    const void *bias;   /* [N] in the weight dtype, or NULL */
    void *out;          /* [M, N] contiguous, in the weight dtype */
    int64_t m, n, steps, first, last; /* steps: K (float32) or ceil(K / 2) (bfloat16); panels [first, last) */
    int kind;
} Gemm;

#ifdef FOLIO_X86
/* Everything AVX-512 here may hold AVX512-BF16; only KIND_BF16_DOT's code does, and runs where the CPU has it. */
#define FOLIO_SIMD_512_TARGET "avx512f,avx512bf16"
#define FOLIO_SIMD 512
#include "cpu_simd.h"

/* Panel steps s + PREFETCH .. s + PREFETCH + 3 (four cache lines) on their way to L2; called every fourth
 * step. Into L2, not L1: L1's 32 KiB also holds the transposed rows of x (18-96 KiB for SmolLM2 at 8-16
 * rows), and two streams 8 KiB ahead evicted weights before their use there (into L2: 1.12x at 8-12 rows,
 * 1.04-1.06x at 16-24, bench/decode_gemm.py --against 4f45751; L1's own prefetcher brings them the last
 * step). */
VFN void prefetch(const char *panel, int64_t s) {
    const char *at = panel + (s + PREFETCH) * 64;
    for (int line = 0; line < 4; ++line) _mm_prefetch(at + 64 * line, _MM_HINT_T1);
}

/* Output columns [col, col + 16) of row r: the sum plus the bias, stored in the output dtype (only the
 * columns below n: the last panel may be padding). */
VFN void put(const Gemm *g, int64_t r, int64_t col, vf sum, const int bf16) {
    if (g->n - col >= PANEL) {
        if (g->bias) sum = vadd(sum, V(vload)(g->bias, col, bf16));
        if (bf16) V(vstore_u16)((uint16_t *)g->out + r * g->n + col, V(vbf16_bits)(sum));
        else vstoreu((float *)g->out + r * g->n + col, sum);
        return;
    }
    float lanes[PANEL];
    vstoreu(lanes, sum);
    for (int64_t j = 0; j < g->n - col; ++j) {
        const float v = lanes[j] + (g->bias ? load(g->bias, col + j, bf16) : 0.0f);
        if (bf16) ((uint16_t *)g->out)[r * g->n + col + j] = f32_to_bf16(v);
        else ((float *)g->out)[r * g->n + col + j] = v;
    }
}

/* Rows [r0, r0 + rows) of x against `count` (1 or 2) panels from `panel` on, count * rows <= 16 accumulators;
 * count, rows and kind are compile-time constants where inlined, so the accumulators stay in registers.
 * Each step's weights are loaded once and each row of x broadcast once for all the panels. */
VFN void tile(const Gemm *g, int64_t panel, const int count, int64_t r0, const int rows, const int kind) {
    const int64_t bytes = g->steps * 64, m = g->m;
    const char *p = (const char *)g->panels + panel * bytes;
    vf a[2][WIDE_ROWS];
    for (int c = 0; c < count; ++c)
        for (int r = 0; r < rows; ++r) a[c][r] = vzero();
    for (int64_t s = 0; s < g->steps; ++s) {
        if ((s & 3) == 0)
            for (int c = 0; c < count; ++c) prefetch(p + c * bytes, s);
        __m512i w[2];
        for (int c = 0; c < count; ++c) w[c] = _mm512_loadu_si512(p + c * bytes + s * 64);
        if (kind == KIND_F32) {
            const float *xs = g->xt + s * m + r0;
            for (int r = 0; r < rows; ++r) {
                const vf xr = vset1(xs[r]);
                for (int c = 0; c < count; ++c) a[c][r] = vfmadd(_mm512_castsi512_ps(w[c]), xr, a[c][r]);
            }
        } else if (kind == KIND_BF16) { /* lane i holds k = 2s (low half) and 2s + 1 (high half) of column i */
            vf even[2], odd[2];
            for (int c = 0; c < count; ++c) {
                even[c] = _mm512_castsi512_ps(_mm512_slli_epi32(w[c], 16));
                odd[c] = _mm512_castsi512_ps(_mm512_and_si512(w[c], _mm512_set1_epi32((int)0xffff0000u)));
            }
            const float *xe = g->xt + 2 * s * m + r0, *xo = xe + m;
            for (int r = 0; r < rows; ++r) {
                const vf xr = vset1(xe[r]), yr = vset1(xo[r]);
                for (int c = 0; c < count; ++c) a[c][r] = vfmadd(odd[c], yr, vfmadd(even[c], xr, a[c][r]));
            }
        } else {
            const uint32_t *xs = g->xp + s * m + r0;
            for (int r = 0; r < rows; ++r) {
                const __m512bh xr = (__m512bh)_mm512_set1_epi32((int)xs[r]);
                for (int c = 0; c < count; ++c) a[c][r] = _mm512_dpbf16_ps(a[c][r], (__m512bh)w[c], xr);
            }
        }
    }
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < count; ++c) put(g, r0 + r, (panel + c) * PANEL, a[c][r], kind != KIND_F32);
}

/* `switch (rows)` over a tile's compile-time row counts: CALL(n) for n = 1 .. 7, then up to 16. */
#define ROWS_1_TO_7(CALL)                                                                                    \
    case 1: CALL(1); break;                                                                                  \
    case 2: CALL(2); break;                                                                                  \
    case 3: CALL(3); break;                                                                                  \
    case 4: CALL(4); break;                                                                                  \
    case 5: CALL(5); break;                                                                                  \
    case 6: CALL(6); break;                                                                                  \
    case 7: CALL(7); break;
#define ROWS_8_TO_15(CALL)                                                                                   \
    case 8: CALL(8); break;                                                                                  \
    case 9: CALL(9); break;                                                                                  \
    case 10: CALL(10); break;                                                                                \
    case 11: CALL(11); break;                                                                                \
    case 12: CALL(12); break;                                                                                \
    case 13: CALL(13); break;                                                                                \
    case 14: CALL(14); break;                                                                                \
    case 15: CALL(15); break;
#define TWO_PANELS(n) tile(g, panel, 2, r0, n, kind)
#define ONE_PANEL(n) tile(g, panel, 1, r0, n, kind)

VFN void panels(const Gemm *g, const int kind) {
    if (g->m > TILE_ROWS) {
        for (int64_t panel = g->first; panel < g->last; ++panel)
            for (int64_t r0 = 0; r0 < g->m; r0 += WIDE_ROWS) {
                const int rows = (int)(g->m - r0 < WIDE_ROWS ? g->m - r0 : WIDE_ROWS);
                switch (rows) { ROWS_1_TO_7(ONE_PANEL) ROWS_8_TO_15(ONE_PANEL) default: ONE_PANEL(16); }
            }
        return;
    }
    for (int64_t panel = g->first; panel < g->last;) {
        /* two panels per pass: two streams of weights in flight, and half the broadcasts of x per weight */
        const int count = panel + 1 < g->last ? 2 : 1;
        for (int64_t r0 = 0; r0 < g->m; r0 += TILE_ROWS) {
            const int rows = (int)(g->m - r0 < TILE_ROWS ? g->m - r0 : TILE_ROWS);
            if (count == 2) {
                switch (rows) { ROWS_1_TO_7(TWO_PANELS) default: TWO_PANELS(8); }
            } else {
                switch (rows) { ROWS_1_TO_7(ONE_PANEL) default: ONE_PANEL(8); }
            }
        }
        panel += count;
    }
}

VENTRY void panels_f32(const Gemm *g) { panels(g, KIND_F32); }
VENTRY void panels_bf16(const Gemm *g) { panels(g, KIND_BF16); }
VENTRY void panels_bf16_dot(const Gemm *g) { panels(g, KIND_BF16_DOT); }
#endif

static void *run_share(void *arg) {
#ifdef FOLIO_X86
    const Gemm *g = (const Gemm *)arg;
    if (g->first < g->last)
        (g->kind == KIND_F32 ? panels_f32 : g->kind == KIND_BF16 ? panels_bf16 : panels_bf16_dot)(g);
#else
    (void)arg;
#endif
    return NULL;
}

static int runs_here(void) { return simd_width() == 512; }

/* Whether bfloat16 runs on AVX512-BF16's dot products (where the CPU has them; the tests turn it off to check
 * the widening path too). */
static int dot_chosen = -1;

static int dot_bf16(void) {
    if (dot_chosen < 0) {
#if defined(__x86_64__) && defined(__GNUC__)
        __builtin_cpu_init();
        dot_chosen = __builtin_cpu_supports("avx512bf16") ? 1 : 0;
#else
        dot_chosen = 0;
#endif
    }
    return dot_chosen;
}

/* --- Python entry points ----------------------------------------------------------------------------- */

#define PTR(x) ((void *)(uintptr_t)(x))

static PyObject *available(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    return PyBool_FromLong(runs_here());
}

static PyObject *bf16_dot(PyObject *self, PyObject *args) {
    (void)self;
    int want = -1;
    if (!PyArg_ParseTuple(args, "|i", &want)) return NULL;
    if (want == 0) dot_chosen = 0;
    else if (want == 1) dot_chosen = -1; /* back to what the CPU has */
    return PyBool_FromLong(dot_bf16());
}

/* x's rows as the tiles read them, each step's M values adjacent; steps past K are zero. Walks x a column at a
 * time: its M rows' cache lines stay in L1 while the writes run in order. */
static void transpose_f32(const void *x, int64_t stride, int64_t m, int64_t k, int64_t steps, float *xt, int bf16) {
    for (int64_t j = 0; j < steps; ++j)
        for (int64_t r = 0; r < m; ++r) xt[j * m + r] = j < k ? load(x, r * stride + j, bf16) : 0.0f;
}

static void transpose_pairs(const uint16_t *x, int64_t stride, int64_t m, int64_t k, int64_t steps, uint32_t *xp) {
    for (int64_t j = 0; j < steps; ++j)
        for (int64_t r = 0; r < m; ++r) {
            const uint16_t *row = x + r * stride + 2 * j;
            xp[j * m + r] = (uint32_t)row[0] | (2 * j + 1 < k ? (uint32_t)row[1] << 16 : 0u);
        }
}

static PyObject *gemm(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long x, panels_ptr, bias, out;
    long long x_stride, m, n, k;
    int dtype, threads;
    if (!PyArg_ParseTuple(args, "KLKKKLLLii", &x, &x_stride, &panels_ptr, &bias, &out, &m, &n, &k, &dtype, &threads))
        return NULL;
    if (!runs_here() || (dtype != DTYPE_F32 && dtype != DTYPE_BF16) || m < 1 || m > MAX_ROWS || n < 1 || k < 1) {
        PyErr_Format(PyExc_ValueError, "decode_gemm: no kernel for dtype code %d, %lld rows (1-%d) on this CPU",
                     dtype, m, MAX_ROWS);
        return NULL;
    }
    const int kind = dtype == DTYPE_F32 ? KIND_F32 : dot_bf16() ? KIND_BF16_DOT : KIND_BF16;
    const int64_t steps = kind == KIND_F32 ? k : (k + 1) / 2;
    /* float32 x for KIND_F32 and KIND_BF16 (2 * steps rows for bfloat16: k rounded up to pairs), pairs else */
    void *xs = malloc((size_t)(m * steps) * (kind == KIND_BF16 ? 2 * sizeof(float) : sizeof(float)));
    if (!xs) return PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS
    if (kind == KIND_BF16_DOT) transpose_pairs(PTR(x), x_stride, m, k, steps, xs);
    else transpose_f32(PTR(x), x_stride, m, k, kind == KIND_BF16 ? 2 * steps : k, xs, kind == KIND_BF16);
    const int64_t count = (n + PANEL - 1) / PANEL, pairs = (count + 1) / 2;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > pairs) threads = (int)pairs;
    if (threads < 1) threads = 1;
    Gemm shares[MAX_THREADS];
    for (int i = 0; i < threads; ++i) /* whole pairs of panels per thread, so that each can run two at once */
        shares[i] = (Gemm){kind == KIND_BF16_DOT ? NULL : xs, kind == KIND_BF16_DOT ? xs : NULL, PTR(panels_ptr),
                           bias ? PTR(bias) : NULL, PTR(out), m, n, steps,
                           2 * (pairs * i / threads), 2 * (pairs * (i + 1) / threads), kind};
    shares[threads - 1].last = count;
    if (threads == 1) run_share(&shares[0]);
    else run_shares(run_share, shares, sizeof(Gemm), threads);
    Py_END_ALLOW_THREADS
    free(xs);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"use_openmp", use_openmp, METH_VARARGS, USE_OPENMP_DOC},
    {"simd", simd, METH_VARARGS, SIMD_DOC},
    {"available", available, METH_NOARGS, "available() -> whether this CPU runs the kernel (AVX-512F)"},
    {"bf16_dot", bf16_dot, METH_VARARGS,
     "bf16_dot([on]) -> whether bfloat16 runs on AVX512-BF16 dot products; 0 turns them off (the widening "
     "path), 1 back to what the CPU has"},
    {"gemm", gemm, METH_VARARGS,
     "gemm(x, x_stride, panels, bias, out, m, n, k, dtype, threads): bias 0 for none; pointers and sizes "
     "already checked by folio.kernels.decode_gemm_cpu"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cpu_decode_gemm",
                                    "The CPU projections of decode steps with few rows (see decode_gemm_cpu.c).",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__cpu_decode_gemm(void) { return PyModule_Create(&module); }
