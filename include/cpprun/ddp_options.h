// Options of cpprun::DistributedDataParallel: PyTorch's names and defaults.
#pragma once

#include <torch/arg.h>

namespace cpprun {

struct DdpOptions {
  // Gradients are reduced in buckets of about this size; the first (last gradients of the model,
  // first to be ready) is smaller so communication starts early.
  TORCH_ARG(double, bucket_cap_mb) = 25;
  TORCH_ARG(double, first_bucket_cap_mb) = 1;
  // Copy rank 0's buffers (e.g. BatchNorm running stats) to every rank before each forward.
  TORCH_ARG(bool, broadcast_buffers) = true;
  // Allow parameters that get no gradient in some iterations (on some or all ranks).
  TORCH_ARG(bool, find_unused_parameters) = false;
  // Make each parameter's .grad a view into its bucket: saves a copy and the memory of one.
  TORCH_ARG(bool, gradient_as_bucket_view) = false;
  // The set of used parameters is the same every iteration: found once, then reused.
  TORCH_ARG(bool, static_graph) = false;
  // Check that all ranks have the same parameters and broadcast rank 0's at construction.
  TORCH_ARG(bool, init_sync) = true;
};

}  // namespace cpprun
