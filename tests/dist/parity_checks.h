// The parity tests' one comparison: every parameter of the trained model against the reference
// trained in one process, as a relative difference over the whole tensor. CHECK, not REQUIRE,
// so that a failing rank keeps making the same collective calls as the others.
#pragma once

#include "catch.h"
#include <torch/nn/module.h>

#include "ddp_test_models.h"

namespace ddp_test {

inline void check_same_parameters(torch::nn::Module& trained, torch::nn::Module& reference, double tolerance) {
  auto ref = reference.named_parameters();
  for (const auto& item : trained.named_parameters()) {
    const double diff = relative_difference(item.value(), ref[item.key()]);
    INFO("parameter " << item.key() << " relative difference " << diff);
    CHECK(diff <= tolerance);
  }
}

}  // namespace ddp_test
