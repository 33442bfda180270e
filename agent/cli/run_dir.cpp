#include "run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "segtape/error.h"
#include "segtape/nn/safetensors.h"

namespace segtape_cli {

using segtape::Error;

fs::path text_target(const fs::path& p, const std::string& what) {
  using T = fs::file_type;
  std::error_code ec;
  fs::path target = p;
  // Hop by hop: weakly_canonical gave a dangling link's own path, which the rename then replaced.
  for (int hops = 0; fs::symlink_status(target, ec).type() == T::symlink; ++hops) {
    const fs::path next = fs::read_symlink(target, ec);
    if (ec || hops == 40)
      throw Error(what + ": cannot follow the link " + p.string() + " (" + (ec ? ec.message() : "too many links") + ")");
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  const T type = fs::status(target, ec).type();
  if (type != T::regular && type != T::not_found && type != T::none)  // (none: not visible; the write then says why)
    throw Error(what + ": " + (target == p ? p.string() : p.string() + " (a link to " + target.string() + ")") +
                " is not a regular file (a directory, FIFO, socket or device); give a file name");
  return target;
}

namespace {

// write_text's temporary file for p: ".<name>.tmp" beside it.
fs::path text_temp_of(const fs::path& p) { return p.parent_path() / ("." + p.filename().string() + ".tmp"); }

// Whether metrics.csv may hold a logged row. A run that failed in its first
// interval (a budget too small for a segment, say) left this program's
// header alone: nothing to lose, so a new run takes the folder without
// --force. Anything else counts as rows: a file that is not regular (never
// opened: a FIFO), that cannot be read, over 4 KiB, whose first line is not
// such a header, or with any non-blank line after it.
bool logged_rows(const fs::path& csv) {
  std::error_code ec;
  if (!fs::is_regular_file(csv, ec)) return true;
  const uintmax_t size = fs::file_size(csv, ec);
  if (ec || size > 4096) return true;
  std::ifstream in(csv, std::ios::binary);
  std::string text(size_t(size), '\0');
  if (!in || !in.read(text.data(), std::streamsize(size))) return true;
  std::stringstream lines(text);
  std::string line;
  std::getline(lines, line);
  if (line.rfind("step,loss,", 0) != 0) return true;
  while (std::getline(lines, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) return true;
  return false;
}

}  // namespace

bool is_run_temp_file(const std::string& name) {
  for (const char* f : {"metrics.csv", "metrics.json", "plot.svg"})
    if (name == text_temp_of(f).string()) return true;
  return segtape::safetensors::is_temporary_of(name, "checkpoint.safetensors");
}

void write_text(const fs::path& given, const std::string& text) {
  const fs::path p = text_target(given, "cannot write " + given.string());
  const fs::path tmp = text_temp_of(p);
  std::error_code tec;  // the temporary name: nothing but a stale file of ours (a link there would be written through)
  if (const fs::file_type t = fs::symlink_status(tmp, tec).type(); t != fs::file_type::regular && t != fs::file_type::not_found && t != fs::file_type::none)
    throw Error("cannot write " + given.string() + ": " + tmp.string() + " exists and is not a regular file (a link, "
                "directory, FIFO, socket or device); it is not replaced");
  {
    std::ofstream o(tmp, std::ios::binary | std::ios::trunc);
    o << text;
    o.flush();
    if (!o) {
      const std::string why = std::strerror(errno);
      o.close();
      std::error_code ignored;
      fs::remove(tmp, ignored);  // (a full disk: the partial temporary file goes too)
      throw Error("cannot write " + p.string() + ": " + why);
    }
  }
  std::error_code ec;
  fs::rename(tmp, p, ec);
  if (ec) {
    std::error_code ignored;  // (reusing ec here made every message end in "Success")
    fs::remove(tmp, ignored);
    throw Error("cannot write " + p.string() + ": " + ec.message());
  }
}

void lock_run_dir(const fs::path& dir, const std::string& flag, bool must_lock) {
  static int fd = -1;  // (kept open: the lock lives as long as the process)
  const fs::path lock = dir / ".segtape.lock";
  fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) throw Error(flag + " " + dir.string() + ": cannot open " + lock.string() + " (" + std::strerror(errno) + ")");
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    ::close(fd);
    fd = -1;
    const bool no_locks = e == ENOLCK || e == EOPNOTSUPP || e == ENOSYS;  // a filesystem without locks (some network or FUSE mounts)
    if (no_locks && must_lock)
      throw Error(flag + " " + dir.string() + ": its metrics.csv holds a header alone, as a run in its first interval does, and " +
                  lock.string() + " cannot be locked here (" + std::strerror(e) + ") to tell; pass --force to take the folder");
    if (no_locks) {
      std::fprintf(stderr, "segtape: warning: %s cannot be locked here (%s): nothing keeps a second process from this run\n",
                   lock.c_str(), std::strerror(e));
      return;
    }
    throw Error(e == EWOULDBLOCK ? flag + " " + dir.string() + ": another segtape process is running this run (it holds " +
                                       lock.string() + "); wait for it to end or stop it first"
                                 : flag + " " + dir.string() + ": cannot lock " + lock.string() + " (" + std::strerror(e) + ")");
  }
}

bool exists_named(const fs::path& p, const std::string& named) {
  std::error_code ec;
  const bool e = fs::exists(p, ec);
  if (ec) throw Error(named + ": cannot look at " + p.string() + " (" + ec.message() + ")");
  return e;
}

bool is_directory_named(const fs::path& p, const std::string& named) {
  std::error_code ec;
  const bool d = fs::is_directory(p, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    throw Error(named + ": cannot look at " + p.string() + " (" + ec.message() + ")");
  return d;
}

bool refuse_a_run_in(const fs::path& out) {
  if (exists_named(out / "checkpoint.safetensors", "--out " + out.string()))
    throw Error("--out " + out.string() + " already holds a run; continue it with --resume " + out.string() +
                ", pass --force to overwrite it, or choose another --out");
  const bool metrics = exists_named(out / "metrics.csv", "--out " + out.string());
  if (metrics && logged_rows(out / "metrics.csv"))  // a run that ended before its first checkpoint
    throw Error("--out " + out.string() + " holds the metrics of a run with no checkpoint to resume; pass --force to "
                "overwrite it, or choose another --out");
  return metrics;
}

void prepare_dir(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !is_directory_named(dir, "--out " + dir.string()))
    throw Error("--out " + dir.string() + ": cannot create the directory (" + (ec ? ec.message() : "not a directory") +
                "); choose a writable path");
  const fs::path probe = dir / ".segtape-write-probe";
  FILE* f = std::fopen(probe.c_str(), "wb");
  if (!f) throw Error("--out " + dir.string() + ": not writable (" + std::strerror(errno) + "); choose a writable path");
  std::fclose(f);
  fs::remove(probe, ec);
}

void check_output_file(const std::string& given, const char* flag) {
  const fs::path p(given);
  if (given.empty() || given.back() == '/' || is_directory_named(p, std::string(flag) + " " + given))
    throw Error(std::string(flag) + " " + given + ": is a directory; give a file name, such as " +
                (fs::path(given) / "tape.dot").string());
  const fs::path target = text_target(p, std::string(flag) + " " + given);  // (through a link: its file's folder)
  const fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  if (!is_directory_named(dir, std::string(flag) + " " + given)) throw Error(std::string(flag) + " " + given + ": the directory " + dir.string() + " does not exist");
  if (::access(dir.c_str(), W_OK) != 0)
    throw Error(std::string(flag) + " " + given + ": cannot write in " + dir.string() + " (" + std::strerror(errno) + ")");
}

bool finished_metrics(const fs::path& dir, int64_t step) {
  const fs::path file = dir / "metrics.json";
  std::error_code ec;
  if (!fs::exists(dir / "plot.svg", ec)) return false;
  (void)text_target(file, "--resume");  // (a directory there threw "basic_filebuf::underflow")
  std::ifstream in(file);
  if (!in) return false;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return false;
  const auto complete = j.find("complete"), steps = j.find("steps");
  return complete != j.end() && complete->is_boolean() && complete->get<bool>() && steps != j.end() &&
         steps->is_number_integer() && steps->get<int64_t>() == step && !j.contains("interrupted");
}

fs::path default_out(const std::string& prefix) {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
  return fs::path("runs") / (prefix + "-" + stamp);
}

}  // namespace segtape_cli
