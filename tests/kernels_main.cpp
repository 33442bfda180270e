// main() of the test programs ctest runs under a choice of kernels
// (segtape/kernels.h): `--kernel NAME=VALUE` (e.g. --kernel packed=off,
// --kernel gemv=on), after GoogleTest's own flags are taken out, sets that
// switch for the whole run (tests/CMakeLists.txt names each such run).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "segtape/error.h"
#include "segtape/kernels.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a != "--kernel" || i + 1 == argc) {
      std::fprintf(stderr, "%s: unknown argument '%s' (expected --kernel NAME=VALUE, or GoogleTest's flags)\n", argv[0], a.c_str());
      return 2;
    }
    const std::string kv = argv[++i];
    const size_t at = kv.find('=');
    try {
      if (at == std::string::npos) throw segtape::Error("--kernel " + kv + ": expected NAME=VALUE, e.g. packed=off");
      segtape::kernels::set_option(kv.substr(0, at), kv.substr(at + 1));
    } catch (const segtape::Error& e) {
      std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
      return 2;
    }
  }
  return RUN_ALL_TESTS();
}
