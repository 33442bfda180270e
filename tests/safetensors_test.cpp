// Tests for segtape::safetensors: round trips, per-tensor checksums, a catalog
// of corrupt files (every parser check), crash-safe saving, and interop with
// Hugging Face's Python package. Also checks (and on request regenerates) the
// fuzz seeds.
#include "segtape/nn/safetensors.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <stdexcept>

namespace st = segtape::safetensors;
namespace fs = std::filesystem;
using segtape::CheckpointError;

#ifndef SEGTAPE_SOURCE_DIR
#error "compile with -DSEGTAPE_SOURCE_DIR=\"<repository root>\""
#endif

namespace {

using Bytes = std::vector<std::byte>;

Bytes to_bytes(std::string_view s) {
  Bytes b(s.size());
  if (!s.empty()) std::memcpy(b.data(), s.data(), s.size());
  return b;
}

// A file from a raw header string and data length (data bytes are 0..255 cycling).
// header_len overrides the length prefix.
Bytes make_file(std::string_view header, std::size_t data_len = 0,
                std::optional<std::uint64_t> header_len = std::nullopt) {
  const std::uint64_t n = header_len.value_or(header.size());
  Bytes b(8);
  std::memcpy(b.data(), &n, 8);
  const Bytes h = to_bytes(header);
  b.insert(b.end(), h.begin(), h.end());
  for (std::size_t i = 0; i < data_len; ++i) b.push_back(static_cast<std::byte>(i));
  return b;
}

template <class T>
std::span<const std::byte> as_bytes(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

// The formulas shared with tests/safetensors_interop.py.
template <class T>
std::vector<T> formula(std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, std::int64_t>)
      v[i] = static_cast<std::int64_t>(i) * 1000000007 - 3;
    else
      v[i] = static_cast<T>(static_cast<double>(i) * 0.5 - 3);
  }
  return v;
}

// Owns the value arrays behind a set of TensorRefs (the set in
// safetensors_interop.py's SPEC: every dtype, a scalar and an empty tensor).
struct InteropTensors {
  std::vector<float> w = formula<float>(6), scalar = formula<float>(1), empty;
  std::vector<double> b = formula<double>(5);
  std::vector<std::int64_t> steps = formula<std::int64_t>(3);
  std::map<std::string, std::string> metadata{{"producer", "segtape"}, {"step", "17"}};
  std::vector<st::TensorRef> refs() const {
    return {{"w", st::DType::F32, {2, 3}, as_bytes(w)},
            {"b", st::DType::F64, {5}, as_bytes(b)},
            {"steps", st::DType::I64, {3}, as_bytes(steps)},
            {"scalar", st::DType::F32, {}, as_bytes(scalar)},
            {"empty", st::DType::F32, {0, 4}, as_bytes(empty)}};
  }
};

void expect_interop_values(const st::File& f) {
  const InteropTensors want;
  EXPECT_EQ(f.metadata, want.metadata);
  ASSERT_NE(f.find("w"), nullptr);
  EXPECT_EQ(f.find("w")->shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(f.values<float>("w"), want.w);
  EXPECT_EQ(f.values<double>("b"), want.b);
  EXPECT_EQ(f.values<std::int64_t>("steps"), want.steps);
  ASSERT_NE(f.find("scalar"), nullptr);
  EXPECT_TRUE(f.find("scalar")->shape.empty());
  EXPECT_EQ(f.values<float>("scalar"), want.scalar);
  ASSERT_NE(f.find("empty"), nullptr);
  EXPECT_EQ(f.find("empty")->shape, (std::vector<std::int64_t>{0, 4}));
  EXPECT_TRUE(f.values<float>("empty").empty());
}

// A fresh directory under the system temp dir, removed at the end of the test.
class TempDir : public ::testing::Test {
 protected:
  fs::path dir;
  void SetUp() override {
    static int counter = 0;
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir = fs::temp_directory_path() / ("segtape_st_" + std::to_string(::getpid()) + "_" +
                                       std::to_string(counter++) + "_" + info->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override {
    st::set_before_rename_hook({});
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
};

// ---------------------------------------------------------------- round trips

TEST(SafetensorsRoundTrip, InMemory) {
  const InteropTensors t;
  const auto refs = t.refs();
  const Bytes bytes = st::serialize(refs, t.metadata);
  const st::File f = st::parse(bytes);
  expect_interop_values(f);
  EXPECT_EQ(f.tensors.size(), 5u);
  EXPECT_EQ(f.source, "<memory>");
  // Data buffer 8-byte aligned (header padded with spaces), every tensor
  // naturally aligned within it, tensors listed in offset order.
  EXPECT_EQ(f.data_start % 8, 0u);
  EXPECT_EQ(static_cast<char>(bytes[f.data_start - 1]), ' ');
  for (std::size_t i = 0; i < f.tensors.size(); ++i) {
    const auto& ti = f.tensors[i];
    EXPECT_EQ(ti.begin % (ti.dtype == st::DType::F32 ? 4 : 8), 0u) << ti.name;
    if (i) {
      EXPECT_LE(f.tensors[i - 1].end, ti.begin);
    }
  }
  EXPECT_EQ(f.find("nope"), nullptr);
}

TEST(SafetensorsRoundTrip, DeterministicWhateverTheInputOrder) {
  const InteropTensors t;
  auto refs = t.refs();
  const Bytes a = st::serialize(refs, t.metadata);
  std::reverse(refs.begin(), refs.end());
  EXPECT_EQ(st::serialize(refs, t.metadata), a);
}

TEST(SafetensorsRoundTrip, NoTensorsNoMetadata) {
  const Bytes bytes = st::serialize({}, {});
  const st::File f = st::parse(bytes);
  EXPECT_TRUE(f.tensors.empty());
  EXPECT_TRUE(f.metadata.empty());
  EXPECT_EQ(bytes.size() % 8, 0u);
}

TEST(SafetensorsRoundTrip, ValuesChecksDtypeAndName) {
  const InteropTensors t;
  const auto refs = t.refs();
  const st::File f = st::parse(st::serialize(refs, t.metadata), "x.safetensors");
  try {
    (void)f.values<double>("w");
    ADD_FAILURE() << "no throw";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("x.safetensors: tensor 'w' is F32, not F64"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW((void)f.values<float>("missing"), CheckpointError);
}

TEST(SafetensorsRoundTrip, OtherDtypesReadAsRawBytes) {
  // BF16 [2] and a BOOL [3], both just bytes; F4 [2] fills exactly one byte.
  const st::File f = st::parse(make_file(
      R"({"h":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
      R"("m":{"dtype":"BOOL","shape":[3],"data_offsets":[4,7]},"q":{"dtype":"F4","shape":[2],"data_offsets":[7,8]}})",
      8));
  const st::TensorInfo* h = f.find("h");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->dtype, st::DType::Other);
  EXPECT_EQ(h->dtype_str, "BF16");
  const auto d = f.data(*h);
  ASSERT_EQ(d.size(), 4u);
  EXPECT_EQ(d[3], std::byte{3});
  EXPECT_EQ(f.data(*f.find("m")).size(), 3u);
  EXPECT_EQ(f.data(*f.find("q")).size(), 1u);
  EXPECT_THROW((void)f.values<float>("h"), CheckpointError);
}

TEST(SafetensorsRoundTrip, ToleratesForeignLayouts) {
  // Unsorted entries, zero-size tensors anywhere, unpadded header, extra keys,
  // trailing whitespace and null metadata: all valid per the reference.
  const st::File f = st::parse(make_file(
      "{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8],\"extra\":1},"
      "\"e\":{\"dtype\":\"I64\",\"shape\":[0],\"data_offsets\":[4,4]},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"__metadata__\":null} \n\t",
      8));
  ASSERT_EQ(f.tensors.size(), 3u);
  EXPECT_EQ(f.tensors[0].name, "a");
  EXPECT_EQ(f.tensors[1].name, "e");
  EXPECT_EQ(f.tensors[2].name, "b");
  EXPECT_TRUE(f.metadata.empty());
}

TEST(SafetensorsSerialize, RejectsBadTensors) {
  const std::vector<float> six(6);
  auto expect_error = [](std::vector<st::TensorRef> refs, const std::string& fragment) {
    try {
      (void)st::serialize(refs, {});
      ADD_FAILURE() << "no throw for " << fragment;
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error({{"x", st::DType::F32, {2, 2}, as_bytes(six)}}, "tensor 'x': F32 shape [2, 2] needs 16 bytes but data has 24");
  expect_error({{"x", st::DType::F32, {-1}, as_bytes(six)}}, "negative dimension");
  expect_error({{"x", st::DType::F32, {6}, as_bytes(six)}, {"x", st::DType::F32, {6}, as_bytes(six)}},
               "duplicate tensor name 'x'");
  expect_error({{"__metadata__", st::DType::F32, {6}, as_bytes(six)}}, "reserved");
  expect_error({{"x", st::DType::Other, {6}, as_bytes(six)}}, "only F32, F64 and I64");
  expect_error({{"bad\xff", st::DType::F32, {6}, as_bytes(six)}}, "cannot encode header");
  expect_error({{"x", st::DType::F64, {1LL << 40, 1LL << 40}, as_bytes(six)}}, "overflows 64 bits");
}

TEST(SafetensorsSerialize, RejectsChecksumKeysInMetadata) {
  const std::vector<float> six(6);
  const std::vector<st::TensorRef> refs{{"x", st::DType::F32, {6}, as_bytes(six)}};
  try {
    (void)st::serialize(refs, {{"segtape.crc32.x", "00000000"}});
    ADD_FAILURE() << "no throw";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("metadata key 'segtape.crc32.x' is reserved"), std::string::npos) << e.what();
  }
}

// -------------------------------------------------------- corrupt-file catalog

struct Corrupt {
  std::string name;
  std::function<Bytes()> make;
  std::string fragment;  // must appear in e.what()
};

std::string entry(std::string_view name, std::string_view body) {
  return "\"" + std::string(name) + "\":{" + std::string(body) + "}";
}
// One F32 tensor "t" with the given shape/offsets JSON text.
Bytes one(std::string_view body, std::size_t data_len) { return make_file("{" + entry("t", body) + "}", data_len); }

std::vector<Corrupt> catalog() {
  const std::string ok = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";
  return {
      {"empty_file", [] { return Bytes{}; }, "file is 0 bytes, shorter than the 8-byte header-length prefix"},
      {"five_bytes", [] { return Bytes(5); }, "file is 5 bytes, shorter than"},
      {"header_len_past_end", [] { return make_file("{}", 0, 1000); },
       "header length 1000 is larger than the 2 bytes after the length prefix"},
      {"header_len_over_cap", [] { return make_file("{}", 0, 100'000'001); },
       "header length 100000001 exceeds the 100000000-byte limit"},
      {"header_len_u64_max", [] { return make_file("{}", 0, UINT64_MAX); }, "exceeds the 100000000-byte limit"},
      {"header_empty", [] { return make_file(""); }, "header is not valid JSON"},
      {"header_not_utf8", [] { return make_file("{\"\xff\":1}"); }, "header is not valid UTF-8 (byte 2 of the header)"},
      {"header_overlong_utf8", [] { return make_file("{\"\xc0\x80\":1}"); }, "not valid UTF-8"},
      {"header_surrogate_utf8", [] { return make_file("{\"\xed\xa0\x80\":1}"); }, "not valid UTF-8"},
      {"header_truncated_utf8", [] { return make_file("{\"\xe2\x82"); }, "not valid UTF-8"},
      {"header_lone_surrogate_escape", [] { return make_file(R"({"\ud800":1})"); }, "header is not valid JSON"},
      {"header_not_json", [] { return make_file("{abc"); }, "header is not valid JSON"},
      {"header_trailing_garbage", [] { return make_file("{} x"); }, "header is not valid JSON"},
      {"header_nul_padding", [] { return make_file(std::string("{}\0\0", 4)); },
       "header is not valid JSON: NUL byte at byte 2 of the header"},
      {"header_nul_then_garbage", [] { return make_file(std::string("{}\0garbage", 10)); }, "NUL byte at byte 2"},
      {"header_array", [] { return make_file("[1,2]"); }, "header is not a JSON object but array"},
      {"header_string", [] { return make_file("\"x\""); }, "header is not a JSON object but string"},
      {"header_deep_nesting", [] { return make_file(std::string(40, '[') + std::string(40, ']')); },
       "nested deeper than 32 levels"},
      {"header_deep_nesting_unclosed", [] { return make_file("{\"a\":" + std::string(500, '[')); },
       "nested deeper than 32 levels"},
      {"duplicate_tensor_name", [=] { return make_file("{" + entry("t", ok) + "," + entry("t", ok) + "}", 8); },
       "duplicate tensor name 't'"},
      {"duplicate_key_in_entry", [=] { return one(ok + R"(,"dtype":"F64")", 8); },
       "duplicate key 'dtype' inside entry 't'"},
      {"entry_not_object", [] { return make_file(R"({"t":[1]})"); }, "tensor 't': entry is not an object but array"},
      {"dtype_missing", [] { return one(R"("shape":[2],"data_offsets":[0,8])", 8); }, "tensor 't': missing \"dtype\""},
      {"dtype_not_string", [] { return one(R"("dtype":32,"shape":[2],"data_offsets":[0,8])", 8); },
       "tensor 't': \"dtype\" is not a string but number"},
      {"dtype_unknown", [] { return one(R"("dtype":"F13","shape":[2],"data_offsets":[0,8])", 8); },
       "tensor 't': unknown dtype 'F13'"},
      {"shape_missing", [] { return one(R"("dtype":"F32","data_offsets":[0,8])", 8); }, "tensor 't': missing \"shape\""},
      {"shape_not_array", [] { return one(R"("dtype":"F32","shape":2,"data_offsets":[0,8])", 8); },
       "\"shape\" is not an array but number"},
      {"shape_float_dim", [] { return one(R"("dtype":"F32","shape":[2.0],"data_offsets":[0,8])", 8); },
       "shape[0] is not an integer but 2.0"},
      {"shape_string_dim", [] { return one(R"("dtype":"F32","shape":["2"],"data_offsets":[0,8])", 8); },
       "shape[0] is not an integer"},
      {"shape_negative_dim", [] { return one(R"("dtype":"F32","shape":[2,-3],"data_offsets":[0,8])", 8); },
       "tensor 't': shape[1] is negative (-3)"},
      {"shape_huge_dim", [] { return one(R"("dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,8])", 8); },
       "shape[0] = 9223372036854775808 is too large"},
      {"shape_beyond_u64", [] { return one(R"("dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,8])", 8); },
       "shape[0] is not an integer"},
      {"shape_numel_overflow",
       [] { return one(R"("dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,8])", 8); },
       "element count of shape [4294967296, 4294967296]... overflows 64 bits"},
      {"shape_bytes_overflow", [] { return one(R"("dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,8])", 8); },
       "byte size of F64 shape [2305843009213693952] overflows 64 bits"},
      {"shape_subbyte_partial", [] { return one(R"("dtype":"F4","shape":[3],"data_offsets":[0,2])", 2); },
       "F4 shape [3] is not a whole number of bytes"},
      {"offsets_missing", [] { return one(R"("dtype":"F32","shape":[2])", 8); }, "tensor 't': missing \"data_offsets\""},
      {"offsets_one_value", [] { return one(R"("dtype":"F32","shape":[2],"data_offsets":[8])", 8); },
       "\"data_offsets\" must be two non-negative integers [begin, end], got [8]"},
      {"offsets_three_values", [] { return one(R"("dtype":"F32","shape":[2],"data_offsets":[0,4,8])", 8); },
       "must be two non-negative integers"},
      {"offsets_negative", [] { return one(R"("dtype":"F32","shape":[2],"data_offsets":[-8,0])", 8); },
       "must be two non-negative integers"},
      {"offsets_float", [] { return one(R"("dtype":"F32","shape":[2],"data_offsets":[0,8.0])", 8); },
       "must be two non-negative integers"},
      {"offsets_object", [] { return one(R"("dtype":"F32","shape":[2],"data_offsets":{"a":0})", 8); },
       "must be two non-negative integers"},
      {"offsets_begin_after_end", [] { return one(R"("dtype":"F32","shape":[2],"data_offsets":[8,0])", 8); },
       "tensor 't': data_offsets begin 8 > end 0"},
      {"offsets_past_buffer", [] { return one(R"("dtype":"F32","shape":[2],"data_offsets":[0,8])", 4); },
       "tensor 't': data_offsets end 8 is past the end of the 4-byte data buffer"},
      {"offsets_u64_max", [] { return one(R"("dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615])", 8); },
       "is past the end of the 8-byte data buffer"},
      {"size_mismatch", [] { return one(R"("dtype":"F32","shape":[2,3],"data_offsets":[0,20])", 20); },
       "tensor 't': F32 shape [2, 3] needs 24 bytes but data_offsets [0, 20) span 20"},
      {"overlap",
       [] {
         return make_file("{" + entry("a", R"("dtype":"F32","shape":[2],"data_offsets":[0,8])") + "," +
                              entry("b", R"("dtype":"F32","shape":[2],"data_offsets":[4,12])") + "}",
                          12);
       },
       "tensors 'a' [0, 8) and 'b' [4, 12) overlap"},
      {"overlap_identical",
       [] {
         return make_file("{" + entry("a", R"("dtype":"F32","shape":[2],"data_offsets":[0,8])") + "," +
                              entry("b", R"("dtype":"F32","shape":[2],"data_offsets":[0,8])") + "}",
                          8);
       },
       "tensors 'a' [0, 8) and 'b' [0, 8) overlap"},
      {"overlap_empty_inside",
       [] {
         return make_file("{" + entry("a", R"("dtype":"F32","shape":[2],"data_offsets":[0,8])") + "," +
                              entry("e", R"("dtype":"F32","shape":[0],"data_offsets":[4,4])") + "}",
                          8);
       },
       "tensors 'a' [0, 8) and 'e' [4, 4) overlap"},
      {"gap_between",
       [] {
         return make_file("{" + entry("a", R"("dtype":"F32","shape":[2],"data_offsets":[0,8])") + "," +
                              entry("b", R"("dtype":"F32","shape":[2],"data_offsets":[12,20])") + "}",
                          20);
       },
       "gap of 4 bytes between tensors 'a' (ends at 8) and 'b' (starts at 12)"},
      {"gap_at_start", [] { return one(R"("dtype":"F32","shape":[2],"data_offsets":[4,12])", 12); },
       "gap: the first tensor 't' starts at 4, not at 0"},
      {"gap_at_end", [=] { return one(ok, 11); }, "gap: 3 bytes at the end of the data buffer after the last tensor 't'"},
      {"gap_no_tensors", [] { return make_file("{}", 5); }, "gap: 5 bytes at the end of the data buffer and no tensors"},
      {"metadata_not_object", [] { return make_file(R"({"__metadata__":["a"]})"); },
       "\"__metadata__\" must be an object of string to string, not array"},
      {"metadata_value_not_string", [] { return make_file(R"({"__metadata__":{"epoch":3}})"); },
       "\"__metadata__\" value for key 'epoch' is not a string but number"},
      {"metadata_duplicate_key", [] { return make_file(R"({"__metadata__":{"k":"1","k":"2"}})"); },
       "duplicate key 'k' inside entry '__metadata__'"},
      {"long_name_truncated", [] { return make_file("{\"" + std::string(5000, 'n') + "\":1}"); },
       "...' (5000 bytes): entry is not an object"},
      {"json_text_file", [] { return to_bytes("{\n  \"eval_accuracy\": 0.5,\n  \"steps\": 64\n}\n"); },
       "not a safetensors file (one starts with an 8-byte little-endian header length"},
      {"header_leading_space", [] { return make_file(" {}"); },
       "not a safetensors file (one starts with an 8-byte little-endian header length followed by that many bytes "
       "of JSON header beginning with '{'): the header's first byte is 0x20, not '{'"},
      {"header_array_not_safetensors", [] { return make_file("[1,2]"); },
       "not a safetensors file (one starts with"},
      {"checksum_not_hex", [=] { return make_file("{\"__metadata__\":{\"segtape.crc32.t\":\"0x12ab\"}," + entry("t", ok) + "}", 8); },
       "\"__metadata__\" key 'segtape.crc32.t' should hold a CRC-32 as 8 hex digits but holds '0x12ab'"},
      {"checksum_mismatch", [=] { return make_file("{\"__metadata__\":{\"segtape.crc32.t\":\"00000000\"}," + entry("t", ok) + "}", 8); },
       "tensor 't': its 8 data bytes do not match the stored checksum (CRC-32 00000000 in metadata key "
       "'segtape.crc32.t', the bytes give "},
  };
}

TEST(SafetensorsCorrupt, Catalog) {
  for (const Corrupt& c : catalog()) {
    SCOPED_TRACE(c.name);
    const std::string source = "case-" + c.name;
    try {
      (void)st::parse(c.make(), source);
      ADD_FAILURE() << c.name << ": parsed without error";
    } catch (const CheckpointError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(source + ": ", 0), 0u) << "message does not start with the source: " << msg;
      EXPECT_NE(msg.find(c.fragment), std::string::npos) << "want '" << c.fragment << "' in: " << msg;
      EXPECT_LT(msg.size(), 1000u) << "message is unbounded";
    }
  }
}

TEST(SafetensorsCorrupt, TruncatedValidFileFailsEverywhere) {
  // Every prefix of a valid file is rejected with a CheckpointError.
  const InteropTensors t;
  const auto refs = t.refs();
  const Bytes good = st::serialize(refs, t.metadata);
  for (std::size_t len = 0; len < good.size(); ++len)
    EXPECT_THROW((void)st::parse(Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len))), CheckpointError)
        << len;
}

// ------------------------------------------------------------------ checksums

TEST(SafetensorsChecksum, IsZlibCrc32) {
  // The standard check value of CRC-32/ISO-HDLC, and what Python's
  // zlib.crc32 gives for these inputs.
  EXPECT_EQ(st::crc32(to_bytes("123456789")), 0xCBF43926u);
  EXPECT_EQ(st::crc32({}), 0u);
  EXPECT_EQ(st::crc32(to_bytes("The quick brown fox jumps over the lazy dog")), 0x414FA339u);
  EXPECT_EQ(st::crc32(to_bytes("6789"), st::crc32(to_bytes("12345"))), 0xCBF43926u);
  // Against the bit-at-a-time definition, for every start offset and length
  // up to 40 bytes of a pseudo-random buffer (all alignments and tails of the
  // 8-bytes-at-a-time loop).
  auto bitwise = [](std::span<const std::byte> b) {
    std::uint32_t c = 0xFFFFFFFFu;
    for (const std::byte x : b) {
      c ^= std::to_integer<std::uint32_t>(x);
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    }
    return ~c;
  };
  Bytes buf(64);
  std::uint32_t x = 12345;
  for (std::byte& b : buf) b = static_cast<std::byte>((x = x * 1103515245u + 12345u) >> 24);
  for (std::size_t at = 0; at < 8; ++at)
    for (std::size_t len = 0; len <= 40; ++len) {
      const auto s = std::span<const std::byte>(buf).subspan(at, len);
      ASSERT_EQ(st::crc32(s), bitwise(s)) << "offset " << at << " length " << len;
    }
}

TEST(SafetensorsChecksum, EveryTensorWrittenCarriesOne) {
  const InteropTensors t;
  const auto refs = t.refs();
  const Bytes bytes = st::serialize(refs, t.metadata);
  const st::File f = st::parse(bytes);
  // One stored checksum per tensor, each the CRC-32 of its data bytes; the
  // keys are kept out of the user's metadata.
  ASSERT_EQ(f.checksums.size(), refs.size());
  for (const st::TensorInfo& ti : f.tensors) {
    ASSERT_TRUE(f.checksums.contains(ti.name)) << ti.name;
    EXPECT_EQ(f.checksums.at(ti.name), st::crc32(f.data(ti))) << ti.name;
  }
  EXPECT_EQ(f.metadata, t.metadata);
  // In the header they are flat string entries of __metadata__.
  const std::string header(reinterpret_cast<const char*>(bytes.data()) + 8, f.data_start - 8);
  char want[64];
  std::snprintf(want, sizeof want, "\"segtape.crc32.w\":\"%08x\"", st::crc32(as_bytes(t.w)));
  EXPECT_NE(header.find(want), std::string::npos) << header;
  // Re-writing what was read (as a tool that edits one tensor does) gives
  // fresh checksums and the same file.
  std::vector<st::TensorRef> again;
  for (const st::TensorInfo& ti : f.tensors) again.push_back({ti.name, ti.dtype, ti.shape, f.data(ti)});
  EXPECT_EQ(st::serialize(again, f.metadata), bytes);
}

TEST_F(TempDir, FlippedDataByteNamesTheTensor) {
  const InteropTensors t;
  const auto refs = t.refs();
  const fs::path p = dir / "ckpt.safetensors";
  st::save_atomic(p, refs, t.metadata);
  const st::File good = st::load(p);
  int damaged_files = 0;
  for (const st::TensorInfo& ti : good.tensors) {
    if (ti.begin == ti.end) continue;  // the empty tensor has no byte to flip
    for (const std::uint64_t at : {ti.begin, ti.end - 1}) {
      SCOPED_TRACE(ti.name + " byte " + std::to_string(at));
      Bytes b = good.bytes;
      b[good.data_start + at] ^= std::byte{0x01};
      const fs::path q = dir / "flipped.safetensors";
      std::ofstream(q, std::ios::binary | std::ios::trunc)
          .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
      try {
        (void)st::load(q);
        ADD_FAILURE() << "a flipped data byte loaded silently";
      } catch (const CheckpointError& e) {
        const std::string msg = e.what();
        EXPECT_EQ(msg.rfind(q.string() + ": tensor '" + ti.name + "': its ", 0), 0u) << msg;
        EXPECT_NE(msg.find("do not match the stored checksum"), std::string::npos) << msg;
        EXPECT_NE(msg.find("the file is damaged"), std::string::npos) << msg;
      }
      ++damaged_files;
    }
  }
  EXPECT_EQ(damaged_files, 8);  // two bytes of each of the 4 non-empty tensors
}

TEST(SafetensorsChecksum, FilesWithoutChecksumsLoad) {
  // As PyTorch's safetensors writes them: no segtape keys at all, or metadata
  // of its own. Nothing to verify, the values load as they are.
  const std::string body = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";
  for (const std::string& meta : {std::string(), std::string(R"("__metadata__":{"format":"pt"},)")}) {
    SCOPED_TRACE(meta);
    const st::File f = st::parse(make_file("{" + meta + entry("t", body) + "}", 8));
    EXPECT_TRUE(f.checksums.empty());
    EXPECT_EQ(f.data(*f.find("t")).size(), 8u);
    EXPECT_EQ(f.data(*f.find("t"))[7], std::byte{7});
  }
  // A checksum for one tensor verifies that one; the other loads unchecked.
  const Bytes data{std::byte{0}, std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4}, std::byte{5}, std::byte{6}, std::byte{7}};
  char meta[96];
  std::snprintf(meta, sizeof meta, R"("__metadata__":{"segtape.crc32.a":"%08x"},)",
                st::crc32(std::span<const std::byte>(data).first(4)));
  const st::File f = st::parse(make_file(std::string("{") + meta +
                                             entry("a", R"("dtype":"F32","shape":[1],"data_offsets":[0,4])") + "," +
                                             entry("b", R"("dtype":"F32","shape":[1],"data_offsets":[4,8])") + "}",
                                         8));
  EXPECT_EQ(f.checksums.size(), 1u);
  EXPECT_TRUE(f.metadata.empty());
}

TEST_F(TempDir, TextFileIsNotASafetensorsFile) {
  // What `segtape eval --checkpoint metrics.json` reads: its first 8 bytes
  // ("{\n  \"eval") as a header length are absurd.
  const fs::path p = dir / "metrics.json";
  std::ofstream(p, std::ios::binary) << "{\n  \"eval_accuracy\": 0.5,\n  \"steps\": 64\n}\n";
  try {
    (void)st::load(p);
    ADD_FAILURE();
  } catch (const CheckpointError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(p.string() + ": not a safetensors file (", 0), 0u) << msg;
    EXPECT_NE(msg.find("): header length "), std::string::npos) << msg;
  }
  // A truncated safetensors file is not called "not a safetensors file".
  const InteropTensors t;
  const auto refs = t.refs();
  const Bytes good = st::serialize(refs, t.metadata);
  try {
    (void)st::parse(Bytes(good.begin(), good.begin() + 40), "cut");
    ADD_FAILURE();
  } catch (const CheckpointError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find("not a safetensors file"), std::string::npos) << msg;
    EXPECT_NE(msg.find("is larger than the 32 bytes after the length prefix (is the file truncated?)"), std::string::npos)
        << msg;
  }
}

TEST_F(TempDir, LoadNamesThePath) {
  const fs::path p = dir / "bad.safetensors";
  std::ofstream(p, std::ios::binary) << "xyz";
  try {
    (void)st::load(p);
    ADD_FAILURE();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(p.string() + ": file is 3 bytes"), std::string::npos) << e.what();
  }
  try {
    (void)st::load(dir / "missing.safetensors");
    ADD_FAILURE();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("missing.safetensors: cannot open: No such file or directory"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW((void)st::load(dir), CheckpointError);  // a directory
}

// ------------------------------------------------------------------ atomicity

TEST_F(TempDir, SaveAndLoad) {
  const InteropTensors t;
  const auto refs = t.refs();
  const fs::path p = dir / "ckpt.safetensors";
  st::save_atomic(p, refs, t.metadata);
  const st::File f = st::load(p);
  EXPECT_EQ(f.source, p.string());
  expect_interop_values(f);
  EXPECT_EQ(listing(), std::vector<std::string>{"ckpt.safetensors"});
  st::save_atomic(p, refs, {});  // overwrite
  EXPECT_TRUE(st::load(p).metadata.empty());
  EXPECT_EQ(listing(), std::vector<std::string>{"ckpt.safetensors"});
}

TEST_F(TempDir, CrashBeforeRenameKeepsOldFile) {
  const std::vector<float> a{1, 2, 3}, b{4, 5, 6, 7};
  const std::vector<st::TensorRef> ra{{"x", st::DType::F32, {3}, as_bytes(a)}};
  const std::vector<st::TensorRef> rb{{"x", st::DType::F32, {4}, as_bytes(b)}};
  const fs::path p = dir / "ckpt.safetensors";
  st::save_atomic(p, ra, {{"v", "A"}});

  bool hook_ran = false;
  st::set_before_rename_hook([&](const fs::path& tmp) {
    hook_ran = true;
    // The temp file is complete and durable before the rename.
    EXPECT_EQ(tmp.parent_path(), dir);
    EXPECT_EQ(st::load(tmp).values<float>("x"), b);
    throw std::runtime_error("simulated crash");
  });
  EXPECT_THROW(st::save_atomic(p, rb, {{"v", "B"}}), std::runtime_error);
  EXPECT_TRUE(hook_ran);
  st::set_before_rename_hook({});

  const st::File f = st::load(p);
  EXPECT_EQ(f.metadata.at("v"), "A");
  EXPECT_EQ(f.values<float>("x"), a);
  EXPECT_EQ(listing(), std::vector<std::string>{"ckpt.safetensors"});  // temp file removed

  st::save_atomic(p, rb, {{"v", "B"}});  // and without the hook B goes through
  EXPECT_EQ(st::load(p).values<float>("x"), b);
}

// The file written is read back and compared with the bytes meant before
// it replaces the previous one: a byte the disk changed, a file cut short
// or grown (the hook, after the write and its fsync, plays the faulty disk)
// is refused naming what differs, the previous file is as it was, and the
// temporary file is removed.
TEST_F(TempDir, AWriteThatReadsBackWrongReplacesNothing) {
  const std::vector<float> a{1, 2, 3}, b{4, 5, 6, 7};
  const std::vector<st::TensorRef> ra{{"x", st::DType::F32, {3}, as_bytes(a)}};
  const std::vector<st::TensorRef> rb{{"x", st::DType::F32, {4}, as_bytes(b)}};
  const fs::path p = dir / "ckpt.safetensors";
  st::save_atomic(p, ra, {{"v", "A"}});
  const size_t size_b = st::serialize(rb, {{"v", "B"}}).size();
  const std::vector<std::pair<std::function<void(const fs::path&)>, std::string>> faults = {
      {[](const fs::path& tmp) {
         std::fstream f(tmp, std::ios::in | std::ios::out | std::ios::binary);
         f.seekp(-2, std::ios::end);
         f.put('\x55');
       },
       "byte " + std::to_string(size_b - 2) + " differs from what was written"},
      {[&](const fs::path& tmp) { fs::resize_file(tmp, size_b - 1); },
       "it holds " + std::to_string(size_b - 1) + " of the " + std::to_string(size_b) + " bytes written"},
      {[](const fs::path& tmp) { std::ofstream(tmp, std::ios::app | std::ios::binary) << 'x'; },
       "it holds more than the " + std::to_string(size_b) + " bytes written"},
  };
  for (const auto& [fault, why] : faults) {
    st::set_before_rename_hook(fault);
    try {
      st::save_atomic(p, rb, {{"v", "B"}});
      ADD_FAILURE() << why;
    } catch (const CheckpointError& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.rfind(p.string() + ": the file written (", 0), 0u) << m;
      EXPECT_NE(m.find("was read back before replacing it, and " + why + "; nothing was replaced (the previous file is as it was)"),
                std::string::npos) << m;
    }
    st::set_before_rename_hook({});
    const st::File f = st::load(p);
    EXPECT_EQ(f.metadata.at("v"), "A");
    EXPECT_EQ(f.values<float>("x"), a);
    EXPECT_EQ(listing(), std::vector<std::string>{"ckpt.safetensors"});
  }
  st::save_atomic(p, rb, {{"v", "B"}});  // without a fault B goes through
  EXPECT_EQ(st::load(p).values<float>("x"), b);
}

TEST_F(TempDir, UnwritableDirectory) {
  const std::vector<float> a{1, 2, 3};
  const std::vector<st::TensorRef> ra{{"x", st::DType::F32, {3}, as_bytes(a)}};
  const fs::path file = dir / "regular";
  std::ofstream(file) << "not a directory";
  for (const fs::path& p : {file / "ckpt.safetensors", fs::path("/proc/segtape_ckpt.safetensors"),
                            dir / "no" / "such" / "dir" / "ckpt.safetensors"}) {
    try {
      st::save_atomic(p, ra, {});
      ADD_FAILURE() << p;
    } catch (const CheckpointError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(p.string() + ": cannot create temporary file", 0), 0u) << msg;
    }
  }
  EXPECT_EQ(listing(), std::vector<std::string>{"regular"});
}

TEST_F(TempDir, RenameFailureKeepsTargetAndRemovesTemp) {
  // A non-empty directory appears at the target after the checks (made by the
  // hook just before the rename): everything up to the rename works, the
  // rename fails, and nothing may be left behind or lost.
  const std::vector<float> a{1, 2, 3};
  const std::vector<st::TensorRef> ra{{"x", st::DType::F32, {3}, as_bytes(a)}};
  const fs::path p = dir / "ckpt.safetensors";
  st::set_before_rename_hook([&](const fs::path&) {
    fs::create_directory(p);
    std::ofstream(p / "keep") << "precious";
  });
  try {
    st::save_atomic(p, ra, {});
    ADD_FAILURE();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(p.string() + ": cannot rename"), std::string::npos) << e.what();
  }
  st::set_before_rename_hook({});
  EXPECT_TRUE(fs::exists(p / "keep"));
  EXPECT_EQ(listing(), std::vector<std::string>{"ckpt.safetensors"});
}

TEST_F(TempDir, ADirectoryIsRefusedAndALinkIsWrittenThrough) {
  const std::vector<float> a{1, 2, 3};
  const std::vector<st::TensorRef> ra{{"x", st::DType::F32, {3}, as_bytes(a)}};
  // A directory, or a link to one, is refused before anything is written
  // (the rename replaced a link to a folder with a file).
  const fs::path folder = dir / "ckpts";
  fs::create_directory(folder);
  fs::create_directory_symlink(folder, dir / "latest");
  for (const fs::path& p : {folder, dir / "latest"}) {
    try {
      st::save_atomic(p, ra, {});
      ADD_FAILURE() << p;
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("is a directory; give a file name in it"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(fs::is_symlink(dir / "latest"));
  // A link to a checkpoint: the checkpoint is replaced, the link kept.
  const fs::path real = folder / "a.safetensors", link = dir / "best.safetensors";
  st::save_atomic(real, ra, {});
  fs::create_symlink(real, link);
  const std::vector<float> b{4, 5, 6};
  st::save_atomic(link, std::vector<st::TensorRef>{{"x", st::DType::F32, {3}, as_bytes(b)}}, {});
  EXPECT_TRUE(fs::is_symlink(link));
  const st::File f = st::load(real);
  const auto got = f.data(*f.find("x"));
  EXPECT_EQ(std::memcmp(got.data(), b.data(), sizeof(float) * 3), 0);
  EXPECT_EQ(listing(), (std::vector<std::string>{"best.safetensors", "ckpts", "latest"}));
}

// A file too large to read into memory (here a sparse 1 TiB one) is a
// CheckpointError naming it, not a std::bad_alloc. Where the kernel would
// grant the allocation anyway (overcommit_memory 1) or ASan refuses it by
// aborting, the case cannot be made and is skipped.
TEST_F(TempDir, AFileTooLargeForMemoryIsNamed) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "ASan aborts on a 1 TiB allocation instead of throwing";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  GTEST_SKIP() << "ASan aborts on a 1 TiB allocation instead of throwing";
#endif
#endif
  std::ifstream oc("/proc/sys/vm/overcommit_memory");
  int mode = -1;
  if (!(oc >> mode) || mode == 1) GTEST_SKIP() << "overcommit_memory is " << mode << ": a 1 TiB allocation may succeed";
  const fs::path big = dir / "huge.safetensors";
  { std::ofstream(big).put('x'); }
  std::error_code ec;
  fs::resize_file(big, std::uintmax_t(1) << 40, ec);
  if (ec) GTEST_SKIP() << "this filesystem holds no sparse 1 TiB file: " << ec.message();
  try {
    (void)st::load(big);
    ADD_FAILURE() << "a 1 TiB file loaded";
  } catch (const CheckpointError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(big.string()), std::string::npos) << m;
    EXPECT_NE(m.find("1099511627776 bytes cannot be read into memory"), std::string::npos) << m;
  }
}

// A FIFO at the path: load refuses it at once (opening it for reading would
// wait for a writer), save refuses to replace it; a path with a NUL byte
// (possible from Python) is refused, not cut short at the NUL.
TEST_F(TempDir, SpecialFilesAndNulPathsAreRefused) {
  const std::vector<float> a{1, 2, 3};
  const std::vector<st::TensorRef> ra{{"x", st::DType::F32, {3}, as_bytes(a)}};
  const fs::path fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const CheckpointError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message([&] { (void)st::load(fifo); }).find("not a regular file"), std::string::npos);
  EXPECT_NE(message([&] { st::save_atomic(fifo, ra, {}); }).find("is not a regular file"), std::string::npos);
  EXPECT_TRUE(fs::is_fifo(fifo)) << "the FIFO was replaced";
  const std::string nul = (dir / "a").string() + std::string(1, '\0') + "b";
  EXPECT_NE(message([&] { st::save_atomic(nul, ra, {}); }).find("NUL byte"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir / "a")) << "the path was cut short at the NUL";
  st::save_atomic(dir / "a", ra, {});
  EXPECT_NE(message([&] { (void)st::load(nul); }).find("NUL byte"), std::string::npos);
}

TEST_F(TempDir, DiskFullKeepsOldFile) {
  // RLIMIT_FSIZE makes write() fail with EFBIG part-way, like a full disk.
  const std::vector<float> a{1, 2, 3};
  const std::vector<float> big(1 << 16);
  const std::vector<st::TensorRef> ra{{"x", st::DType::F32, {3}, as_bytes(a)}};
  const std::vector<st::TensorRef> rb{{"x", st::DType::F32, {1 << 16}, as_bytes(big)}};
  const fs::path p = dir / "ckpt.safetensors";
  st::save_atomic(p, ra, {});

  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit small = old;
  small.rlim_cur = 4096;
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // else the signal kills us
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string msg;
  try {
    st::save_atomic(p, rb, {});
  } catch (const CheckpointError& e) {
    msg = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);

  EXPECT_EQ(msg.rfind(p.string() + ": writing ", 0), 0u) << msg;
  EXPECT_NE(msg.find("File too large"), std::string::npos) << msg;
  EXPECT_EQ(st::load(p).values<float>("x"), a);
  EXPECT_EQ(listing(), std::vector<std::string>{"ckpt.safetensors"});
}

// ------------------------------------------------------------------- interop

bool python_has_safetensors() {
  return std::system("python3 -c 'import safetensors, numpy' >/dev/null 2>&1") == 0;
}

std::string interop_command(const std::string& mode, const fs::path& file) {
  const fs::path script = fs::path(SEGTAPE_SOURCE_DIR) / "tests" / "safetensors_interop.py";
  return "python3 '" + script.string() + "' " + mode + " '" + file.string() + "'";
}

TEST_F(TempDir, InteropPythonLoadsOurFile) {
  if (!python_has_safetensors())
    GTEST_SKIP() << "python3 with safetensors and numpy not found (pip install safetensors numpy)";
  const InteropTensors t;
  const auto refs = t.refs();
  const fs::path p = dir / "from_cpp.safetensors";
  st::save_atomic(p, refs, t.metadata);
  EXPECT_EQ(std::system(interop_command("check", p).c_str()), 0);
}

TEST_F(TempDir, InteropWeLoadPythonFile) {
  if (!python_has_safetensors())
    GTEST_SKIP() << "python3 with safetensors and numpy not found (pip install safetensors numpy)";
  const fs::path p = dir / "from_python.safetensors";
  ASSERT_EQ(std::system(interop_command("write", p).c_str()), 0);
  const st::File f = st::load(p);
  expect_interop_values(f);
  EXPECT_TRUE(f.checksums.empty());  // Python's writer stores none; nothing to verify
  // float16 [-3, -2.5, -2] as raw bytes: 0xC200, 0xC100, 0xC000 little-endian.
  const st::TensorInfo* h = f.find("half");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->dtype_str, "F16");
  EXPECT_EQ(h->dtype, st::DType::Other);
  const auto d = f.data(*h);
  const Bytes want{std::byte{0x00}, std::byte{0xC2}, std::byte{0x00}, std::byte{0xC1}, std::byte{0x00}, std::byte{0xC0}};
  EXPECT_EQ(Bytes(d.begin(), d.end()), want);
}

// ---------------------------------------------------------------- fuzz seeds

// Every committed seed (and every crash input added later) must parse or
// throw CheckpointError. With SEGTAPE_WRITE_FUZZ_CORPUS=<dir> this test
// (re)writes the seeds there first: valid files plus the corrupt catalog.
TEST(SafetensorsFuzzCorpus, SeedsParseOrThrowCheckpointError) {
  const fs::path corpus = fs::path(SEGTAPE_SOURCE_DIR) / "tests" / "fuzz" / "corpus";
  if (const char* out = std::getenv("SEGTAPE_WRITE_FUZZ_CORPUS")) {
    const fs::path o(out);
    fs::create_directories(o);
    auto write = [&](const std::string& name, const Bytes& b) {
      std::ofstream(o / name, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    };
    const std::vector<float> two{1.5f, -2};
    const std::vector<std::int64_t> three{1, 2, 3};
    const std::vector<st::TensorRef> pair{{"bias", st::DType::I64, {3}, as_bytes(three)},
                                          {"weight", st::DType::F32, {2, 1}, as_bytes(two)}};
    write("valid-two-tensors", st::serialize(pair, {}));
    write("valid-metadata", st::serialize(pair, {{"format", "pt"}, {"step", "3"}}));
    const InteropTensors t;
    const auto refs = t.refs();
    write("valid-all-dtypes-scalar-empty", st::serialize(refs, t.metadata));
    for (const Corrupt& c : catalog()) {
      const Bytes b = c.make();
      if (b.size() < 1024) write("corrupt-" + c.name, b);
    }
  }
  ASSERT_TRUE(fs::is_directory(corpus)) << corpus;
  int files = 0;
  for (const auto& e : fs::directory_iterator(corpus)) {
    ++files;
    try {
      (void)st::load(e.path());
    } catch (const CheckpointError&) {
    }
  }
  EXPECT_GT(files, 3);
}

}  // namespace
