/* Running a CPU kernel's shares of work in parallel, on the OpenMP runtime torch itself runs on (found by the
 * Python wrapper, folio.kernels.decode_attention_cpu) or else on plain pthreads. Running on torch's own
 * worker threads matters: torch's workers spin for a while after each op, so threads of our own would fight
 * them for the cores. Include after Python.h; each extension that includes it has its own runtime pointers,
 * set through its `use_openmp`. */
#ifndef FOLIO_CPU_TEAM_H
#define FOLIO_CPU_TEAM_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define MAX_THREADS 64

typedef void (*gomp_parallel_fn)(void (*)(void *), void *, unsigned, unsigned);
typedef int (*omp_int_fn)(void);
static gomp_parallel_fn gomp_parallel;
static omp_int_fn omp_thread_num, omp_num_threads;

typedef void *(*share_fn)(void *);

typedef struct {
    share_fn fn;
    char *shares;
    size_t size;
    int count;
} Team;

static void team_member(void *arg) { /* the team may be smaller than asked for: stride over the shares */
    const Team *team = (const Team *)arg;
    const int size = omp_num_threads();
    for (int i = omp_thread_num(); i < team->count; i += size > 0 ? size : 1)
        team->fn(team->shares + (size_t)i * team->size);
}

/* fn(&shares[i]) for each of `count` (<= MAX_THREADS) shares of `size` bytes, one thread each. */
static void run_shares(share_fn fn, void *shares, size_t size, int count) {
    char *at = (char *)shares;
    if (count > 1 && gomp_parallel) {
        Team team = {fn, at, size, count};
        gomp_parallel(team_member, &team, (unsigned)count, 0);
        return;
    }
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int i = 1; i < count; ++i) started[i] = pthread_create(&ids[i], NULL, fn, at + (size_t)i * size) == 0;
    for (int i = 1; i < count; ++i)
        if (!started[i]) fn(at + (size_t)i * size); /* could not start a thread: do its share here */
    fn(at);
    for (int i = 1; i < count; ++i)
        if (started[i]) pthread_join(ids[i], NULL);
}

static PyObject *use_openmp(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long parallel, thread_num, num_threads;
    if (!PyArg_ParseTuple(args, "KKK", &parallel, &thread_num, &num_threads)) return NULL;
    if (!parallel || !thread_num || !num_threads) {
        gomp_parallel = NULL; /* back to pthreads */
        Py_RETURN_NONE;
    }
    omp_thread_num = (omp_int_fn)(uintptr_t)thread_num;
    omp_num_threads = (omp_int_fn)(uintptr_t)num_threads;
    gomp_parallel = (gomp_parallel_fn)(uintptr_t)parallel;
    Py_RETURN_NONE;
}

#define USE_OPENMP_DOC                                                                                       \
    "use_openmp(GOMP_parallel, omp_get_thread_num, omp_get_num_threads): addresses in the OpenMP runtime to " \
    "run on (all 0: plain pthreads)"

#endif
