// Reading and writing Hugging Face safetensors files (the checkpoint format).
//
// Layout: u64 little-endian header length N, N bytes of UTF-8 JSON header,
// then the raw little-endian data buffer. See docs/checkpoint-format.md.
// parse() treats its input as hostile: every problem is a segtape::CheckpointError
// naming the source and the problem; it never reads outside the buffer.
// serialize() stores the CRC-32 of every tensor's data bytes in __metadata__
// and parse() verifies each stored one, so damaged tensor data is an error,
// not silently wrong values.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "segtape/error.h"

namespace segtape::safetensors {

// The dtypes segtape reads and writes as values; every other valid
// safetensors dtype (F16, BF16, I32, U8, BOOL, ...) parses as Other and is
// exposed as raw bytes together with its dtype string.
enum class DType { F32, F64, I64, Other };

// "F32", "F64", "I64" ("?" for Other: the real string is in TensorInfo::dtype_str).
std::string_view dtype_name(DType d);

// Headers longer than this are rejected before any JSON parsing (same cap as
// the reference implementation).
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

// The CRC-32 of tensor "<name>"'s data bytes is stored under the metadata key
// kChecksumKeyPrefix + "<name>" as 8 lowercase hex digits (a flat string to
// string entry, so other safetensors readers keep working). Callers' metadata
// may not use the prefix.
inline constexpr std::string_view kChecksumKeyPrefix = "segtape.crc32.";

// CRC-32 as zlib, PNG and Python's zlib.crc32 compute it (reflected polynomial
// 0xEDB88320, initial value and final xor 0xFFFFFFFF). Chains like zlib's:
// crc32(b, crc32(a)) == crc32(a followed by b). crc32("123456789") == 0xCBF43926.
std::uint32_t crc32(std::span<const std::byte> bytes, std::uint32_t crc = 0);

struct TensorInfo {
  std::string name;
  std::string dtype_str;  // as written in the file, e.g. "BF16"
  DType dtype = DType::Other;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte offsets into the data buffer
};

template <class T>
inline constexpr DType dtype_of = std::is_same_v<T, float>          ? DType::F32
                                  : std::is_same_v<T, double>       ? DType::F64
                                  : std::is_same_v<T, std::int64_t> ? DType::I64
                                                                    : DType::Other;

// A parsed, fully validated file. Owns its bytes; the spans from data() stay
// valid while the File lives (moving the File keeps them valid too).
struct File {
  std::map<std::string, std::string> metadata;  // "__metadata__", if present, less the checksum keys
  // The stored checksums: tensor name -> CRC-32 of its data bytes. parse()
  // has verified each one whose tensor is in the file; a tensor without one
  // (a file from another writer) is not verified.
  std::map<std::string, std::uint32_t> checksums;
  std::vector<TensorInfo> tensors;              // in data-offset order
  std::vector<std::byte> bytes;                 // the whole file
  std::size_t data_start = 0;                   // 8 + header length
  std::string source;                           // path or "<memory>", for messages

  const TensorInfo* find(std::string_view name) const;
  // The tensor's bytes. Not necessarily aligned for T: copy, don't cast.
  std::span<const std::byte> data(const TensorInfo& t) const;
  // Copies a F32/F64/I64 tensor out as values; CheckpointError if the dtype
  // differs from T or the name is absent.
  template <class T>
  std::vector<T> values(std::string_view name) const {
    static_assert(dtype_of<T> != DType::Other, "values<T>: T must be float, double or int64_t");
    const TensorInfo& t = require(name, dtype_of<T>);
    std::vector<T> out((t.end - t.begin) / sizeof(T));
    if (!out.empty()) std::memcpy(out.data(), data(t).data(), out.size() * sizeof(T));
    return out;
  }

 private:
  const TensorInfo& require(std::string_view name, DType want) const;
};

// Validates everything (see docs/checkpoint-format.md for the list of checks),
// including every stored checksum.
File parse(std::vector<std::byte> bytes, std::string source = "<memory>");
// Reads the whole file and parses it; errors name the path.
File load(const std::filesystem::path& path);

// A tensor to write. data must hold exactly numel * dtype-size bytes.
struct TensorRef {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  std::span<const std::byte> data;
};

// The whole file in memory. Like the reference writer, tensors are laid out
// by descending dtype size, then name: deterministic, and with the data buffer
// starting 8-byte aligned every tensor is naturally aligned in the file.
// The metadata written is `metadata` plus one checksum key per tensor.
// CheckpointError on a bad TensorRef (size/shape mismatch, duplicate name, ...)
// or a metadata key starting with kChecksumKeyPrefix.
std::vector<std::byte> serialize(std::span<const TensorRef> tensors,
                                 const std::map<std::string, std::string>& metadata = {});

// Crash-safe write: temp file in the same directory, write + fsync, the file
// read back (its cached pages dropped first where the kernel allows) and
// compared with the bytes meant, every byte (its size, header and each
// tensor's CRC-32 with them), rename over path, fsync the directory. On any
// failure, a read-back that differs among them, the previous file at path is
// untouched and the temp file is removed; the error names the path and what
// went wrong (errno text, or the first byte that differs).
void save_atomic(const std::filesystem::path& path, std::span<const TensorRef> tensors,
                 const std::map<std::string, std::string>& metadata = {});

// Whether `name` (a file name, no folder) is the name of a temporary file
// save_atomic makes for a file named `target`: ".<target>.tmp.<pid>.<n>",
// left behind when the process was killed mid-write.
bool is_temporary_of(std::string_view name, std::string_view target);

// Offset of the first byte of s that is not part of well-formed UTF-8 (no
// overlongs, no surrogates, nothing above U+10FFFF), or npos: what a header
// (JSON) may hold.
std::size_t utf8_error(std::string_view s);

// Test hook: called by save_atomic after the temp file is written, synced and
// closed, just before it is read back and renamed. A hook that throws
// simulates a crash there; one that changes the file, a write the disk got
// wrong (the read-back refuses it).
// Pass an empty function to clear it.
void set_before_rename_hook(std::function<void(const std::filesystem::path& tmp)> hook);

}  // namespace segtape::safetensors
