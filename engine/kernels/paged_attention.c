/* Attention over the paged KV cache for a flat batch of query tokens (decodes,
 * verifications and prefill chunks alike), one (token, head) at a time.
 *
 * Token t belongs to the sequence in row token_row[t] of the block tables and sees
 * that sequence's first token_keys[t] keys (its own position included). Nothing
 * else about the batch enters a token's arithmetic: its scores, softmax and
 * weighted sum run over its own keys in ascending order with the same
 * instructions, so batching, chunking and speculation cannot change its bits.
 * Threads split (group of tokens, head) pairs, never a sum.
 *
 * Keys are stored transposed within each block, [block][kv_head][dim][block_size]
 * (values as written, [block][slot][kv_head][dim]): 16 consecutive slots of one
 * dimension are one vector, so a query's scores against 16 keys are 64 multiply-adds
 * of a broadcast query element, with no horizontal sum. Only this backend reads and
 * writes the cache it is given, so the layout is its own business.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vector_math.h"

#define MAX_DIM 256 /* head_dim up to 16 registers of 16 floats (a row's weighted values) */

#define GROUP 4 /* a chunk's consecutive queries attended together: each key is read once
                  * for the 4 (they see the same blocks), while every query keeps its own
                  * arithmetic, the same as alone */

/* One query head of `rows` consecutive tokens of one sequence, token r over its n[r]
 * keys; s[r] is scratch for n[r] scores (and a vector's slack). */
static inline __attribute__((always_inline)) void attend(
    const float *const *q, const float *k_cache, const float *v_cache, int64_t k_block_stride,
    int64_t slot_stride, const int64_t *table, int64_t block_size, const int64_t *n,
    int64_t dim, float scale, float *const *s, float *const *out, int rows) {
    const int64_t vecs = dim / 16;
    int64_t most = 0;
    for (int r = 0; r < rows; r++) most = n[r] > most ? n[r] : most;
    float qs[GROUP][MAX_DIM];
    for (int r = 0; r < rows; r++)
        for (int64_t d = 0; d < dim; d++) qs[r][d] = q[r][d] * scale;
    /* Scores 16 keys at a time; lanes past a row's n[r] are masked below. */
    for (int64_t j = 0, b = 0; j < most; b++) {
        const float *keys = k_cache + table[b] * k_block_stride;
        for (int64_t i = 0; i < block_size && j < most; i += 16, j += 16) {
            __m512 acc[GROUP];
            for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
            for (int64_t d = 0; d < dim; d++) {
                const __m512 k = _mm512_loadu_ps(keys + d * block_size + i);
                for (int r = 0; r < rows; r++)
                    acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(qs[r][d]), k, acc[r]);
            }
            for (int r = 0; r < rows; r++) _mm512_storeu_ps(s[r] + j, acc[r]);
        }
    }
    float inv[GROUP];
    for (int r = 0; r < rows; r++) {
        __m512 top = _mm512_set1_ps(-INFINITY);
        for (int64_t j = 0; j < n[r]; j += 16)
            top = _mm512_max_ps(top, _mm512_mask_loadu_ps(top, tail(n[r] - j), s[r] + j));
        const __m512 max = _mm512_set1_ps(_mm512_reduce_max_ps(top));
        __m512 total = _mm512_setzero_ps();
        for (int64_t j = 0; j < n[r]; j += 16) {
            const __mmask16 m = tail(n[r] - j);
            const __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, s[r] + j), max);
            const __m512 e = _mm512_maskz_mov_ps(m, exp_nonpositive(x));
            _mm512_mask_storeu_ps(s[r] + j, m, e);
            total = _mm512_add_ps(total, e);
        }
        inv[r] = 1.0f / _mm512_reduce_add_ps(total);
    }
    __m512 acc[GROUP][MAX_DIM / 16];
    for (int r = 0; r < rows; r++)
        for (int64_t d = 0; d < vecs; d++) acc[r][d] = _mm512_setzero_ps();
    for (int64_t j = 0, b = 0; j < most; b++) {
        const int64_t first = table[b] * block_size;
        const int64_t count = most - j < block_size ? most - j : block_size;
        for (int64_t i = 0; i < count; i++, j++) {
            const float *value = v_cache + (first + i) * slot_stride;
            for (int r = 0; r < rows; r++) {
                if (j >= n[r]) continue;
                const __m512 p = _mm512_set1_ps(s[r][j]);
                for (int64_t d = 0; d < vecs; d++)
                    acc[r][d] = _mm512_fmadd_ps(p, _mm512_loadu_ps(value + 16 * d), acc[r][d]);
            }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int64_t d = 0; d < vecs; d++)
            _mm512_storeu_ps(out[r] + 16 * d, _mm512_mul_ps(acc[r][d], _mm512_set1_ps(inv[r])));
}

typedef void (*attend_fn)(const float *const *, const float *, const float *, int64_t,
                          int64_t, const int64_t *, int64_t, const int64_t *, int64_t, float,
                          float *const *, float *const *);

/* One instance per group size, so each keeps its vectors in registers. */
#define ATTEND_ROWS(R)                                                                       \
    static void attend_##R(const float *const *q, const float *k_cache, const float *v_cache, \
                           int64_t k_block_stride, int64_t slot_stride, const int64_t *table, \
                           int64_t block_size, const int64_t *n, int64_t dim, float scale,    \
                           float *const *s, float *const *out) {                              \
        attend(q, k_cache, v_cache, k_block_stride, slot_stride, table, block_size, n, dim,   \
               scale, s, out, R);                                                             \
    }
ATTEND_ROWS(1)
ATTEND_ROWS(2)
ATTEND_ROWS(3)
ATTEND_ROWS(4)
static const attend_fn ATTEND[GROUP + 1] = {0, attend_1, attend_2, attend_3, attend_4};

/* q [tokens, heads, dim] and k, v [tokens, kv_heads, dim] with token strides q_stride and
 * kv_stride (heads contiguous); the key cache [blocks, kv_heads, dim, block_size], the
 * value cache [slots, kv_heads, dim]; out [tokens, heads, dim] contiguous. dim a multiple of 16, at most MAX_DIM. Returns 0, or -1 when
 * scratch memory could not be had. */
int paged_attention(const float *q, int64_t q_stride, const float *k, const float *v,
                    int64_t kv_stride, float *k_cache, float *v_cache, const int64_t *slots,
                    const int64_t *block_tables, int64_t table_stride, const int64_t *token_row,
                    const int64_t *token_keys, int64_t tokens, int64_t heads, int64_t kv_heads,
                    int64_t dim, int64_t block_size, float scale, float *out) {
    const int64_t slot_stride = kv_heads * dim, per_kv = heads / kv_heads;
    const int64_t k_block_stride = block_size * slot_stride;
    /* Groups of up to GROUP consecutive tokens of one sequence: first[g] .. first[g + 1]. */
    int64_t *first = malloc((tokens + 1) * sizeof(int64_t));
    if (first == NULL) return -1;
    int64_t groups = 0, most_keys = 16;
    for (int64_t t = 0; t < tokens; t++) {
        if (t == 0 || token_row[t] != token_row[t - 1] || t - first[groups - 1] == GROUP)
            first[groups++] = t;
        most_keys = token_keys[t] > most_keys ? token_keys[t] : most_keys;
    }
    first[groups] = tokens;
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tokens; t++) {
            const int64_t block = slots[t] / block_size, i = slots[t] % block_size;
            float *keys = k_cache + block * k_block_stride + i;
            for (int64_t e = 0; e < slot_stride; e++) keys[e * block_size] = k[t * kv_stride + e];
            memcpy(v_cache + slots[t] * slot_stride, v + t * kv_stride, slot_stride * sizeof(float));
        }
        /* (the loop's barrier: every new key is in the cache before any query reads it) */
        float *scratch = malloc(GROUP * (most_keys + 16) * sizeof(float));
        failed = scratch == NULL;
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < groups * heads; i++) {
            if (scratch == NULL) continue;
            const int64_t g = i / heads, h = i % heads, t0 = first[g];
            const int rows = (int)(first[g + 1] - t0);
            const float *qs[GROUP];
            float *scores[GROUP], *outs[GROUP];
            for (int r = 0; r < rows; r++) {
                qs[r] = q + (t0 + r) * q_stride + h * dim;
                scores[r] = scratch + r * (most_keys + 16);
                outs[r] = out + ((t0 + r) * heads + h) * dim;
            }
            const int64_t kv_head = h / per_kv;
            ATTEND[rows](qs, k_cache + kv_head * dim * block_size, v_cache + kv_head * dim,
                         k_block_stride, slot_stride, block_tables + token_row[t0] * table_stride,
                         block_size, token_keys + t0, dim, scale, scores, outs);
        }
        free(scratch);
    }
    free(first);
    return failed ? -1 : 0;
}
