// Options of cpprun::DistributedDataParallel: PyTorch's names and defaults.
#pragma once

#include <torch/arg.h>

#include <optional>

namespace cpprun {

struct DdpOptions {
  // Gradients are reduced in buckets of about this size; the first (last gradients of the model,
  // first to be ready) is smaller so communication starts early: 1 MiB with the default
  // bucket_cap_mb, bucket_cap_mb itself once that is given (as PyTorch 2.15 sizes its first
  // bucket), first_bucket_cap_mb when that is given.
  DdpOptions& bucket_cap_mb(double megabytes) {
    bucket_cap_mb_ = megabytes;
    bucket_cap_given_ = true;
    return *this;
  }
  double bucket_cap_mb() const { return bucket_cap_mb_; }
  DdpOptions& first_bucket_cap_mb(double megabytes) {
    first_bucket_cap_mb_ = megabytes;
    first_bucket_cap_given_ = true;
    return *this;
  }
  double first_bucket_cap_mb() const {
    return first_bucket_cap_given_ ? first_bucket_cap_mb_ : bucket_cap_given_ ? bucket_cap_mb_ : 1;
  }
  // Copy rank 0's buffers (e.g. BatchNorm running stats) to every rank at construction and at a
  // forward that follows one whose backward reduced (PyTorch's require_forward_param_sync); false:
  // each rank keeps its own, from construction on. Read back, it is the forward sync in effect, as
  // PyTorch 2.15's broadcast_buffers property (forward_sync_buffers when that was given).
  DdpOptions& broadcast_buffers(bool on) {
    broadcast_buffers_ = on;
    return *this;
  }
  bool broadcast_buffers() const { return forward_sync_buffers_.value_or(broadcast_buffers_); }
  // PyTorch 2.13's replacement of broadcast_buffers (DistributedDataParallel(forward_sync_buffers=)):
  // given, it decides the sync before a forward alone, and the construction copies the buffers
  // whatever it says (PyTorch's init sync, which broadcast_buffers(false) skips). Given both, this
  // one wins, as PyTorch's (which warns that broadcast_buffers is ignored). Read back: the sync in
  // effect, given or not.
  DdpOptions& forward_sync_buffers(bool on) {
    forward_sync_buffers_ = on;
    return *this;
  }
  bool forward_sync_buffers() const { return broadcast_buffers(); }
  // What the two above decide: a sync of the buffers before a forward, and at construction.
  bool syncs_buffers_before_forward() const { return broadcast_buffers(); }
  bool syncs_buffers_at_construction() const { return forward_sync_buffers_ ? true : broadcast_buffers_; }
  // Allow parameters that get no gradient in some iterations (on some or all ranks).
  TORCH_ARG(bool, find_unused_parameters) = false;
  // Make each parameter's .grad a view into its bucket: saves a copy and the memory of one.
  TORCH_ARG(bool, gradient_as_bucket_view) = false;
  // The set of used parameters is the same every iteration: found once, then reused.
  TORCH_ARG(bool, static_graph) = false;
  // Check that all ranks have the same parameters and broadcast rank 0's at construction.
  TORCH_ARG(bool, init_sync) = true;

 private:
  double bucket_cap_mb_ = 25;
  double first_bucket_cap_mb_ = 1;
  bool bucket_cap_given_ = false;
  bool first_bucket_cap_given_ = false;
  bool broadcast_buffers_ = true;
  std::optional<bool> forward_sync_buffers_;
};

}  // namespace cpprun
