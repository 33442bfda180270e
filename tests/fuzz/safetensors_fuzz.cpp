// libFuzzer target for the safetensors parser. Build (from the repository root):
//   clang++-14 -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined \
//     -Iengine/include -Inn/include tests/fuzz/safetensors_fuzz.cpp nn/safetensors.cpp -o /tmp/st_fuzz
//   /tmp/st_fuzz -max_total_time=120 /tmp/st_fuzz_work tests/fuzz/corpus
// (new inputs go to the first, scratch directory; tests/fuzz/corpus holds the
// committed seeds.) Only CheckpointError may escape parse(); anything else,
// and any out-of-bounds read (ASan), is a bug.
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <vector>

#include "segtape/nn/safetensors.h"

namespace st = segtape::safetensors;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::byte> bytes(size);
  for (std::size_t i = 0; i < size; ++i) bytes[i] = static_cast<std::byte>(data[i]);
  st::File f;
  try {
    f = st::parse(std::move(bytes), "<fuzz>");
  } catch (const segtape::CheckpointError&) {
    return 0;
  }

  // Touch every byte of every tensor so an over-read shows under ASan.
  unsigned sum = 0;
  bool all_known = true;
  for (const st::TensorInfo& t : f.tensors) {
    for (std::byte b : f.data(t)) sum += static_cast<unsigned>(b);
    if (f.find(t.name) == nullptr) std::abort();
    all_known = all_known && t.dtype != st::DType::Other;
  }
  volatile unsigned sink = sum;
  (void)sink;

  // Round trip: a valid file of writable dtypes re-serializes into a file that
  // parses to the same tensors and metadata.
  if (!all_known) return 0;
  std::vector<st::TensorRef> refs;
  for (const st::TensorInfo& t : f.tensors) refs.push_back({t.name, t.dtype, t.shape, f.data(t)});
  const st::File g = st::parse(st::serialize(refs, f.metadata));
  if (g.metadata != f.metadata || g.tensors.size() != f.tensors.size()) std::abort();
  for (const st::TensorInfo& t : f.tensors) {
    const st::TensorInfo* u = g.find(t.name);
    if (!u || u->dtype != t.dtype || u->shape != t.shape) std::abort();
    const auto a = f.data(t), b = g.data(*u);
    if (a.size() != b.size() || !std::equal(a.begin(), a.end(), b.begin())) std::abort();
  }
  return 0;
}
