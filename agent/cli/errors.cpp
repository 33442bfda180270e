#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "cli.h"
#include "segtape/nn/dist.h"

namespace segtape_cli {

namespace dist = segtape::dist;

namespace {
dist::Communicator* g_comm = nullptr;
}  // namespace

void set_job_communicator(dist::Communicator* comm) { g_comm = comm; }
dist::Communicator* job_communicator() { return g_comm; }

std::string one_line(std::string m) {
  for (size_t at; (at = m.find("\n  ")) != std::string::npos;) m.replace(at, 3, at > 0 && m[at - 1] == ':' ? " " : "; ");
  std::replace(m.begin(), m.end(), '\n', ' ');
  return m;
}

std::string error_head() {
  if (g_comm || !dist::launched_by_mpirun()) return "segtape: error";
  const auto [rank, size] = dist::launched_rank();
  if (rank < 0 || size < 2) return "segtape: error";
  return fmt::format("segtape: error (rank {} of {})", rank, size);
}

int rank_error(const std::exception& e) {
  const bool collective = dynamic_cast<const dist::CollectiveError*>(&e) != nullptr;
  if (collective && g_comm->rank() != 0) return 2;  // rank 0 says it
  if (collective) {
    std::fprintf(stderr, "segtape: error: %s\n", one_line(e.what()).c_str());
    return 2;
  }
  std::fprintf(stderr, "segtape: error (rank %d of %d): %s; ending every rank of the job\n", g_comm->rank(), g_comm->size(),
               one_line(e.what()).c_str());
  g_comm->abort(2);
  return 2;  // (abort does not return)
}

int report_error(const std::exception& e) {
  if (g_comm) return rank_error(e);
  std::fprintf(stderr, "%s: %s\n", error_head().c_str(), one_line(e.what()).c_str());
  return 2;
}

}  // namespace segtape_cli
