/* Batched multi-LoRA on the CPU for the engine's small steps: out[t] += b[s] (a[s] x[t]) with s = slots[t], for
 * every token whose slot is not -1, in place.
 *
 * A decode step's tokens each belong to their own sequence, two or three per adapter at most, so the work is
 * a pass over the adapters in use: each adapter's pair is read once from memory, used for all of its tokens,
 * and the time is those bytes over the memory bandwidth. This kernel groups the step's tokens by slot itself
 * (from the slots tensor's contents, read when it runs), so a recorded CPU step graph (folio.engine.cpu_graphs)
 * replays it for whatever mix of adapters the slots hold then, with no host-side plan.
 *
 * Layouts: a [S][Rt][K] as the engine's stacks hold it; b rank-major, [S][Rt][N] (the engine's CPU stacks are
 * allocated so: the logical [S, N, Rt] with strides (Rt N, 1, N)), so that the expand runs along the output's
 * columns with no horizontal sums. A fused projection's pair packs its slices' adapters in blocks of ranks
 * (q, k and v; gate and up), and block j adds only to the output rows [rows[j][0], rows[j][1]) given for it:
 * the zeros of b outside them are neither read nor multiplied (two thirds of the bytes of qkv's b).
 *
 * Arithmetic: float32 multiply-adds (fused); the shrink's sum over K in vector lanes then across them, the
 * rank-Rt intermediate in float32, the expand's sum over the block's ranks in order; a bfloat16 output gets
 * the float32 delta added and is rounded once, to nearest even. So results differ from the PyTorch
 * reference (folio.kernels.lora_reference) only in summation order.
 *
 * Built for AVX-512F and AVX2 (lora_cpu_simd.h); elsewhere `available()` is false and the engine keeps its
 * PyTorch plans. Groups split over torch's OpenMP workers (cpu_team.h) when there are enough of them, else
 * the output's columns do. No torch headers: the Python wrapper (folio.kernels.lora_cpu) checks shapes,
 * dtypes and strides and passes data pointers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

#include "cpu_simd_width.h"
#include "cpu_team.h"
#include "cpu_vec.h"

#define MAX_BLOCKS 8 /* rank blocks of one fused projection (3 for q, k, v) */

typedef struct {
    const void *x, *a, *b;
    void *out;
    int64_t k, n, rt, x_stride, out_stride, blocks;
    int64_t rows[MAX_BLOCKS][2]; /* block j adds to output rows [rows[j][0], rows[j][1]) */
    const int32_t *order;      /* the tokens with an adapter, grouped by slot (in token order within a group) */
    const int64_t *group_start; /* [groups + 1]: group g is order[group_start[g] .. group_start[g + 1]) */
    const int64_t *group_slot;  /* [groups] */
    float *h;                   /* [tokens with an adapter][Rt]: the shrink, in the order of `order` */
} LoRA;

typedef struct {
    const LoRA *p;
    int64_t g0, g1; /* groups [g0, g1) */
    int64_t c0, c1; /* over the output columns [c0, c1) */
    int shrink;     /* whether this share computes its groups' shrink (else it is done) */
    int bf16;
} Share;

static inline void store_to(void *base, int64_t i, float x, const int bf16) {
    if (bf16) ((uint16_t *)base)[i] = f32_to_bf16(x);
    else ((float *)base)[i] = x;
}

#ifdef FOLIO_X86
#define FOLIO_SIMD 512
#include "cpu_simd.h"
#include "lora_cpu_simd.h"
#undef FOLIO_SIMD
#define FOLIO_SIMD 256
#include "cpu_simd.h"
#include "lora_cpu_simd.h"
#endif

static void *run_share(void *arg) {
#ifdef FOLIO_X86
    const Share *s = (const Share *)arg;
    if (s->g0 >= s->g1) return NULL;
    if (simd_width() == 512) (s->bf16 ? run_share_bf16_avx512 : run_share_f32_avx512)(s->p, s);
    else (s->bf16 ? run_share_bf16_avx2 : run_share_f32_avx2)(s->p, s);
#else
    (void)arg;
#endif
    return NULL;
}

static int runs_here(void) { return simd_width() >= 256; }

/* --- Python entry points ----------------------------------------------------------------------------- */

#define PTR(x) ((void *)(uintptr_t)(x))

static PyObject *available(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    return PyBool_FromLong(runs_here());
}

/* Tokens grouped by slot (a counting sort: slots are few); a slot out of [-1, S) counts as -1, so a bad value
 * adds nothing rather than reading outside the stacks. Returns the number of groups. */
static int64_t group_tokens(const int32_t *slots, int64_t tokens, int64_t num_slots, int32_t *order,
                            int64_t *start, int64_t *slot_of, int64_t *count) {
    for (int64_t s = 0; s < num_slots; ++s) count[s] = 0;
    for (int64_t t = 0; t < tokens; ++t)
        if (slots[t] >= 0 && slots[t] < num_slots) ++count[slots[t]];
    int64_t groups = 0, at = 0;
    for (int64_t s = 0; s < num_slots; ++s)
        if (count[s]) {
            start[groups] = at;
            slot_of[groups] = s;
            at += count[s];
            count[s] = start[groups]; /* from here on: where slot s's next token goes */
            ++groups;
        }
    start[groups] = at;
    for (int64_t t = 0; t < tokens; ++t)
        if (slots[t] >= 0 && slots[t] < num_slots) order[count[slots[t]]++] = (int32_t)t;
    return groups;
}

static PyObject *add(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long out, x, a, b, slots;
    long long tokens, k, n, num_slots, rt, x_stride, out_stride;
    PyObject *rows_obj;
    int dtype, threads;
    if (!PyArg_ParseTuple(args, "KKKKKLLLLLLLOii", &out, &x, &a, &b, &slots, &tokens, &k, &n, &num_slots, &rt,
                          &x_stride, &out_stride, &rows_obj, &dtype, &threads))
        return NULL;
    /* rows: (lo_0, hi_0, lo_1, hi_1, ...), a pair per rank block */
    const Py_ssize_t nb = PyTuple_Check(rows_obj) ? PyTuple_GET_SIZE(rows_obj) / 2 : 0;
    if (!runs_here() || (dtype != DTYPE_F32 && dtype != DTYPE_BF16) || nb < 1 || nb > MAX_BLOCKS ||
        PyTuple_GET_SIZE(rows_obj) != 2 * nb || rt % nb != 0 || tokens < 0 || k < 1 || n < 1 || num_slots < 0 ||
        rt < 1) {
        PyErr_Format(PyExc_ValueError, "lora add: no kernel for dtype code %d, %lld tokens, %zd blocks, rank %lld "
                     "on this CPU", dtype, tokens, nb, rt);
        return NULL;
    }
    LoRA p = {PTR(x), PTR(a), PTR(b), PTR(out), k, n, rt, x_stride, out_stride, nb, {{0}}, NULL, NULL, NULL, NULL};
    for (Py_ssize_t j = 0; j < nb; ++j) {
        p.rows[j][0] = PyLong_AsLongLong(PyTuple_GET_ITEM(rows_obj, 2 * j));
        p.rows[j][1] = PyLong_AsLongLong(PyTuple_GET_ITEM(rows_obj, 2 * j + 1));
        if (p.rows[j][0] < 0 || p.rows[j][0] > p.rows[j][1] || p.rows[j][1] > n) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "lora add: a block's rows must lie in [0, n)");
            return NULL;
        }
    }
    if (tokens == 0 || num_slots == 0) Py_RETURN_NONE;
    /* one allocation: order [T] int32, group starts [S + 1], group slots [S], counts [S], h [T][Rt] */
    const size_t ints = (size_t)tokens * sizeof(int32_t) + (size_t)(3 * num_slots + 1) * sizeof(int64_t);
    const size_t h_at = (ints + 63) / 64 * 64;
    char *scratch = malloc(h_at + (size_t)tokens * (size_t)rt * sizeof(float));
    if (!scratch) return PyErr_NoMemory();
    int32_t *order = (int32_t *)scratch;
    int64_t *start = (int64_t *)(scratch + (size_t)tokens * sizeof(int32_t));
    int64_t *slot_of = start + num_slots + 1, *count = slot_of + num_slots;
    Py_BEGIN_ALLOW_THREADS
    const int64_t groups = group_tokens(PTR(slots), tokens, num_slots, order, start, slot_of, count);
    p.order = order, p.group_start = start, p.group_slot = slot_of, p.h = (float *)(scratch + h_at);
    const int bf16 = dtype == DTYPE_BF16;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads < 1) threads = 1;
    Share shares[MAX_THREADS];
    if (groups >= threads) { /* whole groups per thread: each reads its adapters, shrink and expand */
        for (int i = 0; i < threads; ++i)
            shares[i] = (Share){&p, groups * i / threads, groups * (i + 1) / threads, 0, n, 1, bf16};
    } else { /* few groups: their shrinks here first, then the columns (whole tiles) split over the threads */
        if (groups) run_share(&(Share){&p, 0, groups, 0, 0, 1, bf16}); /* no columns: the shrink only */
        const int64_t tiles = (n + 31) / 32;
        for (int i = 0; i < threads; ++i) {
            shares[i] = (Share){&p, 0, groups, 32 * (tiles * i / threads), 32 * (tiles * (i + 1) / threads), 0, bf16};
            if (shares[i].c1 > n) shares[i].c1 = n;
        }
    }
    if (groups) {
        if (threads == 1) run_share(&shares[0]);
        else run_shares(run_share, shares, sizeof(Share), threads);
    }
    Py_END_ALLOW_THREADS
    free(scratch);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"use_openmp", use_openmp, METH_VARARGS, USE_OPENMP_DOC},
    {"simd", simd, METH_VARARGS, SIMD_DOC},
    {"available", available, METH_NOARGS, "available() -> whether this CPU runs the kernel (AVX2 or AVX-512F)"},
    {"add", add, METH_VARARGS,
     "add(out, x, a, b, slots, tokens, k, n, num_slots, rank, x_stride, out_stride, rows, dtype, threads): "
     "pointers and sizes already checked by folio.kernels.lora_cpu"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cpu_lora",
                                    "Batched multi-LoRA for the CPU's small steps (see lora_cpu.c).", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__cpu_lora(void) { return PyModule_Create(&module); }
