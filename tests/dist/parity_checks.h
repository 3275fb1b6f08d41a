// The parity tests' comparison: every parameter of a trained model against a reference's.
#pragma once

#include <catch2/catch.hpp>
#include <torch/nn/module.h>

#include "ddp_test_models.h"

namespace dist_test {

// CHECK, not REQUIRE: a rank that fails goes on, keeping its collectives in step.
inline void check_parameters_match(torch::nn::Module& trained, torch::nn::Module& reference, double tolerance) {
  auto ref = reference.named_parameters();
  for (const auto& item : trained.named_parameters()) {
    const double diff = ddp_test::relative_difference(item.value(), ref[item.key()]);
    INFO("parameter " << item.key() << " relative difference " << diff);
    CHECK(diff <= tolerance);
  }
}

}  // namespace dist_test
