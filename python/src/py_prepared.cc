#include "py_prepared.h"

#include <pybind11/stl.h>

#include "py_descs.h"
#include "py_errors.h"
#include "py_options.h"

namespace xfer::py {
namespace pyb = pybind11;

PyPreparedList::~PyPreparedList() {
  const bool release = !released_;
  pyb::gil_scoped_release nogil;  // (the last holder of the Core finalizes the engine)
  if (release && !core_->closing) {
    std::shared_lock lock(core_->lifetime);
    if (!core_->closing) (void)core_->engine.ReleaseList(handle_);
  }
  core_.reset();
}

void PyPreparedList::Release() {
  if (released_) RaiseInvalid("the list was released already");
  released_ = true;
  // (after close() the engine forgot every list: nothing to release)
  const Status s = core_->Call([&](Engine& e) { return e.ReleaseList(handle_); });
  if (!s.ok() && !core_->closing) Raise(s);
}

ListHandle PyPreparedList::handle(const char* what) const {
  if (released_) RaiseInvalid(std::string(what) + " list was released");
  return handle_;
}

namespace {

// The request's pairs, converted (with the GIL) before the call.
struct Pairs {
  PreparedDescs descs;
  std::vector<uint32_t> local_index, remote_index;
  Pairs(const Core& engine, const PyPreparedList& local, pyb::handle local_index_,
        const PyPreparedList& remote, pyb::handle remote_index_)
      : local_index(ToIndices(local_index_, "local_index")),
        remote_index(ToIndices(remote_index_, "remote_index")) {
    if (local.peer())
      RaiseInvalid("local: a remote list (of peer '" + *local.peer() + "') given as the local one");
    if (!remote.peer()) RaiseInvalid("remote: a local list given as the remote one");
    if (local.core() != &engine || remote.core() != &engine)
      RaiseInvalid("a list prepared by another engine");
    descs = {local.handle("the local"), local_index, remote.handle("the remote"), remote_index};
  }
};

void TransferPrepared(PyEngine& self, Op op, const PyPreparedList& local, pyb::handle local_index,
                      const PyPreparedList& remote, pyb::handle remote_index, pyb::handle timeout,
                      pyb::handle notify, pyb::handle checksum) {
  const Pairs p(*self.core(), local, local_index, remote, remote_index);
  TransferCall(*self.core(), timeout, notify, checksum)
      .Sync(*self.core(), [&](Engine& e, auto t, auto& o, auto* result) {
        return e.TransferSync(op, p.descs, t, o, result);
      });
}

std::unique_ptr<PyRequest> TransferPreparedAsync(PyEngine& self, Op op, const PyPreparedList& local,
                                                 pyb::handle local_index, const PyPreparedList& remote,
                                                 pyb::handle remote_index, pyb::handle timeout,
                                                 pyb::handle notify, pyb::handle checksum) {
  const Pairs p(*self.core(), local, local_index, remote, remote_index);
  return TransferCall(*self.core(), timeout, notify, checksum)
      .Async(self.core(),
             [&](Engine& e, auto t, auto& o, auto* h) { return e.TransferAsync(op, p.descs, t, o, h); });
}

constexpr const char* kPreparedDoc = R"(over prepared lists: pair k moves local entry
local_index[k] and remote entry remote_index[k] (of one length). Indices: integer arrays or
sequences of ints. timeout, notify and checksum as in read()/write(); an error's .landed lists
pairs.)";

void DefTransferPrepared(pyb::class_<PyEngine>& cls, const char* name, Op op, const std::string& doc) {
  const bool async = std::string_view(name).ends_with("_async");
  auto args = [&](auto f) {
    cls.def(name, f, pyb::arg("local"), pyb::arg("local_index"), pyb::arg("remote"), pyb::arg("remote_index"),
            pyb::kw_only(), pyb::arg("timeout") = pyb::none(), pyb::arg("notify") = pyb::none(),
            pyb::arg("checksum") = pyb::none(), doc.c_str());
  };
  if (async) {
    args([op](PyEngine& self, const PyPreparedList& l, pyb::handle li, const PyPreparedList& r,
              pyb::handle ri, pyb::handle timeout, pyb::handle notify, pyb::handle checksum) {
      return TransferPreparedAsync(self, op, l, li, r, ri, timeout, notify, checksum);
    });
  } else {
    args([op](PyEngine& self, const PyPreparedList& l, pyb::handle li, const PyPreparedList& r,
              pyb::handle ri, pyb::handle timeout, pyb::handle notify,
              pyb::handle checksum) { TransferPrepared(self, op, l, li, r, ri, timeout, notify, checksum); });
  }
}

}  // namespace

void BindPrepared(pyb::module_& m, pyb::class_<PyEngine>& engine) {
  pyb::class_<PyPreparedList>(m, "PreparedList",
                              "Ranges checked once, moved by index (Engine.prepare_local, prepare_remote).")
      .def("release", &PyPreparedList::Release,
           "Forgets the list (requests already started run on); also at the end of a with block.")
      .def("__len__", &PyPreparedList::size)
      .def_property_readonly("peer", &PyPreparedList::peer, "the peer of a remote list; None for a local one")
      .def_property_readonly("released", &PyPreparedList::released)
      .def("__enter__", [](pyb::object self) { return self; })
      .def("__exit__",
           [](PyPreparedList& self, pyb::args) {
             if (!self.released()) self.Release();
           })
      .def("__repr__", [](const PyPreparedList& l) {
        return "PreparedList(" + (l.peer() ? "peer=" + *l.peer() : std::string("local")) + ", " +
               std::to_string(l.size()) + " entries" + (l.released() ? ", released)" : ")");
      });
  engine
      .def(
          "prepare_local",
          [](PyEngine& self, pyb::handle addr, pyb::handle length) {
            const std::vector<MemRange> ranges = ToRanges(addr, length);
            ListHandle h = 0;
            Check(self.core()->Call([&](Engine& e) { return e.PrepareLocalList(ranges, &h); }));
            return std::make_unique<PyPreparedList>(self.core(), h, ranges.size(), std::nullopt);
          },
          pyb::arg("addr"), pyb::arg("length"),
          "A local list: ranges of this process (addr: integer array or sequence; length: the same, or one "
          "int for all), checked once. Raises InvalidArgumentError naming the first bad entry.")
      .def(
          "prepare_remote",
          [](PyEngine& self, const std::string& peer, pyb::handle addr, pyb::handle length) {
            const std::vector<MemRange> ranges = ToRanges(addr, length);
            ListHandle h = 0;
            Check(self.core()->Call([&](Engine& e) { return e.PrepareRemoteList(peer, ranges, &h); }));
            return std::make_unique<PyPreparedList>(self.core(), h, ranges.size(), peer);
          },
          pyb::arg("peer"), pyb::arg("addr"), pyb::arg("length"),
          "A remote list: ranges in the peer's registered regions, found once. Tied to the peer's session: "
          "after it ends, prepare it again. Raises RemoteAccessDeniedError naming an entry outside them.");
  DefTransferPrepared(engine, "read_prepared", Op::kRead, std::string("READ ") + kPreparedDoc);
  DefTransferPrepared(engine, "write_prepared", Op::kWrite, std::string("WRITE ") + kPreparedDoc);
  DefTransferPrepared(engine, "read_prepared_async", Op::kRead,
                      "Starts a READ over prepared lists (arguments as read_prepared()); returns a Request.");
  DefTransferPrepared(
      engine, "write_prepared_async", Op::kWrite,
      "Starts a WRITE over prepared lists (arguments as write_prepared()); returns a Request.");
}

}  // namespace xfer::py
