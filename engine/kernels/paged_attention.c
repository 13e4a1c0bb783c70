/* Attention over the paged KV cache for a flat batch of query tokens (decodes,
 * verifications and prefill chunks alike).
 *
 * Token t belongs to the sequence in row token_row[t] of the block tables and sees
 * that sequence's first token_keys[t] keys (its own position included). Nothing
 * else about the batch enters a token's arithmetic: for each of its heads, its
 * scores, softmax and weighted sum run over its own keys in ascending order with
 * the same instructions, so batching, chunking and speculation cannot change its
 * bits. Threads split groups of rows, never a sum.
 *
 * A group is up to MAX_ROWS (token, head) rows attended together: up to MAX_TOKENS
 * consecutive tokens of one sequence, times the query heads that share one KV head
 * (grouped-query attention). Each key and value is read from memory once for the
 * whole group and multiplied from registers; alone, every row re-read them, and a
 * prefill chunk over long contexts was bound by reading the cache, not by the
 * multiply-adds.
 *
 * Keys are stored transposed within each block, [block][kv_head][dim][block_size]
 * (values as written, [block][slot][kv_head][dim]): 16 consecutive slots of one
 * dimension are one vector, so a query's scores against 16 keys are `dim`
 * multiply-adds of a broadcast query element, with no horizontal sum. Only this
 * backend reads and writes the cache it is given, so the layout is its own business.
 *
 * The cache holds float32 or bfloat16 (kv_bf16): bfloat16 halves the bytes a decode
 * reads, and a bfloat16 element widens to float32 exactly, so everything after the
 * load is the same arithmetic. New keys and values are rounded to nearest even, as
 * torch rounds.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vector_math.h"

#define MAX_DIM 256   /* head_dim, in vectors of 16: a row's queries and weighted values */
#define MAX_ROWS 16   /* rows of a group: one accumulator register each while scoring */
#define MAX_TOKENS 4  /* consecutive tokens of a group: they see nearly the same keys */
#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* A group's rows: row r's scaled query, its keys n[r], its score scratch s[r] (n[r]
 * and a vector's slack) and its output. */
typedef struct {
    float q[MAX_ROWS][MAX_DIM];
    int64_t n[MAX_ROWS];
    float *s[MAX_ROWS];
    float *out[MAX_ROWS];
} rows_t;

/* The cache of one KV head as a group reads it (offsets in elements). */
typedef struct {
    const void *keys, *values;
    int64_t k_block_stride, slot_stride, block_size, dim;
    const int64_t *table;
} kv_t;

/* 16 cache elements from element i on, as floats. */
ALWAYS_INLINE __m512 load16(const void *cache, int64_t i, const int bf16) {
    if (!bf16) return _mm512_loadu_ps((const float *)cache + i);
    const __m256i half = _mm256_loadu_si256((const __m256i *)((const uint16_t *)cache + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

/* x rounded to the nearest bfloat16, ties to even (NaN stays a quiet NaN). */
static inline uint16_t to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

/* s[r][j] = q[r] . key j for every j below `most` (in whole vectors of 16 keys: lanes
 * past a row's n[r] are masked by the softmax). R a constant: acc stays in registers. */
ALWAYS_INLINE void score(rows_t *g, const kv_t *kv, int64_t most, const int R, const int bf16) {
    for (int64_t j = 0, b = 0; j < most; b++) {
        const int64_t keys = kv->table[b] * kv->k_block_stride;
        for (int64_t i = 0; i < kv->block_size && j < most; i += 16, j += 16) {
            __m512 acc[MAX_ROWS];
            for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
            for (int64_t d = 0; d < kv->dim; d++) {
                const __m512 k = load16(kv->keys, keys + d * kv->block_size + i, bf16);
                for (int r = 0; r < R; r++)
                    acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(g->q[r][d]), k, acc[r]);
            }
            for (int r = 0; r < R; r++) _mm512_storeu_ps(g->s[r] + j, acc[r]);
        }
    }
}

/* out[r] = sum over j < n[r] of s[r][j] value j, times inv[r], for rows r0 .. r0 + R,
 * V vectors a value. Keys every row sees come first, each value loaded once for all R
 * rows; then each row's own last keys. Either way a row adds its keys in ascending
 * order with the same instruction, so its bits do not depend on R or on the others'
 * n. R and V constants keep the R x V accumulators in registers. */
ALWAYS_INLINE void weigh(rows_t *g, const kv_t *kv, const float *inv, int r0, const int R,
                         const int V, const int bf16) {
    __m512 acc[MAX_ROWS][MAX_DIM / 16];
    int64_t common = g->n[r0], most = g->n[r0];
    for (int r = 0; r < R; r++) {
        common = g->n[r0 + r] < common ? g->n[r0 + r] : common;
        most = g->n[r0 + r] > most ? g->n[r0 + r] : most;
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < V; v++) acc[r][v] = _mm512_setzero_ps();
    for (int64_t j = 0, b = 0; j < most; b++) {
        const int64_t block = kv->table[b] * kv->block_size * kv->slot_stride;
        const int64_t count = most - j < kv->block_size ? most - j : kv->block_size;
        for (int64_t i = 0; i < count; i++, j++) {
            const int64_t value = block + i * kv->slot_stride;
            if (j < common) {
                __m512 x[MAX_DIM / 16];
                for (int v = 0; v < V; v++) x[v] = load16(kv->values, value + 16 * v, bf16);
                for (int r = 0; r < R; r++) {
                    const __m512 p = _mm512_set1_ps(g->s[r0 + r][j]);
                    for (int v = 0; v < V; v++) acc[r][v] = _mm512_fmadd_ps(p, x[v], acc[r][v]);
                }
            } else {
                for (int r = 0; r < R; r++) {
                    if (j >= g->n[r0 + r]) continue;
                    const __m512 p = _mm512_set1_ps(g->s[r0 + r][j]);
                    for (int v = 0; v < V; v++)
                        acc[r][v] = _mm512_fmadd_ps(p, load16(kv->values, value + 16 * v, bf16),
                                                    acc[r][v]);
                }
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < V; v++)
            _mm512_storeu_ps(g->out[r0 + r] + 16 * v,
                             _mm512_mul_ps(acc[r][v], _mm512_set1_ps(inv[r0 + r])));
}

/* Softmax numerators in place of row r's scores; returns 1 / their sum. */
static float softmax(float *s, int64_t n) {
    __m512 top = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < n; j += 16)
        top = _mm512_max_ps(top, _mm512_mask_loadu_ps(top, tail(n - j), s + j));
    const __m512 max = _mm512_set1_ps(_mm512_reduce_max_ps(top));
    __m512 total = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 m = tail(n - j);
        const __m512 e = _mm512_maskz_mov_ps(m, exp_nonpositive(_mm512_sub_ps(
                                                    _mm512_maskz_loadu_ps(m, s + j), max)));
        _mm512_mask_storeu_ps(s + j, m, e);
        total = _mm512_add_ps(total, e);
    }
    return 1.0f / _mm512_reduce_add_ps(total);
}

typedef void (*score_fn)(rows_t *, const kv_t *, int64_t);
typedef void (*weigh_fn)(rows_t *, const kv_t *, const float *, int);

/* One instance per row count (and value width) and cache type, so the accumulators are
 * registers. */
#define SCORE(R)                                                                         \
    static void score_##R(rows_t *g, const kv_t *kv, int64_t most) {                     \
        score(g, kv, most, R, 0);                                                        \
    }                                                                                    \
    static void score_bf16_##R(rows_t *g, const kv_t *kv, int64_t most) {                \
        score(g, kv, most, R, 1);                                                        \
    }
SCORE(1) SCORE(2) SCORE(3) SCORE(4) SCORE(5) SCORE(6) SCORE(7) SCORE(8)
SCORE(9) SCORE(10) SCORE(11) SCORE(12) SCORE(13) SCORE(14) SCORE(15) SCORE(16)
static const score_fn SCORES[2][MAX_ROWS + 1] = {
    {0, score_1, score_2, score_3, score_4, score_5, score_6, score_7, score_8, score_9,
     score_10, score_11, score_12, score_13, score_14, score_15, score_16},
    {0, score_bf16_1, score_bf16_2, score_bf16_3, score_bf16_4, score_bf16_5, score_bf16_6,
     score_bf16_7, score_bf16_8, score_bf16_9, score_bf16_10, score_bf16_11, score_bf16_12,
     score_bf16_13, score_bf16_14, score_bf16_15, score_bf16_16}};

/* R x V accumulators, V values and a broadcast fit the 32 vector registers. */
#define WEIGH(R, V)                                                                        \
    static void weigh_##R##_##V(rows_t *g, const kv_t *kv, const float *inv, int r0) {     \
        weigh(g, kv, inv, r0, R, V, 0);                                                    \
    }                                                                                      \
    static void weigh_bf16_##R##_##V(rows_t *g, const kv_t *kv, const float *inv, int r0) {\
        weigh(g, kv, inv, r0, R, V, 1);                                                    \
    }
WEIGH(1, 4) WEIGH(2, 4) WEIGH(3, 4) WEIGH(4, 4) WEIGH(5, 4) WEIGH(6, 4)
WEIGH(1, 8) WEIGH(2, 8) WEIGH(3, 8)
#define ROWS_AT_4 6 /* rows a pass takes at head_dim 64 */
#define ROWS_AT_8 3 /* and at 128 */
static const weigh_fn WEIGH_4[2][ROWS_AT_4 + 1] = {
    {0, weigh_1_4, weigh_2_4, weigh_3_4, weigh_4_4, weigh_5_4, weigh_6_4},
    {0, weigh_bf16_1_4, weigh_bf16_2_4, weigh_bf16_3_4, weigh_bf16_4_4, weigh_bf16_5_4,
     weigh_bf16_6_4}};
static const weigh_fn WEIGH_8[2][ROWS_AT_8 + 1] = {
    {0, weigh_1_8, weigh_2_8, weigh_3_8}, {0, weigh_bf16_1_8, weigh_bf16_2_8, weigh_bf16_3_8}};

/* Any other head_dim: one row a pass, its accumulators wherever the compiler puts them. */
static void weigh_any(rows_t *g, const kv_t *kv, const float *inv, int r0) {
    weigh(g, kv, inv, r0, 1, (int)(kv->dim / 16), 0);
}
static void weigh_any_bf16(rows_t *g, const kv_t *kv, const float *inv, int r0) {
    weigh(g, kv, inv, r0, 1, (int)(kv->dim / 16), 1);
}
static const weigh_fn WEIGH_ANY[2] = {weigh_any, weigh_any_bf16};

static void attend(rows_t *g, const kv_t *kv, int rows, int bf16) {
    int64_t most = 0;
    for (int r = 0; r < rows; r++) most = g->n[r] > most ? g->n[r] : most;
    SCORES[bf16][rows](g, kv, most);
    float inv[MAX_ROWS];
    for (int r = 0; r < rows; r++) inv[r] = softmax(g->s[r], g->n[r]);
    const int64_t vecs = kv->dim / 16;
    const weigh_fn *blocked = vecs == 4 ? WEIGH_4[bf16] : vecs == 8 ? WEIGH_8[bf16] : NULL;
    const int per_pass = vecs == 4 ? ROWS_AT_4 : vecs == 8 ? ROWS_AT_8 : 1;
    for (int r0 = 0; r0 < rows; r0 += per_pass) {
        const int R = rows - r0 < per_pass ? rows - r0 : per_pass;
        (blocked != NULL ? blocked[R] : WEIGH_ANY[bf16])(g, kv, inv, r0);
    }
}

/* q [tokens, heads, dim] and k, v [tokens, kv_heads, dim] with token strides q_stride and
 * kv_stride (heads contiguous); the key cache [blocks, kv_heads, dim, block_size], the
 * value cache [slots, kv_heads, dim], float32 or (kv_bf16) bfloat16; out [tokens, heads,
 * dim] contiguous. dim a multiple of 16, at most MAX_DIM. Returns 0, or -1 when scratch
 * memory could not be had. */
int paged_attention(const float *q, int64_t q_stride, const float *k, const float *v,
                    int64_t kv_stride, void *k_cache, void *v_cache, int kv_bf16,
                    const int64_t *slots,
                    const int64_t *block_tables, int64_t table_stride, const int64_t *token_row,
                    const int64_t *token_keys, int64_t tokens, int64_t heads, int64_t kv_heads,
                    int64_t dim, int64_t block_size, float scale, float *out) {
    const int64_t slot_stride = kv_heads * dim, per_kv = heads / kv_heads;
    const int64_t k_block_stride = block_size * slot_stride;
    /* A group: `group_heads` heads of one KV head times up to `group_tokens` tokens. */
    const int64_t group_heads = per_kv < MAX_ROWS ? per_kv : MAX_ROWS;
    const int64_t group_tokens = MAX_ROWS / group_heads < MAX_TOKENS ? MAX_ROWS / group_heads
                                                                     : MAX_TOKENS;
    const int64_t head_groups = kv_heads * ((per_kv + group_heads - 1) / group_heads);
    /* Runs of up to group_tokens consecutive tokens of one sequence: first[r] .. first[r + 1]. */
    int64_t *first = malloc((tokens + 1) * sizeof(int64_t));
    if (first == NULL) return -1;
    int64_t runs = 0, most_keys = 16;
    for (int64_t t = 0; t < tokens; t++) {
        if (t == 0 || token_row[t] != token_row[t - 1] || t - first[runs - 1] == group_tokens)
            first[runs++] = t;
        most_keys = token_keys[t] > most_keys ? token_keys[t] : most_keys;
    }
    first[runs] = tokens;
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tokens; t++) {
            const int64_t block = slots[t] / block_size, i = slots[t] % block_size;
            const int64_t keys = block * k_block_stride + i, values = slots[t] * slot_stride;
            const float *kt = k + t * kv_stride, *vt = v + t * kv_stride;
            if (kv_bf16) {
                uint16_t *kc = k_cache, *vc = v_cache;
                for (int64_t e = 0; e < slot_stride; e++) {
                    kc[keys + e * block_size] = to_bf16(kt[e]);
                    vc[values + e] = to_bf16(vt[e]);
                }
            } else {
                float *kc = k_cache, *vc = v_cache;
                for (int64_t e = 0; e < slot_stride; e++) kc[keys + e * block_size] = kt[e];
                memcpy(vc + values, vt, slot_stride * sizeof(float));
            }
        }
        /* (the loop's barrier: every new key is in the cache before any query reads it) */
        const int64_t row_scratch = most_keys + 16;
        float *scratch = malloc(MAX_ROWS * row_scratch * sizeof(float));
        rows_t *g = malloc(sizeof(rows_t));
        failed = scratch == NULL || g == NULL;
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < runs * head_groups; i++) {
            if (scratch == NULL || g == NULL) continue;
            const int64_t run = i / head_groups, t0 = first[run];
            const int64_t kv_head = i % head_groups % kv_heads;
            const int64_t skip = i % head_groups / kv_heads * group_heads; /* of its heads */
            const int64_t h0 = kv_head * per_kv + skip;
            const int64_t nh = per_kv - skip < group_heads ? per_kv - skip : group_heads;
            const int rows = (int)((first[run + 1] - t0) * nh);
            for (int r = 0; r < rows; r++) {
                const int64_t t = t0 + r / nh, h = h0 + r % nh;
                const float *query = q + t * q_stride + h * dim;
                for (int64_t d = 0; d < dim; d++) g->q[r][d] = query[d] * scale;
                g->n[r] = token_keys[t];
                g->s[r] = scratch + r * row_scratch;
                g->out[r] = out + (t * heads + h) * dim;
            }
            const size_t size = kv_bf16 ? 2 : 4;
            const kv_t kv = {(const char *)k_cache + kv_head * dim * block_size * size,
                             (const char *)v_cache + kv_head * dim * size,
                             k_block_stride, slot_stride, block_size, dim,
                             block_tables + token_row[t0] * table_stride};
            attend(g, &kv, rows, kv_bf16 != 0);
        }
        free(g);
        free(scratch);
    }
    free(first);
    return failed ? -1 : 0;
}
