/* Paged decode attention for the CPU: one query token per sequence, read straight from the paged cache.
 *
 * The PyTorch path has to gather each sequence's K/V blocks into a dense buffer before attention can run,
 * which writes and re-reads the whole context on every layer of every step; this kernel reads each cached
 * row once, in place. The layout is folio.kernels.layout's: k_cache/v_cache are contiguous
 * [num_blocks, block_size, kv_heads, head_dim]; token t of sequence b lives in slot
 * block_tables[b][t / block_size] * block_size + t % block_size. Query head h reads KV head h / group.
 * With a sliding window W > 0 a query reads only its sequence's last W tokens (W = 0: the whole context).
 *
 * Per sequence: scores for every head while walking the keys once, an exact two-pass softmax in float32, then
 * the weighted sum of values walking them once. A head_dim that is a multiple of the vector width runs a vector
 * path (paged_decode_simd.h) built for AVX-512 and for AVX2, whichever the CPU has (bfloat16 widened to
 * float32 as it is loaded); other head_dims and CPUs a portable path the compiler vectorizes for
 * AVX-512/AVX2/baseline. Sequences are split across threads by context length, on torch's
 * own OpenMP workers when the wrapper finds them (else pthreads); with at most half as many sequences as
 * threads, the vector path splits each context into runs of keys, one thread each, and merges their partial
 * softmaxes after (flash-decoding): one long chat no longer decodes on one core. The GIL is released while it runs.
 * Single-core speed is bounded by memory: K/V are read once, nothing is written but the output.
 *
 * A verify step (speculative decoding) lays a sequence's positions out as consecutive rows over one block
 * table, each a token longer than the one before. The vector path attends to such rows as one bundle
 * (bundle_rows): page by page, every row scores the page while it is in L1, so the context comes from memory
 * once for all of them rather than once a row; each row still reads only its own keys, with the same sums as
 * alone. With fewer bundles than threads (one client speculating) a bundle's rows are cut into pieces, a
 * thread each, instead of splitting its context.
 *
 * No torch headers: the Python wrapper (folio.kernels.decode_attention_cpu) checks shapes, dtypes and
 * strides and passes data pointers, so this builds as a plain C extension in a second.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_simd_width.h"
#include "cpu_team.h"
#include "cpu_vec.h"

typedef struct {
    const void *q, *k_cache, *v_cache;
    const int32_t *block_tables, *context_lens;
    void *out;
    int64_t heads, kv_heads, head_dim, block_size, table_stride, num_blocks;
    int64_t q_stride_b, q_stride_h, out_stride_b, out_stride_h;  /* in elements */
    float scale;
    int dtype;
    int64_t window; /* 0: full attention */
    /* bundle g: rows [bundle_start[g], bundle_start[g + 1]), which share one context (bundle_rows) */
    const int64_t *bundle_start;
    int64_t max_bundle_rows;
} Problem;

typedef struct {
    const Problem *p;
    int64_t first, last; /* bundles [first, last) on the vector path, rows on the portable one */
    int64_t max_len;
    int failed; /* FAIL_* */
    /* one part of a split context (first + 1 == last): keys [lo, end) of bundle `first`, its results into
     * `partial` (per row, each head's maximum, exp-sum, unnormalized values: PART_FLOATS); NULL: whole ones */
    int64_t lo, end;
    float *partial;
} Work;

enum { FAIL_NONE = 0, FAIL_MEMORY = 1, FAIL_BLOCK = 2, FAIL_LENGTH = 3 };

/* exp(x) for x <= 0 (softmax arguments once the max is subtracted), in a form the compiler vectorizes. */
static inline float exp_nonpositive(float x) {
    if (x < -87.0f) return 0.0f;
    float n;
    const float y = exp_mantissa(x, &n);
    return y * pow2i((int32_t)n);
}

/* One row of `dim` values as float32: a pointer into the cache, or bf16 widened into `tmp`. */
static inline const float *as_f32(int dtype, const void *base, int64_t offset, int64_t dim, float *tmp) {
    if (dtype == DTYPE_F32) return (const float *)base + offset;
    const uint16_t *src = (const uint16_t *)base + offset;
    for (int64_t d = 0; d < dim; ++d) tmp[d] = bf16_to_f32(src[d]);
    return tmp;
}

/* Lane-parallel partial sums reduced as a tree: vector FMAs and a few shuffles, not a serial chain of adds. */
static inline __attribute__((always_inline)) float dot(const float *a, const float *b, const int64_t n) {
    float lanes[16] = {0};
    int64_t d = 0;
    for (; d + 16 <= n; d += 16)
        for (int j = 0; j < 16; ++j) lanes[j] += a[d + j] * b[d + j];
    for (int w = 8; w > 0; w >>= 1)
        for (int j = 0; j < w; ++j) lanes[j] += lanes[j + w];
    float s = lanes[0];
    for (; d < n; ++d) s += a[d] * b[d];
    return s;
}

/* The first position a query at the end of a context of `end` tokens reads. */
static inline int64_t first_key(const Problem *p, int64_t end) {
    return p->window > 0 && end > p->window ? end - p->window : 0;
}

/* The keys of [lo, end) that row b attends to: none past its own context, none before its window. */
static inline void row_keys(const Problem *p, int64_t b, int64_t lo, int64_t end, int64_t *row_lo,
                            int64_t *row_end) {
    const int64_t len = p->context_lens[b], first = first_key(p, len);
    *row_lo = first > lo ? first : lo;
    *row_end = len < end ? len : end;
}

/* A part's results for one row: each head's score maximum and exp-sum, then its unnormalized weighted values. */
#define PART_FLOATS(p) (2 * (p)->heads + (p)->heads * (p)->head_dim)

/* One sequence. Inlined into per-head_dim entry points below, so that common sizes get fully unrolled loops. */
static inline __attribute__((always_inline)) int attend_seq(const Problem *p, int64_t b, const int64_t dim,
                                                             float *scores, float *acc, float *qs, float *tmp) {
    const int64_t heads = p->heads, kv_heads = p->kv_heads, bs = p->block_size, dtype = p->dtype;
    const int64_t group = heads / kv_heads, row = kv_heads * dim, end = p->context_lens[b];
    const int64_t lo = first_key(p, end), len = end - lo; /* keys lo .. end-1; scores are indexed from lo */
    const int32_t *table = p->block_tables + b * p->table_stride;
    for (int64_t i = lo / bs; i * bs < end; ++i) /* a bad block id would read outside the cache */
        if (table[i] < 0 || table[i] >= p->num_blocks) return FAIL_BLOCK;

    for (int64_t h = 0; h < heads; ++h) { /* the scale goes into q once, not into every score */
        const float *qh = as_f32(dtype, p->q, b * p->q_stride_b + h * p->q_stride_h, dim, tmp);
        for (int64_t d = 0; d < dim; ++d) qs[h * dim + d] = qh[d] * p->scale;
    }
    memset(acc, 0, sizeof(float) * heads * dim);

    /* pass 1: every head's score for every key, walking the keys once (a token's keys for all KV heads are
     * one contiguous row; the query heads of a KV head share its load) */
    for (int64_t start = lo; start < end;) {
        const int64_t off = start % bs, n = end - start < bs - off ? end - start : bs - off;
        const int64_t base = (int64_t)table[start / bs] * bs * row + off * row;
        for (int64_t t = 0; t < n; ++t) {
            for (int64_t kvh = 0; kvh < kv_heads; ++kvh) {
                const float *k = as_f32(dtype, p->k_cache, base + t * row + kvh * dim, dim, tmp);
                for (int64_t g = 0; g < group; ++g) {
                    const int64_t h = kvh * group + g;
                    scores[h * len + start - lo + t] = dot(qs + h * dim, k, dim);
                }
            }
        }
        start += n;
    }
    /* softmax per head, in place; 1/sum is applied to the output at the end */
    for (int64_t h = 0; h < heads; ++h) {
        float *s = scores + h * len, m = -INFINITY, sum = 0.0f;
        for (int64_t l = 0; l < len; ++l) m = s[l] > m ? s[l] : m;
#pragma omp simd reduction(+ : sum)
        for (int64_t l = 0; l < len; ++l) {
            s[l] = exp_nonpositive(s[l] - m);
            sum += s[l];
        }
        qs[h] = 1.0f / sum; /* qs is free now: it keeps the normalizers */
    }
    /* pass 2: the weighted values, walking the values once */
    for (int64_t start = lo; start < end;) {
        const int64_t off = start % bs, n = end - start < bs - off ? end - start : bs - off;
        const int64_t base = (int64_t)table[start / bs] * bs * row + off * row;
        for (int64_t t = 0; t < n; ++t) {
            for (int64_t kvh = 0; kvh < kv_heads; ++kvh) {
                const float *v = as_f32(dtype, p->v_cache, base + t * row + kvh * dim, dim, tmp);
                for (int64_t g = 0; g < group; ++g) {
                    const int64_t h = kvh * group + g;
                    const float w = scores[h * len + start - lo + t];
                    float *a = acc + h * dim;
#pragma omp simd
                    for (int64_t d = 0; d < dim; ++d) a[d] += w * v[d];
                }
            }
        }
        start += n;
    }
    for (int64_t h = 0; h < heads; ++h) {
        const float norm = len > 0 ? qs[h] : 0.0f; /* an empty context gives zeros, as the layout says */
        const int64_t o = b * p->out_stride_b + h * p->out_stride_h;
        for (int64_t d = 0; d < dim; ++d) {
            const float x = acc[h * dim + d] * norm;
            if (dtype == DTYPE_F32) ((float *)p->out)[o + d] = x;
            else ((uint16_t *)p->out)[o + d] = f32_to_bf16(x);
        }
    }
    return FAIL_NONE;
}

HOT static int attend_64(const Problem *p, int64_t b, float *s, float *a, float *q, float *t) {
    return attend_seq(p, b, 64, s, a, q, t);
}
HOT static int attend_128(const Problem *p, int64_t b, float *s, float *a, float *q, float *t) {
    return attend_seq(p, b, 128, s, a, q, t);
}
HOT static int attend_any(const Problem *p, int64_t b, float *s, float *a, float *q, float *t) {
    return attend_seq(p, b, p->head_dim, s, a, q, t);
}

/* FOLIO_PORTABLE_ONLY and FOLIO_NO_PREFETCH build the variants bench/decode_attention_cpu.py compares. */
#if defined(FOLIO_X86) && !defined(FOLIO_PORTABLE_ONLY)
#define HAVE_VECTOR_PATH 1

/* A sequence's K and V rows as one stream of bytes (its keys' rows, then its values' rows, in token order) and
 * how much of it has been prefetched. Pages sit anywhere in the cache, so the hardware prefetcher starts over on
 * each and, left to itself, the kernel waits on DRAM for most of its time. While one sequence runs, the next
 * one's stream is asked for a slice at a time in step with the work done: misses stay in flight all along,
 * rather than in bursts the miss queues cannot hold. */
typedef struct {
    const Problem *p;
    int64_t b, lo, end; /* sequence b, keys lo .. end-1 */
    int64_t row_bytes, bytes, issued;
} Ahead;

static inline void ahead_start(Ahead *a, const Problem *p, int64_t b, int64_t lo, int64_t end, int64_t elem) {
    const int64_t row_bytes = p->kv_heads * p->head_dim * elem;
    *a = (Ahead){p, b, lo, end, row_bytes, 2 * (end - lo) * row_bytes, 0};
}

/* Prefetches the stream up to byte `upto`. Block ids are not checked yet (attend checks them before it reads):
 * a prefetch of a bad address is dropped, never a fault, so addresses are formed as integers. */
__attribute__((always_inline)) static inline void ahead_upto(Ahead *a, int64_t upto) {
#ifndef FOLIO_NO_PREFETCH
    const Problem *p = a->p;
    const int64_t half = a->bytes / 2, bs = p->block_size;
    const int32_t *table = p->block_tables + a->b * p->table_stride;
    while (a->issued < upto) {
        const int64_t pos = a->issued < half ? a->issued : a->issued - half;
        const uintptr_t cache = (uintptr_t)(a->issued < half ? p->k_cache : p->v_cache);
        const int64_t token = a->lo + pos / a->row_bytes, block = token / bs;
        const int64_t run_end = (block + 1) * bs < a->end ? (block + 1) * bs : a->end; /* contiguous to here */
        int64_t n = (run_end - token) * a->row_bytes - pos % a->row_bytes;
        n = n < upto - a->issued ? n : upto - a->issued;
        const uintptr_t at = cache + (uintptr_t)(((int64_t)table[block] * bs + token % bs) * a->row_bytes +
                                                 pos % a->row_bytes);
        for (int64_t i = 0; i < n; i += 64) _mm_prefetch((const char *)(at + i), _MM_HINT_T1);
        _mm_prefetch((const char *)(at + n - 1), _MM_HINT_T1);
        a->issued += n;
    }
#else
    (void)a, (void)upto;
#endif
}

/* Vectors of queries (pass 1) or accumulators (pass 2) one walk over a KV head's rows holds in registers: in
 * bfloat16 the query heads of a group share each key and value row, loaded and widened once per walk for as
 * many of them as fit (four at head_dim 64 with AVX-512, two at 128). */
#define GROUP_VECS 16

/* The query heads one walk takes from head h0 on: up to `per`, never past the end of h0's group. */
static inline int64_t heads_in_walk(int64_t h0, int64_t group, int64_t per) {
    const int64_t left = group - h0 % group;
    return left < per ? left : per;
}

typedef int (*attend_vec_fn)(const Problem *, int64_t, int64_t, int64_t, int64_t, float *, float *, Ahead *,
                             float *);

#define FOLIO_SIMD 512
#include "cpu_simd.h"
#include "paged_decode_simd.h"
#undef FOLIO_SIMD
#define FOLIO_SIMD 256
#include "cpu_simd.h"
#include "paged_decode_simd.h"

/* The vector path for this problem on this CPU, or NULL (the portable path). */
static attend_vec_fn pick_vector(const Problem *p) {
    const int width = simd_width();
    if (width == 512 && p->head_dim % 16 == 0 && p->head_dim <= 256) return pick_attend_avx512(p);
    if (width >= 256 && p->head_dim % 8 == 0 && p->head_dim <= 256) return pick_attend_avx2(p);
    return NULL;
}
#endif

/* The keys [lo, end) a share reads of bundle g: its part of a split context, or all of them (the bundle's rows
 * ascend in length: its first row's window starts first, its last row's context ends last). */
static inline void keys_of(const Work *w, int64_t g, int64_t *lo, int64_t *end) {
    if (w->partial) {
        *lo = w->lo, *end = w->end;
        return;
    }
    const Problem *p = w->p;
    *end = p->context_lens[p->bundle_start[g + 1] - 1];
    *lo = first_key(p, p->context_lens[p->bundle_start[g]]);
}

/* A thread's scratch memory, kept from call to call (freed when the thread exits): the scores of a bundle of
 * verify rows pass glibc's mmap threshold, and memory mapped afresh for every layer of every step faults in
 * page by page. */
typedef struct {
    float *data;
    size_t floats;
} Scratch;
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *arg) {
    Scratch *s = (Scratch *)arg;
    free(s->data);
    free(s);
}
static void scratch_init(void) { (void)pthread_key_create(&scratch_key, scratch_free); }

static float *scratch(size_t floats) {
    (void)pthread_once(&scratch_once, scratch_init);
    Scratch *s = (Scratch *)pthread_getspecific(scratch_key);
    if (!s) {
        if (!(s = calloc(1, sizeof(Scratch)))) return NULL;
        if (pthread_setspecific(scratch_key, s)) {
            free(s);
            return NULL;
        }
    }
    if (s->floats < floats) {
        free(s->data);
        s->data = malloc(sizeof(float) * floats);
        s->floats = s->data ? floats : 0;
    }
    return s->data;
}

static void *run_work(void *arg) {
    Work *w = (Work *)arg;
    const Problem *p = w->p;
    /* scores [rows, heads, max_len], acc [heads, dim], scaled q or norms [max(dim, rows), heads], one widened
     * row [dim] */
    const size_t rows = (size_t)p->max_bundle_rows, dim = (size_t)p->head_dim;
    const size_t floats = (size_t)p->heads * (rows * (size_t)w->max_len + dim + (dim > rows ? dim : rows)) + dim;
    float *buf = scratch(floats ? floats : 1);
    if (!buf) {
        w->failed = FAIL_MEMORY;
        return NULL;
    }
    float *scores = buf, *acc = scores + rows * p->heads * w->max_len, *qs = acc + p->heads * p->head_dim;
    float *tmp = qs + p->heads * (dim > rows ? dim : rows);
#ifdef HAVE_VECTOR_PATH
    const attend_vec_fn fast = pick_vector(p);
    if (fast) {
        const int64_t elem = p->dtype == DTYPE_BF16 ? 2 : 4;
        const int64_t *starts = p->bundle_start;
        Ahead next;
        for (int64_t g = w->first; g < w->last && !w->failed; ++g) {
            int64_t lo, end;
            keys_of(w, g, &lo, &end);
            if (g == w->first) { /* nothing ran before the first: its own rows are asked for at once */
                ahead_start(&next, p, starts[g], lo, end, elem);
                ahead_upto(&next, next.bytes);
            }
            if (g + 1 < w->last) {
                int64_t next_lo, next_end;
                keys_of(w, g + 1, &next_lo, &next_end);
                ahead_start(&next, p, starts[g + 1], next_lo, next_end, elem);
            } else {
                next.bytes = next.issued = 0;
            }
            w->failed = fast(p, starts[g], starts[g + 1] - starts[g], lo, end, scores, qs, &next, w->partial);
        }
        return NULL;
    }
#endif
    int (*attend)(const Problem *, int64_t, float *, float *, float *, float *) =
        p->head_dim == 64 ? attend_64 : p->head_dim == 128 ? attend_128 : attend_any;
    for (int64_t b = w->first; b < w->last && !w->failed; ++b) w->failed = attend(p, b, scores, acc, qs, tmp);
    return NULL;
}

/* Below this many (query head x key) pairs, about 10 us of work, waking a thread of the pool costs more than it
 * saves. (At 32768, SmolLM2's 16 sequences of 200 tokens ran on one thread of two: 30 layers 9.7 ms, not 4.8;
 * bench/decode_attention_cpu.py --split.) */
#ifndef MIN_PAIRS_PER_THREAD
#define MIN_PAIRS_PER_THREAD 1024
#endif

/* Row b's output from its `parts` parts, `stride` floats apart (flash-decoding's merge): each part's values
 * and exp-sum rescaled from its own maximum to the overall one, summed, then normalized once. */
static void merge_parts(const Problem *p, int64_t b, const float *partial, int64_t parts, int64_t stride) {
    const int64_t heads = p->heads, dim = p->head_dim;
    for (int64_t h = 0; h < heads; ++h) {
        float m = -INFINITY, sum = 0.0f, scale[MAX_THREADS];
        for (int64_t i = 0; i < parts; ++i) m = fmaxf(m, partial[i * stride + h]);
        for (int64_t i = 0; i < parts; ++i) {
            scale[i] = expf(partial[i * stride + h] - m);
            sum += scale[i] * partial[i * stride + heads + h];
        }
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f; /* an empty context gives zeros */
        float x[256] = {0}; /* head_dim <= 256: parts run on the vector path only */
        for (int64_t i = 0; i < parts; ++i) { /* part by part, so that the sums over dim vectorize */
            const float s = scale[i] * inv, *values = partial + i * stride + 2 * heads + h * dim;
#pragma omp simd
            for (int64_t d = 0; d < dim; ++d) x[d] += s * values[d];
        }
        const int64_t o = b * p->out_stride_b + h * p->out_stride_h;
        for (int64_t d = 0; d < dim; ++d) {
            if (p->dtype == DTYPE_F32) ((float *)p->out)[o + d] = x[d];
            else ((uint16_t *)p->out)[o + d] = f32_to_bf16(x[d]);
        }
    }
}

/* At most half as many bundles as threads: each context in `parts` runs of keys, a thread each, merged after.
 * Only on the vector path, for contexts long enough that each part is worth a thread. A bundle's part holds
 * each of its rows' results in turn; row b's results of its parts lie `rows` results apart. */
static int run_split(const Problem *p, int64_t bundles, int64_t batch, int threads) {
    const int64_t *starts = p->bundle_start, floats = PART_FLOATS(p);
    int64_t parts = threads / bundles, max_part = 0;
    for (int64_t g = 0; g < bundles; ++g) {
        const int64_t len = p->context_lens[starts[g + 1] - 1] - first_key(p, p->context_lens[starts[g]]);
        const int64_t useful = len * p->heads * (starts[g + 1] - starts[g]) / MIN_PAIRS_PER_THREAD;
        parts = useful < parts ? useful : parts;
    }
    if (parts < 2) return -1; /* not worth it: the caller runs whole bundles */
    float *partial = malloc(sizeof(float) * (size_t)(batch * parts * floats));
    if (!partial) return FAIL_MEMORY;
    Work work[MAX_THREADS];
    for (int64_t g = 0; g < bundles; ++g) {
        const int64_t rows = starts[g + 1] - starts[g], lo = first_key(p, p->context_lens[starts[g]]);
        const int64_t len = p->context_lens[starts[g + 1] - 1] - lo;
        for (int64_t i = 0; i < parts; ++i) {
            const int64_t from = lo + len * i / parts, to = lo + len * (i + 1) / parts;
            max_part = to - from > max_part ? to - from : max_part;
            work[g * parts + i] = (Work){p, g, g + 1, 0, FAIL_NONE, from, to,
                                         partial + (starts[g] * parts + i * rows) * floats};
        }
    }
    for (int64_t i = 0; i < bundles * parts; ++i) work[i].max_len = max_part;
    run_shares(run_work, work, sizeof(Work), (int)(bundles * parts));
    int failed = FAIL_NONE;
    for (int64_t i = 0; i < bundles * parts && !failed; ++i) failed = work[i].failed;
    for (int64_t g = 0; g < bundles && !failed; ++g) {
        const int64_t rows = starts[g + 1] - starts[g];
        for (int64_t r = 0; r < rows; ++r)
            merge_parts(p, starts[g] + r, partial + (starts[g] * parts + r) * floats, parts, rows * floats);
    }
    free(partial);
    return failed;
}

/* Rows the vector path attends to as one bundle: they read one context, so each page is loaded once for all of
 * them. A verify step lays a sequence's positions out as consecutive rows of ascending length over one block
 * table. Row b joins the bundle that row `first` opened when its context is at least as long and its blocks
 * are the same as `first`'s as far as its context reaches (then `first`'s table covers the whole bundle, and
 * each row reads its own tokens). */
#define MAX_BUNDLE_ROWS 32
static int bundle_rows(const Problem *p, int64_t first, int64_t b) {
    const int64_t len = p->context_lens[b];
    if (b - first >= MAX_BUNDLE_ROWS || len < p->context_lens[b - 1] || p->context_lens[first] == 0) return 0;
    const int32_t *a = p->block_tables + first * p->table_stride, *t = p->block_tables + b * p->table_stride;
    return memcmp(a, t, sizeof(int32_t) * (size_t)((len + p->block_size - 1) / p->block_size)) == 0;
}

static int run_bundles(const Problem *p, int64_t bundles, int64_t batch, int threads) {
    const int64_t *starts = p->bundle_start;
    int64_t total = 0, max_len = 0;
    for (int64_t g = 0; g < bundles; ++g) {
        const int64_t len = p->context_lens[starts[g + 1] - 1] - first_key(p, p->context_lens[starts[g]]);
        max_len = len > max_len ? len : max_len;
        for (int64_t b = starts[g]; b < starts[g + 1]; ++b) /* keys it reads */
            total += p->context_lens[b] - first_key(p, p->context_lens[b]);
    }
    if (threads > MAX_THREADS) threads = MAX_THREADS;
#if defined(HAVE_VECTOR_PATH) && !defined(FOLIO_NO_CONTEXT_SPLIT) /* the switch: bench/decode_attention_cpu.py */
    if (bundles > 0 && 2 * bundles <= threads && pick_vector(p)) {
        const int rc = run_split(p, bundles, batch, threads);
        if (rc >= 0) return rc;
    }
#endif
    int64_t useful = total * p->heads / MIN_PAIRS_PER_THREAD;
    if (threads > useful) threads = useful > 1 ? (int)useful : 1;
    if (threads > bundles) threads = (int)(bundles > 0 ? bundles : 1);

    Work work[MAX_THREADS];
    int64_t g = 0, seen = 0;
    for (int i = 0; i < threads; ++i) { /* contiguous ranges of about equal total context */
        work[i] = (Work){p, g, g, max_len, FAIL_NONE, 0, 0, NULL};
        const int64_t goal = total * (i + 1) / threads;
        while (g < bundles) { /* a bundle goes where most of it falls */
            int64_t keys = 0;
            for (int64_t b = starts[g]; b < starts[g + 1]; ++b)
                keys += p->context_lens[b] - first_key(p, p->context_lens[b]);
            if (i < threads - 1 && g > work[i].first && 2 * seen + keys > 2 * goal) break;
            seen += keys;
            ++g;
        }
        work[i].last = g;
    }
    run_shares(run_work, work, sizeof(Work), threads);
    int failed = FAIL_NONE;
    for (int i = 0; i < threads && !failed; ++i) failed = work[i].failed;
    return failed;
}

static int run(const Problem *p, int64_t batch, int threads, int64_t capacity) {
    for (int64_t b = 0; b < batch; ++b) /* a longer context would read past its block table */
        if (p->context_lens[b] < 0 || p->context_lens[b] > capacity) return FAIL_LENGTH;
    int64_t *const first = malloc(sizeof(int64_t) * (size_t)(2 * batch + 2)); /* bundles, then their pieces */
    if (!first) return FAIL_MEMORY;
    int64_t *starts = first;
    int bundled = 0; /* only the vector path reads a bundle's pages once; the portable one goes row by row */
#ifdef HAVE_VECTOR_PATH
    bundled = pick_vector(p) != NULL;
#endif
    Problem bundles = *p;
    int64_t count = 0;
    for (int64_t b = 0; b < batch; ++b)
        if (!bundled || b == 0 || !bundle_rows(p, starts[count - 1], b)) starts[count++] = b;
    starts[count] = batch;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (count > 0 && 2 * count <= threads && count < batch) {
        /* fewer bundles than threads (one client speculating): each bundle's rows in as many pieces, a thread
         * each, every piece reading the context once (a split context would merge each row's parts after) */
        int64_t *cut = first + batch + 1, pieces = 0;
        const int64_t share = threads / count;
        for (int64_t g = 0; g < count; ++g) {
            const int64_t rows = starts[g + 1] - starts[g], n = rows < share ? rows : share;
            for (int64_t i = 0; i < n; ++i) cut[pieces++] = starts[g] + rows * i / n;
        }
        cut[pieces] = batch;
        starts = cut, count = pieces;
    }
    for (int64_t g = 0; g < count; ++g) {
        const int64_t rows = starts[g + 1] - starts[g];
        bundles.max_bundle_rows = rows > bundles.max_bundle_rows ? rows : bundles.max_bundle_rows;
    }
    bundles.bundle_start = starts;
    const int rc = run_bundles(&bundles, count, batch, threads);
    free(first);
    return rc;
}

static PyObject *paged_decode(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long q, k_cache, v_cache, tables, lens, out;
    long long batch, heads, kv_heads, head_dim, block_size, num_blocks, table_stride, qsb, qsh, osb, osh, window,
        capacity;
    float scale;
    int dtype, threads;
    if (!PyArg_ParseTuple(args, "KKKKKKLLLLLLLLLLLfiiLL", &q, &k_cache, &v_cache, &tables, &lens, &out, &batch,
                          &heads, &kv_heads, &head_dim, &block_size, &num_blocks, &table_stride, &qsb, &qsh,
                          &osb, &osh, &scale, &dtype, &threads, &window, &capacity))
        return NULL;
    if (batch < 0 || heads < 1 || kv_heads < 1 || heads % kv_heads || head_dim < 1 || block_size < 1 ||
        window < 0 || (dtype != DTYPE_F32 && dtype != DTYPE_BF16)) {
        PyErr_SetString(PyExc_ValueError, "paged_decode: inconsistent problem sizes or dtype");
        return NULL;
    }
    const Problem p = {
        (const void *)(uintptr_t)q, (const void *)(uintptr_t)k_cache, (const void *)(uintptr_t)v_cache,
        (const int32_t *)(uintptr_t)tables, (const int32_t *)(uintptr_t)lens, (void *)(uintptr_t)out,
        heads, kv_heads, head_dim, block_size, table_stride, num_blocks, qsb, qsh, osb, osh, scale, dtype, window,
        NULL, 1,
    };
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = run(&p, batch, threads < 1 ? 1 : threads, capacity);
    Py_END_ALLOW_THREADS if (rc == FAIL_MEMORY) return PyErr_NoMemory();
    if (rc == FAIL_LENGTH) {
        PyErr_Format(PyExc_ValueError, "context_lens must lie in [0, %lld]", capacity);
        return NULL;
    }
    if (rc == FAIL_BLOCK) {
        PyErr_Format(PyExc_ValueError, "block_tables holds a block id outside [0, %lld) for a token in context",
                     num_blocks);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"use_openmp", use_openmp, METH_VARARGS, USE_OPENMP_DOC},
    {"simd", simd, METH_VARARGS, SIMD_DOC},
    {"paged_decode", paged_decode, METH_VARARGS,
     "paged_decode(q, k_cache, v_cache, block_tables, context_lens, out, batch, heads, kv_heads, head_dim, "
     "block_size, num_blocks, table_stride, q_stride_b, q_stride_h, out_stride_b, out_stride_h, scale, dtype, threads, "
     "window, max_context_len): "
     "pointers and sizes already checked by folio.kernels.decode_attention_cpu"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_cpu_attention", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__cpu_attention(void) { return PyModule_Create(&module); }
