// send / recv / isend / irecv with a header and an acknowledgement around each message.
#include "cpprun/point_to_point.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <future>
#include <string>

#include "comm/collective_support.h"
#include "comm/labelled_messages.h"
#include "comm/message_protocol.h"
#include "comm/peer_loss.h"
#include "comm/work_state.h"

namespace cpprun {
namespace detail {

// Note [Point-to-point messages]
// Gloo does not compare sizes: a receive posted for more bytes than its message completes half
// written, one for fewer aborts the process in Gloo's I/O thread. So a message is three: the
// sender's header (its call's fingerprint: dtype, element count, tag), then the data, then the
// receiver's acknowledgement (its own fingerprint) back. The receiver posts its data receive only
// after the header has arrived: matching, into the caller's tensor; not matching, into a scratch
// tensor of the sender's size, so the channel stays clean for later messages. Both ends then
// compare the two fingerprints and throw the same message on a mismatch. A send completes when
// the receiver has the data. Gloo pairs messages by (peer, tag) in posting order, so headers are
// posted at the call; data receives of one tag are posted in call order too (each waits for the
// previous one's), or two receives of one tag from one sender could swap their messages; and so
// are their acknowledgements, sent from the receives' threads, or a sender could compare its
// header with another message's acknowledgement.
// Tags live above the rings' (comm/ring.cpp), which stay below 2^30.
int wire_tag(int tag, MessagePart part) { return (1 << 30) | (tag << 2) | static_cast<int>(part); }

void check_message(const char* op, const ProcessGroup& group, const at::Tensor& tensor, int peer,
                   const char* peer_name, int tag) {
  check_tensor(op, "tensor", tensor);
  check_member(op, group);
  TORCH_CHECK(tag >= 0 && tag <= kMaxTag, "cpprun::", op, ": tag ", tag, " is outside 0..", kMaxTag, ".");
  if (peer == kAnySource) {
    TORCH_CHECK(std::string(peer_name) != "dst", "cpprun::", op, ": dst is kAnySource (", kAnySource,
                "), which only a receive may name; send to a rank of the group, 0..", group.size() - 1, ".");
    TORCH_CHECK(group.size() > 1, "cpprun::", op, ": a group of one has no other rank to receive from.");
    return;
  }
  check_rank(op, peer_name, peer, group);
  TORCH_CHECK(peer != group.rank(), "cpprun::", op, ": rank ", group.rank(), " cannot message itself (",
              peer_name, " ", peer, "); copy the tensor instead.");
}

Turn take_turn(std::map<int, std::shared_future<void>>& chain, int tag) {
  Turn turn;
  turn.done = std::make_shared<std::promise<void>>();
  auto& last = chain[tag];
  turn.previous = last;
  last = turn.done->get_future().share();
  return turn;
}

at::Tensor header_of(const at::Tensor& tensor, int tag, int64_t position) {
  // The fingerprint's root holds the batch position (comm/collective_fingerprint.h).
  std::optional<int> root;
  if (position != kNotBatched) root = static_cast<int>(position % (int64_t{1} << 31));
  return fingerprint(CollectiveCall{CollectiveKind::kSendRecv, {tensor}, root, std::nullopt}, tag);
}

void wait_for(const c10::intrusive_ptr<C10dWork>& work, const GroupImpl& impl, const char* what, int peer,
              int tag) {
  try {
    work->wait(impl.timeout);
  } catch (const std::exception& e) {
    const std::string said = c10d_text(e);
    if (peer_connection_lost(said) || closed_by_earlier_timeout(said)) {
      TORCH_CHECK(false, "cpprun: rank ", impl.env.rank, " waiting for ", what, " (peer ", peer, ", tag ", tag,
                  "): ", c10d_meaning(said), ".",
                  closed_by_earlier_timeout(said) ? "" : " A rank that returns while its peer still sends or "
                                                         "receives made fewer messages than the peer expects.",
                  "\nc10d said: ", said);
    }
    TORCH_CHECK(false, "cpprun: rank ", impl.env.rank, " waited ", impl.timeout.count(), " ms for ", what,
                " (peer ", peer, ", tag ", tag, ") without success. Does the peer make the matching ",
                "send/recv with this tag? It may also have stopped or failed.\nc10d said: ", said);
  }
}

void check_match(const at::Tensor& sent, const at::Tensor& expected, int sender, int receiver, int me) {
  if (auto message = mismatch(sent, {sent, expected}, {sender, receiver}, Agreement::kSameNumel)) {
    // The fingerprints' sequence number is the tag: say so.
    const std::string collective = "collective #" + std::to_string(sequence_of(sent));
    if (auto at = message->find(collective); at != std::string::npos) {
      message->replace(at, collective.size(), "message with tag " + std::to_string(sequence_of(sent)));
    }
    std::string order;
    if (root_of(sent) != root_of(expected)) {
      order = " Between two ranks, batched messages pair in the order each rank lists them, whatever "
              "their tags (as NCCL pairs them), and only with batched ones: list them in one order on "
              "both ranks, and batch both ends of a message or neither.";
    }
    TORCH_CHECK(false, *message, order, " (found on rank ", me, ": rank ", sender, " sent a message that rank ",
                receiver, "'s receive does not fit; sender and receiver need one dtype and element count.)");
  }
}

at::Tensor wire(const GroupImpl& impl, const at::Tensor& t) {
  return impl.is_nccl(t) ? t : as_movable_bits(t);
}

Work post_send(const ProcessGroup& group, at::Tensor tensor, int dst, int tag, std::string label, int64_t position) {
  check_message("isend", group, tensor, dst, "dst", tag);
  auto& impl = impl_of(group);
  const uint64_t record = record_message(impl.recorded, ++impl.p2p_issued, "send", tensor, dst, tag, std::move(label));
  at::Tensor header = header_of(tensor, tag, position);
  at::Tensor ack = at::empty_like(header);
  std::vector<at::Tensor> header_list{header}, data_list{wire(impl, tensor)}, ack_list{ack};
  const int rank = impl.env.rank;
  auto header_send = post_message("a send's header", rank, dst, tag, [&] {
    return impl.gloo->send(header_list, dst, wire_tag(tag, MessagePart::kHeader));
  });
  c10::intrusive_ptr<C10dWork> data_send;
  {
    // See Note [Batched messages]: no single message's data enters a batch's NCCL group.
    std::unique_lock<std::mutex> lock(impl.nccl_p2p_mutex, std::defer_lock);
    if (impl.is_nccl(tensor)) lock.lock();
    data_send = post_message("a send's data", rank, dst, tag, [&] {
      return impl.group_for(tensor).send(data_list, dst, wire_tag(tag, MessagePart::kData));
    });
  }
  auto ack_recv = post_message("a send's acknowledgement receive", rank, dst, tag, [&] {
    return impl.gloo->recv(ack_list, dst, wire_tag(tag, MessagePart::kAck));
  });
  const int me = group.rank();
  const ProcessGroup keep = group;
  auto done = std::async(std::launch::async, [=, &impl]() {
    wait_for(header_send, impl, "a send's header to be taken", dst, tag);
    wait_for(data_send, impl, "a send's data to be taken", dst, tag);
    wait_for(ack_recv, impl, "the receiver's acknowledgement", dst, tag);
    check_match(header, ack, me, dst, me);
    (void)keep;
  });
  Work work = make_work(done.share());
  work.keep_alive(group);
  attach_record(work, record, impl.timeout);
  return work;
}

Work post_recv(const ProcessGroup& group, at::Tensor tensor, int src, int tag, std::string label, int64_t position,
               int* source) {
  tensor = written_in_place(tensor);
  check_message("irecv", group, tensor, src, "src", tag);
  auto& impl = impl_of(group);
  const uint64_t record = record_message(impl.recorded, ++impl.p2p_issued, "recv", tensor,
                                         src == kAnySource ? std::nullopt : std::optional<int>(src), tag,
                                         std::move(label));
  at::Tensor mine = header_of(tensor, tag, position);
  at::Tensor theirs = at::empty_like(mine);
  std::vector<at::Tensor> header_list{theirs};
  auto header_recv = post_message("a receive's header", impl.env.rank, src, tag, [&] {
    return src == kAnySource ? impl.gloo->recvAnysource(header_list, wire_tag(tag, MessagePart::kHeader))
                             : impl.gloo->recv(header_list, src, wire_tag(tag, MessagePart::kHeader));
  });
  Turn data_turn, ack_turn;
  {
    std::lock_guard<std::mutex> lock(impl.p2p_mutex);
    data_turn = take_turn(impl.p2p_data_posted, tag);
    ack_turn = take_turn(impl.p2p_ack_sent, tag);
  }
  const int me = group.rank();
  const ProcessGroup keep = group;
  auto done = std::async(std::launch::async, [=, &impl]() {
    (void)keep;
    TurnGuard data_posted(data_turn), ack_sent(ack_turn);
    wait_for(header_recv, impl, "a message's header", src, tag);
    const int sender = src == kAnySource ? header_recv->sourceRank() : src;
    data_posted.wait_for_previous();
    const bool fits = !mismatch(theirs, {theirs, mine}, {sender, me}, Agreement::kSameNumel);
    // A message that does not fit is drained into scratch on the backend it travels by (a CUDA
    // message into a CPU receive cannot be: the sender then fails at its timeout).
    const bool sent_from_cpu = describe(theirs).find("cuda") == std::string::npos;
    const bool drain = !fits && (sent_from_cpu || tensor.is_cuda());
    at::Tensor into = tensor;
    if (drain) {
      into = at::empty({numel_of(theirs, 0)}, tensor.options().dtype(dtype_of(theirs)).device(
                                                  sent_from_cpu ? at::Device(at::kCPU) : tensor.device()));
    }
    c10::intrusive_ptr<C10dWork> data_recv;
    if (fits || drain) {
      std::vector<at::Tensor> data_list{wire(impl, into)};
      std::unique_lock<std::mutex> lock(impl.nccl_p2p_mutex, std::defer_lock);
      if (impl.is_nccl(into)) lock.lock();  // See Note [Batched messages]
      data_recv = impl.group_for(into).recv(data_list, sender, wire_tag(tag, MessagePart::kData));
    }
    data_posted.done();
    if (data_recv) wait_for(data_recv, impl, "a message's data", sender, tag);
    std::vector<at::Tensor> ack_list{mine};
    ack_sent.wait_for_previous();
    auto ack_send = impl.gloo->send(ack_list, sender, wire_tag(tag, MessagePart::kAck));
    ack_sent.done();
    wait_for(ack_send, impl, "the sender to take the acknowledgement", sender, tag);
    if (source) *source = sender;
    check_match(theirs, mine, sender, me, me);
  });
  Work work = make_work(done.share());
  work.keep_alive(group);
  attach_record(work, record, impl.timeout);
  return work;
}

Work isend_labelled(const ProcessGroup& group, at::Tensor tensor, int dst, int tag, std::string label) {
  return post_send(group, std::move(tensor), dst, tag, std::move(label), kNotBatched);
}

Work irecv_labelled(const ProcessGroup& group, at::Tensor tensor, int src, int tag, std::string label, int* source) {
  return post_recv(group, std::move(tensor), src, tag, std::move(label), kNotBatched, source);
}

}  // namespace detail

Work isend(const ProcessGroup& group, at::Tensor tensor, int dst, int tag) {
  return detail::isend_labelled(group, std::move(tensor), dst, tag, {});
}

void send(const ProcessGroup& group, const at::Tensor& tensor, int dst, int tag) {
  isend(group, tensor, dst, tag).wait();
}

Work irecv(const ProcessGroup& group, at::Tensor tensor, int src, int tag, int* source) {
  return detail::irecv_labelled(group, std::move(tensor), src, tag, {}, source);
}

int recv(const ProcessGroup& group, at::Tensor tensor, int src, int tag) {
  int source = src;
  irecv(group, std::move(tensor), src, tag, &source).wait();
  return source;
}

}  // namespace cpprun
