/* The fingerprint's weighted sum (reference.py), one pass over memory:

       A(row) = sum_j mix(w_j) * R^j  (mod 2^32),  mix(w) = w ^ (w >> MIX_SHIFT)

   for a range of rows of a 32-bit word buffer. The torch kernels in sums.py compute the same
   numbers in five passes (shift, mask, xor, multiply, sum); this one reads each word once,
   so a field costs about what reading it costs. Unsigned 32-bit arithmetic wraps mod 2^32,
   which is the arithmetic the fingerprint is defined in.

   Plain C with no Python API: the package loads it with ctypes, which lets go of the GIL
   for the call, so several threads can each take a range of rows. Built by setup.py as an
   optional extension; without a compiler the torch kernels run instead (kernel.py). R and
   MIX_SHIFT come from the caller: reference.py is their one definition. */
#include <stdint.h>
#include <string.h>

#define LANES 8
#define WIDE (4 * LANES) /* words per step: four independent vectors hide the multiply's latency */

typedef uint32_t v8u __attribute__((vector_size(LANES * sizeof(uint32_t))));

/* On x86-64 ELF the loader picks the AVX2 build where the CPU has it (gcc's function
   multiversioning); elsewhere the compiler's baseline vectors. */
#if defined(__x86_64__) && defined(__ELF__) && defined(__GNUC__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

static inline __attribute__((always_inline)) v8u load(const uint32_t *p)
{
    v8u v;
    memcpy(&v, p, sizeof v); /* unaligned load */
    return v;
}

static inline __attribute__((always_inline)) uint32_t
row_sum(const uint32_t *w, int64_t n, const uint32_t *pw, uint32_t r_wide, uint32_t r,
        uint32_t shift)
{
    v8u p0 = load(pw), p1 = load(pw + LANES), p2 = load(pw + 2 * LANES), p3 = load(pw + 3 * LANES);
    v8u a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    v8u step = (v8u){0} + r_wide;
    int64_t j = 0;
    for (; j + WIDE <= n; j += WIDE) {
        v8u x0 = load(w + j), x1 = load(w + j + LANES);
        v8u x2 = load(w + j + 2 * LANES), x3 = load(w + j + 3 * LANES);
        a0 += (x0 ^ (x0 >> shift)) * p0;
        a1 += (x1 ^ (x1 >> shift)) * p1;
        a2 += (x2 ^ (x2 >> shift)) * p2;
        a3 += (x3 ^ (x3 >> shift)) * p3;
        p0 *= step;
        p1 *= step;
        p2 *= step;
        p3 *= step;
    }
    v8u a = a0 + a1 + a2 + a3;
    uint32_t s = 0;
    for (int k = 0; k < LANES; k++)
        s += a[k];
    uint32_t p = p0[0]; /* R^j */
    for (; j < n; j++) {
        uint32_t x = w[j];
        s += (x ^ (x >> shift)) * p;
        p *= r;
    }
    return s;
}

/* R^0 .. R^(WIDE-1) into pw; returns R^WIDE. */
static uint32_t powers(uint32_t r, uint32_t *pw)
{
    uint32_t p = 1;
    for (int k = 0; k < WIDE; k++) {
        pw[k] = p;
        p *= r;
    }
    return p;
}

/* Rows [offs[i], offs[i+1]) of `words` (n_words long), for i in [r0, r1): out[i - r0].
   Returns -1, having read nothing, when an offset lies outside the buffer or goes back. */
CLONES int dpobs_sums_flat(const uint32_t *words, int64_t n_words, const int64_t *offs,
                           int64_t r0, int64_t r1, uint32_t r, uint32_t shift, uint32_t *out)
{
    if (offs[r0] < 0 || offs[r1] > n_words)
        return -1;
    for (int64_t i = r0; i < r1; i++)
        if (offs[i + 1] < offs[i])
            return -1;
    uint32_t pw[WIDE];
    uint32_t r_wide = powers(r, pw);
    for (int64_t i = r0; i < r1; i++)
        out[i - r0] = row_sum(words + offs[i], offs[i + 1] - offs[i], pw, r_wide, r, shift);
    return 0;
}

/* Rows of m words starting every `stride` words, for rows [r0, r1): out[i - r0]. */
CLONES void dpobs_sums_dense(const uint32_t *words, int64_t stride, int64_t m, int64_t r0,
                             int64_t r1, uint32_t r, uint32_t shift, uint32_t *out)
{
    uint32_t pw[WIDE];
    uint32_t r_wide = powers(r, pw);
    for (int64_t i = r0; i < r1; i++)
        out[i - r0] = row_sum(words + i * stride, m, pw, r_wide, r, shift);
}

/* The digests of n rows from their sums (reference.py): (A + (I xor (F + L*G))) mod 2^32,
   as int64 in [0, 2^32). `lead` holds each row's leading length, or is NULL when every row
   has lead_all. */
void dpobs_finish(const uint32_t *acc, const int64_t *ids, const int64_t *lead, int64_t lead_all,
                  uint32_t f, uint32_t g, int64_t n, int64_t *out)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t l = (uint32_t)(lead != NULL ? lead[i] : lead_all);
        uint32_t salt = (uint32_t)ids[i] ^ (f + l * g);
        out[i] = (int64_t)(uint32_t)(acc[i] + salt);
    }
}
