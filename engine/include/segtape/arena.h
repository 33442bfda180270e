// Arena: bump allocation into fixed chunks, 64-byte aligned, O(1) reset.
// Strict arenas have one chunk (the budget) and refuse to grow; growing arenas
// (the teaching policy, the persistent pool, carry buffers) add chunks when
// full and keep them across resets, so after warm-up they allocate nothing.
// Where chunks come from is pluggable (ChunkAllocator): host memory by
// default, device memory for the arenas of a CUDA tape (one chunk each).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace segtape {

namespace memory {
// Every chunk any segtape arena takes from the system bumps this counter
// (host and device chunks alike).
uint64_t system_allocations();
// Chunks taken from a device allocator (cudaMalloc), a subset of the above.
// A CUDA tape takes all of its chunks when it is made: this stays constant
// while it trains.
uint64_t device_allocations();
}  // namespace memory

// Where an arena's chunks come from. Default (take == nullptr): host memory
// (aligned_alloc). A device backend passes functions that reserve device
// memory; take throws a segtape::Error naming `what` when it cannot.
struct ChunkAllocator {
  void* (*take)(void* ctx, size_t bytes, const char* what) = nullptr;
  void (*give)(void* ctx, void* p) = nullptr;
  void* ctx = nullptr;
  const char* what = "arena chunk";  // for messages: which pool asked
  bool device = false;               // counts in memory::device_allocations()
};

inline constexpr size_t kAlign = 64;
constexpr size_t align_up(size_t n) { return (n + kAlign - 1) & ~(kAlign - 1); }

class Arena {
 public:
  // capacity: size of the first chunk (the budget when !grow).
  // grow: add chunks of max(chunk, request) when full.
  // grow_limit: with grow, refuse once used() would exceed it (0 = no limit).
  // alloc: where chunks come from (host memory by default).
  Arena(size_t capacity, bool grow, size_t grow_limit = 0, ChunkAllocator alloc = {});
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // nullptr when the request does not fit (strict) or passes grow_limit,
  // counting the bytes held outside the arena against the budget too.
  void* try_alloc(size_t bytes);
  // Bytes held outside the arena that count against its budget (the tape's
  // nodes): a request fits only when used() + outside() + request <= budget().
  void set_outside(size_t bytes) { outside_ = bytes; }
  size_t outside() const { return outside_; }
  void reset();  // O(1) in the bytes handed out; keeps every chunk
  size_t used() const { return used_; }    // bytes handed out since reset (aligned sizes)
  size_t peak() const { return peak_; }    // high-water since construction or reset_peak()
  void reset_peak() { peak_ = used_; }
  size_t reserved() const;                 // bytes held from the system
  const char* what() const { return alloc_.what; }  // the pool's name (ChunkAllocator::what)
  size_t budget() const { return grow_ ? grow_limit_ : first_capacity_; }
  bool grows() const { return grow_; }
  bool on_device() const { return alloc_.device; }

 private:
  struct Chunk {
    std::byte* base;
    size_t cap;
  };
  std::byte* take_chunk(size_t cap);
  std::vector<Chunk> chunks_;
  size_t cur_ = 0;     // current chunk
  size_t off_ = 0;     // offset in current chunk
  size_t used_ = 0;
  size_t peak_ = 0;
  size_t outside_ = 0;
  size_t first_capacity_;
  bool grow_;
  size_t grow_limit_;
  ChunkAllocator alloc_;
};

}  // namespace segtape
