// segtape sample: the text a language model writes after a prompt, on
// standard output (messages go to standard error).
#include <cstdio>

#include "cli.h"

namespace segtape_cli {

int sample(const SampleArgs& a) {
  segtape::agent::sample(a.checkpoint, a.o, [](std::string_view t) { std::fwrite(t.data(), 1, t.size(), stdout); });
  std::fputc('\n', stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace segtape_cli
