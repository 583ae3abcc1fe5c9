// Markers for functions that CUDA kernels and host code both call (the element-type conversions).
// Under nvcc, STRATA_HOST_DEVICE compiles a function for both sides; elsewhere it expands to nothing.
// STRATA_FORCE_INLINE keeps such a function inlined at every call: the per-ISA kernel files of
// cpu_adam/ call them from code built with AVX-512 or AVX2 flags, and an out-of-line copy from such a
// file must never be what the linker hands to code that runs on a lesser CPU (at -O0 it would be).
#pragma once

#if defined(__CUDACC__)
#define STRATA_HOST_DEVICE __host__ __device__
#define STRATA_FORCE_INLINE __forceinline__
#elif defined(__GNUC__)
#define STRATA_HOST_DEVICE
#define STRATA_FORCE_INLINE [[gnu::always_inline]] inline
#else
#define STRATA_HOST_DEVICE
#define STRATA_FORCE_INLINE inline
#endif
