// TensorBoard logs: scalar summaries in an event file that TensorBoard (and
// tf.summary readers) read. `segtape train --log-dir DIR` writes one per run
// (docs/agent.md, "Logs"). The file is TensorFlow's record format: each
// record is the length (8 bytes, little endian), the masked CRC-32C of the
// length, the data (a serialized Event, agent/tensorboard.proto) and the
// masked CRC-32C of the data. Every record is flushed as it is written, so a
// run that is killed keeps every scalar logged before.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

namespace segtape::agent::tensorboard {

// CRC-32C (Castagnoli), as TensorFlow's records use it; and its "masked" form
// ((crc >> 15 | crc << 17) + 0xa282ead8) stored in them.
uint32_t crc32c(std::span<const std::byte> data, uint32_t crc = 0);
uint32_t masked_crc32c(std::span<const std::byte> data);

class EventWriter {
 public:
  // Creates `dir` (and its parents) and a new event file in it,
  // events.out.tfevents.<unix seconds>.<host>.<pid>.<n>, whose first event is
  // the file version. Throws Error naming `flag` and the path when the
  // folder or the file cannot be made.
  explicit EventWriter(const std::filesystem::path& dir, const std::string& flag = "--log-dir");
  // One scalar at a step, written and flushed (non-finite values included:
  // TensorBoard shows them). Throws Error naming the file when the write fails.
  void scalar(const std::string& tag, int64_t step, double value);
  const std::filesystem::path& file() const { return file_; }

 private:
  void record(const std::string& data);
  std::filesystem::path file_;
  std::ofstream out_;
};

// Reading back, for tests and tools: every record of an event file, CRCs
// checked; a damaged or truncated record is an Error naming the file and
// the byte offset.
struct ScalarEvent {
  std::string tag;
  int64_t step = 0;
  double wall_time = 0;
  float value = 0;
};
struct EventFile {
  std::string file_version;        // from the first event
  std::vector<ScalarEvent> scalars;  // in file order
};
EventFile read_events(const std::filesystem::path& file);

}  // namespace segtape::agent::tensorboard
