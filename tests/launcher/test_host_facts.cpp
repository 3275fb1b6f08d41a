// Unit tests of GPU counting for --nproc_per_node=gpu|auto.
#include "catch.h"

#include "command_line/host_facts.h"

using namespace cpprun::launcher;

TEST_CASE("host_facts: CUDA_VISIBLE_DEVICES narrows the device nodes", "[host_facts]") {
  CHECK(count_visible_gpus(8, nullptr) == 8);
  CHECK(count_visible_gpus(8, "0,3") == 2);
  CHECK(count_visible_gpus(8, "") == 0);
  CHECK(count_visible_gpus(8, "1,-1,2") == 1);  // the CUDA runtime stops at an invalid entry
  CHECK(count_visible_gpus(1, "0,1,2") == 1);   // cannot see more GPUs than exist
  CHECK(count_visible_gpus(0, "0") == 0);
  CHECK(count_visible_gpus(2, "GPU-8f2e,GPU-11aa") == 2);
}

TEST_CASE("host_facts: probing finds at least one CPU", "[host_facts]") {
  CHECK(probe_host().cpu_count >= 1);
}
