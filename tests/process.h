// Running the segtape program from a test, and reading files whole
// (agent_test.cpp, catalog_test.cpp).
#pragma once
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace segtape::test {

struct Process {
  bool exited;         // ended by exit(), not by a signal
  int code;            // exit status (-1 when killed by a signal)
  std::string output;  // what the command wrote to its standard output
};

// Runs `cmd` with /bin/sh (redirections included) and collects its output.
inline Process run_shell(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int st = pclose(p);
  return {WIFEXITED(st), WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace segtape::test
