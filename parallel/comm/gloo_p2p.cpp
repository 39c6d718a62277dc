// GlooCommunicator's point-to-point half: send and recv.
#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include "core/error.h"
#include "parallel/comm/gloo_communicator.h"

namespace loom::distributed {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using gloo::transport::UnboundBuffer;

// Note [Point-to-point in Gloo]
// Two facts of Gloo's TCP transport shape this file. A send completes only once the
// receiver has posted a matching recv. And a recv posted for fewer bytes than arrive
// aborts the receiving process. So:
//  1. Every send and recv is posted to Gloo at once, from the calling thread, so that
//     progress never depends on the order in which anyone waits (two ranks that each
//     send, then recv, would otherwise wait for each other until the deadline).
//  2. Each message is preceded by a 128-byte header: its fingerprint (dtype, shape)
//     and the sender's message number. The receiver checks the header before posting
//     the data recv, on a slot named by that number, so two recvs with the same tag
//     cannot take each other's data. A mismatched message is received into scratch and
//     dropped, and the recv fails with both shapes while the communicator stays usable.
//  3. Each op is waited for on its own small thread: Gloo waits on one buffer per call,
//     and a wait that times out poisons the whole context, so polling is no option.
// Headers and data use slot prefixes that Gloo's collectives (0x01-0x08) do not.
constexpr uint8_t kHeaderSlotPrefix = 0x40;
constexpr uint8_t kDataSlotPrefix = 0x41;

struct GlooCommunicator::PeerOp {
  Op op;
  std::shared_ptr<Work> work;
  Fingerprint header;  // sent, or received into
  std::vector<uint8_t> scratch;  // a mismatched message lands here
  Clock::time_point deadline;
  std::mutex mutex;      // guards the buffers and `aborted` against abort()
  bool aborted = false;
  std::unique_ptr<UnboundBuffer> header_buffer;
  std::unique_ptr<UnboundBuffer> data_buffer;
  std::atomic<bool> done{false};
  std::thread waiter;

  bool sending() const { return op.kind == OpKind::Send; }

  // Makes pending and future waits on this op's buffers return false at once.
  void abort() {
    std::lock_guard<std::mutex> lock(mutex);
    aborted = true;
    for (auto* b : {header_buffer.get(), data_buffer.get()}) {
      if (!b) continue;
      b->abortWaitSend();
      b->abortWaitRecv();
    }
  }
};

std::shared_ptr<Work> GlooCommunicator::launch_point_to_point(Op op, std::shared_ptr<Work> work) {
  reap_finished_peer_ops(/*all=*/false);
  auto p = std::make_shared<PeerOp>();
  p->op = std::move(op);
  p->work = work;
  p->deadline = Clock::now() + timeout();
  const Op& o = p->op;
  try {
    throw_if_broken(o);
    // The header carries the sender's message number; see Note [Point-to-point in Gloo].
    p->header = fingerprint(o, static_cast<int64_t>(o.seq));
    std::lock_guard<std::mutex> lock(p->mutex);
    p->header_buffer = context_->createUnboundBuffer(p->header.words.data(), sizeof(p->header.words));
    auto header_slot = gloo::Slot::build(kHeaderSlotPrefix, static_cast<uint32_t>(o.tag));
    if (p->sending()) {
      p->header_buffer->send(o.peer, header_slot);
      if (o.tensor.nbytes() > 0) {
        p->data_buffer = context_->createUnboundBuffer(o.tensor.raw_data(), o.tensor.nbytes());
        p->data_buffer->send(o.peer, gloo::Slot::build(kDataSlotPrefix, static_cast<uint32_t>(o.seq)));
      }
    } else {
      p->header_buffer->recv(o.peer, header_slot);
    }
  } catch (const Error&) {
    work->finish(std::current_exception());
    return work;
  } catch (const std::exception& e) {
    try {
      fail(o, e);
    } catch (...) {
      work->finish(std::current_exception());
    }
    return work;
  }
  p->waiter = std::thread([this, p] { finish_point_to_point(*p); });
  std::lock_guard<std::mutex> lock(peer_ops_mutex_);
  peer_ops_.push_back(std::move(p));
  return work;
}

static milliseconds until(Clock::time_point deadline) {
  return std::max(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()), milliseconds(1));
}

void GlooCommunicator::finish_point_to_point(PeerOp& p) {
  const Op& op = p.op;
  // Waits for one buffer; Gloo's errors become loom's (and break the communicator).
  auto wait = [&](UnboundBuffer& buffer) {
    bool completed = false;
    try {
      completed = p.sending() ? buffer.waitSend(until(p.deadline)) : buffer.waitRecv(until(p.deadline));
    } catch (const std::exception& e) {
      fail(op, e);
    }
    LOOM_CHECK(completed, op.describe(), " was aborted: the communicator was destroyed before it completed");
  };
  std::exception_ptr error;
  try {
    wait(*p.header_buffer);
    if (p.sending()) {
      if (p.data_buffer) wait(*p.data_buffer);
    } else {
      const Fingerprint mine = fingerprint(op);
      const int64_t dtype = p.header.words[3];
      LOOM_CHECK(dtype >= 0 && dtype <= int64_t(DType::BFloat16) && p.header.words[4] >= 0, op.describe(),
                 ": the message header from rank ", op.peer, " is malformed; both ranks must run the same loom");
      const bool match = p.header.same_tensor(mine);
      const size_t incoming = static_cast<size_t>(p.header.words[4]) * element_size(DType(dtype));
      if (incoming > 0) {
        {
          std::lock_guard<std::mutex> lock(p.mutex);
          LOOM_CHECK(!p.aborted, op.describe(), " was aborted: the communicator was destroyed before it completed");
          void* into = op.tensor.raw_data();
          if (!match) {
            p.scratch.resize(incoming);
            into = p.scratch.data();
          }
          p.data_buffer = context_->createUnboundBuffer(into, incoming);
          p.data_buffer->recv(op.peer, gloo::Slot::build(kDataSlotPrefix, static_cast<uint32_t>(p.header.id())));
        }
        wait(*p.data_buffer);
      }
      LOOM_CHECK(match, op.describe(), ": rank ", op.peer, " sent ", p.header.tensor_str(), " but this rank's tensor "
                 "is ", mine.tensor_str(), ". The message was received and dropped; the communicator is still "
                 "usable. Give the recv a tensor of the sender's dtype and shape");
    }
  } catch (...) {
    error = std::current_exception();
  }
  p.work->finish(error);
  p.done = true;
}

void GlooCommunicator::reap_finished_peer_ops(bool all) {
  std::vector<std::shared_ptr<PeerOp>> finished;
  {
    std::lock_guard<std::mutex> lock(peer_ops_mutex_);
    for (auto it = peer_ops_.begin(); it != peer_ops_.end();) {
      if (all || (*it)->done) {
        if (all) (*it)->abort();  // See Note [Destroying a communicator with work in flight]
        finished.push_back(std::move(*it));
        it = peer_ops_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& p : finished) p->waiter.join();
}

}  // namespace loom::distributed
