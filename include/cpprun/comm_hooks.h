// Communication hooks: how DistributedDataParallel reduces one bucket of gradients. A hook gets
// the bucket, holding this rank's gradients as they are (not yet divided by the world size), and
// returns a Work; when that work has been waited on, the bucket's buffer must hold the gradients
// averaged over the ranks. With no hook registered, DDP all-reduces each bucket itself, its
// gradients scaled by 1/world size as they were copied in.
#pragma once

#include <ATen/core/Tensor.h>

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

}  // namespace cpprun
