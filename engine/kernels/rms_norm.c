/* RMSNorm of float32 rows: y = x / sqrt(mean(x^2) + eps) * w. One call for what
 * aten spells as about eight ops on CPU; each row is summed in a fixed order, so
 * its bits do not depend on the other rows. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "vector_math.h"

void rms_norm(const float *x, int64_t rows, int64_t n, const float *w, float eps, float *y) {
#pragma omp parallel for schedule(static) if (rows >= 32)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        __m512 squares = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i += 16) {
            const __mmask16 m = tail(n - i);
            const __m512 v = _mm512_maskz_loadu_ps(m, xr + i);
            squares = _mm512_fmadd_ps(v, v, squares);
        }
        const __m512 inv = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(squares) / (float)n + eps));
        for (int64_t i = 0; i < n; i += 16) {
            const __mmask16 m = tail(n - i);
            const __m512 v = _mm512_maskz_loadu_ps(m, xr + i);
            _mm512_mask_storeu_ps(yr + i, m, _mm512_mul_ps(_mm512_mul_ps(v, inv), _mm512_maskz_loadu_ps(m, w + i)));
        }
    }
}
