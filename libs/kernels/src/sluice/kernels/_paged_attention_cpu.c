/*
 * Paged attention over a KV cache in blocks, for the CPU path of a replica.
 *
 * The torch path (paged_attention_cpu.py) must first gather every
 * sequence's blocks into one padded tensor and then run SDPA over it: two
 * passes over the whole context, one of them a copy. On a decode step that
 * gather is a quarter of the step. This kernel reads the blocks where they
 * lie, through the block table, in one pass per (sequence, KV head):
 *
 *     for each query token i of the sequence (its position p = len - q_len + i):
 *         s[g][j] = scale * q[g] . K[j]        j = 0..p, for the G query heads
 *                                              that share this KV head (GQA)
 *         w[g][j] = softmax_j(s[g][j])
 *         out[g]  = sum_j w[g][j] * V[j]
 *
 * Work items are (sequence, KV head) pairs, spread over OpenMP threads. The
 * extension is built with -fopenmp and loaded after torch, so it shares the
 * OpenMP runtime torch already loaded (one thread pool, no oversubscription).
 *
 * Contract (checked by the Python wrapper, not here): float32 everywhere;
 * query/out [T, H, D] contiguous; caches addressed as
 *     block * stride_block + slot * stride_slot + kv_head * stride_head + d * stride_d
 * with values' head_dim contiguous (stride_d 1) and keys' either head_dim
 * contiguous or slots contiguous (stride_slot 1: "transposed keys", where
 * one block of one head is a [head_dim, block_size] matrix, so the scores of
 * a whole block are block_size-wide vector FMAs with no horizontal sums,
 * about twice as fast as dot products of rows); block_tables
 * [S, max_blocks] int32; seq_lens [S] int32; query_start_loc [S + 1] int32;
 * seq_ids: which sequences to compute (the others' rows are left alone).
 * The GIL is released while it runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "_cpu_vector.h"

typedef struct {
    const float *query;
    const float *key_cache;
    const float *value_cache;
    const int32_t *block_tables;
    const int32_t *seq_lens;
    const int32_t *query_start_loc;
    const int32_t *seq_ids;
    float *out;
    int64_t num_work_seqs;
    int64_t num_heads;
    int64_t num_kv_heads;
    int64_t head_dim;
    int64_t block_size;
    int64_t max_blocks;
    int64_t k_stride_block, k_stride_slot, k_stride_head, k_stride_d;
    int64_t v_stride_block, v_stride_slot, v_stride_head;
    float scale;
    int64_t q_stride_token; /* floats between two tokens' query rows (heads and head_dim dense within one) */
    int prefetch_blocks; /* see prefetch_block */
} PagedArgs;

/* Blocks of a sequence lie anywhere in the cache, so the hardware prefetcher
 * cannot guess the next one; in a head-major cache (a block of one KV head a
 * short run), ask for its rows while this block is being read. Where a
 * block's heads lie together (block-major, interleaved) the runs are long
 * enough for the hardware prefetcher, and asking as well cost more than it
 * saved: 64 decodes at 192 tokens, 0.62 against 0.60 ms a layer over a
 * fresh pool, 0.67 against 0.63 over a scattered one. */
static inline __attribute__((always_inline)) void prefetch_block(const float *block, int64_t rows,
                                                                 int64_t row_stride, int64_t row_len) {
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t x = 0; x < row_len; x += 16) __builtin_prefetch(block + r * row_stride + x, 0, 3);
}

/* Scores of one query head against keys 0..visible-1: s[j] = qg . K[j].
 * Keys in rows (head_dim contiguous): a dot product per key. */
static inline __attribute__((always_inline)) void scores_from_rows(const PagedArgs *a, const float *k_head,
                                                                   const int32_t *table, const float *qg,
                                                                   float *s, int64_t visible, int first_head,
                                                                   const int64_t D) {
    const int64_t bs = a->block_size, num_blocks = (visible + bs - 1) / bs;
    for (int64_t b = 0; b < num_blocks; ++b) {
        const float *k_block = k_head + (int64_t)table[b] * a->k_stride_block;
        if (first_head && a->prefetch_blocks && b + 1 < num_blocks)
            prefetch_block(k_head + (int64_t)table[b + 1] * a->k_stride_block, bs, a->k_stride_slot, D);
        const int64_t n = visible - b * bs < bs ? visible - b * bs : bs;
        for (int64_t j = 0; j < n; ++j) {
            const float *k = k_block + j * a->k_stride_slot;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < D; ++d) dot += qg[d] * k[d];
            s[b * bs + j] = dot;
        }
    }
}

/* The same from transposed keys: a block is [head_dim][block_size], so the
 * block's BS scores accumulate as BS-wide vectors, one FMA per dimension.
 * The whole last block is computed and stored (its slots past the context
 * are allocated, their scores unused; `s` has room for whole blocks): a
 * store of n < BS lanes compiled to a `rep movs` copy that took more time
 * than the block's arithmetic. */
static inline __attribute__((always_inline)) void scores_from_columns(const PagedArgs *a, const float *k_head,
                                                                      const int32_t *table, const float *qg,
                                                                      float *s, int64_t visible, int first_head,
                                                                      const int64_t D, const int64_t BS) {
    const int64_t num_blocks = (visible + BS - 1) / BS;
    for (int64_t b = 0; b < num_blocks; ++b) {
        const float *k_block = k_head + (int64_t)table[b] * a->k_stride_block;
        if (first_head && a->prefetch_blocks && b + 1 < num_blocks)
            prefetch_block(k_head + (int64_t)table[b + 1] * a->k_stride_block, D, a->k_stride_d, BS);
        /* Four partial sums over interleaved dimensions: one accumulator
         * would chain every FMA on the previous one's latency. */
        float acc0[BS], acc1[BS], acc2[BS], acc3[BS];
        for (int64_t j = 0; j < BS; ++j) acc0[j] = acc1[j] = acc2[j] = acc3[j] = 0.0f;
        int64_t d = 0;
        for (; d + 4 <= D; d += 4) {
            const float *c0 = k_block + d * a->k_stride_d, *c1 = c0 + a->k_stride_d;
            const float *c2 = c1 + a->k_stride_d, *c3 = c2 + a->k_stride_d;
            const float q0 = qg[d], q1 = qg[d + 1], q2 = qg[d + 2], q3 = qg[d + 3];
#pragma omp simd
            for (int64_t j = 0; j < BS; ++j) {
                acc0[j] += q0 * c0[j];
                acc1[j] += q1 * c1[j];
                acc2[j] += q2 * c2[j];
                acc3[j] += q3 * c3[j];
            }
        }
        for (; d < D; ++d) {
            const float qd = qg[d];
            const float *column = k_block + d * a->k_stride_d;
#pragma omp simd
            for (int64_t j = 0; j < BS; ++j) acc0[j] += qd * column[j];
        }
        float *out = s + b * BS;
        for (int64_t j = 0; j < BS; ++j) out[j] = (acc0[j] + acc1[j]) + (acc2[j] + acc3[j]);
    }
}

/* s[0..n) <- exp(s[j] - max s), the softmax's weights unnormalised; returns 1 / their sum
 * (the output is divided once, not every weight). */
static inline __attribute__((always_inline)) float softmax_weights(float *s, int64_t n) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < n; ++j) m = s[j] > m ? s[j] : m;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) s[j] = exp_nonpositive(s[j] - m);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) sum += s[j];
    return 1.0f / sum;
}

/* Prefill and chunks: TILE_ROWS (query token, query head) rows of one
 * (sequence, KV head) at a time. One query row at a time (below) loads each
 * key column or value row once per FMA, with the query's or weight's
 * scalar broadcast beside it: two loads an FMA, so the load ports, not the
 * FMA units, set the pace, and a 2,048-token prefill step of the tiny model
 * spent ~18% of its time here against ~63% in its GEMMs. A tile loads each
 * column or value row once for all its rows. Rows are the flat index
 * f = token * G + head of the item's queries; a tile's rows see between
 * `visible_min` and `visible_max` keys (causal: later tokens see more).
 * Keys every row sees are summed for all rows at once; the few past
 * `visible_min` only for the rows that see them (a key a row cannot see
 * must not reach it, even as 0 x NaN). A short last tile repeats its last
 * row in the spare slots and stores only its own rows.
 * Needs transposed keys in 16-slot blocks and D a multiple of 16 up to
 * 128 (the caller checks); `scores` holds TILE_ROWS padded rows. */
#define TILE_ROWS 8

/* Whether an item takes the tiled path: a prefill or chunk (a decode's one
 * query row per head has nothing to share a load with) in the layout and
 * sizes it is written for. */
static inline int tiled(const PagedArgs *a, int64_t seq) {
    const int64_t q_len = a->query_start_loc[seq + 1] - a->query_start_loc[seq];
    return q_len > 1 && q_len * (a->num_heads / a->num_kv_heads) >= TILE_ROWS && a->k_stride_d != 1 &&
           a->block_size == 16 && a->head_dim % 16 == 0 && a->head_dim <= 128;
}

/* The vectorised half (_paged_attention_vec.h), once per instruction set:
 * AVX-512 with a block's 16 floats in one register, AVX2 + FMA and the
 * baseline with two 8-float halves (see that file for why not one generic
 * 16-float vector). One Zen 5 core, 64 decodes at 190 tokens: 0.27 ms a
 * layer in AVX-512, 0.32 in AVX2 (2.5-2.9 with the generic vector); 16
 * prompts of 128: 1.8 and 2.8 ms (27-31). The baseline (SSE2) stays ~10x
 * the AVX2 one (8-float halves lower as badly there); only CPUs from
 * before AVX2 (2013) run it. The variant is chosen once, at import, from
 * what the CPU supports; `set_variant` runs another (the tests run all). */
typedef float f32x16 __attribute__((vector_size(64)));
typedef float f32x8 __attribute__((vector_size(32)));
typedef struct {
    f32x8 lo, hi;
} f32x8x2;

#define VEC_CAT(name, isa) name##_##isa
#define VEC_NAME(name, isa) VEC_CAT(name, isa)
#define VEC_FN(name) VEC_NAME(name, VEC_ISA)

/* One 512-bit vector. */
#define V16 f32x16
#define V16_ZERO ((f32x16){0})
#define V16_LOAD(v, p) memcpy((v), (p), sizeof(f32x16))
#define V16_STORE(p, v) memcpy((p), (v), sizeof(f32x16))
#define V16_FMA(acc, s, v) (*(acc) += (s) * *(v))
#define V16_SUM(o, a, b) (*(o) = *(a) + *(b))
#define V16_SCALE(v, s) (*(v) *= (s))

#ifdef SLUICE_ISA_AVX512
#define SLUICE_VARIANTS 1
SLUICE_TARGET(SLUICE_ISA_AVX512)
#define VEC_ISA avx512
#include "_paged_attention_vec.h"
#undef VEC_ISA
SLUICE_TARGET_END
#endif

/* Two 256-bit halves. */
#undef V16
#undef V16_ZERO
#undef V16_LOAD
#undef V16_STORE
#undef V16_FMA
#undef V16_SUM
#undef V16_SCALE
#define V16 f32x8x2
#define V16_ZERO ((f32x8x2){{0}, {0}})
#define V16_LOAD(v, p) (memcpy(&(v)->lo, (p), sizeof(f32x8)), memcpy(&(v)->hi, (p) + 8, sizeof(f32x8)))
#define V16_STORE(p, v) (memcpy((p), &(v)->lo, sizeof(f32x8)), memcpy((p) + 8, &(v)->hi, sizeof(f32x8)))
#define V16_FMA(acc, s, v) ((acc)->lo += (s) * (v)->lo, (acc)->hi += (s) * (v)->hi)
#define V16_SUM(o, a, b) ((o)->lo = (a)->lo + (b)->lo, (o)->hi = (a)->hi + (b)->hi)
#define V16_SCALE(v, s) ((v)->lo *= (s), (v)->hi *= (s))

#ifdef SLUICE_VARIANTS
SLUICE_TARGET(SLUICE_ISA_AVX2)
#define VEC_ISA avx2
#include "_paged_attention_vec.h"
#undef VEC_ISA
SLUICE_TARGET_END
#endif

#define VEC_ISA baseline
#include "_paged_attention_vec.h"
#undef VEC_ISA

typedef void (*AttendOne)(const PagedArgs *a, int64_t seq, int64_t kv_head, float *scores);

static const struct {
    const char *name;
    AttendOne attend_one;
} VARIANTS[] = {
#ifdef SLUICE_VARIANTS
    {"avx512", attend_one_avx512},
    {"avx2", attend_one_avx2},
#endif
    {"baseline", attend_one_baseline},
};
#define NUM_VARIANTS ((int)(sizeof VARIANTS / sizeof VARIANTS[0]))

static int variant_supported(const char *name) {
#ifdef SLUICE_VARIANTS
    __builtin_cpu_init();
    if (strcmp(name, "avx512") == 0)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
    if (strcmp(name, "avx2") == 0) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    return strcmp(name, "baseline") == 0;
}

static AttendOne attend_one = attend_one_baseline; /* set at import: the widest this CPU supports */
static const char *attend_variant = "baseline";

/* Returns 0, or -1 when scratch could not be allocated. */
static int run(const PagedArgs *a, int num_threads) {
    int64_t max_len = 0;
    for (int64_t w = 0; w < a->num_work_seqs; ++w) {
        const int64_t len = a->seq_lens[a->seq_ids[w]];
        max_len = len > max_len ? len : max_len;
    }
    const int64_t G = a->num_heads / a->num_kv_heads;
    const int64_t items = a->num_work_seqs * a->num_kv_heads;
    int failed = 0;
    const int64_t chunk = a->num_work_seqs >= 4 * (int64_t)num_threads ? a->num_kv_heads : 1;
#pragma omp parallel num_threads(num_threads) if (items > 1 && num_threads > 1)
    {
        const int64_t padded_len = (max_len + a->block_size - 1) / a->block_size * a->block_size;
        const int64_t scratch_rows = G > TILE_ROWS ? G : TILE_ROWS;
        float *scores = malloc((size_t)(scratch_rows * (padded_len > 0 ? padded_len : 1)) * sizeof(float));
        if (scores == NULL) {
#pragma omp atomic write
            failed = 1;
        }
        /* dynamic: one long sequence must not leave the other threads idle.
         * With sequences enough to go round, a thread takes a sequence's KV
         * heads together: with keys and values interleaved per block they
         * share each block's run, which one thread then reads whole. */
#pragma omp for schedule(dynamic, chunk)
        for (int64_t item = 0; item < items; ++item) {
            if (scores != NULL)
                attend_one(a, a->seq_ids[item / a->num_kv_heads], item % a->num_kv_heads, scores);
        }
        free(scores);
    }
    return failed ? -1 : 0;
}

/* The kernel reads where the indices say: refuse any that point outside the
 * cache, the query or the batch, before reading anything. Here rather than
 * in the wrapper, where the same checks were a dozen tensor reductions a
 * layer (~50 us; a loop over the tables is ~1 us). NULL when they hold. */
static const char *index_error(const PagedArgs *a, int64_t num_seqs, int64_t num_tokens, int64_t num_blocks) {
    const int32_t *starts = a->query_start_loc;
    if (num_seqs > 0 && (starts[0] < 0 || starts[num_seqs] > num_tokens))
        return "block tables, seq_lens and query_start_loc disagree with the cache or query";
    for (int64_t s = 0; s < num_seqs; ++s) {
        const int64_t q_len = (int64_t)starts[s + 1] - starts[s];
        if (q_len < 0 || a->seq_lens[s] < q_len || a->seq_lens[s] > a->max_blocks * a->block_size)
            return "block tables, seq_lens and query_start_loc disagree with the cache or query";
    }
    for (int64_t i = 0; i < num_seqs * a->max_blocks; ++i)
        if (a->block_tables[i] < 0 || a->block_tables[i] >= num_blocks)
            return "block tables, seq_lens and query_start_loc disagree with the cache or query";
    for (int64_t w = 0; w < a->num_work_seqs; ++w)
        if (a->seq_ids[w] < 0 || a->seq_ids[w] >= num_seqs) return "seq_ids outside the batch's sequences";
    return NULL;
}

static PyObject *paged_attention_f32(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, seq_ids, out;
    PagedArgs a;
    long long num_seqs, num_tokens, num_blocks;
    int num_threads;
    if (!PyArg_ParseTuple(args, "KKKKKKKKLLLLLLL(LLLL)(LLL)fiLLL", &query, &key_cache, &value_cache, &block_tables,
                          &seq_lens, &query_start_loc, &seq_ids, &out, &a.num_work_seqs, &a.num_heads,
                          &a.num_kv_heads, &a.head_dim, &a.block_size, &a.max_blocks, &a.q_stride_token,
                          &a.k_stride_block, &a.k_stride_slot, &a.k_stride_head, &a.k_stride_d, &a.v_stride_block,
                          &a.v_stride_slot, &a.v_stride_head, &a.scale, &num_threads, &num_seqs, &num_tokens,
                          &num_blocks))
        return NULL;
    a.prefetch_blocks = a.k_stride_head > a.k_stride_block;
    if (a.num_kv_heads <= 0 || a.num_heads % a.num_kv_heads != 0 || a.head_dim <= 0 || a.block_size <= 0 ||
        !(a.k_stride_d == 1 || a.k_stride_slot == 1) || a.q_stride_token < a.num_heads * a.head_dim) {
        PyErr_SetString(PyExc_ValueError, "bad attention shape");
        return NULL;
    }
    a.query = (const float *)(uintptr_t)query;
    a.key_cache = (const float *)(uintptr_t)key_cache;
    a.value_cache = (const float *)(uintptr_t)value_cache;
    a.block_tables = (const int32_t *)(uintptr_t)block_tables;
    a.seq_lens = (const int32_t *)(uintptr_t)seq_lens;
    a.query_start_loc = (const int32_t *)(uintptr_t)query_start_loc;
    a.seq_ids = (const int32_t *)(uintptr_t)seq_ids;
    a.out = (float *)(uintptr_t)out;
    const char *error = index_error(&a, num_seqs, num_tokens, num_blocks);
    if (error != NULL) {
        PyErr_SetString(PyExc_ValueError, error);
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = run(&a, num_threads > 0 ? num_threads : 1);
    Py_END_ALLOW_THREADS if (rc != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* Write this step's K/V rows into their slots, for any layout the attention
 * reads (keys' head_dim may be strided: transposed keys). torch's indexed
 * writes into a transposed cache cost ~0.1 ms a layer in dispatch alone. */
static PyObject *write_kv_f32(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long key, value, key_cache, value_cache, slots;
    long long num_tokens, kv_heads, head_dim, block_size, num_blocks, key_stride_token, value_stride_token;
    long long ksb, kss, ksh, ksd, vsb, vss, vsh;
    if (!PyArg_ParseTuple(args, "KKKKKLLLLLL(LLLL)(LLL)L", &key, &value, &key_cache, &value_cache, &slots,
                          &num_tokens, &kv_heads, &head_dim, &block_size, &key_stride_token, &value_stride_token,
                          &ksb, &kss, &ksh, &ksd, &vsb, &vss, &vsh, &num_blocks))
        return NULL;
    if (key_stride_token < kv_heads * head_dim || value_stride_token < kv_heads * head_dim) {
        PyErr_SetString(PyExc_ValueError, "K/V rows overlap: a token stride below kv_heads * head_dim");
        return NULL;
    }
    for (long long t = 0; t < num_tokens; ++t) /* every slot checked before any is written */
        if (((const int64_t *)(uintptr_t)slots)[t] >= num_blocks * block_size) {
            PyErr_Format(PyExc_ValueError, "slot outside the cache's %lld slots", num_blocks * block_size);
            return NULL;
        }
    const float *k = (const float *)(uintptr_t)key, *v = (const float *)(uintptr_t)value;
    float *kc = (float *)(uintptr_t)key_cache, *vc = (float *)(uintptr_t)value_cache;
    const int64_t *slot = (const int64_t *)(uintptr_t)slots;
    Py_BEGIN_ALLOW_THREADS
    for (long long t = 0; t < num_tokens; ++t) {
        if (slot[t] < 0) continue; /* padding */
        const long long block = slot[t] / block_size, offset = slot[t] % block_size;
        for (long long h = 0; h < kv_heads; ++h) {
            const float *src_k = k + t * key_stride_token + h * head_dim;
            const float *src_v = v + t * value_stride_token + h * head_dim;
            float *dst_k = kc + block * ksb + offset * kss + h * ksh;
            float *dst_v = vc + block * vsb + offset * vss + h * vsh;
            for (long long d = 0; d < head_dim; ++d) dst_k[d * ksd] = src_k[d];
            memcpy(dst_v, src_v, (size_t)head_dim * sizeof(float));
        }
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* The variant the kernel runs ("avx512", "avx2" or "baseline"), and a way to
 * run another this CPU supports: the tests check every one against the
 * reference, not only the widest. */
static PyObject *variant(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyUnicode_FromString(attend_variant);
}

static PyObject *supported_variants(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    PyObject *names = PyList_New(0);
    for (int i = 0; names != NULL && i < NUM_VARIANTS; ++i) {
        if (!variant_supported(VARIANTS[i].name)) continue;
        PyObject *name = PyUnicode_FromString(VARIANTS[i].name);
        if (name == NULL || PyList_Append(names, name) != 0) Py_CLEAR(names);
        Py_XDECREF(name);
    }
    return names;
}

static PyObject *set_variant(PyObject *self, PyObject *args) {
    (void)self;
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    for (int i = 0; i < NUM_VARIANTS; ++i)
        if (strcmp(VARIANTS[i].name, name) == 0 && variant_supported(name)) {
            attend_one = VARIANTS[i].attend_one;
            attend_variant = VARIANTS[i].name;
            Py_RETURN_NONE;
        }
    PyErr_Format(PyExc_ValueError, "no kernel variant %s that this CPU runs", name);
    return NULL;
}

static PyMethodDef methods[] = {
    {"variant", variant, METH_NOARGS, "The instruction-set variant the attention kernel runs."},
    {"supported_variants", supported_variants, METH_NOARGS, "The variants this CPU can run, widest first."},
    {"set_variant", set_variant, METH_VARARGS, "Run another supported variant (tests)."},
    {"write_kv_f32", write_kv_f32, METH_VARARGS, "Write K/V rows into cache slots; pointers and shapes as ints."},
    {"paged_attention_f32", paged_attention_f32, METH_VARARGS,
     "Paged attention over float32 blocks; pointers and shapes as ints (see the wrapper)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_paged_attention_cpu",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__paged_attention_cpu(void) {
    for (int i = 0; i < NUM_VARIANTS; ++i) /* widest first */
        if (variant_supported(VARIANTS[i].name)) {
            attend_one = VARIANTS[i].attend_one;
            attend_variant = VARIANTS[i].name;
            break;
        }
    return PyModule_Create(&module);
}
