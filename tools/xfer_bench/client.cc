#include "client.h"

namespace xfer::bench {

std::string Bench::Setup(const std::string& transport) {
  Config& c = c_;
  c.transport = transport;
  int fd = -1;
  std::string err;
  if (c.peer.empty()) {
    err = target_.Start(transport == "local", target_host_id_.empty() ? c.host_id : target_host_id_,
                        c.secret_file, &fd);
    if (!err.empty()) return err;
  } else {
    fd = ConnectRetry(c.peer, c.connect_timeout, &err);
    if (fd < 0) return err;
  }
  ctl_.Reset(fd);

  json reply;
  json hello = {{"type", "hello"},
                {"schema", kCtlSchema},
                {"version", kCtlVersion},
                {"client", MachineLine()},
                {"config", ConfigToJson(c)}};
  err = ctl_.Call(hello, &reply, int(std::max(30.0, c.connect_timeout) * 1000));
  if (!err.empty()) return "the target refused: " + err;
  peer_ = reply.value("engine", "");
  srv_in_process_ = reply.value("in_process", false);
  srv_pid_ = reply.value("pid", 0);
  srv_host_ = reply.value("host", "");
  srv_page_kb_ = reply.value("page_kb", uint64_t(0));

  // This engine listens only when the peer must reach it (bidirectional).
  std::string name = c.local_name;
  if (c.bidir) {
    std::string h = c.peer.empty() ? "127.0.0.1" : SockHost(fd, false);
    name = (h.empty() ? std::string("0.0.0.0") : h) + ":0";
  }
  engine_ = std::make_unique<Engine>();
  Status st = engine_->Initialize(name, MakeEngineOptions(c));
  if (!st.ok()) return "Initialize(" + name + "): " + st.ToString();
  if (c.bidir) drain_ = std::make_unique<NotifyDrain>(*engine_);  // the peer's --notify requests
  // The buffers belong to this engine (AllocMem), or are registered with it.
  err = local_.Allocate(engine_.get(), c, c.span, kLocalTag, MemOf(c.local_mem));
  if (!err.empty()) return "local buffers: " + err;
  local_page_kb_ = local_.page_kb();
  if (c.bidir) {
    err = region_.Allocate(engine_.get(), c, c.span, kRegionTag, MemOf(c.remote_mem));
    if (!err.empty()) return "target region for the reverse direction: " + err;
  }
  st = ConnectEngine(*engine_, peer_, c.connect_timeout);
  if (!st.ok()) return "Connect(" + peer_ + "): " + st.ToString();
  st = engine_->GetPeerInfo(peer_, &peer_info_);
  if (!st.ok()) return "GetPeerInfo(" + peer_ + "): " + st.ToString();
  st = FindRegion(*engine_, peer_, kRegionTag, MemOf(c.remote_mem), &remote_addr_, &remote_len_,
                  &remote_shared_);
  if (!st.ok()) return st.message();
  init_ = std::make_unique<Initiator>(c_, engine_.get(), peer_, &local_, remote_addr_, remote_len_);
  err = init_->CheckRemote();
  if (!err.empty()) return err;
  if (c.bidir) {
    err = ctl_.Call({{"type", "bidir"}, {"client_engine", engine_->LocalName()}}, &reply, 30000);
    if (!err.empty()) return err;
    rev_transport_ = reply.value("transport", "");
    rev_shm_ = reply.value("shm", false);
  }
  return "";
}

void Bench::Teardown() {
  init_.reset();
  // AllocMem memory goes back with FreeMem while the peer is still connected (it waits for the
  // peer to let go); the target frees its own on "bye" and answers when done, and only then
  // this engine finalizes, so that neither waits on a peer that is gone.
  std::string err = local_.Free();
  if (err.empty()) err = region_.Free();
  if (!err.empty()) std::fprintf(stderr, "xfer-bench: warning: %s\n", err.c_str());
  if (ctl_.open()) {
    json reply;
    if (ctl_.Call({{"type", "bye"}}, &reply, 30000).empty()) {
      std::string fe = reply.value("free_error", "");
      if (!fe.empty()) std::fprintf(stderr, "xfer-bench: warning: the target: %s\n", fe.c_str());
    }
    ctl_.Close();
  }
  drain_.reset();
  if (engine_) engine_->Finalize();
  engine_.reset();
  local_.Reset();
  region_.Reset();
  target_.Stop();
}

// One size: the control marks around the timed window; with -b, the peer's row too.
bool Bench::RunOne(const std::string& test, uint64_t block, Row* fwd, Row* rev, std::string* err) {
  json reply;
  *err = ctl_.Call({{"type", "prepare"}, {"test", test}, {"bytes", block}}, &reply, 120000);
  if (!err->empty()) return false;
  double srv0 = -1, srv1 = -1;
  Hooks hk;
  hk.before_start = [&]() -> std::string {
    json r;
    std::string e = ctl_.Call({{"type", "go"}}, &r, 30000);
    srv0 = r.value("cpu_s", -1.0);
    return e;
  };
  json end_reply;
  hk.after_end = [&]() -> std::string {
    std::string e = ctl_.Call({{"type", "end"}}, &end_reply, 600000);
    srv1 = end_reply.value("cpu_s", -1.0);
    return e;
  };
  if (!init_->RunSize(test, block, hk, &progress_, fwd, err)) return false;
  fwd->transport = peer_info_.transport;
  fwd->direction = DirectionOf(c_);
  fwd->path = c_.buffer_pool ? "bufferpool" : "direct";
  if (!srv_in_process_ && srv0 >= 0 && srv1 >= 0 && fwd->seconds > 0)
    fwd->srv_cpu = (srv1 - srv0) / fwd->seconds * 100;
  if (c_.verify && fwd->verify != "ok") verify_failed_ = true;
  if (c_.bidir) {
    if (!end_reply.contains("row")) {
      *err = "the peer sent no row for the reverse direction";
      return false;
    }
    *rev = RowFromJson(end_reply["row"]);
    rev->transport = rev_transport_;
    rev->direction = fwd->direction;  // the peer runs the same test: its buffers local_mem too
    rev->path = fwd->path;
    if (c_.verify && rev->verify != "ok") verify_failed_ = true;
  }
  return true;
}

int Bench::RunTests() {
  std::string err = Setup(c_.transport);
  if (!err.empty()) {
    Teardown();
    std::fprintf(stderr, "xfer-bench: %s\n", err.c_str());
    return 1;
  }
  PrintHeader("");
  for (const auto& test : c_.tests) {
    PrintTableHeader(test);
    for (uint64_t b : c_.sizes) {
      Row fwd, rev;
      if (!RunOne(test, b, &fwd, &rev, &err)) {
        progress_.Clear();
        Teardown();
        std::fprintf(stderr, "xfer-bench: %s\n", err.c_str());
        return 1;
      }
      if (c_.bidir) {
        fwd.dir = "->";
        rev.dir = "<-";
        Row sum = SumRows(fwd, rev);
        for (const Row* r : {&fwd, &rev, &sum}) {
          PrintRow(*r);
          rows_.push_back(*r);
        }
      } else {
        PrintRow(fwd);
        rows_.push_back(fwd);
      }
    }
    PrintPaths(test);
  }
  Teardown();
  return Finish();
}

int Bench::Run() {
  if (c_.tests.size() == 1 && c_.tests[0] == "table") return RunTable();
  return RunTests();
}

}  // namespace xfer::bench
