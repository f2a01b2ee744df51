#include "transport/link.h"

#include <atomic>
#include <memory>

namespace xfer::transport {

namespace {

// Piece after piece, an Execute each.
Status OneAtATime(Link& link, Op op, std::span<const Slice> batch, Clock::time_point deadline,
                  PieceHook& hook) {
  SliceCutter cutter(batch);
  std::vector<Slice> piece;
  const uint64_t each = std::max<uint64_t>(hook.piece(), 1);
  for (uint64_t moved = 0, n; (n = cutter.Next(each, &piece)) > 0;) {
    moved += n;
    if (op == Op::kWrite) {
      if (Status s = hook.Ready(moved); !s.ok()) return s;
    }
    if (Status s = link.Execute(op, piece, deadline); !s.ok()) return s;
    if (op == Op::kRead) {
      if (Status s = hook.Landed(moved); !s.ok()) return s;
    }
  }
  return Status::Ok();
}

// A pipelined link: every piece in flight at once (a WRITE's each once Ready), a READ's told
// Landed in order as each ends; returns once every piece started has ended.
Status AllInFlight(Link& link, Op op, std::span<const Slice> batch, Clock::time_point deadline,
                   PieceHook& hook) {
  SliceCutter cutter(batch);
  const uint64_t each = std::max<uint64_t>(hook.piece(), 1);
  std::vector<std::vector<Slice>> pieces;  // (they live until their batches ended)
  std::vector<uint64_t> ends;              // the payload's bytes up to each piece's end
  for (std::vector<Slice> p; cutter.Next(each, &p) > 0;) {
    uint64_t n = 0;
    for (const Slice& s : p) n += s.len;
    ends.push_back((ends.empty() ? 0 : ends.back()) + n);
    pieces.push_back(std::move(p));
  }
  const size_t count = pieces.size();
  std::vector<Status> results(count);
  const auto ended = std::make_unique<std::atomic<bool>[]>(count);
  std::atomic<bool> failed{false};  // a piece failed: start no more
  const auto wait = [&](size_t k) {
    while (!ended[k].load(std::memory_order_acquire)) {
      link.Drive(Clock::now() + std::chrono::milliseconds(100),
                 [&] { return ended[k].load(std::memory_order_acquire); });
    }
  };
  Status first;  // the first failure: a hook's, or a piece's
  size_t started = 0;
  for (; started < count && !failed.load(std::memory_order_acquire); ++started) {
    if (op == Op::kWrite) {
      if (Status s = hook.Ready(ends[started]); !s.ok()) {
        first = std::move(s);
        break;
      }
    }
    link.Start(op, pieces[started], deadline, [&results, &ended, &failed, k = started](Status s) {
      if (!s.ok()) failed.store(true, std::memory_order_release);
      results[k] = std::move(s);
      ended[k].store(true, std::memory_order_release);
    });
  }
  for (size_t k = 0; k < started; ++k) {
    wait(k);
    if (first.ok() && !results[k].ok()) first = results[k];
    if (first.ok() && op == Op::kRead) first = hook.Landed(ends[k]);
  }
  return first;
}

}  // namespace

Status Link::ExecutePieces(Op op, std::span<const Slice> batch, Clock::time_point deadline, PieceHook& hook) {
  return pipelined() ? AllInFlight(*this, op, batch, deadline, hook)
                     : OneAtATime(*this, op, batch, deadline, hook);
}

}  // namespace xfer::transport
