#include "config.h"

#include <sstream>
#include <tuple>

#include "transport/common/cuda/cuda_api.h"

namespace xfer::bench {
namespace {

// Bytes of buffer per side that the largest size needs, for every thread's requests in flight.
uint64_t SpanForThreads(const Config& c) {
  uint64_t need = 0;
  const uint64_t t = uint64_t(std::max(1, c.threads));
  for (uint64_t b : c.sizes) {
    uint64_t slots = c.reuse
                         ? c.batch * t
                         : std::max<uint64_t>(c.walk_span / b, c.batch * std::max<uint64_t>(1, c.depth) * t);
    need = std::max(need, slots * b);
  }
  return need;
}

}  // namespace

std::string ParseMem(const std::string& opt, const std::string& v, MemSpec* out) {
  *out = MemSpec{};
  if (v == "host") return "";
  if (v.rfind("cuda:", 0) == 0 && v.size() > 5 && v.size() < 10 &&
      v.find_first_not_of("0123456789", 5) == std::string::npos) {
    out->device = true;
    out->gpu = int32_t(std::stoi(v.substr(5)));
    return "";
  }
  return opt + ": bad value '" + v + "' (host, or cuda:N)";
}
MemSpec MemOf(const std::string& v) {
  MemSpec m;
  ParseMem("", v, &m);
  return m;
}

std::string GpuWhy() {
  std::string why;
  if (xfer::transport::cuda::Available(&why)) return "";
#ifdef XFER_HAVE_CUDA
  return "no GPU: " + why;
#else
  (void)why;  // "this build has no CUDA ..."
  return "not built with CUDA (configure with the CUDA toolkit present and XFER_WITH_CUDA=ON)";
#endif
}

std::string DirectionOf(const Config& c) {
  return std::string(MemOf(c.local_mem).device ? "D" : "H") + "2" + (MemOf(c.remote_mem).device ? "D" : "H");
}

void Resolve(Config& c) {
  if (c.all) c.size_arg = "2:8M";
  std::string err;
  if (!ParseSizeList(c.size_arg, &c.sizes, &err)) throw ArgError{"--size: " + err};
  if (!c.span_arg.empty() && !ParseSize(c.span_arg, &c.walk_span))
    throw ArgError{"--span: bad size '" + c.span_arg + "' (example: 256M)"};
  if (!c.slice_arg.empty() && !ParseSize(c.slice_arg, &c.slice_bytes))
    throw ArgError{"--slice-bytes: bad size '" + c.slice_arg + "'"};
  if (!c.batch_bytes_arg.empty() && !ParseSize(c.batch_bytes_arg, &c.batch_bytes))
    throw ArgError{"--batch-bytes: bad size '" + c.batch_bytes_arg + "'"};
  if (!c.staging_bytes_arg.empty() && (!ParseSize(c.staging_bytes_arg, &c.staging_bytes) ||
                                       c.staging_bytes < (64 << 10) || c.staging_bytes > (1ull << 30)))
    throw ArgError{"--staging-buffer-bytes: '" + c.staging_bytes_arg + "' is not a size of 64K..1G"};
  if (!c.transport.empty() &&
      std::find(kKnownTransports.begin(), kKnownTransports.end(), c.transport) == kKnownTransports.end())
    throw ArgError{"--transport: unknown transport '" + c.transport +
                   "' (known: local, cma, shm, tcp, ucx, cuda)"};
  MemSpec lm, rm;
  for (auto [opt, v, m] :
       {std::tuple{"--local-mem", c.local_mem, &lm}, std::tuple{"--remote-mem", c.remote_mem, &rm}}) {
    std::string e = ParseMem(opt, v, m);
    if (!e.empty()) throw ArgError{e};
  }
  bool table = std::find(c.tests.begin(), c.tests.end(), "table") != c.tests.end();
  // GPU memory of this process (and of a local target, on this machine): usable here? A remote
  // serve checks its own.
  const std::string gpu = !table && (lm.device || rm.device || c.transport == "cuda") ? GpuWhy() : "";
  if (!gpu.empty()) {
    if (lm.device) throw ArgError{"--local-mem " + c.local_mem + ": " + gpu};
    if (rm.device && c.peer.empty())
      throw ArgError{"--remote-mem " + c.remote_mem + " (the local target's region): " + gpu};
    if (c.transport == "cuda") throw ArgError{"--transport cuda: " + gpu};
  }
  const bool any_device = lm.device || rm.device;
  if (!table && c.transport == "cuda" && !any_device)
    throw ArgError{
        "--transport cuda moves only pairs with GPU memory (the copy engines): give "
        "--local-mem and/or --remote-mem cuda:N"};
  if (!table && c.transport == "cuda" && c.buffer_pool)
    throw ArgError{
        "--buffer-pool stages over the peer's transport, and --transport cuda has none "
        "(force tcp, or leave --transport out)"};
  // What the engine's paths reach (EngineOptions::transport): the target's GPU memory only
  // through cuda (one host), tcp (the target stages it) or ucx (where the target's UCX
  // registers CUDA memory: the engine says so when it does not); ours through cuda, ucx, or
  // staged over any link (shm has none).
  if (!table && rm.device && !c.transport.empty() && c.transport != "cuda" && c.transport != "tcp" &&
      c.transport != "ucx")
    throw ArgError{"--remote-mem " + c.remote_mem + " with --transport " + c.transport +
                   ": the target's GPU memory is reached only through cuda (one host), tcp "
                   "(the target stages it) or ucx (a UCX with CUDA at the target)"};
  if (!table && lm.device && c.transport == "shm")
    throw ArgError{"--local-mem " + c.local_mem +
                   " with --transport shm: shm moves host memory "
                   "only, and has no link to stage GPU memory over"};
  if (c.mem != "alloc" && c.mem != "register")
    throw ArgError{"--mem: bad value '" + c.mem + "' (alloc or register)"};
  if (c.transport == "shm" && c.mem == "register")
    throw ArgError{
        "--transport shm moves only memory from Engine::AllocMem (mapped shared "
        "memory), and --mem register registers mmap'd memory with RegisterMem: use "
        "--mem alloc (the default), or another transport"};
  if (c.huge_pages && c.mem != "alloc")
    throw ArgError{"--huge-pages applies to --mem alloc (AllocOptions::huge_pages) only"};
  if (table && c.bidir) throw ArgError{"-b/--bidirectional does not apply to the table test"};
  if (table && c.buffer_pool)
    throw ArgError{
        "--buffer-pool does not apply to the table test (it measures the buffer pool "
        "in its bufferpool cells)"};
  if (table && !c.transport.empty())
    throw ArgError{"--transport does not apply to the table test (it tries every transport)"};
  if (c.transport == "local" && !c.peer.empty())
    throw ArgError{"--transport local works only with a target in this process (no peer address)"};
  c.span = SpanForThreads(c);
  uint64_t sides = c.bidir ? 4 : 2;
  if (c.span * sides > MaxSpan() * 2)
    throw ArgError{"each side would need " + FormatSize(c.span) +
                   " of buffers (largest size x --batch x --depth x --threads), too much of this "
                   "machine's memory: lower --size, --batch, --depth, --threads or --span"};
  if (c.local_name.empty()) c.local_name = c.peer.empty() ? "127.0.0.1" : "0.0.0.0";
}

json ConfigToJson(const Config& c) {
  return {{"tests", c.tests},
          {"sizes", c.sizes},
          {"iters", c.iters},
          {"duration", c.duration},
          {"warmup", c.warmup},
          {"batch", c.batch},
          {"depth", c.depth},
          {"threads", c.threads},
          {"links", c.links},
          {"streams", c.streams},
          {"slice_bytes", c.slice_bytes},
          {"batch_bytes", c.batch_bytes},
          {"spin_us", c.spin_us},
          {"transport", c.transport},
          {"bidir", c.bidir},
          {"reuse", c.reuse},
          {"prepared", c.prepared},
          {"walk_span", c.walk_span},
          {"span", c.span},
          {"verify", c.verify},
          {"local_mem", c.local_mem},
          {"remote_mem", c.remote_mem},
          {"mem", c.mem},
          {"huge_pages", c.huge_pages},
          {"notify", c.notify},
          {"checksum", c.checksum},
          {"nics", c.nics},
          {"no_metrics", c.no_metrics},
          {"buffer_pool", c.buffer_pool},
          {"staging_buffers", c.staging_buffers},
          {"staging_bytes", c.staging_bytes},
          {"set", c.set}};
}

void ConfigFromJson(const json& j, Config* c) {
  c->tests = j.at("tests").get<std::vector<std::string>>();
  c->sizes = j.at("sizes").get<std::vector<uint64_t>>();
  c->iters = j.at("iters");
  c->duration = j.at("duration");
  c->warmup = j.at("warmup");
  c->batch = j.at("batch");
  c->depth = j.at("depth");
  c->threads = j.at("threads");
  c->links = j.at("links");
  c->streams = j.at("streams");
  c->slice_bytes = j.at("slice_bytes");
  c->batch_bytes = j.at("batch_bytes");
  c->spin_us = j.at("spin_us");
  c->transport = j.at("transport");
  c->bidir = j.at("bidir");
  c->reuse = j.at("reuse");
  c->prepared = j.value("prepared", false);
  c->nics = j.value("nics", std::string());
  c->walk_span = j.at("walk_span");
  c->span = j.at("span");
  c->verify = j.at("verify");
  c->local_mem = j.at("local_mem");
  c->remote_mem = j.at("remote_mem");
  c->mem = j.at("mem");
  c->huge_pages = j.at("huge_pages");
  c->notify = j.value("notify", false);
  c->checksum = j.value("checksum", false);
  c->no_metrics = j.value("no_metrics", false);
  c->buffer_pool = j.at("buffer_pool");
  c->staging_buffers = j.at("staging_buffers");
  c->staging_bytes = j.at("staging_bytes");
  c->set = j.value("set", std::vector<std::string>());
  if (c->mem != "alloc" && c->mem != "register") throw std::runtime_error("mem '" + c->mem + "'");
  MemSpec m;
  for (const std::string* v : {&c->local_mem, &c->remote_mem})
    if (!ParseMem("memory", *v, &m).empty()) throw std::runtime_error("memory '" + *v + "'");
  if (c->sizes.empty() || c->batch == 0 || c->depth == 0 || c->threads < 1 || c->threads > 256 ||
      c->span == 0 || c->span > MaxSpan())
    throw std::runtime_error("configuration out of range");
}

std::string RerunCommand(const std::string& argv0, const Config& c) {
  std::ostringstream o;
  o << ShellQuote(argv0);
  if (!c.main_job) o << ' ' << c.tests.front();
  o << " -s " << ShellQuote(c.size_arg);
  if (c.iters)
    o << " -n " << c.iters;
  else
    o << " -D " << c.duration;
  if (c.warmup >= 0) o << " -w " << c.warmup;
  o << " --batch " << c.batch << " --depth " << c.depth;
  if (c.threads > 1) o << " --threads " << c.threads;
  if (c.links) o << " --links " << c.links;
  if (c.streams) o << " --streams " << c.streams;
  if (c.slice_bytes) o << " --slice-bytes " << c.slice_arg;
  if (c.batch_bytes) o << " --batch-bytes " << c.batch_bytes_arg;
  if (c.spin_us >= 0) o << " --spin " << c.spin_us;
  if (!c.transport.empty()) o << " --transport " << c.transport;
  o << " --mem " << c.mem;
  if (c.huge_pages) o << " --huge-pages";
  if (c.local_mem != "host") o << " --local-mem " << c.local_mem;
  if (c.remote_mem != "host") o << " --remote-mem " << c.remote_mem;
  if (c.notify) o << " --notify";
  if (c.checksum) o << " --checksum";
  if (!c.nics.empty()) o << " --nics " << c.nics;
  if (c.no_metrics) o << " --no-metrics";
  if (!c.metrics_listen.empty()) o << " --metrics " << c.metrics_listen;
  if (c.buffer_pool) o << " --buffer-pool";
  if (c.staging_buffers) o << " --staging-buffers " << c.staging_buffers;
  if (c.staging_bytes) o << " --staging-buffer-bytes " << c.staging_bytes_arg;
  for (const std::string& kv : c.set) o << " --set " << ShellQuote(kv);
  if (c.bidir) o << " --bidirectional";
  if (c.prepared) o << " --prepared";
  if (c.reuse)
    o << " --reuse";
  else if (!c.span_arg.empty())
    o << " --span " << c.span_arg;
  if (c.verify) o << " --verify";
  if (!c.host_id.empty()) o << " --host-id " << ShellQuote(c.host_id);
  if (c.expect_bw >= 0) o << " --expect-bw " << c.expect_bw;
  if (c.expect_p99 >= 0) o << " --expect-p99 " << c.expect_p99;
  if (!c.json_file.empty()) o << " --json " << ShellQuote(c.json_file);
  if (!c.csv_file.empty()) o << " --csv " << ShellQuote(c.csv_file);
  if (!c.peer.empty()) o << ' ' << ShellQuote(c.peer);
  return o.str();
}

}  // namespace xfer::bench
