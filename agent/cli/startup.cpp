#include "startup.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "segtape/blas.h"

namespace segtape_cli {

void keep_standard_descriptors() {
  for (int fd = 0; fd <= 2; ++fd) {  // (open returns the lowest free descriptor: 0, 1, 2 in turn)
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int n = ::open("/dev/null", O_RDWR);
    if (n >= 0 && n != fd) ::dup2(n, fd), ::close(n);
  }
}

void restart_with_recognised_blas_kernels(char** argv) {
  const std::string better = segtape::blas_better_kernels();
  if (better.empty()) return;
  // Started through the dynamic loader (ld.so segtape ...), /proc/self/exe is
  // the loader, which would take the first argument for the program: keep going.
  std::error_code ec;
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe", ec).filename().string();
  if (ec || exe.rfind("ld-", 0) == 0) return;
  if (setenv("OPENBLAS_CORETYPE", better.c_str(), 1) != 0) return;  // without it the restart would repeat
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE");  // exec failed: carry on with the generic kernels
}

}  // namespace segtape_cli
