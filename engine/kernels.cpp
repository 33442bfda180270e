// segtape/kernels.h: the process-wide kernel switches. Each is one relaxed
// atomic, read where its choice is made (cpu/blas.cpp, cpu/packed.cpp,
// cuda/gru_sequence.cpp).
#include "segtape/kernels.h"

#include <atomic>

#include "segtape/error.h"

namespace segtape::kernels {
namespace {

std::atomic<Gemv> g_gemv{Gemv::Auto};
std::atomic<Packed> g_packed{Packed::Best};
std::atomic<bool> g_fused_gru{true};
std::atomic<bool> g_fused_gru_grid{false};

const char* text(Gemv g) {
  switch (g) {
    case Gemv::Auto: return "auto";
    case Gemv::On: return "on";
    case Gemv::Off: return "off";
  }
  return "?";
}
const char* text(Packed p) {
  switch (p) {
    case Packed::Best: return "best";
    case Packed::Avx2: return "avx2";
    case Packed::Off: return "off";
  }
  return "?";
}

[[noreturn]] void refuse(std::string_view name, std::string_view value, const char* accepted) {
  throw Error("kernel option " + std::string(name) + " = '" + std::string(value) + "': expected " + accepted);
}

bool on_off(std::string_view name, std::string_view value) {
  if (value == "on") return true;
  if (value == "off") return false;
  refuse(name, value, "on or off");
}

}  // namespace

Options options() {
  return {g_gemv.load(std::memory_order_relaxed), g_packed.load(std::memory_order_relaxed),
          g_fused_gru.load(std::memory_order_relaxed), g_fused_gru_grid.load(std::memory_order_relaxed)};
}

void set_options(const Options& o) {
  g_gemv.store(o.gemv, std::memory_order_relaxed);
  g_packed.store(o.packed, std::memory_order_relaxed);
  g_fused_gru.store(o.fused_gru, std::memory_order_relaxed);
  g_fused_gru_grid.store(o.fused_gru_grid, std::memory_order_relaxed);
}

void set_option(std::string_view name, std::string_view value) {
  Options o = options();
  if (name == "gemv") {
    if (value == "auto") o.gemv = Gemv::Auto;
    else if (value == "on") o.gemv = Gemv::On;
    else if (value == "off") o.gemv = Gemv::Off;
    else refuse(name, value, "auto, on or off");
  } else if (name == "packed") {
    if (value == "best") o.packed = Packed::Best;
    else if (value == "avx2") o.packed = Packed::Avx2;
    else if (value == "off") o.packed = Packed::Off;
    else refuse(name, value, "best, avx2 or off");
  } else if (name == "fused_gru") {
    o.fused_gru = on_off(name, value);
  } else if (name == "fused_gru_grid") {
    o.fused_gru_grid = on_off(name, value);
  } else {
    throw Error("kernel option '" + std::string(name) + "': expected gemv, packed, fused_gru or fused_gru_grid");
  }
  set_options(o);
}

std::string option_text(std::string_view name) {
  const Options o = options();
  if (name == "gemv") return text(o.gemv);
  if (name == "packed") return text(o.packed);
  if (name == "fused_gru") return o.fused_gru ? "on" : "off";
  if (name == "fused_gru_grid") return o.fused_gru_grid ? "on" : "off";
  throw Error("kernel option '" + std::string(name) + "': expected gemv, packed, fused_gru or fused_gru_grid");
}

}  // namespace segtape::kernels
