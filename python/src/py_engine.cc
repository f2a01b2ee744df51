#include "py_engine.h"
#include "py_prepared.h"

#include <pybind11/stl.h>

#include "py_descs.h"
#include "py_errors.h"
#include "py_memory.h"
#include "py_options.h"

namespace xfer::py {
namespace pyb = pybind11;
using std::chrono::milliseconds;

void Core::ReapOrphans() {
  std::lock_guard lock(orphans_mu);
  if (orphans.size() < reap_at) return;
  std::erase_if(orphans, [&](RequestHandle h) {
    RequestStatus st;
    return !engine.GetTransferStatus(h, &st).ok() || st.state != RequestState::kWaiting;
  });
  reap_at = std::max<size_t>(64, 2 * orphans.size());  // amortized: O(1) per request
}

// ---- Request

PyRequest::~PyRequest() {
  if (!ended_ && !core_->closed) {
    // Nobody will ask for its end: the engine keeps its handle until someone does.
    std::lock_guard lock(core_->orphans_mu);
    core_->orphans.push_back(handle_);
  }
  pyb::gil_scoped_release nogil;  // (the last holder of the Core finalizes the engine)
  core_.reset();
}

bool PyRequest::Ask(milliseconds ms) {
  if (ended_) return true;
  std::shared_lock alive(core_->lifetime);
  RequestStatus st;
  Status s;
  if (core_->closed) {
    st.state = RequestState::kCanceled;
    st.status = Status(StatusCode::kCanceled, "the engine was closed");
  } else {
    s = ms.count() == 0 ? core_->engine.GetTransferStatus(handle_, &st)
                        : core_->engine.Wait(handle_, ms, &st);
    if (st.state == RequestState::kWaiting) {
      if (s.ok() || s.code() == StatusCode::kTimeout) return false;
      st.state = RequestState::kFailed;  // (a handle the engine does not know: a bug)
      st.status = s;
    }
  }
  final_ = std::move(st);
  ended_ = true;
  return true;
}

bool PyRequest::WaitFor(milliseconds ms) {
  if (ended_) return true;
  pybind11::gil_scoped_release nogil;
  std::unique_lock lock(mu_, std::defer_lock);
  if (!lock.try_lock_for(ms)) return false;  // another thread is waiting for it
  return Ask(ms);
}

bool PyRequest::Wait(pyb::handle timeout) {
  // In slices, so that Ctrl-C gets through and close() need not wait for the whole timeout.
  // None: until it ends (its own deadline bounds that).
  const bool forever = timeout.is_none();
  const auto deadline = std::chrono::steady_clock::now() + ToTimeout(timeout, milliseconds(0));
  bool ended;
  for (;;) {
    const auto left = std::chrono::ceil<milliseconds>(deadline - std::chrono::steady_clock::now());
    const milliseconds slice = forever ? Core::kSlice : std::clamp(left, milliseconds(0), Core::kSlice);
    if ((ended = WaitFor(slice)) || (!forever && left <= slice)) break;  // (the last slice)
    if (PyErr_CheckSignals() != 0) throw pyb::error_already_set();
  }
  if (!ended && !(ended = ended_)) return false;  // (another thread may have seen the end)
  if (final_.state == RequestState::kCompleted) return true;
  Raise(final_.status, &final_.landed);
}

RequestState PyRequest::State() {
  if (!ended_) {
    pybind11::gil_scoped_release nogil;
    std::unique_lock lock(mu_, std::try_to_lock);  // busy: another thread is waiting for it
    if (!lock || !Ask(milliseconds(0))) return RequestState::kWaiting;
  }
  return final_.state;
}

void PyRequest::Cancel() {
  pybind11::gil_scoped_release nogil;
  std::shared_lock alive(core_->lifetime);
  if (ended_ || core_->closed) return;
  (void)core_->engine.Cancel(handle_);  // (a request that just ended: ok, nothing changes)
}

std::vector<uint64_t> PyRequest::Landed() const { return ended_ ? final_.landed : std::vector<uint64_t>{}; }

// ---- Engine

PyEngine::PyEngine(const std::string& name, const pyb::kwargs& options) : core_(std::make_shared<Core>()) {
  const EngineOptions o = ParseOptions(options, &core_->timeout);
  Check(core_->Call([&](Engine& e) { return e.Initialize(name, o); }));
  core_->name = core_->engine.LocalName();
}

PyEngine::~PyEngine() {
  // Buffers, Requests or Regions the program still holds keep the engine (and their memory)
  // until the last of them goes: ~Core then finalizes it.
  if (core_.use_count() > 1) {
    pyb::gil_scoped_release nogil;
    core_.reset();
    return;
  }
  try {
    Close();
  } catch (...) {
  }
}

void PyEngine::Close() {
  if (!core_->closing) {  // (with the GIL: no view can be taken between the check and the flag)
    if (core_->buffer_views > 0) {
      throw pyb::buffer_error("cannot close the engine while " + std::to_string(core_->buffer_views.load()) +
                              " view(s) of its alloc() buffers are alive (del them first)");
    }
    core_->closing = true;
  }
  pyb::gil_scoped_release nogil;
  std::unique_lock lock(core_->lifetime);  // waits for calls in other threads to return
  if (core_->closed) return;
  core_->engine.Finalize();
  core_->closed = true;
  std::lock_guard orphans(core_->orphans_mu);
  core_->orphans.clear();
}

bool PyEngine::Closed() { return core_->closed; }

std::optional<std::string> NotifyMessage(pyb::handle notify) {
  if (notify.is_none()) return std::nullopt;
  if (PyBytes_Check(notify.ptr())) return notify.cast<std::string>();
  if (PyUnicode_Check(notify.ptr())) return notify.cast<std::string>();  // UTF-8
  if (PyObject_CheckBuffer(notify.ptr())) {  // bytearray, memoryview, a numpy array...
    auto bytes = pyb::reinterpret_steal<pyb::object>(PyBytes_FromObject(notify.ptr()));
    if (!bytes) throw pyb::error_already_set();
    return bytes.cast<std::string>();
  }
  RaiseInvalid("a notification must be bytes, str or a bytes-like object");
}

TransferCall::TransferCall(const Core& core, pyb::handle timeout_s, pyb::handle notify, pyb::handle checksum)
    : timeout(ToTimeout(timeout_s, core.timeout)) {
  options.notify = NotifyMessage(notify);
  if (checksum.is_none()) return;
  if (!PyBool_Check(checksum.ptr())) RaiseInvalid("checksum must be True, False or None");
  options.checksum = checksum.cast<bool>();
}

namespace {

PeerAccess AccessOf(bool read_only) { return read_only ? PeerAccess::kReadOnly : PeerAccess::kReadWrite; }

void Transfer(PyEngine& self, Op op, const std::string& peer, pyb::handle descs, pyb::handle local,
              pyb::handle remote, pyb::handle length, pyb::handle timeout, pyb::handle notify,
              pyb::handle checksum) {
  const std::vector<TransferDesc> d = ToDescs(descs, local, remote, length);
  TransferCall(*self.core(), timeout, notify, checksum)
      .Sync(*self.core(), [&](Engine& e, auto t, auto& o, auto* result) {
        return e.TransferSync(peer, op, d, t, o, result);
      });
}

std::unique_ptr<PyRequest> TransferAsync(PyEngine& self, Op op, const std::string& peer, pyb::handle descs,
                                         pyb::handle local, pyb::handle remote, pyb::handle length,
                                         pyb::handle timeout, pyb::handle notify, pyb::handle checksum) {
  const std::vector<TransferDesc> d = ToDescs(descs, local, remote, length);
  return TransferCall(*self.core(), timeout, notify, checksum)
      .Async(self.core(),
             [&](Engine& e, auto t, auto& o, auto* h) { return e.TransferAsync(peer, op, d, t, o, h); });
}

// {path: bytes} of PeerInfo's moved, nic_pairs or staged_via.
pyb::dict MovedDict(const std::vector<PeerInfo::Moved>& moved) {
  pyb::dict d;
  for (const auto& mv : moved) d[pyb::str(mv.path)] = mv.bytes;
  return d;
}

pyb::list Notifications(const std::vector<Notification>& v) {
  pyb::list out;
  for (const auto& n : v) out.append(pyb::cast(n));
  return out;
}

constexpr const char* kTransferDoc = R"(Moves the descriptors' bytes; returns once every byte landed.

descs: a list of (local_addr, remote_addr, len) triples or an (N, 3) integer array; or give
local=, remote= and length= as three integer arrays (length may be one int for all).
timeout: seconds (None: the engine's default). notify: bytes or str delivered to the peer after
the data (its get_notifies()); the call returns once the peer queued it. checksum: True checks
each descriptor's bytes where they landed against a checksum of where they came from
(DataCorruptedError naming the descriptor on a mismatch); None: the engine's checksum option.
Raises an XferError subclass on failure; its .landed lists the descriptors that landed whole.)";

// Adds one of read, write, read_async, write_async (the *_async ones return a Request): the
// same arguments for all four.
void DefTransfer(pyb::class_<PyEngine>& cls, const char* name, Op op, const std::string& doc) {
  const bool async = std::string_view(name).ends_with("_async");
  auto args = [&](auto f) {
    cls.def(name, f, pyb::arg("peer"), pyb::arg("descs") = pyb::none(), pyb::kw_only(),
            pyb::arg("local") = pyb::none(), pyb::arg("remote") = pyb::none(),
            pyb::arg("length") = pyb::none(), pyb::arg("timeout") = pyb::none(),
            pyb::arg("notify") = pyb::none(), pyb::arg("checksum") = pyb::none(), doc.c_str());
  };
  if (async) {
    args([op](PyEngine& self, const std::string& peer, pyb::handle descs, pyb::handle local,
              pyb::handle remote, pyb::handle length, pyb::handle timeout, pyb::handle notify,
              pyb::handle checksum) {
      return TransferAsync(self, op, peer, descs, local, remote, length, timeout, notify, checksum);
    });
  } else {
    args([op](PyEngine& self, const std::string& peer, pyb::handle descs, pyb::handle local,
              pyb::handle remote, pyb::handle length, pyb::handle timeout, pyb::handle notify,
              pyb::handle checksum) {
      Transfer(self, op, peer, descs, local, remote, length, timeout, notify, checksum);
    });
  }
}

}  // namespace

void BindEngine(pyb::module_& m) {
  pyb::enum_<RequestState>(m, "State", "How a request stands (Request.status()).")
      .value("WAITING", RequestState::kWaiting)
      .value("COMPLETED", RequestState::kCompleted)
      .value("FAILED", RequestState::kFailed)
      .value("TIMEOUT", RequestState::kTimeout)
      .value("CANCELED", RequestState::kCanceled);

  pyb::enum_<NotifyOutcome>(m, "Outcome",
                            "How the request behind a notification ended (Notification.outcome); other than "
                            "COMPLETED only for an engine made with notify_outcomes=True.")
      .value("COMPLETED", NotifyOutcome::kCompleted)
      .value("FAILED", NotifyOutcome::kFailed)
      .value("TIMED_OUT", NotifyOutcome::kTimedOut)
      .value("CANCELED", NotifyOutcome::kCanceled)
      .value("INITIATOR_LOST", NotifyOutcome::kInitiatorLost);

  pyb::class_<Notification>(m, "Notification", "A notification as its target receives it.")
      .def_readonly("sender", &Notification::sender, "the sender's name (PeerInfo.name)")
      .def_readonly("sender_incarnation", &Notification::sender_incarnation,
                    "random per sender start: tells a restarted sender apart")
      .def_property_readonly("message", [](const Notification& n) { return pyb::bytes(n.message); })
      .def_readonly("outcome", &Notification::outcome, "how its request ended (xfer.Outcome)")
      .def_property_readonly(
          "landed", [](const Notification& n) { return pyb::cast(n.landed); },
          "other than COMPLETED: the indices of the request's descriptors that landed whole (none known for "
          "INITIATOR_LOST)")
      .def("__repr__", [](const Notification& n) {
        std::string r =
            "<xfer.Notification from " + n.sender + ": " + std::to_string(n.message.size()) + " bytes";
        if (n.outcome != NotifyOutcome::kCompleted) {
          r += ", " + std::string(NotifyOutcomeName(n.outcome)) + ", " + std::to_string(n.landed.size()) +
               " landed";
        }
        return r + ">";
      });

  pyb::class_<RegionInfo>(m, "RegionInfo", "A region as a peer advertises it.")
      .def_readonly("addr", &RegionInfo::addr)
      .def_readonly("len", &RegionInfo::len)
      .def_property_readonly("kind", [](const RegionInfo& r) { return std::string(MemTypeName(r.type)); })
      .def_readonly("device", &RegionInfo::device)
      .def_readonly("tag", &RegionInfo::tag)
      .def_readonly("shared", &RegionInfo::shared, "allocated by the peer's alloc(): same-host peers map it")
      .def_property_readonly(
          "read_only", [](const RegionInfo& r) { return r.access == PeerAccess::kReadOnly; },
          "the peer refuses WRITEs into it")
      .def("__repr__", [](const RegionInfo& r) {
        return MemoryRepr("RegionInfo", r.type, r.addr, r.len, r.tag,
                          r.access == PeerAccess::kReadOnly ? "read-only" : "");
      });

  pyb::class_<ClusterPeer>(m, "ClusterPeer", "An engine as cluster metadata lists it (Engine.list_peers).")
      .def_readonly("name", &ClusterPeer::name, "its cluster_name")
      .def_readonly("address", &ClusterPeer::address, "where it listens; connect() takes either")
      .def_readonly("incarnation", &ClusterPeer::incarnation)
      .def_readonly("host_id", &ClusterPeer::host_id)
      .def_readonly("tags", &ClusterPeer::tags, "the tags of its registered regions")
      .def("__repr__",
           [](const ClusterPeer& p) { return "<xfer.ClusterPeer " + p.name + " at " + p.address + ">"; });

  pyb::class_<MetricSample>(m, "MetricSample", "One sample of a metric (Engine.metrics).")
      .def_property_readonly("labels",
                             [](const MetricSample& s) {
                               pyb::dict d;
                               for (const auto& [k, v] : s.labels) d[pyb::str(k)] = v;
                               return d;
                             })
      .def_readonly("value", &MetricSample::value, "a counter's or gauge's value; a histogram's count")
      .def_readonly("buckets", &MetricSample::buckets,
                    "histograms: (upper bound, cumulative count) pairs, the last bound inf")
      .def_readonly("sum", &MetricSample::sum, "histograms: the observations' sum")
      .def("__repr__", [](const MetricSample& s) {
        std::string labels;
        for (const auto& [k, v] : s.labels) labels += (labels.empty() ? "" : ",") + k + "=" + v;
        return "<xfer.MetricSample {" + labels + "} " + std::to_string(s.value) + ">";
      });
  pyb::class_<Metric>(m, "Metric", "A metric: its name, type, help and samples.")
      .def_readonly("name", &Metric::name)
      .def_property_readonly("type",
                             [](const Metric& x) {
                               return x.type == MetricType::kCounter ? "counter"
                                      : x.type == MetricType::kGauge ? "gauge"
                                                                     : "histogram";
                             })
      .def_readonly("help", &Metric::help)
      .def_readonly("samples", &Metric::samples)
      .def("__repr__", [](const Metric& x) {
        return "<xfer.Metric " + x.name + ": " + std::to_string(x.samples.size()) + " samples>";
      });
  pyb::class_<MetricsSnapshot>(m, "Metrics", R"(The engine's metrics as of one moment (Engine.metrics).

metrics["xfer_transferred_bytes_total"] is a Metric; metrics.sum(name, **labels) adds the values
of its samples carrying those labels; metrics.text() is the Prometheus text format.)")
      .def("__getitem__",
           [](const MetricsSnapshot& s, const std::string& name) {
             const Metric* x = s.Find(name);
             if (x == nullptr) throw pyb::key_error(name);
             return *x;
           })
      .def("__contains__",
           [](const MetricsSnapshot& s, const std::string& name) { return s.Find(name) != nullptr; })
      .def("__iter__",
           [](const MetricsSnapshot& s) {
             pyb::list names;
             for (const auto& x : s.metrics) names.append(x.name);
             return pyb::iter(names);
           })
      .def("__len__", [](const MetricsSnapshot& s) { return s.metrics.size(); })
      .def(
          "sum",
          [](const MetricsSnapshot& s, const std::string& name, const pyb::kwargs& labels) {
            const Metric* x = s.Find(name);
            if (x == nullptr) throw pyb::key_error(name);
            double sum = 0;
            for (const auto& sample : x->samples) {
              bool match = true;
              for (const auto& [k, v] : labels)
                match = match && sample.Label(k.cast<std::string>()) == pyb::str(v).cast<std::string>();
              if (match) sum += sample.value;
            }
            return sum;
          },
          pyb::arg("name"), "The sum of the metric's samples that carry every given label=value.")
      .def("text", &MetricsSnapshot::PrometheusText, "The Prometheus text exposition format.");

  pyb::class_<PeerInfo>(m, "PeerInfo", "What the engine knows about a connected peer.")
      .def_readonly("name", &PeerInfo::name)
      .def_readonly("incarnation", &PeerInfo::incarnation)
      .def_readonly("host_id", &PeerInfo::host_id)
      .def_readonly("pid", &PeerInfo::pid)
      .def_readonly("transport", &PeerInfo::transport, "the link chosen for this peer")
      .def_readonly("outbound", &PeerInfo::outbound)
      .def_readonly("routes", &PeerInfo::routes, "the backends that reach the peer, best first")
      .def_property_readonly(
          "moved", [](const PeerInfo& p) { return MovedDict(p.moved); },
          "bytes moved to or from the peer, by route (and \"staged\")")
      .def_property_readonly(
          "nic_pairs", [](const PeerInfo& p) { return MovedDict(p.nic_pairs); },
          "tcp over several NICs (tcp_nics): the tcp bytes by pair of NICs; empty over one")
      .def_property_readonly(
          "staged_via", [](const PeerInfo& p) { return MovedDict(p.staged_via); },
          "the \"staged\" bytes by the route that carried them after the buffer pool")
      .def("__repr__",
           [](const PeerInfo& p) { return "<xfer.PeerInfo " + p.name + " via " + p.transport + ">"; });

  pyb::class_<PyRequest>(m, "Request", R"(An asynchronous transfer (Engine.read_async, write_async).

wait(timeout=None) returns True once it completed, raises its error when it failed, and returns
False when it is still running after timeout seconds. `await request` waits in asyncio.)")
      .def("wait", &PyRequest::Wait, pyb::arg("timeout") = pyb::none())
      .def("status", &PyRequest::State, "WAITING until it ends; never raises for its failure")
      .def("done", &PyRequest::Done)
      .def("cancel", &PyRequest::Cancel,
           "Drops its batches not yet started; it then ends CANCELED (COMPLETED if every byte had moved).")
      .def_property_readonly("landed", &PyRequest::Landed,
                             "after it ended other than COMPLETED: the descriptors that landed whole");

  pyb::class_<PyEngine> engine(m, "Engine", "The engine (see xfer.Engine).");
  DefTransfer(engine, "read", Op::kRead, std::string("READ: peer's memory → local memory. ") + kTransferDoc);
  DefTransfer(engine, "write", Op::kWrite,
              std::string("WRITE: local memory → peer's memory. ") + kTransferDoc);
  DefTransfer(engine, "read_async", Op::kRead,
              "Starts a READ (arguments as read()) whose deadline is now + timeout; returns a Request. "
              "Bad input raises at once. The local memory must stay valid until the request ends.");
  DefTransfer(engine, "write_async", Op::kWrite, "Starts a WRITE (arguments as write()); returns a Request.");
  BindPrepared(m, engine);
  engine.def(pyb::init<const std::string&, const pyb::kwargs&>(), pyb::arg("name"))
      .def("close", &PyEngine::Close)
      .def_property_readonly("closed", &PyEngine::Closed)
      .def_property_readonly(
          "name", [](PyEngine& self) { return self.core()->name; },
          "the bound name, e.g. \"127.0.0.1:41234\": peers connect to it")
      .def_property_readonly(
          "timeout",
          [](PyEngine& self) { return std::chrono::duration<double>(self.core()->timeout).count(); },
          "seconds: the timeout of calls given none")
      .def(
          "connect",
          [](PyEngine& self, const std::string& peer, pyb::handle timeout) {
            const milliseconds t = ToTimeout(timeout, self.core()->timeout);
            Check(self.core()->Call([&](Engine& e) { return e.Connect(peer, t); }));
          },
          pyb::arg("peer"), pyb::arg("timeout") = pyb::none(),
          "Opens a session to peer (\"host:port\", or a cluster name with the metadata option); "
          "AlreadyConnectedError if there is one.")
      .def(
          "_connect_async",
          [](PyEngine& self, const std::string& peer, pyb::handle timeout) {
            const milliseconds t = ToTimeout(timeout, self.core()->timeout);
            ConnectHandle h = 0;
            Check(self.core()->Call([&](Engine& e) { return e.ConnectAsync(peer, t, &h); }));
            return h;
          },
          pyb::arg("peer"), pyb::arg("timeout") = pyb::none())
      .def(
          "_connect_poll",
          [](PyEngine& self, ConnectHandle h) {
            ConnectStatus st;
            Check(self.core()->Call([&](Engine& e) { return e.GetConnectStatus(h, &st); }));
            if (st.done) Check(st.status);
            return st.done;
          },
          pyb::arg("handle"), "True once the connect ended well; raises its error once it failed")
      .def(
          "disconnect",
          [](PyEngine& self, const std::string& peer) {
            Check(self.core()->Call([&](Engine& e) { return e.Disconnect(peer); }));
          },
          pyb::arg("peer"), "Says goodbye to peer; its requests still running end CONNECTION_LOST.")
      .def(
          "peer_info",
          [](PyEngine& self, const std::string& peer) {
            PeerInfo info;
            Check(self.core()->Call([&](Engine& e) { return e.GetPeerInfo(peer, &info); }));
            return info;
          },
          pyb::arg("peer"), "What the engine knows about a connected peer (PeerInfo).")
      .def(
          "metrics",
          [](PyEngine& self) {
            MetricsSnapshot snapshot;
            Check(self.core()->Call([&](Engine& e) { return e.GetMetrics(&snapshot); }));
            return snapshot;
          },
          "The engine's metrics as of now (Metrics; docs/metrics.md).")
      .def_property_readonly(
          "metrics_address",
          [](PyEngine& self) {
            std::string address;  // (a closed engine serves nothing: "")
            (void)self.core()->Call([&](Engine& e) {
              address = e.MetricsAddress();
              return Status::Ok();
            });
            return address;
          },
          "host:port where the metrics_listen option serves /metrics, or \"\"")
      .def(
          "list_peers",
          [](PyEngine& self) {
            std::vector<ClusterPeer> peers;
            Check(self.core()->Call([&](Engine& e) { return e.ListPeers(&peers); }));
            return peers;
          },
          "The engines cluster metadata lists now, this one included (needs the metadata option).")
      .def(
          "remote_regions",
          [](PyEngine& self, const std::string& peer) {
            std::vector<RegionInfo> regions;
            Check(self.core()->Call([&](Engine& e) { return e.GetRemoteRegions(peer, &regions); }));
            return regions;
          },
          pyb::arg("peer"), "The peer's registered regions, as of now (one control round trip).")
      .def("_register_range",
           [](PyEngine& self, uint64_t addr, uint64_t len, const std::string& kind, const std::string& tag,
              bool read_only, pyb::object keep) {
             return RegisterRange(self.core(), addr, len, ParseKind(kind), tag, AccessOf(read_only),
                                  std::move(keep));
           })
      .def("_register_buffer",
           [](PyEngine& self, pyb::handle obj, const std::string& tag, bool read_only) {
             return RegisterBuffer(self.core(), obj, tag, AccessOf(read_only));
           })
      .def("_alloc",
           [](PyEngine& self, uint64_t len, const std::string& kind, const std::string& tag, bool huge_pages,
              int32_t device, bool read_only) {
             AllocOptions o;
             o.huge_pages = huge_pages;
             o.device = device;
             o.access = AccessOf(read_only);
             return Allocate(self.core(), len, ParseKind(kind), tag, o);
           })
      .def(
          "send_notify",
          [](PyEngine& self, const std::string& peer, pyb::handle message, pyb::handle timeout) {
            const std::string msg = *NotifyMessage(message.is_none() ? pyb::str("") : message);
            const milliseconds t = ToTimeout(timeout, self.core()->timeout);
            Check(self.core()->Call([&](Engine& e) { return e.SendNotify(peer, msg, t); }));
          },
          pyb::arg("peer"), pyb::arg("message"), pyb::arg("timeout") = pyb::none(),
          "Sends a notification not tied to a transfer; returns once the peer queued it.")
      .def(
          "get_notifies",
          [](PyEngine& self) {
            std::vector<Notification> v;
            Check(self.core()->Call([&](Engine& e) { return e.GetNotifies(&v); }));
            return Notifications(v);
          },
          "Takes every notification queued here, oldest first (a list, maybe empty).")
      .def(
          "wait_notifies",
          [](PyEngine& self, pyb::handle timeout) {
            std::vector<Notification> v;
            const milliseconds t = ToTimeout(timeout, self.core()->timeout);
            const Status st = self.core()->WaitInSlices(
                t, [&](Engine& e, milliseconds slice) { return e.WaitNotifies(&v, slice); });
            if (!st.ok() && st.code() != StatusCode::kTimeout) Raise(st);
            return Notifications(v);
          },
          pyb::arg("timeout") = pyb::none(),
          "get_notifies(), once at least one is queued; an empty list when none came within timeout.");
}

}  // namespace xfer::py
