/*
 * The decoder's elementwise steps for the CPU path of a replica, one pass
 * each: RMSNorm, SwiGLU's silu(gate) * up, and the rotary embedding.
 *
 * In torch each is several operators (RMSNorm: square, mean, add, rsqrt,
 * two multiplies; rotation: two multiplies, a negation, a concatenation, an
 * add), each a pass over the activations and a dispatch from Python. On a
 * prefill chunk the activations outgrow the cache and every pass goes to
 * memory: on a 2,048-token step of the tiny model these operators took ~40
 * of ~130 ms. On a decode step the tensors are small and the dispatches are
 * the cost.
 *
 * Contract (checked by the Python wrapper, not here): float32; rows
 * contiguous within themselves, at the strides given. Rows are spread over
 * OpenMP threads when there are enough of them to pay for the fork. The GIL
 * is released while a kernel runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>

#include "_cpu_vector.h"

/* Below this many elements a call stays on the calling thread. */
#define PARALLEL_MIN_ELEMENTS 65536

/* out[r] = weight * (x[r] / sqrt(mean(x[r]^2) + eps)), in the reference's
 * order: normalise, then scale. */
SLUICE_CLONES
static void rms_norm_rows(const float *x, const float *weight, float *out, int64_t rows, int64_t cols,
                          int64_t x_stride, float eps, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * cols >= PARALLEL_MIN_ELEMENTS && num_threads > 1)
    for (int64_t r = 0; r < rows; ++r) {
        const float *row = x + r * x_stride;
        float *o = out + r * cols;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t c = 0; c < cols; ++c) sum += row[c] * row[c];
        const float inv = 1.0f / sqrtf(sum / (float)cols + eps);
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) o[c] = weight[c] * (row[c] * inv);
    }
}

/* if_set where x's sign bit is set (negative numbers, -0, negative NaNs), else
 * otherwise: a select in integer lanes, which GCC's AVX2 clone vectorises. A
 * function of its own because the same memcpys written in an `omp simd`
 * loop's body made GCC give up on that loop (its locals become per-lane
 * arrays whose addresses are taken). */
static inline float where_sign_set(float x, float if_set, float otherwise) {
    uint32_t x_bits, set_bits, otherwise_bits;
    memcpy(&x_bits, &x, sizeof x_bits);
    memcpy(&set_bits, &if_set, sizeof set_bits);
    memcpy(&otherwise_bits, &otherwise, sizeof otherwise_bits);
    const uint32_t mask = (uint32_t)((int32_t)x_bits >> 31);
    const uint32_t out_bits = (set_bits & mask) | (otherwise_bits & ~mask);
    float out;
    memcpy(&out, &out_bits, sizeof out);
    return out;
}

/* silu(g) * u = g * u / (1 + e^-g). e^-|g| <= 1 comes from the vectorised
 * exp of a non-positive argument; for g < 0, e^-g = 1 / e^-|g|, so
 * g / (1 + e^-g) = g e^g / (e^g + 1) = g e / (1 + e) with e = e^-|g|.
 *
 * The choice of g or g e is an integer select on g's sign bit, for the
 * reason exp_nonpositive gives: a float select (g >= 0 ? g : g * e) kept
 * GCC's AVX2 clone scalar (measured on an AVX2-only Zen 3: ~8% of the
 * replica's CPU under load, in this one loop); g * 1.0f is g exactly, so the
 * result is the same to the bit. */
SLUICE_CLONES
static void silu_mul_rows(const float *gate_up, float *out, int64_t rows, int64_t inter, int64_t in_stride,
                          int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * inter >= PARALLEL_MIN_ELEMENTS && num_threads > 1)
    for (int64_t r = 0; r < rows; ++r) {
        const float *gate = gate_up + r * in_stride, *up = gate + inter;
        float *o = out + r * inter;
#pragma omp simd
        for (int64_t c = 0; c < inter; ++c) {
            const float g = gate[c];
            const float e = exp_nonpositive(-fabsf(g));
            o[c] = g * where_sign_set(g, e, 1.0f) / (1.0f + e) * up[c];
        }
    }
}

/* x rotated by (cos, sin) per token, over the two halves of each head:
 *     out[d]        = x[d] cos[d]               - x[d + half] sin[d]
 *     out[d + half] = x[d + half] cos[d + half] + x[d] sin[d + half]
 * (x cos + rotate_half(x) sin). x: [tokens, heads, head_dim] with rows
 * `x_stride` apart and heads contiguous; cos, sin: [tokens, head_dim];
 * out: contiguous [tokens, heads, head_dim]. */
SLUICE_CLONES
static void rotate_rows(const float *x, const float *cos, const float *sin, float *out, int64_t tokens,
                        int64_t heads, int64_t head_dim, int64_t x_stride, int num_threads) {
    const int64_t half = head_dim / 2;
#pragma omp parallel for num_threads(num_threads) if (tokens * heads * head_dim >= PARALLEL_MIN_ELEMENTS && \
                                                        num_threads > 1)
    for (int64_t t = 0; t < tokens; ++t) {
        const float *c = cos + t * head_dim, *s = sin + t * head_dim;
        for (int64_t h = 0; h < heads; ++h) {
            const float *xh = x + t * x_stride + h * head_dim;
            float *o = out + (t * heads + h) * head_dim;
#pragma omp simd
            for (int64_t d = 0; d < half; ++d) {
                o[d] = xh[d] * c[d] - xh[d + half] * s[d];
                o[d + half] = xh[d + half] * c[d + half] + xh[d] * s[d + half];
            }
        }
    }
}

static PyObject *rms_norm_f32(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long x, weight, out;
    long long rows, cols, x_stride;
    float eps;
    int num_threads;
    if (!PyArg_ParseTuple(args, "KKKLLLfi", &x, &weight, &out, &rows, &cols, &x_stride, &eps, &num_threads))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rms_norm_rows((const float *)(uintptr_t)x, (const float *)(uintptr_t)weight, (float *)(uintptr_t)out, rows,
                  cols, x_stride, eps, num_threads > 0 ? num_threads : 1);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *silu_mul_f32(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long gate_up, out;
    long long rows, inter, in_stride;
    int num_threads;
    if (!PyArg_ParseTuple(args, "KKLLLi", &gate_up, &out, &rows, &inter, &in_stride, &num_threads))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    silu_mul_rows((const float *)(uintptr_t)gate_up, (float *)(uintptr_t)out, rows, inter, in_stride,
                  num_threads > 0 ? num_threads : 1);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *rotate_f32(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long x, cos, sin, out;
    long long tokens, heads, head_dim, x_stride;
    int num_threads;
    if (!PyArg_ParseTuple(args, "KKKKLLLLi", &x, &cos, &sin, &out, &tokens, &heads, &head_dim, &x_stride,
                          &num_threads))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rotate_rows((const float *)(uintptr_t)x, (const float *)(uintptr_t)cos, (const float *)(uintptr_t)sin,
                (float *)(uintptr_t)out, tokens, heads, head_dim, x_stride, num_threads > 0 ? num_threads : 1);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"rms_norm_f32", rms_norm_f32, METH_VARARGS, "RMSNorm of float32 rows; pointers and shapes as ints."},
    {"silu_mul_f32", silu_mul_f32, METH_VARARGS, "silu(gate) * up of [gate | up] float32 rows."},
    {"rotate_f32", rotate_f32, METH_VARARGS, "Rotary embedding of float32 [tokens, heads, head_dim] rows."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_elementwise_cpu",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__elementwise_cpu(void) { return PyModule_Create(&module); }
