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
 * Greedy tokens from a screen of the LM head (sluice.model.greedy_head):
 * bfloat16 scores from oneDNN, or float32 scores from the int8 screen below.
 *
 * For each row r: `scores` holds screened logits s_rv, each within margins[r]
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
 * and only blocks whose max reaches the floor are read again, one by one.
 * Scores come as bf16 (the oneDNN screen) or float32 (the int8 screen). */
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

SLUICE_CLONES
static float max_f32(const float *x, int64_t n) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < n; ++j) m = x[j] > m ? x[j] : m;
    return m;
}

/* An exact logit: float32 products are exact in double, and the double sum
 * of a hidden size's worth of them is exact to ~1e-16 relative. The
 * reduction lets the compiler keep several partial sums in vectors (one
 * chain of dependent adds made a candidate ~4 cycles a product). */
SLUICE_CLONES
static double dot_f64(const float *x, const float *y, int64_t n) {
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i) sum += (double)x[i] * (double)y[i];
    return sum;
}

static inline float score_at(const void *scores, int is_bf16, int64_t v) {
    return is_bf16 ? bf16_to_f32(((const uint16_t *)scores)[v]) : ((const float *)scores)[v];
}

/* block_max: the row's block maxima, or NULL to take them here into `scratch`. */
static int64_t screened_row(const void *scores, int is_bf16, int64_t vocab, float margin, const float *hidden,
                            const float *weight, int64_t hidden_size, int64_t max_candidates,
                            const float *block_max, float *scratch) {
    int64_t num_blocks = (vocab + SCREEN_BLOCK - 1) / SCREEN_BLOCK;
    float best_score = -INFINITY;
    if (block_max == NULL) {
        for (int64_t b = 0; b < num_blocks; ++b) {
            int64_t start = b * SCREEN_BLOCK, len = vocab - start < SCREEN_BLOCK ? vocab - start : SCREEN_BLOCK;
            scratch[b] = is_bf16 ? max_bf16((const uint16_t *)scores + start, len)
                                 : max_f32((const float *)scores + start, len);
        }
        block_max = scratch;
    }
    for (int64_t b = 0; b < num_blocks; ++b)
        if (block_max[b] > best_score) best_score = block_max[b];
    if (!isfinite(best_score) || !isfinite(margin)) return -1;
    float floor = best_score - 2.0f * margin;
    int64_t count = 0, best = -1;
    double best_logit = -INFINITY;
    for (int64_t b = 0; b < num_blocks; ++b) {
        if (block_max[b] < floor) continue;
        int64_t end = (b + 1) * SCREEN_BLOCK < vocab ? (b + 1) * SCREEN_BLOCK : vocab;
        for (int64_t v = b * SCREEN_BLOCK; v < end; ++v) {
            if (score_at(scores, is_bf16, v) < floor) continue;
            if (++count > max_candidates) return -1;
            const double logit = dot_f64(hidden, weight + v * hidden_size, hidden_size);
            if (logit > best_logit) { /* strict: the lowest index keeps a tie */
                best_logit = logit;
                best = v;
            }
        }
    }
    return best;
}

/* Every row's screened argmax; scores rows `score_stride` elements apart;
 * block_max: [rows][blocks] maxima the caller already has, or NULL. */
static PyObject *screen_rows(const void *scores, int is_bf16, int64_t score_stride, const float *margins,
                             const float *hidden, const float *weight, int64_t *idx, int64_t rows, int64_t vocab,
                             int64_t hidden_size, int64_t max_candidates, const float *block_max, int num_threads) {
    int64_t blocks_per_row = (vocab + SCREEN_BLOCK - 1) / SCREEN_BLOCK;
    float *scratch = PyMem_RawMalloc(sizeof(float) * (size_t)blocks_per_row *
                                     (size_t)(num_threads > 0 ? num_threads : 1));
    if (scratch == NULL) return PyErr_NoMemory();
    const size_t score_bytes = is_bf16 ? sizeof(uint16_t) : sizeof(float);
    Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for num_threads(num_threads > 0 ? num_threads : 1) if (rows > 1) schedule(static)
    for (long long r = 0; r < rows; ++r)
        idx[r] = screened_row((const char *)scores + (size_t)r * (size_t)score_stride * score_bytes, is_bf16, vocab,
                              margins[r], hidden + r * hidden_size, weight, hidden_size, max_candidates,
                              block_max != NULL ? block_max + r * blocks_per_row : NULL,
                              scratch + omp_get_thread_num() * blocks_per_row);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(scratch);
    Py_RETURN_NONE;
}

static PyObject *screened_argmax(PyObject *args, int is_bf16) {
    unsigned long long scores_p, margins_p, hidden_p, weight_p, out_p, block_max_p;
    long long rows, vocab, score_stride, hidden_size, max_candidates;
    int num_threads;
    if (!PyArg_ParseTuple(args, "KKKKKLLLLLKi", &scores_p, &margins_p, &hidden_p, &weight_p, &out_p, &rows,
                          &vocab, &score_stride, &hidden_size, &max_candidates, &block_max_p, &num_threads))
        return NULL;
    if (rows < 0 || vocab <= 0 || score_stride < vocab || hidden_size <= 0 || max_candidates < 1) {
        PyErr_SetString(PyExc_ValueError, "bad screened argmax shape");
        return NULL;
    }
    return screen_rows((const void *)(uintptr_t)scores_p, is_bf16, score_stride,
                       (const float *)(uintptr_t)margins_p, (const float *)(uintptr_t)hidden_p,
                       (const float *)(uintptr_t)weight_p, (int64_t *)(uintptr_t)out_p, rows, vocab, hidden_size,
                       max_candidates, (const float *)(uintptr_t)block_max_p, num_threads);
}

static PyObject *screened_argmax_bf16(PyObject *self, PyObject *args) {
    (void)self;
    return screened_argmax(args, 1);
}

static PyObject *screened_argmax_f32(PyObject *self, PyObject *args) {
    (void)self;
    return screened_argmax(args, 0);
}


/*
 * The int8 screen's scores (sluice.model.greedy_head, for CPUs without
 * bf16 matrix instructions: AVX2 on Zen 2/3 and older Xeons, AVX-VNNI on
 * Alder Lake and later client cores, AVX-512 VNNI on Cascade Lake). An
 * int8 multiply-add does two to four times the work of a float32 FMA per
 * instruction, and the LM head is most of a small model's decode step.
 *
 * The weights are quantized once per vocab row v (w_v = s_v q_v, q_v in
 * [-127, 127]) and packed by the caller in blocks of 16 rows:
 * packed[block][k / 4][16][4], so one 32-bit lane holds four consecutive
 * k of one row, the layout both vpmaddubsw + vpmaddwd (AVX2) and vpdpbusd
 * (VNNI) consume with the activation's four bytes broadcast. Each hidden
 * row is quantized here, h ~ s_h a, to `bits` bits: a in [-(2^(bits-1) -
 * 1), 2^(bits-1) - 1], stored biased by 2^(bits-1) because the
 * instructions take one unsigned operand; bias * sum(q_v) comes back out.
 * AVX2 takes 7 bits: vpmaddubsw adds two u8 * s8 products in int16 and
 * saturates, and 2 * 127 * 127 < 32768 (an 8th bit by moving a's sign
 * onto q with vpsignb measured 1.5x slower, for half the activation term
 * below). VNNI (AVX-512 or AVX-VNNI) has no int16 step and takes 8.
 *
 * The integer sums are exact, so at one bit width every path (VNNI, AVX2,
 * scalar) gives the same scores. score_v = sum_v s_v s_h, and with
 * e_h = h - s_h a,
 *     |h . w_v - score_v| <= ||h|| ||w_v - s_v q_v|| + ||e_h|| ||s_v q_v||
 *                            + three float32 roundings (sum, s_v, s_h),
 * the row's margin, from the caller's maxima over v of the two weight norms.
 * The first two terms are what quantization costs; the candidates the
 * screen leaves grow with the margin.
 */
#define INT8_BLOCK 16

/* Numbered slowest first (the caller takes the largest this CPU runs). */
enum { INT8_ISA_SCALAR = 1, INT8_ISA_AVX2 = 2, INT8_ISA_AVX_VNNI = 3, INT8_ISA_AVX512_VNNI = 4 };

/* The row's biased activations (padded_hidden bytes, the bias itself past
 * hidden_size, so padding adds bias * 0), its scale and margin. */
static void quantize_row(const float *h, int64_t hidden_size, int64_t padded_hidden, int bits, uint8_t *activations,
                         float *scale_out, float *margin_out, double weight_error_max, double weight_norm_max) {
    const int bias = 1 << (bits - 1), limit = bias - 1;
    float amax = 0.0f;
    int finite = 1;
    for (int64_t i = 0; i < hidden_size; ++i) {
        float a = fabsf(h[i]);
        finite &= isfinite(a);
        amax = a > amax ? a : amax;
    }
    memset(activations, bias, (size_t)padded_hidden);
    if (!finite) { /* the caller's full logits decide the row */
        *scale_out = 0.0f;
        *margin_out = NAN;
        return;
    }
    /* amax == 0: every score is 0 and the margin the float slack alone: every token is a candidate. */
    const float scale = amax > 0.0f ? amax / (float)limit : 0.0f;
    const float inverse = amax > 0.0f ? (float)limit / amax : 0.0f;
    double h_sq = 0.0, e_sq = 0.0;
    for (int64_t i = 0; i < hidden_size; ++i) {
        long a = lrintf(h[i] * inverse);
        a = a > limit ? limit : (a < -limit ? -limit : a);
        activations[i] = (uint8_t)(a + bias);
        const double e = (double)h[i] - (double)scale * (double)a;
        h_sq += (double)h[i] * (double)h[i];
        e_sq += e * e;
    }
    const double h_norm = sqrt(h_sq), e_norm = sqrt(e_sq);
    /* The norms are double sums (relative error ~1e-13); 1e-4 covers them and
     * the bound's own float rounding many times over; 2^-21 covers the three
     * float32 roundings of the score, |score| <= (||h|| + ||e_h||) max ||s_v q_v||. */
    const double margin = (h_norm * weight_error_max + e_norm * weight_norm_max) * (1.0 + 1e-4) +
                          ldexp((h_norm + e_norm) * weight_norm_max, -21) + 1e-30;
    *scale_out = scale;
    *margin_out = (float)(margin * (1.0 + 1e-6)); /* rounding the margin to float must not shrink it */
}

/* One hidden row's running candidates in the fused screen
 * (int8_screened_argmax): the largest score so far, the floor it sets
 * (best - 2 margin), and each vocab row whose score reached the floor when
 * it was scored, in vocab order. The floor only rises, and the final one
 * (the best score's) is at or above every earlier one, so every final
 * candidate was kept; those below the final floor are dropped after. */
typedef struct {
    float best, floor, twice_margin;
    int32_t count, capacity, overflow;
    int32_t *index;
    float *score;
} Int8Candidates;

/* Keep the `hits` lanes of a block's 16 scores (vocab rows v0..v0+15). */
static void int8_push(Int8Candidates *c, int64_t v0, const float *scores, unsigned hits) {
    if (c->overflow) return;
    if (c->count + INT8_BLOCK > c->capacity) { /* drop what no longer reaches the floor */
        int32_t kept = 0;
        for (int32_t i = 0; i < c->count; ++i)
            if (c->score[i] >= c->floor) {
                c->index[kept] = c->index[i];
                c->score[kept++] = c->score[i];
            }
        c->count = kept;
        if (c->count + INT8_BLOCK > c->capacity) { /* the caller computes this row's full logits */
            c->overflow = 1;
            return;
        }
    }
    float best = c->best;
    for (int j = 0; j < INT8_BLOCK; ++j)
        if (hits >> j & 1u) {
            c->index[c->count] = (int32_t)(v0 + j);
            c->score[c->count++] = scores[j];
            best = scores[j] > best ? scores[j] : best;
        }
    c->best = best;
    c->floor = best - c->twice_margin;
}

/* What turns one block's exact integer sums into scores, fused into each
 * instruction set's block kernel so the arithmetic runs at that kernel's
 * vector width (a plain C epilogue after the block, compiled for the
 * baseline ISA, took 40% of the kernel's time on a Zen 4): for hidden row
 * r and vocab row j of the block,
 *     score = (sum - shift[j]) * scale[j] * row_scales[r],
 * shift[j] = bias * sum(q_j) taking the activations' bias back out, in
 * this order on every path (so every path's scores are identical). Then
 * one of two things, over the block's `valid` lanes (padding rows are not
 * tokens; a NaN score is never a maximum nor a candidate):
 *   - scores mode (candidates NULL): store the scores and each row's
 *     running maxima, lane by lane (int8_head_scores);
 *   - screen mode: keep the lanes at or above the row's floor as
 *     candidates (int8_screened_argmax): no score is stored, so a step
 *     neither writes rows x vocab floats (8 MB for 64 x 32k) nor reads
 *     them back, and the KV cache keeps that much more of the L3. */
typedef struct {
    int32_t shift[INT8_BLOCK];
    float scale[INT8_BLOCK];
    const float *row_scales; /* [rows] */
    int valid;               /* vocab rows of the block that are tokens, 0..16 */
    int64_t v0;              /* the block's first vocab row */
    float *scores;           /* scores mode: hidden row 0's score of vocab row v0 */
    int64_t score_stride;
    float *lane_max;         /* scores mode: [rows][16] running maxima */
    Int8Candidates *candidates; /* screen mode: [rows] */
} Int8Epilogue;

static inline __attribute__((always_inline)) void int8_epilogue_scalar(const Int8Epilogue *e, int64_t r,
                                                                       const int32_t *s) {
    const float row_scale = e->row_scales[r];
    float score[INT8_BLOCK];
    for (int j = 0; j < INT8_BLOCK; ++j) score[j] = (float)(s[j] - e->shift[j]) * e->scale[j] * row_scale;
    if (e->candidates != NULL) {
        Int8Candidates *c = e->candidates + r;
        unsigned hits = 0;
        for (int j = 0; j < e->valid; ++j) hits |= (unsigned)(score[j] >= c->floor) << j;
        if (hits) int8_push(c, e->v0, score, hits);
        return;
    }
    float *out = e->scores + r * e->score_stride, *m = e->lane_max + r * INT8_BLOCK;
    for (int j = 0; j < INT8_BLOCK; ++j) {
        out[j] = score[j];
        m[j] = j < e->valid && score[j] > m[j] ? score[j] : m[j];
    }
}

/* One block of 16 vocab rows for `rows` hidden rows: the biased activations
 * of r . q_j, exact, then the epilogue. */
static void int8_block_scalar(const uint8_t *activations, int64_t padded_hidden, const int8_t *block, int64_t rows,
                              const Int8Epilogue *e) {
    for (int64_t r = 0; r < rows; ++r) {
        const uint8_t *a = activations + r * padded_hidden;
        int32_t s[INT8_BLOCK] = {0};
        for (int64_t k4 = 0; k4 < padded_hidden / 4; ++k4) {
            const int8_t *w = block + k4 * INT8_BLOCK * 4;
            for (int j = 0; j < INT8_BLOCK; ++j)
                for (int t = 0; t < 4; ++t) s[j] += (int32_t)a[k4 * 4 + t] * (int32_t)w[j * 4 + t];
        }
        int8_epilogue_scalar(e, r, s);
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SLUICE_INT8_X86 1

/* The block kernels store their sums to a small buffer in L1 and the
 * epilogue reads them back: with the epilogue reading the accumulators
 * straight after the loop, GCC 12 kept them in the wrong registers and
 * copied each one twice per step (16 moves beside 8 vpdpbusd, the block
 * 30% slower). This barrier keeps GCC from forwarding the stores. */
#define SLUICE_KEEP_IN_MEMORY(p) __asm__ volatile("" : : "r"(p) : "memory")

/* The epilogue on two ymm of sums (lanes 0-7, 8-15), for the AVX2 and AVX-VNNI kernels. */
typedef struct {
    __m256i shift0, shift1;
    __m256 scale0, scale1, valid0, valid1; /* valid: all-ones lanes that are tokens */
} Int8EpilogueAvx2;

__attribute__((target("avx2"))) static inline __attribute__((always_inline)) Int8EpilogueAvx2
int8_epilogue_avx2_setup(const Int8Epilogue *e) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), valid = _mm256_set1_epi32(e->valid);
    Int8EpilogueAvx2 v;
    v.shift0 = _mm256_loadu_si256((const __m256i *)e->shift);
    v.shift1 = _mm256_loadu_si256((const __m256i *)(e->shift + 8));
    v.scale0 = _mm256_loadu_ps(e->scale);
    v.scale1 = _mm256_loadu_ps(e->scale + 8);
    v.valid0 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(valid, lanes));
    v.valid1 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(valid, _mm256_add_epi32(lanes, _mm256_set1_epi32(8))));
    return v;
}

__attribute__((target("avx2"))) static inline __attribute__((always_inline)) void
int8_epilogue_avx2(const Int8Epilogue *e, const Int8EpilogueAvx2 *v, int64_t r, __m256i s0, __m256i s1) {
    const __m256 row_scale = _mm256_set1_ps(e->row_scales[r]);
    const __m256 score0 = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(s0, v->shift0)), v->scale0),
                                        row_scale);
    const __m256 score1 = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(s1, v->shift1)), v->scale1),
                                        row_scale);
    if (e->candidates != NULL) {
        Int8Candidates *c = e->candidates + r;
        const __m256 floor = _mm256_set1_ps(c->floor);
        const unsigned hits = ((unsigned)_mm256_movemask_ps(_mm256_and_ps(_mm256_cmp_ps(score0, floor, _CMP_GE_OQ),
                                                                          v->valid0)) |
                               (unsigned)_mm256_movemask_ps(_mm256_and_ps(_mm256_cmp_ps(score1, floor, _CMP_GE_OQ),
                                                                          v->valid1)) << 8);
        if (hits) {
            float score[INT8_BLOCK];
            _mm256_storeu_ps(score, score0);
            _mm256_storeu_ps(score + 8, score1);
            int8_push(c, e->v0, score, hits);
        }
        return;
    }
    float *out = e->scores + r * e->score_stride, *m = e->lane_max + r * INT8_BLOCK;
    _mm256_storeu_ps(out, score0);
    _mm256_storeu_ps(out + 8, score1);
    const __m256 old0 = _mm256_loadu_ps(m), old1 = _mm256_loadu_ps(m + 8);
    _mm256_storeu_ps(m, _mm256_blendv_ps(old0, _mm256_max_ps(score0, old0), v->valid0));
    _mm256_storeu_ps(m + 8, _mm256_blendv_ps(old1, _mm256_max_ps(score1, old1), v->valid1));
}

/* The epilogue of four hidden rows' eight accumulators (two per row),
 * through a buffer the barrier keeps (see SLUICE_KEEP_IN_MEMORY). */
__attribute__((target("avx2"))) static inline __attribute__((always_inline)) void
int8_epilogue_avx2_rows4(const Int8Epilogue *e, const Int8EpilogueAvx2 *v, int64_t r, const __m256i *s) {
    int32_t sums[4 * INT8_BLOCK] __attribute__((aligned(32)));
    for (int i = 0; i < 8; ++i) _mm256_store_si256((__m256i *)(sums + 8 * i), s[i]);
    SLUICE_KEEP_IN_MEMORY(sums);
    for (int i = 0; i < 4; ++i)
        int8_epilogue_avx2(e, v, r + i, _mm256_load_si256((const __m256i *)(sums + 16 * i)),
                           _mm256_load_si256((const __m256i *)(sums + 16 * i + 8)));
}

/* AVX2: 4 hidden rows x 16 vocab rows (two ymm of 8 int32 lanes) per pass,
 * eight independent accumulators; vpmaddubsw then vpmaddwd by ones sums
 * each lane's four products. */
__attribute__((target("avx2,fma"))) static void int8_block_avx2(const uint8_t *activations, int64_t padded_hidden,
                                                                 const int8_t *block, int64_t rows,
                                                                 const Int8Epilogue *e) {
    const __m256i ones = _mm256_set1_epi16(1);
    const Int8EpilogueAvx2 v = int8_epilogue_avx2_setup(e);
    const int64_t steps = padded_hidden / 4;
    int64_t r = 0;
#define SLUICE_INT8_AVX2_ROW(A, S0, S1)                                                   \
    {                                                                                     \
        int32_t q;                                                                        \
        memcpy(&q, (A) + k4 * 4, 4);                                                      \
        const __m256i b = _mm256_set1_epi32(q);                                           \
        S0 = _mm256_add_epi32(S0, _mm256_madd_epi16(_mm256_maddubs_epi16(b, w0), ones)); \
        S1 = _mm256_add_epi32(S1, _mm256_madd_epi16(_mm256_maddubs_epi16(b, w1), ones)); \
    }
    for (; r + 4 <= rows; r += 4) {
        const uint8_t *a0 = activations + r * padded_hidden, *a1 = a0 + padded_hidden, *a2 = a1 + padded_hidden,
                      *a3 = a2 + padded_hidden;
        __m256i s00 = _mm256_setzero_si256(), s01 = s00, s10 = s00, s11 = s00, s20 = s00, s21 = s00, s30 = s00,
                s31 = s00;
        for (int64_t k4 = 0; k4 < steps; ++k4) {
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)(block + k4 * 64));
            const __m256i w1 = _mm256_loadu_si256((const __m256i *)(block + k4 * 64 + 32));
            SLUICE_INT8_AVX2_ROW(a0, s00, s01)
            SLUICE_INT8_AVX2_ROW(a1, s10, s11)
            SLUICE_INT8_AVX2_ROW(a2, s20, s21)
            SLUICE_INT8_AVX2_ROW(a3, s30, s31)
        }
        const __m256i s[8] = {s00, s01, s10, s11, s20, s21, s30, s31};
        int8_epilogue_avx2_rows4(e, &v, r, s);
    }
    for (; r < rows; ++r) {
        const uint8_t *a0 = activations + r * padded_hidden;
        __m256i s00 = _mm256_setzero_si256(), s01 = s00;
        for (int64_t k4 = 0; k4 < steps; ++k4) {
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)(block + k4 * 64));
            const __m256i w1 = _mm256_loadu_si256((const __m256i *)(block + k4 * 64 + 32));
            SLUICE_INT8_AVX2_ROW(a0, s00, s01)
        }
        int8_epilogue_avx2(e, &v, r, s00, s01);
    }
#undef SLUICE_INT8_AVX2_ROW
}

/* AVX-VNNI (Alder Lake and later client cores, no AVX-512): vpdpbusd on
 * ymm, so the AVX2 path's tiling without its int16 step. */
__attribute__((target("avx2,avxvnni"))) static void int8_block_avx_vnni(const uint8_t *activations,
                                                                         int64_t padded_hidden, const int8_t *block,
                                                                         int64_t rows, const Int8Epilogue *e) {
    const Int8EpilogueAvx2 v = int8_epilogue_avx2_setup(e);
    const int64_t steps = padded_hidden / 4;
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) {
        __m256i s[8];
        for (int i = 0; i < 8; ++i) s[i] = _mm256_setzero_si256();
        for (int64_t k4 = 0; k4 < steps; ++k4) {
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)(block + k4 * 64));
            const __m256i w1 = _mm256_loadu_si256((const __m256i *)(block + k4 * 64 + 32));
            for (int i = 0; i < 4; ++i) {
                int32_t q;
                memcpy(&q, activations + (r + i) * padded_hidden + k4 * 4, 4);
                const __m256i b = _mm256_set1_epi32(q);
                s[2 * i] = _mm256_dpbusd_avx_epi32(s[2 * i], b, w0);
                s[2 * i + 1] = _mm256_dpbusd_avx_epi32(s[2 * i + 1], b, w1);
            }
        }
        int8_epilogue_avx2_rows4(e, &v, r, s);
    }
    for (; r < rows; ++r) {
        __m256i s0 = _mm256_setzero_si256(), s1 = s0;
        for (int64_t k4 = 0; k4 < steps; ++k4) {
            int32_t q;
            memcpy(&q, activations + r * padded_hidden + k4 * 4, 4);
            const __m256i b = _mm256_set1_epi32(q);
            s0 = _mm256_dpbusd_avx_epi32(s0, b, _mm256_loadu_si256((const __m256i *)(block + k4 * 64)));
            s1 = _mm256_dpbusd_avx_epi32(s1, b, _mm256_loadu_si256((const __m256i *)(block + k4 * 64 + 32)));
        }
        int8_epilogue_avx2(e, &v, r, s0, s1);
    }
}

/* AVX-512 VNNI: one zmm holds the 16 vocab rows; vpdpbusd sums each lane's
 * four products into int32 in one instruction. 8 hidden rows per pass. */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static inline __attribute__((always_inline)) void
int8_epilogue_avx512(const Int8Epilogue *e, int64_t r, __m512i sum, __m512i shift, __m512 scale, __mmask16 valid) {
    const __m512 score = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(sum, shift)), scale),
                                       _mm512_set1_ps(e->row_scales[r]));
    if (e->candidates != NULL) {
        Int8Candidates *c = e->candidates + r;
        const __mmask16 hits = _mm512_mask_cmp_ps_mask(valid, score, _mm512_set1_ps(c->floor), _CMP_GE_OQ);
        if (hits) {
            float scores[INT8_BLOCK];
            _mm512_storeu_ps(scores, score);
            int8_push(c, e->v0, scores, hits);
        }
        return;
    }
    float *m = e->lane_max + r * INT8_BLOCK;
    _mm512_storeu_ps(e->scores + r * e->score_stride, score);
    const __m512 old = _mm512_loadu_ps(m);
    _mm512_storeu_ps(m, _mm512_mask_max_ps(old, valid, score, old));
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void int8_block_vnni(const uint8_t *activations,
                                                                                     int64_t padded_hidden,
                                                                                     const int8_t *block,
                                                                                     int64_t rows,
                                                                                     const Int8Epilogue *e) {
    const __m512i shift = _mm512_loadu_si512((const void *)e->shift);
    const __m512 scale = _mm512_loadu_ps(e->scale);
    const __mmask16 valid = (__mmask16)((1u << e->valid) - 1u);
    const int64_t steps = padded_hidden / 4;
    int64_t r = 0;
    int32_t sums[8 * INT8_BLOCK] __attribute__((aligned(64)));
    for (; r + 8 <= rows; r += 8) {
        __m512i s[8];
        for (int i = 0; i < 8; ++i) s[i] = _mm512_setzero_si512();
        for (int64_t k4 = 0; k4 < steps; ++k4) {
            const __m512i w = _mm512_loadu_si512((const void *)(block + k4 * 64));
            for (int i = 0; i < 8; ++i) {
                int32_t q;
                memcpy(&q, activations + (r + i) * padded_hidden + k4 * 4, 4);
                s[i] = _mm512_dpbusd_epi32(s[i], _mm512_set1_epi32(q), w);
            }
        }
        for (int i = 0; i < 8; ++i) _mm512_store_si512((void *)(sums + i * INT8_BLOCK), s[i]);
        SLUICE_KEEP_IN_MEMORY(sums);
        for (int i = 0; i < 8; ++i)
            int8_epilogue_avx512(e, r + i, _mm512_load_si512((const void *)(sums + i * INT8_BLOCK)), shift, scale,
                                 valid);
    }
    for (; r < rows; ++r) {
        __m512i s0 = _mm512_setzero_si512();
        for (int64_t k4 = 0; k4 < steps; ++k4) {
            int32_t q;
            memcpy(&q, activations + r * padded_hidden + k4 * 4, 4);
            s0 = _mm512_dpbusd_epi32(s0, _mm512_set1_epi32(q), _mm512_loadu_si512((const void *)(block + k4 * 64)));
        }
        int8_epilogue_avx512(e, r, s0, shift, scale, valid);
    }
}
#endif

typedef void (*int8_block_fn)(const uint8_t *, int64_t, const int8_t *, int64_t, const Int8Epilogue *);

/* Whether this CPU runs `isa` at `bits`-bit activations. */
static int int8_isa_supported(int isa, int bits) {
    if (bits != 7 && bits != 8) return 0;
    switch (isa) {
    case INT8_ISA_SCALAR: return 1;
#ifdef SLUICE_INT8_X86
    case INT8_ISA_AVX2: return bits == 7 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case INT8_ISA_AVX_VNNI: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avxvnni");
    case INT8_ISA_AVX512_VNNI:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vnni");
#endif
    default: return 0;
    }
}

static int8_block_fn int8_block_for(int isa) {
#ifdef SLUICE_INT8_X86
    if (isa == INT8_ISA_AVX512_VNNI) return int8_block_vnni;
    if (isa == INT8_ISA_AVX_VNNI) return int8_block_avx_vnni;
    if (isa == INT8_ISA_AVX2) return int8_block_avx2;
#endif
    (void)isa;
    return int8_block_scalar;
}

/* One call's inputs, as both entry points take them. */
typedef struct {
    const float *hidden;         /* [rows][hidden_size] */
    const int8_t *packed;        /* [padded_vocab / 16][padded_hidden / 4][16][4] */
    const float *weight_scales;  /* [padded_vocab] */
    const int32_t *row_sums;     /* [padded_vocab] */
    int64_t rows, hidden_size, padded_hidden, vocab, padded_vocab;
    double weight_error_max, weight_norm_max;
    int isa, bits, threads;
} Int8Call;

static int int8_check(const Int8Call *call) {
    if (call->rows < 0 || call->hidden_size <= 0 || call->padded_hidden < call->hidden_size ||
        call->padded_hidden % 4 != 0 || call->vocab <= 0 || call->padded_vocab < call->vocab ||
        call->padded_vocab % INT8_BLOCK != 0 || call->vocab > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "bad int8 head shape");
        return -1;
    }
    if (!int8_isa_supported(call->isa, call->bits)) {
        PyErr_Format(PyExc_ValueError, "int8 head: instruction set %d with %d-bit activations is not available "
                     "on this CPU", call->isa, call->bits);
        return -1;
    }
    return 0;
}

/* The head and rows as both entry points take them: one tuple,
 * (hidden, packed, weight_scales, row_sums as pointers, rows, hidden_size,
 * padded_hidden, vocab, padded_vocab, weight_error_max, weight_norm_max,
 * isa, bits, threads), checked. 0, or -1 with a Python error set. */
static int int8_call(PyObject *head, Int8Call *call) {
    unsigned long long hidden_p, packed_p, weight_scales_p, row_sums_p;
    long long rows, hidden_size, padded_hidden, vocab, padded_vocab;
    int threads;
    if (!PyArg_ParseTuple(head, "KKKKLLLLLddiii", &hidden_p, &packed_p, &weight_scales_p, &row_sums_p, &rows,
                          &hidden_size, &padded_hidden, &vocab, &padded_vocab, &call->weight_error_max,
                          &call->weight_norm_max, &call->isa, &call->bits, &threads))
        return -1;
    call->hidden = (const float *)(uintptr_t)hidden_p;
    call->packed = (const int8_t *)(uintptr_t)packed_p;
    call->weight_scales = (const float *)(uintptr_t)weight_scales_p;
    call->row_sums = (const int32_t *)(uintptr_t)row_sums_p;
    call->rows = rows;
    call->hidden_size = hidden_size;
    call->padded_hidden = padded_hidden;
    call->vocab = vocab;
    call->padded_vocab = padded_vocab;
    call->threads = threads > 0 ? threads : 1;
    return int8_check(call);
}

static void int8_quantize(const Int8Call *call, uint8_t *activations, float *row_scales, float *margins) {
    for (int64_t r = 0; r < call->rows; ++r)
        quantize_row(call->hidden + r * call->hidden_size, call->hidden_size, call->padded_hidden, call->bits,
                     activations + r * call->padded_hidden, row_scales + r, margins + r, call->weight_error_max,
                     call->weight_norm_max);
}

/* Every block of the head for the quantized rows (int8_quantize), through
 * the epilogue `mode` describes (scores or screen), the threads taking runs of
 * SCREEN_BLOCK vocab rows. Scores mode: `lane_max` has [threads][rows][16]
 * floats, and `block_max` (or NULL) receives each screen block's maximum.
 * Screen mode: `candidates` has [threads][rows], each thread's own.
 * Runs without the GIL. */
static void int8_scan(const Int8Call *call, const uint8_t *activations, const float *row_scales,
                      const Int8Epilogue *mode, float *lane_max, float *block_max, Int8Candidates *candidates) {
    const int64_t rows = call->rows, vocab = call->vocab;
    const int32_t bias = 1 << (call->bits - 1);
    const int8_block_fn block_fn = int8_block_for(call->isa);
    const int64_t blocks = call->padded_vocab / INT8_BLOCK;
    /* Runs of whole screen blocks, so each one's maxima come out of the
     * epilogue and the screen need not read every score again to find them. */
    const int64_t per_screen_block = SCREEN_BLOCK / INT8_BLOCK;
    const int64_t screen_blocks = (vocab + SCREEN_BLOCK - 1) / SCREEN_BLOCK;
    const int64_t outer = (blocks + per_screen_block - 1) / per_screen_block;
#pragma omp parallel for num_threads(call->threads) if (outer > 1) schedule(dynamic, 1)
    for (long long sb = 0; sb < outer; ++sb) {
        const int thread = omp_get_thread_num();
        Int8Epilogue e = *mode;
        e.row_scales = row_scales;
        float *maxima = NULL;
        if (candidates != NULL) {
            e.candidates = candidates + (size_t)thread * (size_t)rows;
        } else {
            maxima = lane_max + (size_t)thread * (size_t)rows * INT8_BLOCK;
            for (int64_t i = 0; i < rows * INT8_BLOCK; ++i) maxima[i] = -INFINITY;
            e.lane_max = maxima;
        }
        float *const first_scores = e.scores;
        const int64_t b_end = (sb + 1) * per_screen_block < blocks ? (sb + 1) * per_screen_block : blocks;
        for (int64_t b = sb * per_screen_block; b < b_end; ++b) {
            const int64_t v0 = b * INT8_BLOCK;
            e.v0 = v0;
            e.scores = first_scores != NULL ? first_scores + v0 : NULL;
            e.valid = vocab - v0 >= INT8_BLOCK ? INT8_BLOCK : (int)(vocab - v0 > 0 ? vocab - v0 : 0);
            for (int j = 0; j < INT8_BLOCK; ++j) {
                e.shift[j] = bias * call->row_sums[v0 + j];
                e.scale[j] = call->weight_scales[v0 + j];
            }
            block_fn(activations, call->padded_hidden, call->packed + b * INT8_BLOCK * call->padded_hidden, rows, &e);
        }
        if (maxima != NULL && block_max != NULL && sb < screen_blocks)
            for (int64_t r = 0; r < rows; ++r) {
                float m = -INFINITY;
                for (int j = 0; j < INT8_BLOCK; ++j) m = maxima[r * INT8_BLOCK + j] > m ? maxima[r * INT8_BLOCK + j] : m;
                block_max[r * screen_blocks + sb] = m;
            }
    }
}

static PyObject *int8_head_scores(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *head;
    unsigned long long scores_p, margins_p, block_max_p;
    long long score_stride;
    Int8Call call;
    if (!PyArg_ParseTuple(args, "O!KKKL", &PyTuple_Type, &head, &scores_p, &margins_p, &block_max_p, &score_stride) ||
        int8_call(head, &call) < 0)
        return NULL;
    const long long rows = call.rows, padded_hidden = call.padded_hidden;
    if (score_stride < call.padded_vocab) {
        PyErr_SetString(PyExc_ValueError, "bad int8 head shape");
        return NULL;
    }
    const size_t some_rows = (size_t)(rows > 0 ? rows : 1);
    uint8_t *activations = PyMem_RawMalloc(some_rows * (size_t)padded_hidden);
    float *row_scales = PyMem_RawMalloc(sizeof(float) * some_rows);
    float *lane_max = PyMem_RawMalloc(sizeof(float) * some_rows * INT8_BLOCK * (size_t)call.threads);
    if (activations == NULL || row_scales == NULL || lane_max == NULL) {
        PyMem_RawFree(activations);
        PyMem_RawFree(row_scales);
        PyMem_RawFree(lane_max);
        return PyErr_NoMemory();
    }
    const Int8Epilogue mode = {.scores = (float *)(uintptr_t)scores_p, .score_stride = score_stride};
    Py_BEGIN_ALLOW_THREADS
    int8_quantize(&call, activations, row_scales, (float *)(uintptr_t)margins_p);
    int8_scan(&call, activations, row_scales, &mode, lane_max, (float *)(uintptr_t)block_max_p, NULL);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(activations);
    PyMem_RawFree(row_scales);
    PyMem_RawFree(lane_max);
    Py_RETURN_NONE;
}

/* Row r's token from every thread's candidates (see int8_screened_argmax). */
static int64_t int8_pick(const Int8Candidates *candidates, int threads, int64_t rows, int64_t r, float margin,
                         const float *hidden, const float *weight, int64_t hidden_size, int64_t max_candidates) {
    float best = -INFINITY;
    for (int t = 0; t < threads; ++t) {
        const Int8Candidates *c = candidates + (size_t)t * (size_t)rows + r;
        if (c->overflow) return -1;
        best = c->best > best ? c->best : best;
    }
    if (!isfinite(best) || !isfinite(margin)) return -1;
    const float floor = best - 2.0f * margin;
    int64_t count = 0, token = -1;
    double best_logit = -INFINITY;
    for (int t = 0; t < threads; ++t) {
        const Int8Candidates *c = candidates + (size_t)t * (size_t)rows + r;
        for (int32_t i = 0; i < c->count; ++i) {
            if (c->score[i] < floor) continue;
            if (++count > max_candidates) return -1;
            const int64_t v = c->index[i];
            const double logit = dot_f64(hidden, weight + v * hidden_size, hidden_size);
            if (logit > best_logit || (logit == best_logit && v < token)) { /* a tie: the lowest index */
                best_logit = logit;
                token = v;
            }
        }
    }
    return token;
}

/*
 * The int8 screen and the exact argmax in one call: the tokens that
 * int8_head_scores and then screened_argmax_f32 give (the same candidates,
 * the same exact logits, -1 where a row has more than max_candidates or
 * non-finite inputs, or where its running list outgrew its room), without
 * storing the scores (see Int8Epilogue).
 */
static PyObject *int8_screened_argmax(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *head;
    unsigned long long weight_p, out_p;
    long long max_candidates;
    Int8Call call;
    if (!PyArg_ParseTuple(args, "O!KKL", &PyTuple_Type, &head, &weight_p, &out_p, &max_candidates) ||
        int8_call(head, &call) < 0)
        return NULL;
    const long long rows = call.rows, hidden_size = call.hidden_size, padded_hidden = call.padded_hidden;
    if (max_candidates < 1 || max_candidates > (1 << 20)) {
        PyErr_SetString(PyExc_ValueError, "int8 screened argmax: max_candidates must be in 1..2^20");
        return NULL;
    }
    /* Room for twice the cap and a block: a list that fills is first cut
     * to what still reaches the floor, and only overflows when that leaves
     * no room, far past the cap. */
    const int32_t capacity = (int32_t)(2 * max_candidates + 2 * INT8_BLOCK);
    const size_t some_rows = (size_t)(rows > 0 ? rows : 1), lists = some_rows * (size_t)call.threads;
    uint8_t *activations = PyMem_RawMalloc(some_rows * (size_t)padded_hidden);
    float *row_scales = PyMem_RawMalloc(sizeof(float) * some_rows);
    float *margins = PyMem_RawMalloc(sizeof(float) * some_rows);
    Int8Candidates *candidates = PyMem_RawMalloc(sizeof(Int8Candidates) * lists);
    int32_t *indices = PyMem_RawMalloc(sizeof(int32_t) * lists * (size_t)capacity);
    float *scores = PyMem_RawMalloc(sizeof(float) * lists * (size_t)capacity);
    const int allocated = activations != NULL && row_scales != NULL && margins != NULL && candidates != NULL &&
                          indices != NULL && scores != NULL;
    if (allocated) {
        const float *weight = (const float *)(uintptr_t)weight_p;
        int64_t *out = (int64_t *)(uintptr_t)out_p;
        const Int8Epilogue mode = {.scores = NULL};
        Py_BEGIN_ALLOW_THREADS
        int8_quantize(&call, activations, row_scales, margins);
        for (size_t i = 0; i < lists; ++i) { /* each thread's list of each row */
            const Int8Candidates empty = {-INFINITY, -INFINITY, 2.0f * margins[i % some_rows], 0, capacity, 0,
                                          indices + i * (size_t)capacity, scores + i * (size_t)capacity};
            candidates[i] = empty;
        }
        int8_scan(&call, activations, row_scales, &mode, NULL, NULL, candidates);
#pragma omp parallel for num_threads(call.threads) if (rows > 1) schedule(dynamic, 1)
        for (long long r = 0; r < rows; ++r)
            out[r] = int8_pick(candidates, call.threads, rows, r, margins[r], call.hidden + r * hidden_size, weight,
                               hidden_size, max_candidates);
        Py_END_ALLOW_THREADS
    }
    PyMem_RawFree(activations);
    PyMem_RawFree(row_scales);
    PyMem_RawFree(margins);
    PyMem_RawFree(candidates);
    PyMem_RawFree(indices);
    PyMem_RawFree(scores);
    if (!allocated) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* [(isa, bits), ...] this CPU runs. */
static PyObject *int8_head_isas(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    for (int isa = INT8_ISA_SCALAR; isa <= INT8_ISA_AVX512_VNNI; ++isa)
        for (int bits = 7; bits <= 8; ++bits) {
            if (!int8_isa_supported(isa, bits)) continue;
            PyObject *pair = Py_BuildValue("(ii)", isa, bits);
            if (pair == NULL || PyList_Append(out, pair) < 0) {
                Py_XDECREF(pair);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(pair);
        }
    return out;
}

static PyMethodDef methods[] = {
    {"argmax_rows_f32", argmax_rows_f32, METH_VARARGS, "Row-wise argmax; pointers and shapes as ints."},
    {"screened_argmax_bf16", screened_argmax_bf16, METH_VARARGS,
     "Exact row argmax from a bf16 screen; pointers and shapes as ints, -1 where a row needs the full logits."},
    {"screened_argmax_f32", screened_argmax_f32, METH_VARARGS,
     "Exact row argmax from a float32 screen; as screened_argmax_bf16."},
    {"int8_head_scores", int8_head_scores, METH_VARARGS,
     "The int8 screen's float32 scores and each row's margin; pointers and shapes as ints."},
    {"int8_screened_argmax", int8_screened_argmax, METH_VARARGS,
     "Exact row argmax from the int8 screen in one pass; pointers and shapes as ints, -1 where a row needs the "
     "full logits."},
    {"int8_head_isas", int8_head_isas, METH_VARARGS, "The int8 screen's instruction sets this CPU runs."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_argmax_cpu",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__argmax_cpu(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "SCREEN_BLOCK", SCREEN_BLOCK) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
