#include "api/option_table.h"

#include "control/wire.h"
#include "metadata/directory.h"
#include "transport/backend_set.h"
#include "util/checksum.h"
#include "util/net.h"

namespace xfer {
namespace {

using options::Row;
constexpr int64_t kAny = std::numeric_limits<int64_t>::max();
constexpr int64_t KiB = 1 << 10, MiB = 1 << 20, GiB = 1ll << 30;

Status Bad(const std::string& why) { return {StatusCode::kInvalidArgument, why}; }

Row WithCheck(Row row, Status (*check)(const EngineOptions&)) {
  row.check = check;
  return row;
}

// The engine's own options, in the order of EngineOptions (and docs/options.md).
std::vector<Row> CoreRows() {
  return {
      WithCheck(XFER_OPTION_DURATION("heartbeat_interval", heartbeat_interval, "ms", 1, kAny,
                                     "how often each side of a session sends a heartbeat"),
                [](const EngineOptions& o) {
                  return o.heartbeat_interval < o.heartbeat_timeout
                             ? Status::Ok()
                             : Bad("heartbeat_interval must be below heartbeat_timeout");
                }),
      XFER_OPTION_DURATION("heartbeat_timeout", heartbeat_timeout, "ms", 1, kAny,
                           "a peer silent this long is declared dead"),
      XFER_OPTION_BOOL("auto_connect", auto_connect,
                       "connect to an unknown peer on the first transfer to it"),
      XFER_OPTION_DURATION("auto_connect_timeout", auto_connect_timeout, "ms", 1, 0,
                           "the timeout of that connect"),
      XFER_OPTION_COUNT("max_peer_regions", max_peer_regions, 1, 16 * MiB,
                        "the most regions one peer may advertise"),
      XFER_OPTION_BYTES(
          "max_unsent_bytes", max_unsent_bytes, 64 * KiB, 4 * GiB,
          "control frames queued for a peer that does not read them, before its session closes"),
      XFER_OPTION_COUNT("max_sessions", max_sessions, 1, MiB, "sessions with peers, both ways"),
      XFER_OPTION_COUNT("max_sessions_per_host", max_sessions_per_host, 1, MiB,
                        "sessions peers of one host opened to this engine"),
      XFER_OPTION_COUNT("streams", streams, 1, 256, "worker threads that share a request's batches"),
      XFER_OPTION_BYTES("slice_bytes", slice_bytes, 1, 0,
                        "descriptors longer than this are cut (0: per transport)"),
      XFER_OPTION_BYTES("batch_bytes", batch_bytes, 1, 0, "bytes per batch (0: per transport)"),
      XFER_OPTION_DURATION("spin", spin, "us", 0, 1000000,
                           "how long waiters, idle streams and a busy control thread spin before they sleep"),
      WithCheck(XFER_OPTION_BOOL("checksum", checksum,
                                 "requests check their bytes end to end by default (XXH3 on both sides)"),
                [](const EngineOptions& o) {
                  return !o.checksum || checksum::Available()
                             ? Status::Ok()
                             : Status{StatusCode::kUnsupported,
                                      "checksum needs a build with libxxhash (libxxhash-dev)"};
                }),
      XFER_OPTION_CHOICE("staging", staging, ParseStaging, StagingName, "auto, always, off",
                         "the buffer pool: only where needed, for every transfer, or never"),
      XFER_OPTION_COUNT("staging_buffers", staging_buffers, 1, 64, "buffers in the pool"),
      XFER_OPTION_BYTES("staging_buffer_bytes", staging_buffer_bytes, 64 * KiB, GiB, "bytes per pool buffer"),
      XFER_OPTION_COUNT("staging_pools", staging_pools, 1, 256, "peer sessions lent staging slots at once"),
      XFER_OPTION_TEXT("transport", transport,
                       "force one backend by name (empty: the best each peer offers)"),
      WithCheck(XFER_OPTION_TEXT("host_id", host_id, "this host's identity (empty: the kernel's boot id)"),
                [](const EngineOptions& o) {
                  // (Peers refuse a hello whose host id is longer.)
                  return o.host_id.size() <= wire::kMaxAuthName
                             ? Status::Ok()
                             : Bad("host_id is longer than " + std::to_string(wire::kMaxAuthName) + " bytes");
                }),
      XFER_OPTION_SECRET("secret", secret, "peers must prove they know it (at least 16 bytes)"),
      XFER_OPTION_TEXT("secret_file", secret_file, "a file holding the secret"),
      XFER_OPTION_TEXT("metadata", metadata,
                       "etcd://host:port[,...][/prefix] or http://host:port/path (empty: off)"),
      WithCheck(XFER_OPTION_TEXT("cluster_name", cluster_name, "this engine's name in the cluster"),
                [](const EngineOptions& o) {
                  if (o.cluster_name.empty()) return Status::Ok();
                  if (o.metadata.empty())
                    return Bad("cluster_name needs metadata (an etcd:// or http:// URL)");
                  return metadata::CheckClusterName(o.cluster_name);
                }),
      XFER_OPTION_BOOL(
          "start_without_metadata", start_without_metadata,
          "Initialize succeeds while the metadata service cannot be reached, and publishes once it answers"),
      XFER_OPTION_BYTES("notify.max_message_bytes", notify.max_message_bytes, 1, wire::kMaxNotify,
                        "the longest notification sent or accepted"),
      XFER_OPTION_COUNT("notify.queue_messages", notify.queue_messages, 1, 16 * MiB,
                        "notifications received and not yet taken"),
      WithCheck(XFER_OPTION_BYTES("notify.queue_bytes", notify.queue_bytes, 4 * KiB, 16 * GiB,
                                  "their messages' bytes"),
                [](const EngineOptions& o) {
                  return o.notify.queue_bytes >= o.notify.max_message_bytes
                             ? Status::Ok()
                             : Bad("notify.queue_bytes must be at least notify.max_message_bytes");
                }),
      XFER_OPTION_BYTES_OR_0("notify.ring_bytes", notify.ring_bytes, 4 * KiB, GiB,
                             "the shared-memory ring offered to each peer on this host (0: none)"),
      XFER_OPTION_BOOL("notify.outcomes", notify.outcomes,
                       "also receive a notification for each notified request that did not complete"),
      XFER_OPTION_BOOL("metrics", metrics, "count bytes, requests and durations on the data path"),
      WithCheck(
          XFER_OPTION_TEXT("metrics_listen", metrics_listen, "serve the metrics at http://host:port/metrics"),
          [](const EngineOptions& o) {
            net::Address a;
            if (o.metrics_listen.empty() || (net::ParseAddress(o.metrics_listen, &a).ok() && a.has_port)) {
              return Status::Ok();
            }
            return Bad("metrics_listen '" + o.metrics_listen + "' is not host:port");
          }),
      XFER_OPTION_COUNT("metrics_max_peers", metrics_max_peers, 1, 4096, "distinct values of the peer label"),
  };
}

// A number out of the row's range, or a choice that names nothing.
Status CheckRange(const Row& row, const EngineOptions& o) {
  if (row.kind == OptionKind::kChoice && row.show(o) == "unknown") {
    return Bad(std::string(row.key) + " must be one of " + std::string(row.choices));
  }
  if (row.number == nullptr || row.lo > row.hi) return Status::Ok();
  const int64_t v = row.number(o);
  if ((row.zero_ok && v == 0) || (v >= row.lo && v <= row.hi)) return Status::Ok();
  return Bad(std::string(row.key) + " must be " + options::RangeOf(row) + " (not " +
             options::ShowNumber(row, v) + ")");
}

const Row* Find(std::string_view key) {
  for (const Row& r : OptionRows()) {
    if (r.key == key) return &r;
  }
  return nullptr;
}

}  // namespace

const std::vector<Row>& OptionRows() {
  static const std::vector<Row> rows = [] {
    std::vector<Row> all = CoreRows();
    for (const auto& b : transport::MakeBackends()) {
      for (const Row& r : b->Options()) all.push_back(r);
    }
    return all;
  }();
  return rows;
}

Status CheckOptions(const EngineOptions& options) {
  for (const Row& row : OptionRows()) {
    if (Status s = CheckRange(row, options); !s.ok()) return s;
    if (row.check != nullptr) {
      if (Status s = row.check(options); !s.ok()) return s;
    }
  }
  return BackendSet::CheckOptions(options);
}

std::vector<OptionInfo> DescribeOptions(const EngineOptions& options) {
  std::vector<OptionInfo> out;
  for (const Row& r : OptionRows()) {
    out.push_back({std::string(r.key), r.kind, r.show(options), options::RangeOf(r), std::string(r.doc)});
  }
  return out;
}

Status SetOption(EngineOptions* options, std::string_view key, std::string_view value) {
  if (options == nullptr) return Bad("SetOption: null options");
  const Row* row = Find(key);
  if (row == nullptr) {
    std::string known;
    for (const Row& r : OptionRows()) known += (known.empty() ? "" : ", ") + std::string(r.key);
    return Bad("unknown option '" + std::string(key) + "' (known: " + known + ")");
  }
  return row->set(*options, value);
}

}  // namespace xfer
