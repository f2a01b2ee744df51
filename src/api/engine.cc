// The public facade: each call goes to the service that owns it (core/engine_impl.h).
#include "api/option_table.h"
#include "core/engine_impl.h"
#include "xfer/version.h"

namespace xfer {

std::string_view Version() { return XFER_VERSION; }

Engine::Engine() : impl_(std::make_unique<EngineImpl>()) {}
Engine::~Engine() = default;
Status Engine::Initialize(const std::string& n, const EngineOptions& o) {
  return impl_->Initialize(n, o, CheckOptions);
}
void Engine::Finalize() { impl_->Finalize(); }
std::string Engine::LocalName() const { return impl_->LocalName(); }
Status Engine::RegisterMem(void* a, uint64_t l, MemType t, MemHandle* h, const std::string& tag,
                           PeerAccess access) {
  return impl_->regions().Register(a, l, t, h, tag, access);
}
Status Engine::DeregisterMem(MemHandle h) { return impl_->regions().Deregister(h, false); }
Status Engine::AllocMem(uint64_t l, MemType t, void** a, MemHandle* h, const std::string& tag,
                        const AllocOptions& o) {
  return impl_->regions().Allocate(l, t, a, h, tag, o);
}
Status Engine::FreeMem(MemHandle h) { return impl_->regions().Deregister(h, true); }
Status Engine::Connect(const std::string& r, std::chrono::milliseconds t) {
  return impl_->peers().Connect(r, t);
}
Status Engine::ConnectAsync(const std::string& r, std::chrono::milliseconds t, ConnectHandle* h) {
  return impl_->peers().ConnectAsync(r, t, h);
}
Status Engine::GetConnectStatus(ConnectHandle h, ConnectStatus* s) {
  return impl_->peers().GetConnectStatus(h, s);
}
Status Engine::Disconnect(const std::string& r) { return impl_->peers().Disconnect(r); }
Status Engine::GetPeerInfo(const std::string& r, PeerInfo* i) const {
  return impl_->peers().GetPeerInfo(r, i);
}
Status Engine::GetRemoteRegions(const std::string& r, std::vector<RegionInfo>* v) {
  return impl_->peers().GetRemoteRegions(r, v);
}
Status Engine::ListPeers(std::vector<ClusterPeer>* p) { return impl_->peers().ListPeers(p); }
Status Engine::TransferSync(const std::string& r, Op op, const std::vector<TransferDesc>& d,
                            std::chrono::milliseconds t, const TransferOptions& o, RequestStatus* result) {
  return impl_->transfers().TransferSync(r, op, d, t, o, result);
}
Status Engine::TransferAsync(const std::string& r, Op op, const std::vector<TransferDesc>& d,
                             std::chrono::milliseconds t, RequestHandle* h) {
  return impl_->transfers().TransferAsync(r, op, d, t, {}, h);
}
Status Engine::TransferAsync(const std::string& r, Op op, const std::vector<TransferDesc>& d,
                             std::chrono::milliseconds t, const TransferOptions& o, RequestHandle* h) {
  return impl_->transfers().TransferAsync(r, op, d, t, o, h);
}
Status Engine::PrepareLocalList(const std::vector<MemRange>& r, ListHandle* l) {
  return impl_->transfers().PrepareLocalList(r, l);
}
Status Engine::PrepareRemoteList(const std::string& remote, const std::vector<MemRange>& r, ListHandle* l) {
  return impl_->transfers().PrepareRemoteList(remote, r, l);
}
Status Engine::ReleaseList(ListHandle l) { return impl_->transfers().ReleaseList(l); }
Status Engine::TransferSync(Op op, const PreparedDescs& d, std::chrono::milliseconds t,
                            const TransferOptions& o, RequestStatus* result) {
  return impl_->transfers().TransferSync(op, d, t, o, result);
}
Status Engine::TransferAsync(Op op, const PreparedDescs& d, std::chrono::milliseconds t,
                             const TransferOptions& o, RequestHandle* h) {
  return impl_->transfers().TransferAsync(op, d, t, o, h);
}
Status Engine::GetTransferStatus(RequestHandle h, RequestStatus* s) {
  return impl_->transfers().GetTransferStatus(h, s);
}
Status Engine::Wait(RequestHandle h, std::chrono::milliseconds t, RequestStatus* s) {
  return impl_->transfers().Wait(h, t, s);
}
Status Engine::Cancel(RequestHandle h) { return impl_->transfers().Cancel(h); }
Status Engine::SendNotify(const std::string& r, const std::string& m, std::chrono::milliseconds t) {
  return impl_->notifier().SendNotify(r, m, t);
}
Status Engine::GetNotifies(std::vector<Notification>* out) { return impl_->notifier().GetNotifies(out); }
Status Engine::GetMetrics(MetricsSnapshot* out) const { return impl_->GetMetrics(out); }
std::string Engine::MetricsAddress() const { return impl_->MetricsAddress(); }
Status Engine::WaitNotifies(std::vector<Notification>* out, std::chrono::milliseconds t) {
  return impl_->notifier().WaitNotifies(out, t);
}

}  // namespace xfer
