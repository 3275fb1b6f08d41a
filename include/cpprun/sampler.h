// cpprun::DistributedSampler: each rank's share of a dataset's indices, for torch::data's
// make_data_loader, yielding exactly the indices of PyTorch's Python
// torch.utils.data.distributed.DistributedSampler for the same arguments.
//
//   cpprun::DistributedSampler sampler(dataset.size().value());        // replicas/rank from the job
//   auto loader = torch::data::make_data_loader(std::move(dataset), sampler, 64);
//   for (int epoch = 0; epoch < epochs; ++epoch) {
//     sampler.set_epoch(epoch);                                         // reaches the loader's copy
//     for (auto& batch : *loader) { ... }
//   }
#pragma once

#include <torch/arg.h>
#include <torch/data/samplers/base.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "cpprun/process_group.h"

namespace cpprun {

struct DistributedSamplerOptions {
  // Default: the default process group's size and rank, else WORLD_SIZE / RANK, else one replica
  // of rank 0 (a process run without a launcher, as init_process_group() runs it; PyTorch's
  // raises there without a process group).
  TORCH_ARG(std::optional<int64_t>, num_replicas) = std::nullopt;
  TORCH_ARG(std::optional<int64_t>, rank) = std::nullopt;
  TORCH_ARG(bool, shuffle) = true;
  TORCH_ARG(uint64_t, seed) = 0;
  // true: drop the tail that does not divide evenly; false: pad by repeating indices.
  TORCH_ARG(bool, drop_last) = false;
};

// Copies share one state: the copy a data loader owns follows set_epoch() on yours.
class DistributedSampler : public torch::data::samplers::Sampler<> {
 public:
  explicit DistributedSampler(size_t dataset_size, DistributedSamplerOptions options = {});
  DistributedSampler(size_t dataset_size, const ProcessGroup& group, bool shuffle = true);

  // The epoch of the next pass. Without calls, each new pass (loader.begin()) takes the next
  // epoch by itself, so the order changes every epoch: unlike PyTorch's DistributedSampler (and
  // LibTorch's samplers), which repeat epoch 0's order until set_epoch. For that, call
  // set_epoch(0) before every pass (see docs/ddp.md).
  void set_epoch(uint64_t epoch);
  uint64_t epoch() const;
  // Indices this rank gets per epoch (the same on every rank).
  size_t size() const;
  // This rank's indices for epoch(), all of them: the pass under way, or after set_epoch(e) the
  // pass that will take e. Valid until the next set_epoch, reset or load.
  const std::vector<size_t>& indices() const;

  // torch::data::samplers::Sampler
  void reset(torch::optional<size_t> new_size = torch::nullopt) override;
  torch::optional<std::vector<size_t>> next(size_t batch_size) override;
  // Epoch and position: a loaded sampler resumes mid-epoch where the saved one stood.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// The indices PyTorch's DistributedSampler gives `options.rank()` in `epoch`: what the sampler
// yields. Pure when num_replicas and rank are given (otherwise they come from the job, as above).
//   cpprun::distributed_indices(100, cpprun::DistributedSamplerOptions().num_replicas(4).rank(1), epoch)
std::vector<size_t> distributed_indices(size_t dataset_size, const DistributedSamplerOptions& options,
                                        uint64_t epoch = 0);

}  // namespace cpprun
