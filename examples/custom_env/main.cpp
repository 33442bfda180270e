// train_count: trains count-ones (count_env.cpp) through segtape's Trainer,
// the loop `segtape train` runs, then evaluates it greedily on fresh episodes.
// Usage: train_count [steps] [checkpoint file]
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "segtape/agent/trainer.h"

extern "C" void segtape_register_envs();  // count_env.cpp

int main(int argc, char** argv) {
  using namespace segtape::agent;
  try {
    segtape_register_envs();
    TrainConfig c;
    c.env = "count-ones";
    c.steps = argc > 1 ? std::atoll(argv[1]) : 3000;
    c.history = History::parse("tbptt:16");  // episodes of 8 steps: a segment sees whole episodes
    c.hidden = 64;
    Trainer tr(c);
    const double chance = 1.0 / double(tr.env().spec().num_actions);
    int64_t next_log = 0;
    while (!tr.done()) {
      const UpdateResult r = tr.run_segment();
      if (tr.step() >= next_log || tr.done()) {
        std::printf("step %5ld  loss %.4f  accuracy %5.1f%%\n", long(tr.step()), r.loss_sum / double(r.loss_steps),
                    100 * tr.env().score());
        tr.env().reset_score();
        next_log += c.steps / 10;
      }
    }
    if (argc > 2) tr.save(argv[2]);
    const double eval = tr.evaluate(500, 12345);
    std::printf("eval accuracy %.2f%% (greedy, 500 fresh steps x %ld streams; chance %.2f%%)\n", 100 * eval, long(c.batch),
                100 * chance);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_count: error: %s\n", e.what());
    return 2;
  }
}
