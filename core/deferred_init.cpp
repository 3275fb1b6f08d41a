// See deferred_init.h.
#include "core/deferred_init.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorOptions.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/extension_key.h"
#include "cpprun/deferred_init.h"

namespace cpprun::detail {
namespace {

thread_local int scope_depth = 0;
thread_local uint64_t current_scope = 0;
std::atomic<uint64_t> next_scope{1};
std::atomic<uint64_t> next_seq{1};

struct Entry {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  DeferredOps ops;
  std::size_t nbytes = 0;
  c10::Device device = c10::Device(c10::kCPU);
};

// Note [Dropped draws]
// A deferred tensor can die unmaterialised while its module is built: a member made by a default
// initialiser (`Linear a{4, 4};`) and replaced in the constructor. Eager construction drew its
// random numbers all the same, so the values drawn after it depend on them. Its random records are
// therefore kept when its entry goes, and replayed (on scratch memory, in recording order) by the
// next materialisation of tensors recorded in the same deferred_init scope. A dropped draw of a
// scope with no live deferred tensor left is discarded: nothing of that scope can be materialised
// any more (a whole model built deferred and thrown away, e.g. before a reseed, draws nothing).
struct Registry {
  std::mutex mutex;
  std::unordered_map<const c10::StorageImpl*, Entry> entries;
  std::size_t pruned_at = 64;  // entries of tensors dropped unmaterialised are pruned when it doubles
  std::vector<DroppedDraw> dropped;
};

Registry& registry() {
  static Registry r;
  return r;
}

bool died(const Entry& entry, const c10::StorageImpl* storage) {
  return entry.storage.expired() || entry.storage.lock().get() != storage;
}

// Removes the entry of a storage that died unmaterialised, keeping its draws (the caller holds the mutex).
std::unordered_map<const c10::StorageImpl*, Entry>::iterator drop_locked(
    Registry& r, std::unordered_map<const c10::StorageImpl*, Entry>::iterator it) {
  for (const auto& op : it->second.ops) {
    if (op->generator) r.dropped.push_back({op, it->second.nbytes, it->second.device});
  }
  return r.entries.erase(it);
}

// Drops the entries of dead storages, then the dropped draws of scopes with no live entry left.
void sweep_locked(Registry& r) {
  std::unordered_set<uint64_t> live_scopes;
  for (auto it = r.entries.begin(); it != r.entries.end();) {
    if (died(it->second, it->first)) {
      it = drop_locked(r, it);
      continue;
    }
    for (const auto& op : it->second.ops) live_scopes.insert(op->scope);
    ++it;
  }
  r.dropped.erase(std::remove_if(r.dropped.begin(), r.dropped.end(),
                                 [&](const DroppedDraw& d) { return live_scopes.count(d.op->scope) == 0; }),
                  r.dropped.end());
}

// The entry of a live deferred storage (the caller holds the mutex).
Entry* find_locked(Registry& r, const c10::StorageImpl* storage) {
  auto it = r.entries.find(storage);
  if (it == r.entries.end()) return nullptr;
  // A storage that died unmaterialised leaves its entry; a new one may reuse its address.
  if (died(it->second, storage)) {
    drop_locked(r, it);
    return nullptr;
  }
  return &it->second;
}

void add_entry(const at::Tensor& tensor, std::shared_ptr<const DeferredOp> factory) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.entries.size() >= 2 * r.pruned_at) {
    sweep_locked(r);
    r.pruned_at = std::max<std::size_t>(64, r.entries.size());
  }
  const c10::StorageImpl* key = tensor.storage().unsafeGetStorageImpl();
  find_locked(r, key);  // a dead storage's entry at this address goes first, keeping its draws
  Entry entry{c10::weak_intrusive_ptr<c10::StorageImpl>(tensor.storage().getWeakStorageImpl()), {},
              tensor.storage().nbytes(), tensor.device()};
  if (factory) entry.ops.push_back(std::move(factory));
  r.entries.insert_or_assign(key, std::move(entry));
}

TensorGeometry geometry_of(const at::Tensor& t) {
  return TensorGeometry{t.scalar_type(), t.sizes().vec(), t.strides().vec(), t.storage_offset()};
}

std::string op_name(const c10::OperatorHandle& op) {
  const auto& name = op.schema().operator_name();
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

bool is_tensor_type(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType) return true;
  if (auto optional = type->cast<c10::OptionalType>()) return is_tensor_type(optional->getElementType());
  if (auto list = type->cast<c10::ListType>()) return is_tensor_type(list->getElementType());
  return false;
}

bool draws_random(const c10::OperatorHandle& op) {
  for (const auto& arg : op.schema().arguments()) {
    const auto& type = arg.type();
    auto optional = type->cast<c10::OptionalType>();
    if ((optional ? optional->getElementType() : type)->kind() == c10::TypeKind::GeneratorType) return true;
  }
  // randn(size), rand(size), randint(high, size), randperm(n) draw from the default generator.
  return op.schema().name().rfind("aten::rand", 0) == 0;
}

// The generator an op draws from: its own argument, else the device's default one.
at::Generator generator_for(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args, c10::Device device) {
  const auto& schema = op.schema().arguments();
  for (std::size_t i = 0; i < schema.size(); ++i) {
    if (args[i].isGenerator()) return args[i].toGenerator();
  }
  return at::globalContext().defaultGenerator(device);
}

// A factory: takes no tensor, returns one, and is told its device.
std::optional<std::size_t> factory_device_argument(const c10::FunctionSchema& schema) {
  if (schema.returns().size() != 1 || schema.returns()[0].type()->kind() != c10::TypeKind::TensorType) return {};
  std::optional<std::size_t> device;
  for (std::size_t i = 0; i < schema.arguments().size(); ++i) {
    if (is_tensor_type(schema.arguments()[i].type())) return {};
    if (schema.arguments()[i].name() == "device") device = i;
  }
  return device;
}

// Views need no data: they are made as usual and inherit the key (and the storage).
bool is_view(const c10::FunctionSchema& schema) {
  if (schema.returns().empty()) return false;
  for (const auto& arg : schema.arguments()) {
    if (arg.alias_info() && arg.alias_info()->isWrite()) return false;
  }
  for (const auto& ret : schema.returns()) {
    if (!ret.alias_info() || ret.alias_info()->isWrite()) return false;
  }
  return true;
}

// In-place ops that initialisation code applies to parameters (torch::nn::init, reset_parameters,
// trunc_normal_'s arithmetic), recorded on the tensor they write, the first argument.
constexpr std::array<const char*, 24> kRecordable = {
    "aten::normal_",  "aten::uniform_",    "aten::zero_",     "aten::fill_",        "aten::copy_",
    "aten::random_",  "aten::bernoulli_",  "aten::exponential_", "aten::geometric_", "aten::log_normal_",
    "aten::cauchy_",  "aten::mul_",        "aten::div_",      "aten::add_",         "aten::sub_",
    "aten::clamp_",   "aten::clamp_min_",  "aten::clamp_max_", "aten::erfinv_",     "aten::fill_diagonal_",
    "aten::sqrt_",    "aten::abs_",        "aten::neg_",      "aten::masked_fill_"};

bool recordable(const c10::FunctionSchema& schema) {
  const auto& name = schema.name();
  if (std::find(kRecordable.begin(), kRecordable.end(), name) == kRecordable.end()) return false;
  const auto& args = schema.arguments();
  return !args.empty() && args[0].alias_info() && args[0].alias_info()->isWrite();
}

// Ops that read only sizes, strides and types (Module::to() asks _has_compatible_shallow_copy_type).
constexpr std::array<const char*, 15> kMetadataOnly = {
    "aten::_has_compatible_shallow_copy_type", "aten::is_same_size", "aten::size", "aten::stride", "aten::sym_size",
    "aten::sym_stride", "aten::sym_numel", "aten::sym_storage_offset", "aten::dim", "aten::numel",
    "aten::is_complex", "aten::is_floating_point", "aten::is_conj", "aten::is_neg", "aten::is_inference"};

bool reads_metadata_only(const c10::FunctionSchema& schema) {
  return std::find(kMetadataOnly.begin(), kMetadataOnly.end(), schema.name()) != kMetadataOnly.end();
}

const char* kMaterialiseHint =
    "Materialise the module first: cpprun::materialize(module), or wrap it in cpprun::FullyShardedDataParallel, "
    "which materialises it unit by unit. Or do this computation outside the cpprun::deferred_init scope.";

at::Tensor make_deferred(const at::Tensor& meta, c10::Device device) {
  const std::size_t nbytes = at::detail::computeStorageNbytes(meta.sizes(), meta.strides(), meta.dtype().itemsize());
  // The device's allocator, for when the storage is materialised (core/deferred_replay.cpp).
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, c10::DataPtr(nullptr, device),
                       c10::GetAllocator(device.type()), /*resizable=*/true);
  const auto keys = c10::DispatchKeySet(c10::computeDispatchKey(meta.scalar_type(), meta.layout(), device));
  at::Tensor tensor = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), keys, meta.dtype());
  tensor.unsafeGetTensorImpl()->set_sizes_and_strides(meta.sizes(), meta.strides());
  set_extension_key(tensor, true);
  return tensor;
}

void make_factory_output(const c10::OperatorHandle& op, std::size_t device_arg, torch::jit::Stack* stack) {
  const std::size_t n = op.schema().arguments().size();
  std::vector<c10::IValue> args(stack->end() - n, stack->end());
  const c10::Device device = args[device_arg].isNone() ? c10::Device(at::kCPU) : args[device_arg].toDevice();
  TORCH_CHECK(device.type() != at::kMeta, "cpprun::deferred_init: ", op_name(op), " asked for a meta tensor; deferred "
              "tensors take the device they will be materialised on (cpu or cuda).");
  // The same factory on the meta device: its sizes, strides and dtype, and no memory.
  torch::jit::Stack meta(args);
  meta[device_arg] = c10::IValue(c10::Device(at::kMeta));
  {
    c10::impl::ExcludeDispatchKeyGuard no_reentry(kExtensionKey);
    op.callBoxed(meta);
  }
  const at::Tensor shape = meta.at(0).toTensor();
  TORCH_CHECK(shape.layout() == at::kStrided, "cpprun::deferred_init: ", op_name(op), " makes a ", shape.layout(),
              " tensor; only strided (dense) tensors can be deferred. ", kMaterialiseHint);
  at::Tensor tensor = make_deferred(shape, device);
  std::shared_ptr<DeferredOp> record;
  const std::string& name = op.schema().name();
  if (name != "aten::empty" && name != "aten::empty_strided" && name != "aten::empty_permuted") {  // no values to give
    record = std::make_shared<DeferredOp>(op);
    record->seq = next_seq++;
    record->scope = current_scope;
    record->args = args;
    record->factory = true;
    record->result = geometry_of(tensor);
    if (draws_random(op)) record->generator = generator_for(op, args, device);
  }
  add_entry(tensor, std::move(record));
  torch::jit::drop(*stack, n);
  stack->emplace_back(std::move(tensor));
}

// tensor.to(device or dtype) (Module::to()): a new deferred tensor, its value a recorded copy_ of
// the source's.
void make_converted_copy(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const std::size_t n = schema.arguments().size();
  std::vector<c10::IValue> args(stack->end() - n, stack->end());
  const at::Tensor source = args[0].toTensor();
  std::optional<at::ScalarType> dtype;
  std::optional<c10::Device> device;
  for (std::size_t i = 1; i < n; ++i) {
    if (schema.arguments()[i].name() == "dtype" && !args[i].isNone()) dtype = args[i].toScalarType();
    if (schema.arguments()[i].name() == "device" && !args[i].isNone()) device = args[i].toDevice();
  }
  const auto meta_options = at::TensorOptions().dtype(dtype.value_or(source.scalar_type())).device(at::kMeta);
  at::Tensor shape;
  {
    c10::impl::ExcludeDispatchKeyGuard no_reentry(kExtensionKey);
    shape = source.is_non_overlapping_and_dense() ? at::empty_strided(source.sizes(), source.strides(), meta_options)
                                                  : at::empty(source.sizes(), meta_options);
  }
  at::Tensor tensor = make_deferred(shape, device.value_or(source.device()));
  static const c10::OperatorHandle copy = c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy_", "");
  auto record = std::make_shared<DeferredOp>(copy);
  record->seq = next_seq++;
  record->scope = current_scope;
  record->args = {c10::IValue(), c10::IValue(), c10::IValue(false)};
  record->inputs.push_back({0, tensor.storage().unsafeGetStorageImpl(), c10::Storage(), geometry_of(tensor)});
  record->inputs.push_back({1, source.storage().unsafeGetStorageImpl(), source.storage(), geometry_of(source)});
  add_entry(tensor, nullptr);
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    find_locked(r, tensor.storage().unsafeGetStorageImpl())->ops.push_back(std::move(record));
  }
  torch::jit::drop(*stack, n);
  stack->emplace_back(std::move(tensor));
}

}  // namespace

bool deferred_init_scope_active() { return scope_depth > 0; }
void enter_deferred_init_scope() {
  if (scope_depth++ == 0) current_scope = next_scope++;
}
void leave_deferred_init_scope() { --scope_depth; }

bool is_deferred_tensor(const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.key_set().has(kExtensionKey) || !tensor.has_storage()) return false;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return find_locked(r, tensor.storage().unsafeGetStorageImpl()) != nullptr;
}

std::optional<DeferredOps> deferred_ops_of(const c10::StorageImpl* storage) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const Entry* entry = find_locked(r, storage);
  if (!entry) return std::nullopt;
  return entry->ops;
}

void forget_deferred(const c10::StorageImpl* storage) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.entries.erase(storage);
}

std::vector<DroppedDraw> take_dropped_draws(const std::unordered_set<uint64_t>& scopes, uint64_t before_seq) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  sweep_locked(r);
  std::vector<DroppedDraw> taken, kept;
  for (auto& draw : r.dropped) {
    (scopes.count(draw.op->scope) && draw.op->seq < before_seq ? taken : kept).push_back(std::move(draw));
  }
  r.dropped = std::move(kept);
  std::sort(taken.begin(), taken.end(), [](const auto& a, const auto& b) { return a.op->seq < b.op->seq; });
  return taken;
}

bool record_deferred_op(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const std::size_t n = schema.arguments().size();
  std::vector<std::size_t> deferred;  // argument positions holding a deferred tensor
  bool deferred_in_list = false;
  for (std::size_t i = 0; i < n; ++i) {
    const c10::IValue& arg = (*stack)[stack->size() - n + i];
    if (arg.isTensor()) {
      if (is_deferred_tensor(arg.toTensor())) deferred.push_back(i);
    } else if (arg.isList()) {
      for (const c10::IValue& item : arg.toListRef()) {
        if (item.isTensor() && is_deferred_tensor(item.toTensor())) deferred_in_list = true;
      }
    }
  }
  if (deferred.empty() && !deferred_in_list) {
    if (!deferred_init_scope_active()) return false;
    const auto device_arg = factory_device_argument(schema);
    if (!device_arg) return false;
    make_factory_output(op, *device_arg, stack);
    return true;
  }
  if (!deferred_in_list && is_view(schema)) {
    op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kExtensionKey), stack);
    return true;
  }
  if (!deferred_in_list && (schema.name() == "aten::set_data" || reads_metadata_only(schema))) {
    // Module::to(): the parameter's TensorImpl takes the new tensor's storage (and key set); queries.
    op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kExtensionKey), stack);
    return true;
  }
  if (!deferred_in_list && deferred.size() == 1 && deferred.front() == 0 && schema.name() == "aten::_to_copy") {
    make_converted_copy(op, stack);
    return true;
  }
  const bool writes_deferred = !deferred.empty() && deferred.front() == 0;
  TORCH_CHECK(!deferred_in_list && writes_deferred && recordable(schema),
              "cpprun::deferred_init: ", op_name(op), " was applied to a tensor whose initialisation is deferred (made "
              "inside cpprun::deferred_init, so it has no memory yet). Only initialisation ops are recorded: factories "
              "(empty, zeros, ones, full, rand, randn, ...), views, and in-place normal_, uniform_, zero_, fill_, copy_, "
              "random_, bernoulli_, mul_, add_, clamp_, erfinv_, ... on the deferred tensor. ", kMaterialiseHint);
  auto record = std::make_shared<DeferredOp>(op);
  record->seq = next_seq++;
  record->scope = current_scope;
  record->args.assign(stack->end() - n, stack->end());
  const at::Tensor self = record->args[0].toTensor();
  for (std::size_t i : deferred) {
    const at::Tensor t = record->args[i].toTensor();
    DeferredOp::Input input{i, t.storage().unsafeGetStorageImpl(), i == 0 ? c10::Storage() : t.storage(), geometry_of(t)};
    record->inputs.push_back(std::move(input));
    record->args[i] = c10::IValue();
  }
  if (draws_random(op)) {
    TORCH_CHECK(deferred.size() == 1, "cpprun::deferred_init: ", op_name(op), " draws random numbers and reads another "
                "deferred tensor; this cannot be recorded. ", kMaterialiseHint);
    record->generator = generator_for(op, record->args, self.device());
  }
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    Entry* entry = find_locked(r, self.storage().unsafeGetStorageImpl());
    TORCH_INTERNAL_ASSERT(entry, "cpprun::deferred_init: lost the records of a deferred tensor");
    entry->ops.push_back(std::move(record));
  }
  torch::jit::drop(*stack, n);
  stack->emplace_back(self);  // in place: returns its first argument
  return true;
}

}  // namespace cpprun::detail

namespace cpprun {

DeferredInitGuard::DeferredInitGuard()
    : key_was_included_(c10::impl::tls_is_dispatch_key_included(detail::kExtensionKey)) {
  // Every operator on this thread now meets the key's fallback, factories included.
  c10::impl::tls_set_dispatch_key_included(detail::kExtensionKey, true);
  detail::enter_deferred_init_scope();
}

DeferredInitGuard::~DeferredInitGuard() {
  detail::leave_deferred_init_scope();
  c10::impl::tls_set_dispatch_key_included(detail::kExtensionKey, key_was_included_);
}

bool is_deferred(const at::Tensor& tensor) { return detail::is_deferred_tensor(tensor); }

}  // namespace cpprun
