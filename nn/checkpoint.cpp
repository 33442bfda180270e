#include "segtape/nn/checkpoint.h"

#include <cstring>
#include <set>
#include <string_view>

#include "segtape/nn/safetensors.h"

namespace segtape::nn {
namespace {

namespace st = segtape::safetensors;

// One named tensor of a checkpoint: where its bytes come from (save) or go
// to (load), with the dtype and shape the model expects. Either a tensor
// (copied through to_host_bytes / from_host_bytes, so it may live on a
// device) or a host buffer of the caller's (step counters, rng state).
struct Slot {
  std::string name;
  st::DType dtype;
  std::vector<int64_t> shape;
  Tensor tensor;
  void* host = nullptr;
  size_t bytes = 0;
};

Slot tensor_slot(std::string name, const Tensor& t) {
  const st::DType d = t.dtype == DType::F32 ? st::DType::F32 : t.dtype == DType::F64 ? st::DType::F64 : st::DType::I64;
  return {std::move(name), d, std::vector<int64_t>(t.shape.dims.begin(), t.shape.dims.begin() + t.rank()), t, nullptr,
          t.nbytes()};
}
Slot i64_slot(std::string name, int64_t* v, std::vector<int64_t> shape, size_t n) {
  return {std::move(name), st::DType::I64, std::move(shape), Tensor{}, v, n * sizeof(int64_t)};
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}
std::string dtype_str(st::DType d) { return std::string(st::dtype_name(d)); }

void write(const std::filesystem::path& path, const std::vector<Slot>& slots, const Metadata& metadata) {
  std::vector<st::TensorRef> refs;
  std::vector<std::vector<std::byte>> staged(slots.size());  // the tensors' bytes, copied to the host
  refs.reserve(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    const Slot& s = slots[i];
    std::span<const std::byte> bytes(static_cast<const std::byte*>(s.host), s.bytes);
    if (s.tensor.defined()) {
      staged[i].resize(s.bytes);
      s.tensor.to_host_bytes(staged[i]);
      bytes = staged[i];
    }
    refs.push_back({s.name, s.dtype, s.shape, bytes});
  }
  st::save_atomic(path, refs, metadata);
}

// Compares the file with the slots and appends every problem; nothing is written.
void check(const st::File& f, const std::vector<Slot>& slots, bool strict, std::vector<std::string>& problems,
           LoadReport& report) {
  std::vector<std::string> shape_bad, dtype_bad;
  std::set<std::string_view> expected;
  for (const Slot& s : slots) {
    expected.insert(s.name);
    const st::TensorInfo* t = f.find(s.name);
    if (!t) {
      report.missing_keys.push_back(s.name);
      continue;
    }
    if (t->dtype != s.dtype)
      dtype_bad.push_back("wrong dtype: '" + s.name + "' is " + t->dtype_str + " in the file, the model has " +
                          dtype_str(s.dtype));
    else if (t->shape != s.shape)
      shape_bad.push_back("wrong shape: '" + s.name + "' is " + shape_str(t->shape) + " in the file, the model has " +
                          shape_str(s.shape));
  }
  for (const st::TensorInfo& t : f.tensors)
    if (!expected.contains(t.name)) report.unexpected_keys.push_back(t.name);
  if (strict) {
    for (const std::string& n : report.missing_keys) problems.push_back("missing: '" + n + "' is not in the file");
    for (const std::string& n : report.unexpected_keys)
      problems.push_back("unexpected: '" + n + "' is in the file but not in the model");
  }
  problems.insert(problems.end(), shape_bad.begin(), shape_bad.end());
  problems.insert(problems.end(), dtype_bad.begin(), dtype_bad.end());
}

[[noreturn]] void fail(const st::File& f, const char* what, const std::vector<std::string>& problems) {
  std::string m = f.source + ": cannot load " + what + ": " + std::to_string(problems.size()) +
                  (problems.size() == 1 ? " problem" : " problems") + " (nothing was loaded):";
  for (const std::string& p : problems) m += "\n  " + p;
  throw CheckpointError(m);
}

// Only after check() found nothing: every slot the file has is copied.
void copy(const st::File& f, const std::vector<Slot>& slots) {
  for (const Slot& s : slots)
    if (const st::TensorInfo* t = f.find(s.name)) {
      if (s.tensor.defined()) s.tensor.from_host_bytes(f.data(*t));
      else std::memcpy(s.host, f.data(*t).data(), s.bytes);
    }
}

std::vector<Slot> param_slots(const Module& m) {
  std::vector<Slot> slots;
  for (auto& [name, p] : m.named_parameters()) slots.push_back(tensor_slot(name, p));
  return slots;
}

std::string optim_prefix(size_t k) { return k == 0 ? "optim" : "optim" + std::to_string(k); }
constexpr std::string_view kReserved = "segtape.";
constexpr const char* kKindKey = "segtape.kind";
constexpr const char* kTrainingState = "training_state";

// The slots of a training state; steps and rng values live in the caller's buffers.
struct TrainingSlots {
  std::vector<Slot> slots;
  std::vector<int64_t> optim_steps;
  int64_t train_step = 0;
  int64_t rng[2] = {0, 0};

  TrainingSlots(const Module& m, std::span<const Optimizer* const> optimizers) : slots(param_slots(m)) {
    optim_steps.resize(optimizers.size());  // before taking pointers into it
    for (size_t k = 0; k < optimizers.size(); ++k) {
      const std::string pre = optim_prefix(k) + ".";
      for (const auto& [name, t] : optimizers[k]->state()) slots.push_back(tensor_slot(pre + name, t));
      slots.push_back(i64_slot(pre + "step", &optim_steps[k], {}, 1));
    }
    slots.push_back(i64_slot("train.step", &train_step, {}, 1));
    slots.push_back(i64_slot("rng.state", rng, {2}, 2));
  }
};

std::vector<const Optimizer*> as_const(std::span<Optimizer* const> o) { return {o.begin(), o.end()}; }

}  // namespace

void save(const Module& m, const std::filesystem::path& path, const Metadata& metadata) {
  write(path, param_slots(m), metadata);
}

LoadReport load(Module& m, const std::filesystem::path& path, bool strict) {
  const st::File f = st::load(path);
  const std::vector<Slot> slots = param_slots(m);
  LoadReport report;
  std::vector<std::string> problems;
  check(f, slots, strict, problems, report);
  if (!problems.empty()) fail(f, "the module's parameters", problems);
  copy(f, slots);
  report.metadata = f.metadata;
  return report;
}

void save_training_state(const std::filesystem::path& path, const Module& m,
                         std::span<const Optimizer* const> optimizers, const Rng& rng, int64_t step,
                         const Metadata& metadata) {
  Metadata meta;
  for (const auto& [k, v] : metadata) {
    if (std::string_view(k).starts_with(kReserved))
      throw CheckpointError(path.string() + ": metadata key '" + k + "' is reserved (keys starting with 'segtape.' are segtape's own)");
    meta[k] = v;
  }
  meta[kKindKey] = kTrainingState;
  TrainingSlots ts(m, optimizers);
  for (size_t k = 0; k < optimizers.size(); ++k) {
    meta["segtape." + optim_prefix(k) + ".kind"] = optimizers[k]->kind();
    ts.optim_steps[k] = optimizers[k]->step_count();
  }
  ts.train_step = step;
  const Rng::State s = rng.state();
  // The u64 state words stored bit for bit in I64 (safetensors has U64, but
  // I64 is what every reader handles).
  std::memcpy(&ts.rng[0], &s.seed, 8);
  std::memcpy(&ts.rng[1], &s.counter, 8);
  write(path, ts.slots, meta);
}

void save_training_state(const std::filesystem::path& path, const Module& m, const Optimizer& optimizer,
                         const Rng& rng, int64_t step, const Metadata& metadata) {
  const Optimizer* o = &optimizer;
  save_training_state(path, m, std::span<const Optimizer* const>(&o, 1), rng, step, metadata);
}

TrainingState load_training_state(const std::filesystem::path& path, Module& m, std::span<Optimizer* const> optimizers,
                                  Rng& rng) {
  const st::File f = st::load(path);
  std::vector<std::string> problems;
  auto meta = [&](const std::string& key) {
    auto it = f.metadata.find(key);
    return it == f.metadata.end() ? std::string("(none)") : it->second;
  };
  if (meta(kKindKey) != kTrainingState)
    problems.push_back("not a training state: metadata '" + std::string(kKindKey) + "' is '" + meta(kKindKey) +
                       "', expected '" + kTrainingState + "' (a plain module checkpoint loads with nn::load)");
  for (size_t k = 0; k < optimizers.size(); ++k) {
    const std::string key = "segtape." + optim_prefix(k) + ".kind";
    if (meta(key) != optimizers[k]->kind())
      problems.push_back("optimizer " + std::to_string(k) + " is " + optimizers[k]->kind() + " but the file's '" +
                         optim_prefix(k) + "' state is from " + meta(key));
  }
  TrainingSlots ts(m, as_const(optimizers));
  LoadReport report;
  check(f, ts.slots, true, problems, report);
  if (problems.empty()) {
    // Step counters are validated before anything is copied.
    for (size_t k = 0; k < optimizers.size(); ++k) {
      const int64_t n = f.values<int64_t>(optim_prefix(k) + ".step")[0];
      if (n < 0) problems.push_back("'" + optim_prefix(k) + ".step' is negative (" + std::to_string(n) + ")");
    }
  }
  if (!problems.empty()) fail(f, "the training state", problems);
  copy(f, ts.slots);
  for (size_t k = 0; k < optimizers.size(); ++k) optimizers[k]->set_step_count(ts.optim_steps[k]);
  Rng::State s;
  std::memcpy(&s.seed, &ts.rng[0], 8);
  std::memcpy(&s.counter, &ts.rng[1], 8);
  rng.set_state(s);
  TrainingState out;
  out.step = ts.train_step;
  for (const auto& [k, v] : f.metadata)
    if (!std::string_view(k).starts_with(kReserved)) out.metadata[k] = v;
  return out;
}

TrainingState load_training_state(const std::filesystem::path& path, Module& m, Optimizer& optimizer, Rng& rng) {
  Optimizer* o = &optimizer;
  return load_training_state(path, m, std::span<Optimizer* const>(&o, 1), rng);
}

}  // namespace segtape::nn
