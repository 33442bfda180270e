// The retention lab on LibTorch: the same pitfalls and fixes as
// agent/retention.cpp (exact-replay's segment replay included), written the
// way a PyTorch user writes them, with the same model (segtape's initial
// weights, copied by name), sizes and data.
// Memory is LibTorch's live CPU tensor bytes, counted by our own allocator
// installed in front of the default one (agent/torch_memory.h); if that
// cannot be installed, the process RSS, and the output says which.
// Built, only when LibTorch was found, as a module of its own
// (libsegtape_torch_lab.so) that the segtape program loads when a lab run
// asks for LibTorch: linking LibTorch into the program made every start of
// it load ~290 shared libraries (~1.5 s); see docs/retention.md. The
// module links none of segtape's libraries: its segtape references resolve
// to the program's exported symbols, as an env plug-in's do.
#include <torch/torch.h>

#include <chrono>

#include "segtape/agent/env.h"
#include "segtape/agent/retention.h"
#include "segtape/agent/trainer.h"
#include "torch_memory.h"

namespace segtape::agent::retention {
namespace {

using Clock = std::chrono::steady_clock;

struct Memory {
  bool counting = false;
  std::string source;
  double live() const {
    return counting ? double(torch_memory::CountingAllocator::stats().live.load()) : double(resident_bytes());
  }
  double peak() const {
    return counting ? double(torch_memory::CountingAllocator::stats().peak.load()) : double(resident_bytes());
  }
  void reset_peak() const {
    if (counting) torch_memory::CountingAllocator::reset_peak();
  }
};

const Memory& memory() {
  static const Memory m = [] {
    Memory m;
    try {
      const c10::Allocator* ours = &torch_memory::install();  // before asking which one is in place
      m.counting = c10::GetCPUAllocator() == ours;
    } catch (const std::exception&) {
      m.counting = false;
    }
    m.source = m.counting
                   ? "libtorch: live bytes of CPU tensor storage after the step, counted by an allocator of our own installed "
                     "with c10::SetCPUAllocator in front of LibTorch's default one (allocator statistics of our own; "
                     "autograd's graph nodes live on the C++ heap and are not counted)"
                   : "RSS: the process resident set size after the step (the counting allocator could not be installed)";
    // One intra-op thread: these tensors are far too small to split, and segtape runs single-threaded too.
    torch::set_num_threads(1);
    return m;
  }();
  return m;
}

// Embedding -> GRUCell -> Linear head (or window mode's compress layer), plus
// pitfall 4's ctx layer: PyTorch's names, segtape's initial values.
struct Net : torch::nn::Module {
  torch::nn::Embedding encoder{nullptr};
  torch::nn::GRUCell gru{nullptr};
  torch::nn::Linear compress{nullptr}, head{nullptr}, ctx{nullptr};

  Net(const LabConfig& c, bool window) {
    encoder = register_module("encoder", torch::nn::Embedding(c.vocab, c.embed));
    if (window) compress = register_module("compress", torch::nn::Linear(c.window * c.embed, c.hidden));
    else gru = register_module("gru", torch::nn::GRUCell(c.embed, c.hidden));
    head = register_module("head", torch::nn::Linear(c.hidden, c.vocab));
    ctx = register_module("ctx", torch::nn::Linear(c.embed, c.hidden));
    torch::NoGradGuard ng;
    auto params = named_parameters();
    for (const NamedValues& v : initial_weights(c, window)) {
      torch::Tensor* p = params.find(v.name);
      if (!p || p->sizes() != torch::IntArrayRef(v.shape))
        throw Error("retention (libtorch): parameter '" + v.name + "' is missing or has another shape than segtape's");
      p->copy_(torch::from_blob(const_cast<float*>(v.values.data()), v.shape, torch::kFloat32));
    }
    // Gradients exist from the start (as segtape's persistent ones do), so the
    // baseline counts them and the curves show only what the loop retains.
    for (torch::Tensor& p : parameters()) p.mutable_grad() = torch::zeros_like(p);
  }
};

// In-step checkpointing of the GRU cell: forward runs without recording
// (a custom Function's forward records nothing) and saves only its inputs;
// backward recomputes the cell with grad enabled and differentiates it.
// torch.utils.checkpoint has no C++ counterpart in LibTorch 1.13; this is
// what it does, for one op.
struct CheckpointedGru : torch::autograd::Function<CheckpointedGru> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& h,
                               const torch::Tensor& w_ih, const torch::Tensor& w_hh, const torch::Tensor& b_ih,
                               const torch::Tensor& b_hh) {
    ctx->save_for_backward({x, h, w_ih, w_hh, b_ih, b_hh});
    return torch::gru_cell(x, h, w_ih, w_hh, b_ih, b_hh);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list g) {
    const auto saved = ctx->get_saved_variables();
    torch::AutoGradMode enable(true);
    std::vector<torch::Tensor> in, wanted;
    for (size_t i = 0; i < saved.size(); ++i) {
      in.push_back(saved[i].detach().requires_grad_(ctx->needs_input_grad(i)));
      if (ctx->needs_input_grad(i)) wanted.push_back(in.back());
    }
    const torch::Tensor y = torch::gru_cell(in[0], in[1], in[2], in[3], in[4], in[5]);
    const auto grads = torch::autograd::grad({y}, wanted, {g[0]});
    torch::autograd::variable_list out(saved.size());
    for (size_t i = 0, j = 0; i < saved.size(); ++i)
      if (ctx->needs_input_grad(i)) out[i] = grads[j++];
    return out;
  }
};

struct Run {
  const LabConfig& cfg;
  Trace& tr;
  const Memory& mem;
  const Episode ep;
  double base = 0;

  torch::Tensor tokens(int64_t t) const { return at(ep.tokens, t); }
  torch::Tensor targets(int64_t t) const { return at(ep.targets, t); }
  torch::Tensor at(const std::vector<int64_t>& v, int64_t t) const {
    // A view of the episode's memory: no tensor allocation to count.
    return torch::from_blob(const_cast<int64_t*>(v.data()) + t * cfg.batch, {cfg.batch}, torch::kLong);
  }
  void row(int64_t t, Clock::time_point start) {
    tr.step.push_back(t);
    tr.bytes.push_back(mem.live() - base);
    tr.seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
};

torch::Tensor ce(const torch::Tensor& logits, const torch::Tensor& y) {
  return torch::nn::functional::cross_entropy(logits, y, torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kNoTarget));
}

// Every parameter's gradient, by name, for exact-replay's check against pitfall 1.
std::vector<NamedValues> gradients(torch::nn::Module& net) {
  std::vector<NamedValues> out;
  for (const auto& p : net.named_parameters()) {
    const torch::Tensor g = p.value().grad().contiguous();
    out.push_back({p.key(), g.sizes().vec(), {g.data_ptr<float>(), g.data_ptr<float>() + g.numel()}});
  }
  return out;
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

void pitfall(Case c, Run& r) {
  const LabConfig& cfg = r.cfg;
  Net net(cfg, false);
  torch::optim::SGD opt(net.parameters(), torch::optim::SGDOptions(cfg.lr));
  const bool every_step = info(c).backward_every_step;
  r.base = r.mem.live();
  torch::Tensor h = torch::zeros({cfg.batch, cfg.hidden});
  torch::Tensor loss, history;
  std::vector<torch::Tensor> kept_logits;  // pitfall 3's buffer
  for (int64_t t = 0; t < cfg.steps; ++t) {
    const auto start = Clock::now();
    torch::Tensor e = net.encoder(r.tokens(t));
    torch::Tensor logits;
    if (c == Case::GrowingContext) {
      history = t ? torch::cat({history, e.unsqueeze(0)}, 0) : e.unsqueeze(0);  // [t + 1, B, E]
      logits = net.head(torch::tanh(net.ctx(history.mean(0))));
    } else {
      if (c == Case::DetachInputOnly) e = e.detach();
      h = c == Case::Checkpoint ? CheckpointedGru::apply(e, h, net.gru->weight_ih, net.gru->weight_hh, net.gru->bias_ih, net.gru->bias_hh)
                                : net.gru(e, h);
      logits = net.head(h);
    }
    if (c == Case::LogitsBuffer) kept_logits.push_back(logits);
    if (r.ep.has_target(t)) {
      torch::Tensor l = ce(logits, r.targets(t));
      if (every_step) {
        l.backward({}, /*retain_graph=*/true);
        if (c == Case::ClipGrad) torch::nn::utils::clip_grad_norm_(net.parameters(), cfg.clip);
      } else {
        loss = loss.defined() ? loss + l : l;
      }
    }
    if (c == Case::LogitsBuffer && (t + 1) % cfg.k == 0) {
      if (loss.defined()) loss.backward(), opt.step(), opt.zero_grad();
      loss = torch::Tensor();
      h = h.detach();
    }
    if (t + 1 == cfg.steps) {
      if (loss.defined()) loss.backward();
      if (c == Case::HiddenNotDetached) r.tr.grads = gradients(net);  // what exact-replay must equal
      opt.step();
      opt.zero_grad();
      if (c == Case::LogitsBuffer) (void)torch::stack(kept_logits).argmax(-1);  // what the buffer was for
    }
    r.row(t, start);
  }
}

void fix(Case c, Run& r) {
  const LabConfig& cfg = r.cfg;
  const bool window = c == Case::Window, trainer = c == Case::GruState;
  Net net(cfg, window);
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (trainer) opt = std::make_unique<torch::optim::Adam>(net.parameters(), torch::optim::AdamOptions(3e-3));  // the Trainer's
  else opt = std::make_unique<torch::optim::SGD>(net.parameters(), torch::optim::SGDOptions(cfg.lr));
  const int64_t K = c == Case::Detach ? 1 : trainer ? cfg.trainer_k : cfg.k;
  // Adam allocates its moments at its first step; take that step now, on zero
  // gradients (a no-op update), so the baseline holds them as segtape's
  // persistent pool does.
  opt->step();
  r.base = r.mem.live();
  torch::Tensor h = torch::zeros({cfg.batch, cfg.hidden});
  std::vector<torch::Tensor> ring;  // window: the last N - 1 embeddings as values
  for (int64_t i = 0; window && i + 1 < cfg.window; ++i) ring.push_back(torch::zeros({cfg.batch, cfg.embed}));
  for (int64_t t0 = 0; t0 < cfg.steps; t0 += K) {
    r.mem.reset_peak();
    torch::Tensor loss;
    const int64_t n = std::min(K, cfg.steps - t0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = t0 + i;
      const auto start = Clock::now();
      torch::Tensor e = net.encoder(r.tokens(t));
      torch::Tensor f;
      if (window) {
        std::vector<torch::Tensor> parts(ring.begin(), ring.end());
        parts.push_back(e);
        f = torch::tanh(net.compress(torch::cat(parts, 1)));
        if (!ring.empty()) ring.erase(ring.begin()), ring.push_back(e.detach());
      } else {
        h = net.gru(e, c == Case::NogradHistory ? h.detach() : h);
        f = h;
      }
      torch::Tensor logits = net.head(f);
      if (r.ep.has_target(t)) {
        torch::Tensor l = ce(logits, r.targets(t));
        loss = loss.defined() ? loss + l : l;
      }
      if (i + 1 == n && loss.defined()) {
        loss.backward();
        if (trainer) torch::nn::utils::clip_grad_norm_(net.parameters(), 1.0);
        opt->step();
        opt->zero_grad();
      }
      r.row(t, start);
    }
    h = h.detach();  // the TBPTT boundary
    r.tr.segment_peaks.push_back(r.mem.peak() - r.base);
  }
}


// exact-replay as a PyTorch user writes it: a forward pass under no_grad that
// keeps h at every K-th step, then each segment replayed in reverse from its
// stored state (a leaf that requires grad) and backpropagated from its losses
// and from dL/dh at its end; h0.grad is dL/dh for the segment before, and the
// segment's stored state is dropped. One update, as pitfall 1's. Rows as
// segtape's: the live bytes after step t in its replay (its segment's last
// step: after the backward), time = forward + replay.
void exact(Run& r) {
  const LabConfig& cfg = r.cfg;
  Net net(cfg, false);
  torch::optim::SGD opt(net.parameters(), torch::optim::SGDOptions(cfg.lr));
  const int64_t T = cfg.steps, K = cfg.k, S = (T + K - 1) / K;
  std::vector<double> bytes(size_t(T), 0), seconds(size_t(T), 0);
  r.tr.segment_peaks.assign(size_t(S), 0);
  r.base = r.mem.live();
  auto step = [&](int64_t t, const torch::Tensor& h, torch::Tensor& loss) {
    torch::Tensor h1 = net.gru(net.encoder(r.tokens(t)), h);
    torch::Tensor logits = net.head(h1);
    if (r.ep.has_target(t)) {
      torch::Tensor l = ce(logits, r.targets(t));
      loss = loss.defined() ? loss + l : l;
    }
    return h1;
  };
  std::vector<torch::Tensor> states;  // the state entering each segment
  {
    torch::NoGradGuard no_grad;
    torch::Tensor h = torch::zeros({cfg.batch, cfg.hidden});
    for (int64_t t = 0; t < T; ++t) {
      const auto start = Clock::now();
      if (t % K == 0) states.push_back(h);
      torch::Tensor loss;
      h = step(t, h, loss);
      seconds[size_t(t)] += seconds_since(start);
    }
  }
  torch::Tensor dh;  // dL/dh at the end of the segment being replayed (none after the last)
  for (int64_t s = S - 1; s >= 0; --s) {
    r.mem.reset_peak();
    const torch::Tensor h0 = states.back().detach().requires_grad_();
    torch::Tensor h = h0, loss;
    const int64_t end = std::min(T, (s + 1) * K);
    for (int64_t t = s * K; t < end; ++t) {
      const auto start = Clock::now();
      h = step(t, h, loss);
      if (t + 1 == end) {
        torch::autograd::variable_list outputs, seeds;
        if (loss.defined()) outputs.push_back(loss), seeds.push_back(torch::ones_like(loss));
        if (dh.defined()) outputs.push_back(h), seeds.push_back(dh);
        if (!outputs.empty()) {
          torch::autograd::backward(outputs, seeds);
          dh = h0.grad();
        }
        states.pop_back();
      }
      seconds[size_t(t)] += seconds_since(start);
      bytes[size_t(t)] = r.mem.live() - r.base;
    }
    r.tr.segment_peaks[size_t(s)] = r.mem.peak() - r.base;
  }
  r.tr.grads = gradients(net);  // before the update, as pitfall 1's
  const auto start = Clock::now();
  opt.step();
  opt.zero_grad();
  seconds[size_t(T - 1)] += seconds_since(start);
  for (int64_t t = 0; t < T; ++t) {
    r.tr.step.push_back(t);
    r.tr.bytes.push_back(bytes[size_t(t)]);
    r.tr.seconds.push_back(seconds[size_t(t)]);
  }
}

}  // namespace

Trace run_libtorch(Case c, const LabConfig& cfg) {
  cfg.validate();
  const Memory& mem = memory();
  Trace tr;
  tr.engine = "libtorch";
  tr.id = c;
  tr.memory_source = mem.source;
  Run r{cfg, tr, mem, make_episode(cfg)};
  try {
    if (info(c).pitfall) pitfall(c, r);
    else if (c == Case::ExactReplay) exact(r);
    else fix(c, r);
  } catch (const c10::Error& e) {  // a LibTorch refusal is a result too
    tr.error_type = "c10::Error";
    tr.error = e.what_without_backtrace();
    tr.error_step = tr.step.empty() ? 0 : tr.step.back() + 1;
  }
  return tr;
}

}  // namespace segtape::agent::retention

// The module's one entry point (load_torch_lab in agent/cli/retention.cpp).
extern "C" segtape::agent::retention::TorchRunner segtape_torch_lab_runner() {
  return &segtape::agent::retention::run_libtorch;
}
