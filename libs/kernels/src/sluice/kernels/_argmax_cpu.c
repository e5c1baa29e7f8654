/*
 * Row-wise argmax of a float32 matrix, for greedy sampling on CPU.
 *
 * torch's argmax over the last dim runs a scalar loop (~2 cycles per logit);
 * a decode step of 64 rows over a 32k vocabulary spent ~1.5 ms there, more
 * than a layer's attention. Here each row takes two vectorised passes: the
 * max, then the first index holding it (the same tie rule as torch: lowest
 * index wins). Rows are spread over the OpenMP threads torch already runs.
 *
 * NaN: ignored by the max; a row of NaN only gives index 0. (torch would
 * return the NaN's index; either way such logits are a broken model.)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_thread_num(void) { return 0; }
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SLUICE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SLUICE_CLONES
#endif

SLUICE_CLONES
static int64_t argmax_row(const float *row, int64_t n) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < n; ++j) m = row[j] > m ? row[j] : m;
    for (int64_t j = 0; j < n; ++j)
        if (row[j] == m) return j;
    return 0;
}

static PyObject *argmax_rows_f32(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long data, out;
    long long rows, cols, row_stride;
    int num_threads;
    if (!PyArg_ParseTuple(args, "KKLLLi", &data, &out, &rows, &cols, &row_stride, &num_threads)) return NULL;
    if (rows < 0 || cols <= 0 || row_stride < cols) {
        PyErr_SetString(PyExc_ValueError, "bad argmax shape");
        return NULL;
    }
    const float *x = (const float *)(uintptr_t)data;
    int64_t *idx = (int64_t *)(uintptr_t)out;
    Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for num_threads(num_threads > 0 ? num_threads : 1) if (rows > 1) schedule(static)
    for (long long r = 0; r < rows; ++r) idx[r] = argmax_row(x + r * row_stride, cols);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}


/*
 * Greedy tokens from a bfloat16 screen of the LM head (sluice.model.greedy_head).
 *
 * For each row r: `scores` holds bf16 logits s_rv, each within margins[r]
 * of the exact logit t_rv = hidden_r . weight_v (the caller derives that
 * bound from the rounding of its inputs). Every v with s_rv >= max_v s_rv -
 * 2 margins[r] is a candidate; the exact argmax is among them, because it
 * is within one margin of its score and every score is within one margin
 * of its exact logit. The candidates' exact logits are recomputed here from
 * the float32 hidden row and weight rows, accumulated in double, and the
 * largest wins (ties to the lowest index, as argmax_rows).
 *
 * A row with more than `max_candidates` candidates, or a margin or max
 * that is not finite (NaN or inf in the inputs), gets -1: the caller then
 * computes that row's full float32 logits instead.
 */
static inline float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Scores are scanned in blocks: one vectorised pass takes each block's max,
 * and only blocks whose max reaches the floor are read again, one by one. */
#define SCREEN_BLOCK 256

SLUICE_CLONES
static float max_bf16(const uint16_t *x, int64_t n) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < n; ++j) {
        float v = bf16_to_f32(x[j]);
        m = v > m ? v : m;
    }
    return m;
}

static int64_t screened_row(const uint16_t *scores, int64_t vocab, float margin, const float *hidden,
                            const float *weight, int64_t hidden_size, int64_t max_candidates,
                            float *block_max) {
    int64_t num_blocks = (vocab + SCREEN_BLOCK - 1) / SCREEN_BLOCK;
    float best_score = -INFINITY;
    for (int64_t b = 0; b < num_blocks; ++b) {
        int64_t start = b * SCREEN_BLOCK, len = vocab - start < SCREEN_BLOCK ? vocab - start : SCREEN_BLOCK;
        block_max[b] = max_bf16(scores + start, len);
        if (block_max[b] > best_score) best_score = block_max[b];
    }
    if (!isfinite(best_score) || !isfinite(margin)) return -1;
    float floor = best_score - 2.0f * margin;
    int64_t count = 0, best = -1;
    double best_logit = -INFINITY;
    for (int64_t b = 0; b < num_blocks; ++b) {
        if (block_max[b] < floor) continue;
        int64_t end = (b + 1) * SCREEN_BLOCK < vocab ? (b + 1) * SCREEN_BLOCK : vocab;
        for (int64_t v = b * SCREEN_BLOCK; v < end; ++v) {
            if (bf16_to_f32(scores[v]) < floor) continue;
            if (++count > max_candidates) return -1;
            const float *w = weight + v * hidden_size;
            double logit = 0.0;
            for (int64_t i = 0; i < hidden_size; ++i) logit += (double)hidden[i] * (double)w[i];
            if (logit > best_logit) { /* strict: the lowest index keeps a tie */
                best_logit = logit;
                best = v;
            }
        }
    }
    return best;
}

static PyObject *screened_argmax_bf16(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long scores_p, margins_p, hidden_p, weight_p, out_p;
    long long rows, vocab, hidden_size, max_candidates;
    int num_threads;
    if (!PyArg_ParseTuple(args, "KKKKKLLLLi", &scores_p, &margins_p, &hidden_p, &weight_p, &out_p, &rows,
                          &vocab, &hidden_size, &max_candidates, &num_threads))
        return NULL;
    if (rows < 0 || vocab <= 0 || hidden_size <= 0 || max_candidates < 1) {
        PyErr_SetString(PyExc_ValueError, "bad screened argmax shape");
        return NULL;
    }
    const uint16_t *scores = (const uint16_t *)(uintptr_t)scores_p;
    const float *margins = (const float *)(uintptr_t)margins_p;
    const float *hidden = (const float *)(uintptr_t)hidden_p;
    const float *weight = (const float *)(uintptr_t)weight_p;
    int64_t *idx = (int64_t *)(uintptr_t)out_p;
    float *block_max = PyMem_RawMalloc(sizeof(float) * (size_t)((vocab + SCREEN_BLOCK - 1) / SCREEN_BLOCK) *
                                       (size_t)(num_threads > 0 ? num_threads : 1));
    if (block_max == NULL) return PyErr_NoMemory();
    int64_t blocks_per_row = (vocab + SCREEN_BLOCK - 1) / SCREEN_BLOCK;
    Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for num_threads(num_threads > 0 ? num_threads : 1) if (rows > 1) schedule(static)
    for (long long r = 0; r < rows; ++r)
        idx[r] = screened_row(scores + r * vocab, vocab, margins[r], hidden + r * hidden_size, weight,
                              hidden_size, max_candidates, block_max + omp_get_thread_num() * blocks_per_row);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(block_max);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"argmax_rows_f32", argmax_rows_f32, METH_VARARGS, "Row-wise argmax; pointers and shapes as ints."},
    {"screened_argmax_bf16", screened_argmax_bf16, METH_VARARGS,
     "Exact row argmax from a bf16 screen; pointers and shapes as ints, -1 where a row needs the full logits."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_argmax_cpu",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__argmax_cpu(void) { return PyModule_Create(&module); }
