// One side's buffer (BenchMem).
#pragma once

#include "config.h"
#include "system.h"
#include "transport/common/cuda/cuda_api.h"

namespace xfer::bench {

// One side's buffer, as --mem and the memory kind say. Host memory: Engine::AllocMem (a memfd
// that a same-host peer maps and moves with memcpy: path shm), or an anonymous mmap (Span)
// registered with RegisterMem (the peer's transport: cma on one host). GPU memory (cuda:N):
// Engine::AllocMem(kCuda) on device N, or cudaMalloc (cuda::AllocDevice) + RegisterMem(kCuda).
// Either way every byte is written with the same fill before anything is timed (AllocMem
// memory is populated already; the fill keeps the modes alike); GPU memory through cuda::Copy.
class BenchMem {
 public:
  BenchMem() = default;
  ~BenchMem() { Reset(); }
  BenchMem(const BenchMem&) = delete;
  BenchMem& operator=(const BenchMem&) = delete;

  // Empty on success, else what failed.
  std::string Allocate(Engine* engine, const Config& c, uint64_t len, const char* tag, const MemSpec& mem) {
    Reset();
    len = PageRound(std::max<uint64_t>(len, 1));
    engine_ = engine;
    alloc_ = c.mem == "alloc";
    mem_ = mem;
    if (mem.device) {
      const std::string where = "cuda:" + std::to_string(mem.gpu);
      void* p = nullptr;
      if (alloc_) {
        xfer::AllocOptions ao;
        ao.device = mem.gpu;
        Status st = engine->AllocMem(len, xfer::MemType::kCuda, &p, &handle_, tag, ao);
        if (!st.ok())
          return "AllocMem(" + FormatSize(len) + ", " + where + ", " + tag + "): " + st.ToString();
      } else {
        Status st = xfer::transport::cuda::AllocDevice(len, mem.gpu, &p);
        if (!st.ok()) return "cudaMalloc(" + FormatSize(len) + ", " + where + "): " + st.ToString();
        device_ = p;
        st = engine->RegisterMem(p, len, xfer::MemType::kCuda, &handle_, tag);
        if (!st.ok()) return std::string("RegisterMem (") + tag + ", " + where + "): " + st.ToString();
      }
      p_ = static_cast<uint8_t*>(p);
      len_ = len;
      return Fill(0x5a);
    }
    if (alloc_) {
      void* p = nullptr;
      xfer::AllocOptions ao;
      ao.huge_pages = c.huge_pages;
      Status st = engine->AllocMem(len, xfer::MemType::kHost, &p, &handle_, tag, ao);
      if (!st.ok()) return "AllocMem(" + FormatSize(len) + ", " + tag + "): " + st.ToString();
      p_ = static_cast<uint8_t*>(p);
      len_ = len;
      std::memset(p_, 0x5a, len_);  // the same fill as Span
      if (c.huge_pages) page_kb_ = PageKbAt(p_);
      return "";
    }
    if (!span_.Allocate(len)) return "cannot allocate " + FormatSize(len) + " (" + tag + ")";
    p_ = span_.data();
    len_ = span_.size();
    Status st = engine->RegisterMem(p_, len_, xfer::MemType::kHost, &handle_, tag);
    if (!st.ok()) return std::string("RegisterMem (") + tag + "): " + st.ToString();
    return "";
  }
  // Before the engine finalizes: FreeMem for AllocMem memory (registered memory stays until
  // Finalize, as it always did). Empty, or what FreeMem said.
  std::string Free() {
    std::string err;
    if (alloc_ && handle_ && engine_) {
      Status st = engine_->FreeMem(handle_);
      if (!st.ok()) err = "FreeMem: " + st.ToString();
      handle_ = 0;
      p_ = nullptr;
      len_ = 0;
    }
    return err;
  }
  // After the engine finalized (or never was): forgets everything, unmaps the Span, frees
  // cudaMalloc'd memory.
  void Reset() {
    span_.Release();
    if (device_) xfer::transport::cuda::FreeDevice(device_);
    device_ = nullptr;
    p_ = nullptr;
    len_ = 0;
    handle_ = 0;
    engine_ = nullptr;
    page_kb_ = 0;
    mem_ = MemSpec{};
  }

  // Copies between host memory and [addr, addr+len) of this buffer, whatever memory it is.
  // Empty, or what failed.
  std::string Put(uint64_t addr, const void* src, uint64_t len) const {
    if (!mem_.device) {
      std::memcpy(reinterpret_cast<void*>(addr), src, len);
      return "";
    }
    return DeviceCopy(Op::kWrite, addr, const_cast<void*>(src), len);
  }
  std::string Get(void* dst, uint64_t addr, uint64_t len) const {
    if (!mem_.device) {
      std::memcpy(dst, reinterpret_cast<const void*>(addr), len);
      return "";
    }
    return DeviceCopy(Op::kRead, addr, dst, len);
  }
  std::string Set(uint64_t addr, uint8_t byte, uint64_t len) const {
    if (!mem_.device) {
      std::memset(reinterpret_cast<void*>(addr), byte, len);
      return "";
    }
    std::vector<uint8_t> h(std::min<uint64_t>(len, 8ull << 20), byte);
    for (uint64_t off = 0; off < len; off += h.size()) {
      std::string e = Put(addr + off, h.data(), std::min<uint64_t>(h.size(), len - off));
      if (!e.empty()) return e;
    }
    return "";
  }

  uint8_t* data() const { return p_; }
  uint64_t size() const { return len_; }
  uint64_t addr() const { return reinterpret_cast<uint64_t>(p_); }
  uint64_t page_kb() const { return page_kb_; }  // with --huge-pages: what the kernel gave
  bool device() const { return mem_.device; }

 private:
  std::string Fill(uint8_t byte) {
    std::string e = Set(addr(), byte, len_);
    return e.empty() ? e : "filling GPU memory: " + e;
  }
  static std::string DeviceCopy(Op op, uint64_t dev, void* host, uint64_t len) {
    const xfer::transport::Slice s{reinterpret_cast<uint64_t>(host), dev, len};
    Status st =
        xfer::transport::cuda::Copy(op, {&s, 1}, std::chrono::steady_clock::now() + std::chrono::seconds(60));
    return st.ok() ? "" : "cuda copy: " + st.ToString();
  }

  Engine* engine_ = nullptr;
  bool alloc_ = false;
  MemSpec mem_;
  Span span_;
  void* device_ = nullptr;  // cudaMalloc'd (--mem register with GPU memory)
  uint8_t* p_ = nullptr;
  uint64_t len_ = 0;
  xfer::MemHandle handle_ = 0;
  uint64_t page_kb_ = 0;
};

}  // namespace xfer::bench
