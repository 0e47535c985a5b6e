// The extension module of the Python package gradsnap (docs/python.md): a thin binding of the
// public client API (include/gradsnap/client.h) and nothing else of the tree.
//
// OVERVIEW
//   _gradsnap.Client wraps one gradsnap::client::Client. Tensors go in and out through the
//   buffer protocol: save() hands the client pointers into the callers' buffers (no copy on
//   this side), restore() and read_range() write straight into NumPy arrays made here or into
//   buffers the caller passes (out=). NumPy is used only through Python calls (numpy.empty),
//   never its C API, so one build works with NumPy 1.x and 2.x.
//
// ERROR HANDLING
//   A non-OK absl::Status becomes a StatusError, translated at the module edge into the
//   exception class of its code (gradsnap/errors.py: gradsnap.DataLoss, gradsnap.NotFound, ...).
//   Bad Python arguments raise TypeError / ValueError before any I/O.
//
// THREAD SAFETY
//   The GIL is released around every client call. A call holds its own reference to the Client,
//   so close() from another thread never frees it under a running call: the last reference
//   closes it (waiting for its queued saves) with the GIL released.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "gradsnap/client.h"

namespace py = pybind11;
namespace gc = gradsnap::client;

namespace {

// A non-OK status on its way to Python (translated in PYBIND11_MODULE).
struct StatusError : std::exception {
  explicit StatusError(absl::Status s) : status(std::move(s)) {}
  const char* what() const noexcept override { return "gradsnap status"; }
  absl::Status status;
};

void Check(const absl::Status& s) {
  if (!s.ok()) throw StatusError(s);
}

template <typename T>
T Check(absl::StatusOr<T> s) {
  if (!s.ok()) throw StatusError(s.status());
  return *std::move(s);
}

// The exception class of `code` in gradsnap.errors, named as absl::StatusCodeToString spells it.
py::object ErrorClass(absl::StatusCode code) {
  py::module_ errors = py::module_::import("gradsnap.errors");
  return errors.attr("error_class")(absl::StatusCodeToString(code));
}

// A Py_buffer released when this goes away (the GIL must be held then).
class Buffer {
 public:
  Buffer(py::handle obj, bool writable, const std::string& what) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj.ptr(), &view_, flags) != 0) {
      PyErr_Clear();
      std::string type = py::str(py::type::handle_of(obj).attr("__name__"));
      throw py::type_error(what + ": a " + type + " is not a " +
                           (writable ? "writable " : "") +
                           "C-contiguous buffer (NumPy array, memoryview, bytearray, ...)");
    }
    held_ = true;
  }
  ~Buffer() {
    if (held_) PyBuffer_Release(&view_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return view_.buf; }
  size_t bytes() const { return static_cast<size_t>(view_.len); }
  size_t itemsize() const { return static_cast<size_t>(view_.itemsize); }
  std::string format() const { return view_.format ? view_.format : "B"; }
  std::vector<int64_t> shape() const {
    std::vector<int64_t> s;
    for (int i = 0; i < view_.ndim; ++i) s.push_back(view_.shape[i]);
    if (view_.ndim == 1 && view_.shape == nullptr) s = {static_cast<int64_t>(bytes() / itemsize())};
    return s;
  }

 private:
  Py_buffer view_{};
  bool held_ = false;
};

// The dtype of a buffer's struct format ("f", "<d", "e", "q", "B", ...); nullopt when gradsnap
// has no such element type.
std::optional<gradsnap::DType> DTypeOfFormat(std::string f, size_t itemsize) {
  using gradsnap::DType;
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || f[0] == '<')) f = f.substr(1);
  if (f.size() != 1) return std::nullopt;
  switch (f[0]) {
    case 'f': return DType::kF32;
    case 'd': return DType::kF64;
    case 'e': return DType::kF16;
    case 'B': case 'c': return DType::kU8;
    case 'i': case 'l': case 'q': case 'n':
      if (itemsize == 4) return DType::kI32;
      if (itemsize == 8) return DType::kI64;
      return std::nullopt;
    default: return std::nullopt;
  }
}

// NumPy's name of a dtype's element type. bf16 has none: it comes back as uint16 (its bits).
const char* NumpyDType(gradsnap::DType t) {
  using gradsnap::DType;
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kBF16: return "uint16";
    case DType::kF16: return "float16";
    case DType::kF64: return "float64";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kU8: return "uint8";
    default: return "uint8";
  }
}

py::object NumpyEmpty(const std::vector<int64_t>& shape, const char* dtype) {
  py::module_ np = py::module_::import("numpy");
  return np.attr("empty")(py::cast(shape), py::arg("dtype") = dtype);
}

void CheckName(const std::string& what, const std::string& v) {
  if (v.empty()) throw py::value_error(what + " must not be empty");
}

py::dict InfoDict(const gc::CheckpointInfo& i) {
  py::dict d;
  d["job"] = i.job;
  d["step"] = i.step;
  d["kind"] = i.kind == gc::CheckpointKind::kFull ? "full" : "delta";
  d["base_step"] = i.base_step;
  d["world_size"] = i.world_size;
  d["state"] = i.state == gc::CheckpointState::kCommitted ? "committed" : "pending";
  d["raw_bytes"] = i.raw_bytes;
  d["stored_bytes"] = i.stored_bytes;
  d["created_unix_ms"] = i.created_unix_ms;
  d["committed_unix_ms"] = i.committed_unix_ms;
  d["metadata"] = py::bytes(i.metadata);
  return d;
}

py::dict TensorDict(const gc::TensorInfo& t) {
  py::dict d;
  d["name"] = t.spec.name;
  const char* dn = gradsnap::DTypeName(t.spec.dtype);
  d["dtype"] = dn ? dn : "unknown";
  d["shape"] = py::tuple(py::cast(t.spec.shape));
  d["byte_length"] = t.spec.byte_length;
  d["digest"] = t.digest;
  d["stored_bytes"] = t.stored_bytes;
  return d;
}

// Runs f (a client call returning StatusOr) with the GIL released; its value or a StatusError.
template <typename F>
auto Call(F f) -> typename decltype(f())::value_type {
  decltype(f()) r = absl::UnknownError("not run");
  {
    py::gil_scoped_release nogil;
    r = f();
  }
  return Check(std::move(r));
}

// Runs f (a client call returning Status) with the GIL released; a StatusError if not OK.
template <typename F>
void CallStatus(F f) {
  absl::Status s;
  {
    py::gil_scoped_release nogil;
    s = f();
  }
  Check(s);
}

// An int step as is; "latest": the newest committed step of the job (NOT_FOUND if none).
int64_t ResolveStep(gc::Client& c, const std::string& job, py::object step) {
  if (py::isinstance<py::str>(step)) {
    if (py::cast<std::string>(step) != "latest") {
      throw py::value_error("step must be an int or \"latest\"");
    }
    auto l = Call([&] { return c.List(job, false); });
    if (l.empty()) {
      throw StatusError(absl::NotFoundError("gradsnap: job " + job +
                                            " has no committed checkpoint"));
    }
    return l.back().step;
  }
  if (!py::isinstance<py::int_>(step) || py::isinstance<py::bool_>(step)) {
    throw py::type_error("step must be an int or \"latest\"");
  }
  return py::cast<int64_t>(step);
}

// Restore: at most this many tensors of a shard are read one by one (RestoreTensor) when they
// are less than half its payload; more, or more bytes, take one stream of the whole shard.
constexpr size_t kRestoreTensorsAlone = 8;

// A piece of a shard's payload wanted in a caller's buffer: payload bytes [begin, end) go to
// dst[0, end - begin).
struct PayloadRegion {
  uint64_t begin, end;
  char* dst;
};

// Copies the parts of payload bytes [at, at + n) (held at p) that fall in `rs` (sorted by
// begin); pieces must come in payload order, `first` carrying over from piece to piece.
void ScatterPiece(const std::vector<PayloadRegion>& rs, size_t* first, const char* p, uint64_t at,
                  size_t n) {
  const uint64_t end = at + n;
  while (*first < rs.size() && rs[*first].end <= at) ++*first;
  for (size_t k = *first; k < rs.size() && rs[k].begin < end; ++k) {
    const uint64_t b = std::max(at, rs[k].begin), e = std::min(end, rs[k].end);
    if (b < e) std::memcpy(rs[k].dst + (b - rs[k].begin), p + (b - at), e - b);
  }
}

// One restore stream of the whole payload (RestoreShard: chunk checksums and every tensor's
// digest checked), each piece copied into the regions (sorted by begin) it overlaps, the bytes
// no region wants dropped. OUT_OF_RANGE when a region lies past the payload.
absl::Status StreamIntoRegions(gc::Client& c, const std::string& job, int64_t step, int32_t rank,
                               const std::vector<PayloadRegion>& rs) {
  uint64_t hi = 0, pos = 0;
  for (const PayloadRegion& r : rs) hi = std::max(hi, r.end);
  size_t first = 0;
  absl::Status s = c.RestoreShard(job, step, rank, [&](const void* p, size_t n) {
    ScatterPiece(rs, &first, static_cast<const char*>(p), pos, n);
    pos += n;
    return absl::OkStatus();
  });
  if (s.ok() && pos < hi) {
    s = absl::OutOfRangeError("gradsnap: bytes up to " + std::to_string(hi) +
                              " asked of a payload of " + std::to_string(pos) + " bytes");
  }
  return s;
}

class PyClient {
 public:
  explicit PyClient(std::shared_ptr<gc::Client> c) : client_(std::move(c)) {}
  ~PyClient() {
    py::gil_scoped_release nogil;
    client_.reset();
  }

  static std::unique_ptr<PyClient> Open(const gc::ClientOptions& o) {
    absl::StatusOr<std::unique_ptr<gc::Client>> c;
    {
      py::gil_scoped_release nogil;
      c = gc::Client::Connect(o);
    }
    return std::make_unique<PyClient>(std::shared_ptr<gc::Client>(Check(std::move(c))));
  }

  void Close() {
    std::shared_ptr<gc::Client> c;
    {
      std::lock_guard<std::mutex> l(mu_);
      c = std::move(client_);
    }
    py::gil_scoped_release nogil;
    c.reset();  // waits for queued saves unless another call still holds it
  }
  bool closed() {
    std::lock_guard<std::mutex> l(mu_);
    return client_ == nullptr;
  }

  void Save(const std::string& job, int64_t step, py::handle tensors, int32_t rank,
            int32_t world_size, py::object dtypes, py::bytes metadata,
            py::bytes checkpoint_metadata) {
    CheckName("job", job);
    if (!py::isinstance<py::dict>(tensors)) {
      throw py::type_error("tensors must be a dict {name: buffer}");
    }
    py::dict overrides;
    if (!dtypes.is_none()) {
      if (!py::isinstance<py::dict>(dtypes)) throw py::type_error("dtypes must be a dict");
      overrides = dtypes;
    }
    std::vector<std::unique_ptr<Buffer>> held;
    std::vector<gc::TensorRef> refs;
    for (auto kv : py::reinterpret_borrow<py::dict>(tensors)) {
      if (!py::isinstance<py::str>(kv.first)) throw py::type_error("tensor names must be str");
      std::string name = py::cast<std::string>(kv.first);
      held.push_back(std::make_unique<Buffer>(kv.second, false, "tensor '" + name + "'"));
      const Buffer& b = *held.back();
      gc::TensorRef r;
      r.spec.name = name;
      r.spec.shape = b.shape();
      r.spec.byte_length = b.bytes();
      std::optional<gradsnap::DType> dt;
      if (overrides.contains(kv.first)) {
        std::string dn = py::cast<std::string>(overrides[kv.first]);
        dt = gradsnap::DTypeFromName(dn);
        if (!dt) throw py::value_error("tensor '" + name + "': unknown dtype '" + dn + "'");
        size_t es = gradsnap::DTypeSize(*dt);
        if (es != b.itemsize()) {  // e.g. raw bytes saved as bf16: a flat tensor
          if (b.bytes() % es != 0) {
            throw py::value_error("tensor '" + name + "': " + std::to_string(b.bytes()) +
                                  " bytes is not a whole number of " + dn + " elements");
          }
          r.spec.shape = {static_cast<int64_t>(b.bytes() / es)};
        }
      } else {
        dt = DTypeOfFormat(b.format(), b.itemsize());
        if (!dt) {
          throw py::type_error("tensor '" + name + "': element format '" + b.format() +
                               "' has no gradsnap dtype (f32 bf16 f16 f64 i32 i64 u8); pass "
                               "dtypes={'" + name + "': 'u8'} to store its bytes");
        }
      }
      r.spec.dtype = *dt;
      r.data = b.data();
      refs.push_back(std::move(r));
    }
    gc::CheckpointSpec cs;
    cs.job = job;
    cs.step = step;
    cs.world_size = world_size;
    cs.metadata = checkpoint_metadata;
    gc::ShardSpec ss;
    ss.job = job;
    ss.step = step;
    ss.rank = rank;
    ss.metadata = metadata;
    std::shared_ptr<gc::Client> c = Get();
    CallStatus([&] {
      absl::Status s = c->BeginCheckpoint(cs);
      return s.ok() ? c->SaveShard(ss, std::move(refs)) : s;
    });
  }

  py::dict Restore(const std::string& job, py::object step, int32_t rank, py::object out,
                   py::object names) {
    CheckName("job", job);
    std::shared_ptr<gc::Client> c = Get();
    int64_t st = ResolveStep(*c, job, step);
    gc::Manifest m = Call([&] { return c->Show(job, st); });
    const gc::ShardInfo* shard = nullptr;
    for (const auto& sh : m.shards) {
      if (sh.rank == rank) shard = &sh;
    }
    if (shard == nullptr) {
      throw StatusError(absl::NotFoundError("gradsnap: " + job + " step " + std::to_string(st) +
                                            " has no shard for rank " + std::to_string(rank)));
    }
    py::dict outs;
    if (!out.is_none()) {
      if (!py::isinstance<py::dict>(out)) throw py::type_error("out must be a dict {name: buffer}");
      outs = out;
    }
    std::vector<std::string> want;
    if (!names.is_none()) {
      for (auto n : names) want.push_back(py::cast<std::string>(n));
    } else {
      for (const auto& t : shard->tensors) want.push_back(t.spec.name);
    }
    for (auto kv : outs) {
      std::string n = py::cast<std::string>(kv.first);
      if (std::find(want.begin(), want.end(), n) == want.end()) {
        throw StatusError(absl::NotFoundError("gradsnap: out names tensor '" + n +
                                              "', which is not restored from rank " +
                                              std::to_string(rank)));
      }
    }
    // Each tensor's place in the payload (its tensors back to back in manifest order).
    std::map<std::string, std::pair<const gc::TensorInfo*, uint64_t>> where;
    uint64_t payload = 0;
    for (const auto& t : shard->tensors) {
      where[t.spec.name] = {&t, payload};
      payload += t.spec.byte_length;
    }
    py::dict result;
    std::vector<std::unique_ptr<Buffer>> held;
    std::vector<PayloadRegion> rs;
    uint64_t wanted = 0;
    for (const std::string& n : want) {
      auto it = where.find(n);
      if (it == where.end()) {
        throw StatusError(absl::NotFoundError("gradsnap: rank " + std::to_string(rank) +
                                              " of " + job + " step " + std::to_string(st) +
                                              " has no tensor '" + n + "'"));
      }
      const gc::TensorInfo* ti = it->second.first;
      py::object dest = outs.contains(n) ? py::object(outs[py::str(n)])
                                         : NumpyEmpty(ti->spec.shape, NumpyDType(ti->spec.dtype));
      held.push_back(std::make_unique<Buffer>(dest, true, "out['" + n + "']"));
      const Buffer& b = *held.back();
      if (b.bytes() != ti->spec.byte_length) {
        throw py::value_error("out['" + n + "'] holds " + std::to_string(b.bytes()) +
                              " bytes; the tensor has " + std::to_string(ti->spec.byte_length));
      }
      rs.push_back({it->second.second, it->second.second + b.bytes(), static_cast<char*>(b.data())});
      wanted += b.bytes();
      result[py::str(n)] = dest;
    }
    // Most of the shard, or many tensors: one verified stream of the whole payload (a tensor
    // read alone reads every chunk it touches, and small tensors share chunks: restoring 2,000
    // tensors of 4 KiB one by one through a server read their shared chunk 2,000 times). A few
    // tensors of a large shard: each on its own (RestoreTensor, its digest checked).
    const bool stream = want.size() > kRestoreTensorsAlone || 2 * wanted >= payload;
    if (stream) {
      std::sort(rs.begin(), rs.end(), [](const PayloadRegion& a, const PayloadRegion& b) {
        return a.begin < b.begin;
      });
    }
    // Arrays made here are fresh: base pages, faulted in by a helper while the restore reads
    // (docs/performance.md, "Restore into fresh memory"); `out` buffers are only faulted in
    // when they are not yet.
    std::vector<std::pair<void*, size_t>> ranges;
    for (const PayloadRegion& r : rs) ranges.emplace_back(r.dst, r.end - r.begin);
    gc::FreshDestination fresh(ranges, outs.empty());
    if (stream) {
      CallStatus([&] { return StreamIntoRegions(*c, job, st, rank, rs); });
    } else {
      for (size_t i = 0; i < want.size(); ++i) {
        CallStatus([&] {
          return c->RestoreTensor(job, st, rank, want[i], rs[i].dst, rs[i].end - rs[i].begin);
        });
      }
    }
    return result;
  }

  py::object ReadRange(const std::string& job, int64_t step, int32_t rank, uint64_t offset,
                       uint64_t length, py::object out) {
    CheckName("job", job);
    std::shared_ptr<gc::Client> c = Get();
    py::object dest = out.is_none() ? NumpyEmpty({static_cast<int64_t>(length)}, "uint8") : out;
    Buffer b(dest, true, "out");
    if (b.bytes() != length) {
      throw py::value_error("out holds " + std::to_string(b.bytes()) + " bytes, not length " +
                            std::to_string(length));
    }
    CallStatus([&] { return c->ReadShardRange(job, step, rank, offset, length, b.data()); });
    return dest;
  }

  // Fills each (offset, out) of `regions` with payload bytes [offset, offset + len(out)) of a
  // committed shard; regions may overlap and come in any order. whole_shard: one restore stream
  // of the whole payload (RestoreShard, verified: chunk checksums and every tensor's digest),
  // each piece copied into the regions it overlaps, the bytes no region wants dropped. Else one
  // ranged read (ReadShardRange) of the span from the lowest offset to the highest end: straight
  // into the out of a region that is the whole span, else into a scratch buffer copied out.
  void ReadRanges(const std::string& job, int64_t step, int32_t rank, py::list regions,
                  bool whole_shard) {
    CheckName("job", job);
    std::vector<std::unique_ptr<Buffer>> held;
    std::vector<PayloadRegion> rs;
    for (size_t i = 0; i < regions.size(); ++i) {
      py::object r = regions[i];
      if (!py::isinstance<py::tuple>(r) || py::len(r) != 2) {
        throw py::type_error("regions must be a list of (offset, out) tuples");
      }
      py::tuple t = r;
      if (!py::isinstance<py::int_>(t[0]) || py::isinstance<py::bool_>(t[0])) {
        throw py::type_error("regions[" + std::to_string(i) + "]: offset must be an int");
      }
      int64_t off = py::cast<int64_t>(t[0]);
      if (off < 0) throw py::value_error("regions[" + std::to_string(i) + "]: offset < 0");
      held.push_back(std::make_unique<Buffer>(t[1], true, "regions[" + std::to_string(i) + "]"));
      const Buffer& b = *held.back();
      if (b.bytes() == 0) continue;
      rs.push_back({static_cast<uint64_t>(off), static_cast<uint64_t>(off) + b.bytes(),
                    static_cast<char*>(b.data())});
    }
    if (rs.empty()) return;
    std::sort(rs.begin(), rs.end(), [](const PayloadRegion& a, const PayloadRegion& b) {
      return a.begin < b.begin;
    });
    uint64_t lo = rs.front().begin, hi = 0;
    for (const PayloadRegion& r : rs) hi = std::max(hi, r.end);
    std::shared_ptr<gc::Client> c = Get();
    if (whole_shard) {
      CallStatus([&] { return StreamIntoRegions(*c, job, step, rank, rs); });
      return;
    }
    if (rs.size() == 1) {
      CallStatus([&] { return c->ReadShardRange(job, step, rank, lo, hi - lo, rs[0].dst); });
      return;
    }
    CallStatus([&] {
      std::unique_ptr<char[]> scratch(new char[hi - lo]);
      absl::Status s = c->ReadShardRange(job, step, rank, lo, hi - lo, scratch.get());
      size_t first = 0;
      if (s.ok()) ScatterPiece(rs, &first, scratch.get(), lo, hi - lo);
      return s;
    });
  }

  py::list List(const std::string& job, bool pending) {
    CheckName("job", job);
    std::shared_ptr<gc::Client> c = Get();
    py::list l;
    for (const auto& i : Call([&] { return c->List(job, pending); })) l.append(InfoDict(i));
    return l;
  }

  std::vector<std::string> Jobs() {
    std::shared_ptr<gc::Client> c = Get();
    return Call([&] { return c->ListJobs(); });
  }

  py::dict Show(const std::string& job, py::object step) {
    CheckName("job", job);
    std::shared_ptr<gc::Client> c = Get();
    int64_t st = ResolveStep(*c, job, step);
    gc::Manifest m = Call([&] { return c->Show(job, st); });
    py::dict d = InfoDict(m.info);
    py::list shards;
    for (const auto& sh : m.shards) {
      py::dict s;
      s["rank"] = sh.rank;
      s["committed"] = sh.committed;
      s["raw_bytes"] = sh.raw_bytes;
      s["stored_bytes"] = sh.stored_bytes;
      s["metadata"] = py::bytes(sh.metadata);
      py::list ts;
      for (const auto& t : sh.tensors) ts.append(TensorDict(t));
      s["tensors"] = ts;
      shards.append(s);
    }
    d["shards"] = shards;
    return d;
  }

  int64_t Verify(const std::string& job, py::object step) {
    CheckName("job", job);
    std::shared_ptr<gc::Client> c = Get();
    int64_t st = ResolveStep(*c, job, step);
    CallStatus([&] { return c->Verify(job, st); });
    return st;
  }

  void Delete(const std::string& job, int64_t step) {
    CheckName("job", job);
    std::shared_ptr<gc::Client> c = Get();
    CallStatus([&] { return c->Delete(job, step); });
  }

  void Abort(const std::string& job, int64_t step) {
    CheckName("job", job);
    std::shared_ptr<gc::Client> c = Get();
    CallStatus([&] { return c->AbortCheckpoint(job, step); });
  }

  void Health() {
    std::shared_ptr<gc::Client> c = Get();
    CallStatus([&] { return c->Health(); });
  }

 private:
  std::shared_ptr<gc::Client> Get() {
    std::lock_guard<std::mutex> l(mu_);
    if (client_ == nullptr) throw py::value_error("gradsnap: the client is closed");
    return client_;
  }

  std::mutex mu_;
  std::shared_ptr<gc::Client> client_;  // null once closed
};

}  // namespace

PYBIND11_MODULE(_gradsnap, m) {
  m.doc() = "Binding of the gradsnap client library; use the package gradsnap instead.";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      py::object cls = ErrorClass(e.status.code());
      py::object exc = cls(std::string(e.status.message()),
                           absl::StatusCodeToString(e.status.code()));
      PyErr_SetObject(cls.ptr(), exc.ptr());
    }
  });

  m.def(
      "open",
      [](std::vector<std::string> endpoints, std::string local_dir, bool read_only,
         std::string token, std::string tls_ca, std::string tls_cert, std::string tls_key,
         int replicas, int timeout_ms, int max_attempts, int read_streams, std::string etcd,
         int min_replicas, std::string etcd_ca, std::string etcd_cert, std::string etcd_key,
         std::string etcd_user, std::string etcd_password) {
        gc::ClientOptions o;
        o.etcd_tls.ca_file = std::move(etcd_ca);
        o.etcd_tls.cert_file = std::move(etcd_cert);
        o.etcd_tls.key_file = std::move(etcd_key);
        o.etcd_user = std::move(etcd_user);
        o.etcd_password = std::move(etcd_password);
        // Cluster mode (etcd set): `replicas` is ClientOptions::cluster_replicas.
        o.etcd = std::move(etcd);
        if (!o.etcd.empty()) o.cluster_replicas = replicas;
        o.min_replicas = min_replicas;
        o.endpoints = std::move(endpoints);
        o.local_dir = std::move(local_dir);
        o.read_only = read_only;
        o.token = std::move(token);
        o.tls.ca_file = std::move(tls_ca);
        o.tls.cert_file = std::move(tls_cert);
        o.tls.key_file = std::move(tls_key);
        if (o.etcd.empty()) o.replicas = replicas;
        o.rpc_timeout_ms = timeout_ms;
        o.max_attempts = max_attempts;
        o.read_streams = read_streams;
        return PyClient::Open(o);
      },
      py::arg("endpoints"), py::arg("local_dir"), py::arg("read_only"), py::arg("token"),
      py::arg("tls_ca"), py::arg("tls_cert"), py::arg("tls_key"), py::arg("replicas"),
      py::arg("timeout_ms"), py::arg("max_attempts"), py::arg("read_streams"), py::arg("etcd"),
      py::arg("min_replicas"), py::arg("etcd_ca") = "", py::arg("etcd_cert") = "",
      py::arg("etcd_key") = "", py::arg("etcd_user") = "", py::arg("etcd_password") = "");

  py::class_<PyClient>(m, "Client")
      .def("close", &PyClient::Close)
      .def_property_readonly("closed", &PyClient::closed)
      .def("save", &PyClient::Save, py::arg("job"), py::arg("step"), py::arg("tensors"),
           py::arg("rank"), py::arg("world_size"), py::arg("dtypes"), py::arg("metadata"),
           py::arg("checkpoint_metadata"))
      .def("restore", &PyClient::Restore, py::arg("job"), py::arg("step"), py::arg("rank"),
           py::arg("out"), py::arg("names"))
      .def("read_range", &PyClient::ReadRange, py::arg("job"), py::arg("step"), py::arg("rank"),
           py::arg("offset"), py::arg("length"), py::arg("out"))
      .def("read_ranges", &PyClient::ReadRanges, py::arg("job"), py::arg("step"),
           py::arg("rank"), py::arg("regions"), py::arg("whole_shard"))
      .def("list", &PyClient::List, py::arg("job"), py::arg("pending"))
      .def("jobs", &PyClient::Jobs)
      .def("show", &PyClient::Show, py::arg("job"), py::arg("step"))
      .def("verify", &PyClient::Verify, py::arg("job"), py::arg("step"))
      .def("delete", &PyClient::Delete, py::arg("job"), py::arg("step"))
      .def("abort", &PyClient::Abort, py::arg("job"), py::arg("step"))
      .def("health", &PyClient::Health);
}
