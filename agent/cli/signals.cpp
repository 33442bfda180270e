#include "signals.h"

#include <csignal>

#include "segtape/nn/dist.h"

namespace segtape_cli {
namespace {

volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

void catch_stop_signal(int sig, int flags) {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = flags;
  sigaction(sig, &sa, nullptr);
}

}  // namespace

bool stop_requested() { return g_stop_signal != 0; }
std::string stop_signal_name() { return g_stop_signal == SIGINT ? "SIGINT" : g_stop_signal == SIGPIPE ? "SIGPIPE" : "SIGTERM"; }
int stop_signal_reason() { return g_stop_signal == SIGINT ? 1 : 2; }
std::string stop_reason_name(int reason) { return reason == 1 ? "SIGINT" : "SIGTERM"; }
int stop_exit_code(const std::string& name) { return name == "SIGINT" ? 130 : name == "SIGPIPE" ? 141 : 143; }
bool is_stop_signal(const std::string& name) { return name == "SIGINT" || name == "SIGTERM" || name == "SIGPIPE"; }

void catch_stop_signals() {
  catch_stop_signal(SIGINT, SA_RESETHAND | SA_RESTART);
  catch_stop_signal(SIGTERM, SA_RESETHAND | SA_RESTART);
}

void catch_sigpipe() {
  if (segtape::dist::launched_by_mpirun()) return;  // (under mpirun the ranks' output goes through Open MPI, which handles its pipes)
  catch_stop_signal(SIGPIPE, SA_RESTART);
}

}  // namespace segtape_cli
