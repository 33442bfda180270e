// segtape retention: the retention lab (agent/retention.h, docs/retention.md),
// its output folder and files, and its LibTorch module.
#include <dlfcn.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "cli.h"
#include "run_dir.h"
#include "segtape/explain.h"

namespace segtape_cli {

namespace rt = segtape::agent::retention;
using segtape::Error;

namespace {

#ifdef SEGTAPE_WITH_LIBTORCH
// The lab's LibTorch side, agent/retention_torch.cpp, is a module loaded only
// here (linked into the program, LibTorch made every start of it ~1.5 s
// slower): beside the program (build tree), then in the install's
// lib/segtape/. Not found or not loadable: the lab runs segtape only, and
// its report and a stderr line say why.
rt::TorchRunner load_torch_lab(std::string& note) {
  const char* name = "libsegtape_torch_lab.so";
  std::error_code ec;
  const fs::path exe_dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  std::vector<fs::path> tried;
  if (!ec && exe_dir.is_absolute()) {  // never a path relative to the working directory
    tried.push_back(exe_dir / name);
#ifdef SEGTAPE_TORCH_LAB_DIR
    tried.push_back((exe_dir / SEGTAPE_TORCH_LAB_DIR / name).lexically_normal());
#endif
  }
  const auto not_run = [&](const std::string& why) -> rt::TorchRunner {
    note = "LibTorch not run: its module " + why;
    std::fprintf(stderr, "segtape: warning: %s\n", note.c_str());
    return nullptr;
  };
  for (const fs::path& p : tried) {
    if (!fs::exists(p, ec)) continue;
    void* lib = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL);  // kept open for the process's life
    const char* err = lib ? nullptr : dlerror();
    if (lib)
      if (auto entry = reinterpret_cast<rt::TorchRunner (*)()>(dlsym(lib, "segtape_torch_lab_runner"))) return entry();
    return not_run(p.string() + ": " + (err ? err : "no segtape_torch_lab_runner in it"));
  }
  std::string looked;
  for (const fs::path& p : tried) looked += " " + p.string();
  return not_run("not found (looked for" + (tried.empty() ? std::string(" nothing: /proc/self/exe is not readable") : looked) + ")");
}
#endif

// N copies of the lab would time each other and write the same files.
void refuse_under_mpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* n = std::getenv(v); n && std::atoi(n) > 1)
      throw Error(std::string("segtape retention measures one process's memory and time; run it without mpirun (this is one of ") + n +
                  " ranks)");
}

// --cases: every case when empty, else those named, each once.
std::vector<rt::Case> lab_cases(const std::string& names, const rt::LabConfig& c) {
  std::vector<rt::Case> which;
  if (names.empty()) {
    for (const rt::CaseInfo& i : rt::cases()) which.push_back(i.id);
    return which;
  }
  std::stringstream ss(names);
  for (std::string name; std::getline(ss, name, ',');) {
    const rt::Case k = rt::parse_case(name, c);
    if (std::find(which.begin(), which.end(), k) != which.end())  // (it ran again, its rows twice in the csv)
      throw Error(fmt::format("--cases {}: '{}' names a case already given", names, name));
    which.push_back(k);
  }
  return which;
}

// --out, or runs/retention-<time>; a lab run's files there need --force.
fs::path lab_out(const RetentionArgs& a) {
  fs::path out = a.out.empty() ? default_out("retention") : fs::path(a.out);
  const std::string named = "--out " + out.string();
  if (!a.force && (exists_named(out / "retention.json", named) || exists_named(out / "retention.csv", named) ||
                   exists_named(out / "retention.svg", named)))
    throw Error("--out " + out.string() + " already holds a lab run; pass --force to overwrite it, or choose another --out");
  return out;
}

// --dot's second file: tbptt's tape beside the pitfall's, as <name>-tbptt.dot.
fs::path dot_fix_of(const std::string& dot) {
  const fs::path d(dot);
  return fs::path(d).replace_filename(d.stem().string() + "-tbptt" + d.extension().string());
}

// A device that cannot be used says so before anything is written.
void probe_device(const rt::LabConfig& c) {
  if (c.device != "cuda") return;
  segtape::TapeOptions small;
  small.segment_budget = small.device_persistent = small.device_carry = small.device_workspace = size_t(1) << 20;
  segtape::Tape probe(segtape::Device::cuda(), small);
}

// Small segments, parameters named: pitfall 1 over 3 steps, and tbptt's
// second segment (the state arrives carried) beside it.
void write_dots(const std::string& dot, const fs::path& dot_fix, const rt::LabConfig& c) {
  write_text(dot, rt::tape_dot(rt::Case::HiddenNotDetached, c));
  write_text(dot_fix, rt::tape_dot(rt::Case::Tbptt, c));
  std::printf("wrote %s (the tape of pitfall 1 after 3 steps) and %s (tbptt's second segment, h carried in); render with: dot -Tsvg %s -o tape.svg\n",
              dot.c_str(), dot_fix.c_str(), dot.c_str());
}

// The progress line on a terminal; with --explain, each pitfall's report into `explained`.
rt::LabHooks lab_hooks(bool tty, bool explain, std::string& explained) {
  rt::LabHooks hooks;
  hooks.progress = [tty](const std::string& line) {
    if (tty) std::fprintf(stderr, "\r%-60s", line.c_str());
  };
  if (explain)
    hooks.inspect = [&explained](rt::Case k, const segtape::Tape& t) {
      const auto t0 = std::chrono::steady_clock::now();
      const segtape::Explanation e = segtape::explain(t);
      const double ms = 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      explained += fmt::format("== {} (pitfall {}), at its last step; explained {} nodes in {:.2f} ms\n{}\n", rt::info(k).name,
                               int(k) + 1, e.node_count, ms, e.report());
    };
  return hooks;
}

int anomaly_only(const rt::LabConfig& c) {
  const rt::AnomalyCost ac = rt::anomaly_cost(c);
  std::printf("anomaly mode on the agent loop (Trainer, recall, tbptt:%ld, B=%ld, H=%ld): %.1f us/step off, %.1f us/step on (%+.1f%%)\n",
              c.trainer_k, c.batch, c.hidden, ac.us_off, ac.us_on, ac.percent());
  return 0;
}

// The lab's files and its table; exit status 1 when its check failed.
int report(const rt::LabReport& rep, const fs::path& out, const std::string& explained, double wall) {
  write_text(out / "retention.csv", rt::to_csv(rep));
  write_text(out / "retention.json", rt::to_json(rep));
  write_text(out / "retention.svg", rt::to_svg(rep));
  if (!explained.empty()) std::printf("%s", explained.c_str());
  std::printf("%s", rt::table(rep).c_str());
  std::printf("%.1f s; files: %s/{retention.csv, retention.json, retention.svg}\n", wall, out.c_str());
  if (const std::string why = rep.check_failure(); !why.empty()) {
    std::fprintf(stderr, "segtape: error: %s (see the table)\n", one_line(why).c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int retention_lab(RetentionArgs& a) {
  refuse_under_mpirun();
  rt::LabConfig c = a.c;
  c.budget = segtape::agent::parse_bytes(a.budget);
  c.budget_name = "--budget";
  segtape::agent::check_device_flag(c.device);
  c.validate();
  if (a.anomaly_only) return anomaly_only(c);
  const std::vector<rt::Case> which = lab_cases(a.cases, c);
  const fs::path out = lab_out(a);
  const fs::path dot_fix = a.dot.empty() ? fs::path() : dot_fix_of(a.dot);
  if (!a.dot.empty()) check_output_file(a.dot, "--dot"), check_output_file(dot_fix.string(), "--dot (its -tbptt file)");
  probe_device(c);
  rt::check_lab_memory(c, which);  // (before its folder is made)
  prepare_dir(out);
  rt::TorchRunner torch = nullptr;
#ifdef SEGTAPE_WITH_LIBTORCH
  std::string torch_note;
  if (!a.no_libtorch) torch = load_torch_lab(torch_note);
#endif
  if (!a.dot.empty()) write_dots(a.dot, dot_fix, c);
  const bool tty = isatty(STDERR_FILENO);
  std::string explained;
  const rt::LabHooks hooks = lab_hooks(tty, a.explain, explained);
  const auto t0 = std::chrono::steady_clock::now();
  rt::LabReport rep = rt::run_lab(c, which, torch, hooks);
#ifdef SEGTAPE_WITH_LIBTORCH
  if (a.no_libtorch) rep.libtorch_note = "LibTorch not run (--no-libtorch)";
  else if (!torch) rep.libtorch_note = torch_note;
#endif
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (tty) std::fprintf(stderr, "\r%-60s\r", "");
  return report(rep, out, explained, wall);
}

}  // namespace segtape_cli
