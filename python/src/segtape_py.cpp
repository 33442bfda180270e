// segtape._segtape: the nanobind module behind `import segtape`
// (docs/python.md). Thin: every call goes straight to the C++ library; the
// Python package (python/segtape/) adds the Pythonic parts (parsing a device
// or a size, nn.Module's attribute registration, the retention helpers).
//
// Lifetimes. A C++ Tensor is a handle into memory its Tape owns. A Python
// Tensor holds that handle and a shared TapeBox; the Python Tape object owns
// the box's Tape and destroys it when Python frees the Tape object, after
// which every Tensor of it raises ExpiredTensorError ("its tape is gone")
// instead of reading freed memory. Segments, modules and optimizers keep
// their Python Tape object alive (nb::keep_alive), so the tape cannot go away
// under them. A tensor of an ended segment raises through the engine's own
// generation check, as in C++.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <vector>

#include "segtape/agent/env.h"
#include "segtape/agent/sample.h"
#include "segtape/blas.h"
#include "segtape/agent/retention.h"
#include "segtape/agent/trainer.h"
#include "segtape/emulation.h"
#include "segtape/explain.h"
#include "segtape/kernels.h"
#include "segtape/nn.h"
#include "segtape/nn/dist.h"
#include "segtape/op_list.h"
#include "segtape/ops.h"
#include "segtape/tape.h"

#include "../../agent/task/corpus.h"  // (the agent library's corpus reader: segtape.agent.corpus)

namespace nb = nanobind;
using namespace nb::literals;
using namespace segtape;

namespace {
// The Python API's MPI calls, one thread at a time (MPI is initialised
// MPI_THREAD_FUNNELED; the calls release the GIL while they wait).
std::mutex& dist_calls() {
  static std::mutex m;
  return m;
}

// ---------------------------------------------------------------- interpreter exit
//
// When the interpreter finalizes, CPython 3.11 ends a daemon thread that
// takes the GIL again with pthread_exit. Its forced unwind cannot pass a
// nanobind call (the dispatcher and the ndarray export are noexcept): a
// daemon thread inside a call that releases the GIL (retention.run, the dist
// collectives) or runs Python code (a Python env's callbacks in
// Trainer.run_segment) ended the process with std::terminate or a segfault.
// So no such call may be running when finalization begins: the atexit
// handler segtape registers at import (_at_exit) runs before it, while
// daemon threads still run. It sets `exiting`, which refuses new calls and
// stops running ones at their next boundary (a Python env's next callback,
// evaluate's next segment, the lab's next 64 steps), and waits, at most its
// timeout, for `in_flight` to reach 0.
struct ExitGate {
  std::atomic<bool> exiting{false};
  std::atomic<int64_t> in_flight{0};
  std::mutex m;  // (for cv: the waiter checks in_flight under it)
  std::condition_variable cv;
};
ExitGate& exit_gate() {
  static ExitGate g;
  return g;
}
bool interpreter_exiting() { return exit_gate().exiting.load(); }

// A running call stopped by the interpreter's exit; Python's RuntimeError
// (nanobind translates std::runtime_error; not a segtape::Error, so that
// segtape's own handlers do not take it for a bad argument).
struct InterpreterExiting : std::runtime_error {
  explicit InterpreterExiting(const std::string& what)
      : std::runtime_error("segtape: the interpreter is exiting; " + what) {}
};

// Counts a call in flight for the scope (made and ended with the GIL held),
// or refuses it once the interpreter exits.
class ExitGuard {
 public:
  explicit ExitGuard(const char* call) {
    ExitGate& g = exit_gate();
    g.in_flight.fetch_add(1);  // (then exiting: _at_exit sets it, then reads in_flight)
    if (g.exiting.load()) {
      leave();
      throw InterpreterExiting(std::string(call) + " refused");
    }
  }
  ~ExitGuard() { leave(); }
  ExitGuard(const ExitGuard&) = delete;
  ExitGuard& operator=(const ExitGuard&) = delete;

 private:
  static void leave() {
    ExitGate& g = exit_gate();
    if (g.in_flight.fetch_sub(1) == 1 && g.exiting.load()) {
      const std::lock_guard<std::mutex> lock(g.m);
      g.cv.notify_all();
    }
  }
};

// _at_exit: refuses every guarded call from now on and waits (the GIL
// released) until none runs, or timeout_s; returns how many still run.
int64_t at_exit(double timeout_s) {
  ExitGate& g = exit_gate();
  g.exiting.store(true);
  nb::gil_scoped_release release;
  std::unique_lock<std::mutex> lock(g.m);
  g.cv.wait_for(lock, std::chrono::duration<double>(std::max(timeout_s, 0.0)), [&] { return g.in_flight.load() == 0; });
  return g.in_flight.load();
}
}  // namespace

namespace {

// ---------------------------------------------------------------- ints beyond their C++ type
// A Python int beyond the C++ type an argument goes into matches none of a
// function's typed overloads, and nanobind's TypeError then lists
// signatures, naming neither the call nor the argument. The overloads
// registered after the typed ones take the int as an object and say what
// is wrong: the argument and its range, or (a shape) its dimension.

[[noreturn]] void int_beyond(const std::string& call, const char* name, nb::handle v, const char* range) {
  throw Error(call + ": " + name + " must be in " + range + ", got " + nb::str(v).c_str());
}

// A shape the typed overload did not take, as a Shape: a sequence of ints
// (operator.index: NumPy's too), the first that int64 cannot hold named as
// beyond a dimension's range (2^31 - 1; Shape::of names one beyond that
// but within int64); anything else is a TypeError naming the call.
Shape shape_arg(const char* call, nb::handle shape) {
  const auto not_ints = [&] {
    return nb::type_error((std::string(call) + ": shape must be a sequence of ints, got " + nb::str(shape).c_str()).c_str());
  };
  if (!nb::isinstance<nb::sequence>(shape) || nb::isinstance<nb::str>(shape)) throw not_ints();
  std::vector<int64_t> dims;
  const nb::object lo = nb::int_(INT64_MIN), hi = nb::int_(INT64_MAX);
  for (nb::handle d : nb::iter(shape)) {
    PyObject* i = PyNumber_Index(d.ptr());
    if (!i) {
      PyErr_Clear();
      throw not_ints();
    }
    const nb::object v = nb::steal(i);
    if (v < lo || v > hi)
      throw ShapeError(std::string(call) + ": shape " + nb::str(shape).c_str() + " has the dimension " + nb::str(v).c_str() +
                       ", beyond what a dimension can hold (2^31 - 1)");
    dims.push_back(nb::cast<int64_t>(v));
  }
  return Shape::of(dims, call);
}

// ---------------------------------------------------------------- lifetimes

struct TapeBox {
  std::unique_ptr<Tape> tape;
  std::optional<Segment> open;  // the open segment, ended before the tape goes
  uint32_t open_index = 0;
  // One C++ guard while any no_grad() guard is entered: the Python guards
  // entered and not yet exited, innermost last. A guard dropped without its
  // __exit__ leaves the list wherever it is (each C++ guard restoring the
  // mode it saved left the tape without gradients for good when two were
  // dropped out of order).
  std::optional<NoGradGuard> no_grad;
  std::vector<const void*> no_grad_stack;
};
using BoxPtr = std::shared_ptr<TapeBox>;

// Tape* -> its box, for tensors made by C++ code that knows only the Tape
// (a module's parameters). Entries live as long as their Python Tape.
std::unordered_map<const Tape*, std::weak_ptr<TapeBox>>& boxes() {
  static std::unordered_map<const Tape*, std::weak_ptr<TapeBox>> m;
  return m;
}
BoxPtr box_of(const Tape* t) {
  auto it = boxes().find(t);
  if (it == boxes().end()) throw TapeError("internal: a tensor of a tape that Python does not know");
  return it->second.lock();
}

struct PyTensor {
  Tensor t;
  BoxPtr box;
  // The handle, if its tape still exists (the engine then checks the segment).
  const Tensor& get() const {
    if (t.defined() && (!box || !box->tape))
      throw ExpiredTensorError("tensor " + std::string(dtype_name(t.dtype)) + t.shape.str() +
                               " used after its tape is gone (the segtape.Tape object was freed); "
                               "keep the tape alive while its tensors are used");
    return t;
  }
};
PyTensor wrap(const Tensor& t, const BoxPtr& box) { return {t, box}; }
PyTensor wrap(const Tensor& t) { return {t, t.defined() ? box_of(t.tape) : BoxPtr{}}; }

struct PyTape {
  BoxPtr box = std::make_shared<TapeBox>();
  PyTape(Device d, TapeOptions o) {
    if (!o.budget_name) o.budget_name = o.grow ? "segtape.Tape(grow_limit=...)" : "segtape.Tape(segment_budget=...)";
    box->tape = std::make_unique<Tape>(d, o);
    boxes()[box->tape.get()] = box;
  }
  ~PyTape() {
    box->open.reset();
    box->no_grad.reset();
    boxes().erase(box->tape.get());
    box->tape.reset();
  }
  PyTape(const PyTape&) = delete;
  PyTape& operator=(const PyTape&) = delete;
  Tape& tape() const { return *box->tape; }
};

// One Python object per segment (__enter__ returns the same object), which
// ends the segment when it goes (as C++'s Segment does): a `tape.segment()`
// whose object was dropped does not leave the tape locked.
struct PySegment {
  BoxPtr box;
  uint32_t index = 0;
  PySegment(BoxPtr b, uint32_t i) : box(std::move(b)), index(i) {}
  PySegment(PySegment&& o) noexcept : box(std::move(o.box)), index(o.index) {}
  PySegment(const PySegment&) = delete;
  PySegment& operator=(const PySegment&) = delete;
  ~PySegment() {
    if (box && box->open && box->open_index == index) box->open.reset();
  }
  Segment& get() const {
    if (!box->open || box->open_index != index)
      throw TapeError("segment " + std::to_string(index) + " has ended; open a new one with tape.segment()");
    return *box->open;
  }
};

struct PyNoGrad {
  BoxPtr box;
  bool entered = false;
  explicit PyNoGrad(BoxPtr b) : box(std::move(b)) {}
  PyNoGrad(const PyNoGrad&) = delete;
  PyNoGrad& operator=(const PyNoGrad&) = delete;
  ~PyNoGrad() {
    if (entered) leave();
  }
  void enter() {
    if (!box->tape) throw TapeError("no_grad(): the tape is gone");
    if (entered) throw TapeError("no_grad(): this guard is already entered");
    if (box->no_grad_stack.empty()) box->no_grad.emplace(*box->tape);
    box->no_grad_stack.push_back(this);
    entered = true;
  }
  void exit() {
    if (!entered) throw TapeError("no_grad(): this guard was not entered");
    if (box->no_grad_stack.back() != this)
      throw TapeError("no_grad(): guards must be exited in the reverse order of entering (as `with` blocks are)");
    leave();
  }
  void leave() noexcept {
    auto& s = box->no_grad_stack;
    s.erase(std::find(s.begin(), s.end(), static_cast<const void*>(this)));
    entered = false;
    if (s.empty()) box->no_grad.reset();
  }
};

// ---------------------------------------------------------------- errors

// The Python classes of segtape's errors (python/segtape/__init__.py names them),
// made here with tuple bases so that e.g. ShapeError is also a ValueError.
struct ErrorClasses {
  PyObject *base = nullptr, *shape = nullptr, *expired = nullptr, *budget = nullptr, *tape = nullptr,
           *index = nullptr, *checkpoint = nullptr, *anomaly = nullptr, *non_finite = nullptr,
           *out_of_memory = nullptr, *device = nullptr;
};
ErrorClasses& errors() {
  static ErrorClasses e;
  return e;
}
PyObject* make_error(nb::module_& m, const char* name, PyObject* bases, const char* doc) {
  const std::string qual = std::string("segtape.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qual.c_str(), doc, bases, nullptr);
  if (!cls) throw nb::python_error();
  m.attr(name) = nb::handle(cls);
  return cls;
}
void register_errors(nb::module_& m) {
  auto& e = errors();
  e.base = make_error(m, "Error", PyExc_Exception, "Base of every error segtape raises on bad input or misuse.");
  auto two = [&](PyObject* builtin) { return nb::make_tuple(nb::handle(e.base), nb::handle(builtin)).release().ptr(); };
  e.shape = make_error(m, "ShapeError", two(PyExc_ValueError), "An op got inputs of incompatible shapes or dtypes.");
  e.expired = make_error(m, "ExpiredTensorError", two(PyExc_ReferenceError),
                         "A tensor used after its segment ended, or after its tape is gone.");
  e.budget = make_error(m, "BudgetError", two(PyExc_MemoryError),
                        "The segment arena would exceed its budget (the message says what filled it), or a GPU's fixed pool its size.");
  e.tape = make_error(m, "TapeError", two(PyExc_RuntimeError),
                      "The tape was misused: a second backward without retain_graph, an op with no open segment, ...");
  e.index = make_error(m, "IndexError", two(PyExc_IndexError), "An index (embedding row, class target) out of range.");
  e.checkpoint = make_error(m, "CheckpointError", two(PyExc_OSError),
                            "A checkpoint file is missing, corrupt, hostile, or does not match the model.");
  e.anomaly = make_error(m, "AnomalyError", two(PyExc_FloatingPointError), "A NaN or Inf produced under anomaly mode.");
  e.non_finite = make_error(m, "NonFiniteError", two(PyExc_FloatingPointError),
                            "A training update whose gradient or loss is not finite (TrainConfig.nonfinite, segtape.gym.train's "
                            "nonfinite): the message names the update, its steps and the first parameter whose gradient is not finite.");
  e.out_of_memory = make_error(m, "OutOfMemoryError", two(PyExc_MemoryError),
                               "The machine's (or the GPU's) memory cannot hold one of a tape's pools; the message names it "
                               "and the bytes, and .pool is its name (e.g. segtape.SEGMENT_ARENA_POOL).");
  e.device = make_error(m, "DeviceError", two(PyExc_RuntimeError),
                        "The device asked for is not here: no CUDA GPU or driver, an ordinal past the count, a GPU that cannot be used, "
                        "or no CUDA backend built.");
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    auto& c = errors();
    // A message may hold bytes that are not UTF-8 (a file name as the OS has
    // it): those read as \xNN, where PyErr_SetString lost the whole message.
    const auto decode = [](const char* m) { return PyUnicode_DecodeUTF8(m, Py_ssize_t(std::strlen(m)), "backslashreplace"); };
    const auto set_error = [&](PyObject* type, const char* m) {
      PyObject* text = decode(m);
      if (!text) return;  // (its own error is set)
      PyErr_SetObject(type, text);
      Py_DECREF(text);
    };
    try {
      std::rethrow_exception(p);
    } catch (const ShapeError& x) {
      set_error(c.shape, x.what());
    } catch (const ExpiredTensorError& x) {
      set_error(c.expired, x.what());
    } catch (const BudgetError& x) {
      set_error(c.budget, x.what());
    } catch (const TapeError& x) {
      // The engine's advice in C++ (`{.retain_graph = true}`), and the writer
      // of a refused write (from_host: Tensor.copy_ here), in Python terms.
      std::string m = x.what();
      for (size_t at; (at = m.find("{.retain_graph = true}")) != std::string::npos;) m.replace(at, 22, "retain_graph=True");
      constexpr std::string_view from_host = "from_host";
      if (size_t at = m.find(" from_host wrote into it"); at != std::string::npos) m.replace(at + 1, from_host.size(), "copy_()");
      set_error(c.tape, m.c_str());
    } catch (const IndexError& x) {
      set_error(c.index, x.what());
    } catch (const CheckpointError& x) {
      set_error(c.checkpoint, x.what());
    } catch (const AnomalyError& x) {
      set_error(c.anomaly, x.what());
    } catch (const NonFiniteError& x) {
      set_error(c.non_finite, x.what());
    } catch (const OutOfMemoryError& x) {
      // with the pool as .pool, C++'s field (callers tell pools apart by it)
      PyObject* text = decode(x.what());
      PyObject* e = text ? PyObject_CallOneArg(c.out_of_memory, text) : nullptr;
      Py_XDECREF(text);
      if (!e) return;  // (its own error is set)
      PyObject* pool = decode(x.pool);
      if (!pool || PyObject_SetAttrString(e, "pool", pool) != 0) PyErr_Clear();
      Py_XDECREF(pool);
      PyErr_SetObject(c.out_of_memory, e);
      Py_DECREF(e);
    } catch (const DeviceError& x) {
      set_error(c.device, x.what());
    } catch (const Error& x) {
      set_error(c.base, x.what());
    }
  });
}

// ---------------------------------------------------------------- tensors

template <class T>
using HostArray = nb::ndarray<const T, nb::c_contig, nb::device::cpu>;

// A NumPy array with a copy of t's values (any device).
template <class T>
nb::object to_numpy(const Tensor& t) {
  auto* v = new std::vector<T>(size_t(t.numel()));
  nb::capsule owner(v, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  t.to_host(std::span<T>(*v));
  std::vector<size_t> shape(size_t(t.rank()));
  for (int i = 0; i < t.rank(); ++i) shape[size_t(i)] = size_t(t.dim(i));
  return nb::cast(nb::ndarray<nb::numpy, T>(v->data(), shape.size(), shape.data(), owner));
}
nb::object numpy_of(const PyTensor& p) {
  const Tensor& t = p.get();
  t.check_live("numpy()");
  switch (t.dtype) {
    case DType::F32: return to_numpy<float>(t);
    case DType::F64: return to_numpy<double>(t);
    case DType::I64: return to_numpy<int64_t>(t);
  }
  throw Error("numpy(): unknown dtype");
}

DType dtype_from(const std::string& s) {
  if (s == "float32") return DType::F32;
  if (s == "float64") return DType::F64;
  if (s == "int64") return DType::I64;
  throw ShapeError("dtype '" + s + "': expected float32, float64 or int64");
}
std::string dtype_str(DType d) {
  switch (d) {
    case DType::F32: return "float32";
    case DType::F64: return "float64";
    case DType::I64: return "int64";
  }
  return "?";
}

template <class T>
void copy_from(const PyTensor& p, const HostArray<T>& a) {
  const Tensor& t = p.get();  // (segtape's Tensor.copy_ checked the shape and made `a` contiguous, of t's dtype)
  if (a.size() != size_t(t.numel()))
    throw ShapeError("copy_(): " + std::to_string(a.size()) + " values into tensor " + t.describe());
  t.from_host(std::span<const T>(a.data(), a.size()));
}

std::vector<int64_t> dims(const Tensor& t) {
  std::vector<int64_t> d(size_t(t.rank()));
  for (int i = 0; i < t.rank(); ++i) d[size_t(i)] = t.dim(i);
  return d;
}

// An op on tensors of one box: f(get()...) wrapped with the first input's box.
template <class F, class... P>
PyTensor apply(F&& f, const PyTensor& a, const P&... rest) {
  return wrap(f(a.get(), rest.get()...), a.box);
}

// {"key": value, ...} from C++ values.
nb::dict dict_of(std::initializer_list<std::pair<const char*, nb::object>> items) {
  nb::dict d;
  for (const auto& [k, v] : items) d[k] = v;
  return d;
}

PyTensor add_scalar(const PyTensor& a, double s) {
  if (s != 0)
    throw nb::type_error(("tensor + " + std::to_string(s) + ": segtape adds numbers to tensors only when the number is 0 "
                          "(sum(), loss = 0 + ...); make a tensor of the value instead").c_str());
  a.get();
  return a;
}

nb::dict to_dict(const TapeStats& s) {
  nb::dict d;
  d["live_bytes"] = s.live_bytes, d["peak_bytes"] = s.peak_bytes, d["last_segment_peak"] = s.last_segment_peak;
  d["node_count"] = s.node_count, d["node_bytes"] = s.node_bytes, d["node_peak_bytes"] = s.node_peak_bytes;
  d["persistent_bytes"] = s.persistent_bytes, d["carry_bytes"] = s.carry_bytes;
  d["workspace_bytes"] = s.workspace_bytes, d["grad_bytes"] = s.grad_bytes;
  d["system_allocations"] = s.system_allocations, d["segment_index"] = s.segment_index, d["step"] = s.step;
  nb::dict by_op;
  for (size_t k = 0; k < kOpKinds; ++k)
    if (s.bytes_by_op[k]) by_op[op_name(OpKind(k))] = s.bytes_by_op[k];
  d["bytes_by_op"] = by_op;
  d["device_bytes"] = s.device_bytes, d["device_allocations"] = s.device_allocations;
  return d;
}

nb::dict to_dict(const Explanation& e) {
  nb::dict d;
  d["segment"] = e.segment, d["open"] = e.open, d["arena_bytes"] = e.arena_bytes, d["node_bytes"] = e.node_bytes;
  d["node_count"] = e.node_count, d["first_step"] = e.first_step, d["last_step"] = e.last_step;
  d["grad_bytes"] = e.grad_bytes, d["bytes_per_step"] = e.bytes_per_step();
  nb::dict arena, nodes, counts;
  for (size_t k = 0; k < kOpKinds; ++k) {
    if (e.arena_by_op[k]) arena[op_name(OpKind(k))] = e.arena_by_op[k];
    if (e.node_bytes_by_op[k]) nodes[op_name(OpKind(k))] = e.node_bytes_by_op[k];
    if (e.nodes_by_op[k]) counts[op_name(OpKind(k))] = e.nodes_by_op[k];
  }
  d["arena_by_op"] = arena, d["node_bytes_by_op"] = nodes, d["nodes_by_op"] = counts;
  nb::list steps, largest;
  for (const StepBytes& s : e.by_step) steps.append(dict_of({{"step", nb::cast(s.step)}, {"bytes", nb::cast(s.bytes)}, {"nodes", nb::cast(s.nodes)}}));
  for (const NodeBytes& n : e.largest)
    largest.append(dict_of({{"index", nb::cast(n.index)}, {"op", nb::cast(op_name(n.op))}, {"step", nb::cast(n.step)}, {"bytes", nb::cast(n.bytes)}, {"saved_bytes", nb::cast(n.saved_bytes)}, {"shape", nb::cast(n.shape.str())}, {"dtype", nb::cast(dtype_str(n.dtype))}}));
  d["by_step"] = steps, d["largest"] = largest;
  return d;
}

nb::list named(const std::vector<nn::NamedTensor>& v) {
  nb::list l;
  for (const auto& [name, t] : v) l.append(nb::make_tuple(name, wrap(t)));
  return l;
}

// ---------------------------------------------------------------- envs from Python

// An agent::Env whose streams live in Python (segtape.gym: a Gymnasium vector
// env). `py` has observe() -> float32 [B, obs_dim] or int64 [B] tokens, and
// step(int64 actions [B]) -> (float32 reward [B], uint8 done [B], uint8
// success [B]); success counts, for the ended streams, into score().
// Optionally truncations() -> (uint8 truncated [B], final observations)
// (Env::truncations).
// make_env wraps it in the contract checks like any env. Its state is in
// Python, so a checkpoint cannot restore it (segtape.gym keeps none).
class PyEnv final : public agent::Env {
 public:
  PyEnv(nb::object py, agent::EnvSpec spec, int64_t batch, uint64_t seed)
      : Env(batch, seed), py_(std::move(py)), spec_(std::move(spec)) {}
  const agent::EnvSpec& spec() const override { return spec_; }
  void observe(std::span<int64_t> tokens, std::span<float> vectors) const override {
    refuse_at_exit("observe");
    nb::gil_scoped_acquire gil;
    nb::object o = py_.attr("observe")();
    if (spec_.vocab > 0) {
      auto a = as<HostArray<int64_t>>(o, "observe()", "an int64 array of tokens [batch]");
      copy_exact(a, tokens, "observe() tokens");
    } else {
      auto a = as<HostArray<float>>(o, "observe()", "a float32 array [batch, obs_dim]");
      copy_exact(a, vectors, "observe() vectors");
    }
  }
  void step(std::span<const int64_t> actions, std::span<float> reward, std::span<uint8_t> done) override {
    refuse_at_exit("step");
    nb::gil_scoped_acquire gil;
    ++steps_;
    size_t shape[1] = {actions.size()};
    nb::ndarray<nb::numpy, const int64_t> acts(actions.data(), 1, shape, nb::handle());
    nb::tuple r = as<nb::tuple>(py_.attr("step")(acts), "step()", "a tuple (reward, done, success)");
    if (r.size() != 3) throw agent::EnvContractError("env '" + spec_.name + "': step() must return (reward, done, success)");
    copy_exact(as<HostArray<float>>(r[0], "step()'s reward", "a float32 array [batch]"), reward, "step() reward");
    copy_exact(as<HostArray<uint8_t>>(r[1], "step()'s done", "a uint8 array [batch]"), done, "step() done");
    // 255 is the contract check's mark of a done left unwritten (agent/env.cpp),
    // which a Python env cannot leave: it wrote 255, refused as done == 2 is.
    for (size_t b = 0; b < done.size(); ++b)
      if (done[b] == 0xff)
        throw agent::EnvContractError("env '" + spec_.name + "', step " + std::to_string(steps_) + ": step() set done of stream " +
                                      std::to_string(b) + " to 255; done is 0 or 1 (the Env contract: segtape/agent/env.h, docs/agent.md)");
    auto success = as<HostArray<uint8_t>>(r[2], "step()'s success", "a uint8 array [batch]");
    if (success.size() != done.size()) throw agent::EnvContractError("env '" + spec_.name + "': step() success has the wrong size");
    for (size_t b = 0; b < done.size(); ++b)
      if (done[b]) ++score_den_, score_num_ += success.data()[b] ? 1 : 0;
  }
  // `py`'s truncations() -> (uint8 truncated [B], the final observations:
  // int64 tokens [B] or float32 vectors [B, obs_dim]) where it has one;
  // otherwise none truncated (Env's).
  bool truncations(std::span<uint8_t> truncated, std::span<int64_t> tokens, std::span<float> vectors) const override {
    refuse_at_exit("truncations");
    nb::gil_scoped_acquire gil;
    if (!nb::hasattr(py_, "truncations")) return Env::truncations(truncated, tokens, vectors);
    nb::tuple r = as<nb::tuple>(py_.attr("truncations")(), "truncations()", "a tuple (truncated, final observations)");
    if (r.size() != 2) throw agent::EnvContractError("env '" + spec_.name + "': truncations() must return (truncated, final observations)");
    copy_exact(as<HostArray<uint8_t>>(r[0], "truncations()'s truncated", "a uint8 array [batch]"), truncated, "truncations() truncated");
    if (spec_.vocab > 0)
      copy_exact(as<HostArray<int64_t>>(r[1], "truncations()'s final observations", "an int64 array of tokens [batch]"), tokens,
                 "truncations() final tokens");
    else
      copy_exact(as<HostArray<float>>(r[1], "truncations()'s final observations", "a float32 array [batch, obs_dim]"), vectors,
                 "truncations() final vectors");
    return std::any_of(truncated.begin(), truncated.end(), [](uint8_t t) { return t != 0; });
  }

 protected:
  std::vector<int64_t>& state_ints() override { return none_; }
  bool valid_state(std::span<const int64_t> ints) const override { return ints.empty(); }

 private:
  // A running Trainer call stops at the env's next callback once the
  // interpreter exits (ExitGate).
  void refuse_at_exit(const char* call) const {
    if (interpreter_exiting())
      throw InterpreterExiting("env '" + spec_.name + "': " + call + "() not called; the call stepping it stops");
  }
  // What a callback returned, as T, or an error naming the env and what it should have been.
  template <class T>
  T as(nb::handle o, const char* what, const char* expected) const {
    try {
      return nb::cast<T>(o);
    } catch (const std::bad_cast&) {  // (nanobind's cast_error is one)
      throw agent::EnvContractError("env '" + spec_.name + "': " + what + " returned " +
                                    nb::cast<std::string>(nb::str(nb::handle(o.type()).attr("__name__"))) + ", expected " + expected);
    }
  }
  template <class T>
  void copy_exact(const HostArray<T>& a, std::span<T> out, const char* what) const {
    if (a.size() != out.size())
      throw agent::EnvContractError("env '" + spec_.name + "': " + what + " has " + std::to_string(a.size()) +
                                    " values, expected " + std::to_string(out.size()));
    std::copy_n(a.data(), out.size(), out.begin());
  }
  nb::object py_;
  agent::EnvSpec spec_;
  std::vector<int64_t> none_;
  int64_t steps_ = 0;  // step() calls (the contract check's step number, where each passed it)
};

// ---- the ops (segtape/op_list.h). Every op of the list but the Leaf
// (Segment.input) is a function of this module, exported by segtape/__init__.py
// from _ops, the list as (family, kind, name) tuples; python/tests/test_op_list.py
// checks that each one is here. The elementwise ops' functions (and the
// unary ones' Tensor methods) are made from the list; the others are
// written out, each with its own arguments. The Tensor's operators too.
// Each op's docstring (the elementwise ops' functions and methods are made
// from the op list; python/tests/test_docstrings.py requires one for every public name).
const char* op_doc(std::string_view name) {
  static const std::pair<std::string_view, const char*> docs[] = {
      {"add", "a + b, elementwise, with broadcasting of b's rows (recorded on the tape; its gradient flows in backward)."},
      {"sub", "a - b, elementwise, with broadcasting of b's rows."},
      {"mul", "a * b, elementwise, with broadcasting of b's rows."},
      {"div", "a / b, elementwise, with broadcasting of b's rows (a / 0 is inf or nan, as in PyTorch)."},
      {"neg", "-x, elementwise."},
      {"scale", "s * x for a float s, elementwise."},
      {"tanh", "tanh(x), elementwise."},
      {"sigmoid", "1 / (1 + exp(-x)), elementwise."},
      {"relu", "max(x, 0), elementwise (gradient 0 at 0, as PyTorch's)."},
      {"exp", "exp(x), elementwise."},
      {"log", "log(x), elementwise (-inf at 0, nan below)."},
      {"softplus", "log(1 + exp(x)), elementwise (x itself above 20, as torch.nn.functional.softplus)."},
  };
  for (const auto& [n, d] : docs)
    if (n == name) return d;
  return "A segtape op (docs/python.md).";
}

template <class TensorClass>
void bind_ops(nb::module_& m, TensorClass& tensor) {
  nb::list ops;
#define SEGTAPE_OP_ENTRY(Family, Kind, name) ops.append(nb::make_tuple(#Family, #Kind, #name));
  SEGTAPE_NAMED_OPS(SEGTAPE_OP_ENTRY)
#undef SEGTAPE_OP_ENTRY
  m.attr("_ops") = nb::tuple(ops);

#define SEGTAPE_BIND_UNARY(Kind, name, ...)                                       \
  tensor.def(#name, [](const PyTensor& a) { return apply(segtape::name, a); }, op_doc(#name)); \
  m.def(#name, [](const PyTensor& a) { return apply(segtape::name, a); }, op_doc(#name));
  SEGTAPE_UNARY_PLAIN_OPS(SEGTAPE_BIND_UNARY)
#undef SEGTAPE_BIND_UNARY
#define SEGTAPE_BIND_UNARY_SCALAR(Kind, name, ...) \
  m.def(#name, [](const PyTensor& a, double s) { return wrap(segtape::name(a.get(), s), a.box); }, op_doc(#name));
  SEGTAPE_UNARY_SCALAR_OPS(SEGTAPE_BIND_UNARY_SCALAR)
#undef SEGTAPE_BIND_UNARY_SCALAR
#define SEGTAPE_BIND_BINARY(Kind, name, ...) \
  m.def(#name, [](const PyTensor& a, const PyTensor& b) { return apply(segtape::name, a, b); }, op_doc(#name));
  SEGTAPE_BINARY_OPS(SEGTAPE_BIND_BINARY)
#undef SEGTAPE_BIND_BINARY

  // The operators.
  tensor.def("__add__", [](const PyTensor& a, const PyTensor& b) { return apply(segtape::add, a, b); }, nb::is_operator())
      // tensor + 0 and 0 + tensor are the tensor (Python's sum() and the
      // `loss = 0; loss = loss + l` idiom); segtape has no scalar add op, so any
      // other number is a TypeError that says so.
      .def("__add__", [](const PyTensor& a, double s) { return add_scalar(a, s); }, nb::is_operator())
      .def("__radd__", [](const PyTensor& a, double s) { return add_scalar(a, s); }, nb::is_operator())
      .def("__sub__", [](const PyTensor& a, const PyTensor& b) { return apply(segtape::sub, a, b); }, nb::is_operator())
      .def("__mul__", [](const PyTensor& a, const PyTensor& b) { return apply(segtape::mul, a, b); }, nb::is_operator())
      .def("__mul__", [](const PyTensor& a, double s) { return wrap(scale(a.get(), s), a.box); }, nb::is_operator())
      .def("__rmul__", [](const PyTensor& a, double s) { return wrap(scale(a.get(), s), a.box); }, nb::is_operator())
      .def("__truediv__", [](const PyTensor& a, const PyTensor& b) { return apply(segtape::div, a, b); }, nb::is_operator())
      .def("__truediv__", [](const PyTensor& a, double s) {
        // x / 0.0 is x * inf, as in PyTorch (inf, -inf, or nan for 0 / 0).
        const double r = s == 0 ? std::copysign(std::numeric_limits<double>::infinity(), s) : 1.0 / s;
        return wrap(scale(a.get(), r), a.box);
      }, nb::is_operator())
      .def("__neg__", [](const PyTensor& a) { return apply(segtape::neg, a); })
      .def("__matmul__", [](const PyTensor& a, const PyTensor& b) { return wrap(matmul(a.get(), b.get()), a.box); },
           nb::is_operator());

  // The others: methods where the Tensor has them, and the module's functions.
  const auto softmax_fn = [](const PyTensor& a) { return apply(segtape::softmax, a); };
  const auto log_softmax_fn = [](const PyTensor& a) { return apply(segtape::log_softmax, a); };
  const auto sum_fn = [](const PyTensor& a, std::optional<int> axis) {
    return wrap(axis ? segtape::sum(a.get(), *axis) : segtape::sum(a.get()), a.box);
  };
  const auto mean_fn = [](const PyTensor& a, std::optional<int> axis) {
    return wrap(axis ? segtape::mean(a.get(), *axis) : segtape::mean(a.get()), a.box);
  };
  // An axis beyond int: out of range for any tensor, as the op says of one beyond its rank.
  const auto axis_beyond = [](const char* op) {
    return [op](const PyTensor& a, nb::int_ axis) -> PyTensor {
      throw ShapeError(std::string(op) + ": axis " + nb::str(axis).c_str() + " out of range for " + a.get().describe());
    };
  };
  const auto reshape_fn = [](const PyTensor& a, const std::vector<int64_t>& s) {
    return wrap(reshape(a.get(), Shape::of(s, "reshape")), a.box);
  };
  const auto reshape_beyond = [](const PyTensor& a, nb::object s) { return wrap(reshape(a.get(), shape_arg("reshape", s)), a.box); };
  const auto transpose_fn = [](const PyTensor& a) { return apply(segtape::transpose, a); };
  const char* const softmax_doc = "softmax over the last axis (each row sums to 1).";
  const char* const log_softmax_doc = "log(softmax(x)) over the last axis, computed stably.";
  const char* const sum_doc = "The sum of all elements (a 0-d tensor), or along `axis` (removed from the shape); ShapeError for an axis out of range.";
  const char* const mean_doc = "The mean of all elements (a 0-d tensor), or along `axis` (removed from the shape); ShapeError for an axis out of range.";
  const char* const reshape_doc = "The same values in a new shape with as many elements (no copy); ShapeError naming both shapes otherwise.";
  const char* const transpose_doc = "The transpose of a 2-d tensor.";
  const char* const detach_doc = "The same values without history: no gradient flows back through it (torch.detach).";
  tensor.def("softmax", softmax_fn, softmax_doc)
      .def("log_softmax", log_softmax_fn, log_softmax_doc)
      .def("sum", sum_fn, "axis"_a = nb::none(), sum_doc)
      .def("sum", axis_beyond("sum"), "axis"_a)
      .def("mean", mean_fn, "axis"_a = nb::none(), mean_doc)
      .def("mean", axis_beyond("mean"), "axis"_a)
      .def("reshape", reshape_fn, reshape_doc)
      .def("reshape", reshape_beyond)
      .def("t", transpose_fn, transpose_doc)
      .def_prop_ro("T", transpose_fn, transpose_doc)
      .def("detach", [](const PyTensor& a) { return apply(segtape::detach, a); }, detach_doc);
  m.def("softmax", softmax_fn, softmax_doc);
  m.def("log_softmax", log_softmax_fn, log_softmax_doc);
  m.def("sum", sum_fn, "input"_a, "axis"_a = nb::none(), sum_doc);
  m.def("sum", axis_beyond("sum"), "input"_a, "axis"_a);
  m.def("mean", mean_fn, "input"_a, "axis"_a = nb::none(), mean_doc);
  m.def("mean", axis_beyond("mean"), "input"_a, "axis"_a);
  m.def("reshape", reshape_fn, reshape_doc);
  m.def("reshape", reshape_beyond);
  m.def("transpose", transpose_fn, transpose_doc);
  m.def("matmul", [](const PyTensor& a, const PyTensor& b, bool ta, bool tb) { return wrap(matmul(a.get(), b.get(), ta, tb), a.box); },
        "a"_a, "b"_a, "transpose_a"_a = false, "transpose_b"_a = false,
        "a @ b for 2-d tensors, either operand transposed in place of a copy; ShapeError naming both shapes when they do not match.");
  m.def("cross_entropy", [](const PyTensor& logits, const PyTensor& target, const std::string& reduction, int64_t ignore_index) {
    if (reduction != "mean" && reduction != "sum")
      throw ShapeError("cross_entropy: reduction '" + reduction + "': expected 'mean' or 'sum'");
    return wrap(cross_entropy(logits.get(), target.get(), reduction == "sum" ? Reduction::Sum : Reduction::Mean, ignore_index),
                logits.box);
  }, "input"_a, "target"_a, "reduction"_a = "mean", "ignore_index"_a = -100,
        "Cross-entropy of logits [N, C] against int64 class indices [N], as torch.nn.functional.cross_entropy: mean or sum "
        "over the rows whose target is not ignore_index; IndexError naming a target out of [0, C).");
  m.def("mse_loss", [](const PyTensor& a, const PyTensor& b, const std::string& reduction) {
    if (reduction != "mean" && reduction != "sum")
      throw ShapeError("mse_loss: reduction '" + reduction + "': expected 'mean' or 'sum'");
    return wrap(mse_loss(a.get(), b.get(), reduction == "sum" ? Reduction::Sum : Reduction::Mean), a.box);
  }, "input"_a, "target"_a, "reduction"_a = "mean",
        "Mean (or sum) of (input - target)^2 over every element, as torch.nn.functional.mse_loss.");
  m.def("concat", [](const std::vector<PyTensor>& parts, int axis) {
    if (parts.empty()) throw ShapeError("concat: no tensors given");
    std::vector<Tensor> v;
    v.reserve(parts.size());
    for (const PyTensor& p : parts) v.push_back(p.get());
    return wrap(concat(std::span<const Tensor>(v), axis), parts.front().box);
  }, "tensors"_a, "axis"_a = 0, "The tensors joined along `axis` (their other dimensions equal), as torch.cat.");
  m.def("slice", [](const PyTensor& a, int axis, int64_t start, int64_t length) { return wrap(slice(a.get(), axis, start, length), a.box); },
        "input"_a, "axis"_a, "start"_a, "length"_a, "`length` entries of `input` from `start` along `axis` (input.narrow).");
  m.def("embedding", [](const PyTensor& w, const PyTensor& idx) { return apply(segtape::embedding, w, idx); },
        "weight"_a, "indices"_a, "The rows of weight [V, E] at int64 indices [N]: [N, E] (torch.nn.functional.embedding).");
  m.def("gru_cell", [](const PyTensor& x, const PyTensor& h, const PyTensor& wih, const PyTensor& whh,
                       const PyTensor& bih, const PyTensor& bhh, bool recompute) {
    return wrap(gru_cell(x.get(), h.get(), wih.get(), whh.get(), bih.get(), bhh.get(), recompute), x.box);
  }, "x"_a, "h"_a, "weight_ih"_a, "weight_hh"_a, "bias_ih"_a, "bias_hh"_a, "recompute"_a = false,
        "One GRU step, as torch.nn.GRUCell (PyTorch's gate order r, z, n): the new state [B, H]. recompute: keep less for "
        "backward and compute the gates again there.");
  m.def("gru_sequence", [](const PyTensor& x, const PyTensor& h, const PyTensor& wih, const PyTensor& whh,
                           const PyTensor& bih, const PyTensor& bhh, const std::optional<PyTensor>& keep) {
    return wrap(segtape::gru_sequence(x.get(), h.get(), wih.get(), whh.get(), bih.get(), bhh.get(), keep ? keep->get() : Tensor{}),
                x.box);
  }, "x"_a, "h0"_a, "weight_ih"_a, "weight_hh"_a, "bias_ih"_a, "bias_hh"_a, "keep"_a = nb::none(),
        "A GRU over a whole sequence x [T, B, I] from h0 [B, H]: the states [T, B, H] (one op; cuDNN's on a GPU). keep [T, B]: "
        "per step and stream, 0 resets the state before that step.");
  // The fused op on a state [2, B, H] (h and c), or torch.lstm_cell's form: hx = (h, c) -> (h', c').
  m.def("lstm_cell", [](const PyTensor& x, const PyTensor& state, const PyTensor& wih, const PyTensor& whh, const PyTensor& bih,
                        const PyTensor& bhh) {
    return wrap(lstm_cell(x.get(), state.get(), wih.get(), whh.get(), bih.get(), bhh.get()), x.box);
  }, "x"_a, "state"_a, "weight_ih"_a, "weight_hh"_a, "bias_ih"_a, "bias_hh"_a,
        "One LSTM step, as torch.nn.LSTMCell (gate order i, f, g, o), on a state [2, B, H] (h and c; lstm_state makes one), or "
        "on hx = (h, c), returning (h', c').");
  m.def("lstm_cell", [](const PyTensor& x, const std::pair<PyTensor, PyTensor>& hx, const PyTensor& wih, const PyTensor& whh,
                        const PyTensor& bih, const PyTensor& bhh) {
    const LstmPair p = lstm_cell(x.get(), hx.first.get(), hx.second.get(), wih.get(), whh.get(), bih.get(), bhh.get());
    return std::make_pair(wrap(p.h, x.box), wrap(p.c, x.box));
  }, "x"_a, "hx"_a, "weight_ih"_a, "weight_hh"_a, "bias_ih"_a, "bias_hh"_a);
  m.def("lstm_state", [](const PyTensor& h, const PyTensor& c) { return wrap(lstm_state(h.get(), c.get()), h.box); }, "h"_a, "c"_a,
        "The LSTM state [2, B, H] of h and c [B, H] each (lstm_cell's first form).");
  m.def("lstm_h", [](const PyTensor& s) { return wrap(lstm_h(s.get()), s.box); }, "state"_a, "h [B, H] of an LSTM state [2, B, H].");
  m.def("lstm_c", [](const PyTensor& s) { return wrap(lstm_c(s.get()), s.box); }, "state"_a, "c [B, H] of an LSTM state [2, B, H].");
}

}  // namespace

NB_MODULE(_segtape, m) {
  m.doc() = "segtape's C++ library (the segtape package wraps it; see docs/python.md)";
  // At interpreter exit CPython may leave objects that module globals hold
  // (a model, its optimizer) uncollected; nanobind would list them as leaks.
  // Nothing leaks while the interpreter runs (the ASan run of the tests).
  nb::set_leak_warnings(false);
  register_errors(m);
  m.def("_at_exit", &at_exit, "timeout_s"_a,
        "segtape's atexit handler (registered at import): refuses the calls that release the GIL or run Python code "
        "from now on, stops running ones at their next boundary and waits up to timeout_s for them; returns how many "
        "still run.");
  m.attr("SEGMENT_ARENA_POOL") = kSegmentArenaPool;  // OutOfMemoryError.pool of the segment arena
  m.def("cuda_built", &Device::cuda_built, "Whether this build has the CUDA backend (a GPU is still needed).");
  m.def("parse_bytes", [](const std::string& s, const std::string& what) { return agent::parse_bytes(s, what.c_str()); },
        "text"_a, "what"_a = "segment_budget");
  m.def("format_bytes", &format_bytes, "bytes"_a, "A byte count as segtape's messages write it, e.g. '64.0 MiB'.");
  m.def("blas_kernels", &blas_kernels, "OpenBLAS's kernel set in this process, e.g. 'SkylakeX', 'Haswell', 'Prescott'.");
  m.def("packed_kernel", &packed_kernel,
        "segtape's own kernel for the GRU's packed weight products in this process: 'avx512', 'avx2' or 'none' "
        "(set_kernel_options(packed=...) chooses).");
  m.def("kernel_options", [] {
    nb::dict d;
    for (const char* name : {"gemv", "packed", "fused_gru", "fused_gru_grid"}) d[name] = kernels::option_text(name);
    return d;
  }, "segtape's kernel switches (segtape/kernels.h) as a dict: gemv, packed, fused_gru, fused_gru_grid.");
  m.def("set_kernel_options", [](const std::optional<std::string>& gemv, const std::optional<std::string>& packed,
                                 const std::optional<std::string>& fused_gru, const std::optional<std::string>& fused_gru_grid) {
    const kernels::Options before = kernels::options();
    try {  // all or none
      if (gemv) kernels::set_option("gemv", *gemv);
      if (packed) kernels::set_option("packed", *packed);
      if (fused_gru) kernels::set_option("fused_gru", *fused_gru);
      if (fused_gru_grid) kernels::set_option("fused_gru_grid", *fused_gru_grid);
    } catch (...) {
      kernels::set_options(before);
      throw;
    }
  }, "gemv"_a = nb::none(), "packed"_a = nb::none(), "fused_gru"_a = nb::none(), "fused_gru_grid"_a = nb::none(),
        "Sets segtape's kernel switches, process-wide (segtape/kernels.h; those not given stay): gemv 'auto', 'on' or "
        "'off' (CPU products with one row or column through BLAS's GEMV or GEMM); packed 'best', 'avx2' or 'off' (the "
        "GRU's packed weight products); fused_gru 'on' or 'off' (CUDA: gru_sequence's fused kernels, or cuDNN's GRU); "
        "fused_gru_grid 'on' or 'off' (CUDA: also the fused kernels' grid plan where no cluster fits; off by default "
        "until it has run on a GPU).");
  m.def("blas_better_kernels", &blas_better_kernels,
        "'SkylakeX' or 'Haswell' when OpenBLAS fell back to kernels older than AVX2 on a CPU that has it "
        "(and OPENBLAS_CORETYPE was not set); else ''.");
  // Test seam (segtape/emulation.h): Tape(device="cuda") made while it is on
  // gets the host-emulated device, so CI runs the device paths of the bindings.
  m.def("_emulate_cuda_on_host", &emulation::emulate_cuda_on_host, "on"_a);

  // ------------------------------------------------------------ Tensor
  auto tensor = nb::class_<PyTensor>(m, "Tensor", "A handle to values a tape owns (docs/python.md: lifetimes).");
  tensor
      .def_prop_ro("shape", [](const PyTensor& p) { return nb::tuple(nb::cast(dims(p.t))); }, "The tensor's dimensions, as a tuple of ints.")
      .def_prop_ro("dtype", [](const PyTensor& p) { return dtype_str(p.t.dtype); }, "The element type: \"float32\", \"float64\" or \"int64\".")
      .def_prop_ro("ndim", [](const PyTensor& p) { return p.t.rank(); }, "The number of dimensions (0 for a scalar).")
      .def("numel", [](const PyTensor& p) { return p.t.numel(); }, "The number of elements.")
      .def("__len__", [](const PyTensor& p) {
        if (p.t.rank() == 0) throw nb::type_error("len() of a 0-d tensor");
        return p.t.dim(0);
      })
      .def_prop_ro("requires_grad", [](const PyTensor& p) { return p.t.requires_grad; }, "Whether backward computes a gradient for this tensor.")
      .def_prop_ro("space", [](const PyTensor& p) {
        switch (p.t.space) {
          case Space::None: return "none";
          case Space::Persistent: return "persistent";
          case Space::Segment: return "segment";
          case Space::Carry: return "carry";
        }
        return "?";
      }, "Where the data lives: \"persistent\" (parameters), \"segment\" (expires with its segment), \"carry\" (kept for the next segment) or \"none\".")
      .def_prop_ro("is_live", [](const PyTensor& p) { return p.box && p.box->tape && p.t.is_live(); }, "False once the tensor has expired (its segment ended, or its tape is gone): reading it then raises.")
      .def_prop_ro("device", [](const PyTensor& p) { return p.get().tape->device().str(); }, "The device the data lives on, e.g. \"cpu\" or \"cuda:0\".")
      .def_prop_ro("grad", [](const PyTensor& p) -> std::optional<PyTensor> {
        const Tensor& t = p.get();
        if (!t.grad) return std::nullopt;
        return wrap(t.grad_tensor(), p.box);
      }, "The gradient of a parameter (a persistent tensor), None for others.")
      .def("numpy", &numpy_of, "A NumPy array with a copy of the values (valid after the segment ends).")
      // An int64 tensor's item() is a Python int, exact (through a double, 2^53 + 1 came back as 2^53).
      .def("item", [](const PyTensor& p) -> nb::object {
        const Tensor& t = p.get();
        if (t.dtype == DType::I64) {
          (void)t.item();  // its checks: live, one element
          return nb::int_(t.to_host<int64_t>()[0]);  // (on a device too)
        }
        return nb::float_(t.item());
      }, "The value of a one-element tensor: a float (an int for int64); an error for more elements, or while its segment's "
         "values are not yet computed (a CUDA graph segment).")
      .def("__float__", [](const PyTensor& p) { return p.get().item(); })
      .def("_copy_", &copy_from<float>, "values"_a.noconvert())
      .def("_copy_", &copy_from<double>, "values"_a.noconvert())
      .def("_copy_", &copy_from<int64_t>, "values"_a.noconvert())
      .def("__repr__", [](const PyTensor& p) {
        if (!p.t.defined()) return std::string("segtape.Tensor(undefined)");
        if (!p.box || !p.box->tape) return "segtape.Tensor(" + std::string(dtype_name(p.t.dtype)) + p.t.shape.str() + ", tape gone)";
        return "segtape.Tensor(" + p.t.describe() + (p.t.is_live() ? "" : ", expired") + ")";
      })
      .def("describe", [](const PyTensor& p) { return p.get().describe(); },
           "A one-line description: dtype, shape, where its values live (persistent, segment, carry), its segment and step.");
  bind_ops(m, tensor);

  // ------------------------------------------------------------ Tape
  nb::class_<PyTape>(m, "_Tape")
      .def(nb::init<Device, TapeOptions>())
      .def("segment", [](PyTape& t) {
        t.box->open.emplace(t.tape().segment());
        t.box->open_index = t.tape().segment_index();
        return PySegment(t.box, t.box->open_index);
      }, nb::keep_alive<0, 1>())
      .def("_from_f32", [](PyTape& t, const HostArray<float>& a, const std::vector<int64_t>& shape) {
        return wrap(t.tape().from(std::span<const float>(a.data(), a.size()), Shape::of(shape, "tensor")), t.box);
      }, "values"_a.noconvert(), "shape"_a)
      .def("_from_f64", [](PyTape& t, const HostArray<double>& a, const std::vector<int64_t>& shape) {
        return wrap(t.tape().from(std::span<const double>(a.data(), a.size()), Shape::of(shape, "tensor")), t.box);
      }, "values"_a.noconvert(), "shape"_a)
      .def("_from_i64", [](PyTape& t, const HostArray<int64_t>& a, const std::vector<int64_t>& shape) {
        return wrap(t.tape().from(std::span<const int64_t>(a.data(), a.size()), Shape::of(shape, "tensor")), t.box);
      }, "values"_a.noconvert(), "shape"_a)
      .def("zeros", [](PyTape& t, const std::vector<int64_t>& s, const std::string& d) {
        return wrap(t.tape().zeros(Shape::of(s, "zeros"), dtype_from(d)), t.box);
      }, "shape"_a, "dtype"_a = "float32")
      .def("zeros", [](PyTape& t, nb::object s, const std::string& d) { return wrap(t.tape().zeros(shape_arg("zeros", s), dtype_from(d)), t.box); },
           "shape"_a, "dtype"_a = "float32")
      .def("parameter", [](PyTape& t, const std::vector<int64_t>& s, const std::string& d) {
        return wrap(t.tape().parameter(Shape::of(s, "parameter"), dtype_from(d)), t.box);
      }, "shape"_a, "dtype"_a = "float32")
      .def("parameter", [](PyTape& t, nb::object s, const std::string& d) {
        return wrap(t.tape().parameter(shape_arg("parameter", s), dtype_from(d)), t.box);
      }, "shape"_a, "dtype"_a = "float32")
      .def("persistent", [](PyTape& t, const std::vector<int64_t>& s, const std::string& d) {
        return wrap(t.tape().persistent(Shape::of(s, "persistent"), dtype_from(d)), t.box);
      }, "shape"_a, "dtype"_a = "float32")
      .def("persistent", [](PyTape& t, nb::object s, const std::string& d) {
        return wrap(t.tape().persistent(shape_arg("persistent", s), dtype_from(d)), t.box);
      }, "shape"_a, "dtype"_a = "float32")
      .def("next_step", [](PyTape& t) { t.tape().next_step(); })
      .def_prop_ro("step", [](const PyTape& t) { return t.tape().step(); }, "The tape's step counter (next_step() adds one).")
      .def_prop_ro("segment_open", [](const PyTape& t) { return t.tape().segment_open(); }, "Whether a segment is open now.")
      .def_prop_ro("segment_index", [](const PyTape& t) { return t.tape().segment_index(); }, "The number of the open segment, or of the last one.")
      .def_prop_ro("device", [](const PyTape& t) { return t.tape().device().str(); }, "The device this tape records on, e.g. \"cpu\" or \"cuda:0\".")
      .def_prop_ro("segment_budget", [](const PyTape& t) { return t.tape().options().segment_budget; }, "The arena's byte budget for one segment (TapeOptions::segment_budget).")
      .def("stats", [](const PyTape& t) { return to_dict(t.tape().stats()); })
      .def("zero_grad", [](PyTape& t) { t.tape().zero_grad(); })
      .def("synchronize", [](PyTape& t) { t.tape().synchronize(); })
      .def("set_anomaly", [](PyTape& t, bool on) { t.tape().set_anomaly(on); })
      .def("no_grad", [](PyTape& t) { return new PyNoGrad(t.box); }, nb::keep_alive<0, 1>())
      .def("_explain", [](const PyTape& t, size_t top) { return explain(t.tape(), top); }, "top"_a = 10)
      .def("_to_dot", [](const PyTape& t, const std::vector<std::pair<PyTensor, std::string>>& names, uint32_t first,
                         uint32_t last, size_t max_nodes) {
        DotOptions o;
        o.first_step = first, o.last_step = last, o.max_nodes = max_nodes;
        std::unordered_map<const void*, std::string> by_ptr;
        for (const auto& [p, name] : names) by_ptr[p.t.ptr] = name;
        if (!by_ptr.empty())
          o.name_of = [&by_ptr](const void* ptr) {
            auto it = by_ptr.find(ptr);
            return it == by_ptr.end() ? std::string() : it->second;
          };
        return to_dot(t.tape(), o);
      });

  nb::class_<Device>(m, "Device")
      .def_static("cpu", &Device::cpu)
      .def_static("cuda", &Device::cuda, "index"_a = 0)
      .def("__str__", &Device::str);

  nb::class_<TapeOptions>(m, "TapeOptions")
      .def(nb::init<>())
      .def_rw("segment_budget", &TapeOptions::segment_budget)
      .def_rw("grow", &TapeOptions::grow)
      .def_rw("grow_limit", &TapeOptions::grow_limit)
      .def_rw("node_capacity", &TapeOptions::node_capacity)
      .def_rw("anomaly", &TapeOptions::anomaly)
      .def_rw("batch_weight_grads", &TapeOptions::batch_weight_grads)
      .def_rw("device_persistent", &TapeOptions::device_persistent)
      .def_rw("device_carry", &TapeOptions::device_carry)
      .def_rw("device_workspace", &TapeOptions::device_workspace)
      .def_rw("allow_tf32", &TapeOptions::allow_tf32)
      .def_prop_rw(
          "precision", [](const TapeOptions& o) { return std::string(precision_name(o.precision)); },
          [](TapeOptions& o, const std::string& name) {
            const std::optional<Precision> p = parse_precision(name);
            if (!p) throw Error("TapeOptions.precision: '" + name + "' is not a precision (f32 or bf16)");
            o.precision = *p;
          },
          "'f32', or 'bf16': matrix products on bfloat16 operands, rounded to bfloat16 (docs/precision.md)");

  nb::class_<PyNoGrad>(m, "NoGrad")
      .def("__enter__", [](PyNoGrad& g) {
        g.enter();
        return &g;
      }, nb::rv_policy::reference)
      .def("__exit__", [](PyNoGrad& g, nb::handle, nb::handle, nb::handle) { g.exit(); }, nb::arg().none(), nb::arg().none(),
           nb::arg().none());

  nb::class_<Explanation>(m, "Explanation", "Who holds the memory: the open segment's tape by op, step and node.")
      .def("report", &Explanation::report, "max_rows"_a = 8,
           "The explanation as plain text: the segment's arena bytes by op kind and by step, and its largest tensors (max_rows of them).")
      .def("__str__", [](const Explanation& e) { return e.report(); })
      .def("to_dict", [](const Explanation& e) { return to_dict(e); }, "The explanation's figures as a dict (by op kind, by step, the largest nodes).")
      .def("bytes_per_step", &Explanation::bytes_per_step,
           "The least-squares slope of the segment's bytes over its steps: how fast it grows per step (0 for one step).")
      .def_ro("node_bytes", &Explanation::node_bytes, "Bytes of the segment's graph nodes.")
      .def_ro("arena_bytes", &Explanation::arena_bytes, "Bytes of the segment's arena in use (its tensors' data).")
      .def_ro("node_count", &Explanation::node_count, "How many ops the segment recorded.");

  // ------------------------------------------------------------ Segment
  nb::class_<PySegment>(m, "Segment", "One segment of a tape: its tensors expire when it ends.")
      .def("__enter__", [](PySegment& s) -> PySegment& { return s; }, nb::rv_policy::reference)
      .def("__exit__", [](PySegment& s, nb::handle, nb::handle, nb::handle) {
        if (s.box->open && s.box->open_index == s.index) s.box->open.reset();
      }, nb::arg().none(), nb::arg().none(), nb::arg().none())
      .def("end", [](PySegment& s) {
        if (s.box->open && s.box->open_index == s.index) s.box->open.reset();
      }, "Ends the segment (as leaving its `with` block): its arena is reset and its tensors expire; carried ones stay.")
      .def_prop_ro("index", [](const PySegment& s) { return s.index; }, "This segment's number on its tape, in the order the segments opened.")
      .def_prop_ro("open", [](const PySegment& s) { return bool(s.box->open) && s.box->open_index == s.index; }, "True until the segment ends (its `with` block is left, or end() is called).")
      .def("_backward", [](PySegment& s, std::optional<PyTensor> loss, const std::vector<std::pair<PyTensor, PyTensor>>& seeds,
                           bool retain, bool allow_overwritten) {
        Segment& seg = s.get();
        std::vector<Seed> v;
        v.reserve(seeds.size());
        for (const auto& [out, grad] : seeds) v.push_back({out.get(), grad.get()});
        Tensor l = loss ? loss->get() : Tensor{};
        seg.backward(loss ? &l : nullptr, std::span<const Seed>(v),
                     BackwardOptions{.retain_graph = retain, .allow_overwritten = allow_overwritten});
      }, "loss"_a.none(), "seeds"_a, "retain_graph"_a, "allow_overwritten"_a)
      .def("_backward_grad", [](PySegment& s, const PyTensor& out, const PyTensor& grad, bool retain, bool allow_overwritten) {
        s.get().backward(out.get(), grad.get(), BackwardOptions{.retain_graph = retain, .allow_overwritten = allow_overwritten});
      })
      .def("carry", [](PySegment& s, const PyTensor& x) { return wrap(s.get().carry(x.get()), s.box); },
           "The value kept, history cut: valid through the next segment.")
      .def("input", [](PySegment& s, const PyTensor& x) { return wrap(s.get().input(x.get()), s.box); },
           "A leaf of this segment over x's values whose gradient backward keeps (seg.grad).")
      .def("grad", [](PySegment& s, const PyTensor& leaf) { return wrap(s.get().grad(leaf.get()), s.box); },
           "The gradient backward accumulated for an input() leaf.");

  // ------------------------------------------------------------ nn
  nb::module_ nnm = m.def_submodule("nn", "segtape.nn's C++ classes");
  nb::class_<nn::Rng>(nnm, "Rng", "The seeded, portable generator behind initialisation (splitmix64).")
      .def(nb::init<uint64_t>(), "seed"_a = 0)
      .def("__init__", [](nn::Rng*, nb::int_ seed) { int_beyond("segtape.nn.Rng", "seed", seed, "[0, 2^64 - 1]"); }, "seed"_a)
      .def("uniform", nb::overload_cast<>(&nn::Rng::uniform), "The next uniform draw in [0, 1), or in [low, high).")
      .def("uniform", nb::overload_cast<double, double>(&nn::Rng::uniform), "low"_a, "high"_a)
      .def("normal", &nn::Rng::normal, "mean"_a = 0.0, "std"_a = 1.0, "The next normal draw of this mean and standard deviation.")
      .def("next_u64", &nn::Rng::next_u64, "The next 64 random bits, as an int (the generator's counter moves on by one).")
      .def_prop_rw("state", [](const nn::Rng& r) { return std::make_pair(r.state().seed, r.state().counter); },
                   [](nn::Rng& r, std::pair<uint64_t, uint64_t> s) { r.set_state({s.first, s.second}); },
                   "(seed, counter): the whole state of the generator; assigning it back replays the same draws.");

  nb::class_<nn::Module>(nnm, "Module", nb::dynamic_attr(), "The base of every module: parameters with PyTorch's names, children, train/eval mode.")
      .def("__init__", [](nn::Module* self, PyTape& t) { new (self) nn::Module(t.tape()); }, nb::keep_alive<1, 2>())
      .def("_register_module", [](nn::Module& self, const std::string& name, nn::Module& child) {
        self.register_module(name, child);
      }, nb::keep_alive<1, 3>())
      .def("register_parameter", [](nn::Module& self, const std::string& name, const std::vector<int64_t>& shape) {
        return wrap(self.register_parameter(name, Shape::of(shape, "register_parameter")));
      }, "name"_a, "shape"_a, "A zero-filled parameter of this module (fill it with .copy_(array)).")
      .def("named_parameters", [](const nn::Module& self) { return named(self.named_parameters()); },
           "A list of (name, tensor) of this module's parameters and its children's, with PyTorch's dotted names.")
      .def("parameters", [](const nn::Module& self) {
        nb::list l;
        for (const Tensor& t : self.parameters()) l.append(wrap(t));
        return l;
      }, "This module's parameters and its children's, in named_parameters' order.")
      .def("parameter_count", &nn::Module::parameter_count, "The number of parameter elements, children's included.")
      .def("zero_grad", &nn::Module::zero_grad, "Sets every parameter's gradient to zero.")
      // torch.nn.Module's train(mode) / eval(): this module and every one below it; each returns the module.
      .def("train", [](nn::Module& self, bool mode) -> nn::Module& {
        self.train(mode);
        return self;
      }, "mode"_a = true, nb::rv_policy::reference,
           "Training mode (dropout active) for this module and every one below it, or eval mode with mode=False; returns the module.")
      .def("eval", [](nn::Module& self) -> nn::Module& {
        self.eval();
        return self;
      }, nb::rv_policy::reference, "Eval mode (dropout off) for this module and every one below it; returns the module.")
      .def_prop_ro("training", &nn::Module::is_training, "True in training mode (dropout on), False after eval().");

  nb::class_<nn::Linear, nn::Module>(nnm, "Linear")
      .def("__init__", [](nn::Linear* self, PyTape& t, int64_t in, int64_t out, bool bias, nn::Rng& rng) {
        new (self) nn::Linear(t.tape(), rng, in, out, bias);
      }, "tape"_a, "in_features"_a, "out_features"_a, "bias"_a = true, "rng"_a, nb::keep_alive<1, 2>())
      .def("forward", [](const nn::Linear& l, const PyTensor& x) { return wrap(l(x.get()), x.box); })
      .def("__call__", [](const nn::Linear& l, const PyTensor& x) { return wrap(l(x.get()), x.box); })
      .def_ro("in_features", &nn::Linear::in_features)
      .def_ro("out_features", &nn::Linear::out_features)
      .def_prop_ro("weight", [](const nn::Linear& l) { return wrap(l.weight); })
      .def_prop_ro("bias", [](const nn::Linear& l) -> std::optional<PyTensor> {
        if (!l.bias.defined()) return std::nullopt;
        return wrap(l.bias);
      });

  nb::class_<nn::Embedding, nn::Module>(nnm, "Embedding")
      .def("__init__", [](nn::Embedding* self, PyTape& t, int64_t num, int64_t dim, nn::Rng& rng) {
        new (self) nn::Embedding(t.tape(), rng, num, dim);
      }, "tape"_a, "num_embeddings"_a, "embedding_dim"_a, "rng"_a, nb::keep_alive<1, 2>())
      .def("forward", [](const nn::Embedding& e, const PyTensor& i) { return wrap(e(i.get()), i.box); })
      .def("__call__", [](const nn::Embedding& e, const PyTensor& i) { return wrap(e(i.get()), i.box); })
      .def_ro("num_embeddings", &nn::Embedding::num_embeddings)
      .def_ro("embedding_dim", &nn::Embedding::embedding_dim)
      .def_prop_ro("weight", [](const nn::Embedding& e) { return wrap(e.weight); });

  // A host mask of `shape` drawn by f (Dropout::mask, LSTM/GRU::dropout_masks) as a NumPy array of dtype d.
  auto host_mask = [](const std::vector<int64_t>& shape, DType d, auto&& f) -> nb::object {
    size_t n = 1;
    for (int64_t v : shape) {
      if (v < 0) throw ShapeError("mask: negative size in the shape");
      n *= size_t(v);
    }
    std::vector<size_t> dims(shape.begin(), shape.end());
    auto make = [&]<class T>() {
      auto* v = new std::vector<T>(n);
      nb::capsule owner(v, [](void* q) noexcept { delete static_cast<std::vector<T>*>(q); });
      f(std::span<T>(*v));
      return nb::cast(nb::ndarray<nb::numpy, T>(v->data(), dims.size(), dims.data(), owner));
    };
    return d == DType::F64 ? make.template operator()<double>() : make.template operator()<float>();
  };
  auto gru_cell_forward = [](const nn::GRUCell& g, const PyTensor& x, std::optional<PyTensor> h) {
    return wrap(g(x.get(), h ? h->get() : Tensor{}), x.box);
  };
  nb::class_<nn::GRUCell, nn::Module>(nnm, "GRUCell")
      .def("__init__", [](nn::GRUCell* self, PyTape& t, int64_t in, int64_t hidden, bool bias, nn::Rng& rng) {
        new (self) nn::GRUCell(t.tape(), rng, in, hidden, bias);
      }, "tape"_a, "input_size"_a, "hidden_size"_a, "bias"_a = true, "rng"_a, nb::keep_alive<1, 2>())
      .def("forward", gru_cell_forward, "input"_a, "hx"_a = nb::none())
      .def("__call__", gru_cell_forward, "input"_a, "hx"_a = nb::none())
      .def_ro("input_size", &nn::GRUCell::input_size)
      .def_ro("hidden_size", &nn::GRUCell::hidden_size)
      .def_prop_ro("weight_ih", [](const nn::GRUCell& g) { return wrap(g.weight_ih); })
      .def_prop_ro("weight_hh", [](const nn::GRUCell& g) { return wrap(g.weight_hh); })
      // None without bias (as nn.Linear's bias and PyTorch's): the zeros the
      // fused op takes then are no parameter, and writing them changed the cell.
      .def_prop_ro("bias_ih", [](const nn::GRUCell& g) -> std::optional<PyTensor> {
        if (!g.bias_ih.grad) return std::nullopt;
        return wrap(g.bias_ih);
      })
      .def_prop_ro("bias_hh", [](const nn::GRUCell& g) -> std::optional<PyTensor> {
        if (!g.bias_hh.grad) return std::nullopt;
        return wrap(g.bias_hh);
      });

  auto gru_forward = [](nn::GRU& g, const PyTensor& x, std::optional<PyTensor> h, std::optional<PyTensor> keep,
                        std::optional<PyTensor> masks) {
    auto out = g(x.get(), h ? h->get() : Tensor{}, keep ? keep->get() : Tensor{}, masks ? masks->get() : Tensor{});
    return std::make_pair(wrap(out.output, x.box), wrap(out.h_n, x.box));
  };
  nb::class_<nn::GRU, nn::Module>(nnm, "GRU")
      .def("__init__", [](nn::GRU* self, PyTape& t, int64_t in, int64_t hidden, int64_t layers, bool bias, double dropout,
                          uint64_t dropout_seed, nn::Rng& rng) {
        new (self) nn::GRU(t.tape(), rng, in, hidden, layers, bias, DType::F32, dropout, dropout_seed);
      }, "tape"_a, "input_size"_a, "hidden_size"_a, "num_layers"_a = 1, "bias"_a = true, "dropout"_a = 0.0, "dropout_seed"_a = 0,
      "rng"_a, nb::keep_alive<1, 2>())
      .def("forward", gru_forward, "input"_a, "hx"_a = nb::none(), "keep"_a = nb::none(), "dropout_masks"_a = nb::none())
      .def("__call__", gru_forward, "input"_a, "hx"_a = nb::none(), "keep"_a = nb::none(), "dropout_masks"_a = nb::none())
      .def("dropout_masks", [host_mask](nn::GRU& g, int64_t steps, int64_t batch) {
        return host_mask({g.num_layers - 1, steps, batch, g.hidden_size}, g.dtype(), [&](auto v) { g.dropout_masks(v); });
      }, "steps"_a, "batch"_a, "The masks of the dropout between layers for one forward, [num_layers - 1, T, B, H] (ones in eval mode).")
      .def_prop_ro("dropout_rng", [](nn::GRU& g) -> nn::Rng& { return g.dropout_rng(); }, nb::rv_policy::reference_internal)
      .def_ro("input_size", &nn::GRU::input_size)
      .def_ro("hidden_size", &nn::GRU::hidden_size)
      .def_ro("num_layers", &nn::GRU::num_layers)
      .def_ro("dropout", &nn::GRU::dropout);

  nb::class_<nn::Dropout, nn::Module>(nnm, "Dropout")
      .def("__init__", [](nn::Dropout* self, PyTape& t, double p, uint64_t seed) { new (self) nn::Dropout(t.tape(), p, seed); },
           "tape"_a, "p"_a = 0.5, "seed"_a = 0, nb::keep_alive<1, 2>())
      .def("forward", [](nn::Dropout& d, const PyTensor& x) { return wrap(d(x.get()), x.box); })
      .def("__call__", [](nn::Dropout& d, const PyTensor& x) { return wrap(d(x.get()), x.box); })
      .def("mask", [host_mask](nn::Dropout& d, const std::vector<int64_t>& shape, const std::string& dtype) {
        if (dtype != "float32" && dtype != "float64") throw ShapeError("Dropout.mask: dtype '" + dtype + "': expected 'float32' or 'float64'");
        return host_mask(shape, dtype == "float64" ? DType::F64 : DType::F32, [&](auto v) { d.mask(v); });
      }, "shape"_a, "dtype"_a = "float32", "A mask of this shape drawn now (ones in eval mode), as a NumPy array: a step's input.")
      .def("apply", [](const nn::Dropout& d, const PyTensor& x, const PyTensor& m) { return wrap(d.apply(x.get(), m.get()), x.box); },
           "input"_a, "mask"_a)
      .def_prop_ro("p", &nn::Dropout::p)
      .def_prop_ro("rng", [](nn::Dropout& d) -> nn::Rng& { return d.rng(); }, nb::rv_policy::reference_internal);

  auto lstm_cell_forward = [](const nn::LSTMCell& l, const PyTensor& x, std::optional<std::pair<PyTensor, PyTensor>> hx) {
    const Tensor& xt = x.get();
    LstmPair p;
    if (hx) {
      p = l(xt, hx->first.get(), hx->second.get());
    } else {  // zeros: the state [2, B, H] form
      const Tensor s = l(xt);
      p = {lstm_h(s), lstm_c(s)};
    }
    return std::make_pair(wrap(p.h, x.box), wrap(p.c, x.box));
  };
  nb::class_<nn::LSTMCell, nn::Module>(nnm, "LSTMCell")
      .def("__init__", [](nn::LSTMCell* self, PyTape& t, int64_t in, int64_t hidden, bool bias, nn::Rng& rng) {
        new (self) nn::LSTMCell(t.tape(), rng, in, hidden, bias);
      }, "tape"_a, "input_size"_a, "hidden_size"_a, "bias"_a = true, "rng"_a, nb::keep_alive<1, 2>())
      .def("forward", lstm_cell_forward, "input"_a, "hx"_a = nb::none())
      .def("__call__", lstm_cell_forward, "input"_a, "hx"_a = nb::none())
      .def_ro("input_size", &nn::LSTMCell::input_size)
      .def_ro("hidden_size", &nn::LSTMCell::hidden_size)
      .def_prop_ro("weight_ih", [](const nn::LSTMCell& l) { return wrap(l.weight_ih); })
      .def_prop_ro("weight_hh", [](const nn::LSTMCell& l) { return wrap(l.weight_hh); })
      .def_prop_ro("bias_ih", [](const nn::LSTMCell& l) -> std::optional<PyTensor> {
        if (!l.bias_ih.grad) return std::nullopt;
        return wrap(l.bias_ih);
      })
      .def_prop_ro("bias_hh", [](const nn::LSTMCell& l) -> std::optional<PyTensor> {
        if (!l.bias_hh.grad) return std::nullopt;
        return wrap(l.bias_hh);
      });

  auto opt_tensor = [](const std::optional<PyTensor>& t) { return t ? t->get() : Tensor{}; };
  auto lstm_forward = [opt_tensor](nn::LSTM& l, const PyTensor& x, std::optional<std::pair<PyTensor, PyTensor>> hx,
                                   std::optional<PyTensor> masks) {
    auto out = hx ? l(x.get(), hx->first.get(), hx->second.get(), opt_tensor(masks)) : l(x.get(), {}, {}, opt_tensor(masks));
    return std::make_pair(wrap(out.output, x.box), std::make_pair(wrap(out.h_n, x.box), wrap(out.c_n, x.box)));
  };
  nb::class_<nn::LSTM, nn::Module>(nnm, "LSTM")
      .def("__init__", [](nn::LSTM* self, PyTape& t, int64_t in, int64_t hidden, int64_t layers, bool bias, double dropout,
                          uint64_t dropout_seed, nn::Rng& rng) {
        new (self) nn::LSTM(t.tape(), rng, in, hidden, layers, bias, DType::F32, dropout, dropout_seed);
      }, "tape"_a, "input_size"_a, "hidden_size"_a, "num_layers"_a = 1, "bias"_a = true, "dropout"_a = 0.0, "dropout_seed"_a = 0,
      "rng"_a, nb::keep_alive<1, 2>())
      .def("forward", lstm_forward, "input"_a, "hx"_a = nb::none(), "dropout_masks"_a = nb::none())
      .def("__call__", lstm_forward, "input"_a, "hx"_a = nb::none(), "dropout_masks"_a = nb::none())
      .def("dropout_masks", [host_mask](nn::LSTM& l, int64_t steps, int64_t batch) {
        return host_mask({l.num_layers - 1, steps, batch, l.hidden_size}, l.dtype(), [&](auto v) { l.dropout_masks(v); });
      }, "steps"_a, "batch"_a, "The masks of the dropout between layers for one forward, [num_layers - 1, T, B, H] (ones in eval mode).")
      .def_prop_ro("dropout_rng", [](nn::LSTM& l) -> nn::Rng& { return l.dropout_rng(); }, nb::rv_policy::reference_internal)
      .def_ro("input_size", &nn::LSTM::input_size)
      .def_ro("hidden_size", &nn::LSTM::hidden_size)
      .def_ro("num_layers", &nn::LSTM::num_layers)
      .def_ro("dropout", &nn::LSTM::dropout);

  nb::class_<nn::Optimizer>(nnm, "Optimizer", "The base of SGD, Adam and AdamW: an update of a module's parameters from their gradients.")
      .def("step", &nn::Optimizer::step, "One update of every parameter from its gradient (after backward).")
      .def("zero_grad", &nn::Optimizer::zero_grad, "Sets the module's parameters' gradients to zero.")
      .def_prop_ro("kind", &nn::Optimizer::kind, "The optimizer's name: \"SGD\", \"Adam\" or \"AdamW\".")
      .def_prop_ro("step_count", &nn::Optimizer::step_count, "How many steps this optimizer has taken (Adam's bias correction counts from it).")
      .def("state", [](const nn::Optimizer& o) { return named(o.state()); },
           "The optimizer's state tensors as (name, tensor) pairs (e.g. Adam's moments), with PyTorch's names.");
  nb::class_<nn::SGD, nn::Optimizer>(nnm, "SGD", "torch.optim.SGD: lr, momentum, dampening, weight decay, Nesterov.")
      .def("__init__", [](nn::SGD* self, const nn::Module& mod, double lr, double momentum, double dampening,
                          double weight_decay, bool nesterov) {
        new (self) nn::SGD(mod, nn::SGDOptions{.lr = lr, .momentum = momentum, .dampening = dampening,
                                               .weight_decay = weight_decay, .nesterov = nesterov});
      }, "module"_a, "lr"_a, "momentum"_a = 0.0, "dampening"_a = 0.0, "weight_decay"_a = 0.0, "nesterov"_a = false,
      nb::keep_alive<1, 2>())
      .def_prop_rw("lr", [](nn::SGD& o) { return o.options().lr; }, [](nn::SGD& o, double v) { o.options().lr = v; },
                   "The learning rate; assigning it takes effect at the next step().");
  auto adam_like = [](auto* self, const nn::Module& mod, double lr, std::pair<double, double> betas, double eps,
                      double weight_decay, bool capturable) {
    using T = std::remove_pointer_t<decltype(self)>;
    using O = std::conditional_t<std::is_same_v<T, nn::AdamW>, nn::AdamWOptions, nn::AdamOptions>;
    O o;
    o.lr = lr, o.beta1 = betas.first, o.beta2 = betas.second, o.eps = eps, o.weight_decay = weight_decay;
    o.capturable = capturable;
    new (self) T(mod, o);
  };
  nb::class_<nn::Adam, nn::Optimizer>(nnm, "Adam",
                                      "torch.optim.Adam (L2 weight decay). capturable: the step count on the device, for CUDA graphs.")
      .def("__init__", [adam_like](nn::Adam* self, const nn::Module& mod, double lr, std::pair<double, double> betas,
                                   double eps, double wd, bool capturable) { adam_like(self, mod, lr, betas, eps, wd, capturable); },
           "module"_a, "lr"_a = 1e-3, "betas"_a = std::make_pair(0.9, 0.999), "eps"_a = 1e-8, "weight_decay"_a = 0.0,
           "capturable"_a = false, nb::keep_alive<1, 2>())
      .def_prop_rw("lr", [](nn::Adam& o) { return o.options().lr; }, [](nn::Adam& o, double v) { o.options().lr = v; },
                   "The learning rate; assigning it takes effect at the next step().");
  nb::class_<nn::AdamW, nn::Adam>(nnm, "AdamW", "torch.optim.AdamW (decoupled weight decay, default 1e-2).")
      .def("__init__", [adam_like](nn::AdamW* self, const nn::Module& mod, double lr, std::pair<double, double> betas,
                                   double eps, double wd, bool capturable) { adam_like(self, mod, lr, betas, eps, wd, capturable); },
           "module"_a, "lr"_a = 1e-3, "betas"_a = std::make_pair(0.9, 0.999), "eps"_a = 1e-8, "weight_decay"_a = 1e-2,
           "capturable"_a = false, nb::keep_alive<1, 2>());

  // With total_sq (a persistent float64 [1] tensor), the capturable form: the
  // norm's square stays there and None is returned (nothing reaches the host).
  nnm.def("clip_grad_norm", [](const nn::Module& mod, double max_norm, std::optional<PyTensor> total_sq) -> nb::object {
    if (!total_sq) return nb::cast(nn::clip_grad_norm(mod, max_norm));
    nn::clip_grad_norm(mod, max_norm, total_sq->get());
    return nb::none();
  }, "module"_a, "max_norm"_a, "total_sq"_a = nb::none(),
          "Scales the module's gradients so that their global L2 norm is at most max_norm, as torch.nn.utils.clip_grad_norm_; "
          "returns the norm before clipping (with total_sq, a persistent float64 [1] tensor, it stays there and None is returned).");
  nnm.def("save", [](const nn::Module& mod, const std::filesystem::path& path, const nn::Metadata& meta) { nn::save(mod, path, meta); },
          "module"_a, "path"_a, "metadata"_a = nn::Metadata{});
  nnm.def("load", [](nn::Module& mod, const std::filesystem::path& path, bool strict) {
    nn::LoadReport r = nn::load(mod, path, strict);
    return dict_of({{"missing_keys", nb::cast(r.missing_keys)}, {"unexpected_keys", nb::cast(r.unexpected_keys)}, {"metadata", nb::cast(r.metadata)}});
  }, "module"_a, "path"_a, "strict"_a = true);

  // ------------------------------------------------------------ retention lab
  namespace rt = agent::retention;
  nb::module_ lab = m.def_submodule("retention", "the retention lab's C++ side");
  nb::class_<rt::LabConfig>(lab, "LabConfig")
      .def(nb::init<>())
      .def_rw("steps", &rt::LabConfig::steps)
      .def_rw("batch", &rt::LabConfig::batch)
      .def_rw("vocab", &rt::LabConfig::vocab)
      .def_rw("embed", &rt::LabConfig::embed)
      .def_rw("hidden", &rt::LabConfig::hidden)
      .def_rw("lag", &rt::LabConfig::lag)
      .def_rw("k", &rt::LabConfig::k)
      .def_rw("window", &rt::LabConfig::window)
      .def_rw("trainer_k", &rt::LabConfig::trainer_k)
      .def_rw("lr", &rt::LabConfig::lr)
      .def_rw("clip", &rt::LabConfig::clip)
      .def_rw("budget", &rt::LabConfig::budget)
      .def_rw("seed", &rt::LabConfig::seed)
      .def_rw("device", &rt::LabConfig::device)
      .def("validate", &rt::LabConfig::validate);
  lab.def("case_labels", [](const rt::LabConfig& c) { return rt::case_names(c); }, "config"_a,
          "The cases as the table labels them for this config, one string (\"1 hidden-not-detached, ..., tbptt:8, ...\").");
  lab.def("cases", []() {
    nb::list l;
    for (const rt::CaseInfo& i : rt::cases())
      l.append(dict_of({{"name", nb::cast(i.name)}, {"pitfall", nb::cast(i.pitfall)}, {"backward_every_step", nb::cast(i.backward_every_step)}, {"summary", nb::cast(i.summary)}, {"remedy", nb::cast(i.remedy)}}));
    return l;
  });
  // Runs the lab on segtape (LibTorch's side is Python's torch: segtape.retention).
  // Returns the JSON summary, the CSV of every row, the SVG figure and the table.
  lab.def("run_lab", [](rt::LabConfig cfg, const std::vector<std::string>& which, bool measure_anomaly) {
    cfg.budget_name = "segtape.retention.run(budget=...)";
    std::vector<rt::Case> cases;
    for (const std::string& w : which) cases.push_back(rt::parse_case(w, cfg));
    rt::LabHooks hooks;
    hooks.measure_anomaly = measure_anomaly;
    // Ctrl-C: the lab runs without the GIL, so Python's signal handlers run
    // only here, between its steps; their exception (KeyboardInterrupt) is
    // kept and raised once the lab has unwound.
    const ExitGuard running("retention.run");
    std::optional<nb::python_error> stopped;
    bool exiting = false;
    hooks.interrupted = [&stopped, &exiting] {
      if (interpreter_exiting()) return exiting = true;  // (asked without the GIL)
      nb::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() == 0) return false;
      stopped.emplace();  // takes the exception, leaving none set
      return true;
    };
    rt::LabReport r;
    try {
      nb::gil_scoped_release release;
      r = rt::run_lab(cfg, cases, nullptr, hooks);
    } catch (const rt::Interrupted&) {
      if (stopped) throw *stopped;
      if (exiting) throw InterpreterExiting("retention.run stopped");
      throw;
    }
    return dict_of({{"json", nb::cast(rt::to_json(r))}, {"csv", nb::cast(rt::to_csv(r))}, {"svg", nb::cast(rt::to_svg(r))}, {"table", nb::cast(rt::table(r))}});
  }, "config"_a, "cases"_a, "measure_anomaly"_a = false);
  lab.def("tape_dot", [](const std::string& c, const rt::LabConfig& cfg) { return rt::tape_dot(rt::parse_case(c, cfg), cfg); },
          "case"_a, "config"_a);

  // ------------------------------------------------------------ agent (segtape.gym)
  nb::module_ ag = m.def_submodule("agent", "the agent's C++ side: envs from Python, the Trainer");
  // Registers a Python env factory under `name`: factory(batch, seed) returns
  // an object with observe() and step() (PyEnv above).
  // The factory stays in Python (segtape.gym._factories[name]): the C++
  // registry outlives the interpreter and must hold no Python object.
  ag.def("register_python_env", [](const std::string& name, int64_t obs_dim, int64_t vocab, int64_t num_actions,
                                   const std::string& measure) {
    agent::EnvSpec spec{.name = name, .vocab = vocab, .obs_dim = obs_dim, .num_actions = num_actions,
                        .supervised = false, .measure = measure};
    agent::register_env(name, [spec](int64_t batch, uint64_t seed, const agent::EnvOptions&) {
      nb::gil_scoped_acquire gil;
      nb::object factory = nb::module_::import_("segtape.gym").attr("_factories")[spec.name.c_str()];
      return std::unique_ptr<agent::Env>(new PyEnv(factory(batch, seed), spec, batch, seed));
    });
  }, "name"_a, "obs_dim"_a, "vocab"_a, "num_actions"_a, "measure"_a = "success");
  ag.def("env_names", &agent::env_names);
  // A built-in env, stepped from Python (segtape.gym exposes it as a Gymnasium env).
  nb::class_<agent::Env>(ag, "Env")
      .def_prop_ro("name", [](const agent::Env& e) { return e.spec().name; })
      .def_prop_ro("vocab", [](const agent::Env& e) { return e.spec().vocab; })
      .def_prop_ro("obs_dim", [](const agent::Env& e) { return e.spec().obs_dim; })
      .def_prop_ro("num_actions", [](const agent::Env& e) { return e.spec().num_actions; })
      .def_prop_ro("supervised", [](const agent::Env& e) { return e.spec().supervised; })
      .def_prop_ro("batch", &agent::Env::batch)
      .def("observe", [](const agent::Env& e) {
        const ExitGuard running("Env.observe");  // (a Python env's: Python code)
        const auto& sp = e.spec();
        std::vector<int64_t> tokens(size_t(e.batch()));
        std::vector<float> vectors(size_t(e.batch() * std::max<int64_t>(sp.obs_dim, 0)));
        e.observe(tokens, vectors);
        return std::make_pair(tokens, vectors);
      })
      .def("step", [](agent::Env& e, const std::vector<int64_t>& actions) {
        const ExitGuard running("Env.step");
        std::vector<float> reward(size_t(e.batch()));
        std::vector<uint8_t> done(size_t(e.batch()));
        if (actions.size() != size_t(e.batch()))
          throw ShapeError("env.step: " + std::to_string(actions.size()) + " actions for " + std::to_string(e.batch()) + " streams");
        e.step(actions, reward, done);
        return std::make_pair(reward, std::vector<int>(done.begin(), done.end()));
      })
      // After step: (truncated [B], final tokens [B], final vectors [B x obs_dim]) (Env::truncations).
      .def("truncations", [](const agent::Env& e) {
        const ExitGuard running("Env.truncations");
        const auto& sp = e.spec();
        std::vector<uint8_t> truncated(size_t(e.batch()));
        std::vector<int64_t> tokens(size_t(e.batch()));
        std::vector<float> vectors(size_t(e.batch() * std::max<int64_t>(sp.obs_dim, 0)));
        (void)e.truncations(truncated, tokens, vectors);
        return std::make_tuple(std::vector<int>(truncated.begin(), truncated.end()), tokens, vectors);
      })
      .def("score", &agent::Env::score);
  ag.def("make_env", [](const std::string& name, int64_t batch, uint64_t seed, int64_t lag, int64_t vocab, int64_t corridor,
                        bool sparse) {
    const ExitGuard running("make_env");  // (a Python env's factory)
    agent::EnvOptions o;
    o.lag = lag, o.vocab = vocab, o.corridor = corridor, o.sparse = sparse;
    return agent::make_env(name, batch, seed, o);
  }, "name"_a, "batch"_a, "seed"_a, "lag"_a = 8, "vocab"_a = 4, "corridor"_a = 10, "sparse"_a = false);

  nb::class_<agent::TrainConfig>(ag, "TrainConfig")
      .def(nb::init<>())
      .def_rw("env", &agent::TrainConfig::env)
      .def_prop_rw("history", [](const agent::TrainConfig& c) { return c.history.str(); },
                   [](agent::TrainConfig& c, const std::string& h) { c.history = agent::History::parse(h); })
      .def_rw("steps", &agent::TrainConfig::steps)
      .def_rw("batch", &agent::TrainConfig::batch)
      .def_rw("hidden", &agent::TrainConfig::hidden)
      .def_rw("embed", &agent::TrainConfig::embed)
      .def_rw("update_bias", &agent::TrainConfig::update_bias)
      // recall's settings (EnvOptions)
      .def_prop_rw("lag", [](const agent::TrainConfig& c) { return c.env_options.lag; },
                   [](agent::TrainConfig& c, int64_t v) { c.env_options.lag = v; })
      .def_prop_rw("vocab", [](const agent::TrainConfig& c) { return c.env_options.vocab; },
                   [](agent::TrainConfig& c, int64_t v) { c.env_options.vocab = v; })
      .def_prop_rw("sparse", [](const agent::TrainConfig& c) { return c.env_options.sparse; },
                   [](agent::TrainConfig& c, bool v) { c.env_options.sparse = v; })
      .def_rw("lr", &agent::TrainConfig::lr)
      .def_rw("clip", &agent::TrainConfig::clip)
      .def_rw("nonfinite", &agent::TrainConfig::nonfinite)
      .def_rw("size_check", &agent::TrainConfig::size_check)
      .def_rw("max_skips", &agent::TrainConfig::max_skips)
      .def_rw("seed", &agent::TrainConfig::seed)
      .def_rw("device", &agent::TrainConfig::device)
      .def_rw("budget", &agent::TrainConfig::budget)
      .def_rw("gamma", &agent::TrainConfig::gamma)
      .def_rw("entropy", &agent::TrainConfig::entropy)
      .def_rw("value_coef", &agent::TrainConfig::value_coef)
      .def_prop_rw("algo", [](const agent::TrainConfig& c) { return std::string(agent::algo_name(c.algo)); },
                   [](agent::TrainConfig& c, const std::string& a) { c.algo = agent::parse_algo(a); })
      .def_rw("rollout", &agent::TrainConfig::rollout)
      .def_rw("epochs", &agent::TrainConfig::epochs)
      .def_rw("minibatches", &agent::TrainConfig::minibatches)
      .def_rw("clip_range", &agent::TrainConfig::clip_range)
      .def_rw("gae_lambda", &agent::TrainConfig::gae_lambda)
      .def_rw("lr_schedule", &agent::TrainConfig::lr_schedule)
      .def_rw("clip_schedule", &agent::TrainConfig::clip_schedule)
      .def_rw("value_clip", &agent::TrainConfig::value_clip)
      .def_rw("env_shards", &agent::TrainConfig::env_shards)
      .def_rw("graph_replay", &agent::TrainConfig::graph_replay)
      .def_rw("device_loop", &agent::TrainConfig::device_loop)
      .def_rw("precision", &agent::TrainConfig::precision)
      // --task lm / series: the files and their reading (EnvOptions), the model
#define SEGTAPE_OPTION(name, type)                                                          \
  .def_prop_rw(#name, [](const agent::TrainConfig& c) { return c.env_options.name; }, \
               [](agent::TrainConfig& c, type v) { c.env_options.name = std::move(v); })
      SEGTAPE_OPTION(data, std::string) SEGTAPE_OPTION(valid, std::string) SEGTAPE_OPTION(test, std::string)
      SEGTAPE_OPTION(tokens, std::string) SEGTAPE_OPTION(split, double) SEGTAPE_OPTION(target, std::string)
      SEGTAPE_OPTION(features, std::string)
#undef SEGTAPE_OPTION
      .def_rw("cell", &agent::TrainConfig::cell)
      .def_rw("critic", &agent::TrainConfig::critic)
      .def_rw("head_hidden", &agent::TrainConfig::head_hidden)
      .def_rw("ortho_init", &agent::TrainConfig::ortho_init)
      .def_rw("adam_eps", &agent::TrainConfig::adam_eps)
      .def_rw("encoder", &agent::TrainConfig::encoder)
      .def_rw("layers", &agent::TrainConfig::layers)
      .def_rw("dropout", &agent::TrainConfig::dropout)
      .def_rw("tied", &agent::TrainConfig::tied)
      .def_rw("optim", &agent::TrainConfig::optim)
      .def("validate", &agent::TrainConfig::validate);
  ag.def("corpus", [](const std::string& data, const std::string& valid, const std::string& test, const std::string& tokens,
                      double split) {
    const std::shared_ptr<const agent::Corpus> c = agent::load_corpus(data, valid, test, agent::parse_tokens(tokens), split);
    std::vector<std::string> vocab;
    for (int64_t i = 0; i < c->vocab.size(); ++i) vocab.push_back(c->vocab.text(i));
    const auto ids = [](const std::vector<int32_t>& v) {
      int32_t* copy = new int32_t[std::max<size_t>(v.size(), 1)];
      std::copy(v.begin(), v.end(), copy);
      nb::capsule owner(copy, [](void* p) noexcept { delete[] static_cast<int32_t*>(p); });
      return nb::ndarray<nb::numpy, int32_t, nb::ndim<1>>(copy, {v.size()}, owner);
    };
    return nb::make_tuple(vocab, ids(c->train), ids(c->valid), ids(c->test));
  }, "data"_a, "valid"_a = "", "test"_a = "", "tokens"_a = "chars", "split"_a = 0.1,
     "A text's token ids as `segtape train --task lm` reads it: (vocabulary texts by id, train, valid, test ids as int32 arrays).");
  ag.def("sample", [](const std::filesystem::path& checkpoint, const std::string& prompt, int64_t length, double temperature,
                      uint64_t seed) {
    std::string text;
    agent::sample(checkpoint, {.prompt = prompt, .length = length, .temperature = temperature, .seed = seed},
                  [&](std::string_view t) { text += t; });
    return text;
  }, "checkpoint"_a, "prompt"_a = "", "length"_a = 500, "temperature"_a = 1.0, "seed"_a = 1,
     "The text a language-model checkpoint writes after the prompt (segtape sample): the prompt, then `length` tokens.");
  nb::class_<agent::Trainer>(ag, "Trainer")
      .def("__init__", [](agent::Trainer* self, const agent::TrainConfig& c, dist::Communicator* comm) {
        const ExitGuard running("Trainer()");  // (a Python env's factory)
        new (self) agent::Trainer(c, comm);
      }, "config"_a, "comm"_a.none() = nullptr, nb::keep_alive<1, 3>(),
           "With a communicator of several ranks: one rank of a data-parallel run (docs/distributed.md).")
      .def_prop_ro("rank", &agent::Trainer::rank, "This process's rank, from 0.")
      .def_prop_ro("ranks", &agent::Trainer::ranks, "How many ranks the run has (1 without a communicator).")
      .def("load", [](agent::Trainer& t, const std::filesystem::path& path) { t.load(path); })
      .def("parameters", [](agent::Trainer& t) {
        nb::list l;
        for (const Tensor& p : t.policy().parameters()) l.append(to_numpy<float>(p));
        return l;
      }, "Copies of the policy's parameters (NumPy arrays), in order.")
      .def("run_segment", [](agent::Trainer& t) {
        const ExitGuard running("Trainer.run_segment");
        const agent::UpdateResult r = t.run_segment();
        return dict_of({{"steps", nb::cast(r.steps)}, {"loss_sum", nb::cast(r.loss_sum)}, {"loss_steps", nb::cast(r.loss_steps)},
                        {"return_sum", nb::cast(r.return_sum)}, {"episodes", nb::cast(r.episodes)},
                        {"approx_kl", nb::cast(r.metric("approx_kl"))}, {"clip_fraction", nb::cast(r.metric("clip_fraction"))},
                        {"metrics", [&] {  // the algorithm's own figures of this update (a language model's valid_loss)
                           nb::dict d;
                           for (const agent::Metric& m : r.metrics) d[m.name] = m.value;
                           return d;
                         }()},
                        // exact and ppo report their windows' or iterations' largest segment
                        {"segment_peak", nb::cast(r.segment_peak ? r.segment_peak : t.tape().stats().last_segment_peak)}});
      })
      .def("done", &agent::Trainer::done)
      .def_prop_ro("step", &agent::Trainer::step, "The training step the run has reached (one step moves every stream on by one).")
      .def_prop_ro("skipped_updates", &agent::Trainer::skipped_updates,
                   "Updates skipped because their gradient was not finite (nonfinite \"skip\"), in the whole run.")
      .def("score", [](agent::Trainer& t) { return t.env().score(); })
      .def("reset_score", [](agent::Trainer& t) {
        t.refuse_while_running("reset_score");
        t.env().reset_score();
      })
      .def("evaluate", [](agent::Trainer& t, int64_t steps, uint64_t seed) {
        const ExitGuard running("Trainer.evaluate");
        t.refuse_while_running("evaluate");  // (before the interrupt check of a running evaluate is replaced below)
        // Ctrl-C stops it at its next segment (Python's signal handlers run
        // there) and raises their exception (KeyboardInterrupt); so does the
        // interpreter's exit, with a RuntimeError.
        std::optional<nb::python_error> stopped;
        bool exiting = false;
        t.set_interrupt([&stopped, &exiting] {
          if (interpreter_exiting()) return exiting = true;
          if (PyErr_CheckSignals() == 0) return false;
          stopped.emplace();  // takes the exception, leaving none set while the env is put back
          return true;
        });
        double score = 0;
        try {
          score = t.evaluate(steps, seed);
        } catch (...) {
          t.set_interrupt({});
          throw;
        }
        t.set_interrupt({});
        if (stopped) throw *stopped;
        if (exiting) throw InterpreterExiting("Trainer.evaluate stopped");
        return score;
      }, "steps"_a, "seed"_a,
           "Greedy evaluation over `steps` fresh steps of a new env seeded `seed`: its score, or NaN where nothing was scored "
           "(recall asks its first question at step lag).")
      .def("save", [](const agent::Trainer& t, const std::filesystem::path& path) { t.save(path); })
      .def_prop_ro("parameter_count", [](agent::Trainer& t) { return t.policy().parameter_count(); });

  // ------------------------------------------------------------ dist (docs/distributed.md)
  nb::module_ dm = m.def_submodule("dist", "Data parallelism over MPI: segtape::dist");
  nb::class_<dist::Communicator>(dm, "Communicator", "The ranks of a job (MPI_COMM_WORLD, or one process).")
      .def_prop_ro("rank", &dist::Communicator::rank, "This process's rank in the job, from 0.")
      .def_prop_ro("size", &dist::Communicator::size, "How many ranks the job has.")
      .def_prop_ro("backend", &dist::Communicator::backend, "The transport: \"mpi\", or \"local\" for one process without MPI.")
      // Each call first compares the collective and its size across the ranks
      // (one small allgather): a rank that calls another collective, or sums
      // another length, gets a CollectiveError on every rank instead of MPI
      // pairing buffers of different sizes. The waits release the GIL, and take
      // dist_calls instead: MPI runs funnelled (one thread at a time in it).
      .def("allreduce_sum", [](dist::Communicator& c, nb::ndarray<float, nb::c_contig, nb::device::cpu> a) {
        float* data = a.data();
        const size_t n = a.size();
        const ExitGuard running("Communicator.allreduce_sum");
        nb::gil_scoped_release release;
        const std::lock_guard<std::mutex> one(dist_calls());
        dist::check_same(c, {{"call", "allreduce_sum"}, {"elements", std::to_string(n)}}, "segtape.dist's collective call");
        c.allreduce_sum(data, n, "allreduce_sum");
      }, "array"_a.noconvert(), "In place: every element becomes its sum over the ranks (float32, C-contiguous).")
      // Anything else is refused: converted (float64, strided), the sum went
      // to a temporary copy and the caller's array kept its values, silently.
      .def("allreduce_sum", [](dist::Communicator&, nb::handle a) {
        const auto text = [](nb::handle o) { return std::string(nb::steal<nb::str>(PyObject_Str(o.ptr())).c_str()); };
        std::string got = text(nb::handle(a.type()).attr("__name__"));
        if (nb::hasattr(a, "dtype")) got += " of " + text(a.attr("dtype"));
        if (nb::hasattr(a, "flags") && nb::hasattr(a.attr("flags"), "c_contiguous") && nb::hasattr(a.attr("flags"), "writeable")) {
          if (!nb::cast<bool>(a.attr("flags").attr("c_contiguous"))) got += ", not C-contiguous";
          if (!nb::cast<bool>(a.attr("flags").attr("writeable"))) got += ", read-only";
        }
        throw nb::type_error(("segtape.dist: allreduce_sum sums in place, so it takes a writable, C-contiguous float32 NumPy "
                              "array on the CPU; got " + got.substr(0, 200) +
                              " (make one with np.array(x, dtype=np.float32, order='C'), a writable copy, sum it, and use it)").c_str());
      }, "array"_a.none())
      .def("allgather", [](dist::Communicator& c, nb::bytes b) {
        const ExitGuard running("Communicator.allgather");
        std::vector<std::string> all;
        {
          std::string mine(b.c_str(), b.size());
          nb::gil_scoped_release release;
          const std::lock_guard<std::mutex> one(dist_calls());
          dist::check_same(c, {{"call", "allgather"}}, "segtape.dist's collective call");
          all = c.allgather(mine, "allgather");
        }
        nb::list l;
        for (const std::string& s : all) l.append(nb::bytes(s.data(), s.size()));
        return l;
      }, "data"_a, "Every rank's bytes, in rank order.");
  dm.def("mpi", [](double timeout_s) { return dist::mpi({.timeout_s = timeout_s}); }, "timeout_s"_a = 300.0,
         "MPI_COMM_WORLD (MPI initialised on the first call); collectives end the job after timeout_s.");
  dm.def("local", &dist::local, "One rank: every collective is the identity.");
  dm.def("mpi_built", &dist::mpi_built, "Whether this build has Open MPI (segtape.dist.mpi() needs it).");
  dm.def("nccl_built", &dist::nccl_built, "Whether this build has NCCL (gradients averaged on the GPUs).");
  dm.def("launched_by_mpirun", &dist::launched_by_mpirun, "Whether this process is a rank started by mpirun (its environment says so).");
  dm.def("local_rank", &dist::local_rank, "This rank's place among the ranks on its machine (0 outside mpirun).");
  dm.def("check_same", [](dist::Communicator& c, const std::map<std::string, std::string>& s, const std::string& what) {
    const ExitGuard running("dist.check_same");
    nb::gil_scoped_release release;
    const std::lock_guard<std::mutex> one(dist_calls());
    dist::check_same(c, s, what);
  }, "comm"_a, "settings"_a, "what"_a, "Raises segtape.Error on every rank when the settings differ between ranks.");
  dm.def("check_replicas", [](dist::Communicator& c, const nn::Module& m, const std::string& when) { dist::check_replicas(c, m, when); },
         "comm"_a, "module"_a, "when"_a,
         "Compares the ranks' parameter checksums; raises segtape.Error on every rank, naming the ranks that differ from rank 0 and `when`.");
  dm.def("parameter_checksum", &dist::parameter_checksum, "module"_a,
         "An FNV-1a checksum of the module's parameters' bytes (equal on replicas that hold the same values).");
  nb::class_<dist::GradientAverager>(dm, "GradientAverager",
                                     "Averages a module's gradients over the ranks (broadcasts rank 0's parameters when made).")
      .def(nb::init<dist::Communicator&, const nn::Module&, size_t>(), "comm"_a, "module"_a, "bucket_bytes"_a = size_t(4) << 20,
           nb::keep_alive<1, 2>(), nb::keep_alive<1, 3>())
      .def("average", [](dist::GradientAverager& avg, float count) {
        const ExitGuard running("GradientAverager.average");
        nb::gil_scoped_release release;
        const std::lock_guard<std::mutex> one(dist_calls());
        return avg.average(count);
      }, "count"_a = 0.0f,
           "After backward, before clipping and the optimizer step; returns the sum of `count` over the ranks.")
      .def_prop_ro("transport", &dist::GradientAverager::transport, "How gradients travel between ranks: \"nccl\" (CUDA tapes), \"mpi\" or \"local\".")
      .def_prop_ro("stats", [](const dist::GradientAverager& a) {
        const dist::AverageStats& s = a.stats();
        return dict_of({{"calls", nb::cast(s.calls)}, {"collectives", nb::cast(s.collectives)}, {"bytes", nb::cast(s.bytes)},
                        {"seconds", nb::cast(s.seconds)}});
      }, "What averaging has cost so far, as a dict: calls, collectives, bytes and seconds.");
}
