// safetensors reader/writer. The parser's input is untrusted: every length,
// offset and count is checked (with overflow checks) before it is used to
// index or allocate, and every failure is a CheckpointError "<source>: <problem>".
#include "segtape/nn/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>

namespace segtape::safetensors {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// The data buffer is copied to and from memory as is.
static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host would need byte swaps");

// A valid header nests 3 deep (root, entry, shape). The cap keeps a hostile
// "[[[[..." from building a huge DOM chain; nlohmann itself parses iteratively.
constexpr std::size_t kMaxJsonDepth = 32;

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw CheckpointError(source + ": " + what);
}

std::string errno_text(int e) { return std::error_code(e, std::generic_category()).message(); }

// Names come from untrusted files: keep them bounded in messages.
std::string quote(std::string_view s) {
  constexpr std::size_t kMax = 100;
  if (s.size() <= kMax) return "'" + std::string(s) + "'";
  return "'" + std::string(s.substr(0, kMax)) + "...' (" + std::to_string(s.size()) + " bytes)";
}

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string range_str(const TensorInfo& t) {
  return "[" + std::to_string(t.begin) + ", " + std::to_string(t.end) + ")";
}

// Every dtype the reference implementation knows, with its size in bits
// (F4/F6 are sub-byte: a tensor of them must still fill whole bytes).
struct DTypeDesc {
  std::string_view name;
  unsigned bits;
  DType dtype;
};
constexpr DTypeDesc kDTypes[] = {
    {"F32", 32, DType::F32},          {"F64", 64, DType::F64},          {"I64", 64, DType::I64},
    {"BOOL", 8, DType::Other},        {"F4", 4, DType::Other},          {"F6_E2M3", 6, DType::Other},
    {"F6_E3M2", 6, DType::Other},     {"U8", 8, DType::Other},          {"I8", 8, DType::Other},
    {"F8_E5M2", 8, DType::Other},     {"F8_E4M3", 8, DType::Other},     {"F8_E8M0", 8, DType::Other},
    {"F8_E4M3FNUZ", 8, DType::Other}, {"F8_E5M2FNUZ", 8, DType::Other}, {"I16", 16, DType::Other},
    {"U16", 16, DType::Other},        {"F16", 16, DType::Other},        {"BF16", 16, DType::Other},
    {"I32", 32, DType::Other},        {"U32", 32, DType::Other},        {"C64", 64, DType::Other},
    {"U64", 64, DType::Other},
};

const DTypeDesc* find_dtype(std::string_view name) {
  for (const auto& d : kDTypes)
    if (d.name == name) return &d;
  return nullptr;
}

unsigned dtype_bytes(DType d) { return d == DType::F32 ? 4 : 8; }  // F64, I64

// CRC-32 tables for slicing by 8: kCrc[0][b] is the CRC register after
// shifting byte b through it (reflected polynomial 0xEDB88320); kCrc[k][b]
// is the same followed by k zero bytes, so 8 input bytes take 8 lookups.
constexpr std::array<std::array<std::uint32_t, 256>, 8> kCrc = [] {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  for (std::uint32_t b = 0; b < 256; ++b) {
    std::uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[0][b] = c;
  }
  for (std::size_t k = 1; k < 8; ++k)
    for (std::size_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  return t;
}();

std::string hex8(std::uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

// A stored checksum value: exactly 8 hex digits (no sign, no "0x").
bool parse_hex8(const std::string& s, std::uint32_t& out) {
  const auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
  if (s.size() != 8 || !std::all_of(s.begin(), s.end(), hex)) return false;
  return std::from_chars(s.data(), s.data() + s.size(), out, 16).ec == std::errc{};
}

bool is_checksum_key(std::string_view k) { return k.starts_with(kChecksumKeyPrefix); }


// First pass over the header. nlohmann's DOM parser silently keeps the last of
// duplicate keys and has no depth limit, so this SAX pass rejects both (and
// captures the JSON syntax error) before any DOM is built.
struct HeaderChecker final : nlohmann::json_sax<json> {
  std::vector<std::set<std::string>> keys;  // keys seen, one set per open object
  std::string entry;                        // current top-level key, for messages
  std::size_t depth = 0;
  std::string error;

  bool enter() {
    if (++depth <= kMaxJsonDepth) return true;
    error = "header JSON is nested deeper than " + std::to_string(kMaxJsonDepth) + " levels";
    return false;
  }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    if (!enter()) return false;
    keys.emplace_back();
    return true;
  }
  bool key(string_t& k) override {
    if (keys.size() == 1) entry = k;
    if (keys.back().insert(k).second) return true;
    error = keys.size() == 1 ? "duplicate tensor name " + quote(k)
                             : "duplicate key " + quote(k) + " inside entry " + quote(entry);
    return false;
  }
  bool end_object() override {
    keys.pop_back();
    --depth;
    return true;
  }
  bool start_array(std::size_t) override { return enter(); }
  bool end_array() override {
    --depth;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) override {
    error = std::string("header is not valid JSON: ") + ex.what();
    return false;
  }
};

// A non-negative JSON integer, or nothing. nlohmann stores every integer
// literal >= 0 as unsigned, negatives as signed, anything else as float.
bool as_u64(const json& j, std::uint64_t& out) {
  if (!j.is_number_unsigned()) return false;
  out = j.get<std::uint64_t>();
  return true;
}

TensorInfo parse_entry(const std::string& src, const std::string& name, const json& e,
                       std::uint64_t data_len) {
  const std::string what = "tensor " + quote(name) + ": ";
  if (!e.is_object()) fail(src, what + "entry is not an object but " + e.type_name());
  TensorInfo t;
  t.name = name;

  const auto dt = e.find("dtype");
  if (dt == e.end()) fail(src, what + "missing \"dtype\"");
  if (!dt->is_string()) fail(src, what + "\"dtype\" is not a string but " + dt->type_name());
  t.dtype_str = dt->get<std::string>();
  const DTypeDesc* desc = find_dtype(t.dtype_str);
  if (!desc) fail(src, what + "unknown dtype " + quote(t.dtype_str));
  t.dtype = desc->dtype;

  const auto sh = e.find("shape");
  if (sh == e.end()) fail(src, what + "missing \"shape\"");
  if (!sh->is_array()) fail(src, what + "\"shape\" is not an array but " + sh->type_name());
  std::uint64_t numel = 1;
  for (std::size_t i = 0; i < sh->size(); ++i) {
    const json& d = (*sh)[i];
    std::uint64_t v = 0;
    if (d.is_number_integer() && !d.is_number_unsigned())
      fail(src, what + "shape[" + std::to_string(i) + "] is negative (" + d.dump() + ")");
    if (!as_u64(d, v)) fail(src, what + "shape[" + std::to_string(i) + "] is not an integer but " + d.dump());
    if (v > static_cast<std::uint64_t>(INT64_MAX))
      fail(src, what + "shape[" + std::to_string(i) + "] = " + std::to_string(v) + " is too large");
    t.shape.push_back(static_cast<std::int64_t>(v));
    if (__builtin_mul_overflow(numel, v, &numel))
      fail(src, what + "element count of shape " + shape_str(t.shape) + "... overflows 64 bits");
  }
  std::uint64_t bits = 0;
  if (__builtin_mul_overflow(numel, std::uint64_t{desc->bits}, &bits))
    fail(src, what + "byte size of " + t.dtype_str + " shape " + shape_str(t.shape) + " overflows 64 bits");
  if (bits % 8 != 0)
    fail(src, what + t.dtype_str + " shape " + shape_str(t.shape) + " is not a whole number of bytes");
  const std::uint64_t nbytes = bits / 8;

  const auto off = e.find("data_offsets");
  if (off == e.end()) fail(src, what + "missing \"data_offsets\"");
  if (!off->is_array() || off->size() != 2 || !as_u64((*off)[0], t.begin) || !as_u64((*off)[1], t.end))
    fail(src, what + "\"data_offsets\" must be two non-negative integers [begin, end], got " + off->dump());
  if (t.begin > t.end)
    fail(src, what + "data_offsets begin " + std::to_string(t.begin) + " > end " + std::to_string(t.end));
  if (t.end > data_len)
    fail(src, what + "data_offsets end " + std::to_string(t.end) + " is past the end of the " +
                  std::to_string(data_len) + "-byte data buffer");
  if (t.end - t.begin != nbytes)
    fail(src, what + t.dtype_str + " shape " + shape_str(t.shape) + " needs " + std::to_string(nbytes) +
                  " bytes but data_offsets " + range_str(t) + " span " + std::to_string(t.end - t.begin));
  return t;
}

std::map<std::string, std::string> parse_metadata(const std::string& src, const json& m) {
  std::map<std::string, std::string> out;
  if (m.is_null()) return out;  // the reference reads null as "no metadata"
  if (!m.is_object())
    fail(src, "\"__metadata__\" must be an object of string to string, not " + std::string(m.type_name()));
  for (const auto& [k, v] : m.items()) {
    if (!v.is_string())
      fail(src, "\"__metadata__\" value for key " + quote(k) + " is not a string but " + v.type_name());
    out.emplace(k, v.get<std::string>());
  }
  return out;
}

// Closes an fd and, unless committed, unlinks the temp file it belongs to.
struct TempFile {
  fs::path path;
  int fd = -1;
  bool committed = false;
  ~TempFile() {
    if (fd >= 0) ::close(fd);
    if (!committed && !path.empty()) ::unlink(path.c_str());
  }
};

std::mutex g_hook_mutex;
std::function<void(const fs::path&)> g_before_rename_hook;

// The temporary file read back, its cached pages dropped first where the
// kernel allows (so the read comes from the disk, not from what was just
// written into memory), and compared with the bytes meant: its size and
// every byte, which covers each tensor's CRC-32 and the header. A file that
// differs is not renamed over the previous one. Returns "" when equal, else
// what differs.
std::string read_back_differs(const fs::path& tmp, std::span<const std::byte> want) {
  const int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "cannot open it again to read it back: " + errno_text(errno);
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  std::vector<std::byte> buf(std::min<size_t>(want.size() + 1, size_t(1) << 20));
  size_t at = 0;
  std::string why;
  while (why.empty()) {
    const ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      why = "reading it back failed: " + errno_text(errno);
      break;
    }
    if (r == 0) break;
    const size_t n = size_t(r);
    if (at + n > want.size()) {
      why = "it holds more than the " + std::to_string(want.size()) + " bytes written";
      break;
    }
    const auto mismatch = std::mismatch(buf.begin(), buf.begin() + ptrdiff_t(n), want.begin() + ptrdiff_t(at));
    if (mismatch.first != buf.begin() + ptrdiff_t(n))
      why = "byte " + std::to_string(at + size_t(mismatch.first - buf.begin())) + " differs from what was written";
    at += n;
  }
  ::close(fd);
  if (why.empty() && at != want.size())
    why = "it holds " + std::to_string(at) + " of the " + std::to_string(want.size()) + " bytes written";
  return why;
}

std::vector<std::byte> serialize_impl(std::span<const TensorRef> tensors,
                                      const std::map<std::string, std::string>& metadata,
                                      const std::string& src) {
  std::vector<const TensorRef*> order;
  std::set<std::string_view> names;
  for (const TensorRef& t : tensors) {
    const std::string what = "tensor " + quote(t.name) + ": ";
    if (t.dtype == DType::Other) fail(src, what + "only F32, F64 and I64 can be written");
    if (t.name == "__metadata__") fail(src, what + "that name is reserved for the metadata");
    if (!names.insert(t.name).second) fail(src, "duplicate tensor name " + quote(t.name));
    std::uint64_t n = dtype_bytes(t.dtype);
    for (std::int64_t d : t.shape) {
      if (d < 0) fail(src, what + "negative dimension in shape " + shape_str(t.shape));
      if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n))
        fail(src, what + "byte size of shape " + shape_str(t.shape) + " overflows 64 bits");
    }
    if (n != t.data.size())
      fail(src, what + std::string(dtype_name(t.dtype)) + " shape " + shape_str(t.shape) + " needs " +
                    std::to_string(n) + " bytes but data has " + std::to_string(t.data.size()));
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](const TensorRef* a, const TensorRef* b) {
    const unsigned sa = dtype_bytes(a->dtype), sb = dtype_bytes(b->dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });

  std::map<std::string, std::string> meta;
  for (const auto& [k, v] : metadata) {
    if (is_checksum_key(k))
      fail(src, "metadata key " + quote(k) + " is reserved (keys starting with '" + std::string(kChecksumKeyPrefix) +
                    "' hold the checksums segtape writes itself)");
    meta.emplace(k, v);
  }
  for (const TensorRef* t : order) meta[std::string(kChecksumKeyPrefix) + t->name] = hex8(crc32(t->data));

  json h = json::object();
  if (!meta.empty()) h["__metadata__"] = meta;
  std::uint64_t offset = 0;
  for (const TensorRef* t : order) {
    const std::uint64_t n = t->data.size();
    h[t->name] = {{"dtype", dtype_name(t->dtype)}, {"shape", t->shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string header;
  try {
    header = h.dump();  // throws on names / metadata that are not valid UTF-8
  } catch (const json::exception& e) {
    fail(src, std::string("cannot encode header: ") + e.what());
  }
  header.append((8 - header.size() % 8) % 8, ' ');  // data buffer starts 8-byte aligned

  std::vector<std::byte> out(8 + header.size() + offset);
  const std::uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  std::byte* p = out.data() + 8 + header.size();
  for (const TensorRef* t : order) {
    if (!t->data.empty()) std::memcpy(p, t->data.data(), t->data.size());
    p += t->data.size();
  }
  return out;
}

}  // namespace

// (nlohmann checks strings too, but this gives one clear message for the
// whole header)
namespace {
// ".<target>.tmp.": what save_atomic's temporary files for `target` are
// named with, before "<pid>.<n>" (is_temporary_of recognises them).
std::string temporary_prefix(std::string_view target) { return "." + std::string(target) + ".tmp."; }
}  // namespace

bool is_temporary_of(std::string_view name, std::string_view target) {
  const std::string prefix = temporary_prefix(target);
  if (!name.starts_with(prefix)) return false;
  const std::string_view rest = name.substr(prefix.size());  // <pid>.<n>
  const size_t dot = rest.find('.');
  auto digits = [](std::string_view d) { return !d.empty() && d.find_first_not_of("0123456789") == std::string_view::npos; };
  return dot != std::string_view::npos && digits(rest.substr(0, dot)) && digits(rest.substr(dot + 1));
}

std::size_t utf8_error(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // > U+10FFFF
    } else {
      return i;
    }
    if (n - i < len || p[i + 1] < lo || p[i + 1] > hi) return i;
    for (std::size_t k = 2; k < len; ++k)
      if ((p[i + k] & 0xC0) != 0x80) return i;
    i += len;
  }
  return std::string::npos;
}

std::uint32_t crc32(std::span<const std::byte> bytes, std::uint32_t crc) {
  crc = ~crc;
  const std::byte* p = bytes.data();
  std::size_t n = bytes.size();
  for (; n >= 8; p += 8, n -= 8) {  // little-endian words (see the static_assert above)
    std::uint32_t lo = 0, hi = 0;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= crc;
    crc = kCrc[7][lo & 0xFFu] ^ kCrc[6][(lo >> 8) & 0xFFu] ^ kCrc[5][(lo >> 16) & 0xFFu] ^ kCrc[4][lo >> 24] ^
          kCrc[3][hi & 0xFFu] ^ kCrc[2][(hi >> 8) & 0xFFu] ^ kCrc[1][(hi >> 16) & 0xFFu] ^ kCrc[0][hi >> 24];
  }
  for (; n > 0; --n, ++p) crc = kCrc[0][(crc ^ std::to_integer<std::uint32_t>(*p)) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

std::string_view dtype_name(DType d) {
  switch (d) {
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::I64: return "I64";
    case DType::Other: break;
  }
  return "?";
}

const TensorInfo* File::find(std::string_view name) const {
  for (const TensorInfo& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

std::span<const std::byte> File::data(const TensorInfo& t) const {
  // parse() guarantees this; the check guards hand-built or edited Files.
  if (t.begin > t.end || data_start > bytes.size() || t.end > bytes.size() - data_start)
    fail(source, "tensor " + quote(t.name) + ": data_offsets " + range_str(t) + " outside the file");
  return std::span<const std::byte>(bytes).subspan(data_start + t.begin, t.end - t.begin);
}

const TensorInfo& File::require(std::string_view name, DType want) const {
  const TensorInfo* t = find(name);
  if (!t) fail(source, "no tensor named " + quote(name));
  if (t->dtype != want)
    fail(source, "tensor " + quote(name) + " is " + t->dtype_str + ", not " + std::string(dtype_name(want)));
  return *t;
}

File parse(std::vector<std::byte> bytes, std::string source) {
  const std::string& src = source;
  const std::uint64_t size = bytes.size();
  if (size < 8)
    fail(src, "file is " + std::to_string(size) + " bytes, shorter than the 8-byte header-length prefix");
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const char* first = reinterpret_cast<const char*>(bytes.data()) + 8;
  // A file of another kind (JSON or CSV text, an image, ...) fails here: its
  // first 8 bytes read as an absurd header length, or the byte after them is
  // not the '{' every safetensors header starts with (the reference requires
  // it too). Such failures say so first, then give the precise detail.
  const bool opens_with_brace = size > 8 && first[0] == '{';
  const std::string not_safetensors =
      "not a safetensors file (one starts with an 8-byte little-endian header length followed by that many "
      "bytes of JSON header beginning with '{'): ";
  const std::string lead = opens_with_brace ? std::string() : not_safetensors;  // starts the header checks' messages
  if (n > kMaxHeaderBytes)
    fail(src, not_safetensors + "header length " + std::to_string(n) + " exceeds the " +
                  std::to_string(kMaxHeaderBytes) + "-byte limit");
  if (n > size - 8)
    fail(src, lead + "header length " + std::to_string(n) + " is larger than the " + std::to_string(size - 8) +
                  " bytes after the length prefix" + (opens_with_brace ? " (is the file truncated?)" : ""));

  const char* last = first + n;
  if (std::size_t bad = utf8_error(std::string_view(first, n)); bad != std::string::npos)
    fail(src, lead + "header is not valid UTF-8 (byte " + std::to_string(bad) + " of the header)");
  // nlohmann's lexer takes a NUL byte for the end of input and would ignore
  // whatever follows it; raw NUL is never valid JSON, so reject it here.
  if (const void* z = std::memchr(first, 0, n))
    fail(src, lead + "header is not valid JSON: NUL byte at byte " +
                  std::to_string(static_cast<const char*>(z) - first) + " of the header");
  HeaderChecker checker;
  bool ok = false;
  try {
    ok = json::sax_parse(first, last, &checker);
  } catch (const json::exception& e) {  // not expected from sax_parse, but never let it escape
    fail(src, lead + "header is not valid JSON: " + e.what());
  }
  if (!ok) fail(src, lead + (checker.error.empty() ? "header is not valid JSON" : checker.error));
  const json h = json::parse(first, last, nullptr, /*allow_exceptions=*/false);
  if (h.is_discarded()) fail(src, lead + "header is not valid JSON");
  if (!h.is_object()) fail(src, lead + "header is not a JSON object but " + h.type_name());
  // A JSON object whose text does not start with '{' (leading whitespace, a BOM).
  if (!opens_with_brace) {
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02x", static_cast<unsigned char>(first[0]));
    fail(src, not_safetensors + "the header's first byte is " + byte + ", not '{'");
  }

  File f;
  const std::uint64_t data_len = size - 8 - n;
  for (const auto& [name, entry] : h.items()) {
    if (name == "__metadata__")
      f.metadata = parse_metadata(src, entry);
    else
      f.tensors.push_back(parse_entry(src, name, entry, data_len));
  }

  // The reference requires the tensors, sorted by offset, to tile the data
  // buffer exactly: no overlap (aliasing), no gap (hidden bytes), nothing after.
  std::sort(f.tensors.begin(), f.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.name < b.name;
  });
  std::uint64_t pos = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : f.tensors) {
    if (t.begin < pos)
      fail(src, "tensors " + quote(prev->name) + " " + range_str(*prev) + " and " + quote(t.name) + " " +
                    range_str(t) + " overlap");
    if (t.begin > pos)
      fail(src, prev ? "gap of " + std::to_string(t.begin - pos) + " bytes between tensors " + quote(prev->name) +
                           " (ends at " + std::to_string(pos) + ") and " + quote(t.name) + " (starts at " +
                           std::to_string(t.begin) + ")"
                     : "gap: the first tensor " + quote(t.name) + " starts at " + std::to_string(t.begin) +
                           ", not at 0");
    pos = t.end;
    prev = &t;
  }
  if (pos != data_len)
    fail(src, "gap: " + std::to_string(data_len - pos) + " bytes at the end of the data buffer " +
                  (prev ? "after the last tensor " + quote(prev->name) : std::string("and no tensors")));

  // The checksum keys move out of the user's metadata into f.checksums.
  for (auto it = f.metadata.begin(); it != f.metadata.end();) {
    if (!is_checksum_key(it->first)) {
      ++it;
      continue;
    }
    std::uint32_t crc = 0;
    if (!parse_hex8(it->second, crc))
      fail(src, "\"__metadata__\" key " + quote(it->first) + " should hold a CRC-32 as 8 hex digits but holds " +
                    quote(it->second));
    f.checksums.emplace(it->first.substr(kChecksumKeyPrefix.size()), crc);
    it = f.metadata.erase(it);
  }

  f.bytes = std::move(bytes);
  f.data_start = static_cast<std::size_t>(8 + n);
  f.source = std::move(source);

  // Every stored checksum is verified before any tensor can be read.
  const TensorInfo* damaged = nullptr;
  std::uint32_t stored = 0, actual = 0;
  std::size_t n_damaged = 0;
  for (const TensorInfo& t : f.tensors) {
    const auto c = f.checksums.find(t.name);
    if (c == f.checksums.end()) continue;
    const std::uint32_t got = crc32(f.data(t));
    if (got == c->second) continue;
    if (n_damaged++ == 0) {
      damaged = &t;
      stored = c->second;
      actual = got;
    }
  }
  if (damaged)
    fail(f.source, "tensor " + quote(damaged->name) + ": its " + std::to_string(damaged->end - damaged->begin) +
                  " data bytes do not match the stored checksum (CRC-32 " + hex8(stored) + " in metadata key " +
                  quote(std::string(kChecksumKeyPrefix) + damaged->name) + ", the bytes give " + hex8(actual) +
                  "): the file is damaged" +
                  (n_damaged > 1 ? "; " + std::to_string(n_damaged - 1) + " more tensor(s) do not match either" : "") +
                  " (if another tool changed this tensor on purpose, delete that key to load it unchecked)");
  return f;
}

// A path for a message, its NUL bytes written as \0 (what() ends at the first NUL).
static std::string printable_path(std::string s) {
  for (size_t at = s.find('\0'); at != std::string::npos; at = s.find('\0', at + 2)) s.replace(at, 1, "\\0");
  return s;
}

File load(const fs::path& path) {
  const std::string src = path.string();
  if (src.find('\0') != std::string::npos) fail(printable_path(src), "the path contains a NUL byte");
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer; fstat then refuses it.
  TempFile guard{{}, ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK), true};  // just closes the fd
  if (guard.fd < 0) fail(src, "cannot open: " + errno_text(errno));
  struct stat st {};
  if (::fstat(guard.fd, &st) != 0) fail(src, "cannot stat: " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) fail(src, "not a regular file");
  // The whole file is read into memory: one too large for that (a damaged
  // size, a sparse file) is named, not a std::bad_alloc.
  std::vector<std::byte> bytes;
  try {
    bytes.resize(static_cast<std::size_t>(st.st_size));
  } catch (const std::exception&) {  // bad_alloc, length_error
    fail(src, "the file's " + std::to_string(st.st_size) + " bytes cannot be read into memory (out of memory)");
  }
  std::size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t r = ::read(guard.fd, bytes.data() + got, bytes.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail(src, "read failed: " + errno_text(errno));
    if (r == 0) fail(src, "file shrank while being read");
    got += static_cast<std::size_t>(r);
  }
  return parse(std::move(bytes), src);
}

std::vector<std::byte> serialize(std::span<const TensorRef> tensors,
                                 const std::map<std::string, std::string>& metadata) {
  return serialize_impl(tensors, metadata, "<memory>");
}

void save_atomic(const fs::path& path, std::span<const TensorRef> tensors,
                 const std::map<std::string, std::string>& metadata) {
  const std::string src = path.string();
  if (src.find('\0') != std::string::npos) fail(printable_path(src), "the path contains a NUL byte");
  const std::vector<std::byte> bytes = serialize_impl(tensors, metadata, src);
  if (!path.has_filename()) fail(src, "not a file path");
  // A symbolic link is written through, as open() would (and as torch.save
  // does): its target is replaced and the link kept. (The rename below
  // replaced the link itself with a file: a `latest` link to the
  // checkpoints' folder became a file.)
  fs::path target = path;
  std::error_code lec;
  if (fs::is_symlink(fs::symlink_status(path, lec))) {
    std::error_code cec;
    if (fs::path real = fs::weakly_canonical(path, cec); !cec) target = real;
  }
  // The rename below would replace a device, FIFO or socket at the path:
  // refused instead, as a directory is.
  if (struct stat existing {}; ::stat(target.c_str(), &existing) == 0) {
    if (S_ISDIR(existing.st_mode))
      fail(src, std::string(target == path ? "" : "(a link to " + target.string() + ") ") + "is a directory; give a file name in it");
    if (!S_ISREG(existing.st_mode)) fail(src, "exists and is not a regular file (a device, FIFO or socket); it is not replaced");
  }
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");

  // Same directory, so the rename cannot cross filesystems; pid + counter keep
  // concurrent writers (threads or processes) from sharing a temp file.
  static std::atomic<unsigned long> counter{0};
  TempFile tmp;
  tmp.path = dir / (temporary_prefix(target.filename().string()) + std::to_string(::getpid()) + "." + std::to_string(counter++));
  const std::string tmp_name = tmp.path.string();
  tmp.fd = ::open(tmp.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (tmp.fd < 0) {
    const int e = errno;
    tmp.path.clear();  // not ours: never unlink a file we did not create
    fail(src, "cannot create temporary file " + tmp_name + ": " + errno_text(e));
  }
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(tmp.fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) fail(src, "writing " + tmp_name + " failed: " + errno_text(errno));
    done += static_cast<std::size_t>(w);
  }
  // The data must be durable before the rename makes it the checkpoint, or a
  // crash could leave the new name pointing at a truncated file.
  if (::fsync(tmp.fd) != 0) fail(src, "fsync of " + tmp_name + " failed: " + errno_text(errno));
  const int rc = ::close(tmp.fd);
  tmp.fd = -1;
  if (rc != 0) fail(src, "closing " + tmp_name + " failed: " + errno_text(errno));

  std::function<void(const fs::path&)> hook;
  {
    std::lock_guard lock(g_hook_mutex);
    hook = g_before_rename_hook;
  }
  if (hook) hook(tmp.path);
  if (const std::string why = read_back_differs(tmp.path, bytes); !why.empty())
    fail(src, "the file written (" + tmp_name + ") was read back before replacing it, and " + why +
              "; nothing was replaced (" + (fs::exists(target) ? "the previous file is as it was" : "no file was made") +
              "): a failing disk or a full or faulty filesystem?");

  if (::rename(tmp.path.c_str(), target.c_str()) != 0)
    fail(src, "cannot rename " + tmp_name + " over it: " + errno_text(errno));
  tmp.committed = true;

  // Persist the rename itself. The new file is already in place here, so a
  // failure is reported but there is nothing to roll back.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) fail(src, "saved, but cannot open directory to fsync it: " + errno_text(errno));
  const int drc = ::fsync(dfd);
  const int de = errno;
  ::close(dfd);
  if (drc != 0 && de != EINVAL)  // some filesystems cannot fsync directories
    fail(src, "saved, but fsync of the directory failed: " + errno_text(de));
}

void set_before_rename_hook(std::function<void(const fs::path& tmp)> hook) {
  std::lock_guard lock(g_hook_mutex);
  g_before_rename_hook = std::move(hook);
}

}  // namespace segtape::safetensors
