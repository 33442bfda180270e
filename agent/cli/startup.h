// What the segtape program does before anything else: standard descriptors
// that exist, and OpenBLAS with the kernels of the CPU it runs on.
#pragma once

namespace segtape_cli {

// A standard descriptor closed by the caller (`segtape train ... >&-`) is
// /dev/null here: else the next file opened took descriptor 1, and the
// progress lines went into it (a TensorBoard event file, the run's lock).
void keep_standard_descriptors();

// OpenBLAS chose generic pre-AVX2 kernels on a CPU with AVX2 (it did not
// recognise the CPU): start again with OPENBLAS_CORETYPE naming the kernels the
// CPU runs, which OpenBLAS reads only when it loads. Same process id, same
// arguments, before anything else ran. A set OPENBLAS_CORETYPE is always kept.
void restart_with_recognised_blas_kernels(char** argv);

}  // namespace segtape_cli
