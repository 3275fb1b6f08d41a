// Collectives: argument checks, dispatch to the backend group for the tensor's device, and the
// conversions that let Gloo carry what it does not support natively.
#include "cpprun/collectives.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <future>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>
#include <string_view>
#include <vector>

#include "comm/chunked_collectives.h"
#include "comm/collective_wait.h"
#include "comm/collective_support.h"
#include "comm/peer_loss.h"
#include "comm/ring.h"
#include "comm/work_state.h"

namespace cpprun {
namespace detail {

using at::ScalarType;

void check_tensor(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), "cpprun::", op, ": ", name, " is an undefined tensor.");
  TORCH_CHECK(t.layout() == at::kStrided, "cpprun::", op, ": ", name,
              " must be a dense tensor, got layout ", t.layout(), ".");
  // A tensor without memory would be sent from (or received into) a null address: Gloo's socket
  // then fails with EFAULT and aborts the process.
  TORCH_CHECK(t.numel() == 0 || (t.has_storage() && t.storage().data() != nullptr), "cpprun::", op, ": ", name,
              " (shape ", t.sizes(), ", device ", t.device(), ") has no memory: a meta tensor, or a deferred one "
              "(cpprun::deferred_init) not yet materialised. Call cpprun::materialize(module) first, or give the "
              "collective a tensor with values.");
  // Collectives move a tensor's memory as one block; an input could be copied, but a result is
  // written in place, so every tensor is asked to be contiguous alike.
  const bool result = std::string_view(name) != "input";
  // at::conj and at::neg of some tensors are lazy: the memory keeps the values before them and a
  // flag says so. Moved as memory, the values would arrive without the flag, silently
  // unconjugated (PyTorch refuses such tensors too).
  TORCH_CHECK(!t.is_conj() && !t.is_neg(), "cpprun::", op, ": ", name, " (shape ", t.sizes(), ", ", t.scalar_type(),
              ") is a lazily ", t.is_conj() ? "conjugated (at::conj)" : "negated", " view: its memory holds other "
              "values than it shows, and collectives move memory. Pass ",
              t.is_conj() ? "t.resolve_conj()" : "t.resolve_neg()",
              result ? " and use that tensor afterwards (the result is written in place)." : " instead.");
  TORCH_CHECK(t.is_contiguous(), "cpprun::", op, ": ", name, " (shape ", t.sizes(), ") is not contiguous; ",
              result ? "the result is written in place, so pass a contiguous tensor (e.g. t = t.contiguous() "
                       "before the call and use t afterwards)."
                     : "collectives send a tensor's memory as one block: pass input.contiguous().");
}

at::Tensor written_in_place(const at::Tensor& t) { return t.defined() ? t.detach() : t; }

void check_same_kind(const char* op, const at::Tensor& output, const at::Tensor& input) {
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "cpprun::", op,
              ": output dtype ", output.scalar_type(), " differs from input dtype ",
              input.scalar_type(), ".");
  TORCH_CHECK(output.device() == input.device(), "cpprun::", op, ": output is on ",
              output.device(), " but input is on ", input.device(), ".");
}

void check_reduction(const char* op, const at::Tensor& t, ReduceOp reduce) {
  const ScalarType type = t.scalar_type();
  TORCH_CHECK(reduce != ReduceOp::kAvg || at::isFloatingType(type) || at::isComplexType(type), "cpprun::", op,
              ": ReduceOp::kAvg needs a floating-point or complex tensor, got ", type,
              ". Use kSum and divide as your integer semantics require.");
  const bool bitwise = reduce == ReduceOp::kBAnd || reduce == ReduceOp::kBOr || reduce == ReduceOp::kBXor;
  TORCH_CHECK(!bitwise || at::isIntegralType(type, /*includeBool=*/true), "cpprun::", op, ": ReduceOp ",
              to_string(reduce), " needs an integer or bool tensor, got ", type, " (PyTorch refuses it too).");
  TORCH_CHECK(!at::isComplexType(type) || reduce == ReduceOp::kSum || reduce == ReduceOp::kAvg, "cpprun::", op,
              ": ReduceOp ", to_string(reduce), " of a ", type, " tensor: complex tensors are reduced by sum and "
              "average only (PyTorch refuses the others too; complex numbers have no order). Reduce their magnitudes "
              "(at::abs) or their real and imaginary parts (at::view_as_real) instead.");
}

void check_rank(const char* op, const char* what, int rank, const ProcessGroup& group) {
  TORCH_CHECK(rank >= 0 && rank < group.size(), "cpprun::", op, ": ", what, " ", rank,
              " is not a rank of this group (0..", group.size() - 1, ").");
}

void check_member(const char* op, const ProcessGroup& group) {
  const auto& impl = detail::impl_of(group);
  if (impl.member) return;
  std::ostringstream ranks;
  for (std::size_t i = 0; i < impl.global_ranks.size(); ++i) ranks << (i ? ", " : "") << impl.global_ranks[i];
  TORCH_CHECK(false, "cpprun::", op, ": this process (rank ", impl.parent_rank,
              " of the group it was created from) is not a member of this subgroup (ranks ",
              ranks.str(), "). new_group() and split_group() are called by every rank, but only "
              "members may use the group: test group.is_member() before calling collectives on it or "
              "handing it to DDP, FSDP, a sampler or a layer (there, size() and rank() are -1, as "
              "PyTorch's get_world_size and get_rank of a group the rank is not in).");
}

bool alone(const char* op, const ProcessGroup& group) {
  check_member(op, group);
  return group.size() == 1;
}

bool gloo_reduces(ScalarType type) {
  switch (type) {
    case ScalarType::BFloat16:
    case ScalarType::Float:
    case ScalarType::Double:
    case ScalarType::Half:
    case ScalarType::Char:
    case ScalarType::Byte:
    case ScalarType::Int:
    case ScalarType::Long: return true;
    default: return false;
  }
}

ReductionWire gloo_reduction_wire(const at::Tensor& t, ReduceOp reduce) {
  const ScalarType type = t.scalar_type();
  if (gloo_reduces(type)) return {t, true, false};
  switch (type) {
    case ScalarType::Short:
    case ScalarType::Bool: return {t.to(ScalarType::Int), false, false};
    case ScalarType::UInt16:
    case ScalarType::UInt32: return {t.to(ScalarType::Long), false, false};
    case ScalarType::UInt64: {
      const at::Tensor bits = t.view(ScalarType::Long);
      // Sums, products and bitwise operations of the bits wrap as in the type; only the order differs.
      if (reduce != ReduceOp::kMax && reduce != ReduceOp::kMin) return {bits, true, false};
      return {bits.bitwise_xor(std::numeric_limits<int64_t>::min()), false, true};
    }
    case ScalarType::ComplexHalf:
    case ScalarType::ComplexFloat:
    case ScalarType::ComplexDouble: return {at::view_as_real(t), true, false};
    default: break;
  }
  TORCH_CHECK(at::isFloatingType(type), "cpprun: a reduction of a ", type, " tensor: Gloo cannot carry it "
              "(cpprun carries every integer, bool, floating and complex type); convert it first.");
  return {t.to(ScalarType::Float), false, false};
}

void write_back(const at::Tensor& t, const ReductionWire& wire) {
  if (wire.top_bit_flipped) {
    t.view(ScalarType::Long).copy_(wire.wire.bitwise_xor(std::numeric_limits<int64_t>::min()));
  } else if (!wire.aliases) {
    t.copy_(wire.wire);
  }
}

at::Tensor as_movable_bits(const at::Tensor& t) {
  // Gloo moves float, double, half, int8, uint8, int32 and int64 only (Note [Reductions Gloo cannot
  // do]); a type of the same element size carries the others' bits, so the shape stays the same
  // (all_to_all and scatter split by rows). Complex tensors travel as their real and imaginary
  // parts, as PyTorch sends them.
  switch (t.scalar_type()) {
    case ScalarType::BFloat16:
    case ScalarType::Short:
    case ScalarType::UInt16: return t.view(ScalarType::Half);
    case ScalarType::UInt32: return t.view(ScalarType::Int);
    case ScalarType::UInt64: return t.view(ScalarType::Long);
    case ScalarType::Bool:
    case ScalarType::Float8_e4m3fn:
    case ScalarType::Float8_e4m3fnuz:
    case ScalarType::Float8_e5m2:
    case ScalarType::Float8_e5m2fnuz:
    case ScalarType::Float8_e8m0fnu: return t.view(ScalarType::Byte);
    case ScalarType::ComplexHalf:
    case ScalarType::ComplexFloat:
    case ScalarType::ComplexDouble: return at::view_as_real(t);
    default: return t;
  }
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return c10d::ReduceOp::SUM;  // averaged after the sum, on every backend
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
    case ReduceOp::kProduct: return c10d::ReduceOp::PRODUCT;
    case ReduceOp::kBAnd: return c10d::ReduceOp::BAND;
    case ReduceOp::kBOr: return c10d::ReduceOp::BOR;
    case ReduceOp::kBXor: return c10d::ReduceOp::BXOR;
  }
  return c10d::ReduceOp::SUM;
}

// Under DETAIL, every collective. By default (CPPRUN_CHECK_COLLECTIVES unset or 1), over Gloo,
// those whose mismatch Gloo would not report: an all-reduce with SUM on one rank and MAX on
// another, or of one dtype against another of the same width, gives every rank a wrong result
// without an error; one of other sizes aborts in Gloo's I/O thread; a smaller broadcast from the
// root leaves the others' tensors half written; gather, scatter and reduce of mismatched sizes
// corrupt or abort (all-to-all checks its split sizes itself, comm/scatter_gather.cpp). One
// all-gather of a few bytes before each is cheap next to the collective itself
// (docs/process_groups.md, "Collectives"). Our rings check their neighbours themselves, for free
// (comm/ring.cpp); other mismatches need DETAIL.
bool checked_across_ranks(const detail::GroupImpl& impl, const CollectiveCall& call) {
  if (impl.debug_level == DebugLevel::kDetail) return true;
  if (!impl.check_collectives) return false;
  switch (call.kind) {
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kGather:
    case CollectiveKind::kScatter:
    case CollectiveKind::kReduce: return !impl.is_nccl(call.tensors.at(0));
    default: return false;
  }
}

}  // namespace detail

namespace {

using at::ScalarType;
using detail::alone;
using detail::as_movable_bits;
using detail::check_reduction;
using detail::check_same_kind;
using detail::check_tensor;
using detail::CollectiveCall;
using detail::CollectiveKind;
using detail::issue_collective;
using detail::to_c10d;

// Queues one of our ring collectives (comm/ring.h) on the group's executor, behind those issued
// before it. The task must not own the group: were it the last owner, the group would be
// destroyed on its own executor thread. The Work keeps the group alive instead.
template <typename RunRing>
Work submit_ring(const ProcessGroup& group, const CollectiveCall& call, uint64_t sequence,
                 RunRing run) {
  auto& impl = detail::impl_of(group);
  detail::Ring ring;
  ring.group = impl.gloo.get();
  ring.rank = group.rank();
  ring.size = group.size();
  ring.op_index = impl.next_p2p_op++;
  ring.op = call.reduce.value_or(ReduceOp::kSum);
  ring.timeout = impl.timeout;
  ring.bytes_sent = &impl.p2p_bytes_sent;
  ring.call = detail::fingerprint(call, sequence);
  for (const at::Tensor& t : call.tensors) {  // Note [CUDA tensors over Gloo's send/recv] (comm/ring.cpp)
    if (t.defined() && t.is_cuda()) {
      ring.stream = c10::impl::VirtualGuardImpl(t.device().type()).getStream(t.device());
      break;
    }
  }
  Work work = make_work(impl.executor.submit([ring, run]() {
    std::optional<c10::StreamGuard> on_callers_stream;
    if (ring.stream) on_callers_stream.emplace(*ring.stream);
    run(ring);
  }));
  work.keep_alive(group);
  return work;
}

}  // namespace

// ---- Work ----------------------------------------------------------------------------------

Work::Work() = default;
Work::Work(std::shared_ptr<State> state) : state_(std::move(state)) {}

// Note [A Work let go unfinished]
// A message's Work waits in a std::async task, and the last future of a std::async task blocks in
// its destructor until the task ends: `cpprun::isend(group, t, peer);` with the Work let go (as
// PyTorch's `dist.isend(t, peer)` without its request) waited right there for the peer's
// receive, so two ranks that each sent before receiving waited out the group's timeout (an audit,
// 2026-12-07). A task still running when its last Work goes is kept instead and runs on, as a
// PyTorch request let go does (its error, if any, is then nobody's, as there). The list is never
// destroyed, so that nothing waits for such a task at exit; finished tasks leave it as others come.
Work::State::~State() {
  if (!task.valid() || task.wait_for(std::chrono::seconds(0)) == std::future_status::ready) return;
  static std::mutex mutex;
  static auto* unfinished = new std::vector<std::shared_future<void>>();
  std::lock_guard<std::mutex> lock(mutex);
  unfinished->erase(std::remove_if(unfinished->begin(), unfinished->end(),
                                   [](const std::shared_future<void>& f) {
                                     return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
                                   }),
                    unfinished->end());
  unfinished->push_back(std::move(task));
}

void Work::wait() {
  if (!state_) return;
  {
    // Blocking collectives wait here too, as do DDP's and FSDP's; the then step is not waiting.
    detail::CollectiveWaitScope waiting;
    if (state_->before) Work(state_->before).wait();
    try {
      if (state_->c10d_work) state_->c10d_work->wait();
      if (state_->task.valid()) state_->task.get();
    } catch (const c10::Error&) {
      detail::record_failed(state_->recorder_id, state_->timeout, std::current_exception());
      throw;
    } catch (const std::exception& e) {
      // Gloo's own exceptions (a barrier's "Timed out waiting 3000ms for recv operation") reach
      // here bare: named as a collective's failure, with what Gloo's words mean.
      detail::record_failed(state_->recorder_id, state_->timeout, std::current_exception());
      const std::string said = detail::c10d_text(e);
      const std::string meaning = detail::c10d_meaning(said);
      TORCH_CHECK(false, "cpprun: a collective failed in Gloo", meaning.empty() ? "" : ": " + meaning,
                  ".\nc10d said: ", said);
    } catch (...) {
      detail::record_failed(state_->recorder_id, state_->timeout, std::current_exception());
      throw;
    }
  }
  detail::record_completed(state_->recorder_id);
  if (!state_->then) return;
  // Once, even when it throws: call_once would run a throwing step again at the next wait, and
  // a step that issues a collective (PowerSGD's Q) would issue it again on this rank alone. Its
  // error is kept and rethrown by every later wait.
  std::call_once(state_->then_once, [this] {
    try {
      state_->then();
    } catch (...) {
      state_->then_failure = std::current_exception();
    }
  });
  if (state_->then_failure) std::rethrow_exception(state_->then_failure);
}

void Work::keep_alive(const ProcessGroup& group) {
  if (!state_) state_ = std::make_shared<State>();
  state_->group = group;
}

Work Work::then(std::function<void()> step) const {
  auto state = std::make_shared<State>();
  state->before = state_;
  state->then = std::move(step);
  return Work(std::move(state));
}

bool Work::is_completed() const {
  if (!state_) return true;
  if (state_->before && !Work(state_->before).is_completed()) return false;
  if (state_->c10d_work && !state_->c10d_work->isCompleted()) return false;
  if (state_->task.valid() &&
      state_->task.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    return false;
  }
  // The result is in place only after the then-step (kAvg's division, a type carried as another
  // written back, an uneven all_gather's copy-out), which wait() runs: run it here, at once, as
  // PyTorch's is_completed() means the tensors hold the result (code that polls read the sum
  // for an average). A failure stays for wait() to rethrow.
  if (state_->then) {
    try {
      Work(state_).wait();
    } catch (...) {  // rethrown by the caller's wait()
    }
  }
  return true;
}

// ---- all_reduce ----------------------------------------------------------------------------

Work all_reduce_async(const ProcessGroup& group, at::Tensor tensor, ReduceOp op) {
  tensor = detail::written_in_place(tensor);
  check_tensor("all_reduce", "tensor", tensor);
  check_reduction("all_reduce", tensor, op);
  if (alone("all_reduce", group)) return Work();
  auto& impl = detail::impl_of(group);
  // A type Gloo refuses travels as one it reduces: Note [Reductions Gloo cannot do].
  const detail::ReductionWire wire =
      impl.is_nccl(tensor) ? detail::ReductionWire{tensor, true, false} : detail::gloo_reduction_wire(tensor, op);
  CollectiveCall call{CollectiveKind::kAllReduce, {tensor}, std::nullopt, op};
  return issue_collective(group, call, [&](uint64_t) {
    std::vector<at::Tensor> tensors{wire.wire};
    c10d::AllreduceOptions opts;
    opts.reduceOp = to_c10d(op);
    auto work = impl.group_for(tensor).allreduce(tensors, opts);
    const int size = group.size();
    return make_work(std::move(work), [tensor, wire, op, size]() mutable {
      if (op == ReduceOp::kAvg) wire.wire.div_(size);
      detail::write_back(tensor, wire);
    });
  });
}

void all_reduce(const ProcessGroup& group, at::Tensor tensor, ReduceOp op) {
  all_reduce_async(group, std::move(tensor), op).wait();
}

// ---- broadcast -----------------------------------------------------------------------------

Work broadcast_async(const ProcessGroup& group, at::Tensor tensor, int root) {
  tensor = detail::written_in_place(tensor);
  check_tensor("broadcast", "tensor", tensor);
  detail::check_member("broadcast", group);
  detail::check_rank("broadcast", "root", root, group);
  if (alone("broadcast", group)) return Work();
  auto& impl = detail::impl_of(group);
  CollectiveCall call{CollectiveKind::kBroadcast, {tensor}, root, std::nullopt};
  return issue_collective(group, call, [&](uint64_t) {
    std::vector<at::Tensor> tensors{impl.is_nccl(tensor) ? tensor : as_movable_bits(tensor)};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    return make_work(impl.group_for(tensor).broadcast(tensors, opts));
  });
}

void broadcast(const ProcessGroup& group, at::Tensor tensor, int root) {
  broadcast_async(group, std::move(tensor), root).wait();
}

void broadcast_coalesced(const ProcessGroup& group, const std::vector<at::Tensor>& tensors, int root) {
  if (alone("broadcast_coalesced", group)) return;
  // Packed in chunks of at most this many bytes: a model's worth of copies at once would double
  // the memory it takes just to start (what ZeRO-3 is there to avoid).
  constexpr int64_t kChunkBytes = 32 << 20;
  at::NoGradGuard no_grad;  // parameters are written in place
  std::vector<bool> sent(tensors.size(), false);
  auto send = [&](const std::vector<std::size_t>& chunk) {
    if (chunk.size() == 1 && tensors[chunk[0]].is_contiguous()) {
      broadcast(group, tensors[chunk[0]].detach(), root);
      return;
    }
    std::vector<at::Tensor> flat;
    for (std::size_t i : chunk) flat.push_back(tensors[i].detach().reshape({-1}));
    at::Tensor packed = at::cat(flat);
    broadcast(group, packed, root);
    int64_t offset = 0;
    for (std::size_t i : chunk) {
      at::Tensor t = tensors[i].detach();
      t.copy_(packed.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  };
  for (std::size_t first = 0; first < tensors.size(); ++first) {
    if (sent[first]) continue;
    std::vector<std::size_t> chunk;  // later tensors of this one's dtype and device
    int64_t bytes = 0;
    for (std::size_t i = first; i < tensors.size(); ++i) {
      if (sent[i] || tensors[i].scalar_type() != tensors[first].scalar_type() ||
          tensors[i].device() != tensors[first].device()) {
        continue;
      }
      if (!chunk.empty() && bytes + static_cast<int64_t>(tensors[i].nbytes()) > kChunkBytes) {
        send(chunk);
        chunk.clear();
        bytes = 0;
      }
      chunk.push_back(i);
      bytes += static_cast<int64_t>(tensors[i].nbytes());
      sent[i] = true;
    }
    if (!chunk.empty()) send(chunk);
  }
}

// ---- all_gather_into -----------------------------------------------------------------------

Work all_gather_into_async(const ProcessGroup& group, at::Tensor output, at::Tensor input) {
  output = detail::written_in_place(output);
  check_tensor("all_gather_into", "input", input);
  check_tensor("all_gather_into", "output", output);
  check_same_kind("all_gather_into", output, input);
  detail::check_member("all_gather_into", group);
  const int n = group.size();
  TORCH_CHECK(output.numel() == n * input.numel(), "cpprun::all_gather_into: output has ",
              output.numel(), " elements but needs world_size (", n, ") x input (",
              input.numel(), ") = ", n * input.numel(), ".");
  // In place is the input as this rank's own chunk of the output; anywhere else in the output,
  // the ring would write other ranks' chunks over it before sending it on (wrong 3 runs of 4).
  if (input.numel() > 0 && at::get_overlap_status(output, input) != at::MemOverlapStatus::No) {
    const int64_t own_offset = static_cast<int64_t>(group.rank()) * input.numel();
    const bool own_chunk = static_cast<const char*>(input.data_ptr()) ==
                           static_cast<const char*>(output.data_ptr()) + own_offset * output.element_size();
    TORCH_CHECK(own_chunk, "cpprun::all_gather_into: input shares memory with output other than as this rank's "
                "own chunk (elements ", own_offset, " to ", own_offset + input.numel() - 1, " of output): the "
                "gather would overwrite it before sending it. Pass that chunk, or a separate input.");
  }
  auto& impl = detail::impl_of(group);
  if (group.size() == 1) {
    output.view_as(input).copy_(input);
    return Work();
  }
  CollectiveCall call{CollectiveKind::kAllGatherInto, {output, input}, std::nullopt, std::nullopt};
  return issue_collective(group, call, [&](uint64_t sequence) {
    if (impl.is_nccl(input)) {
      // _allgather_base, not all_gather_single: the older name is in every LibTorch 2.x (2.11, on
      // the GPU machine, has no all_gather_single; 2.15 forwards one to the other).
      return make_work(impl.group_for(input)._allgather_base(output, input));
    }
    // Gloo's own all-gather would fill a scratch tensor of the output's size and copy it over:
    // a ring over send/recv moves the same bytes straight into `output`.
    at::Tensor in_bits = as_movable_bits(input);
    at::Tensor out_bits = as_movable_bits(output);
    return submit_ring(group, call, sequence, [out_bits, in_bits](const detail::Ring& ring) {
      detail::run_ring_all_gather(ring, out_bits, in_bits);
    });
  });
}

void all_gather_into(const ProcessGroup& group, at::Tensor output, at::Tensor input) {
  all_gather_into_async(group, std::move(output), std::move(input)).wait();
}

// ---- reduce_scatter ------------------------------------------------------------------------

Work reduce_scatter_async(const ProcessGroup& group, at::Tensor output, at::Tensor input,
                          ReduceOp op) {
  output = detail::written_in_place(output);
  check_tensor("reduce_scatter", "input", input);
  check_tensor("reduce_scatter", "output", output);
  check_same_kind("reduce_scatter", output, input);
  check_reduction("reduce_scatter", input, op);
  detail::check_member("reduce_scatter", group);
  const int n = group.size();
  TORCH_CHECK(input.numel() == n * output.numel(), "cpprun::reduce_scatter: input has ",
              input.numel(), " elements but needs world_size (", n, ") x output (",
              output.numel(), ") = ", n * output.numel(),
              ". Pad the input to a multiple of the world size.");
  auto& impl = detail::impl_of(group);
  if (group.size() == 1) {
    output.view_as(input).copy_(input);
    return Work();
  }
  const ScalarType type = input.scalar_type();
  TORCH_CHECK(impl.is_nccl(input) || (type != ScalarType::UInt16 && type != ScalarType::UInt32 &&
                                      type != ScalarType::UInt64),
              "cpprun::reduce_scatter of a ", type, " tensor on the CPU: LibTorch has no CPU arithmetic for "
              "unsigned types wider than 8 bits (PyTorch's Gloo refuses them too); reduce an int64 copy.");
  // Refused before any message: the ring's additions would fail half-way, with ATen's words.
  TORCH_CHECK(impl.is_nccl(input) || !at::isFloat8Type(type), "cpprun::reduce_scatter of a ", type,
              " tensor on the CPU: LibTorch has no CPU arithmetic for float8 types; reduce a float32 or bfloat16 copy "
              "(all_reduce carries float8 as float32 itself).");
  CollectiveCall call{CollectiveKind::kReduceScatter, {output, input}, std::nullopt, op};
  return issue_collective(group, call, [&](uint64_t sequence) {
    if (impl.is_nccl(input)) {
      c10d::ReduceScatterOptions opts;
      opts.reduceOp = to_c10d(op);
      auto work = impl.group_for(input)._reduce_scatter_base(output, input, opts);  // as _allgather_base
      return make_work(std::move(work), [output, op, n]() mutable {
        if (op == ReduceOp::kAvg) output.div_(n);
      });
    }
    return submit_ring(group, call, sequence, [output, input](const detail::Ring& ring) {
      detail::run_ring_reduce_scatter(ring, output, input);
    });
  });
}

void reduce_scatter(const ProcessGroup& group, at::Tensor output, at::Tensor input, ReduceOp op) {
  reduce_scatter_async(group, std::move(output), std::move(input), op).wait();
}

// ---- the same, of tensors in pieces (comm/chunked_collectives.h) ----------------------------

namespace detail {
namespace {

void check_chunks(const char* op, const ProcessGroup& group, const ChunkedTensor& chunked, int64_t chunk_numel) {
  TORCH_CHECK(static_cast<int>(chunked.chunks.size()) == group.size() && chunked.chunk_numel == chunk_numel,
              "cpprun::", op, ": ", chunked.chunks.size(), " chunks of ", chunked.chunk_numel,
              " elements do not fit a group of ", group.size(), " with ", chunk_numel, " elements per rank.");
}

// What the flight recorder and the checks see: the whole tensor, world x chunk (a view).
at::Tensor described_whole(const at::Tensor& chunk, int world) {
  return chunk.reshape({1, -1}).expand({world, chunk.numel()});
}

}  // namespace

Work all_gather_chunks_in_place_async(const ProcessGroup& group, ChunkedTensor output, at::TensorOptions wire) {
  check_member("all_gather_into", group);
  check_chunks("all_gather_into", group, output, output.chunk_numel);
  if (group.size() == 1) return Work();
  // Described as an all_gather_into of the whole: what it is, and what a rank calling the
  // ordinary all_gather_into of the same size must match.
  // (Views of one element: nothing of the chunk's size is made to describe it.)
  const at::Tensor one = at::empty({1}, wire);
  const at::Tensor described_input = one.expand({output.chunk_numel});
  const at::Tensor described_output = one.expand({group.size(), output.chunk_numel});
  auto& impl = impl_of(group);
  CollectiveCall call{CollectiveKind::kAllGatherInto, {described_output, described_input}, std::nullopt, std::nullopt};
  return issue_collective(group, call, [&](uint64_t sequence) {
    if (impl.is_nccl(described_input)) {
      const int64_t m = output.chunk_numel;
      at::Tensor mine = at::empty({m}, wire);
      pack_chunk(output.chunks[group.rank()], mine);
      at::Tensor whole = at::empty({group.size() * m}, wire);
      auto work = impl.group_for(mine)._allgather_base(whole, mine);
      return make_work(std::move(work), [whole, mine, output = std::move(output), rank = group.rank()] {
        at::Tensor rows = whole.view({static_cast<int64_t>(output.chunks.size()), output.chunk_numel});
        PieceCopies copies;  // every rank's pieces out in one launch
        for (std::size_t q = 0; q < output.chunks.size(); ++q) {
          if (static_cast<int>(q) != rank) unpack_chunk(rows[q], output.chunks[q], copies);
        }
        copies.run();
      });
    }
    return submit_ring(group, call, sequence, [output = std::move(output), wire](const Ring& ring) {
      run_ring_all_gather_in_place(ring, output, wire);
    });
  });
}

Work reduce_scatter_chunks_async(const ProcessGroup& group, at::Tensor output, ChunkedTensor input, ReduceOp op) {
  output = written_in_place(output);
  check_tensor("reduce_scatter", "output", output);
  check_reduction("reduce_scatter", output, op);
  check_member("reduce_scatter", group);
  check_chunks("reduce_scatter", group, input, output.numel());
  if (group.size() == 1) {
    pack_chunk(input.chunks[0], output.view({-1}));
    return Work();
  }
  auto& impl = impl_of(group);
  CollectiveCall call{CollectiveKind::kReduceScatter, {output, described_whole(output, group.size())}, std::nullopt, op};
  return issue_collective(group, call, [&](uint64_t sequence) {
    if (impl.is_nccl(output)) {
      at::Tensor whole = at::empty({group.size() * output.numel()}, output.options());
      at::Tensor rows = whole.view({group.size(), output.numel()});
      PieceCopies copies;  // every rank's chunk in one launch
      for (int q = 0; q < group.size(); ++q) pack_chunk(input.chunks[q], rows[q], copies);
      copies.run();
      c10d::ReduceScatterOptions opts;
      opts.reduceOp = to_c10d(op);
      auto work = impl.group_for(output)._reduce_scatter_base(output, whole, opts);
      const int n = group.size();
      return make_work(std::move(work), [output, whole, op, n]() mutable {
        if (op == ReduceOp::kAvg) output.div_(n);
      });
    }
    return submit_ring(group, call, sequence, [output, input = std::move(input)](const Ring& ring) {
      run_ring_reduce_scatter(ring, output, input);
    });
  });
}

}  // namespace detail

// ---- barrier -------------------------------------------------------------------------------

Work barrier_async(const ProcessGroup& group) {
  if (alone("barrier", group)) return Work();
  CollectiveCall call{CollectiveKind::kBarrier, {}, std::nullopt, std::nullopt};
  return issue_collective(group, call, [&](uint64_t) { return make_work(detail::impl_of(group).gloo->barrier()); });
}

void barrier(const ProcessGroup& group) { barrier_async(group).wait(); }

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kProduct: return "product";
    case ReduceOp::kBAnd: return "band";
    case ReduceOp::kBOr: return "bor";
    case ReduceOp::kBXor: return "bxor";
  }
  return "?";
}

}  // namespace cpprun
