// PowerSGD's state across steps, what PyTorch's PowerSGDState holds besides its process group and
// compression statistics, and its file (cpprun::save_powerSGD_state / load_powerSGD_state).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cpprun/comm_hooks.h"
#include "cpprun/process_group.h"
#include "support/torch_save_file.h"

namespace cpprun::detail {

// numpy's legacy np.random.RandomState(seed) as PyTorch's PowerSGDState.rng: its MT19937 kept as
// numpy keeps it, 624 words and a position, so that (key, pos) is numpy's
// get_state(legacy=False)["state"] after the same draws and the file can carry it.
class NumpyRandomState {
 public:
  static constexpr int kWords = 624;
  explicit NumpyRandomState(uint32_t seed);
  // rng.randint(1_000_000_000): 32-bit words masked to 30 bits, those above 999,999,999 drawn
  // again, as numpy's legacy bounded integers.
  int64_t randint_below_one_billion();

  std::array<uint32_t, kWords> key{};
  int64_t pos = kWords;  // the next word; kWords: all used, the next draw regenerates them

 private:
  uint32_t next_word();
};

struct PowerSgdState {
  explicit PowerSgdState(const PowerSGDOptions& options) : options(options), rng(options.random_seed()) {}

  PowerSGDOptions options;
  NumpyRandomState rng;
  int64_t iter = 0;  // steps seen: the last bucket of each backward counts one
  // By bucket index: this rank's error feedback (the bucket's size), and the warm-started P and Q.
  std::map<int, at::Tensor> error_dict, p_memory_dict, q_memory_dict;

  // cpprun's own, so that a state is used only where it fits (Note [A PowerSGD state fits one
  // layout]): the group the hook last ran on (world_size 0: none yet), and each compressed bucket's
  // gradients' shapes in bucket order.
  int world_size = 0;
  int rank = -1;
  std::map<int, std::vector<std::vector<int64_t>>> bucket_shapes;
  std::string loaded_from;  // the file it came from, for the errors; empty if made here
  // The bucket indices whose first run the ranks agreed on (agree_state_fits); a state is loaded
  // only into a hook that has none.
  std::set<int> agreed_buckets;
};

// The P and Q elements a compressed bucket needs (the hook's split of its gradients).
struct FactorSizes {
  int64_t p = 0, q = 0;
};

// The file's dict: PyTorch's slot names for what PyTorch pickles, "cpprun.*" for the rest.
NamedTensors powersgd_state_to_tensors(const PowerSgdState& state);
// Replaces `state` (whose options are the hook's) with the file's, all or nothing. Refuses a dict
// whose hyperparameters differ from the hook's, listing each, or that lacks or adds a key.
void powersgd_state_from_tensors(PowerSgdState& state, const NamedTensors& tensors, const std::string& path);

// Before a bucket's compression or all-reduce: throws if the state was made on another rank,
// world size, or bucket layout, or holds P and Q of other sizes than `factors` (naming the file it
// came from); moves loaded tensors to the bucket's device; then records this group and layout.
// See Note [A PowerSGD state fits one layout].
void check_state_fits(PowerSgdState& state, int rank, int world_size, const GradBucket& bucket, bool compressing,
                      FactorSizes factors);
// check_state_fits at a bucket index's first run, agreed: collective (one all-gather of each
// rank's verdict and step count, before any of the bucket's collectives); if any rank's state
// does not fit, or the ranks' steps differ, every rank throws, naming the rank and its reason.
void agree_state_fits(PowerSgdState& state, const ProcessGroup& group, const GradBucket& bucket, bool compressing,
                      FactorSizes factors);

// powersgd_hook.cpp: the state of a hook made by powerSGD_hook(); throws, naming `caller`, for
// any other hook.
PowerSgdState& powersgd_state_of(CommHook& hook, const char* caller);

}  // namespace cpprun::detail
