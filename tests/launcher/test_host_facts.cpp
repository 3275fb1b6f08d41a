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

TEST_CASE("host_facts: CUDA_VISIBLE_DEVICES read as torch.cuda.device_count() reads it", "[host_facts]") {
  // Cut at the first ordinal past the last GPU: a list copied from a bigger node shows fewer GPUs, or none.
  CHECK(count_visible_gpus(4, "4,5,6,7") == 0);
  CHECK(count_visible_gpus(2, "0,5") == 1);
  CHECK(count_visible_gpus(2, "0,5,1") == 1);
  // A repeated ordinal or UUID hides every GPU.
  CHECK(count_visible_gpus(8, "0,0") == 0);
  CHECK(count_visible_gpus(8, "1,2,1") == 0);
  CHECK(count_visible_gpus(8, "GPU-a,GPU-a") == 0);
  // strtoul's reading: leading digits count, whitespace and a sign are allowed; no number stops the list.
  CHECK(count_visible_gpus(8, "1gpu2,2ampere") == 2);
  CHECK(count_visible_gpus(8, " 0, 1") == 2);
  CHECK(count_visible_gpus(8, "+1,-0") == 2);
  CHECK(count_visible_gpus(8, "0,a,1") == 1);
  CHECK(count_visible_gpus(8, "0,,1") == 1);
  CHECK(count_visible_gpus(8, "-1") == 0);
  CHECK(count_visible_gpus(8, "99999999999999999999") == 0);
  CHECK(count_visible_gpus(8, "0,12345678901,12345678902") == 1);  // not a repeat: every digit counts
  CHECK(count_visible_gpus(8, "0,-0") == 0);                         // -0 is 0 again
  // UUIDs: the list stops at an entry of another kind.
  CHECK(count_visible_gpus(8, "GPU-a,0,GPU-b") == 1);
  CHECK(count_visible_gpus(8, "MIG-a,MIG-b") == 2);
}

TEST_CASE("host_facts: probing finds at least one CPU", "[host_facts]") {
  CHECK(probe_host().cpu_count >= 1);
}
