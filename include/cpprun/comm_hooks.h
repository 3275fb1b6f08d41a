// Communication hooks: how DistributedDataParallel reduces one bucket of gradients. A hook gets
// the bucket, holding this rank's gradients as they are (not yet divided by the world size), and
// returns a Work; when that work has been waited on, the bucket's buffer must hold the gradients
// averaged over the ranks. With no hook registered, DDP all-reduces each bucket itself, its
// gradients scaled by 1/world size as they were copied in.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cpprun/collectives.h"

namespace cpprun {

struct GradBucket {
  int index = 0;                       // buckets are reduced in index order on every rank
  bool is_last = false;                // the last bucket of this backward pass
  at::Tensor buffer;                   // the bucket's gradients, flattened, one dtype
  std::vector<at::Tensor> parameters;  // the parameters whose gradients it holds

  // Each parameter's gradient: views of `buffer`, end to end in the parameters' order (PyTorch's
  // GradBucket.gradients()); writing them writes the buffer.
  std::vector<at::Tensor> gradients() const {
    std::vector<at::Tensor> views;
    int64_t offset = 0;
    for (const auto& p : parameters) {
      views.push_back(buffer.narrow(0, offset, p.numel()).view(p.sizes()));
      offset += p.numel();
    }
    return views;
  }
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual Work run(const ProcessGroup& group, GradBucket& bucket) = 0;
  virtual std::string name() const = 0;
};

// All-reduce the bucket and divide by the world size: what DDP does with no hook, one pass slower.
std::shared_ptr<CommHook> allreduce_hook();
// Send the bucket as float16 / bfloat16 (half the bytes of float32), then decompress.
std::shared_ptr<CommHook> fp16_compress_hook();
std::shared_ptr<CommHook> bf16_compress_hook();
// Leaves every bucket as it is, communicating nothing (PyTorch's debugging noop_hook): the upper
// bound of what a hook can save, for measuring; it does not train as DDP.
std::shared_ptr<CommHook> noop_hook();

// PowerSGD (Vogels et al., NeurIPS 2019), as PyTorch's PowerSGDState and powerSGD_hook, argument
// for argument: each bucket's gradient matrices (a tensor viewed as [size(0), rest]) worth it
// (min_compression_rate) are sent as low-rank factors P and Q of matrix_approximation_rank
// columns, the rest all-reduced as they are; errors are fed back into the next step, Q is warm
// started from the last step, and the first start_powerSGD_iter steps all-reduce plainly. The
// random initial Q comes from the same numbers PyTorch draws (numpy's RandomState(random_seed)
// for each bucket's seed, then torch.randn, from a generator of its own: PyTorch's reseeds the
// global ones), so a run matches PyTorch's with the same buckets. One hook object per model: it
// holds the state (errors, P and Q, the step count, the random numbers) across steps;
// save_powerSGD_state() keeps it for a resumed run. As PyTorch's chain of futures, its bucket's
// communication overlaps the rest of the backward: the uncompressed gradients' and P's
// all-reduces are issued when the bucket is ready, Q's when DDP waits for the bucket.
struct PowerSGDOptions {
  TORCH_ARG(int64_t, matrix_approximation_rank) = 1;
  TORCH_ARG(int64_t, start_powerSGD_iter) = 1000;
  TORCH_ARG(double, min_compression_rate) = 2;
  TORCH_ARG(bool, use_error_feedback) = true;
  TORCH_ARG(bool, warm_start) = true;
  TORCH_ARG(double, orthogonalization_epsilon) = 0;
  TORCH_ARG(uint32_t, random_seed) = 0;
  TORCH_ARG(bool, batch_tensors_with_same_shape) = false;
};
std::shared_ptr<CommHook> powerSGD_hook(const PowerSGDOptions& options = PowerSGDOptions());

// PowerSGD's state in a file, as PyTorch users torch.save a PowerSGDState (whose __getstate__
// keeps all but the process group): a torch.save zip that torch.load reads, holding the
// hyperparameters, "iter", "error_dict.<bucket>", "p_memory_dict.<bucket>",
// "q_memory_dict.<bucket>" and numpy's RandomState state as "rng.key" and "rng.pos", under
// PowerSGDState's names; plus "cpprun.*": the rank, world size and bucket layout it fits. The
// errors are the rank's own: every rank saves its file and loads its own. Load into a new hook
// made with the same PowerSGDOptions, before its first step; the resumed run then compresses from
// the same step, with the same errors, P, Q and random numbers, as if never stopped. Refused: a
// file of other options (listing each), and, at the first backward that meets them, another
// rank's file, another world size, or buckets of other shapes. Either throws for another hook.
//
//   auto hook = cpprun::powerSGD_hook(options);
//   cpprun::load_powerSGD_state(*hook, "ckpt/powerSGD_rank" + std::to_string(group.rank()) + ".pt");
//   model->register_comm_hook(hook);
void save_powerSGD_state(const CommHook& hook, const std::string& path);
void load_powerSGD_state(CommHook& hook, const std::string& path);

}  // namespace cpprun
