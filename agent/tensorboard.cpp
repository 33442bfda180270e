#include "tensorboard.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <iterator>

#include "segtape/error.h"
#include "tensorboard.pb.h"

namespace segtape::agent::tensorboard {

using Event = ::segtape::tensorboard::Event;  // agent/tensorboard.proto
using Summary = ::segtape::tensorboard::Summary;

namespace {

// The byte-at-a-time table of the reflected Castagnoli polynomial 0x82F63B78.
// (Debian 12 packages no CRC-32C library; this is the textbook table method.)
constexpr std::array<uint32_t, 256> kTable = [] {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}();

std::span<const std::byte> bytes_of(const void* p, size_t n) { return {static_cast<const std::byte*>(p), n}; }

void put_u64(std::string& s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(char((v >> (8 * i)) & 0xFF));
}
void put_u32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(char((v >> (8 * i)) & 0xFF));
}
uint64_t get_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint32_t get_u32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(std::span<const std::byte> data, uint32_t crc) {
  crc = ~crc;
  for (std::byte b : data) crc = kTable[(crc ^ uint32_t(b)) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(std::span<const std::byte> data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

EventWriter::EventWriter(const std::filesystem::path& dir, const std::string& flag) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    throw Error(flag + " " + dir.string() + ": cannot make the folder" + (ec ? " (" + ec.message() + ")" : ""));
  static std::atomic<int> files{0};
  char host[256] = "localhost";
  if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
  host[sizeof host - 1] = '\0';
  file_ = dir / ("events.out.tfevents." + std::to_string(int64_t(unix_seconds())) + "." + host + "." +
                 std::to_string(getpid()) + "." + std::to_string(files++));
  out_.open(file_, std::ios::binary | std::ios::trunc);
  if (!out_) throw Error(flag + " " + dir.string() + ": cannot create " + file_.filename().string() + " (" + std::strerror(errno) + ")");
  Event e;
  e.set_wall_time(unix_seconds());
  e.set_file_version("brain.Event:2");
  record(e.SerializeAsString());
}

void EventWriter::scalar(const std::string& tag, int64_t step, double value) {
  Event e;
  e.set_wall_time(unix_seconds());
  e.set_step(step);
  Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(float(value));
  record(e.SerializeAsString());
}

void EventWriter::record(const std::string& data) {
  std::string r;
  r.reserve(data.size() + 16);
  put_u64(r, data.size());
  put_u32(r, masked_crc32c(bytes_of(r.data(), 8)));
  r += data;
  put_u32(r, masked_crc32c(bytes_of(data.data(), data.size())));
  out_.write(r.data(), std::streamsize(r.size()));
  out_.flush();
  if (!out_) throw Error("TensorBoard log " + file_.string() + ": write failed (disk full?)");
}

EventFile read_events(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error("TensorBoard log " + file.string() + ": cannot open");
  const std::string s((std::istreambuf_iterator<char>(in)), {});
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  EventFile f;
  size_t at = 0;
  auto bad = [&](const std::string& why) {
    return Error("TensorBoard log " + file.string() + ": record at byte " + std::to_string(at) + ": " + why);
  };
  while (at < s.size()) {
    if (s.size() - at < 12) throw bad("truncated header");
    const uint64_t n = get_u64(p + at);
    if (get_u32(p + at + 8) != masked_crc32c(bytes_of(p + at, 8))) throw bad("length CRC mismatch");
    if (n > s.size() - at - 12 || s.size() - at - 12 - n < 4) throw bad("truncated data");
    const auto data = bytes_of(p + at + 12, size_t(n));
    if (get_u32(p + at + 12 + n) != masked_crc32c(data)) throw bad("data CRC mismatch");
    Event e;
    if (!e.ParseFromArray(p + at + 12, int(n))) throw bad("not an Event");
    if (e.has_file_version()) f.file_version = e.file_version();
    if (e.has_summary())
      for (const Summary::Value& v : e.summary().value())
        f.scalars.push_back({v.tag(), e.step(), e.wall_time(), v.simple_value()});
    at += 12 + n + 4;
  }
  return f;
}

}  // namespace segtape::agent::tensorboard
