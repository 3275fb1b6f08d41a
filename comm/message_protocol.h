// The parts of a point-to-point message (header, data, acknowledgement) that single messages
// (comm/point_to_point.cpp) and batches (comm/batch_point_to_point.cpp) share. Internal to comm/.
// See Note [Point-to-point messages] and Note [Batched messages].
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <string>

#include "comm/c10d_types.h"
#include "comm/group_impl.h"
#include "cpprun/collectives.h"
#include "cpprun/process_group.h"

namespace cpprun::detail {

// kAgreed: a message posted without header or acknowledgement, whose size both ends already agree
// on (Note [Messages of agreed size]); a tag space of its own, so it never pairs with a checked
// message's data.
enum class MessagePart { kHeader = 0, kData = 1, kAck = 2, kAgreed = 3 };
// The Gloo (or NCCL) tag of one part of a message with the user's `tag`.
int wire_tag(int tag, MessagePart part);

// A message's place among the batched messages between its two ranks in its direction; single
// messages have none. See Note [Batched messages].
constexpr int64_t kNotBatched = -1;

// A receive's place among the receives of its tag for one of their steps (posting the data,
// sending the acknowledgement). Taken under GroupImpl::p2p_mutex, at the call.
struct Turn {
  std::shared_future<void> previous;          // the receive before: its step done
  std::shared_ptr<std::promise<void>> done;   // this one's
};
Turn take_turn(std::map<int, std::shared_future<void>>& chain, int tag);

// In the receive's thread: waits for the receive before to have taken its step, and signals this
// one's when told or when it goes, so that a failed receive never holds up the next.
class TurnGuard {
 public:
  explicit TurnGuard(Turn turn) : turn_(std::move(turn)) {}
  TurnGuard(const TurnGuard&) = delete;
  TurnGuard& operator=(const TurnGuard&) = delete;
  ~TurnGuard() { done(); }
  void wait_for_previous() const {
    if (turn_.previous.valid()) turn_.previous.wait();
  }
  void done() {
    if (turn_.done) turn_.done->set_value();
    turn_.done.reset();
  }

 private:
  Turn turn_;
};

// The checks every send and receive makes before anything is posted; `peer_name` ("dst", "src")
// names the peer in messages.
void check_message(const char* op, const ProcessGroup& group, const at::Tensor& tensor, int peer,
                   const char* peer_name, int tag);

// What both ends compare: dtype, element count, tag and the batch position.
at::Tensor header_of(const at::Tensor& tensor, int tag, int64_t position);

// Waits for one part; a failure or timeout says which part, the peer and the tag.
void wait_for(const c10::intrusive_ptr<C10dWork>& work, const GroupImpl& impl, const char* what, int peer,
              int tag);

// Throws the message both ends give when the sender's header and the receiver's do not match.
void check_match(const at::Tensor& sent, const at::Tensor& expected, int sender, int receiver, int me);

// The tensor a backend carries: NCCL takes CUDA tensors as they are, Gloo as bits it knows.
at::Tensor wire(const GroupImpl& impl, const at::Tensor& t);

// A single send or receive (position kNotBatched), or a batched one on Gloo, whose data goes as a
// single message's does. `label` goes to the flight recorder.
Work post_send(const ProcessGroup& group, at::Tensor tensor, int dst, int tag, std::string label, int64_t position);
Work post_recv(const ProcessGroup& group, at::Tensor tensor, int src, int tag, std::string label, int64_t position,
               int* source);

}  // namespace cpprun::detail
