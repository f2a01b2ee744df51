#include "transport/backend_set.h"

#include <algorithm>

#include "util/log.h"
#include "util/text.h"

namespace xfer {

RegionResources::~RegionResources() {
  while (!prepared.empty()) prepared.pop_back();  // mappings go before the memory they map
  allocation.reset();
}

Status BackendSet::CheckOptions(const EngineOptions& options) {
  const auto& names = transport::BackendNames();
  if (!options.transport.empty() && std::find(names.begin(), names.end(), options.transport) == names.end()) {
    std::string list;
    for (const auto& n : names) text::Append(&list, n, ", ");
    return {StatusCode::kInvalidArgument,
            "unknown transport '" + options.transport + "' (this build has: " + list + ")"};
  }
  for (const auto& b : transport::MakeBackends()) {
    if (Status s = b->CheckOptions(options); !s.ok()) return s;
  }
  return Status::Ok();
}

Status BackendSet::Start(const transport::EngineContext& ctx) {
  all_.clear();  // (an Initialize that failed may have started some)
  forced_ = ctx.forced;
  for (auto& b : transport::MakeBackends()) {
    Entry e{std::move(b), false, ""};
    Status s = e.backend->Start(ctx);
    e.started = s.ok();
    e.off = s.message();
    // (A backend that cannot honour an option it was given, e.g. a NIC it cannot serve on,
    // fails Initialize rather than go quietly unoffered.)
    if (!e.started && s.code() == StatusCode::kInvalidArgument) return s;
    if (!e.started && forced_ == e.backend->name()) {
      return {StatusCode::kUnsupported, "transport '" + forced_ + "' forced, but " + e.off};
    }
    all_.push_back(std::move(e));
  }
  return Status::Ok();
}

void BackendSet::StopServing() {
  for (auto& e : all_) {
    if (e.started) e.backend->StopServing();
  }
}

transport::Blobs BackendSet::HelloBlobs() const {
  transport::Blobs out;
  for (const auto& e : all_) {
    if (!e.started) continue;
    if (auto blob = e.backend->HelloBlob()) out.push_back({std::string(e.backend->name()), *blob});
  }
  return out;
}

std::string BackendSet::Summary() const {
  std::string out;
  for (const auto& e : all_) {
    text::Append(&out, std::string(e.backend->name()) + (e.started ? " on" : " off"), ", ");
  }
  return out;
}

std::vector<BackendSet::State> BackendSet::States() const {
  std::vector<State> out;
  for (const auto& e : all_) {
    out.push_back({std::string(e.backend->name()), e.started, e.off, e.backend->About()});
  }
  return out;
}

void BackendSet::Classify(const void* p, MemType* type, int32_t* device) const {
  for (const auto& e : all_) {
    if (e.started && e.backend->HandlesDeviceMemory() && e.backend->Classify(p, type, device)) {
      return;
    }
  }
  *type = MemType::kHost;
  *device = -1;
}

Status BackendSet::CheckMemoryType(MemType type) const {
  if (type == MemType::kHost) return Status::Ok();
  std::string why;
  for (const auto& e : all_) {
    if (!e.backend->HandlesDeviceMemory()) continue;
    if (e.started) return Status::Ok();
    text::Append(&why, std::string(e.backend->name()) + ": " + e.off);
  }
  return {StatusCode::kUnsupported,
          "GPU memory needs a GPU backend, and none is usable here" +
              (why.empty() ? std::string(" (none is built in)") : " (" + why + ")")};
}

Status BackendSet::Allocate(uint64_t len, MemType type, const AllocOptions& options, uint64_t* addr,
                            int32_t* device, std::unique_ptr<transport::RegionResource>* res) {
  if (Status s = CheckMemoryType(type); !s.ok()) return s;
  for (auto& e : all_) {
    if (e.started && e.backend->Allocates(type)) {
      return e.backend->Allocate(len, type, options, addr, device, res);
    }
  }
  return {StatusCode::kUnsupported, std::string("no backend of this build allocates ") +
                                        (type == MemType::kHost ? "host" : "GPU") + " memory"};
}

Status BackendSet::PrepareRegion(const RegionInfo& info, RegionResources* res, transport::Blobs* blobs) {
  for (auto& e : all_) {
    if (!e.started) continue;
    std::optional<std::string> blob;
    std::unique_ptr<transport::RegionResource> r;
    if (Status s = e.backend->PrepareRegion(info, res->allocation.get(), &blob, &r); !s.ok()) {
      return s;
    }
    if (blob) blobs->push_back({std::string(e.backend->name()), std::move(*blob)});
    if (r) res->prepared.push_back(std::move(r));
  }
  return Status::Ok();
}

std::vector<std::shared_ptr<transport::Route>> BackendSet::Connect(const transport::PeerContext& peer,
                                                                   const transport::Blobs& offered,
                                                                   bool itself, std::string* why) {
  std::vector<std::shared_ptr<transport::Route>> routes;
  auto note = [why](const std::string& reason) { text::Append(why, reason); };
  for (auto& e : all_) {
    const std::string_view name = e.backend->name();
    if (!itself && !forced_.empty() && forced_ != name) continue;
    if (!e.started) {
      note(std::string(name) + ": off here (" + e.off + ")");
      continue;
    }
    const std::string* blob = transport::FindBlob(offered, name);
    if (blob == nullptr) {
      note(std::string(name) + ": the peer does not offer it");
      continue;
    }
    transport::PeerContext p = peer;
    p.blob = *blob;
    std::shared_ptr<transport::Route> route;
    if (Status s = e.backend->Connect(p, &route); s.ok()) {
      routes.push_back(std::move(route));
    } else {
      note(s.message());
    }
  }
  if (routes.empty() && !itself && !forced_.empty()) *why += "; transport forced to " + forced_;
  return routes;
}

void BackendSet::Fence(std::chrono::steady_clock::time_point deadline) {
  for (auto& e : all_) {
    if (e.started) e.backend->Fence(deadline);
  }
}

void BackendSet::DropPeer(uint64_t incarnation) {
  for (auto& e : all_) {
    if (e.started) e.backend->DropPeer(incarnation);
  }
}

}  // namespace xfer
