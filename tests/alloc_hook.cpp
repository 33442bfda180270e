#include "alloc_hook.h"

#include <atomic>
#include <cstdlib>
#include <new>

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer)
#define SEGTAPE_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define SEGTAPE_SANITIZED 1
#endif

namespace {
std::atomic<bool> g_on{false};
std::atomic<uint64_t> g_count{0};
inline void note() {
  if (g_on.load(std::memory_order_relaxed)) g_count.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

namespace alloc_hook {
void enable(bool on) { g_on.store(on); }
uint64_t count() { return g_count.load(); }
#ifdef SEGTAPE_SANITIZED
bool counts_malloc() { return false; }
#else
bool counts_malloc() { return true; }
#endif
}  // namespace alloc_hook

#ifndef SEGTAPE_SANITIZED
// glibc lets a program interpose the malloc family; forward to glibc's own.
extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
void __libc_free(void*);

void* malloc(size_t n) {
  note();
  return __libc_malloc(n);
}
void* calloc(size_t n, size_t s) {
  note();
  return __libc_calloc(n, s);
}
void* realloc(void* p, size_t n) {
  note();
  return __libc_realloc(p, n);
}
void free(void* p) { __libc_free(p); }
void* memalign(size_t a, size_t n) {
  note();
  return __libc_memalign(a, n);
}
void* aligned_alloc(size_t a, size_t n) {
  note();
  return __libc_memalign(a, n);
}
int posix_memalign(void** out, size_t a, size_t n) {
  note();
  *out = __libc_memalign(a, n);
  return *out ? 0 : 12;  // ENOMEM
}
}
void* operator new(size_t n) {
  if (void* p = malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
#else
void* operator new(size_t n) {
  note();
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
#endif
void* operator new[](size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
