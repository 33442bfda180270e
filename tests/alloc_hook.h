// Counts every heap allocation of the process (operator new and malloc
// family) while enabled: the test hook behind "zero system allocations".
#pragma once
#include <cstdint>

namespace alloc_hook {
void enable(bool on);
uint64_t count();
bool counts_malloc();  // false under sanitizers, where only operator new is counted
}  // namespace alloc_hook
