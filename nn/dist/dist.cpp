// segtape::dist (nn/include/segtape/nn/dist.h): the communicators and the
// gradient averager. The MPI backend is compiled when CMake found MPI
// (SEGTAPE_HAVE_MPI); every collective is non-blocking under the hood and
// waited for with a deadline, so a dead or hung rank ends the job instead of
// hanging it.
#include "segtape/nn/dist.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "nccl.h"
#include "segtape/fnv.h"
#include "segtape/update.h"

#ifdef SEGTAPE_HAVE_MPI
#include <mpi.h>
#endif

namespace segtape::dist {

namespace {

class Local final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "local"; }
  void allreduce_sum(float*, size_t, const char*) override {}
  void allreduce_sum(double*, size_t, const char*) override {}
  void broadcast(void*, size_t, int, const char*) override {}
  std::vector<std::string> allgather(const std::string& b, const char*) override { return {b}; }
  std::vector<std::string> gather(const std::string& b, int, const char*) override { return {b}; }
  std::string scatter(const std::vector<std::string>& parts, int, const char* what) override {
    if (parts.size() != 1) throw Error(std::string("dist::scatter (") + what + "): " + std::to_string(parts.size()) + " parts for 1 rank");
    return parts[0];
  }
  [[noreturn]] void abort(int code) override { std::_Exit(code); }
};

#ifdef SEGTAPE_HAVE_MPI

// MPI_COMM_WORLD, with MPI initialised by the first mpi() and finalised at exit.
class Mpi final : public Communicator {
 public:
  explicit Mpi(const Options& o) : o_(o) {
    int ready = 0;
    MPI_Initialized(&ready);
    if (!ready) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      std::atexit([] {
        int done = 0;
        MPI_Finalized(&done);
        if (!done) MPI_Finalize();
      });
    }
    // Errors come back as codes (and become exceptions here), not as MPI's default abort.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  void allreduce_sum(float* data, size_t n, const char* what) override { reduce(data, n, MPI_FLOAT, what); }
  void allreduce_sum(double* data, size_t n, const char* what) override { reduce(data, n, MPI_DOUBLE, what); }

  void broadcast(void* data, size_t bytes, int root, const char* what) override {
    for (size_t off = 0; off < bytes;) {  // MPI counts are ints
      const int n = int(std::min<size_t>(bytes - off, kChunk));
      MPI_Request r;
      check(MPI_Ibcast(static_cast<char*>(data) + off, n, MPI_BYTE, root, MPI_COMM_WORLD, &r), what);
      wait(r, what);
      off += size_t(n);
    }
  }

  std::vector<std::string> allgather(const std::string& b, const char* what) override {
    std::vector<int> sizes = gather_sizes(b, true, 0, what);
    std::vector<int> offsets = offsets_of(sizes);
    std::string all(size_t(offsets.back() + sizes.back()), '\0');
    MPI_Request r;
    check(MPI_Iallgatherv(b.data(), int(b.size()), MPI_BYTE, all.data(), sizes.data(), offsets.data(), MPI_BYTE,
                          MPI_COMM_WORLD, &r),
          what);
    wait(r, what);
    return split(all, sizes, offsets);
  }

  std::vector<std::string> gather(const std::string& b, int root, const char* what) override {
    std::vector<int> sizes = gather_sizes(b, false, root, what);
    std::vector<int> offsets = rank_ == root ? offsets_of(sizes) : std::vector<int>(size_t(size_), 0);
    std::string all(rank_ == root ? size_t(offsets.back() + sizes.back()) : 0, '\0');
    MPI_Request r;
    check(MPI_Igatherv(b.data(), int(b.size()), MPI_BYTE, all.data(), sizes.data(), offsets.data(), MPI_BYTE, root,
                       MPI_COMM_WORLD, &r),
          what);
    wait(r, what);
    if (rank_ != root) return {};
    return split(all, sizes, offsets);
  }

  std::string scatter(const std::vector<std::string>& parts, int root, const char* what) override {
    std::vector<int> sizes(size_t(size_), 0), offsets(size_t(size_), 0);
    std::string all;
    if (rank_ == root) {
      if (parts.size() != size_t(size_))
        throw Error(std::string("dist::scatter (") + what + "): " + std::to_string(parts.size()) + " parts for " +
                    std::to_string(size_) + " ranks");
      for (size_t i = 0; i < parts.size(); ++i) {
        if (parts[i].size() > size_t(kChunk)) throw Error(std::string("dist::scatter (") + what + "): a part over 1 GiB");
        sizes[i] = int(parts[i].size());
      }
      offsets = offsets_of(sizes);
      for (const std::string& p : parts) all += p;
    }
    int mine = 0;
    MPI_Request r;
    check(MPI_Iscatter(sizes.data(), 1, MPI_INT, &mine, 1, MPI_INT, root, MPI_COMM_WORLD, &r), what);
    wait(r, what);
    std::string out(size_t(mine), '\0');
    check(MPI_Iscatterv(all.data(), sizes.data(), offsets.data(), MPI_BYTE, out.data(), mine, MPI_BYTE, root,
                        MPI_COMM_WORLD, &r),
          what);
    wait(r, what);
    return out;
  }

  [[noreturn]] void abort(int code) override {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  static constexpr size_t kChunk = size_t(1) << 30;

  void check(int rc, const char* what) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    throw Error("dist (rank " + std::to_string(rank_) + " of " + std::to_string(size_) + "): MPI failed in " + what + ": " +
                std::string(text, size_t(len)));
  }

  // Polls until the request completes; past the deadline, says what it
  // waited for and ends the job: a collective that cannot complete (a peer
  // died or hangs) must never leave this rank waiting forever.
  void wait(MPI_Request& r, const char* what) {
    // Polls without pausing for the first second, as MPI's blocking calls
    // do (a large all-reduce progresses only while its ranks poll); after
    // that, a long wait (a rank evaluating, writing a checkpoint, or gone),
    // with 1 ms sleeps.
    const auto start = std::chrono::steady_clock::now();
    for (int64_t spins = 0;; ++spins) {
      int done = 0;
      check(MPI_Test(&r, &done, MPI_STATUS_IGNORE), what);
      if (done) return;
      if (spins % 256 != 255) continue;
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > o_.timeout_s) {
        std::fprintf(stderr,
                     "segtape: error: dist: rank %d of %d waited %.0f s for %s (--dist-timeout %g): another rank died or "
                     "hangs; ending the job\n",
                     rank_, size_, waited, what, o_.timeout_s);
        abort(3);
      }
      if (waited > 1.0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  void reduce(void* data, size_t n, MPI_Datatype type, const char* what) {
    const size_t elem = type == MPI_FLOAT ? sizeof(float) : sizeof(double);
    for (size_t off = 0; off < n;) {
      const int k = int(std::min(n - off, kChunk / elem));
      MPI_Request r;
      check(MPI_Iallreduce(MPI_IN_PLACE, static_cast<char*>(data) + off * elem, k, type, MPI_SUM, MPI_COMM_WORLD, &r), what);
      wait(r, what);
      off += size_t(k);
    }
  }

  // Every rank's byte count (on every rank when `all`, else on root).
  std::vector<int> gather_sizes(const std::string& b, bool all, int root, const char* what) {
    if (b.size() > kChunk) throw Error(std::string("dist (") + what + "): over 1 GiB from one rank");
    int mine = int(b.size());
    std::vector<int> sizes(size_t(size_), 0);
    MPI_Request r;
    if (all)
      check(MPI_Iallgather(&mine, 1, MPI_INT, sizes.data(), 1, MPI_INT, MPI_COMM_WORLD, &r), what);
    else
      check(MPI_Igather(&mine, 1, MPI_INT, sizes.data(), 1, MPI_INT, root, MPI_COMM_WORLD, &r), what);
    wait(r, what);
    return sizes;
  }
  static std::vector<int> offsets_of(const std::vector<int>& sizes) {
    std::vector<int> o(sizes.size(), 0);
    int64_t at = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (at > int64_t(kChunk)) throw Error("dist: over 1 GiB gathered");
      o[i] = int(at), at += sizes[i];
    }
    return o;
  }
  static std::vector<std::string> split(const std::string& all, const std::vector<int>& sizes, const std::vector<int>& offsets) {
    std::vector<std::string> out;
    for (size_t i = 0; i < sizes.size(); ++i) out.push_back(all.substr(size_t(offsets[i]), size_t(sizes[i])));
    return out;
  }

  Options o_;
  int rank_ = 0, size_ = 1;
};

#endif  // SEGTAPE_HAVE_MPI

}  // namespace

std::unique_ptr<Communicator> local() { return std::make_unique<Local>(); }

bool mpi_built() {
#ifdef SEGTAPE_HAVE_MPI
  return true;
#else
  return false;
#endif
}

int local_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* s = std::getenv(v)) return std::atoi(s);
  return 0;
}

bool nccl_built() { return detail::Nccl::built(); }

bool launched_by_mpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

std::pair<int64_t, int64_t> launched_rank() {
  auto number = [](std::initializer_list<const char*> vars) -> int64_t {
    for (const char* v : vars)
      if (const char* x = std::getenv(v)) {
        int64_t n = -1;
        const char* end = x + std::strlen(x);
        if (const auto r = std::from_chars(x, end, n); r.ec == std::errc() && r.ptr == end && n >= 0) return n;
      }
    return -1;
  };
  return {number({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}), number({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})};
}

std::unique_ptr<Communicator> mpi([[maybe_unused]] const Options& o) {
#ifdef SEGTAPE_HAVE_MPI
  if (!(o.timeout_s >= 1) || !std::isfinite(o.timeout_s))  // (1e-9 failed a healthy job, "another rank died or hangs")
    throw Error("dist: the collective timeout must be a finite number of seconds >= 1 (--dist-timeout; healthy ranks reach "
                "a collective that far apart)");
  return std::make_unique<Mpi>(o);
#else
  throw Error("dist: this build of segtape has no MPI (Open MPI was not found when it was configured; install "
              "libopenmpi-dev and rebuild)");
#endif
}

void check_same(Communicator& c, const std::map<std::string, std::string>& settings, const std::string& what) {
  // Each key and value as its length, ':' and its bytes: any byte may be in
  // them (a NUL included), and no two different maps encode alike.
  std::string mine;
  auto put = [&](const std::string& x) { mine.append(std::to_string(x.size())).append(1, ':').append(x); };
  for (const auto& [k, v] : settings) put(k), put(v);
  const std::vector<std::string> all = c.allgather(mine, "the comparison of the ranks' settings");
  if (std::all_of(all.begin(), all.end(), [&](const std::string& s) { return s == all[0]; })) return;
  auto parse = [](const std::string& s) {  // (every rank encoded its map as above)
    std::map<std::string, std::string> m;
    size_t at = 0;
    auto get = [&]() {
      const size_t colon = s.find(':', at);
      if (colon == std::string::npos) {  // not this encoding (another build of segtape): the rest as one value
        std::string rest = s.substr(at);
        at = s.size();
        return rest;
      }
      const size_t n = std::min(size_t(std::strtoull(s.c_str() + at, nullptr, 10)), s.size() - colon - 1);
      at = colon + 1 + n;
      return s.substr(colon + 1, n);
    };
    while (at < s.size()) {
      std::string k = get();
      m[std::move(k)] = get();
    }
    return m;
  };
  std::vector<std::map<std::string, std::string>> maps;
  maps.reserve(all.size());
  for (const std::string& s : all) maps.push_back(parse(s));
  std::map<std::string, bool> keys;
  for (const auto& m : maps)
    for (const auto& [k, v] : m) keys[k] = true;
  for (const auto& entry : keys) {
    const std::string& k = entry.first;
    auto value = [&](size_t r) {
      auto it = maps[r].find(k);
      return it == maps[r].end() ? std::string("(none)") : "'" + it->second + "'";
    };
    std::string differ;
    for (size_t r = 1; r < maps.size(); ++r)
      if (value(r) != value(0)) differ.append(differ.empty() ? "" : ", ").append("rank ").append(std::to_string(r)).append(" has ").append(value(r));
    if (!differ.empty()) {
      std::string m = "dist: ";
      m.append(what).append(" differs between ranks: ").append(k).append(" is ").append(value(0)).append(" on rank 0, but ");
      m.append(differ).append("; every rank must run the same configuration");
      throw CollectiveError(m);
    }
  }
}

void raise_if_any(Communicator& c, const std::string& error) {
  const std::vector<std::string> all = c.allgather(error, "the exchange of the ranks' errors");
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty())
      throw CollectiveError(c.size() > 1 && r > 0 ? "(rank " + std::to_string(r) + ") " + all[r] : all[r]);
}

uint64_t parameter_checksum(const nn::Module& m) {
  uint64_t h = fnv::kOffset;
  std::vector<std::byte> bytes;
  for (const Tensor& p : m.parameters()) {
    bytes.resize(p.nbytes());
    p.to_host_bytes(bytes);
    h = fnv::bytes(bytes.data(), bytes.size(), h);
  }
  return h;
}

void check_replicas(Communicator& c, const nn::Module& m, const std::string& when) {
  const uint64_t mine = parameter_checksum(m);
  const std::vector<std::string> all =
      c.allgather(std::string(reinterpret_cast<const char*>(&mine), sizeof mine), "the comparison of the parameter checksums");
  std::string differ;
  for (size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  if (!differ.empty())
    throw CollectiveError("dist: the replicas' parameters differ " + when + ": rank(s) " + differ +
                          " do not hold rank 0's values (parameter checksums differ); the ranks no longer train one model");
}

GradientAverager::GradientAverager(Communicator& c, const nn::Module& m, size_t bucket_bytes) : comm_(c), params_(m.parameters()) {
  // A model this rank refuses is every rank's error (the others would wait
  // in the comparison below until the collective timeout).
  std::string refused;
  try {
    build_buckets(bucket_bytes);
  } catch (const Error& e) {
    if (comm_.size() == 1) throw;
    refused = e.what();
  }
  // Every rank must hold the same parameters, bucketed alike, or the
  // broadcast and the all-reduces below would pair buffers of different
  // sizes (MPI writes past the smaller one): one comparison first.
  if (comm_.size() > 1) {
    raise_if_any(comm_, refused);
    std::map<std::string, std::string> layout{{"bucket_bytes", std::to_string(bucket_bytes)},
                                              {"parameter count", std::to_string(params_.size())},
                                              {"device", !params_.empty() && params_[0].on_device() ? "cuda" : "cpu"}};
    for (size_t i = 0; i < params_.size(); ++i) {
      std::string at = std::to_string(i);
      at.insert(0, 5 - std::min<size_t>(5, at.size()), '0');  // (in order when the keys are sorted)
      layout["parameter " + at] = std::string(dtype_name(params_[i].dtype)) + params_[i].shape.str();
    }
    check_same(comm_, layout, "the model (dist::GradientAverager's parameters)");
  }
  broadcast(params_, "the broadcast of rank 0's parameters");
  setup_nccl();
}

void GradientAverager::build_buckets(size_t bucket_bytes) {
  if (bucket_bytes < sizeof(float)) throw Error("dist::GradientAverager: bucket_bytes must be >= 4");
  const size_t cap = bucket_bytes / sizeof(float);
  Bucket packed;
  size_t largest = 1;
  for (const Tensor& p : params_) {
    if (!p.grad) throw Error("dist::GradientAverager: " + p.describe() + " has no gradient buffer (not a parameter)");
    if (p.dtype == DType::F64) {  // reduced one by one, in double (f64 models are for checks, not speed)
      f64_.push_back(p.grad_tensor());
      continue;
    }
    if (p.dtype != DType::F32) throw Error("dist::GradientAverager: " + p.describe() + ": only f32 and f64 parameters are averaged");
    Tensor g = p.grad_tensor();
    const size_t n = size_t(g.numel());
    if (n >= cap) {  // a bucket of its own
      buckets_.push_back({{g}, n});
      largest = std::max(largest, n);
      continue;
    }
    if (packed.elements + n > cap) buckets_.push_back(std::move(packed)), packed = {};
    packed.grads.push_back(g), packed.elements += n;
  }
  buckets_.push_back(std::move(packed));  // the last: packed, and carries the flag (possibly alone)
  for (const Bucket& b : buckets_) largest = std::max(largest, b.elements + 2);  // (+ the flag and the count)
  pack_.assign(largest, 0.0f);
}

void GradientAverager::setup_nccl() {
  // CUDA tapes: NCCL on the tape's stream, when built in.
  if (!params_.empty() && f64_.empty() && params_[0].on_device() && params_[0].tape->native_stream() && detail::Nccl::built()) {
    // NCCL's calls go to the stream directly, not through the tape's graph
    // capture and replay: on a replaying tape they would run out of order.
    if (params_[0].tape->options().graph_replay)
      throw Error("dist::GradientAverager: the tape replays CUDA graphs (TapeOptions::graph_replay), which the NCCL all-reduce "
                  "does not go through yet; make the tape without graph_replay");
    nccl_ = detail::Nccl::make(comm_, params_[0].tape->native_stream(), params_[0].tape->device().index);
    for (const Tensor& p : params_) {
      const Tensor g = p.grad_tensor();
      device_grads_.push_back(static_cast<float*>(g.ptr));
      device_counts_.push_back(size_t(g.numel()));
    }
  }
}

GradientAverager::~GradientAverager() = default;

std::string GradientAverager::transport() const { return nccl_ ? "nccl" : comm_.backend(); }

void GradientAverager::broadcast(const std::vector<Tensor>& tensors, const char* what) {
  if (comm_.size() == 1) return;
  std::vector<std::byte> bytes;
  for (const Tensor& t : tensors) {
    bytes.resize(t.nbytes());
    if (comm_.rank() == 0) t.to_host_bytes(bytes);
    comm_.broadcast(bytes.data(), bytes.size(), 0, what);
    if (comm_.rank() != 0) t.from_host_bytes(bytes);
  }
}

double GradientAverager::average(float count) {
  const auto t0 = std::chrono::steady_clock::now();
  const int n = comm_.size();
  if (nccl_) {  // enqueued on the tape's stream: nothing waits here
    nccl_->sum(device_grads_, device_counts_);
    for (const size_t c : device_counts_) stats_.bytes += double(c) * sizeof(float);
    ++stats_.collectives;
    float f[2] = {flag_, count};
    if (n > 1) {
      comm_.allreduce_sum(f, 2, "the all-reduce of the stop flag and the count");
      for (const Tensor& p : params_) scale_grad(p, 1.0 / double(n));
    }
    note_flag(f[0]);
    ++stats_.calls;
    stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return f[1];
  }
  if (n == 1) {  // nothing to average; the flag and the count are this rank's own
    note_flag(flag_);
    ++stats_.calls;
    return count;
  }
  double total = 0;
  const double inv = 1.0 / double(n);
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    const bool last = i + 1 == buckets_.size();
    if (b.grads.size() == 1 && !last && !b.grads[0].on_device()) {  // reduced in its own buffer
      comm_.allreduce_sum(b.grads[0].data<float>(), b.elements, "the gradient all-reduce");
    } else {
      size_t at = 0;
      for (const Tensor& g : b.grads) {
        g.to_host(std::span<float>(pack_.data() + at, size_t(g.numel())));
        at += size_t(g.numel());
      }
      size_t elements = at;
      if (last) pack_[elements++] = flag_, pack_[elements++] = count;
      // the flag is summed: > 0 when any rank raised it
      comm_.allreduce_sum(pack_.data(), elements, "the gradient all-reduce");
      if (last) note_flag(pack_[at]), total = pack_[at + 1];
      at = 0;
      for (const Tensor& g : b.grads) {
        g.from_host(std::span<const float>(pack_.data() + at, size_t(g.numel())));
        at += size_t(g.numel());
      }
    }
    stats_.bytes += double(b.elements) * sizeof(float);
    ++stats_.collectives;
  }
  for (const Tensor& g : f64_) {
    const size_t count = size_t(g.numel());
    if (!g.on_device()) {
      comm_.allreduce_sum(g.data<double>(), count, "the gradient all-reduce (f64)");
    } else {
      std::vector<double> host(count);
      g.to_host(std::span<double>(host));
      comm_.allreduce_sum(host.data(), count, "the gradient all-reduce (f64)");
      g.from_host(std::span<const double>(host));
    }
    stats_.bytes += double(count) * sizeof(double);
    ++stats_.collectives;
  }
  for (const Tensor& p : params_) scale_grad(p, inv);
  ++stats_.calls;
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return total;
}

}  // namespace segtape::dist
