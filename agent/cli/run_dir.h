// A run's folder: its text files written atomically, its lock, and the checks
// that keep a new run from writing over an old one's work.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

namespace segtape_cli {

namespace fs = std::filesystem;

// Where a text output at p goes: p, or through a link the file it names
// (the link stays). A FIFO, socket or device there is refused: the rename
// would replace it (as root, /dev/null through --dot /dev/null), and opening
// a FIFO waits forever for a reader. `what` starts the message.
fs::path text_target(const fs::path& p, const std::string& what);

// Whether a file name in a run's folder is one of the temporary files its
// writes leave when killed: write_text's for the run's text files, and
// safetensors::save_atomic's for its checkpoint. Only these: a user's own
// hidden files there (".tmp_notes") are not ours to delete.
bool is_run_temp_file(const std::string& name);

// Atomic text write: temp file, then rename, so a crash never leaves half a
// file. Errors name the file asked for (not the temporary one).
void write_text(const fs::path& given, const std::string& text);

// One process per run folder: an flock on DIR/.segtape.lock, held until the
// process ends (a kill releases it too). A second process resuming (or
// --force-ing) a run that is training deleted its temporary checkpoint.
// must_lock: the folder holds a header-only metrics.csv, which is also what a
// run in its first interval has; where nothing can be locked, refused.
void lock_run_dir(const fs::path& dir, const std::string& flag, bool must_lock = false);

// fs::exists / fs::is_directory on a path a flag gave: one the system cannot
// look at (a name too long, a folder it may not search) is an Error naming
// the flag and the path, where the throwing overloads printed "filesystem
// error: status: ..." with neither. (A file where a folder should be is
// "not there" to fs::exists, and an Error to is_directory_named.)
bool exists_named(const fs::path& p, const std::string& named);
bool is_directory_named(const fs::path& p, const std::string& named);

// A new run's --out without --force: refused where a run's work is there (a
// checkpoint, or a metrics.csv with rows). Returns whether a metrics.csv with
// its header alone is there (a run in its first interval looks the same:
// lock_run_dir's must_lock).
bool refuse_a_run_in(const fs::path& out);

// --out's folder, made if missing and checked writable.
void prepare_dir(const fs::path& dir);

// A file the program will write later: refused now, by the name given, if
// it names a directory or its directory is missing or not writable.
void check_output_file(const std::string& given, const char* flag);

// Whether the run in `dir` wrote its end at `step`: metrics.json complete, not
// interrupted, and plot.svg there (written before metrics.json; a write of it
// that failed, a full disk, left the run to finish).
bool finished_metrics(const fs::path& dir, int64_t step);

// runs/<prefix>-YYYYmmdd-HHMMSS: a run's folder when no --out is given.
fs::path default_out(const std::string& prefix);

}  // namespace segtape_cli
