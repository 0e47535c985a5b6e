// Per-tensor digests (docs/format.md, "Digests"): XXH3-128 by default, SHA-256 selectable, the
// algorithm recorded per shard and used to verify it; stores written before the algorithm was
// recorded (ShardRecord version 1, SHA-256) keep verifying next to new checkpoints; corrupt data
// or a wrong stored digest is DATA_LOSS with either algorithm.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "common/digest.h"
#include "common/sha256.h"
#include "gtest/gtest.h"
#include "storage/engine.h"
#include "storage/metadata.h"
#include "storage/test_util.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace storage {
namespace {

namespace fs = std::filesystem;

class DigestTest : public ::testing::Test {
 protected:
  void Open(DigestAlgo algo) {
    engine_.reset();
    EngineOptions o;
    o.data_dir = dir_.path();
    o.chunk_bytes = 32 << 10;  // several chunks per tensor
    o.digest = algo;
    auto e = Engine::Open(o);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
  }
  ShardData Write(int64_t step) {
    EXPECT_TRUE(engine_->BeginCheckpoint({"dj", step, CheckpointKind::kFull, -1, 1, ""}).ok());
    ShardData d = MakeShard("dj", step, 0, step, 20000);
    absl::Status s = engine_->WriteShard(d.spec, d.ptrs());
    EXPECT_TRUE(s.ok()) << s;
    return d;
  }
  DigestAlgo AlgoOf(int64_t step) {
    auto m = engine_->GetManifest("dj", step);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? m->shards.at(0).digest_algo : DigestAlgo::kSha256;
  }
  // Rewrites step's shard record as version 1 (the format before digests were selectable):
  // the same bytes minus the trailing algorithm field. Only valid for a SHA-256 shard.
  void DowngradeToVersion1(int64_t step) {
    engine_.reset();
    auto meta = MetaStore::Open(dir_.path() + "/meta");
    ASSERT_TRUE(meta.ok()) << meta.status();
    std::string key = ShardKey("dj", step, 0);
    auto v = (*meta)->Get(key);
    ASSERT_TRUE(v.ok()) << v.status();
    ASSERT_EQ((*v)[0], 2);
    ASSERT_EQ(static_cast<uint8_t>(v->back()), static_cast<uint8_t>(DigestAlgo::kSha256));
    std::string old = v->substr(0, v->size() - 1);
    old[0] = 1;
    ShardRecord r;
    ASSERT_TRUE(DecodeShard(old, &r).ok());
    EXPECT_EQ(r.digest_algo, DigestAlgo::kSha256);
    ASSERT_TRUE((*meta)->Commit({{{key, old}}, {}, {}}).ok());
  }
  // Replaces the stored digest of tensor `index` (0: "w", 1: the empty "empty") of step's
  // shard by `hex`.
  void TamperDigest(int64_t step, const std::string& hex, size_t index = 0) {
    engine_.reset();
    auto meta = MetaStore::Open(dir_.path() + "/meta");
    ASSERT_TRUE(meta.ok()) << meta.status();
    std::string key = ShardKey("dj", step, 0);
    auto v = (*meta)->Get(key);
    ASSERT_TRUE(v.ok());
    ShardRecord r;
    ASSERT_TRUE(DecodeShard(*v, &r).ok());
    r.tensor_digests.at(index) = hex;
    ASSERT_TRUE((*meta)->Commit({{{key, EncodeShard(r)}}, {}, {}}).ok());
  }
  void ExpectTensorLoss(int64_t step, const std::string& what) {
    absl::Status v = engine_->Verify("dj", step);
    EXPECT_EQ(v.code(), absl::StatusCode::kDataLoss) << v;
    auto r = engine_->OpenShardReader("dj", step, 0);
    ASSERT_TRUE(r.ok()) << r.status();
    std::vector<uint8_t> out((*r)->info().tensors[0].spec.byte_length);
    absl::Status s = (*r)->ReadTensor(0, out.data(), out.size());
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find("job dj step " + std::to_string(step) + " rank 0 tensor w"),
              std::string::npos) << s;
    EXPECT_NE(s.message().find(what), std::string::npos) << s;
  }
  std::vector<std::string> Segments(int64_t step) {
    return testing::SegmentFiles(dir_.path(), "dj", step);
  }

  TempDir dir_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(DigestTest, DefaultIsXxh3AndShaIsSelectable) {
  Open(EngineOptions().digest);
  EXPECT_EQ(EngineOptions().digest, DigestAlgo::kXxh3_128);
  ShardData a = Write(1);
  EXPECT_EQ(AlgoOf(1), DigestAlgo::kXxh3_128);
  ExpectRestores(engine_.get(), a);
  auto m = engine_->GetManifest("dj", 1);
  ASSERT_TRUE(m.ok());
  for (const TensorInfo& t : m->shards[0].tensors) {
    EXPECT_EQ(t.digest.size(), 32u) << t.spec.name;
    EXPECT_TRUE(t.spec.sha256.empty()) << t.spec.name;  // none was expected at write time
  }

  Open(DigestAlgo::kSha256);
  ShardData b = Write(2);
  EXPECT_EQ(AlgoOf(2), DigestAlgo::kSha256);
  ExpectRestores(engine_.get(), b);
  m = engine_->GetManifest("dj", 2);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->shards[0].tensors[0].digest,
            Sha256Hex(b.bytes[0].data(), b.bytes[0].size()));
  EXPECT_EQ(m->shards[0].tensors[0].spec.sha256, m->shards[0].tensors[0].digest);
  // Each checkpoint verifies with the algorithm that wrote it, whatever the engine's option.
  EXPECT_TRUE(engine_->Verify("dj", 1).ok());
  EXPECT_TRUE(engine_->Verify("dj", 2).ok());
}

TEST_F(DigestTest, MixedStoreWithVersion1RecordsKeepsVerifying) {
  // An "old" store: a SHA-256 checkpoint whose shard record has no algorithm field.
  Open(DigestAlgo::kSha256);
  ShardData old_data = Write(1);
  DowngradeToVersion1(1);
  // A new engine with the default digest adds XXH3 checkpoints to the same data dir.
  Open(DigestAlgo::kXxh3_128);
  ShardData new_data = Write(2);
  EXPECT_EQ(AlgoOf(1), DigestAlgo::kSha256);
  EXPECT_EQ(AlgoOf(2), DigestAlgo::kXxh3_128);
  ExpectRestores(engine_.get(), old_data);
  ExpectRestores(engine_.get(), new_data);
  EXPECT_TRUE(engine_->Verify("dj", 1).ok());
  EXPECT_TRUE(engine_->Verify("dj", 2).ok());
  // Reopening (recovery over both record versions) changes nothing.
  Open(DigestAlgo::kSha256);
  EXPECT_TRUE(engine_->Verify("dj", 1).ok());
  EXPECT_TRUE(engine_->Verify("dj", 2).ok());
  EXPECT_EQ(AlgoOf(2), DigestAlgo::kXxh3_128);
}

TEST_F(DigestTest, CorruptDataIsDataLossWithEitherAlgorithm) {
  for (DigestAlgo algo : {DigestAlgo::kXxh3_128, DigestAlgo::kSha256}) {
    SCOPED_TRACE(DigestAlgoName(algo));
    Open(algo);
    const int64_t step = algo == DigestAlgo::kSha256 ? 2 : 1;
    Write(step);
    fs::path seg = Segments(step).at(0);
    int fd = ::open(seg.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    // Records start on 4 KiB boundaries: byte 100 of every block hits every record's payload
    // (or padding), whichever order the records were written in.
    for (uint64_t off = 100; off < fs::file_size(seg); off += 4096) {
      uint8_t b = 0;
      ASSERT_EQ(::pread(fd, &b, 1, static_cast<off_t>(off)), 1);
      b ^= 0x01;
      ASSERT_EQ(::pwrite(fd, &b, 1, static_cast<off_t>(off)), 1);
    }
    ::close(fd);
    ExpectTensorLoss(step, "");
  }
}

TEST_F(DigestTest, WrongStoredDigestIsDataLossWithEitherAlgorithm) {
  Open(DigestAlgo::kXxh3_128);
  Write(1);
  Open(DigestAlgo::kSha256);
  Write(2);
  TamperDigest(1, std::string(32, 'a'));
  TamperDigest(2, std::string(64, 'a'));
  Open(DigestAlgo::kXxh3_128);
  ExpectTensorLoss(1, "xxh3-128 digest mismatch");
  ExpectTensorLoss(2, "sha256 digest mismatch");
  // The stream reader checks it too, when it passes the tensor's end.
  auto r = engine_->OpenShardReader("dj", 1, 0);
  ASSERT_TRUE(r.ok());
  std::vector<uint8_t> buf(1 << 20);
  auto n = (*r)->Read(0, buf.data(), buf.size());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kDataLoss) << n.status();
}

// An empty tensor has no byte to hash: its recorded digest must still be the empty input's, or
// Verify and a stream that passes it report DATA_LOSS (ReadTensor always checked it).
TEST_F(DigestTest, WrongDigestOfAnEmptyTensorIsDataLoss) {
  Open(DigestAlgo::kXxh3_128);
  Write(1);
  TamperDigest(1, std::string(32, 'b'), /*index=*/1);
  Open(DigestAlgo::kXxh3_128);
  absl::Status v = engine_->Verify("dj", 1);
  EXPECT_EQ(v.code(), absl::StatusCode::kDataLoss) << v;
  EXPECT_NE(v.message().find("tensor empty"), std::string::npos) << v;
  auto r = engine_->OpenShardReader("dj", 1, 0);
  ASSERT_TRUE(r.ok());
  std::vector<uint8_t> w(80000);
  EXPECT_TRUE((*r)->Read(0, w.data(), w.size()).ok());  // w alone, before "empty": fine
  std::vector<uint8_t> buf(1000);
  EXPECT_EQ((*r)->Read(80000, buf.data(), buf.size()).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST_F(DigestTest, StreamReadInSmallPiecesChecksTheDigestAtTheTensorEnd) {
  Open(DigestAlgo::kXxh3_128);
  ShardData d = Write(1);
  std::vector<uint8_t> stream = d.stream();
  TamperDigest(1, std::string(32, 'a'));  // tensor w: bytes [0, 80000)
  Open(DigestAlgo::kXxh3_128);
  auto r = engine_->OpenShardReader("dj", 1, 0);
  ASSERT_TRUE(r.ok());
  std::vector<uint8_t> buf(7000);
  uint64_t pos = 0;
  absl::Status failed;
  while (pos < stream.size()) {
    auto n = (*r)->Read(pos, buf.data(), buf.size());
    if (!n.ok()) {
      failed = n.status();
      break;
    }
    ASSERT_GT(*n, 0u);
    ASSERT_EQ(std::memcmp(buf.data(), stream.data() + pos, *n), 0) << pos;
    pos += *n;
  }
  EXPECT_EQ(failed.code(), absl::StatusCode::kDataLoss) << failed;
  EXPECT_EQ(pos, 77000u);  // the read that reaches the end of w fails
  // Read again on the same reader, from inside w: it knows w is bad (it would not hash w again
  // from there), so w's bytes are not handed out now either.
  auto again = (*r)->Read(pos, buf.data(), buf.size());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kDataLoss) << again.status();
  // A stream that starts inside w checks CRCs only, and reads the rest of the shard.
  auto r2 = engine_->OpenShardReader("dj", 1, 0);
  ASSERT_TRUE(r2.ok());
  std::vector<uint8_t> rest(stream.size() - 100);
  auto n = (*r2)->Read(100, rest.data(), rest.size());
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, rest.size());
  EXPECT_EQ(std::memcmp(rest.data(), stream.data() + 100, rest.size()), 0);
}

// Streams the shard with ReadShared (the server's path: the reader checks a raw chunk's CRC and
// its tensors' digests in one pass when it takes the chunk) in pieces of `piece` bytes from
// `from`; returns the first error. Every byte handed out must be the one written.
absl::Status StreamShared(ShardReader* r, const std::vector<uint8_t>& stream, uint64_t from,
                          size_t piece, uint64_t* pos) {
  *pos = from;
  while (*pos < stream.size()) {
    const uint8_t* p = nullptr;
    std::shared_ptr<const void> hold;
    auto n = r->ReadShared(*pos, piece, &p, &hold);
    if (!n.ok()) return n.status();
    if (*n == 0) return absl::OutOfRangeError("short");
    EXPECT_EQ(std::memcmp(p, stream.data() + *pos, *n), 0) << *pos;
    *pos += *n;
  }
  return absl::OkStatus();
}

TEST_F(DigestTest, SharedReadsCheckCrcAndDigestBeforeHandingOutAChunk) {
  Open(DigestAlgo::kXxh3_128);
  ShardData d = Write(1);
  const std::vector<uint8_t> stream = d.stream();
  uint64_t pos = 0;
  {  // Intact: the whole shard, in pieces that do not line up with the 32 KiB chunks.
    auto r = engine_->OpenShardReader("dj", 1, 0);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(StreamShared(r->get(), stream, 0, 7000, &pos).ok());
  }
  TamperDigest(1, std::string(32, 'a'));  // tensor w: bytes [0, 80000)
  Open(DigestAlgo::kXxh3_128);
  {
    auto r = engine_->OpenShardReader("dj", 1, 0);
    ASSERT_TRUE(r.ok());
    absl::Status s = StreamShared(r->get(), stream, 0, 7000, &pos);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find("tensor w"), std::string::npos) << s;
    EXPECT_NE(s.message().find("xxh3-128 digest mismatch"), std::string::npos) << s;
    // Nothing of the chunk holding w's end (bytes [65536, 98304)) was handed out.
    EXPECT_LE(pos, 65536u);
  }
  {  // A stream that starts inside w checks CRCs only, and reads the rest of the shard.
    auto r = engine_->OpenShardReader("dj", 1, 0);
    ASSERT_TRUE(r.ok());
    absl::Status s = StreamShared(r->get(), stream, 100, 7000, &pos);
    EXPECT_TRUE(s.ok()) << s;
  }
  // A flipped payload byte in the middle of the segment: DATA_LOSS from the chunk's CRC, and
  // every byte handed out before it is right.
  // (Records start on 4 KiB boundaries; a block whose byte 100 is padding is skipped.)
  ShardData d2 = Write(2);
  const std::vector<uint8_t> stream2 = d2.stream();
  fs::path seg = Segments(2).at(0);
  bool flipped = false;
  for (uint64_t off = fs::file_size(seg) / 2 / 4096 * 4096 + 100; !flipped; off += 4096) {
    ASSERT_LT(off, fs::file_size(seg));
    ASSERT_TRUE(testing::FlipByte(seg.string(), off, 0x01).ok());
    flipped = !engine_->Verify("dj", 2).ok();
    if (!flipped) {
      ASSERT_TRUE(testing::FlipByte(seg.string(), off, 0x01).ok());
    }
  }
  auto r = engine_->OpenShardReader("dj", 2, 0);
  ASSERT_TRUE(r.ok());
  absl::Status s = StreamShared(r->get(), stream2, 0, 7000, &pos);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("CRC mismatch"), std::string::npos) << s;
  EXPECT_LT(pos, stream2.size());
}

TEST_F(DigestTest, ExpectedSha256IsCheckedUnderXxh3) {
  Open(DigestAlgo::kXxh3_128);
  ASSERT_TRUE(engine_->BeginCheckpoint({"dj", 1, CheckpointKind::kFull, -1, 1, ""}).ok());
  ShardData d = MakeShard("dj", 1, 0, 1, 20000);
  d.spec.tensors[0].sha256 = Sha256Hex(d.bytes[0].data(), d.bytes[0].size());
  ASSERT_TRUE(engine_->WriteShard(d.spec, d.ptrs()).ok());
  auto m = engine_->GetManifest("dj", 1);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->shards[0].digest_algo, DigestAlgo::kXxh3_128);
  EXPECT_EQ(m->shards[0].tensors[0].spec.sha256, d.spec.tensors[0].sha256);
  EXPECT_EQ(m->shards[0].tensors[0].digest,
            DigestHex(DigestAlgo::kXxh3_128, d.bytes[0].data(), d.bytes[0].size()));

  ASSERT_TRUE(engine_->BeginCheckpoint({"dj", 2, CheckpointKind::kFull, -1, 1, ""}).ok());
  ShardData bad = MakeShard("dj", 2, 0, 2, 20000);
  bad.spec.tensors[2].sha256 = std::string(64, '0');
  absl::Status s = engine_->WriteShard(bad.spec, bad.ptrs());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("SHA-256 mismatch"), std::string::npos) << s;
}

TEST_F(DigestTest, ResumedShardKeepsItsAlgorithm) {
  Open(DigestAlgo::kXxh3_128);
  ASSERT_TRUE(engine_->BeginCheckpoint({"dj", 1, CheckpointKind::kFull, -1, 1, ""}).ok());
  ShardData d = MakeShard("dj", 1, 0, 1, 20000);
  d.spec.tensors[0].sha256 = Sha256Hex(d.bytes[0].data(), d.bytes[0].size());
  std::vector<uint8_t> stream = d.stream();
  {
    auto w = engine_->OpenShardWriter(d.spec);
    ASSERT_TRUE(w.ok()) << w.status();
    // Half of tensor w (several chunks), durable; the writer is then dropped.
    ASSERT_TRUE((*w)->Append(stream.data(), 40000).ok());
    ASSERT_TRUE((*w)->Flush().ok());
  }
  Open(DigestAlgo::kSha256);  // a restarted server with another option
  auto w = engine_->OpenShardWriter(d.spec);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ((*w)->committed_size(), 40000u);
  ASSERT_TRUE((*w)->Append(stream.data() + 40000, stream.size() - 40000).ok());
  ASSERT_TRUE((*w)->Finish().ok());  // the expected SHA-256 of w spans both sessions
  w->reset();
  EXPECT_EQ(AlgoOf(1), DigestAlgo::kXxh3_128);
  ExpectRestores(engine_.get(), d);
}

TEST_F(DigestTest, BadOptionAndBadRecord) {
  EngineOptions o;
  o.data_dir = dir_.path();
  o.digest = static_cast<DigestAlgo>(9);
  EXPECT_EQ(Engine::Open(o).status().code(), absl::StatusCode::kInvalidArgument);
  ShardRecord r;
  r.spec.job = "dj";
  r.digest_algo = DigestAlgo::kXxh3_128;
  std::string v = EncodeShard(r);
  ShardRecord back;
  ASSERT_TRUE(DecodeShard(v, &back).ok());
  EXPECT_EQ(back.digest_algo, DigestAlgo::kXxh3_128);
  EXPECT_EQ(v[0], 2);  // version 2: no epoch, readable by the versions before epochs
  v.back() = 9;  // unknown algorithm
  EXPECT_EQ(DecodeShard(v, &back).code(), absl::StatusCode::kDataLoss);
  v[0] = 4;      // unknown version
  EXPECT_EQ(DecodeShard(v, &back).code(), absl::StatusCode::kDataLoss);
  // Version 3 appends the writer epoch of the durable prefix.
  r.epoch = 7;
  v = EncodeShard(r);
  EXPECT_EQ(v[0], 3);
  ASSERT_TRUE(DecodeShard(v, &back).ok());
  EXPECT_EQ(back.epoch, 7u);
  EXPECT_EQ(back.digest_algo, DigestAlgo::kXxh3_128);
  v.pop_back();  // a cut epoch
  EXPECT_EQ(DecodeShard(v, &back).code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace storage
}  // namespace gradsnap
