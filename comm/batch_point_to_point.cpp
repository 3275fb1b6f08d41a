// batch_isend_irecv: several sends and receives posted at once; on NCCL, their data as one group.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <future>
#include <mutex>
#include <thread>

#include "comm/collective_support.h"
#include "comm/labelled_messages.h"
#include "comm/message_protocol.h"
#include "comm/peer_loss.h"
#include "comm/work_state.h"
#include "cpprun/point_to_point.h"

namespace cpprun {
namespace {

using detail::C10dWork;
using detail::MessagePart;
using detail::wire_tag;

// Note [Batched messages]
// NCCL pairs the sends and receives between two ranks in the order they are issued on its
// communicator, whatever their tags, and a large send waits for its receive. A single receive
// posts its data from its own thread once its header has arrived (Note [Point-to-point
// messages]), so on NCCL two receives from one sender may post in another order than the sends
// were, and two ranks that each send before receiving wait for each other once a message exceeds
// NCCL's buffers. A batch posts the data of every op from the calling thread, in list order,
// inside one NCCL group (Backend::startCoalescing/endCoalescing, as torch.distributed's
// batch_isend_irecv): NCCL progresses them all together. A receive's size is its tensor's, known
// at the call; the Gloo header and acknowledgement still travel around each message and compare
// dtype and element count, but the data is posted by then: after a mismatch on NCCL the message
// names both ranks, and what NCCL made of the mismatched pair is NCCL's (the group should not be
// used again).
// c10d issues batched NCCL messages on the group's communicator and single ones on one per pair,
// so a message sent singly never meets a batched receive; and within the batched ones, order is
// NCCL's only pairing. So each batched message's header carries its place among the batched
// messages from its sender to its receiver (GroupImpl::batched_sent/batched_received), single
// ones none, and a receive whose header says otherwise fails on both ends: on Gloo too, where
// tags alone would pair them, so that CPU runs refuse what would mis-pair on GPUs. On Gloo (and
// for CUDA tensors on a group without NCCL) each op is otherwise a single message.
// Nothing else may enter the NCCL group while it is open: issue_mutex keeps collectives out and
// nccl_p2p_mutex single messages' data (posted from other threads).

const char* name_of(P2POp::Op op) { return op == P2POp::Op::kIsend ? "isend" : "irecv"; }

// Everything is checked before anything is posted: a refused batch sends nothing.
void check_batch(const ProcessGroup& group, const std::vector<P2POp>& ops) {
  TORCH_CHECK(!ops.empty(), "cpprun::batch_isend_irecv: the list of ops is empty; pass at least one isend or "
              "irecv (torch.distributed.batch_isend_irecv refuses an empty list too).");
  detail::check_member("batch_isend_irecv", group);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    TORCH_CHECK(op.op == P2POp::Op::kIsend || op.op == P2POp::Op::kIrecv, "cpprun::batch_isend_irecv: op ", i,
                " is neither P2POp::Op::kIsend nor kIrecv (", static_cast<int>(op.op), ").");
    const bool send = op.op == P2POp::Op::kIsend;
    const std::string what = "batch_isend_irecv: op " + std::to_string(i) + " (" + name_of(op.op) + ")";
    TORCH_CHECK(op.peer != kAnySource, "cpprun::", what, send ? " sends to" : " receives from", " kAnySource (",
                kAnySource, "); a batch names the peer of every op (as torch.distributed.batch_isend_irecv ",
                "does).", send ? "" : " Receive from any source with cpprun::irecv.");
    // PyTorch takes the first op's device for the whole batch; a CPU tensor in an NCCL group
    // would fail inside NCCL, half posted. Two batches say what is meant. (Before the tensor's own
    // checks, which would name a meta tensor's missing memory first.)
    TORCH_CHECK(!op.tensor.defined() || op.tensor.device() == ops[0].tensor.device(), "cpprun::", what,
                "'s tensor is on ", op.tensor.device(), " but op 0's is on ", ops[0].tensor.device(),
                ": one batch's tensors are all on the CPU or all on one GPU (on NCCL a batch is one NCCL group, "
                "which carries CUDA tensors of one device only). Post them as one batch per device.");
    detail::check_message(what.c_str(), group, op.tensor, op.peer, send ? "dst" : "src", op.tag);
  }
}

// Each op's place among the batched messages between its two ranks in its direction.
std::vector<int64_t> take_positions(detail::GroupImpl& impl, const std::vector<P2POp>& ops) {
  std::vector<int64_t> positions;
  std::lock_guard<std::mutex> lock(impl.p2p_mutex);
  for (const P2POp& op : ops) {
    auto& count = op.op == P2POp::Op::kIsend ? impl.batched_sent[op.peer] : impl.batched_received[op.peer];
    positions.push_back(count++);
  }
  return positions;
}

// Waits once for the batch's NCCL group, on a thread of its own: an op whose header check fails
// need not wait for data that may never come.
std::shared_future<void> wait_for_group(const ProcessGroup& group, c10::intrusive_ptr<C10dWork> data,
                                        std::size_t messages) {
  auto promise = std::make_shared<std::promise<void>>();
  std::shared_future<void> done = promise->get_future().share();
  std::thread([group, data = std::move(data), promise, messages]() {
    auto& impl = detail::impl_of(group);
    try {
      try {
        if (data) data->wait(impl.timeout);
      } catch (const std::exception& e) {
        TORCH_CHECK(false, "cpprun: rank ", impl.env.rank, " waited ", impl.timeout.count(), " ms for the data of ",
                    "a batch of ", messages, " message(s) (one NCCL group) without success. Does every peer ",
                    "post its side of each message in a batch? One may also have stopped or failed.\nc10d said: ",
                    e.what());
      }
      promise->set_value();
    } catch (...) {
      promise->set_exception(std::current_exception());
    }
  }).detach();
  return done;
}

std::vector<Work> post_nccl_batch(const ProcessGroup& group, const std::vector<P2POp>& ops,
                                  std::vector<std::string> labels, const std::vector<int64_t>& positions) {
  auto& impl = detail::impl_of(group);
  const int me = group.rank();
  struct Posted {
    uint64_t record = 0;
    at::Tensor mine, theirs;                       // this end's header, the other end's
    c10::intrusive_ptr<C10dWork> header, ack;      // a send's ack receive; a receive sends its later
    detail::Turn ack_turn;                         // a receive's, among its tag's
  };
  std::vector<Posted> posted(ops.size());
  {
    std::lock_guard<std::mutex> lock(impl.p2p_mutex);
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].op == P2POp::Op::kIrecv) posted[i].ack_turn = detail::take_turn(impl.p2p_ack_sent, ops[i].tag);
    }
  }
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    const bool send = op.op == P2POp::Op::kIsend;
    Posted& p = posted[i];
    p.record = detail::record_message(impl.recorded, ++impl.p2p_issued, send ? "send" : "recv", op.tensor, op.peer,
                                      op.tag, labels.empty() ? std::string() : std::move(labels[i]));
    p.mine = detail::header_of(op.tensor, op.tag, positions[i]);
    p.theirs = at::empty_like(p.mine);
    std::vector<at::Tensor> mine{p.mine}, theirs{p.theirs};
    const int rank = impl.env.rank;
    if (send) {
      p.header = detail::post_message("a batched send's header", rank, op.peer, op.tag, [&] {
        return impl.gloo->send(mine, op.peer, wire_tag(op.tag, MessagePart::kHeader));
      });
      p.ack = detail::post_message("a batched send's acknowledgement receive", rank, op.peer, op.tag, [&] {
        return impl.gloo->recv(theirs, op.peer, wire_tag(op.tag, MessagePart::kAck));
      });
    } else {
      p.header = detail::post_message("a batched receive's header", rank, op.peer, op.tag, [&] {
        return impl.gloo->recv(theirs, op.peer, wire_tag(op.tag, MessagePart::kHeader));
      });
    }
  }
  c10::intrusive_ptr<C10dWork> data;
  try {
    std::lock_guard<std::mutex> collectives(impl.issue_mutex);
    std::lock_guard<std::mutex> messages(impl.nccl_p2p_mutex);
    impl.nccl->startCoalescing();
    try {
      for (const P2POp& op : ops) {
        std::vector<at::Tensor> list{op.tensor};
        if (op.op == P2POp::Op::kIsend) {
          impl.nccl->send(list, op.peer, wire_tag(op.tag, MessagePart::kData));
        } else {
          impl.nccl->recv(list, op.peer, wire_tag(op.tag, MessagePart::kData));
        }
      }
    } catch (...) {
      try {
        impl.nccl->endCoalescing();  // never leave the group open for the next NCCL call
      } catch (...) {
      }
      throw;
    }
    data = impl.nccl->endCoalescing();
  } catch (...) {
    for (const Posted& p : posted) detail::record_failed(p.record, impl.timeout, std::current_exception());
    throw;
  }
  std::shared_future<void> data_done = wait_for_group(group, data, ops.size());
  std::vector<Work> works;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    const Posted& p = posted[i];
    const int peer = op.peer, tag = op.tag;
    std::future<void> done;
    if (op.op == P2POp::Op::kIsend) {
      done = std::async(std::launch::async, [&impl, keep = group, p, me, peer, tag, data_done]() {
        (void)keep;
        detail::wait_for(p.header, impl, "a send's header to be taken", peer, tag);
        detail::wait_for(p.ack, impl, "the receiver's acknowledgement", peer, tag);
        detail::check_match(p.mine, p.theirs, me, peer, me);
        data_done.get();
      });
    } else {
      done = std::async(std::launch::async, [&impl, keep = group, p, me, peer, tag, data_done]() {
        (void)keep;
        detail::TurnGuard ack_sent(p.ack_turn);
        detail::wait_for(p.header, impl, "a message's header", peer, tag);
        // Acknowledged before the data has come: the sender learns of a mismatch without
        // waiting for NCCL.
        std::vector<at::Tensor> ack{p.mine};
        ack_sent.wait_for_previous();
        auto ack_send = impl.gloo->send(ack, peer, wire_tag(tag, MessagePart::kAck));
        ack_sent.done();
        detail::wait_for(ack_send, impl, "the sender to take the acknowledgement", peer, tag);
        detail::check_match(p.theirs, p.mine, peer, me, me);
        data_done.get();
      });
    }
    Work work = make_work(done.share());
    work.keep_alive(group);
    detail::attach_record(work, p.record, impl.timeout);
    works.push_back(std::move(work));
  }
  return works;
}

}  // namespace

namespace detail {
namespace {

// batch_isend_irecv_labelled once the batch is checked: header, data and acknowledgement per op.
std::vector<Work> post_checked_batch(const ProcessGroup& group, std::vector<P2POp> ops,
                                     std::vector<std::string> labels) {
  auto& impl = impl_of(group);
  const std::vector<int64_t> positions = take_positions(impl, ops);
  if (impl.is_nccl(ops[0].tensor)) return post_nccl_batch(group, ops, std::move(labels), positions);
  std::vector<Work> works;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    P2POp& op = ops[i];
    std::string label = labels.empty() ? std::string() : std::move(labels[i]);
    works.push_back(op.op == P2POp::Op::kIsend
                        ? post_send(group, std::move(op.tensor), op.peer, op.tag, std::move(label), positions[i])
                        : post_recv(group, std::move(op.tensor), op.peer, op.tag, std::move(label), positions[i],
                                    nullptr));
  }
  return works;
}

void check_labelled_batch(const ProcessGroup& group, const std::vector<P2POp>& ops,
                          const std::vector<std::string>& labels) {
  check_batch(group, ops);
  TORCH_INTERNAL_ASSERT(labels.empty() || labels.size() == ops.size(), "batch_isend_irecv: ", labels.size(),
                        " labels for ", ops.size(), " ops");
}

}  // namespace

std::vector<Work> batch_isend_irecv_labelled(const ProcessGroup& group, std::vector<P2POp> ops,
                                             std::vector<std::string> labels) {
  check_labelled_batch(group, ops, labels);
  return post_checked_batch(group, std::move(ops), std::move(labels));
}

// Note [Messages of agreed size]
// A checked message (Note [Point-to-point messages]) is three Gloo messages and a thread: the
// receiver learns the size from the header before it posts the data, so that a mismatch is an
// error on both ends rather than a half-written tensor or an abort in Gloo's I/O thread. Where
// the two ends already agree on every message's dtype and size, that costs without protecting:
// a pipeline's activations and gradients within a step (its checked shape message, one a step,
// fixes the activations' and the sender checks each micro-batch's against it; a gradient is the
// received activation's, whose shape and dtype autograd keeps). Measured on 2 cores
// (bench/pipeline_bench, 2 ranks, m = 4, 2026-12-02): Interleaved 1F1B took 139-173 ms a step
// with checked messages, 126-130 posted as they are (PyTorch's: 119); 1F1B 132-150 against
// 112-120. Each thread woken per message takes a core from the other rank's compute here.
// On Gloo such a message is posted at the call (as torch.distributed's isend / irecv) in a tag
// space of its own (MessagePart::kAgreed); its wait ends at the group's timeout (Gloo's context
// timeout) and is recorded by the flight recorder as any message. NCCL messages keep the checked
// batch: their data already travel in one NCCL group, and only the headers go by Gloo.
std::vector<Work> batch_isend_irecv_agreed(const ProcessGroup& group, std::vector<P2POp> ops,
                                           std::vector<std::string> labels) {
  check_labelled_batch(group, ops, labels);
  auto& impl = impl_of(group);
  if (impl.is_nccl(ops[0].tensor)) return post_checked_batch(group, std::move(ops), std::move(labels));
  std::vector<Work> works;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    const bool send = op.op == P2POp::Op::kIsend;
    const uint64_t record =
        record_message(impl.recorded, ++impl.p2p_issued, send ? "send" : "recv", op.tensor, op.peer, op.tag,
                       labels.empty() ? std::string() : std::move(labels[i]));
    std::vector<at::Tensor> list{wire(impl, op.tensor)};
    c10::intrusive_ptr<C10dWork> posted;
    try {
      posted = post_message(send ? "a batched send" : "a batched receive", impl.env.rank, op.peer, op.tag, [&] {
        return send ? impl.gloo->send(list, op.peer, wire_tag(op.tag, MessagePart::kAgreed))
                    : impl.gloo->recv(list, op.peer, wire_tag(op.tag, MessagePart::kAgreed));
      });
    } catch (...) {
      record_failed(record, impl.timeout, std::current_exception());
      throw;
    }
    Work work = make_work(std::move(posted));
    work.keep_alive(group);
    attach_record(work, record, impl.timeout);
    works.push_back(std::move(work));
  }
  return works;
}

}  // namespace detail

std::vector<Work> batch_isend_irecv(const ProcessGroup& group, std::vector<P2POp> ops) {
  return detail::batch_isend_irecv_labelled(group, std::move(ops), {});
}

}  // namespace cpprun
