/*
 * The vectorised half of the CPU paged-attention kernel, included by
 * _paged_attention_cpu.c once per instruction set it is built for.
 *
 * A block's 16 scores, or 16 floats of a value row, are one `V16`. The
 * including file defines V16 and its operations for the variant: one
 * 512-bit vector where AVX-512 is on, two 256-bit halves elsewhere. GCC's
 * generic 16-float vector compiled for AVX2 or SSE went through the stack
 * element by element (a 64-decode layer 2.5-2.9 ms against 0.28 ms on the
 * same Zen 5 core in AVX-512), so each width gets its own type. VEC_FN
 * names each function after its variant.
 *
 *   V16_ZERO             a V16 of zeros
 *   V16_LOAD(&v, p)      v = p[0..15]            V16_STORE(p, &v)   p[0..15] = v
 *   V16_FMA(&acc, s, &v) acc += s * v            V16_SUM(&o, &a, &b) o = a + b
 *   V16_SCALE(&v, s)     v *= s
 */

/* acc += q * p[0..15]. Vectors pass by pointer: by value they would change
 * the ABI between the variants (GCC warns), inlined or not. */
static inline __attribute__((always_inline)) void VEC_FN(fma16)(V16 *acc, float q, const float *p) {
    V16 v;
    V16_LOAD(&v, p);
    V16_FMA(acc, q, &v);
}

static inline __attribute__((always_inline)) void VEC_FN(scores_from_columns16)(const PagedArgs *a, const float *k_head,
                                                                        const int32_t *table, const float *qg,
                                                                        float *s, int64_t visible, int first_head,
                                                                        const int64_t D) {
    const int64_t num_blocks = (visible + 15) / 16, stride_d = a->k_stride_d;
    for (int64_t b = 0; b < num_blocks; ++b) {
        const float *k_block = k_head + (int64_t)table[b] * a->k_stride_block;
        if (first_head && a->prefetch_blocks && b + 1 < num_blocks)
            prefetch_block(k_head + (int64_t)table[b + 1] * a->k_stride_block, D, stride_d, 16);
        V16 acc0 = V16_ZERO, acc1 = V16_ZERO, acc2 = V16_ZERO, acc3 = V16_ZERO;
        int64_t d = 0;
        for (; d + 4 <= D; d += 4) {
            const float *c = k_block + d * stride_d;
            VEC_FN(fma16)(&acc0, qg[d], c);
            VEC_FN(fma16)(&acc1, qg[d + 1], c + stride_d);
            VEC_FN(fma16)(&acc2, qg[d + 2], c + 2 * stride_d);
            VEC_FN(fma16)(&acc3, qg[d + 3], c + 3 * stride_d);
        }
        for (; d < D; ++d) VEC_FN(fma16)(&acc0, qg[d], k_block + d * stride_d);
        V16 sum01, sum23, acc;
        V16_SUM(&sum01, &acc0, &acc1);
        V16_SUM(&sum23, &acc2, &acc3);
        V16_SUM(&acc, &sum01, &sum23);
        V16_STORE(s + b * 16, &acc);
    }
}

/* out[0..D) = inv_sum * sum_j w[j] V[j] over keys 0..visible-1, D a
 * multiple of 16 up to 128: each row is D/16 vectors, accumulated in two
 * alternating sets (as the scores' four, against FMA latency). */
static inline __attribute__((always_inline)) void VEC_FN(weighted_values16)(const PagedArgs *a, const float *v_head,
                                                                    const int32_t *table, const float *w,
                                                                    int64_t visible, int64_t num_blocks,
                                                                    int first_head, float *out, float inv_sum,
                                                                    const int64_t D) {
    const int64_t bs = a->block_size, stride_slot = a->v_stride_slot, V = D / 16;
    V16 acc0[8], acc1[8];
    for (int64_t x = 0; x < 8; ++x) acc0[x] = acc1[x] = V16_ZERO;
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
                VEC_FN(fma16)(&acc0[x], wb[j], v0 + 16 * x);
                VEC_FN(fma16)(&acc1[x], wb[j + 1], v1 + 16 * x);
            }
        }
        if (j < n)
            for (int64_t x = 0; x < V; ++x) VEC_FN(fma16)(&acc0[x], wb[j], v_block + j * stride_slot + 16 * x);
    }
    for (int64_t x = 0; x < V; ++x) {
        V16 sum;
        V16_SUM(&sum, &acc0[x], &acc1[x]);
        V16_SCALE(&sum, inv_sum);
        V16_STORE(out + 16 * x, &sum);
    }
}

/* One (sequence, KV head): all its query tokens and the G query heads of the group.
 * scores: scratch of G * seq_len floats, each row padded to whole blocks. D is a parameter so that the
 * common head sizes get loops of constant length (see attend_one). */
static inline __attribute__((always_inline)) void VEC_FN(attend_one_d)(const PagedArgs *a, int64_t seq,
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
                VEC_FN(scores_from_columns16)(a, k_head, table, qg, s, visible, g == 0, D);
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
                VEC_FN(weighted_values16)(a, v_head, table, s, visible, num_blocks, g == 0, o + g * D, inv_sum[g], D);
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


/* acc[r] += w[r][key] * v (one or two vectors of a value row) for the
 * tile's rows that see `key`: every row where `all_see` (a constant at
 * each call, so the check folds away), else those with visible[r] > key. */
static inline __attribute__((always_inline)) void VEC_FN(add_value_row)(V16 acc[TILE_ROWS][2], const float *scores,
                                                                int64_t row, int64_t key, const float *v,
                                                                int64_t step, const int64_t *visible,
                                                                int all_see) {
    V16 v0, v1 = V16_ZERO;
    V16_LOAD(&v0, v);
    if (step == 2) V16_LOAD(&v1, v + 16);
    for (int64_t r = 0; r < TILE_ROWS; ++r) {
        if (!all_see && key >= visible[r]) continue;
        const float w = scores[r * row + key];
        V16_FMA(&acc[r][0], w, &v0);
        if (step == 2) V16_FMA(&acc[r][1], w, &v1);
    }
}

static inline __attribute__((always_inline)) void VEC_FN(attend_tiled_d)(const PagedArgs *a, int64_t seq,
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
            V16 acc[TILE_ROWS];
            for (int64_t r = 0; r < TILE_ROWS; ++r) acc[r] = V16_ZERO;
            for (int64_t d = 0; d < D; ++d) {
                V16 column;
                V16_LOAD(&column, k_block + d * stride_d);
                for (int64_t r = 0; r < TILE_ROWS; ++r) V16_FMA(&acc[r], qs[r][d], &column);
            }
            for (int64_t r = 0; r < TILE_ROWS; ++r) V16_STORE(scores + r * row + b * 16, &acc[r]);
        }
        /* Softmax weights per row over the keys it sees, unnormalised. */
        float inv_sum[TILE_ROWS];
        for (int64_t r = 0; r < TILE_ROWS; ++r) inv_sum[r] = softmax_weights(scores + r * row, visible[r]);
        /* Weighted values: each value row loaded once for every row, two
         * vectors of it at a time (the rows' accumulators fill the registers). */
        const int64_t step = V % 2 == 0 ? 2 : 1;
        for (int64_t x = 0; x < V; x += step) {
            V16 acc[TILE_ROWS][2];
            for (int64_t r = 0; r < TILE_ROWS; ++r) acc[r][0] = acc[r][1] = V16_ZERO;
            for (int64_t b = 0; b < num_blocks; ++b) {
                const float *v_block = v_head + (int64_t)table[b] * a->v_stride_block;
                const int64_t first = b * 16;
                const int64_t shared = visible_min - first < 16 ? visible_min - first : 16; /* keys all rows see */
                const int64_t any = visible_max - first < 16 ? visible_max - first : 16;
                int64_t j = 0;
                for (; j < shared; ++j)
                    VEC_FN(add_value_row)(acc, scores, row, first + j, v_block + j * stride_slot + 16 * x, step, visible, 1);
                for (; j < any; ++j)
                    VEC_FN(add_value_row)(acc, scores, row, first + j, v_block + j * stride_slot + 16 * x, step, visible, 0);
            }
            for (int64_t r = 0; r < rows; ++r) {
                V16_SCALE(&acc[r][0], inv_sum[r]);
                V16_STORE(o_row[r] + 16 * x, &acc[r][0]);
                if (step == 2) {
                    V16_SCALE(&acc[r][1], inv_sum[r]);
                    V16_STORE(o_row[r] + 16 * x + 16, &acc[r][1]);
                }
            }
        }
    }
}

static void VEC_FN(attend_one)(const PagedArgs *a, int64_t seq, int64_t kv_head, float *scores) {
    if (tiled(a, seq)) {
        switch (a->head_dim) {
        case 32: VEC_FN(attend_tiled_d)(a, seq, kv_head, scores, 32); return;
        case 64: VEC_FN(attend_tiled_d)(a, seq, kv_head, scores, 64); return;
        case 128: VEC_FN(attend_tiled_d)(a, seq, kv_head, scores, 128); return;
        default: VEC_FN(attend_tiled_d)(a, seq, kv_head, scores, a->head_dim); return;
        }
    }
    switch (a->head_dim) {
    case 64: VEC_FN(attend_one_d)(a, seq, kv_head, scores, 64); break;
    case 128: VEC_FN(attend_one_d)(a, seq, kv_head, scores, 128); break;
    case 32: VEC_FN(attend_one_d)(a, seq, kv_head, scores, 32); break;
    default: VEC_FN(attend_one_d)(a, seq, kv_head, scores, a->head_dim); break;
    }
}

