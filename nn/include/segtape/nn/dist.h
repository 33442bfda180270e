// Data parallelism over an existing communication library (docs/distributed.md).
//
// Each rank (process) runs its own streams; after each backward the gradients
// are averaged over the ranks, so every rank applies the same update and the
// replicas stay equal. On CPUs the engine underneath is MPI (Open MPI from
// Debian): a program started by `mpirun -np N` makes its communicator with
// dist::mpi(). A communicator's collectives never wait forever: one that does
// not complete within Options::timeout_s (a rank died or hangs) prints what it
// waited for and ends the whole job (MPI_Abort).
//
// A loop of your own, on every rank:
//
//   auto comm = dist::mpi();                        // MPI_COMM_WORLD
//   dist::check_same(*comm, {{"hidden", "128"}});   // refused on every rank if any differs
//   dist::GradientAverager avg(*comm, policy);      // parameters broadcast from rank 0
//   for (...) {
//     Segment seg = tape.segment();
//     ... seg.backward(loss);                       // this rank's streams
//     avg.average();                                // every gradient = the mean over ranks
//     nn::clip_grad_norm(policy, 1.0); adam.step(); adam.zero_grad();
//   }
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "segtape/error.h"
#include "segtape/nn/module.h"

namespace segtape::dist {

// Every rank raised the same error at the same point (a configuration that
// differs between ranks): each can end normally. Any other error on one rank
// of several must end the job (abort), or the others would wait for it.
struct CollectiveError : Error {
  using Error::Error;
};

struct Options {
  double timeout_s = 300;  // a collective not complete after this aborts the job
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "mpi", "local"
  // In place: data[i] = the sum of data[i] over the ranks, on every rank.
  virtual void allreduce_sum(float* data, size_t n, const char* what) = 0;
  virtual void allreduce_sum(double* data, size_t n, const char* what) = 0;
  // Rank `root`'s bytes to every rank (the same size on every rank).
  virtual void broadcast(void* data, size_t bytes, int root, const char* what) = 0;
  // Every rank's bytes, in rank order, on every rank.
  virtual std::vector<std::string> allgather(const std::string& bytes, const char* what) = 0;
  // Rank `root` gets every rank's bytes in rank order; the others get {}.
  virtual std::vector<std::string> gather(const std::string& bytes, int root, const char* what) = 0;
  // Rank `root` sends parts[r] to rank r (parts is read on root only); returns this rank's.
  virtual std::string scatter(const std::vector<std::string>& parts, int root, const char* what) = 0;
  // Ends every rank of the job now with this exit code (MPI_Abort).
  [[noreturn]] virtual void abort(int code) = 0;
};

// One rank: every collective is the identity. What a program runs on when it
// was not started by mpirun.
std::unique_ptr<Communicator> local();

// Whether this build has the MPI backend (MPI found at configure time).
bool mpi_built();
// Whether this build averages CUDA tapes' gradients with NCCL (found with the CUDA backend).
bool nccl_built();
// Whether this process was started by mpirun (Open MPI's, or a PMI/PMIx launcher's environment).
bool launched_by_mpirun();
// The rank and the number of ranks mpirun gave this process, read from Open
// MPI's or PMI's environment before MPI starts; -1 for one not there (an
// error before the communicator exists can still name its rank).
std::pair<int64_t, int64_t> launched_rank();
// MPI_COMM_WORLD. Initialises MPI on the first call (MPI_Finalize runs at
// exit). Throws Error when this build has no MPI.
std::unique_ptr<Communicator> mpi(const Options& o = {});

// Refuses, on every rank alike (CollectiveError), settings that differ
// between ranks: the message names the first differing key, its value on
// rank 0 and the ranks that differ with their values. `what` says what the
// values are ("the training configuration").
void check_same(Communicator& c, const std::map<std::string, std::string>& settings, const std::string& what);

// Every rank learns of an error one rank had: `error` is this rank's ("" for
// none); when any rank's is not empty, every rank throws CollectiveError with
// the first one, naming its rank.
void raise_if_any(Communicator& c, const std::string& error);

// FNV-1a over the values of a module's parameters (any device: device
// tensors are copied to the host).
uint64_t parameter_checksum(const nn::Module& m);
// Compares every rank's parameter_checksum with rank 0's; CollectiveError
// naming the ranks that differ and `when` (e.g. "after update 200").
void check_replicas(Communicator& c, const nn::Module& m, const std::string& when);

// This process's rank among the ranks on its machine (mpirun's
// OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID or SLURM_LOCALID; 0 when none is
// set): the GPU a rank of a CUDA run takes (one GPU per rank).
int local_rank();

namespace detail {
class Nccl;  // nn/dist/nccl.h
}

struct AverageStats {
  int64_t calls = 0;       // average() calls
  int64_t collectives = 0; // all-reduce calls (one per bucket per average())
  double bytes = 0;        // bytes each rank contributed, summed over calls
  double seconds = 0;      // wall time inside average(), summed
};

// Averages a module's gradients over the ranks: the gradients in buckets of
// about `bucket_bytes` (a parameter's gradient at least that large is a
// bucket of its own, reduced in its own buffer; smaller ones are packed into
// one host buffer), one in-place all-reduce per bucket, then scaled by 1/size.
// f64 parameters (a model made for checks) are reduced one by one, in double.
// Made on every rank, in the same order: it broadcasts rank 0's parameters
// (the replicas start equal).
class GradientAverager {
 public:
  GradientAverager(Communicator& c, const nn::Module& m, size_t bucket_bytes = size_t(4) << 20);
  ~GradientAverager();
  // "nccl" (device gradients, NCCL on the tape's stream) or the
  // communicator's backend ("mpi", "local") through host memory.
  std::string transport() const;
  // After the backward, before clipping and the optimizer step, on every
  // rank. `count` travels with the gradients (an extra element of the last
  // bucket) and the sum over the ranks comes back: e.g. how many ranks had a
  // loss this update (the agent's trainer skips the step when none had).
  double average(float count = 0);
  // A flag that travels with the next average() (an extra element of its
  // last bucket, summed): set by any rank, every rank sees it after that
  // call, and it stays seen - e.g. "stop after this update", agreed at the
  // same step. `value` (> 0) is summed over the ranks that raised it:
  // flag_sum() is that sum, the first time any rank raised it (the agent's
  // trainer encodes why each rank stops in it: Trainer::stop_reason).
  void raise_flag(float value = 1) { flag_ = value > 0 ? value : 1; }
  bool flag_seen() const { return seen_; }
  float flag_sum() const { return seen_sum_; }
  // Rank 0's values of these tensors to every rank (parameters, optimizer state).
  void broadcast(const std::vector<Tensor>& tensors, const char* what);
  const AverageStats& stats() const { return stats_; }
  Communicator& communicator() const { return comm_; }

 private:
  struct Bucket {
    std::vector<Tensor> grads;  // in order; a large one alone, reduced in its own buffer when on the host
    size_t elements = 0;
  };
  void build_buckets(size_t bucket_bytes);  // buckets_, f64_ and pack_ from params_
  void setup_nccl();                        // nccl_ where the parameters are on a CUDA tape and NCCL is built
  Communicator& comm_;
  std::vector<Tensor> params_;
  std::vector<Bucket> buckets_;
  std::vector<float> pack_;  // the host buffer packed buckets (and device gradients) go through
  std::vector<Tensor> f64_;  // f64 gradients: one all-reduce each, in double
  float flag_ = 0;
  bool seen_ = false;
  float seen_sum_ = 0;
  void note_flag(float sum) {  // after an average(): the ranks' flags summed
    if (!seen_ && sum > 0) seen_sum_ = sum;
    seen_ = seen_ || sum > 0, flag_ = 0;
  }
  AverageStats stats_;
  std::unique_ptr<detail::Nccl> nccl_;
  std::vector<float*> device_grads_;
  std::vector<size_t> device_counts_;
};

}  // namespace segtape::dist
