/* Fused elementwise ops of the CPU decoder layer: residual add + RMSNorm, SiLU-and-multiply, the neox rotary
 * embedding in place, and the scatter of new keys and values into the paged cache; and greedy sampling's
 * argmax over a step's logits, read in the model's dtype.
 *
 * PyTorch runs each of these as two to seven ops, every one a pass over memory with its own dispatch and its
 * own temporary; on a small model's decode step, where the tensors are a few hundred kilobytes, that costs
 * more than the arithmetic. Here each op is one pass over its rows, 16 lanes at a time.
 *
 * The roundings are the engine's PyTorch path's (transformers'): bfloat16 values are widened to float32,
 * and every result PyTorch rounds to the tensor dtype is rounded here, to nearest even, at the same place.
 * Products and sums are not contracted into fused multiply-adds (the build passes -ffp-contract=off), so
 * the rotary embedding, the residual add and the KV scatter are bit-identical to PyTorch. The RMSNorm
 * statistic (another summation order) and the SiLU exponential (another polynomial) may differ from
 * PyTorch's in the last float32 bit; in bfloat16 that survives only where it crosses a rounding boundary,
 * rarely, but over a long greedy generation one such flip can change a later token.
 *
 * AVX-512 only: float32 needs AVX-512F, bfloat16 also AVX512-BF16 (its rounding instruction; without it the
 * emulated rounding makes these ops slower than PyTorch's). `dtypes()` says which this CPU runs; elsewhere
 * the engine keeps its PyTorch code. Rows are independent: an op with enough of them splits them over
 * torch's OpenMP workers (cpu_team.h), with results that do not depend on the split; a small one runs on
 * the calling thread, where a thread would cost more to start than it saves. No torch headers: the Python wrapper (folio.kernels.fused_cpu) checks shapes,
 * dtypes and strides and passes data pointers, so this builds as a plain C extension in a second.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_team.h"
#include "cpu_vec.h"

#define INLINE static inline __attribute__((always_inline))

/* Element i of a float32 or bfloat16 array as float32; `bf16` is a compile-time constant where inlined. */
INLINE float load(const void *base, int64_t i, const int bf16) {
    return bf16 ? bf16_to_f32(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

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

/* --- the kernels: 16 lanes at a time; a row's last width % 16 values take the scalar helpers above ------ */
#ifdef FOLIO_X86
/* The float32 instantiations carry the same target but hold no BF16 instruction (pack16 is reached only with
 * bf16 set), so AVX-512F alone runs them. */
#define TARGET __attribute__((target("avx512f,avx512bf16")))
#define AVX512 TARGET __attribute__((always_inline)) static inline

/* vcvtneps2bf16 rounds to nearest even as f32_to_bf16 does, NaN included, but flushes subnormals to zero:
 * the rare vector that holds one takes the integer rounding instead. */
AVX512 __m256i pack16(__m512 x) {
    const __m512i magnitude = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff));
    const __mmask16 subnormal = /* 0 < |x| < 2^-126, as unsigned integers: |x| - 1 < 0x7fffff */
        _mm512_cmplt_epu32_mask(_mm512_sub_epi32(magnitude, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fffff));
    if (__builtin_expect(subnormal != 0, 0)) return _mm512_cvtepi32_epi16(bf16_bits16(x));
    return (__m256i)_mm512_cvtneps_pbh(x);
}

/* store16 (cpu_vec.h) with the fast rounding; and x as the tensor dtype would hold it (PyTorch rounds the
 * result of every bfloat16 op). */
AVX512 void put16(void *base, int64_t i, __m512 x, const int bf16) {
    if (bf16) _mm256_storeu_si256((__m256i *)((uint16_t *)base + i), pack16(x));
    else _mm512_storeu_ps((float *)base + i, x);
}

AVX512 __m512 rnd16(__m512 x, const int bf16) {
    return bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(pack16(x)), 16)) : x;
}

/* exp_full for 16 lanes. */
AVX512 __m512 exp16_full(__m512 x) {
    __m512 n;
    const __m512 clamped = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-103.0f)), _mm512_set1_ps(89.0f));
    const __m512 y = exp_mantissa16(clamped, &n);
    const __m512i ni = _mm512_cvtps_epi32(n);
    const __m512i half = _mm512_srai_epi32(_mm512_add_epi32(ni, _mm512_srli_epi32(ni, 31)), 1); /* n / 2 as C */
    __m512 e = _mm512_mul_ps(_mm512_mul_ps(y, pow2i16(half)), pow2i16(_mm512_sub_epi32(ni, half)));
    e = _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(x, _mm512_set1_ps(88.72283935546875f), _CMP_GT_OQ),
                           _mm512_set1_ps(INFINITY));
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-103.0f), _CMP_NLT_UQ), e); /* NaN stays */
}

AVX512 void norm_rows16(const Norm *n, const int bf16) {
    const int64_t hidden = n->hidden, full = hidden / 16 * 16;
    for (int64_t row = 0; row < n->rows; ++row) {
        const int64_t xi = row * n->x_stride, oi = row * hidden;
        const void *src = n->x;
        int64_t si = xi;
        if (n->residual) {
            const int64_t ri = row * n->residual_stride;
            int64_t d = 0;
            for (; d < full; d += 16)
                put16(n->residual_out, oi + d,
                        _mm512_add_ps(load16(n->x, xi + d, bf16), load16(n->residual, ri + d, bf16)), bf16);
            for (; d < hidden; ++d)
                store(n->residual_out, oi + d, load(n->x, xi + d, bf16) + load(n->residual, ri + d, bf16), bf16);
            src = n->residual_out;
            si = oi;
        }
        __m512 acc = _mm512_setzero_ps();
        int64_t d = 0;
        for (; d < full; d += 16) {
            const __m512 v = load16(src, si + d, bf16);
            acc = _mm512_add_ps(acc, _mm512_mul_ps(v, v));
        }
        float sum = _mm512_reduce_add_ps(acc);
        for (; d < hidden; ++d) sum += load(src, si + d, bf16) * load(src, si + d, bf16);
        const float rs = 1.0f / sqrtf(sum / (float)hidden + n->eps);
        const __m512 r = _mm512_set1_ps(rs);
        for (d = 0; d < full; d += 16)
            put16(n->out, oi + d,
                    _mm512_mul_ps(rnd16(_mm512_mul_ps(load16(src, si + d, bf16), r), bf16),
                                  load16(n->weight, d, bf16)), bf16);
        for (; d < hidden; ++d)
            store(n->out, oi + d, round_to(load(src, si + d, bf16) * rs, bf16) * load(n->weight, d, bf16), bf16);
    }
}

TARGET static void norm16_f32(const Norm *n) { norm_rows16(n, 0); }
TARGET static void norm16_bf16(const Norm *n) { norm_rows16(n, 1); }

AVX512 void silu_mul_rows16(const void *gate_up, int64_t stride, void *out, int64_t rows, int64_t width,
                            const int bf16) {
    const int64_t full = width / 16 * 16;
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t row = 0; row < rows; ++row) {
        const int64_t g = row * stride, o = row * width;
        int64_t j = 0;
        for (; j < full; j += 16) {
            const __m512 x = load16(gate_up, g + j, bf16);
            const __m512 e = exp16_full(_mm512_sub_ps(_mm512_setzero_ps(), x));
            const __m512 silu = rnd16(_mm512_div_ps(x, _mm512_add_ps(one, e)), bf16);
            put16(out, o + j, _mm512_mul_ps(silu, load16(gate_up, g + width + j, bf16)), bf16);
        }
        for (; j < width; ++j) {
            const float x = load(gate_up, g + j, bf16);
            store(out, o + j, round_to(x / (1.0f + exp_full(-x)), bf16) * load(gate_up, g + width + j, bf16), bf16);
        }
    }
}

TARGET static void silu_mul16_f32(const void *gu, int64_t s, void *o, int64_t r,
                                                               int64_t w) {
    silu_mul_rows16(gu, s, o, r, w, 0);
}
TARGET static void silu_mul16_bf16(const void *gu, int64_t s, void *o, int64_t r,
                                                                int64_t w) {
    silu_mul_rows16(gu, s, o, r, w, 1);
}

AVX512 void rotate_rows16(const Rotary *p, const int bf16) {
    const int64_t half = p->half, full = half / 16 * 16;
    for (int64_t t = 0; t < p->tokens; ++t) {
        const int64_t c = t * p->cs_stride;
        for (int64_t h = 0; h < p->heads; ++h) {
            const int64_t base = t * p->token_stride + h * p->head_stride;
            int64_t j = 0;
            for (; j < full; j += 16) {
                const __m512 x1 = load16(p->x, base + j, bf16), x2 = load16(p->x, base + half + j, bf16);
                const __m512 cs = load16(p->cos, c + j, bf16), sn = load16(p->sin, c + j, bf16);
                put16(p->x, base + j, _mm512_sub_ps(rnd16(_mm512_mul_ps(x1, cs), bf16),
                                                      rnd16(_mm512_mul_ps(x2, sn), bf16)), bf16);
                put16(p->x, base + half + j, _mm512_add_ps(rnd16(_mm512_mul_ps(x2, cs), bf16),
                                                             rnd16(_mm512_mul_ps(x1, sn), bf16)), bf16);
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

TARGET static void rotate16_f32(const Rotary *p) { rotate_rows16(p, 0); }
TARGET static void rotate16_bf16(const Rotary *p) { rotate_rows16(p, 1); }

/* The index of each row's first maximum, as torch's max(dim=-1) gives it: a NaN counts as the maximum (the
 * first NaN wins). One pass finds the maximum (and whether there is a NaN), a second finds where it first
 * is; a row of logits fits in L2, so the second pass reads no DRAM. bfloat16 compares exactly as float32. */
AVX512 void argmax_rows16(const void *x, int64_t stride, int64_t *out, int64_t rows, int64_t cols, const int bf16) {
    const int64_t full = cols / 16 * 16;
    for (int64_t row = 0; row < rows; ++row) {
        const int64_t base = row * stride;
        __m512 m = _mm512_set1_ps(-INFINITY);
        __mmask16 nan = 0;
        int64_t j = 0;
        for (; j < full; j += 16) {
            const __m512 v = load16(x, base + j, bf16);
            nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            m = _mm512_max_ps(m, v);
        }
        float best = _mm512_reduce_max_ps(m);
        int has_nan = nan != 0;
        for (; j < cols; ++j) {
            const float v = load(x, base + j, bf16);
            has_nan |= v != v;
            best = v > best ? v : best;
        }
        const __m512 target = _mm512_set1_ps(best);
        int64_t at = -1;
        for (j = 0; j < full && at < 0; j += 16) {
            const __m512 v = load16(x, base + j, bf16);
            const __mmask16 hit = has_nan ? _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)
                                          : _mm512_cmp_ps_mask(v, target, _CMP_EQ_OQ);
            if (hit) at = j + __builtin_ctz(hit);
        }
        for (j = full; j < cols && at < 0; ++j) {
            const float v = load(x, base + j, bf16);
            if (has_nan ? v != v : v == best) at = j;
        }
        out[row] = at;
    }
}

TARGET static void argmax16_f32(const void *x, int64_t s, int64_t *o, int64_t r, int64_t c) {
    argmax_rows16(x, s, o, r, c, 0);
}
TARGET static void argmax16_bf16(const void *x, int64_t s, int64_t *o, int64_t r, int64_t c) {
    argmax_rows16(x, s, o, r, c, 1);
}
#endif

/* --- Python entry points ----------------------------------------------------------------------------- */

#define PTR(x) ((void *)(uintptr_t)(x))

typedef void (*norm_fn)(const Norm *);
typedef void (*silu_mul_fn)(const void *, int64_t, void *, int64_t, int64_t);
typedef void (*rotate_fn)(const Rotary *);
typedef void (*argmax_fn)(const void *, int64_t, int64_t *, int64_t, int64_t);
/* Indexed by dtype code; NULL where this CPU lacks the instructions (set when the module loads). */
static norm_fn norm_kernels[2];
static silu_mul_fn silu_mul_kernels[2];
static rotate_fn rotate_kernels[2];
static argmax_fn argmax_kernels[2];

static int runs(int dtype) {
    if ((dtype == DTYPE_F32 || dtype == DTYPE_BF16) && norm_kernels[dtype]) return 1;
    PyErr_Format(PyExc_ValueError, "folio.kernels._cpu_fused has no kernel for dtype code %d on this CPU "
                                   "(see dtypes())", dtype);
    return 0;
}

static PyObject *dtypes(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    return Py_BuildValue("(OO)", norm_kernels[DTYPE_F32] ? Py_True : Py_False,
                         norm_kernels[DTYPE_BF16] ? Py_True : Py_False);
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
        norm_kernels[r->dtype](&m);
        break;
    }
    case OP_SILU_MUL: {
        const SiluMul *m = (const SiluMul *)r->problem;
        silu_mul_kernels[r->dtype](AT(m->gate_up, a * m->stride, size), m->stride, AT(m->out, a * m->width, size), n,
                                   m->width);
        break;
    }
    case OP_ROTATE: {
        Rotary m = *(const Rotary *)r->problem;
        m.x = AT(m.x, a * m.token_stride, size), m.cos = AT(m.cos, a * m.cs_stride, size);
        m.sin = AT(m.sin, a * m.cs_stride, size), m.tokens = n;
        rotate_kernels[r->dtype](&m);
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
    Py_BEGIN_ALLOW_THREADS argmax_kernels[dtype](PTR(x), stride, PTR(out), rows, cols);
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
    {"dtypes", dtypes, METH_NOARGS, "dtypes() -> (float32, bfloat16): whether this CPU runs the vector ops"},
    {"rms_norm", rms_norm, METH_VARARGS,
     "rms_norm(x, residual, weight, out, residual_out, rows, hidden, x_stride, residual_stride, eps, dtype, threads): "
     "residual 0 for none; pointers and sizes already checked by folio.kernels.fused_cpu"},
    {"silu_and_mul", silu_and_mul, METH_VARARGS, "silu_and_mul(gate_up, stride, out, rows, width, dtype, threads)"},
    {"rotary_neox", rotary_neox, METH_VARARGS,
     "rotary_neox(x, cos, sin, tokens, heads, token_stride, head_stride, cs_stride, half, dtype, threads): in place"},
    {"argmax_rows", argmax_rows, METH_VARARGS,
     "argmax_rows(x, stride, out, rows, cols, dtype): out int64 [rows]; cols >= 1"},
    {"store_kv", store_kv, METH_VARARGS,
     "store_kv(key, value, key_stride, value_stride, k_cache, v_cache, slots, tokens, row_bytes, num_slots, threads): "
     "strides in bytes, slots int64"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_cpu_fused", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__cpu_fused(void) {
#ifdef FOLIO_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        norm_kernels[DTYPE_F32] = norm16_f32, silu_mul_kernels[DTYPE_F32] = silu_mul16_f32;
        rotate_kernels[DTYPE_F32] = rotate16_f32, argmax_kernels[DTYPE_F32] = argmax16_f32;
    }
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16")) {
        norm_kernels[DTYPE_BF16] = norm16_bf16, silu_mul_kernels[DTYPE_BF16] = silu_mul16_bf16;
        rotate_kernels[DTYPE_BF16] = rotate16_bf16, argmax_kernels[DTYPE_BF16] = argmax16_bf16;
    }
#endif
    return PyModule_Create(&module);
}
