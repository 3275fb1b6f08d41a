// See flat_param.h.
#include "fsdp/flat_param.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <map>

namespace cpprun::detail {

FlatParam::FlatParam(std::vector<std::string> names, std::vector<at::Tensor> params, int rank, int world,
                     std::optional<at::ScalarType> compute_dtype, bool separate_shard, bool shard_on_cpu)
    : names_(std::move(names)), params_(std::move(params)), rank_(rank), world_(world) {
  TORCH_INTERNAL_ASSERT(!params_.empty());
  for (const auto& p : params_) {
    TORCH_INTERNAL_ASSERT(p.scalar_type() == params_.front().scalar_type() && p.device() == params_.front().device());
    offsets_.push_back(numel_);
    numel_ += p.numel();
  }
  padded_ = (numel_ + world - 1) / world * world;
  const auto own_dtype = params_.front().scalar_type();
  const bool mixed = compute_dtype && *compute_dtype != own_dtype;
  at::Tensor master = at::zeros({padded_}, params_.front().options().requires_grad(false));
  full_ = mixed ? at::zeros({padded_}, master.options().dtype(*compute_dtype)) : master;
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    slot(master, i).copy_(params_[i].detach());
    at::Tensor place = slot(full_, i);
    if (mixed) place.copy_(slot(master, i));
    params_[i].set_data(place);  // the module's parameter now lives in full_
  }
  const bool offload = shard_on_cpu && !full_.is_cpu();
  if (mixed || separate_shard || offload) {  // this rank's part only
    shard_ = master.narrow(0, shard_offset(), shard_numel()).clone();
    if (offload) shard_ = shard_.to(at::kCPU).pin_memory();  // pinned: copies to the GPU overlap
  } else {
    shard_ = alias_into(full_, shard_offset(), {shard_numel()});
  }
  shard_.requires_grad_(true);
}

c10::DataPtr FlatParam::release_full() {
  c10::StorageImpl* storage = full_.storage().unsafeGetStorageImpl();
  c10::DataPtr memory = storage->set_data_ptr(c10::DataPtr(nullptr, full_.device()));
  storage->set_nbytes(0);
  return memory;
}

void FlatParam::allocate_full(c10::DataPtr reuse) {
  if (full_allocated()) return;
  c10::StorageImpl* storage = full_.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(reuse ? std::move(reuse) : storage->allocator()->allocate(full_bytes()));
  storage->set_nbytes(full_bytes());
}

std::size_t FlatParam::full_bytes() const { return static_cast<std::size_t>(padded_) * full_.element_size(); }

bool FlatParam::full_allocated() const { return full_.storage().nbytes() != 0; }

void FlatParam::shard_from_full() {
  if (!shard_is_separate()) return;
  at::NoGradGuard no_grad;
  shard_.copy_(full_.narrow(0, shard_offset(), shard_numel()));
}

at::Tensor FlatParam::slot(const at::Tensor& flat, std::size_t i) const {
  return alias_into(flat, offsets_[i], params_[i].sizes());
}

std::vector<FlatParam> flatten_units(const std::vector<UnitPlan>& units, const FlattenOptions& options,
                                     std::vector<bool>& in_root_unit) {
  std::vector<FlatParam> flats;
  in_root_unit.clear();
  for (std::size_t u = 0; u < units.size(); ++u) {
    const UnitPlan& unit = units[u];
    if (options.before_unit) options.before_unit(u);
    std::map<std::string, std::pair<std::vector<std::string>, std::vector<at::Tensor>>> by_kind;
    std::vector<std::string> kinds;  // in the order of their first parameter
    for (std::size_t i = 0; i < unit.params.size(); ++i) {
      const auto& p = unit.params[i];
      const std::string kind = std::string(c10::toString(p.scalar_type())) + "/" + p.device().str();
      if (!by_kind.count(kind)) kinds.push_back(kind);
      by_kind[kind].first.push_back(unit.param_names[i]);
      by_kind[kind].second.push_back(p);
    }
    for (const auto& kind : kinds) {
      flats.emplace_back(by_kind[kind].first, by_kind[kind].second, options.rank, options.world, options.compute_dtype,
                         options.separate_shard, options.shard_on_cpu);
      if (options.release_full) flats.back().release_full();
      in_root_unit.push_back(unit.name.empty());
    }
  }
  return flats;
}

}  // namespace cpprun::detail
