// The backends of this engine: started once at Initialize, in the registry's priority order;
// the core reaches every backend through here and names none.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/backend.h"
#include "xfer/options.h"
#include "xfer/status.h"

namespace xfer {

// What one local region holds of the backends, released when the region goes: what each
// backend prepared (last first), then the memory itself when a backend allocated it.
struct RegionResources {
  std::unique_ptr<transport::RegionResource> allocation;
  std::vector<std::unique_ptr<transport::RegionResource>> prepared;
  ~RegionResources();
};

class BackendSet {
 public:
  // Checks every backend's options, and that a forced transport is one of this build's.
  static Status CheckOptions(const EngineOptions& options);

  // Starts every backend; a forced one that cannot start fails (nothing else does).
  Status Start(const transport::EngineContext& ctx);
  // Finalize: stops those that serve peers, then (Clear) destroys them all.
  void StopServing();
  void Clear() { all_.clear(); }

  // Our hello's entries: the backends offered to peers, best first.
  transport::Blobs HelloBlobs() const;
  // One line for the log: each backend "on" or "off".
  std::string Summary() const;
  // Each backend, as Start left it (xfer-info): on, or off and why; and what it says of itself.
  struct State {
    std::string name;
    bool on = false;
    std::string why_off;
    std::string about;  // Backend::About
  };
  std::vector<State> States() const;

  // What memory p is (host memory unless a backend handles it, e.g. GPU memory).
  void Classify(const void* p, MemType* type, int32_t* device) const;
  // Ok when this engine can hold memory of that type; else kUnsupported, with why not.
  Status CheckMemoryType(MemType type) const;
  // Allocates zeroed memory (Engine::AllocMem) with the first backend that allocates the type.
  Status Allocate(uint64_t len, MemType type, const AllocOptions& options, uint64_t* addr, int32_t* device,
                  std::unique_ptr<transport::RegionResource>* res);
  // Every backend's blob and resources for a region being registered.
  Status PrepareRegion(const RegionInfo& info, RegionResources* res, transport::Blobs* blobs);

  // The routes to a peer, best first: every started backend (only the forced one, when one
  // is, except for this engine itself: a forced backend says how to reach peers) that the
  // peer offers and that reaches it. *why, when there are none, says why.
  std::vector<std::shared_ptr<transport::Route>> Connect(const transport::PeerContext& peer,
                                                         const transport::Blobs& offered, bool itself,
                                                         std::string* why);
  // Target side: see Backend::Fence and Backend::DropPeer.
  void Fence(std::chrono::steady_clock::time_point deadline);
  void DropPeer(uint64_t incarnation);

 private:
  struct Entry {
    std::unique_ptr<transport::Backend> backend;
    bool started = false;
    std::string off;  // why not started
  };
  std::vector<Entry> all_;
  std::string forced_;
};

}  // namespace xfer
