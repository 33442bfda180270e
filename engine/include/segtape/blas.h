// The CPU's BLAS (OpenBLAS) as it loaded. OpenBLAS picks its kernels for the
// CPU it sees when it loads; one that does not know the CPU (Debian 12's
// 0.3.21 on some newer Intel CPUs) falls back to generic SSE3 kernels, several
// times slower (docs/benchmarks.md). OPENBLAS_CORETYPE in the environment of
// a process, before it starts, chooses instead.
#pragma once
#include <cstdint>
#include <string>

namespace segtape {

// OpenBLAS's kernel set in this process, e.g. "SkylakeX", "Haswell", "Prescott".
std::string blas_kernels();

// segtape's own kernel for the GRU's packed weight products in this process:
// "avx512", "avx2" or "none" (docs/design.md, "Packed weights";
// kernels::Options::packed in segtape/kernels.h chooses).
std::string packed_kernel();

// Whether a recurrent cell's weight product of M rows by a weight [K, N]
// takes a packed copy of the weight in this process (one float per weight,
// kept: the size check counts it; docs/design.md, "Packed weights").
bool packs_weight(int64_t M, int64_t N, int64_t K);

// The threads OpenBLAS runs its products on in this process.
int blas_threads();

// "SkylakeX" (AVX-512) or "Haswell" (AVX2 + FMA) when OpenBLAS chose kernels
// older than AVX2 on a CPU that has it, and OPENBLAS_CORETYPE was not set;
// otherwise empty. The segtape program restarts itself with it (agent/cli/startup.cpp).
std::string blas_better_kernels();

}  // namespace segtape
