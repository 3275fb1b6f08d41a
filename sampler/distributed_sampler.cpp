// See cpprun/sampler.h. The index arithmetic follows PyTorch's DistributedSampler step by step:
// randperm with a CPU generator seeded seed+epoch, pad by repeating from the front (or drop the
// tail), then take every num_replicas-th index starting at rank.
#include "cpprun/sampler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/serialize/archive.h>

#include <algorithm>

#include "comm/group_membership.h"

namespace cpprun {

namespace {

// num_replicas and rank filled in from the job where not given, and checked.
DistributedSamplerOptions resolved(DistributedSamplerOptions options) {
  options.num_replicas(options.num_replicas().value_or(world_size()));
  options.rank(options.rank().value_or(cpprun::rank()));
  const int64_t replicas = *options.num_replicas(), rank = *options.rank();
  TORCH_CHECK(replicas >= 1, "cpprun::DistributedSampler: num_replicas must be at least 1, got ", replicas, ".");
  TORCH_CHECK(rank >= 0 && rank < replicas, "cpprun::DistributedSampler: rank ", rank,
              " is not in [0, num_replicas - 1] = [0, ", replicas - 1, "].");
  return options;
}

size_t samples_per_replica(size_t size, int64_t replicas, bool drop_last) {
  const auto n = static_cast<size_t>(replicas);
  if (drop_last && size % n != 0) return size < n ? 0 : (size - n + n - 1) / n;  // ceil((size - n) / n)
  return (size + n - 1) / n;
}

}  // namespace

struct DistributedSampler::State {
  size_t dataset_size = 0;
  DistributedSamplerOptions options;     // num_replicas and rank resolved
  uint64_t epoch = 0;                    // of the pass under way (or the next, before any)
  std::optional<uint64_t> chosen_epoch;  // set_epoch() since the last reset
  bool started = false;                  // a reset has happened
  std::optional<size_t> resume_position; // from load(): skip this many at the next reset
  std::vector<size_t> indices;
  size_t position = 0;
  // indices() between set_epoch(e) and the pass that takes e: epoch e's, made once.
  std::optional<uint64_t> chosen_indices_epoch;
  std::vector<size_t> chosen_indices;

  int64_t num_replicas() const { return *options.num_replicas(); }
  void compute() { indices = distributed_indices(dataset_size, options, epoch); }
};

std::vector<size_t> distributed_indices(size_t dataset_size, const DistributedSamplerOptions& given, uint64_t epoch) {
  const DistributedSamplerOptions options = resolved(given);
  const int64_t num_replicas = *options.num_replicas(), rank = *options.rank();
  const bool shuffle = options.shuffle(), drop_last = options.drop_last();
  const uint64_t seed = options.seed();
  const size_t per_replica = samples_per_replica(dataset_size, num_replicas, drop_last);
  const size_t total = per_replica * static_cast<size_t>(num_replicas);
  std::vector<size_t> all(dataset_size);
  if (shuffle) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(seed + epoch);
    at::Tensor perm = at::randperm(static_cast<int64_t>(dataset_size), generator, at::kLong);
    const int64_t* p = perm.data_ptr<int64_t>();
    for (size_t i = 0; i < dataset_size; ++i) all[i] = static_cast<size_t>(p[i]);
  } else {
    for (size_t i = 0; i < dataset_size; ++i) all[i] = i;
  }
  if (!drop_last) {  // pad with the first indices, repeated as often as needed
    for (size_t i = 0; all.size() < total; ++i) all.push_back(all[i]);
  }
  std::vector<size_t> mine;
  for (size_t i = static_cast<size_t>(rank); i < total; i += static_cast<size_t>(num_replicas)) mine.push_back(all[i]);
  return mine;
}

DistributedSampler::DistributedSampler(size_t dataset_size, DistributedSamplerOptions options)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.dataset_size = dataset_size;
  s.options = resolved(std::move(options));
  s.compute();
}

DistributedSampler::DistributedSampler(size_t dataset_size, const ProcessGroup& group, bool shuffle)
    : DistributedSampler(dataset_size, DistributedSamplerOptions()
                                           .num_replicas(detail::member_group("DistributedSampler", group).size())
                                           .rank(group.rank())
                                           .shuffle(shuffle)) {}

void DistributedSampler::set_epoch(uint64_t epoch) { state_->chosen_epoch = epoch; }
uint64_t DistributedSampler::epoch() const { return state_->chosen_epoch.value_or(state_->epoch); }
size_t DistributedSampler::size() const {
  return samples_per_replica(state_->dataset_size, state_->num_replicas(), state_->options.drop_last());
}
const std::vector<size_t>& DistributedSampler::indices() const {
  State& s = *state_;
  // After set_epoch(e), epoch() is e, and so are the indices, as PyTorch's iter(sampler) after
  // set_epoch(e): the pass under way (a loader's) keeps its own order until its end.
  if (!s.chosen_epoch || *s.chosen_epoch == s.epoch) return s.indices;
  if (s.chosen_indices_epoch != s.chosen_epoch) {
    s.chosen_indices = distributed_indices(s.dataset_size, s.options, *s.chosen_epoch);
    s.chosen_indices_epoch = s.chosen_epoch;
  }
  return s.chosen_indices;
}

void DistributedSampler::reset(torch::optional<size_t> new_size) {
  State& s = *state_;
  if (new_size) s.dataset_size = *new_size;
  if (s.chosen_epoch) {
    s.epoch = *s.chosen_epoch;
  } else if (s.started && !s.resume_position) {
    ++s.epoch;  // a new pass without set_epoch(): a new order all the same
  }
  s.chosen_epoch.reset();
  s.chosen_indices_epoch.reset();  // made for the old size, perhaps
  s.started = true;
  s.compute();
  s.position = std::min(s.resume_position.value_or(0), s.indices.size());
  s.resume_position.reset();
}

torch::optional<std::vector<size_t>> DistributedSampler::next(size_t batch_size) {
  State& s = *state_;
  if (s.position >= s.indices.size()) return torch::nullopt;
  const size_t end = std::min(s.indices.size(), s.position + batch_size);
  std::vector<size_t> batch(s.indices.begin() + static_cast<std::ptrdiff_t>(s.position),
                            s.indices.begin() + static_cast<std::ptrdiff_t>(end));
  s.position = end;
  return batch;
}

void DistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  const State& s = *state_;
  auto value = [&](const char* key, int64_t v) { archive.write(key, at::tensor(v, at::kLong), /*is_buffer=*/true); };
  value("dataset_size", static_cast<int64_t>(s.dataset_size));
  value("num_replicas", s.num_replicas());
  value("seed", static_cast<int64_t>(s.options.seed()));
  value("epoch", static_cast<int64_t>(s.epoch));
  value("position", static_cast<int64_t>(s.position));
}

void DistributedSampler::load(torch::serialize::InputArchive& archive) {
  State& s = *state_;
  auto value = [&](const char* key) {
    at::Tensor t;
    archive.read(key, t, /*is_buffer=*/true);
    return t.item<int64_t>();
  };
  TORCH_CHECK(value("dataset_size") == static_cast<int64_t>(s.dataset_size) && value("num_replicas") == s.num_replicas() &&
                  value("seed") == static_cast<int64_t>(s.options.seed()),
              "cpprun::DistributedSampler::load: the saved sampler was for another dataset size, number of "
              "replicas or seed; its position means nothing here.");
  s.epoch = static_cast<uint64_t>(value("epoch"));
  s.chosen_epoch = s.epoch;
  s.chosen_indices_epoch.reset();
  s.compute();  // indices() is the loaded epoch's before the pass that resumes it
  s.resume_position = static_cast<size_t>(value("position"));
}

}  // namespace cpprun
