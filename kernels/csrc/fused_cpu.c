/* Fused elementwise ops of the CPU decoder layer: residual add + RMSNorm, SiLU-and-multiply, the neox rotary
 * embedding in place, and the scatter of new keys and values into the paged cache; greedy sampling's argmax
 * over a step's logits, read in the model's dtype, and the greedy LM head's scan for the tokens its bfloat16
 * screen cannot rule out (folio.engine.layers.greedy_head).
 *
 * PyTorch runs each of these as two to seven ops, every one a pass over memory with its own dispatch and its
 * own temporary; on a small model's decode step, where the tensors are a few hundred kilobytes, that costs
 * more than the arithmetic. Here each op is one pass over its rows, a vector at a time.
 *
 * The roundings are the engine's PyTorch path's (transformers'): bfloat16 values are widened to float32,
 * and every result PyTorch rounds to the tensor dtype is rounded here, to nearest even, at the same place.
 * Products and sums are not contracted into fused multiply-adds (the build passes -ffp-contract=off), so
 * the rotary embedding, the residual add and the KV scatter are bit-identical to PyTorch. The RMSNorm
 * statistic (another summation order) and the SiLU exponential (another polynomial) may differ from
 * PyTorch's in the last float32 bit; in bfloat16 that survives only where it crosses a rounding boundary,
 * rarely, but over a long greedy generation one such flip can change a later token.
 *
 * The ops (fused_cpu_simd.h) are built for AVX-512 and for AVX2; `dtypes()` says which dtypes this CPU runs
 * them in: float32 with either, bfloat16 with AVX2 or with AVX-512F and AVX512-BF16 (its rounding
 * instruction; an AVX-512 CPU without it gains nothing over PyTorch's own AVX-512 code with the emulated
 * rounding). Elsewhere the engine keeps its PyTorch code. Rows are independent: an op with enough of them splits them over
 * torch's OpenMP workers (cpu_team.h), with results that do not depend on the split; a small one runs on
 * the calling thread, where a thread would cost more to start than it saves. No torch headers: the Python wrapper (folio.kernels.fused_cpu) checks shapes,
 * dtypes and strides and passes data pointers, so this builds as a plain C extension in a second.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_simd_width.h"
#include "cpu_team.h"
#include "cpu_vec.h"

#define INLINE static inline __attribute__((always_inline))

INLINE void store(void *base, int64_t i, float x, const int bf16) {
    if (bf16) ((uint16_t *)base)[i] = f32_to_bf16(x);
    else ((float *)base)[i] = x;
}

/* x as the tensor dtype would hold it: PyTorch rounds every bfloat16 op's result. */
INLINE float round_to(float x, const int bf16) { return bf16 ? bf16_to_f32(f32_to_bf16(x)) : x; }

/* exp(x) over float32's range (Cephes', as the decode kernel's): 2^n is applied in two halves so that
 * results near FLT_MAX do not overflow early, and -103 is where even subnormals run out. */
INLINE float exp_full(float x) {
    if (x != x) return x; /* NaN */
    if (x > 88.72283935546875f) return INFINITY;
    if (x < -103.0f) return 0.0f;
    float n;
    const float y = exp_mantissa(x, &n);
    const int32_t half = (int32_t)n / 2;
    return y * pow2i(half) * pow2i((int32_t)n - half);
}

/* --- the problems ---------------------------------------------------------------------------------- */

typedef struct { /* residual add + RMSNorm */
    const void *x, *residual, *weight; /* residual NULL: no add */
    void *out, *residual_out;          /* residual_out: x + residual, rounded (unused without residual) */
    int64_t rows, hidden, x_stride, residual_stride; /* strides between rows, in elements */
    float eps;
} Norm;

typedef struct { /* the rotary embedding, in place */
    void *x;                   /* [tokens, heads, head_dim] with strides (token_stride, head_stride, 1) */
    const void *cos, *sin;     /* [tokens, half] each, rows cs_stride apart, in x's dtype */
    int64_t tokens, heads, token_stride, head_stride, cs_stride, half;
} Rotary;

typedef struct Reaching { /* the greedy LM head's screen: the columns that can still reach a row's floor */
    const void *x;                         /* [rows, cols], rows stride elements apart */
    const float *floor, *slope, *col;      /* [rows], [rows], [cols] */
    float rel;
    int64_t stride, rows, cols, cap;
    int64_t *idx, *counts;                 /* [rows, cap], [rows] */
} Reaching;

/* --- the kernels, per instruction set -------------------------------------------------------------- */

typedef struct {
    void (*norm)(const Norm *);
    void (*silu_mul)(const void *, int64_t, void *, int64_t, int64_t);
    void (*rotate)(const Rotary *);
    void (*argmax)(const void *, int64_t, int64_t *, int64_t, int64_t);
    void (*reaching)(const struct Reaching *);
} Kernels;

#ifdef FOLIO_X86
/* The float32 instantiations carry the same target but hold no BF16 instruction (the fast rounding is
 * reached only with bf16 set), so AVX-512F alone runs them. */
#define FOLIO_SIMD_512_TARGET "avx512f,avx512bf16"
#define FOLIO_SIMD 512
#include "cpu_simd.h"
#include "fused_cpu_simd.h"
#undef FOLIO_SIMD
#define FOLIO_SIMD 256
#include "cpu_simd.h"
#include "fused_cpu_simd.h"
#endif

/* The kernels for a dtype code on this CPU at the chosen width, or NULL (the engine keeps PyTorch). */
static const Kernels *kernels_for(int dtype) {
#ifdef FOLIO_X86
    const int width = simd_width(), bf16 = dtype == DTYPE_BF16;
    if (width == 512 && (!bf16 || __builtin_cpu_supports("avx512bf16"))) return bf16 ? &kernels_bf16_avx512 : &kernels_f32_avx512;
    if (width >= 256) return bf16 ? &kernels_bf16_avx2 : &kernels_f32_avx2;
#endif
    (void)dtype;
    return NULL;
}

/* --- Python entry points ----------------------------------------------------------------------------- */

#define PTR(x) ((void *)(uintptr_t)(x))

static int runs(int dtype) {
    if ((dtype == DTYPE_F32 || dtype == DTYPE_BF16) && kernels_for(dtype)) return 1;
    PyErr_Format(PyExc_ValueError, "folio.kernels._cpu_fused has no kernel for dtype code %d on this CPU "
                                   "(see dtypes())", dtype);
    return 0;
}

static PyObject *dtypes(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    return Py_BuildValue("(OO)", kernels_for(DTYPE_F32) ? Py_True : Py_False,
                         kernels_for(DTYPE_BF16) ? Py_True : Py_False);
}

/* --- splitting rows over threads ------------------------------------------------------------------------ */

typedef struct { /* SiLU-and-multiply */
    const void *gate_up; /* [rows, 2 * width], rows `stride` elements apart; gate first */
    void *out;           /* [rows, width] */
    int64_t stride, rows, width;
} SiluMul;

typedef struct { /* the KV scatter, slots already checked */
    const char *key, *value;
    char *k_cache, *v_cache;
    const int64_t *slots;
    int64_t key_stride, value_stride, tokens, row_bytes; /* strides in bytes */
} Scatter;

enum { OP_NORM, OP_SILU_MUL, OP_ROTATE, OP_SCATTER };

typedef struct {
    int op, dtype;
    const void *problem;
    int64_t first, last; /* rows */
} Rows;

#define AT(base, elements, size) ((void *)((char *)(base) + (elements) * (size)))

static void scatter(const Scatter *s) {
    for (int64_t i = 0; i < s->tokens; ++i) {
        if (s->slots[i] < 0) continue;
        memcpy(s->k_cache + s->slots[i] * s->row_bytes, s->key + i * s->key_stride, (size_t)s->row_bytes);
        memcpy(s->v_cache + s->slots[i] * s->row_bytes, s->value + i * s->value_stride, (size_t)s->row_bytes);
    }
}

/* The op over rows [first, last): its problem with the pointers moved to the first row. */
static void *run_rows(void *arg) {
    const Rows *r = (const Rows *)arg;
    const int64_t a = r->first, n = r->last - r->first, size = r->dtype == DTYPE_BF16 ? 2 : 4;
    switch (r->op) {
    case OP_NORM: {
        Norm m = *(const Norm *)r->problem;
        m.x = AT(m.x, a * m.x_stride, size), m.out = AT(m.out, a * m.hidden, size);
        m.residual = m.residual ? AT(m.residual, a * m.residual_stride, size) : NULL;
        m.residual_out = AT(m.residual_out, a * m.hidden, size), m.rows = n;
        kernels_for(r->dtype)->norm(&m);
        break;
    }
    case OP_SILU_MUL: {
        const SiluMul *m = (const SiluMul *)r->problem;
        kernels_for(r->dtype)->silu_mul(AT(m->gate_up, a * m->stride, size), m->stride, AT(m->out, a * m->width, size), n,
                                   m->width);
        break;
    }
    case OP_ROTATE: {
        Rotary m = *(const Rotary *)r->problem;
        m.x = AT(m.x, a * m.token_stride, size), m.cos = AT(m.cos, a * m.cs_stride, size);
        m.sin = AT(m.sin, a * m.cs_stride, size), m.tokens = n;
        kernels_for(r->dtype)->rotate(&m);
        break;
    }
    default: {
        Scatter m = *(const Scatter *)r->problem;
        m.key += a * m.key_stride, m.value += a * m.value_stride, m.slots += a, m.tokens = n;
        scatter(&m);
        break;
    }
    }
    return NULL;
}

/* Below this many elements (or bytes, for the scatter) per thread a thread costs more than it saves. */
#define MIN_WORK_PER_THREAD 32768

/* The op over all `rows`, split into contiguous ranges over up to `threads` threads by `work` per row. */
static void over_rows(int op, int dtype, const void *problem, int64_t rows, int64_t work, int threads) {
    const int64_t useful = rows * work / MIN_WORK_PER_THREAD;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > useful) threads = useful > 1 ? (int)useful : 1;
    if (threads > rows) threads = rows > 1 ? (int)rows : 1;
    Rows shares[MAX_THREADS];
    for (int i = 0; i < threads; ++i) shares[i] = (Rows){op, dtype, problem, rows * i / threads, rows * (i + 1) / threads};
    if (threads == 1) run_rows(&shares[0]);
    else run_shares(run_rows, shares, sizeof(Rows), threads);
}

static PyObject *rms_norm(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long x, residual, weight, out, residual_out;
    long long rows, hidden, x_stride, residual_stride;
    float eps;
    int dtype, threads;
    if (!PyArg_ParseTuple(args, "KKKKKLLLLfii", &x, &residual, &weight, &out, &residual_out, &rows, &hidden,
                          &x_stride, &residual_stride, &eps, &dtype, &threads) || !runs(dtype))
        return NULL;
    const Norm n = {PTR(x), PTR(residual), PTR(weight), PTR(out), PTR(residual_out), rows, hidden, x_stride,
                    residual_stride, eps};
    Py_BEGIN_ALLOW_THREADS over_rows(OP_NORM, dtype, &n, rows, hidden, threads);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

static PyObject *silu_and_mul(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long gate_up, out;
    long long stride, rows, width;
    int dtype, threads;
    if (!PyArg_ParseTuple(args, "KLKLLii", &gate_up, &stride, &out, &rows, &width, &dtype, &threads) || !runs(dtype))
        return NULL;
    const SiluMul m = {PTR(gate_up), PTR(out), stride, rows, width};
    Py_BEGIN_ALLOW_THREADS over_rows(OP_SILU_MUL, dtype, &m, rows, width, threads);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

static PyObject *rotary_neox(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long x, cos, sin;
    long long tokens, heads, token_stride, head_stride, cs_stride, half;
    int dtype, threads;
    if (!PyArg_ParseTuple(args, "KKKLLLLLLii", &x, &cos, &sin, &tokens, &heads, &token_stride, &head_stride,
                          &cs_stride, &half, &dtype, &threads) || !runs(dtype))
        return NULL;
    const Rotary p = {PTR(x), PTR(cos), PTR(sin), tokens, heads, token_stride, head_stride, cs_stride, half};
    Py_BEGIN_ALLOW_THREADS over_rows(OP_ROTATE, dtype, &p, tokens, 2 * heads * half, threads);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

static PyObject *argmax_rows(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long x, out;
    long long stride, rows, cols;
    int dtype;
    if (!PyArg_ParseTuple(args, "KLKLLi", &x, &stride, &out, &rows, &cols, &dtype) || !runs(dtype)) return NULL;
    Py_BEGIN_ALLOW_THREADS kernels_for(dtype)->argmax(PTR(x), stride, PTR(out), rows, cols);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

static PyObject *reaching_rows(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long x, floor, slope, col, idx, counts;
    long long stride, rows, cols, cap;
    float rel;
    int dtype;
    if (!PyArg_ParseTuple(args, "KLKKKfLLKLKi", &x, &stride, &floor, &slope, &col, &rel, &rows, &cols, &idx, &cap,
                          &counts, &dtype) ||
        !runs(dtype))
        return NULL;
    const Reaching p = {PTR(x), PTR(floor), PTR(slope), PTR(col), rel, stride, rows, cols, cap, PTR(idx), PTR(counts)};
    Py_BEGIN_ALLOW_THREADS kernels_for(dtype)->reaching(&p);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

/* Structured output's token bitmask on float32 logits, in place: in each listed row, every column whose bit
 * is clear (bit j of 32-bit word j / 32) becomes -inf. A word with all bits set (most of a JSON string's
 * vocabulary) is skipped and one with none set is a plain fill; the rest select per lane without branches,
 * which compilers vectorize. */
static void bitmask_rows(float *x, int64_t stride, const uint32_t *mask, int64_t mask_stride, const int64_t *rows,
                         int64_t num_rows, int64_t cols) {
    for (int64_t i = 0; i < num_rows; ++i) {
        float *row = x + rows[i] * stride;
        const uint32_t *bits = mask + rows[i] * mask_stride;
        for (int64_t w = 0; w * 32 < cols; ++w) {
            const uint32_t word = bits[w];
            const int64_t base = w * 32, n = cols - base < 32 ? cols - base : 32;
            if (word == 0xFFFFFFFFu) continue;
            float *out = row + base;
            if (word == 0) {
                for (int64_t k = 0; k < n; ++k) out[k] = -INFINITY;
                continue;
            }
            for (int64_t k = 0; k < n; ++k) out[k] = (word >> k) & 1u ? out[k] : -INFINITY;
        }
    }
}

static PyObject *bitmask_rows_py(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long x, mask, rows;
    long long stride, mask_stride, num_rows, cols;
    if (!PyArg_ParseTuple(args, "KLKLKLL", &x, &stride, &mask, &mask_stride, &rows, &num_rows, &cols)) return NULL;
    Py_BEGIN_ALLOW_THREADS bitmask_rows(PTR(x), stride, PTR(mask), mask_stride, PTR(rows), num_rows, cols);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

/* The first token whose slot lies outside [-1, num_slots), or -1 when all are in range. */
static int64_t bad_slot(const int64_t *slots, int64_t tokens, int64_t num_slots) {
    for (int64_t i = 0; i < tokens; ++i)
        if (slots[i] < -1 || slots[i] >= num_slots) return i;
    return -1;
}

static PyObject *store_kv(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long key, value, k_cache, v_cache, slots;
    long long key_stride, value_stride, tokens, row_bytes, num_slots;
    int threads;
    if (!PyArg_ParseTuple(args, "KKLLKKKLLLi", &key, &value, &key_stride, &value_stride, &k_cache, &v_cache, &slots,
                          &tokens, &row_bytes, &num_slots, &threads))
        return NULL;
    /* Token i's key and value rows (row_bytes each, contiguous) to slot slots[i]; slot -1 (padding) is
     * skipped. Every slot is checked first: one outside the cache writes nothing. */
    const Scatter m = {PTR(key), PTR(value), PTR(k_cache), PTR(v_cache), PTR(slots), key_stride, value_stride,
                       tokens, row_bytes};
    int64_t bad;
    Py_BEGIN_ALLOW_THREADS bad = bad_slot(m.slots, tokens, num_slots);
    if (bad < 0) over_rows(OP_SCATTER, DTYPE_F32, &m, tokens, 2 * row_bytes, threads);
    Py_END_ALLOW_THREADS if (bad >= 0) {
        PyErr_Format(PyExc_ValueError, "slot_mapping values must lie in [-1, %lld), got %lld for token %lld",
                     num_slots, (long long)((const int64_t *)PTR(slots))[bad], (long long)bad);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"use_openmp", use_openmp, METH_VARARGS, USE_OPENMP_DOC},
    {"simd", simd, METH_VARARGS, SIMD_DOC},
    {"dtypes", dtypes, METH_NOARGS, "dtypes() -> (float32, bfloat16): whether this CPU runs the vector ops"},
    {"rms_norm", rms_norm, METH_VARARGS,
     "rms_norm(x, residual, weight, out, residual_out, rows, hidden, x_stride, residual_stride, eps, dtype, threads): "
     "residual 0 for none; pointers and sizes already checked by folio.kernels.fused_cpu"},
    {"silu_and_mul", silu_and_mul, METH_VARARGS, "silu_and_mul(gate_up, stride, out, rows, width, dtype, threads)"},
    {"rotary_neox", rotary_neox, METH_VARARGS,
     "rotary_neox(x, cos, sin, tokens, heads, token_stride, head_stride, cs_stride, half, dtype, threads): in place"},
    {"argmax_rows", argmax_rows, METH_VARARGS,
     "argmax_rows(x, stride, out, rows, cols, dtype): out int64 [rows]; cols >= 1"},
    {"reaching_rows", reaching_rows, METH_VARARGS,
     "reaching_rows(x, stride, floor, slope, col, rel, rows, cols, idx, cap, counts, dtype): floor and slope "
     "float32 [rows], col float32 [cols], idx int64 [rows, cap], counts int64 [rows]"},
    {"bitmask_rows", bitmask_rows_py, METH_VARARGS,
     "bitmask_rows(x, stride, mask, mask_stride, rows, num_rows, cols): x float32, mask int32 words, rows int64; "
     "in place"},
    {"store_kv", store_kv, METH_VARARGS,
     "store_kv(key, value, key_stride, value_stride, k_cache, v_cache, slots, tokens, row_bytes, num_slots, threads): "
     "strides in bytes, slots int64"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_cpu_fused", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__cpu_fused(void) { return PyModule_Create(&module); }
