#include "segtape/nn/random.h"

#include <cmath>

namespace segtape::nn {

double Rng::normal(double mean, double std) {
  // u1 in (0, 1] keeps log() finite; u2 in [0, 1).
  const double u1 = 1.0 - uniform();
  const double u2 = uniform();
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  return mean + std * std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

}  // namespace segtape::nn
