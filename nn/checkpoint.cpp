#include "segtape/nn/checkpoint.h"

#include <cstring>
#include <set>
#include <string_view>

#include "segtape/nn/safetensors.h"

namespace segtape::nn {
namespace {

namespace st = segtape::safetensors;

st::DType file_dtype(DType d) { return d == DType::F32 ? st::DType::F32 : d == DType::F64 ? st::DType::F64 : st::DType::I64; }

std::vector<int64_t> dims_of(const Tensor& t) { return {t.shape.dims.begin(), t.shape.dims.begin() + t.rank()}; }

// The elements of a host entry's shape; a negative dimension or a product
// past int64 is an error naming the entry (the product overflowed).
int64_t elements_of(const std::string& name, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) {
      std::string m = "nn::entry('" + name + "'): shape [";
      for (size_t i = 0; i < shape.size(); ++i) m += (i ? ", " : "") + std::to_string(shape[i]);
      m += d < 0 ? "] has a negative dimension" : "] has more elements than int64 counts";
      throw Error(m);
    }
  return n;
}

size_t entry_bytes(const Entry& e) {
  if (e.tensor.defined()) return e.tensor.nbytes();
  return size_t(elements_of(e.name, e.shape)) * dtype_size(e.dtype);
}

template <class T>
Entry host_entry(std::string name, std::span<T> values, std::vector<int64_t> shape) {
  const int64_t n = elements_of(name, shape);
  if (n != int64_t(values.size()))
    throw Error("nn::entry('" + name + "'): " + std::to_string(values.size()) + " values for a shape of " +
                std::to_string(n) + " elements");
  return {std::move(name), dtype_of<T>(), std::move(shape), Tensor{}, values.data()};
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}
std::string dtype_str(st::DType d) { return std::string(st::dtype_name(d)); }

// Compares the file with the entries and appends every problem; nothing is written.
void check(const st::File& f, std::span<const Entry> entries, bool strict, std::vector<std::string>& problems,
           LoadReport& report) {
  std::vector<std::string> shape_bad, dtype_bad;
  std::set<std::string_view> expected;
  for (const Entry& e : entries) {
    expected.insert(e.name);
    const st::TensorInfo* t = f.find(e.name);
    if (!t) {
      if (!e.optional) report.missing_keys.push_back(e.name);
      continue;
    }
    if (t->dtype != file_dtype(e.dtype))
      dtype_bad.push_back("wrong dtype: '" + e.name + "' is " + t->dtype_str + " in the file, the model has " +
                          dtype_str(file_dtype(e.dtype)));
    else if (t->shape != e.shape)
      shape_bad.push_back("wrong shape: '" + e.name + "' is " + shape_str(t->shape) + " in the file, the model has " +
                          shape_str(e.shape));
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

[[noreturn]] void fail(const st::File& f, const std::string& what, const std::vector<std::string>& problems) {
  std::string m = f.source + ": cannot load " + what + ": " + std::to_string(problems.size()) +
                  (problems.size() == 1 ? " problem" : " problems") + " (nothing was loaded):";
  for (const std::string& p : problems) m += "\n  " + p;
  throw CheckpointError(m);
}

// Only after check() found nothing: the entries of one kind (host buffers or
// tensors) that the file has are copied.
void copy(const st::File& f, std::span<const Entry> entries, bool tensors) {
  for (const Entry& e : entries)
    if (const st::TensorInfo* t = f.find(e.name); t && e.tensor.defined() == tensors) {
      if (tensors) e.tensor.from_host_bytes(f.data(*t));
      else std::memcpy(e.host, f.data(*t).data(), entry_bytes(e));
    }
}

// The caller's entries themselves, before the file is read: an entry whose
// tensor has expired or disagrees with its dtype and shape, or a host entry
// without its buffer, would otherwise fail in the copy, after earlier
// tensors were written.
void check_entries(const std::filesystem::path& path, std::span<const Entry> entries, const std::string& what) {
  std::set<std::string_view> names;
  for (const Entry& e : entries) {
    auto bad = [&](const std::string& why) {
      std::string m = path.string();
      m += ": cannot load " + what + ": entry '";
      m += e.name + "' " + why + " (nothing was loaded)";
      throw Error(m);
    };
    if (!names.insert(e.name).second) bad("is given twice");
    if (e.tensor.defined()) {
      if (!e.tensor.is_live()) bad("is a tensor that has expired (" + e.tensor.describe() + ")");
      if (e.tensor.dtype != e.dtype || dims_of(e.tensor) != e.shape)
        bad("declares " + dtype_str(file_dtype(e.dtype)) + shape_str(e.shape) + " but its tensor is " + e.tensor.describe());
    } else if (!e.host && entry_bytes(e) > 0) {
      bad("has neither a tensor nor a host buffer");
    }
  }
}

// load_entries, and nn::load's non-strict variant (which reports the names it skipped).
Metadata load_checked(const std::filesystem::path& path, std::span<const Entry> entries, const std::string& what,
                      bool strict, LoadReport& report, const LoadCheck& about_file, const LoadCheck& about_values) {
  check_entries(path, entries, what);
  const st::File f = st::load(path);
  std::vector<std::string> problems;
  if (about_file) about_file(f.metadata, problems);
  // A file of another configuration (another size, rank count, ...) is named
  // as that alone: the tensors it then lacks or holds extra are its consequence.
  if (problems.empty()) check(f, entries, strict, problems, report);
  if (problems.empty()) {
    copy(f, entries, false);
    if (about_values) about_values(f.metadata, problems);
  }
  if (!problems.empty()) fail(f, what, problems);
  copy(f, entries, true);
  return f.metadata;
}

std::vector<Entry> param_entries(const Module& m, const std::string& prefix = "") {
  std::vector<Entry> entries;
  for (auto& [name, p] : m.named_parameters()) entries.push_back(entry(prefix + name, p));
  return entries;
}

std::string optim_prefix(size_t k) { return k == 0 ? "optim" : "optim" + std::to_string(k); }
constexpr std::string_view kReserved = "segtape.";
constexpr const char* kKindKey = "segtape.kind";
constexpr const char* kTrainingState = "training_state";

// The entries of a training state; steps and rng words live in its own buffers.
struct TrainingEntries {
  std::vector<Entry> entries;
  std::vector<int64_t> optim_steps;
  int64_t train_step = 0;
  int64_t rng[2] = {0, 0};

  TrainingEntries(const Module& m, std::span<const Optimizer* const> optimizers) : entries(param_entries(m)) {
    for (size_t k = 0; k < optimizers.size(); ++k)
      if (!optimizers[k]) throw Error("nn training state: optimizer " + std::to_string(k) + " of the list is null");
    optim_steps.resize(optimizers.size());  // before taking pointers into it
    for (size_t k = 0; k < optimizers.size(); ++k) {
      const std::string pre = optim_prefix(k) + ".";
      for (const auto& [name, t] : optimizers[k]->state()) entries.push_back(entry(pre + name, t));
      entries.push_back(entry(pre + "step", std::span<int64_t>(&optim_steps[k], 1), {}));
    }
    entries.push_back(entry("train.step", std::span<int64_t>(&train_step, 1), {}));
    entries.push_back(entry("rng.state", std::span<int64_t>(rng), {2}));
  }
  TrainingEntries(const TrainingEntries&) = delete;  // the entries point into it
  TrainingEntries& operator=(const TrainingEntries&) = delete;
};

std::vector<const Optimizer*> as_const(std::span<Optimizer* const> o) { return {o.begin(), o.end()}; }

}  // namespace

Entry entry(std::string name, const Tensor& t) {
  t.check_live("checkpoint entry");
  return {std::move(name), t.dtype, dims_of(t), t};
}
Entry entry(std::string name, std::span<int64_t> values, std::vector<int64_t> shape) {
  return host_entry(std::move(name), values, std::move(shape));
}
Entry entry(std::string name, std::span<float> values, std::vector<int64_t> shape) {
  return host_entry(std::move(name), values, std::move(shape));
}
Entry entry(std::string name, Rng& rng) {
  // (int64_t and uint64_t may alias: the words are stored bit for bit)
  return host_entry(std::move(name), std::span<int64_t>(reinterpret_cast<int64_t*>(rng.words()), 2), {2});
}

void save_entries(const std::filesystem::path& path, std::span<const Entry> entries, const Metadata& metadata) {
  std::vector<st::TensorRef> refs;
  std::vector<std::vector<std::byte>> staged(entries.size());  // a device's tensors' bytes, copied to the host
  refs.reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    std::span<const std::byte> bytes(static_cast<const std::byte*>(e.host), entry_bytes(e));
    if (e.tensor.defined() && e.tensor.tape->device().kind == Device::Kind::CPU) {
      e.tensor.check_live("save_entries");
      bytes = {static_cast<const std::byte*>(e.tensor.ptr), e.tensor.nbytes()};  // (the host's own bytes: no copy)
    } else if (e.tensor.defined()) {  // a device's, copied to the host
      staged[i].resize(bytes.size());
      e.tensor.to_host_bytes(staged[i]);
      bytes = staged[i];
    }
    refs.push_back({e.name, file_dtype(e.dtype), e.shape, bytes});
  }
  st::save_atomic(path, refs, metadata);
}

Metadata load_entries(const std::filesystem::path& path, std::span<const Entry> entries, const std::string& what,
                      const LoadCheck& about_file, const LoadCheck& about_values) {
  LoadReport report;
  return load_checked(path, entries, what, true, report, about_file, about_values);
}

namespace {
// The caller's metadata for a file save() or save_training_state() writes:
// keys starting with "segtape." are segtape's own (a training state's kind
// and optimizers; load_training_state drops them from what it returns).
const Metadata& callers_metadata(const std::filesystem::path& path, const Metadata& metadata) {
  for (const auto& [k, v] : metadata)
    if (std::string_view(k).starts_with(kReserved))
      throw CheckpointError(path.string() + ": metadata key '" + k + "' is reserved (keys starting with 'segtape.' are segtape's own)");
  return metadata;
}
}  // namespace

void save(const Module& m, const std::filesystem::path& path, const Metadata& metadata) {
  save_entries(path, param_entries(m), callers_metadata(path, metadata));
}

LoadReport load(Module& m, const std::filesystem::path& path, bool strict, const std::string& prefix) {
  LoadReport report;
  report.metadata = load_checked(path, param_entries(m, prefix), "the module's parameters", strict, report, {}, {});
  return report;
}

void save_training_state(const std::filesystem::path& path, const Module& m,
                         std::span<const Optimizer* const> optimizers, const Rng& rng, int64_t step,
                         const Metadata& metadata) {
  Metadata meta = callers_metadata(path, metadata);
  if (step < 0) throw CheckpointError(path.string() + ": the training step must be >= 0, got " + std::to_string(step));
  meta[kKindKey] = kTrainingState;
  TrainingEntries te(m, optimizers);
  for (size_t k = 0; k < optimizers.size(); ++k) {
    meta["segtape." + optim_prefix(k) + ".kind"] = optimizers[k]->kind();
    te.optim_steps[k] = optimizers[k]->step_count();
  }
  te.train_step = step;
  const Rng::State s = rng.state();
  // The u64 state words stored bit for bit in I64 (safetensors has U64, but
  // I64 is what every reader handles).
  std::memcpy(&te.rng[0], &s.seed, 8);
  std::memcpy(&te.rng[1], &s.counter, 8);
  save_entries(path, te.entries, meta);
}

void save_training_state(const std::filesystem::path& path, const Module& m, const Optimizer& optimizer,
                         const Rng& rng, int64_t step, const Metadata& metadata) {
  const Optimizer* o = &optimizer;
  save_training_state(path, m, std::span<const Optimizer* const>(&o, 1), rng, step, metadata);
}

TrainingState load_training_state(const std::filesystem::path& path, Module& m, std::span<Optimizer* const> optimizers,
                                  Rng& rng) {
  TrainingEntries te(m, as_const(optimizers));
  const auto about_file = [&](const Metadata& metadata, std::vector<std::string>& problems) {
    auto meta = [&](const std::string& key) {
      auto it = metadata.find(key);
      return it == metadata.end() ? std::string("(none)") : it->second;
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
  };
  // Step counters are validated before any tensor is copied.
  const auto about_values = [&](const Metadata&, std::vector<std::string>& problems) {
    for (size_t k = 0; k < optimizers.size(); ++k)
      if (te.optim_steps[k] < 0 || te.optim_steps[k] > Optimizer::kMaxSteps)
        problems.push_back("'" + optim_prefix(k) + ".step' is " + std::to_string(te.optim_steps[k]) +
                           ", outside [0, 2^53] (an optimizer's step count)");
  };
  const Metadata metadata = load_entries(path, te.entries, "the training state", about_file, about_values);
  for (size_t k = 0; k < optimizers.size(); ++k) optimizers[k]->set_step_count(te.optim_steps[k]);
  Rng::State s;
  std::memcpy(&s.seed, &te.rng[0], 8);
  std::memcpy(&s.counter, &te.rng[1], 8);
  rng.set_state(s);
  TrainingState out;
  out.step = te.train_step;
  for (const auto& [k, v] : metadata)
    if (!std::string_view(k).starts_with(kReserved)) out.metadata[k] = v;
  return out;
}

TrainingState load_training_state(const std::filesystem::path& path, Module& m, Optimizer& optimizer, Rng& rng) {
  Optimizer* o = &optimizer;
  return load_training_state(path, m, std::span<Optimizer* const>(&o, 1), rng);
}

}  // namespace segtape::nn
