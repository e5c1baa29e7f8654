/*
 * What the native CPU kernels share: one clone per instruction set, and an
 * exp the compiler vectorises. Included by each extension's single source
 * file (static functions: no symbol crosses between extensions).
 */
#ifndef SLUICE_CPU_VECTOR_H
#define SLUICE_CPU_VECTOR_H

#include <stdint.h>
#include <string.h>

/* Vector width follows the machine it runs on: one clone per ISA, picked at
 * load time (GCC function multi-versioning); the build never assumes the
 * builder's CPU. The x86-64 levels carry FMA with their vectors (a bare
 * "avx2" clone has none, so -ffp-contract=fast had nothing to contract
 * into): v3 = AVX2 + FMA (Haswell, Zen), v4 = AVX-512. GCC before 12 knows
 * no level names: ISA names there. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define SLUICE_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define SLUICE_ISA_AVX512 "arch=x86-64-v4"
#define SLUICE_ISA_AVX2 "arch=x86-64-v3"
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SLUICE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#define SLUICE_ISA_AVX512 "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"
#define SLUICE_ISA_AVX2 "avx2,fma"
#else
#define SLUICE_CLONES
#endif

/* Code between SLUICE_TARGET(SLUICE_ISA_...) and SLUICE_TARGET_END is built
 * for that instruction set (where the ISA names are defined: GCC on
 * x86-64), for a kernel that keeps one variant per ISA and picks one at
 * run time itself. */
#define SLUICE_PRAGMA(x) _Pragma(#x)
#define SLUICE_TARGET(isa) SLUICE_PRAGMA(GCC push_options) SLUICE_PRAGMA(GCC target(isa))
#define SLUICE_TARGET_END SLUICE_PRAGMA(GCC pop_options)

/* exp(x) for x <= 0 (softmax after subtracting the max), in a form the
 * compiler vectorises: libm's expf is a scalar call per score, which made
 * exp the kernel's largest cost. Range reduction x = n ln2 + r with ln2 split
 * in two (Cody-Waite), a degree-6 polynomial for e^r on |r| <= ln2/2
 * (Cephes' coefficients), and 2^n built in the exponent bits. Relative
 * error ~1e-7; x below ~-87.7 (-inf included) gives 0, x between -87.7 and
 * -87.3 a subnormal; a NaN stays NaN (a corrupt score shows in the output).
 *
 * Every step is branch-free arithmetic or an integer select, or GCC leaves
 * the loop scalar: a float select (x < -88 ? -88 : x) kept the AVX2 clone
 * scalar, a third of a decode step's attention. So the clamp at -88 is an
 * unsigned min on the bits (for x <= 0, a larger magnitude is a larger bit
 * pattern, -inf's too; NaNs, above -inf's, pass), and the exponent's floor
 * an integer max. */
static inline float exp_nonpositive(float x) {
    uint32_t x_bits;
    memcpy(&x_bits, &x, sizeof x_bits);
    const uint32_t clamped = x_bits < 0xC2B00000u ? x_bits : 0xC2B00000u; /* -88.0f */
    x_bits = x_bits > 0xFF800000u ? x_bits : clamped;                       /* a NaN passes */
    memcpy(&x, &x_bits, sizeof x);
    /* n = round(x / ln2) by the 1.5 * 2^23 trick: floorf would keep GCC from vectorising. */
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    /* 2^n; n <= -127 (x < ~-87.7) gives exponent bits 0, so 2^n = 0. */
    int32_t biased = (int32_t)n + 127;
    biased = biased > 0 ? biased : 0;
    const int32_t two_n_bits = biased << 23;
    float two_n;
    memcpy(&two_n, &two_n_bits, sizeof two_n);
    return p * two_n;
}

#endif /* SLUICE_CPU_VECTOR_H */
