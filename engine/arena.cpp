#include "segtape/arena.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <cstdlib>
#include <new>
#include <string>

#include "segtape/error.h"

namespace segtape {

namespace memory {
namespace {
std::atomic<uint64_t> g_system_allocations{0};
std::atomic<uint64_t> g_device_allocations{0};
}  // namespace
uint64_t system_allocations() { return g_system_allocations.load(std::memory_order_relaxed); }
uint64_t device_allocations() { return g_device_allocations.load(std::memory_order_relaxed); }
}  // namespace memory

namespace {
[[noreturn]] void no_memory_for_chunk(size_t bytes, const char* what) {
  throw OutOfMemoryError("out of memory: could not reserve an arena chunk of " + std::to_string(bytes) + " bytes (" + what + ")",
                         what);
}
}  // namespace

std::byte* Arena::take_chunk(size_t cap) {
  const size_t n = align_up(cap ? cap : kAlign);
  void* p = nullptr;
  if (alloc_.take) {
    p = alloc_.take(alloc_.ctx, n, alloc_.what);  // throws with the device's own message
  } else {
    p = std::aligned_alloc(kAlign, n);
    if (!p) no_memory_for_chunk(cap, alloc_.what);
  }
  memory::g_system_allocations.fetch_add(1, std::memory_order_relaxed);
  if (alloc_.device) memory::g_device_allocations.fetch_add(1, std::memory_order_relaxed);
  return static_cast<std::byte*>(p);
}

namespace {
// Above this no request can be met, and align_up would wrap to 0 near 2^64
// (a budget of 2^64 - 1 became an arena of 0 bytes).
constexpr size_t kLargest = std::numeric_limits<size_t>::max() / 2;
}  // namespace

Arena::Arena(size_t capacity, bool grow, size_t grow_limit, ChunkAllocator alloc)
    : first_capacity_(align_up(std::min(capacity, kLargest))), grow_(grow), grow_limit_(grow_limit), alloc_(alloc) {
  if (capacity > kLargest) no_memory_for_chunk(capacity, alloc.what);
  chunks_.reserve(64);
  if (first_capacity_) chunks_.push_back({take_chunk(first_capacity_), first_capacity_});
}

Arena::~Arena() {
  for (auto& c : chunks_) {
    if (alloc_.give) alloc_.give(alloc_.ctx, c.base);
    else std::free(c.base);
  }
}

void* Arena::try_alloc(size_t bytes) {
  if (bytes > kLargest) return nullptr;
  const size_t n = align_up(bytes);
  if (grow_ && grow_limit_ && used_ + outside_ + n > grow_limit_) return nullptr;
  if (!grow_ && used_ + outside_ + n > first_capacity_) return nullptr;
  // Fit in the current chunk, else move to a later chunk that is big enough.
  while (cur_ < chunks_.size()) {
    Chunk& c = chunks_[cur_];
    if (off_ + n <= c.cap) {
      std::byte* p = c.base + off_;
      off_ += n;
      used_ += n;
      if (used_ > peak_) peak_ = used_;
      return p;
    }
    if (!grow_) return nullptr;
    ++cur_;
    off_ = 0;
  }
  if (!grow_) return nullptr;
  const size_t cap = n > first_capacity_ ? n : first_capacity_;
  chunks_.push_back({take_chunk(cap), cap});
  cur_ = chunks_.size() - 1;
  off_ = n;
  used_ += n;
  if (used_ > peak_) peak_ = used_;
  return chunks_.back().base;
}

void Arena::reset() {
  cur_ = 0;
  off_ = 0;
  used_ = 0;
}

size_t Arena::reserved() const {
  size_t r = 0;
  for (auto& c : chunks_) r += c.cap;
  return r;
}

}  // namespace segtape
