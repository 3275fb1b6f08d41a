// What the multi-rank checkpoint tests compare: two flattened optimizer state dicts (the form
// cpprun::get_optimizer_state_dict gives), key by key, tensors bit for bit.
#pragma once

#include "catch.h"
#include <torch/torch.h>

#include "cpprun/optimizer_state_dict.h"

namespace dist_test {

inline void check_same_optimizer_state(const cpprun::OptimizerStateDict& got, const cpprun::OptimizerStateDict& expected) {
  REQUIRE(got.size() == expected.size());
  for (const auto& item : expected) {
    INFO(item.key());
    const auto* found = got.find(item.key());
    REQUIRE(found != nullptr);
    if (item.value().isTensor()) {
      CHECK(torch::equal(found->toTensor(), item.value().toTensor()));
    } else {
      CHECK(*found == item.value());
    }
  }
}

}  // namespace dist_test
