#include "trainer/wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace gradsnap {
namespace trainer {
namespace {

class Writer {
 public:
  void U64(uint64_t v) { out_.append(reinterpret_cast<const char*>(&v), sizeof(v)); }
  void Str(const std::string& s) {
    U64(s.size());
    out_.append(s);
  }
  void Bytes(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  bool U64(uint64_t* v) {
    if (in_.size() - pos_ < sizeof(*v)) return false;
    std::memcpy(v, in_.data() + pos_, sizeof(*v));
    pos_ += sizeof(*v);
    return true;
  }
  bool I64(int64_t* v) { return U64(reinterpret_cast<uint64_t*>(v)); }
  bool Str(std::string* s) {
    uint64_t n;
    if (!U64(&n) || in_.size() - pos_ < n) return false;
    s->assign(in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  // Points at the next n bytes.
  const char* Bytes(size_t n) {
    if (in_.size() - pos_ < n) return nullptr;
    const char* p = in_.data() + pos_;
    pos_ += n;
    return p;
  }

 private:
  const std::string& in_;
  size_t pos_ = 0;
};

absl::Status Malformed(const char* what) {
  return absl::DataLossError(absl::StrCat("malformed funnel message: ", what));
}

void PutSpec(Writer& w, const client::TensorSpec& t) {
  w.Str(t.name);
  w.U64(static_cast<uint64_t>(t.dtype));
  w.U64(t.shape.size());
  for (int64_t d : t.shape) w.U64(static_cast<uint64_t>(d));
  w.U64(t.byte_length);
  w.Str(t.flat_name);
  w.U64(t.flat_offset);
  w.U64(t.flat_total);
  w.Str(t.sha256);
}

bool GetSpec(Reader& r, client::TensorSpec* t) {
  uint64_t dtype, ndim;
  if (!r.Str(&t->name) || !r.U64(&dtype) || !r.U64(&ndim) || ndim > 16) return false;
  t->dtype = static_cast<DType>(dtype);
  t->shape.resize(ndim);
  for (int64_t& d : t->shape) {
    if (!r.I64(&d)) return false;
  }
  return r.U64(&t->byte_length) && r.Str(&t->flat_name) && r.U64(&t->flat_offset) &&
         r.U64(&t->flat_total) && r.Str(&t->sha256);
}

}  // namespace

absl::Status SendMessage(Comm& comm, int dst, uint32_t tag, const std::string& msg) {
  uint64_t n = msg.size();
  RETURN_IF_ERROR(comm.Send(dst, 2 * tag, &n, sizeof(n)));
  if (n == 0) return absl::OkStatus();
  return comm.Send(dst, 2 * tag + 1, msg.data(), n);
}

absl::StatusOr<std::string> RecvMessage(Comm& comm, int src, uint32_t tag) {
  uint64_t n = 0;
  RETURN_IF_ERROR(comm.Recv(src, 2 * tag, &n, sizeof(n)));
  std::string msg(n, '\0');
  if (n > 0) RETURN_IF_ERROR(comm.Recv(src, 2 * tag + 1, msg.data(), n));
  return msg;
}

std::string EncodeStatus(const absl::Status& s) {
  Writer w;
  w.U64(static_cast<uint64_t>(s.code()));
  w.Str(std::string(s.message()));
  return w.Take();
}

absl::Status DecodeStatus(const std::string& msg) {
  Reader r(msg);
  uint64_t code;
  std::string text;
  if (!r.U64(&code) || !r.Str(&text)) return Malformed("status");
  return absl::Status(static_cast<absl::StatusCode>(code), text);
}

std::string EncodeShard(const client::ShardSpec& spec,
                        const std::vector<client::TensorRef>& tensors) {
  Writer w;
  w.Str(spec.job);
  w.U64(static_cast<uint64_t>(spec.step));
  w.U64(static_cast<uint64_t>(spec.rank));
  w.Str(spec.metadata);
  w.U64(tensors.size());
  for (const client::TensorRef& t : tensors) PutSpec(w, t.spec);
  for (const client::TensorRef& t : tensors) w.Bytes(t.data, t.spec.byte_length);
  return w.Take();
}

absl::Status DecodeShard(const std::string& msg, client::ShardSpec* spec,
                         std::vector<client::TensorRef>* tensors) {
  Reader r(msg);
  uint64_t rank, n;
  if (!r.Str(&spec->job) || !r.I64(&spec->step) || !r.U64(&rank) || !r.Str(&spec->metadata) ||
      !r.U64(&n) || n > 100000) {
    return Malformed("shard header");
  }
  spec->rank = static_cast<int32_t>(rank);
  spec->tensors.resize(n);
  for (client::TensorSpec& t : spec->tensors) {
    if (!GetSpec(r, &t)) return Malformed("tensor spec");
  }
  tensors->clear();
  for (const client::TensorSpec& t : spec->tensors) {
    const char* p = r.Bytes(t.byte_length);
    if (p == nullptr) return Malformed("tensor bytes");
    tensors->push_back(client::TensorRef{t, p});
  }
  return absl::OkStatus();
}

std::string EncodeInfos(const absl::StatusOr<std::vector<client::CheckpointInfo>>& infos) {
  Writer w;
  w.Str(EncodeStatus(infos.status()));
  if (!infos.ok()) return w.Take();
  w.U64(infos->size());
  for (const client::CheckpointInfo& i : *infos) {
    w.Str(i.job);
    w.U64(static_cast<uint64_t>(i.step));
    w.U64(static_cast<uint64_t>(i.kind));
    w.U64(static_cast<uint64_t>(i.base_step));
    w.U64(static_cast<uint64_t>(i.world_size));
    w.U64(static_cast<uint64_t>(i.state));
    w.Str(i.metadata);
  }
  return w.Take();
}

absl::StatusOr<std::vector<client::CheckpointInfo>> DecodeInfos(const std::string& msg) {
  Reader r(msg);
  std::string status;
  if (!r.Str(&status)) return Malformed("list status");
  RETURN_IF_ERROR(DecodeStatus(status));
  uint64_t n;
  if (!r.U64(&n)) return Malformed("list size");
  std::vector<client::CheckpointInfo> out(n);
  for (client::CheckpointInfo& i : out) {
    uint64_t kind, world, state;
    if (!r.Str(&i.job) || !r.I64(&i.step) || !r.U64(&kind) || !r.I64(&i.base_step) ||
        !r.U64(&world) || !r.U64(&state) || !r.Str(&i.metadata)) {
      return Malformed("checkpoint info");
    }
    i.kind = static_cast<client::CheckpointKind>(kind);
    i.world_size = static_cast<int32_t>(world);
    i.state = static_cast<client::CheckpointState>(state);
  }
  return out;
}

}  // namespace trainer
}  // namespace gradsnap
