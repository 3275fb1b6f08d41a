// See deferred_replay.h.
#include "core/deferred_replay.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <mutex>
#include <unordered_set>
#include <utility>

#include "core/extension_key.h"
#include "cpprun/deferred_init.h"

namespace cpprun::detail {
namespace {

// A plain tensor (without the key) over `storage`, placed as `g` says.
at::Tensor over(const c10::Storage& storage, const TensorGeometry& g) {
  c10::impl::ExcludeDispatchKeyGuard no_defer(kExtensionKey);
  at::Tensor t = at::empty({0}, at::TensorOptions().dtype(g.dtype).device(storage.device()));
  t.set_(storage, g.offset, g.sizes, g.strides);
  return t;
}

c10::Storage scratch(std::size_t nbytes, c10::Device device) {
  c10::impl::ExcludeDispatchKeyGuard no_defer(kExtensionKey);
  return at::empty({static_cast<int64_t>(nbytes)}, at::TensorOptions().dtype(at::kByte).device(device)).storage();
}

// Runs a recorded call with the arguments given; a factory's result is returned.
at::Tensor call(const DeferredOp& op, std::vector<c10::IValue> stack) {
  c10::impl::ExcludeDispatchKeyGuard no_defer(kExtensionKey);
  at::NoGradGuard no_grad;
  op.op.callBoxed(stack);
  return op.factory ? stack.at(0).toTensor() : at::Tensor();
}

at::Tensor state_of(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_state(at::Generator generator, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

const TensorGeometry& written(const DeferredOp& op) { return op.factory ? op.result : op.inputs.front().geometry; }

}  // namespace

DeferredReplay::DeferredReplay(const std::vector<std::vector<at::Tensor>>& groups, bool every_group)
    : groups_(groups.size()), group_tensors_(groups) {
  for (std::size_t g = 0; g < groups.size(); ++g) {
    for (const auto& t : groups[g]) {
      if (!is_deferred_tensor(t) || entries_.count(t.storage().unsafeGetStorageImpl())) continue;
      add_entry(t.storage().unsafeGetStorageImpl(), static_cast<int>(g));
      groups_[g].push_back(t.storage().unsafeGetStorageImpl());
    }
  }
  // Deferred tensors outside the groups that records read (e.g. a temporary copied into a parameter).
  std::vector<const c10::StorageImpl*> work;
  for (const auto& item : entries_) work.push_back(item.first);
  while (!work.empty()) {
    const c10::StorageImpl* key = work.back();
    work.pop_back();
    const DeferredOps ops = entries_.at(key).ops;
    for (const auto& op : ops) {
      for (std::size_t i = 1; i < op->inputs.size(); ++i) {
        const auto* read = op->inputs[i].storage;
        if (entries_.count(read) || !deferred_ops_of(read)) continue;
        add_entry(read, -1);
        work.push_back(read);
      }
    }
  }
  std::unordered_set<uint64_t> scopes;
  uint64_t last_draw = 0;
  for (const auto& item : entries_) {
    for (const auto& op : item.second.ops) {
      scopes.insert(op->scope);
      if (op->generator) last_draw = std::max(last_draw, op->seq);
    }
  }
  dropped_ = take_dropped_draws(scopes, last_draw);
  snapshots_ = !every_group || !dropped_.empty() || needs_snapshots();
  if (snapshots_) take_snapshots();
}

DeferredReplay::~DeferredReplay() {
  if (snapshots_ && next_group_ < groups_.size()) restore_final_states();
}

void DeferredReplay::add_entry(const c10::StorageImpl* key, int group) {
  Entry entry;
  entry.storage = c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(const_cast<c10::StorageImpl*>(key)));
  entry.nbytes = entry.storage.nbytes();
  entry.device = entry.storage.device();
  entry.ops = deferred_ops_of(key).value();
  std::sort(entry.ops.begin(), entry.ops.end(), [](const auto& a, const auto& b) { return a->seq < b->seq; });
  entry.group = group;
  entries_.emplace(key, std::move(entry));
}

bool DeferredReplay::needs_snapshots() const {
  for (const auto& [key, entry] : entries_) {
    for (const auto& op : entry.ops) {
      if (entry.group < 0 && op->generator) return true;  // a draw no group replays
      for (std::size_t i = 1; i < op->inputs.size(); ++i) {
        auto read = entries_.find(op->inputs[i].storage);
        if (read != entries_.end() && read->second.group != entry.group) return true;  // rebuilt on its own
      }
    }
  }
  // Do the groups, in order, draw in recording order?
  std::vector<uint64_t> draws;
  for (const auto& group : groups_) {
    std::vector<uint64_t> in_group;
    for (const auto* key : group) {
      for (const auto& op : entries_.at(key).ops) {
        if (op->generator) in_group.push_back(op->seq);
      }
    }
    std::sort(in_group.begin(), in_group.end());
    draws.insert(draws.end(), in_group.begin(), in_group.end());
  }
  return !std::is_sorted(draws.begin(), draws.end());
}

void DeferredReplay::take_snapshots() {
  struct Draw {
    const DeferredOp* op;
    std::size_t nbytes;
    c10::Device device;
  };
  std::vector<Draw> draws;
  for (const auto& item : entries_) {
    for (const auto& op : item.second.ops) {
      if (op->generator) draws.push_back({op.get(), item.second.nbytes, item.second.device});
    }
  }
  for (const auto& d : dropped_) draws.push_back({d.op.get(), d.nbytes, d.device});
  std::sort(draws.begin(), draws.end(), [](const Draw& a, const Draw& b) { return a.op->seq < b.op->seq; });
  std::vector<at::Generator> generators;
  for (const auto& [op, nbytes, device] : draws) {
    const at::Generator& generator = *op->generator;
    state_before_[op] = state_of(generator);
    if (std::find(generators.begin(), generators.end(), generator) == generators.end()) generators.push_back(generator);
    // Draw as eager construction did, into scratch memory the size of the tensor's storage.
    std::vector<c10::IValue> stack = op->args;
    if (!op->factory) stack[op->inputs.front().index] = over(scratch(nbytes, device), written(*op));
    call(*op, std::move(stack));
  }
  for (const auto& generator : generators) final_states_.emplace_back(generator, state_of(generator));
}

void DeferredReplay::restore_final_states() {
  for (const auto& [generator, state] : final_states_) set_state(generator, state);
}

void DeferredReplay::run(const DeferredOp& op, const at::Tensor& target, int group) {
  if (snapshots_ && op.generator) set_state(*op.generator, state_before_.at(&op));
  std::vector<c10::IValue> stack = op.args;
  if (op.factory) {
    const at::Tensor made = call(op, std::move(stack));
    c10::impl::ExcludeDispatchKeyGuard no_defer(kExtensionKey);
    at::NoGradGuard no_grad;
    target.copy_(made);
    return;
  }
  stack[op.inputs.front().index] = target;
  for (std::size_t i = 1; i < op.inputs.size(); ++i) stack[op.inputs[i].index] = value_of(op.inputs[i], op.seq, group);
  call(op, std::move(stack));
}

at::Tensor DeferredReplay::value_of(const DeferredOp::Input& input, uint64_t seq, int group) {
  auto it = entries_.find(input.storage);
  if (it == entries_.end()) return over(input.keep_alive, input.geometry);  // materialised before: its values now
  const Entry& entry = it->second;
  // The group replays all its records in recording order: the storage holds its value at `seq`.
  if (group >= 0 && entry.group == group) return over(entry.storage, input.geometry);
  const c10::Storage rebuilt = scratch(entry.nbytes, entry.device);  // see needs_snapshots(): draws are placed
  for (const auto& op : entry.ops) {
    if (op->seq >= seq) break;
    run(*op, over(rebuilt, written(*op)), /*group=*/-1);
  }
  return over(rebuilt, input.geometry);
}

void DeferredReplay::materialize(std::size_t group) {
  TORCH_INTERNAL_ASSERT(group == next_group_ && group < groups_.size(), "DeferredReplay: group ", group,
                        " out of order (next is ", next_group_, ")");
  std::vector<std::pair<const DeferredOp*, const Entry*>> ops;
  for (const auto* key : groups_[group]) {
    const Entry& entry = entries_.at(key);
    c10::StorageImpl* storage = entry.storage.unsafeGetStorageImpl();
    // CUDA's caching allocator allocates on the current device, not the storage's: make it current.
    const c10::DeviceGuard on_device(entry.device);
    storage->set_data_ptr_noswap(storage->allocator()->allocate(storage->nbytes()));
    for (const auto& op : entry.ops) ops.emplace_back(op.get(), &entry);
  }
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.first->seq < b.first->seq; });
  for (const auto& [op, entry] : ops) run(*op, over(entry->storage, written(*op)), static_cast<int>(group));
  const std::unordered_set<const c10::StorageImpl*> done(groups_[group].begin(), groups_[group].end());
  for (const auto* key : groups_[group]) {
    forget_deferred(key);
    entries_.at(key).storage = c10::Storage();  // the module owns it now (FSDP frees it once flattened)
  }
  for (const auto& t : group_tensors_[group]) {
    if (t.defined() && t.has_storage() && done.count(t.storage().unsafeGetStorageImpl())) set_extension_key(t, false);
  }
  group_tensors_[group].clear();
  if (++next_group_ == groups_.size() && snapshots_) restore_final_states();
}

}  // namespace cpprun::detail

namespace cpprun {

void materialize(torch::nn::Module& module) {
  std::vector<at::Tensor> tensors;
  for (const auto& p : module.parameters()) tensors.push_back(p);
  for (const auto& b : module.buffers()) tensors.push_back(b);
  detail::DeferredReplay replay({tensors});
  replay.materialize(0);
}

}  // namespace cpprun
