// The CPU's BLAS (OpenBLAS) as it loaded. OpenBLAS picks its kernels for the
// CPU it sees when it loads; one that does not know the CPU (Debian 12's
// 0.3.21 on some newer Xeons) falls back to generic SSE3 kernels, several
// times slower (docs/benchmarks.md). OPENBLAS_CORETYPE in the environment of
// a process, before it starts, chooses instead.
#pragma once
#include <string>

namespace segtape {

// OpenBLAS's kernel set in this process, e.g. "SkylakeX", "Haswell", "Prescott".
std::string blas_kernels();

// segtape's own kernel for the GRU's packed weight products in this process:
// "avx512", "avx2" or "none" (docs/design.md, "Packed weights";
// kernels::Options::packed in segtape/kernels.h chooses).
std::string packed_kernel();

// "SkylakeX" (AVX-512) or "Haswell" (AVX2 + FMA) when OpenBLAS chose kernels
// older than AVX2 on a CPU that has it, and OPENBLAS_CORETYPE was not set;
// otherwise empty. The segtape program restarts itself with it (agent/cli/startup.cpp).
std::string blas_better_kernels();

}  // namespace segtape
