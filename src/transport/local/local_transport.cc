#include "transport/local/local_transport.h"

#include <unistd.h>

#include <cstring>

namespace xfer::transport {

void CopyInProcess(Op op, std::span<const Slice> batch) {
  for (const Slice& s : batch) {
    void* local = reinterpret_cast<void*>(s.local);
    void* remote = reinterpret_cast<void*>(s.remote);
    if (op == Op::kWrite) {
      std::memmove(remote, local, s.len);
    } else {
      std::memmove(local, remote, s.len);
    }
  }
}

namespace {

class LocalLink final : public Link {
 public:
  Status Execute(Op op, std::span<const Slice> batch, Clock::time_point) override {
    CopyInProcess(op, batch);
    return Status::Ok();
  }
};

}  // namespace

Status LocalTransport::Connect(const PeerEndpoint& peer, std::shared_ptr<Link>* link) {
  if (peer.pid != ::getpid()) {
    return {StatusCode::kUnsupported, "local: peer is another process"};
  }
  *link = std::make_shared<LocalLink>();
  return Status::Ok();
}

}  // namespace xfer::transport
