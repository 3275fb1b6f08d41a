// What a cpprun::ProcessGroup holds. Internal to comm/: the rest of cpprun reaches c10d only
// through the functions declared in cpprun's public headers.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <mutex>
#include <vector>

#include "comm/c10d_types.h"
#include "comm/flight_recorder_ring.h"
#include "comm/serial_executor.h"
#include "cpprun/process_group.h"

namespace cpprun {

struct ProcessGroup::Impl {
  // For a subgroup (comm/subgroups.cpp), env.rank and env.world_size are this process's rank in
  // the subgroup and the subgroup's size (both -1 on a non-member); the rest is the job's environment.
  DistEnv env;
  // Whether this process belongs to the group: a subgroup exists on every rank that took part
  // in creating it, but only its members hold backends (see Note [Subgroup creation]).
  bool member = true;
  // The members' ranks in the group this one was created from (empty for a group made by
  // init_process_group), and this process's rank there: for messages.
  std::vector<int> global_ranks;
  int parent_rank = 0;
  // Subgroups created from this group so far: names each one's keys in the store, and is the
  // same on every rank because creation is collective.
  std::atomic<uint32_t> subgroups_created{0};
  Backend backend = Backend::kGloo;
  std::chrono::milliseconds timeout{};
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<detail::C10dGroup> gloo;  // always: CPU tensors, and the fallback
  c10::intrusive_ptr<detail::C10dGroup> nccl;  // CUDA builds with a GPU: CUDA tensors
  DebugLevel debug_level = DebugLevel::kOff;
  // The default mode's checks across ranks (CPPRUN_CHECK_COLLECTIVES, on unless "0"): see
  // checked_across_ranks in comm/collectives.cpp. DETAIL checks every collective regardless.
  bool check_collectives = true;
  // Held while a collective is checked and issued, so that its check and the collective itself
  // follow each other in the group's order on every rank. See Note [Collective consistency check].
  std::mutex issue_mutex;
  // Collectives issued on this group (under issue_mutex): the sequence number errors name.
  uint64_t collectives_issued = 0;
  // Sends and receives issued on this group: their number in the flight recorder.
  std::atomic<uint64_t> p2p_issued{0};
  // The group's name and global ranks, shared by its flight-recorder entries.
  std::shared_ptr<const detail::RecordedGroup> recorded;
  // Tags for point-to-point messages of our own algorithms; every rank draws them in the
  // same order because collectives are called in the same order on every rank.
  std::atomic<uint32_t> next_p2p_op{0};
  // Bytes this rank sent point-to-point in our own algorithms: lets tests check that the ring
  // moves what a native collective would.
  std::atomic<uint64_t> p2p_bytes_sent{0};
  // Point-to-point receives of one tag post their data receives, and send their
  // acknowledgements, in the order they were called: the last one's signal per tag for each.
  // See Note [Point-to-point messages].
  std::mutex p2p_mutex;
  std::map<int, std::shared_future<void>> p2p_data_posted, p2p_ack_sent;
  // Under p2p_mutex: how many messages this rank has sent to / received from each rank (of this
  // group) in batches; each batched message's header carries its place in that order.
  // See Note [Batched messages] (comm/batch_point_to_point.cpp).
  std::map<int, int64_t> batched_sent, batched_received;
  // Held while point-to-point data is posted on NCCL, and across a batch's NCCL group (with
  // issue_mutex), so that no other message enters the group.
  std::mutex nccl_p2p_mutex;
  // Declared last so it is destroyed first: queued ring steps still use the groups above.
  detail::SerialExecutor executor;

  // The backend group that handles tensors on `tensor`'s device.
  detail::C10dGroup& group_for(const at::Tensor& tensor) const {
    if (tensor.is_cuda() && nccl) return *nccl;
    return *gloo;
  }
  bool is_nccl(const at::Tensor& tensor) const { return tensor.is_cuda() && nccl; }
};

namespace detail {

// The library's access to what ProcessGroup keeps private (users cannot name it).
struct GroupAccess {
  using Impl = ProcessGroup::Impl;
  static Impl& impl(const ProcessGroup& group) { return *group.impl_; }
  static ProcessGroup make(std::shared_ptr<Impl> impl) { return ProcessGroup(std::move(impl)); }
};
using GroupImpl = GroupAccess::Impl;
inline GroupImpl& impl_of(const ProcessGroup& group) { return GroupAccess::impl(group); }

}  // namespace detail
}  // namespace cpprun
