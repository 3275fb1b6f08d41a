// See param_bucket.h.
#include "fsdp/param_bucket.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <map>

#include "core/tensor_alias.h"

namespace cpprun::detail {

std::vector<int64_t> ShardedParam::shard_sizes() const {
  std::vector<int64_t> out = sizes.empty() ? std::vector<int64_t>{1} : sizes;
  out[0] = local_rows;
  return out;
}

ParamBucket::ParamBucket(std::size_t unit, std::vector<std::string> names, std::vector<at::Tensor> params, int rank,
                         int world, std::optional<at::ScalarType> compute_dtype, bool separate_shards,
                         bool shards_on_cpu, bool keep_unsharded)
    : unit_(unit), frozen_(!params.at(0).requires_grad()), rank_(rank), world_(world) {
  TORCH_INTERNAL_ASSERT(!params.empty() && names.size() == params.size());
  const at::Tensor& first = params.front();
  // Mixed precision casts floating-point parameters only (a frozen integer one stays as it is).
  if (!at::isFloatingType(first.scalar_type())) compute_dtype.reset();
  const bool mixed = compute_dtype && *compute_dtype != first.scalar_type();
  const bool offload = shards_on_cpu && !first.is_cpu();
  separate_ = separate_shards || mixed || offload;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    TORCH_INTERNAL_ASSERT(p.scalar_type() == first.scalar_type() && p.device() == first.device() &&
                          p.requires_grad() != frozen_);
    ShardedParam s;
    s.name = std::move(names[i]);
    s.param = p;
    s.sizes = p.sizes().vec();
    s.rows = p.dim() == 0 ? 1 : p.size(0);
    s.row_numel = 1;
    for (std::size_t d = 1; d < s.sizes.size(); ++d) s.row_numel *= s.sizes[d];
    s.rows_per_rank = (s.rows + world - 1) / world;
    s.first_row = std::min(rank * s.rows_per_rank, s.rows);
    s.local_rows = std::min(s.rows - s.first_row, s.rows_per_rank);
    s.unsharded_offset = chunk_numel_ * world;
    s.wire_offset = chunk_numel_;
    chunk_numel_ += s.chunk_numel();
    numel_ += p.numel();
    params_.push_back(std::move(s));
  }

  at::NoGradGuard no_grad;
  const auto options = first.options().requires_grad(false).dtype(compute_dtype.value_or(first.scalar_type()));
  // Padding rows must be zeros; memory that is released at once is never touched.
  unsharded_ = keep_unsharded ? at::zeros({unsharded_numel()}, options) : at::empty({unsharded_numel()}, options);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    ShardedParam& s = params_[i];
    at::Tensor value = s.param.detach();
    if (separate_) {
      at::Tensor rows = value.reshape({s.rows, s.row_numel}).narrow(0, s.first_row, s.local_rows);
      s.shard = rows.clone().view(s.shard_sizes());
      if (offload) s.shard = s.shard.to(at::kCPU).pin_memory();  // pinned: copies to the GPU overlap
    }
    if (keep_unsharded) param_view(unsharded_, i).copy_(value);
    s.param.set_data(param_view(unsharded_, i));  // the module's parameter now lives in unsharded_
    if (!separate_) s.shard = shard_view(unsharded_, i);
    s.shard.requires_grad_(!frozen_);
  }
  if (!keep_unsharded) release_unsharded();
}

at::Tensor ParamBucket::region(const at::Tensor& unsharded_like, std::size_t i) const {
  const ShardedParam& s = params_[i];
  return unsharded_like.narrow(0, s.unsharded_offset, s.chunk_numel() * world_);
}

at::Tensor ParamBucket::param_view(const at::Tensor& unsharded_like, std::size_t i) const {
  return alias_into(unsharded_like, params_[i].unsharded_offset, params_[i].sizes);
}

at::Tensor ParamBucket::shard_view(const at::Tensor& unsharded_like, std::size_t i) const {
  const ShardedParam& s = params_[i];
  return alias_into(unsharded_like, s.unsharded_offset + rank_ * s.chunk_numel(), s.shard_sizes());
}

c10::DataPtr ParamBucket::release_unsharded() {
  c10::StorageImpl* storage = unsharded_.storage().unsafeGetStorageImpl();
  c10::DataPtr memory = storage->set_data_ptr(c10::DataPtr(nullptr, unsharded_.device()));
  storage->set_nbytes(0);
  return memory;
}

void ParamBucket::allocate_unsharded(c10::DataPtr reuse) {
  if (unsharded_allocated()) return;
  c10::StorageImpl* storage = unsharded_.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(reuse ? std::move(reuse) : storage->allocator()->allocate(unsharded_bytes()));
  storage->set_nbytes(unsharded_bytes());
}

std::size_t ParamBucket::unsharded_bytes() const {
  return static_cast<std::size_t>(unsharded_numel()) * unsharded_.element_size();
}

bool ParamBucket::unsharded_allocated() const { return unsharded_.storage().nbytes() != 0; }

std::vector<ParamBucket> shard_units(const std::vector<UnitPlan>& units, const ShardOptions& options) {
  std::vector<ParamBucket> buckets, frozen;
  for (std::size_t u = 0; u < units.size(); ++u) {
    const UnitPlan& unit = units[u];
    if (options.before_unit) options.before_unit(u);
    std::map<std::string, std::pair<std::vector<std::string>, std::vector<at::Tensor>>> by_kind;
    std::vector<std::string> kinds;  // in the order of their first parameter
    for (std::size_t i = 0; i < unit.params.size(); ++i) {
      const auto& p = unit.params[i];
      const std::string kind = std::string(c10::toString(p.scalar_type())) + "/" + p.device().str() +
                               (p.requires_grad() ? "" : "/frozen");
      if (!by_kind.count(kind)) kinds.push_back(kind);
      by_kind[kind].first.push_back(unit.param_names[i]);
      by_kind[kind].second.push_back(p);
    }
    for (const auto& kind : kinds) {
      const bool trainable = by_kind[kind].second.front().requires_grad();
      (trainable ? buckets : frozen)
          .emplace_back(u, by_kind[kind].first, by_kind[kind].second, options.rank, options.world,
                        options.compute_dtype, options.separate_shards, options.shards_on_cpu, options.keep_unsharded);
    }
  }
  for (auto& bucket : frozen) buckets.push_back(std::move(bucket));
  return buckets;
}

std::size_t trainable_bucket_count(const std::vector<ParamBucket>& buckets) {
  const auto is_frozen = [](const ParamBucket& b) { return b.frozen(); };
  const auto first_frozen = std::find_if(buckets.begin(), buckets.end(), is_frozen);
  TORCH_INTERNAL_ASSERT(std::all_of(first_frozen, buckets.end(), is_frozen));
  return static_cast<std::size_t>(first_frozen - buckets.begin());
}

}  // namespace cpprun::detail
