// Envs: the base class's state, the registry, make_env and its shards, and
// plug-ins. The built-in envs are in task/, one file each.
#include "segtape/agent/env.h"

#include <dlfcn.h>

#include <algorithm>
#include <map>
#include <cctype>
#include <mutex>

#include "task/task.h"

namespace segtape::agent {

void Env::targets(std::span<int64_t> y) const { std::fill(y.begin(), y.end(), kNoTarget); }

void Env::target_values(std::span<float>) const {
  throw Error("env '" + spec().name + "' has no real-valued targets (target_values); a regression algorithm needs an env that gives them, "
              "as --task series does");
}

bool Env::truncations(std::span<uint8_t> truncated, std::span<int64_t>, std::span<float>) const {
  std::fill(truncated.begin(), truncated.end(), uint8_t(0));
  return false;
}

std::vector<int64_t> Env::save_state() const {
  auto& ints = const_cast<Env*>(this)->state_ints();
  const auto rs = rng_.state();
  std::vector<int64_t> s = {int64_t(rs.seed), int64_t(rs.counter), score_num_, score_den_};
  s.insert(s.end(), ints.begin(), ints.end());
  return s;
}

void Env::load_state(std::span<const int64_t> s) {
  auto& ints = state_ints();
  if (s.size() != ints.size() + 4)
    throw Error("env '" + spec().name + "': saved state has " + std::to_string(s.size()) + " integers, expected " +
                std::to_string(ints.size() + 4) + " (a checkpoint of another configuration?)");
  if (s[2] < 0 || s[3] < s[2] || !valid_state(s.subspan(4)))
    throw Error("env '" + spec().name + "': saved state is out of range for this configuration (a damaged checkpoint?)");
  rng_.set_state({uint64_t(s[0]), uint64_t(s[1])});
  score_num_ = s[2], score_den_ = s[3];
  std::copy(s.begin() + 4, s.end(), ints.begin());
}

namespace {

// ---- The registry

// Read and written under `lock`: Python registers envs at any time (each
// segtape.gym.train does), also while a thread that released the GIL makes
// one (segtape.retention.run): a push_back then moved the vectors under it.
struct Registry {
  std::vector<std::string> names;  // in registration order
  std::vector<EnvFactory> factories;
  std::mutex lock;
};

void add(Registry& r, const std::string& name, EnvFactory f) {
  if (name.empty()) throw Error("register_env: the env name is empty");
  for (const char ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_' && ch != '.')
      throw Error("register_env: env name '" + name + "' has a character other than letters, digits, '-', '_' and '.'");
  if (std::find(r.names.begin(), r.names.end(), name) != r.names.end())
    throw Error("register_env: an env named '" + name + "' is already registered; choose another name");
  if (!f) throw Error("register_env: the factory of env '" + name + "' is empty");
  r.names.push_back(name);
  r.factories.push_back(std::move(f));
}

Registry& registry() {
  static Registry r;
  static const bool builtins = [] {  // (once, thread-safe: a static's initialisation)
#define SEGTAPE_ADD(N, F) add(r, N, F);
    SEGTAPE_TASKS(SEGTAPE_ADD)
#undef SEGTAPE_ADD
    return true;
  }();
  (void)builtins;
  return r;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& n : v) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace

void register_env(const std::string& name, EnvFactory factory) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> hold(r.lock);
  add(r, name, std::move(factory));
}

std::vector<std::string> env_names() {
  Registry& r = registry();
  const std::lock_guard<std::mutex> hold(r.lock);
  return r.names;
}

bool env_registered(const std::string& name) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> hold(r.lock);
  return std::find(r.names.begin(), r.names.end(), name) != r.names.end();
}

std::unique_ptr<Env> make_env(const std::string& name, int64_t batch, uint64_t seed, const EnvOptions& o) {
  if (batch < 1) throw Error("env: batch must be >= 1, got " + std::to_string(batch));
  EnvFactory make;  // a copy, called with the registry unlocked (a factory may register envs)
  {
    Registry& r = registry();
    const std::lock_guard<std::mutex> hold(r.lock);
    const auto it = std::find(r.names.begin(), r.names.end(), name);
    if (it == r.names.end())
      throw Error("unknown env '" + name + "' (registered: " + joined(r.names) +
                  "; an env of your own: register_env, or `segtape train --env-plugin FILE`)");
    make = r.factories[size_t(it - r.names.begin())];
  }
  return checked_env(name, batch, [&] { return make(batch, seed, o); });
}

namespace {

// make_env_shards' env: the shards side by side, stream ranges in order.
class ShardedEnv final : public Env {
 public:
  ShardedEnv(std::vector<std::unique_ptr<Env>> shards, int64_t batch) : Env(batch, 0), shards_(std::move(shards)) {
    per_ = batch / int64_t(shards_.size());
    dim_ = shards_[0]->spec().obs_dim;
  }
  const EnvSpec& spec() const override { return shards_[0]->spec(); }
  void observe(std::span<int64_t> tokens, std::span<float> vectors) const override {
    for (size_t i = 0; i < shards_.size(); ++i)
      shards_[i]->observe(part(tokens, i, 1), dim_ > 0 ? part(vectors, i, dim_) : std::span<float>());
  }
  void targets(std::span<int64_t> y) const override {
    for (size_t i = 0; i < shards_.size(); ++i) shards_[i]->targets(part(y, i, 1));
  }
  void target_values(std::span<float> y) const override {
    for (size_t i = 0; i < shards_.size(); ++i) shards_[i]->target_values(part(y, i, 1));
  }
  void step(std::span<const int64_t> actions, std::span<float> reward, std::span<uint8_t> done) override {
    for (size_t i = 0; i < shards_.size(); ++i) shards_[i]->step(part(actions, i, 1), part(reward, i, 1), part(done, i, 1));
  }
  bool truncations(std::span<uint8_t> truncated, std::span<int64_t> tokens, std::span<float> vectors) const override {
    bool any = false;
    for (size_t i = 0; i < shards_.size(); ++i)
      any |= shards_[i]->truncations(part(truncated, i, 1), part(tokens, i, 1), dim_ > 0 ? part(vectors, i, dim_) : std::span<float>());
    return any;
  }
  std::pair<int64_t, int64_t> score_counts() const override {
    std::pair<int64_t, int64_t> n{0, 0};
    for (const auto& e : shards_) {
      const auto [a, b] = e->score_counts();
      n.first += a, n.second += b;
    }
    return n;
  }
  double score() const override {
    const auto [a, b] = score_counts();
    return b ? double(a) / double(b) : 0.0;
  }
  void reset_score() override {
    for (const auto& e : shards_) e->reset_score();
  }
  std::vector<int64_t> save_state() const override {
    std::vector<int64_t> s;
    for (const auto& e : shards_) {
      const std::vector<int64_t> one = e->save_state();
      s.insert(s.end(), one.begin(), one.end());
    }
    return s;
  }
  void load_state(std::span<const int64_t> s) override {
    std::vector<size_t> sizes;
    size_t total = 0;
    for (const auto& e : shards_) sizes.push_back(e->save_state().size()), total += sizes.back();
    if (s.size() != total)
      throw Error("env '" + spec().name + "' (" + std::to_string(shards_.size()) + " shards): saved state has " +
                  std::to_string(s.size()) + " integers, expected " + std::to_string(total) + " (a checkpoint of another configuration?)");
    // All or nothing: a shard that refuses its state puts the ones before it back.
    std::vector<std::vector<int64_t>> before;
    for (const auto& e : shards_) before.push_back(e->save_state());
    size_t i = 0;
    try {
      for (size_t at = 0; i < shards_.size(); at += sizes[i], ++i) shards_[i]->load_state(s.subspan(at, sizes[i]));
    } catch (...) {
      for (size_t j = 0; j < i; ++j) shards_[j]->load_state(before[j]);
      throw;
    }
  }

 private:
  template <class T>
  std::span<T> part(std::span<T> v, size_t i, int64_t width) const {
    const size_t n = size_t(per_ * width);
    return v.size() >= (i + 1) * n ? v.subspan(i * n, n) : std::span<T>();
  }
  std::vector<int64_t>& state_ints() override { return no_ints_; }
  bool valid_state(std::span<const int64_t>) const override { return false; }

  std::vector<std::unique_ptr<Env>> shards_;
  std::vector<int64_t> no_ints_;
  int64_t per_ = 0, dim_ = 0;
};

}  // namespace

std::unique_ptr<Env> make_env_shards(const std::string& name, int64_t batch, std::span<const uint64_t> seeds, const EnvOptions& o) {
  if (seeds.empty()) throw Error("env: make_env_shards needs at least one seed");
  if (seeds.size() == 1) return make_env(name, batch, seeds[0], o);
  const int64_t n = int64_t(seeds.size());
  if (batch < n || batch % n != 0)
    throw Error("env: " + std::to_string(batch) + " streams cannot be split into " + std::to_string(n) +
                " shards of equal size (--batch must be a multiple of --env-shards)");
  std::vector<std::unique_ptr<Env>> shards;
  for (size_t i = 0; i < seeds.size(); ++i) {
    EnvOptions oi = o;
    oi.shard = o.shard + int64_t(i);  // (lm: the shard's own streams)
    shards.push_back(make_env(name, batch / n, seeds[i], oi));
  }
  return std::make_unique<ShardedEnv>(std::move(shards), batch);
}

std::vector<std::string> load_env_plugin(const std::filesystem::path& file) {
  namespace fs = std::filesystem;
  static std::map<fs::path, std::vector<std::string>> loaded;  // by absolute path: what each plug-in registered
  std::error_code ec;
  if (!fs::exists(file, ec)) throw Error(file.string() + (ec ? ": cannot look at it (" + ec.message() + ")" : ": no such file"));
  if (fs::is_directory(file, ec)) throw Error(file.string() + ": is a directory, not a shared library");
  // dlopen of a FIFO waits for a writer forever; a device is no library either.
  if (!fs::is_regular_file(file, ec)) throw Error(file.string() + ": not a regular file, not a shared library");
  // An absolute path: dlopen searches the library path for a bare name.
  const fs::path path = fs::weakly_canonical(fs::absolute(file, ec), ec);
  if (auto it = loaded.find(path); it != loaded.end()) return it->second;
  dlerror();
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = dlerror();
    throw Error(file.string() + ": cannot load it as a shared library (" + (why ? why : "dlopen failed") + ")");
  }
  // Reading a function pointer out of dlsym's void*: the POSIX way.
  void* sym = dlsym(lib, "segtape_register_envs");
  if (!sym) {
    dlclose(lib);
    throw Error(file.string() + ": not a segtape env plug-in (it defines no extern \"C\" void segtape_register_envs())");
  }
  auto* register_envs = reinterpret_cast<void (*)()>(sym);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
  // The library stays loaded from here on: its factories may be in the
  // registry (and an env it made may outlive any handle we would close).
  // (the registry is locked around each step, not across register_envs,
  // whose register_env calls lock it themselves)
  Registry& r = registry();
  const size_t before = [&] {
    const std::lock_guard<std::mutex> hold(r.lock);
    return r.names.size();
  }();
  auto roll_back = [&] {
    const std::lock_guard<std::mutex> hold(r.lock);
    r.names.resize(before);
    r.factories.resize(before);
  };
  try {
    register_envs();
  } catch (const std::exception& e) {
    roll_back();
    throw Error(file.string() + ": segtape_register_envs() failed: " + e.what());
  } catch (...) {
    roll_back();
    throw Error(file.string() + ": segtape_register_envs() failed with an exception that is not a std::exception");
  }
  std::vector<std::string> added;
  {
    const std::lock_guard<std::mutex> hold(r.lock);
    added.assign(r.names.begin() + std::ptrdiff_t(before), r.names.end());
  }
  if (added.empty()) throw Error(file.string() + ": segtape_register_envs() registered no env (call register_env in it)");
  loaded[path] = added;
  return added;
}

}  // namespace segtape::agent
