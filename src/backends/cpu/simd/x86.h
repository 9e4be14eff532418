// x86 intrinsics for the MUL_MAT kernels (include only from simd/*.cpp).
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
// GCC 12 reports the _mm512_undefined_*() placeholders inside many AVX-512 intrinsics
// (cvtepi32_ps, reduce_*, cvtepi32_epi8, ...) as maybe-uninitialized once they are inlined into
// loops over register arrays: a false positive that -Werror would turn into a build failure.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#endif
