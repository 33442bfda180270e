// Ctrl-C / SIGTERM: the run finishes the segment it is in, writes its
// checkpoint and metrics, and says how to resume. The handler resets itself:
// a second signal ends the process at once. SIGPIPE (the reader of its
// output gone: `segtape train | head`) stops it the same way; it stays
// caught, so the writes after it fail quietly instead of ending the process
// before its checkpoint.
#pragma once
#include <string>

namespace segtape_cli {

// Whether a stop signal has arrived.
bool stop_requested();
// The stop signal's name ("SIGINT", "SIGTERM", "SIGPIPE"), and the exit
// status a run it stopped ends with (130, 143, 141).
std::string stop_signal_name();
int stop_exit_code(const std::string& name);
// Data parallel: the stop signal as Trainer::request_stop's reason (1
// SIGINT, 2 SIGTERM; SIGPIPE is not caught under mpirun), and the name of
// the reason the ranks agreed on (Trainer::stop_reason).
int stop_signal_reason();
std::string stop_reason_name(int reason);
bool is_stop_signal(const std::string& name);
// SIGINT and SIGTERM, each caught once.
void catch_stop_signals();
// Caught from train's first line (its first output may already meet a
// closed pipe), then the run stops at its first segment boundary.
void catch_sigpipe();

}  // namespace segtape_cli
