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

/* scores_from_columns for 16-slot blocks, the default, written with GCC's
 * vector extensions: a block's 16 scores are one vector (one AVX-512
 * register, two AVX2 ones, four SSE ones: the clone's ISA decides). From
 * the arrays above GCC built the sum of the four partial vectors with
 * lane shuffles and spilled them to the stack: a third of the kernel's time
 * over cached blocks went there. */
typedef float f32x16 __attribute__((vector_size(64)));

/* acc += q * p[0..15]. Vectors pass by pointer: by value they would change
 * the ABI between the clones (GCC warns), inlined or not. */
static inline __attribute__((always_inline)) void fma16(f32x16 *acc, float q, const float *p) {
    f32x16 v;
    memcpy(&v, p, sizeof v);
    *acc += q * v;
}

static inline __attribute__((always_inline)) void scores_from_columns16(const PagedArgs *a, const float *k_head,
                                                                        const int32_t *table, const float *qg,
                                                                        float *s, int64_t visible, int first_head,
                                                                        const int64_t D) {
    const int64_t num_blocks = (visible + 15) / 16, stride_d = a->k_stride_d;
    for (int64_t b = 0; b < num_blocks; ++b) {
        const float *k_block = k_head + (int64_t)table[b] * a->k_stride_block;
        if (first_head && a->prefetch_blocks && b + 1 < num_blocks)
            prefetch_block(k_head + (int64_t)table[b + 1] * a->k_stride_block, D, stride_d, 16);
        f32x16 acc0 = {0}, acc1 = {0}, acc2 = {0}, acc3 = {0};
        int64_t d = 0;
        for (; d + 4 <= D; d += 4) {
            const float *c = k_block + d * stride_d;
            fma16(&acc0, qg[d], c);
            fma16(&acc1, qg[d + 1], c + stride_d);
            fma16(&acc2, qg[d + 2], c + 2 * stride_d);
            fma16(&acc3, qg[d + 3], c + 3 * stride_d);
        }
        for (; d < D; ++d) fma16(&acc0, qg[d], k_block + d * stride_d);
        const f32x16 acc = (acc0 + acc1) + (acc2 + acc3);
        memcpy(s + b * 16, &acc, sizeof acc);
    }
}

/* out[0..D) = inv_sum * sum_j w[j] V[j] over keys 0..visible-1, D a
 * multiple of 16 up to 128: each row is D/16 vectors, accumulated in two
 * alternating sets (as the scores' four, against FMA latency). */
static inline __attribute__((always_inline)) void weighted_values16(const PagedArgs *a, const float *v_head,
                                                                    const int32_t *table, const float *w,
                                                                    int64_t visible, int64_t num_blocks,
                                                                    int first_head, float *out, float inv_sum,
                                                                    const int64_t D) {
    const int64_t bs = a->block_size, stride_slot = a->v_stride_slot, V = D / 16;
    f32x16 acc0[8] = {{0}}, acc1[8] = {{0}};
    for (int64_t b = 0; b < num_blocks; ++b) {
        const float *v_block = v_head + (int64_t)table[b] * a->v_stride_block;
        if (first_head && a->prefetch_blocks && b + 1 < num_blocks)
            prefetch_block(v_head + (int64_t)table[b + 1] * a->v_stride_block, bs, stride_slot, D);
        const int64_t n = visible - b * bs < bs ? visible - b * bs : bs;
        const float *wb = w + b * bs;
        int64_t j = 0;
        for (; j + 2 <= n; j += 2) {
            const float *v0 = v_block + j * stride_slot, *v1 = v0 + stride_slot;
            for (int64_t x = 0; x < V; ++x) {
                fma16(&acc0[x], wb[j], v0 + 16 * x);
                fma16(&acc1[x], wb[j + 1], v1 + 16 * x);
            }
        }
        if (j < n)
            for (int64_t x = 0; x < V; ++x) fma16(&acc0[x], wb[j], v_block + j * stride_slot + 16 * x);
    }
    for (int64_t x = 0; x < V; ++x) {
        const f32x16 sum = (acc0[x] + acc1[x]) * inv_sum;
        memcpy(out + 16 * x, &sum, sizeof sum);
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

/* One (sequence, KV head): all its query tokens and the G query heads of the group.
 * scores: scratch of G * seq_len floats, each row padded to whole blocks. D is a parameter so that the
 * common head sizes get loops of constant length (see attend_one). */
static inline __attribute__((always_inline)) void attend_one_d(const PagedArgs *a, int64_t seq,
                                                               int64_t kv_head, float *scores,
                                                               const int64_t D) {
    const int64_t G = a->num_heads / a->num_kv_heads, bs = a->block_size;
    const int64_t seq_len = a->seq_lens[seq];
    const int64_t q_begin = a->query_start_loc[seq], q_end = a->query_start_loc[seq + 1];
    const int64_t q_len = q_end - q_begin;
    const int32_t *table = a->block_tables + seq * a->max_blocks;
    const float *k_head = a->key_cache + kv_head * a->k_stride_head;
    const float *v_head = a->value_cache + kv_head * a->v_stride_head;

    for (int64_t i = 0; i < q_len; ++i) {
        const int64_t visible = seq_len - q_len + i + 1; /* keys 0 .. position */
        const int64_t num_blocks = (visible + bs - 1) / bs;
        const int64_t row = num_blocks * bs; /* a query head's scores, padded to whole blocks */
        const float *q = a->query + (q_begin + i) * a->q_stride_token + kv_head * G * D;
        float *o = a->out + ((q_begin + i) * a->num_heads + kv_head * G) * D;

        /* Scores. One query head at a time, so its q stays in registers
         * (a block is a few KB: the second head reads it from L1). */
        for (int64_t g = 0; g < G; ++g) {
            float qg[D];
            for (int64_t d = 0; d < D; ++d) qg[d] = q[g * D + d] * a->scale;
            float *s = scores + g * row;
            if (a->k_stride_d == 1)
                scores_from_rows(a, k_head, table, qg, s, visible, g == 0, D);
            else if (bs == 16)
                scores_from_columns16(a, k_head, table, qg, s, visible, g == 0, D);
            else if (bs == 32)
                scores_from_columns(a, k_head, table, qg, s, visible, g == 0, D, 32);
            else
                scores_from_columns(a, k_head, table, qg, s, visible, g == 0, D, bs);
        }
        /* Softmax weights per query head, unnormalised (the sum divides the output). */
        float inv_sum[G];
        for (int64_t g = 0; g < G; ++g) inv_sum[g] = softmax_weights(scores + g * row, visible);
        /* Weighted sum of values, accumulated in registers per query head. */
        for (int64_t g = 0; g < G; ++g) {
            const float *s = scores + g * row;
            if (D % 16 == 0 && D <= 128) { /* the common head sizes: rows as whole vectors */
                weighted_values16(a, v_head, table, s, visible, num_blocks, g == 0, o + g * D, inv_sum[g], D);
                continue;
            }
            /* Rows alternate between two accumulators, for the same reason
             * as the scores' four. */
            float acc0[D], acc1[D];
            for (int64_t d = 0; d < D; ++d) acc0[d] = acc1[d] = 0.0f;
            for (int64_t b = 0; b < num_blocks; ++b) {
                const float *v_block = v_head + (int64_t)table[b] * a->v_stride_block;
                if (g == 0 && a->prefetch_blocks && b + 1 < num_blocks)
                    prefetch_block(v_head + (int64_t)table[b + 1] * a->v_stride_block, bs, a->v_stride_slot, D);
                const int64_t n = visible - b * bs < bs ? visible - b * bs : bs;
                const float *w = s + b * bs;
                int64_t j = 0;
                for (; j + 2 <= n; j += 2) {
                    const float *v0 = v_block + j * a->v_stride_slot, *v1 = v0 + a->v_stride_slot;
                    const float w0 = w[j], w1 = w[j + 1];
#pragma omp simd
                    for (int64_t d = 0; d < D; ++d) {
                        acc0[d] += w0 * v0[d];
                        acc1[d] += w1 * v1[d];
                    }
                }
                if (j < n) {
                    const float *v0 = v_block + j * a->v_stride_slot;
                    const float w0 = w[j];
#pragma omp simd
                    for (int64_t d = 0; d < D; ++d) acc0[d] += w0 * v0[d];
                }
            }
            float acc[D];
            for (int64_t d = 0; d < D; ++d) acc[d] = acc0[d] + acc1[d];
            for (int64_t d = 0; d < D; ++d) o[g * D + d] = acc[d] * inv_sum[g];
        }
    }
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

/* acc[r] += w[r][key] * v (one or two vectors of a value row) for the
 * tile's rows that see `key`: every row where `all_see` (a constant at
 * each call, so the check folds away), else those with visible[r] > key. */
static inline __attribute__((always_inline)) void add_value_row(f32x16 acc[TILE_ROWS][2], const float *scores,
                                                                int64_t row, int64_t key, const float *v,
                                                                int64_t step, const int64_t *visible,
                                                                int all_see) {
    f32x16 v0, v1 = {0};
    memcpy(&v0, v, sizeof v0);
    if (step == 2) memcpy(&v1, v + 16, sizeof v1);
    for (int64_t r = 0; r < TILE_ROWS; ++r) {
        if (!all_see && key >= visible[r]) continue;
        const float w = scores[r * row + key];
        acc[r][0] += w * v0;
        if (step == 2) acc[r][1] += w * v1;
    }
}

static inline __attribute__((always_inline)) void attend_tiled_d(const PagedArgs *a, int64_t seq,
                                                                 int64_t kv_head, float *scores,
                                                                 const int64_t D) {
    const int64_t G = a->num_heads / a->num_kv_heads;
    const int64_t seq_len = a->seq_lens[seq];
    const int64_t q_begin = a->query_start_loc[seq], q_len = a->query_start_loc[seq + 1] - q_begin;
    const int32_t *table = a->block_tables + seq * a->max_blocks;
    const float *k_head = a->key_cache + kv_head * a->k_stride_head;
    const float *v_head = a->value_cache + kv_head * a->v_stride_head;
    const int64_t stride_d = a->k_stride_d, stride_slot = a->v_stride_slot, V = D / 16;
    const int64_t rows_total = q_len * G;

    for (int64_t f0 = 0; f0 < rows_total; f0 += TILE_ROWS) {
        const int64_t rows = rows_total - f0 < TILE_ROWS ? rows_total - f0 : TILE_ROWS;
        int64_t visible[TILE_ROWS];
        const float *q_row[TILE_ROWS];
        float *o_row[TILE_ROWS];
        for (int64_t r = 0; r < TILE_ROWS; ++r) {
            const int64_t f = f0 + (r < rows ? r : rows - 1), i = f / G, g = f % G;
            visible[r] = seq_len - q_len + i + 1;
            q_row[r] = a->query + (q_begin + i) * a->q_stride_token + (kv_head * G + g) * D;
            o_row[r] = a->out + ((q_begin + i) * a->num_heads + kv_head * G + g) * D;
        }
        const int64_t visible_min = visible[0], visible_max = visible[rows - 1];
        const int64_t num_blocks = (visible_max + 15) / 16, row = num_blocks * 16;
        float qs[TILE_ROWS][D];
        for (int64_t r = 0; r < TILE_ROWS; ++r)
            for (int64_t d = 0; d < D; ++d) qs[r][d] = q_row[r][d] * a->scale;

        /* Scores: a block's 16 keys for every row, one column load per dimension. */
        for (int64_t b = 0; b < num_blocks; ++b) {
            const float *k_block = k_head + (int64_t)table[b] * a->k_stride_block;
            f32x16 acc[TILE_ROWS];
            for (int64_t r = 0; r < TILE_ROWS; ++r) acc[r] = (f32x16){0};
            for (int64_t d = 0; d < D; ++d) {
                f32x16 column;
                memcpy(&column, k_block + d * stride_d, sizeof column);
                for (int64_t r = 0; r < TILE_ROWS; ++r) acc[r] += qs[r][d] * column;
            }
            for (int64_t r = 0; r < TILE_ROWS; ++r) memcpy(scores + r * row + b * 16, &acc[r], sizeof acc[r]);
        }
        /* Softmax weights per row over the keys it sees, unnormalised. */
        float inv_sum[TILE_ROWS];
        for (int64_t r = 0; r < TILE_ROWS; ++r) inv_sum[r] = softmax_weights(scores + r * row, visible[r]);
        /* Weighted values: each value row loaded once for every row, two
         * vectors of it at a time (the rows' accumulators fill the registers). */
        const int64_t step = V % 2 == 0 ? 2 : 1;
        for (int64_t x = 0; x < V; x += step) {
            f32x16 acc[TILE_ROWS][2];
            for (int64_t r = 0; r < TILE_ROWS; ++r) acc[r][0] = acc[r][1] = (f32x16){0};
            for (int64_t b = 0; b < num_blocks; ++b) {
                const float *v_block = v_head + (int64_t)table[b] * a->v_stride_block;
                const int64_t first = b * 16;
                const int64_t shared = visible_min - first < 16 ? visible_min - first : 16; /* keys all rows see */
                const int64_t any = visible_max - first < 16 ? visible_max - first : 16;
                int64_t j = 0;
                for (; j < shared; ++j)
                    add_value_row(acc, scores, row, first + j, v_block + j * stride_slot + 16 * x, step, visible, 1);
                for (; j < any; ++j)
                    add_value_row(acc, scores, row, first + j, v_block + j * stride_slot + 16 * x, step, visible, 0);
            }
            for (int64_t r = 0; r < rows; ++r) {
                const f32x16 out0 = acc[r][0] * inv_sum[r];
                memcpy(o_row[r] + 16 * x, &out0, sizeof out0);
                if (step == 2) {
                    const f32x16 out1 = acc[r][1] * inv_sum[r];
                    memcpy(o_row[r] + 16 * x + 16, &out1, sizeof out1);
                }
            }
        }
    }
}

/* Whether an item takes the tiled path: a prefill or chunk (a decode's one
 * query row per head has nothing to share a load with) in the layout and
 * sizes it is written for. */
static inline int tiled(const PagedArgs *a, int64_t seq) {
    const int64_t q_len = a->query_start_loc[seq + 1] - a->query_start_loc[seq];
    return q_len > 1 && q_len * (a->num_heads / a->num_kv_heads) >= TILE_ROWS && a->k_stride_d != 1 && a->block_size == 16 &&
           a->head_dim % 16 == 0 && a->head_dim <= 128;
}

SLUICE_CLONES
static void attend_one(const PagedArgs *a, int64_t seq, int64_t kv_head, float *scores) {
    if (tiled(a, seq)) {
        switch (a->head_dim) {
        case 32: attend_tiled_d(a, seq, kv_head, scores, 32); return;
        case 64: attend_tiled_d(a, seq, kv_head, scores, 64); return;
        case 128: attend_tiled_d(a, seq, kv_head, scores, 128); return;
        default: attend_tiled_d(a, seq, kv_head, scores, a->head_dim); return;
        }
    }
    switch (a->head_dim) {
    case 64: attend_one_d(a, seq, kv_head, scores, 64); break;
    case 128: attend_one_d(a, seq, kv_head, scores, 128); break;
    case 32: attend_one_d(a, seq, kv_head, scores, 32); break;
    default: attend_one_d(a, seq, kv_head, scores, a->head_dim); break;
    }
}

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

static PyMethodDef methods[] = {
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

PyMODINIT_FUNC PyInit__paged_attention_cpu(void) { return PyModule_Create(&module); }
