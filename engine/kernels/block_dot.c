/* Block-quantized matrix products for CPU decode, as llama.cpp does them: the
 * activations are quantized here to int8 per row and per block of 32 (one scale
 * each), and multiplied in integers with 4-bit or 8-bit unsigned weights (a scale
 * and a minimum per block) by AVX-512 VNNI.
 *
 * Weights are packed 16 output channels abreast (see engine/block_quantized_linear.py):
 * one vpdpbusd multiplies 16 outputs by 4 inputs and adds them into 16 int32
 * lanes, one lane per output, so a block needs 8 of them and no horizontal sum.
 *
 * Each row's result depends on that row alone: it is quantized on its own, and
 * its outputs are summed block by block in a fixed order with the same
 * instructions whatever the batch (rows share unpacked weights, not arithmetic),
 * and threads split the outputs, never a sum. So batching, chunking and
 * speculation cannot change a row's bits, which the engine's invariance needs.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#include "vector_math.h"

#define BLOCK 32
#define LANES 16
#define MAX_ROWS 8 /* rows sharing one unpacked weight block: 8 weight, 8 accumulator
                    * and a few sum, scale and broadcast registers of the 32 */

/* x [rows, k] float -> q [rows, k] int8, and per block its scale d and the sum of its
 * q. Gated, x is [rows, 2k], a gate then an up half, and the row quantized is
 * silu(gate) * up (SwiGLU, the MLP's input to its down projection). */
static void quantize_rows(const float *x, int64_t rows, int64_t k, int gated, int8_t *q,
                          float *d, int32_t *qsum) {
    const int64_t blocks = k / BLOCK, stride = gated ? 2 * k : k;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows * blocks; i++) {
        const float *xb = x + (i / blocks) * stride + (i % blocks) * BLOCK;
        __m512 a = _mm512_loadu_ps(xb), b = _mm512_loadu_ps(xb + 16);
        if (gated) {
            a = _mm512_mul_ps(silu(a), _mm512_loadu_ps(xb + k));
            b = _mm512_mul_ps(silu(b), _mm512_loadu_ps(xb + k + 16));
        }
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
        const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, inv));
        const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, inv));
        _mm_storeu_si128((__m128i *)(q + i * BLOCK), _mm512_cvtsepi32_epi8(qa));
        _mm_storeu_si128((__m128i *)(q + i * BLOCK + 16), _mm512_cvtsepi32_epi8(qb));
        d[i] = amax / 127.0f;
        qsum[i] = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
    }
}

/* The 4 activation bytes x[4j..4j+3] of a block, in every lane. */
static inline __m512i quad(const int8_t *xb, int j) {
    int32_t v;
    __builtin_memcpy(&v, xb + 4 * j, 4);
    return _mm512_set1_epi32(v);
}

/* A block's weights as 8 vectors of 16 lanes x 4 inputs, wq[c] holding inputs 4c..4c+3
 * of each lane's output channel: what vpdpbusd multiplies with the activation bytes.
 *
 * int4 (bits 4): 4 x 64 bytes of nibbles; lane l's bytes 4l..4l+3 of chunk c hold
 * inputs 8c..8c+3 in their low nibbles and 8c+4..8c+7 in their high ones.
 * int8 (bits 8): 8 x 64 bytes; chunk c holds inputs 4c..4c+3.
 * Either way q is unsigned (0..15, 0..255), as vpdpbusd's first operand must be; a
 * weight is scale * q + minimum, the block's minimum at q = 0 and its maximum at the
 * top, so a 4-bit block (max - min = 15 steps) lands on q = 17 k exactly in 8 bits. */
static inline __attribute__((always_inline)) void unpack(const uint8_t *wb, int bits,
                                                         __m512i wq[8]) {
    if (bits == 8) {
        for (int c = 0; c < 8; c++) wq[c] = _mm512_loadu_si512(wb + 64 * c);
        return;
    }
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    for (int c = 0; c < 4; c++) {
        const __m512i packed = _mm512_loadu_si512(wb + 64 * c);
        wq[2 * c] = _mm512_and_si512(packed, nibble);
        wq[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), nibble);
    }
}

/* One tile (16 output channels) for `rows` rows: per block, its packed weights (16 lanes
 * x 32 inputs x bits / 8 bytes), then 16 scales and 16 minimums (fp16). */
static inline __attribute__((always_inline)) void tile(
    int bits, const uint8_t *w, const uint16_t *s, int64_t blocks, const int8_t *xq,
    const float *xd, const int32_t *xs, int64_t k, int rows, float *y, int64_t ldy) {
    __m512 acc[MAX_ROWS];
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < blocks; g++) {
        __m512i wq[8];
        unpack(w + g * LANES * BLOCK * bits / 8, bits, wq);
        const __m512 scale = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + g * 32)));
        const __m512 low = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + g * 32 + 16)));
        for (int r = 0; r < rows; r++) {
            const int8_t *xb = xq + r * k + g * BLOCK;
            __m512i sum = _mm512_setzero_si512();
            for (int c = 0; c < 8; c++) sum = _mm512_dpbusd_epi32(sum, wq[c], quad(xb, c));
            const int64_t i = r * (k / BLOCK) + g;
            const __m512 dx = _mm512_mul_ps(scale, _mm512_set1_ps(xd[i]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), dx, acc[r]);
            /* The minimums times the block's activations, as quantized. */
            acc[r] = _mm512_fmadd_ps(low, _mm512_set1_ps(xd[i] * (float)xs[i]), acc[r]);
        }
    }
    for (int r = 0; r < rows; r++) _mm512_storeu_ps(y + r * ldy, acc[r]);
}

typedef void (*tile_fn)(const uint8_t *, const uint16_t *, int64_t, const int8_t *,
                        const float *, const int32_t *, int64_t, float *, int64_t);

/* One instance per width and row count, so each keeps its accumulators in registers. */
#define TILE(BITS, R)                                                                       \
    static void tile_##BITS##_##R(const uint8_t *w, const uint16_t *s, int64_t blocks,    \
                                  const int8_t *xq, const float *xd, const int32_t *xs,   \
                                  int64_t k, float *y, int64_t ldy) {                     \
        tile(BITS, w, s, blocks, xq, xd, xs, k, R, y, ldy);                               \
    }
TILE(4, 1)
TILE(4, 2)
TILE(4, 3)
TILE(4, 4)
TILE(4, 5)
TILE(4, 6)
TILE(4, 7)
TILE(4, 8)
TILE(8, 1)
TILE(8, 2)
TILE(8, 3)
TILE(8, 4)
TILE(8, 5)
TILE(8, 6)
TILE(8, 7)
TILE(8, 8)

static const tile_fn INT4_TILES[MAX_ROWS + 1] = {0,        tile_4_1, tile_4_2, tile_4_3, tile_4_4,
                                                 tile_4_5, tile_4_6, tile_4_7, tile_4_8};
static const tile_fn INT8_TILES[MAX_ROWS + 1] = {0,        tile_8_1, tile_8_2, tile_8_3, tile_8_4,
                                                 tile_8_5, tile_8_6, tile_8_7, tile_8_8};

/* y [rows, n] = x [rows, k] @ W.T (gated: see quantize_rows); k a multiple of 32, n of
 * 16. Returns 0, or -1 when scratch memory could not be had. */
static int block_matmul(const tile_fn *tiles, int bits, const float *x, int64_t rows, int64_t k, int64_t n, const uint8_t *w,
                        const uint16_t *s, float *y, int gated) {
    const int64_t blocks = k / BLOCK, tiles_n = n / LANES;
    int8_t *xq = malloc(rows * k + 64);
    float *xd = malloc(rows * blocks * sizeof(float));
    int32_t *xs = malloc(rows * blocks * sizeof(int32_t));
    if (xq == NULL || xd == NULL || xs == NULL) {
        free(xq);
        free(xd);
        free(xs);
        return -1;
    }
#pragma omp parallel
    {
        quantize_rows(x, rows, k, gated, xq, xd, xs);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles_n; t++) {
            const uint8_t *wt = w + t * blocks * LANES * BLOCK * bits / 8;
            const uint16_t *st = s + t * blocks * 2 * LANES;
            for (int64_t r0 = 0; r0 < rows; r0 += MAX_ROWS) {
                const int r = rows - r0 < MAX_ROWS ? (int)(rows - r0) : MAX_ROWS;
                tiles[r](wt, st, blocks, xq + r0 * k, xd + r0 * blocks, xs + r0 * blocks, k,
                         y + r0 * n + t * LANES, n);
            }
        }
    }
    free(xq);
    free(xd);
    free(xs);
    return 0;
}

int int4_matmul(const float *x, int64_t rows, int64_t k, int64_t n, const uint8_t *w,
                const uint16_t *s, float *y, int gated) {
    return block_matmul(INT4_TILES, 4, x, rows, k, n, w, s, y, gated);
}

int int8_matmul(const float *x, int64_t rows, int64_t k, int64_t n, const uint8_t *w,
                const uint16_t *s, float *y, int gated) {
    return block_matmul(INT8_TILES, 8, x, rows, k, n, w, s, y, gated);
}
