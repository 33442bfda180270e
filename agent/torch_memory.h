// Live and peak bytes of LibTorch's CPU tensors, counted by an allocator
// installed in front of LibTorch's default one (LibTorch's CPU allocator keeps
// no statistics of its own). Used by the retention lab and the benchmarks;
// include only from translation units that link LibTorch.
#pragma once
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdint>

namespace segtape::torch_memory {

class CountingAllocator final : public c10::Allocator {
 public:
  // The size is kept in a 64-byte header in front of the data, so counting
  // adds no heap allocation of its own and keeps LibTorch's 64-byte alignment.
  static constexpr size_t kHeader = 64;

  c10::DataPtr allocate(size_t n) const override {
    void* raw = base_->raw_allocate(n + kHeader);
    *static_cast<size_t*>(raw) = n;
    auto& s = stats();
    const int64_t live = s.live.fetch_add(int64_t(n)) + int64_t(n);
    int64_t peak = s.peak.load();
    while (live > peak && !s.peak.compare_exchange_weak(peak, live)) {
    }
    s.allocations.fetch_add(1);
    return {static_cast<char*>(raw) + kHeader, raw, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  struct Stats {
    std::atomic<int64_t> live{0}, peak{0}, allocations{0};
  };
  static Stats& stats() {
    static Stats s;
    return s;
  }
  static void reset_peak() { stats().peak.store(stats().live.load()); }

 private:
  static void release(void* raw) {
    stats().live.fetch_sub(int64_t(*static_cast<size_t*>(raw)));
    instance()->base_->raw_deallocate(raw);
  }
  friend CountingAllocator& install();
  static CountingAllocator*& instance() {
    static CountingAllocator* p = nullptr;
    return p;
  }
  c10::Allocator* base_ = c10::GetDefaultCPUAllocator();
};

// Installs the counting allocator once (LibTorch takes ownership); returns it.
inline CountingAllocator& install() {
  static CountingAllocator* a = [] {
    auto* c = new CountingAllocator;
    CountingAllocator::instance() = c;
    c10::SetCPUAllocator(c, /*priority=*/100);
    return c;
  }();
  return *a;
}

}  // namespace segtape::torch_memory
