// The asynchronous requests whose end has not been reported yet, by handle.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "core/datapath/request.h"
#include "xfer/types.h"

namespace xfer {

// Sharded by the thread that issued a request (a handle names its shard), so that threads
// issuing and waiting for their own requests share no lock.
class RequestTable {
 public:
  RequestHandle NextHandle();
  void Track(const std::shared_ptr<Request>& req);
  // A new handle for a request that was over before its handle was given out (its one copy
  // ran on the caller): tracked by its handle alone, without a Request.
  RequestHandle TrackCompleted();
  // Looks h up: false when it is unknown (never issued, or its end was reported already).
  // *req is the request, or null for one tracked by TrackCompleted; with take_completed, such
  // a one is forgotten as it is found (its end is reported now, once).
  bool Find(RequestHandle h, bool take_completed, std::shared_ptr<Request>* req);
  // When st is terminal: removes the request and returns it, or null when another thread took
  // it first (its end is reported once). Null for a waiting st.
  std::shared_ptr<Request> TakeIfDone(RequestHandle h, const RequestStatus& st);
  // Cancels every request (Finalize); Clear then forgets them.
  void CancelAll();
  void Clear();

 private:
  static constexpr unsigned kShards = 16;
  static constexpr unsigned kRing = 256;
  struct alignas(64) Shard {
    std::mutex mu;
    std::unordered_map<RequestHandle, std::shared_ptr<Request>> requests;  // mu
    // TrackCompleted's handles. Each goes into the ring, at its number's place, when that is
    // free (0): a thread that keeps up to kRing such requests in flight issues, finds and takes
    // them with no lock. The rest wait in `completed`, ascending (mu): a thread that waits for
    // them in the order it issued them takes the first. (One taken out of order costs a move
    // of the handles after it: a few nanoseconds each.)
    std::atomic<RequestHandle> ring[kRing]{};
    std::deque<RequestHandle> completed;
    std::atomic<RequestHandle> next{1};  // handle = next * kShards + the shard's index
  };
  static std::atomic<RequestHandle>& RingPlace(Shard& s, RequestHandle h) {
    return s.ring[(h / kShards) % kRing];
  }
  Shard& ShardOf(RequestHandle h) { return shards_[h % kShards]; }
  Shard shards_[kShards];
};

}  // namespace xfer
