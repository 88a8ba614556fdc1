/* Which of cpu_simd.h's instruction sets a kernel module runs: the widest this CPU has, unless its tests ask
 * for a narrower one (through the module's `simd`) to check every path on one machine. Include after
 * Python.h; each extension has its own setting. */
#ifndef FOLIO_CPU_SIMD_WIDTH_H
#define FOLIO_CPU_SIMD_WIDTH_H

/* 512: AVX-512F; 256: AVX2 with FMA; 0: none (portable code, where the module has it). */
static int simd_best(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return 512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 256;
#endif
    return 0;
}

static int simd_chosen = -1;

static int simd_width(void) {
    if (simd_chosen < 0) simd_chosen = simd_best();
    return simd_chosen;
}

#define SIMD_DOC                                                                                            \
    "simd([width]) -> the vector width in bits the kernels run: 512 (AVX-512F), 256 (AVX2 and FMA) or 0 "   \
    "(none); given a width, runs that one from now on (at most the widest this CPU has)"

static PyObject *simd(PyObject *self, PyObject *args) {
    (void)self;
    int want = -1;
    if (!PyArg_ParseTuple(args, "|i", &want)) return NULL;
    if (want != -1) {
        if ((want != 0 && want != 256 && want != 512) || want > simd_best()) {
            PyErr_Format(PyExc_ValueError, "simd: %d is not 0, 256 or 512 up to this CPU's %d", want, simd_best());
            return NULL;
        }
        simd_chosen = want;
    }
    return PyLong_FromLong(simd_width());
}

#endif
