#include "algorithm.h"

namespace segtape::agent {

#define SEGTAPE_DECLARE(K, N) extern const AlgorithmDef K##Algorithm;
SEGTAPE_ALGORITHMS(SEGTAPE_DECLARE)
#undef SEGTAPE_DECLARE

const AlgorithmDef& algorithm_def(Algo kind) {
  switch (kind) {
#define SEGTAPE_CASE(K, N) \
  case Algo::K: return K##Algorithm;
    SEGTAPE_ALGORITHMS(SEGTAPE_CASE)
#undef SEGTAPE_CASE
  }
  throw Error("algorithm_def: no algorithm of kind " + std::to_string(int(kind)));
}

}  // namespace segtape::agent
