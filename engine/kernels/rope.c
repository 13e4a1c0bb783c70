/* Rotate-half RoPE of a step's q and k heads: out = x * cos + roll(x, dim/2) * signed_sin,
 * with the step's tables [tokens, dim] (the sign of rotate-half lives in signed_sin).
 * Multiplies and adds are separate (no fused multiply-add), as aten's are, so the
 * result is bit-identical to engine/model.py's apply_rope. */
#include <immintrin.h>
#include <stdint.h>

/* x [tokens, heads, dim] with token stride x_stride (heads packed); out contiguous.
 * dim a multiple of 32. */
void rope(const float *x, int64_t x_stride, int64_t tokens, int64_t heads, int64_t dim,
          const float *cos, const float *signed_sin, float *out) {
    const int64_t half = dim / 2;
#pragma omp parallel for schedule(static) if (tokens >= 32)
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos + t * dim, *s = signed_sin + t * dim;
        for (int64_t h = 0; h < heads; h++) {
            const float *xh = x + t * x_stride + h * dim;
            float *oh = out + (t * heads + h) * dim;
            for (int64_t i = 0; i < dim; i += 16) {
                const __m512 straight = _mm512_mul_ps(_mm512_loadu_ps(xh + i), _mm512_loadu_ps(c + i));
                const __m512 rolled = _mm512_mul_ps(_mm512_loadu_ps(xh + (i + half) % dim), _mm512_loadu_ps(s + i));
                _mm512_storeu_ps(oh + i, _mm512_add_ps(straight, rolled));
            }
        }
    }
}
