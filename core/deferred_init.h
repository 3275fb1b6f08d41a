// Deferred initialisation, the recording half. Inside a deferred_init scope (cpprun/deferred_init.h)
// a tensor factory (empty, zeros, randn, full, arange, ...) returns a tensor with its sizes,
// strides, dtype and device but no memory, carrying the extension key (core/extension_key.h).
// The initialisation ops then applied to it, or to views of it (normal_, uniform_, zero_, fill_,
// copy_, ...), are recorded per storage with a global sequence number; views are made as usual
// (they need no data); any other op on it fails, naming the op. core/deferred_replay.h runs the
// records later, in the same order, so that the values are those eager construction gives.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Storage.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_set>
#include <utility>
#include <vector>

namespace cpprun::detail {

// Where a tensor lies in its storage.
struct TensorGeometry {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
};

// One recorded operator call: a factory (made the storage's tensor) or an in-place op on it.
struct DeferredOp {
  struct Input {
    std::size_t index;                // in `args`
    const c10::StorageImpl* storage;  // the deferred storage
    c10::Storage keep_alive;          // read inputs only: their records must stay reachable
    TensorGeometry geometry;
  };
  explicit DeferredOp(c10::OperatorHandle handle) : op(std::move(handle)) {}
  uint64_t seq = 0;  // recording order, across all deferred tensors
  uint64_t scope = 0;  // which deferred_init scope (outermost, on its thread) recorded it
  c10::OperatorHandle op;
  std::vector<c10::IValue> args;  // each deferred input's place holds None
  bool factory = false;
  TensorGeometry result;           // factory: the tensor it made
  std::vector<Input> inputs;       // in-place: inputs[0] is the tensor written, the rest are read
  std::optional<at::Generator> generator;  // the generator it draws from, if it draws random numbers
};
using DeferredOps = std::vector<std::shared_ptr<const DeferredOp>>;

bool deferred_init_scope_active();
void enter_deferred_init_scope();
void leave_deferred_init_scope();

// The key's fallback (core/extension_key.cpp): records `op` (or makes a deferred tensor, or a view
// of one) and returns true when it is deferred initialisation's business; false otherwise.
bool record_deferred_op(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

bool is_deferred_tensor(const at::Tensor& tensor);
// The records of a deferred storage (nullopt if it is not one, or no longer).
std::optional<DeferredOps> deferred_ops_of(const c10::StorageImpl* storage);
// The storage has its memory and values now: ops on it run as usual.
void forget_deferred(const c10::StorageImpl* storage);

// A random draw recorded on a deferred tensor that died unmaterialised (Note [Dropped draws]).
struct DroppedDraw {
  std::shared_ptr<const DeferredOp> op;
  std::size_t nbytes = 0;  // of the storage it wrote
  c10::Device device = c10::Device(c10::kCPU);
};
// Hands over, by seq, the dropped draws recorded in one of `scopes` before `before_seq`.
std::vector<DroppedDraw> take_dropped_draws(const std::unordered_set<uint64_t>& scopes, uint64_t before_seq);

}  // namespace cpprun::detail
