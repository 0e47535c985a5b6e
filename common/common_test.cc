#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <thread>
#include <string>
#include <vector>

#include "common/crc32c.h"
#include "common/digest.h"
#include "common/dtype.h"
#include "common/flag_names.h"
#include "common/json.h"
#include "common/names.h"
#include "common/populate.h"
#include "common/sha256.h"
#include "common/stats.h"
#include "common/status.h"
#include "gtest/gtest.h"

namespace gradsnap {
namespace {

// Waits (at most max_ms) until `p` has populated `want` bytes.
size_t WaitPopulated(const PopulateAhead& p, size_t want, int max_ms = 5000) {
  for (int i = 0; i < max_ms && p.populated() < want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return p.populated();
}

// PopulateAhead faults in every whole page inside the destination and nothing else, leaves
// the bytes as they were, skips small and already faulted-in destinations and stops quietly on
// memory it may not populate.
TEST(PopulateAheadTest, FaultsInWholePagesInsideOnlyAndKeepsTheBytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t pages = (PopulateAhead::kMinBytes + 3 * PopulateAhead::kStep) / page + 2;
  // Guard pages on both sides: populating one of them would fail, not write it.
  char* map = static_cast<char*>(::mmap(nullptr, (pages + 2) * page, PROT_READ | PROT_WRITE,
                                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(map, MAP_FAILED);
  ASSERT_EQ(::mprotect(map, page, PROT_NONE), 0);
  ASSERT_EQ(::mprotect(map + (pages + 1) * page, page, PROT_NONE), 0);
  char* area = map + page;
  // The destination starts 100 bytes into the first page and ends 100 bytes into the last.
  char* dst = area + 100;
  const size_t n = (pages - 1) * page;
  std::memset(area + (pages / 2) * page, 0x5a, page);  // one page touched and written before
  std::vector<unsigned char> resident(pages + 2);
  {
    PopulateAhead p(dst, n);
    const size_t inside = (pages - 2) * page;  // the whole pages within [dst, dst + n)
    EXPECT_EQ(WaitPopulated(p, inside), inside);
    ASSERT_EQ(::mincore(map, (pages + 2) * page, resident.data()), 0);
  }
  EXPECT_FALSE(resident[1] & 1) << "the partial first page was populated";
  for (size_t i = 2; i < pages; ++i) ASSERT_TRUE(resident[i] & 1) << "page " << i;
  EXPECT_FALSE(resident[pages] & 1) << "the partial last page was populated";
  for (size_t i = 0; i < page; ++i) {
    ASSERT_EQ(area[(pages / 2) * page + i], 0x5a);  // contents kept
    ASSERT_EQ(area[page + i], 0);                   // fresh pages stay zero
  }
  {  // Faulted in already (the pages above): no helper.
    PopulateAhead again(dst, n);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(again.populated(), 0u);
  }
  {
    PopulateAhead small(dst, PopulateAhead::kMinBytes - 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(small.populated(), 0u);
  }
  ::munmap(map, (pages + 2) * page);
  // Read-only memory never touched (so not resident: a helper starts) is not populated for
  // writing: the kernel refuses, the helper stops at once, nothing faults and nothing hangs.
  char* ro_map = static_cast<char*>(
      ::mmap(nullptr, pages * page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(ro_map, MAP_FAILED);
  {
    PopulateAhead ro(ro_map, pages * page);
    EXPECT_EQ(WaitPopulated(ro, 1, 100), 0u);
  }
  ASSERT_EQ(::mincore(ro_map, pages * page, resident.data()), 0);
  for (size_t i = 0; i < pages; ++i) EXPECT_FALSE(resident[i] & 1) << "page " << i;
  ::munmap(ro_map, pages * page);
}

// The VmFlags line of /proc/self/smaps for the mapping that holds `p`.
std::string VmFlagsOf(const void* p) {
  FILE* f = std::fopen("/proc/self/smaps", "r");
  if (f == nullptr) return "";
  char line[4096];
  bool in = false;
  std::string out;
  const auto at = reinterpret_cast<uintptr_t>(p);
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {
      in = at >= lo && at < hi;
    } else if (in && std::strncmp(line, "VmFlags:", 8) == 0) {
      out = line;
      break;
    }
  }
  std::fclose(f);
  return out;
}

// Several ranges: each one's whole pages are populated, one helper walks them in order, and a
// range already faulted in is skipped (counted as nothing populated).
TEST(PopulateAheadTest, WalksSeveralRangesAndSkipsResidentOnes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t each = PopulateAhead::kMinBytes / 2 + 3 * page;  // together over kMinBytes
  char* map = static_cast<char*>(::mmap(nullptr, 3 * each, PROT_READ | PROT_WRITE,
                                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(map, MAP_FAILED);
  std::memset(map + each, 1, each);  // the middle range is faulted in already
  std::vector<unsigned char> resident(3 * each / page);
  {
    PopulateAhead p({{map, each}, {map + each, each}, {map + 2 * each, each}});
    EXPECT_EQ(WaitPopulated(p, 2 * each), 2 * each);  // the first and the last
    ASSERT_EQ(::mincore(map, 3 * each, resident.data()), 0);
  }
  for (size_t i = 0; i < resident.size(); ++i) ASSERT_TRUE(resident[i] & 1) << "page " << i;
  EXPECT_EQ(map[0], 0);
  EXPECT_EQ(map[each], 1);
  ::munmap(map, 3 * each);
}

// AdviseBasePages marks the destination's mapping no-huge-pages ("nh"), over NumPy's advice of
// huge pages ("hg"), and leaves destinations under 4 MiB alone.
TEST(PopulateAheadTest, AdviseBasePagesTurnsHugePagesOff) {
  const size_t n = 8u << 20;
  char* map = static_cast<char*>(
      ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(map, MAP_FAILED);
  if (::madvise(map, n, MADV_HUGEPAGE) != 0) GTEST_SKIP() << "no transparent huge pages here";
  ASSERT_NE(VmFlagsOf(map).find(" hg"), std::string::npos) << VmFlagsOf(map);
  AdviseBasePages(map, (4u << 20) - 1);
  EXPECT_NE(VmFlagsOf(map).find(" hg"), std::string::npos) << "a small destination was advised";
  AdviseBasePages(map, n);
  const std::string flags = VmFlagsOf(map);
  EXPECT_NE(flags.find(" nh"), std::string::npos) << flags;
  EXPECT_EQ(flags.find(" hg"), std::string::npos) << flags;
  ::munmap(map, n);
}

TEST(Crc32c, KnownVectors) {
  // RFC 3720 B.4 test vectors.
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF), inc(32);
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(Crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(inc.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
}

TEST(Crc32c, ExtendEqualsWhole) {
  std::string s(1000, 'x');
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(i * 131 + 7);
  for (size_t cut : {0, 1, 7, 8, 9, 500, 999, 1000}) {
    uint32_t a = Crc32cExtend(Crc32c(s.data(), cut), s.data() + cut, s.size() - cut);
    EXPECT_EQ(a, Crc32c(s.data(), s.size())) << cut;
  }
}

TEST(Crc32c, InterleavedMatchesPortableAtEveryBoundary) {
  // Lengths around the 3-stream block sizes (3 x 256, 3 x 8192 and 3 x 32768 bytes, alone and
  // one after another) and odd alignments.
  std::string s(300000, '\0');
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>((i * 2654435761u) >> 11);
  for (size_t n : {size_t{0}, size_t{7}, size_t{767}, size_t{768}, size_t{769}, size_t{1000},
                   size_t{24575}, size_t{24576}, size_t{24577}, size_t{50000}, size_t{98303},
                   size_t{98304}, size_t{98305}, size_t{98304 + 24576 + 768 + 9},
                   size_t{2 * 98304 + 24575}, size_t{299990}}) {
    for (size_t off : {size_t{0}, size_t{1}, size_t{5}}) {
      EXPECT_EQ(Crc32cExtend(0xdeadbeef, s.data() + off, n),
                Crc32cExtendPortable(0xdeadbeef, s.data() + off, n))
          << n << " at " << off;
    }
  }
}

TEST(Sha256, KnownVector) {
  EXPECT_EQ(Sha256Hex("abc", 3),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Sha256 h;
  h.Update("a", 1);
  h.Update("bc", 2);
  EXPECT_EQ(DigestToHex(h.Finish()), Sha256Hex("abc", 3));
}

TEST(Digest, KnownVectorsAndStreaming) {
  // The xxHash project's reference value for the empty input (XXH3_128bits, seed 0).
  EXPECT_EQ(DigestHex(DigestAlgo::kXxh3_128, "", 0), "99aa06d3014798d86001c324468d497f");
  EXPECT_EQ(DigestHex(DigestAlgo::kSha256, "abc", 3), Sha256Hex("abc", 3));
  std::string data(1 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 2654435761u) >> 13);
  for (DigestAlgo algo : {DigestAlgo::kXxh3_128, DigestAlgo::kSha256}) {
    std::string whole = DigestHex(algo, data.data(), data.size());
    EXPECT_EQ(whole.size(), DigestHexLength(algo));
    EXPECT_TRUE(IsDigestHex(algo, whole));
    Digester d(algo);
    for (size_t cut : {size_t{0}, size_t{1}, size_t{63}, size_t{4096}, size_t{700000}}) {
      d.Update(data.data(), cut);
      d.Update(data.data() + cut, data.size() - cut);
      EXPECT_EQ(d.FinishHex(), whole) << DigestAlgoName(algo) << " cut " << cut;
    }
    data[12345] ^= 1;
    EXPECT_NE(DigestHex(algo, data.data(), data.size()), whole);
    data[12345] ^= 1;
  }
  DigestAlgo a;
  EXPECT_TRUE(ParseDigestAlgo("xxh3", &a) && a == DigestAlgo::kXxh3_128);
  EXPECT_TRUE(ParseDigestAlgo("xxh3-128", &a) && a == DigestAlgo::kXxh3_128);
  EXPECT_TRUE(ParseDigestAlgo("sha256", &a) && a == DigestAlgo::kSha256);
  EXPECT_FALSE(ParseDigestAlgo("md5", &a));
  EXPECT_FALSE(IsKnownDigestAlgo(0));
  EXPECT_FALSE(IsKnownDigestAlgo(3));
  EXPECT_FALSE(IsDigestHex(DigestAlgo::kXxh3_128, std::string(32, 'A')));
  EXPECT_FALSE(IsDigestHex(DigestAlgo::kSha256, std::string(32, 'a')));
}

TEST(Names, ValidAndInvalid) {
  EXPECT_TRUE(ValidateName("job-1.v2_x", "job name").ok());
  EXPECT_TRUE(ValidateName(std::string(128, 'a'), "job name").ok());
  for (std::string bad : {std::string(""), std::string(129, 'a'), std::string("a/b"),
                          std::string(".."), std::string("."), std::string("a b"),
                          std::string("x\0y", 3), std::string("\xff")}) {
    absl::Status s = ValidateName(bad, "job name");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(Status, PosixErrorCodes) {
  EXPECT_EQ(PosixError("x", ENOSPC).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(PosixError("x", ENOENT).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(PosixError("x", EIO).code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(PosixError("open /a", ENOENT).message().find("open /a"), std::string::npos);
}

absl::StatusOr<int> Half(int x) {
  if (x % 2) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::Status UseMacros(int x, int* out) {
  ASSIGN_OR_RETURN(int h, Half(x));
  RETURN_IF_ERROR(h > 100 ? absl::OutOfRangeError("big") : absl::OkStatus());
  *out = h;
  return absl::OkStatus();
}

TEST(Status, Macros) {
  int out = 0;
  EXPECT_TRUE(UseMacros(4, &out).ok());
  EXPECT_EQ(out, 2);
  EXPECT_EQ(UseMacros(3, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(UseMacros(400, &out).code(), absl::StatusCode::kOutOfRange);
}

TEST(DType, Sizes) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_FALSE(DTypeFromInt(0).has_value());
  EXPECT_FALSE(DTypeFromInt(99).has_value());
  EXPECT_EQ(*DTypeFromName("bf16"), DType::kBF16);
}

TEST(Stats, PrometheusText) {
  Registry r;
  r.GetCounter("t_bytes_total{dir=\"in\"}", "bytes")->Add(5);
  r.GetHistogram("t_lat_seconds", "latency")->Observe(0.001);
  std::string text = r.RenderPrometheus();
  EXPECT_NE(text.find("t_bytes_total{dir=\"in\"} 5"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE t_lat_seconds histogram"), std::string::npos);
  EXPECT_NE(text.find("t_lat_seconds_count 1"), std::string::npos);
}

TEST(JsonTest, ParsesWhatWeWriteAndRefusesGarbage) {
  auto v = ParseJson(R"({"a":[1,2,{"b":"x\ny\u00e9"}],"c":true,"d":null,"e":-3.5e2})", "t");
  ASSERT_TRUE(v.ok()) << v.status();
  uint64_t one;
  EXPECT_TRUE(v->Find("a")->array[0].AsUint(&one));
  EXPECT_EQ(one, 1u);
  EXPECT_EQ(v->Find("a")->array[2].Find("b")->text, "x\ny\xc3\xa9");
  EXPECT_TRUE(v->Find("c")->boolean);
  for (const char* bad :
       {"", "{", "{\"a\":}", "[1,]", "{\"a\":1} x", "\"\\q\"", "[[[[", "{\"a\" 1}", "nul"}) {
    EXPECT_EQ(ParseJson(bad, "t").status().code(), absl::StatusCode::kDataLoss) << bad;
  }
  EXPECT_FALSE(ParseJson(std::string(1000, '['), "t").ok());  // nesting bound
}

// What JsonQuote writes, ParseJson reads back as it was.
TEST(JsonTest, QuotedStringsReadBack) {
  std::string all;
  for (int c = 1; c < 0x80; ++c) all.push_back(static_cast<char>(c));
  for (const std::string& s : {std::string(), std::string("a\"b\\c"), all,
                               std::string("x\xc3\xa9y")}) {
    auto v = ParseJson(JsonQuote(s), "t");
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->text, s);
  }
  EXPECT_EQ(JsonQuote("a\nb\x01"), "\"a\\nb\\u0001\"");
}

TEST(JsonTest, EveryEscapeAndEmptyContainers) {
  auto v = ParseJson(R"({"s":"\"\\\/\b\f\n\r\t\ud83d\ude00","a":[],"o":{}})", "t");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->Find("s")->text, "\"\\/\b\f\n\r\t\xf0\x9f\x98\x80");
  EXPECT_TRUE(v->Find("a")->array.empty());
  EXPECT_EQ(v->Find("o")->type, JsonValue::Type::kObject);
  EXPECT_TRUE(v->Find("o")->object.empty());
}

}  // namespace
}  // namespace gradsnap

#include "common/token.h"

namespace gradsnap {
namespace {

TEST(Token, MintAndCheck) {
  std::string secret = "0123456789abcdef-secret";
  auto a = MintJobToken(secret, "jobA");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->substr(0, 4), "gs1.");
  EXPECT_EQ(a->size(), 4u + 64u);
  EXPECT_TRUE(CheckJobToken(secret, "jobA", *a));
  EXPECT_FALSE(CheckJobToken(secret, "jobB", *a));
  EXPECT_FALSE(CheckJobToken("another-secret-0123", "jobA", *a));
  EXPECT_FALSE(CheckJobToken(secret, "jobA", ""));
  EXPECT_FALSE(MintJobToken(secret, "../x").ok());
  EXPECT_FALSE(MintJobToken("", "jobA").ok());
}

}  // namespace
}  // namespace gradsnap

TEST(FlagNames, DashesBecomeUnderscoresInNamesOnly) {
  const char* in[] = {"prog", "--data-dir=/a-b", "--listen", "127.0.0.1:1", "-x-y", "--ckpt-mode",
                      "gockpt", "--", "--not-a-flag"};
  std::vector<char*> argv;
  for (const char* a : in) argv.push_back(const_cast<char*>(a));
  gradsnap::UnderscoredArgv u(static_cast<int>(argv.size()), argv.data());
  ASSERT_EQ(u.argc(), 9);
  EXPECT_STREQ(u.argv()[0], "prog");
  EXPECT_STREQ(u.argv()[1], "--data_dir=/a-b");  // the value keeps its dash
  EXPECT_STREQ(u.argv()[2], "--listen");
  EXPECT_STREQ(u.argv()[4], "-x-y");             // single-dash arguments are not rewritten
  EXPECT_STREQ(u.argv()[5], "--ckpt_mode");
  EXPECT_STREQ(u.argv()[8], "--not-a-flag");     // after "--", nothing is a flag
}

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "common/small_file.h"

namespace gradsnap {
namespace {

// A file under the test's temporary directory, removed on destruction.
class ScratchFile {
 public:
  ScratchFile(const char* name, const std::string& bytes)
      : path_(std::string(::testing::TempDir()) + "/" + name + "." + std::to_string(getpid())) {
    std::ofstream(path_, std::ios::binary) << bytes;
  }
  ~ScratchFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(SmallFile, ReadsBoundedRegularFilesOnly) {
  ScratchFile f("small", "abc");
  absl::StatusOr<std::string> s = ReadSmallFile(f.path(), "token file");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, "abc");
  EXPECT_TRUE(absl::IsInvalidArgument(ReadSmallFile(f.path(), "token file", 2).status()));
  EXPECT_TRUE(absl::IsNotFound(ReadSmallFile("/nonexistent/x", "token file").status()));
  absl::Status dir = ReadSmallFile("/", "token file").status();
  EXPECT_TRUE(absl::IsInvalidArgument(dir));
  EXPECT_NE(dir.message().find("is a directory"), std::string::npos) << dir;
  EXPECT_TRUE(absl::IsInvalidArgument(ReadSmallFile("/dev/zero", "token file").status()));
}

TEST(SmallFile, AppendFileKeepsWhatWasThereAndChecksTheTotalFirst) {
  ScratchFile a("append_a", "hello ");
  ScratchFile b("append_b", "world");
  std::vector<uint8_t> out;
  ASSERT_TRUE(AppendFile(a.path(), "data file", 11, &out).ok());
  ASSERT_TRUE(AppendFile(b.path(), "data file", 11, &out).ok());
  EXPECT_EQ(std::string(out.begin(), out.end()), "hello world");
  // One byte over the total: refused before reading, *out untouched.
  absl::Status over = AppendFile(a.path(), "data file", 16, &out);
  EXPECT_TRUE(absl::IsInvalidArgument(over)) << over;
  EXPECT_NE(over.message().find("data file"), std::string::npos) << over;
  EXPECT_EQ(out.size(), 11u);
  EXPECT_TRUE(absl::IsNotFound(AppendFile("/nonexistent/x", "data file", 100, &out)));
  EXPECT_TRUE(absl::IsInvalidArgument(AppendFile("/dev/zero", "data file", 100, &out)));
  const std::string fifo = std::string(::testing::TempDir()) + "/fifo." + std::to_string(getpid());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  EXPECT_TRUE(absl::IsInvalidArgument(AppendFile(fifo, "data file", 100, &out)));  // no hang
  std::remove(fifo.c_str());
  EXPECT_EQ(out.size(), 11u);
}

}  // namespace
}  // namespace gradsnap

#include "absl/flags/flag.h"
#include "common/command_line.h"

ABSL_FLAG(int, command_line_test_value, 0, "a flag for CommandLine's test");

TEST(CommandLine, DashSpellingsAndPositionalArguments) {
  const char* in[] = {"prog", "--command-line-test-value=7", "pos-1"};
  std::vector<char*> argv;
  for (const char* a : in) argv.push_back(const_cast<char*>(a));
  gradsnap::CommandLine cl(static_cast<int>(argv.size()), argv.data(), "prog [--flags]",
                           {"common_test"});
  EXPECT_STREQ(cl.args()[1], "--command_line_test_value=7");
  std::vector<char*> positional = cl.Parse();
  EXPECT_EQ(absl::GetFlag(FLAGS_command_line_test_value), 7);
  ASSERT_EQ(positional.size(), 2u);
  EXPECT_STREQ(positional[1], "pos-1");
}

ABSL_FLAG(bool, command_line_test_switch, false, "a bool flag for CommandLine's test");

// FlagError's one line for each kind of bad flag, naming the flag as typed (dashes kept).
std::string FlagErrorOf(std::vector<const char*> in) {
  in.insert(in.begin(), "prog");
  return gradsnap::FlagArgumentsError(std::vector<std::string>(in.begin(), in.end()));
}

TEST(CommandLine, FlagErrorNamesTheFlagAsTyped) {
  EXPECT_EQ(FlagErrorOf({"--command-line-test-value=3", "--command-line-test-switch"}), "");
  EXPECT_EQ(FlagErrorOf({"--command-line-test-value", "4", "pos"}), "");
  EXPECT_EQ(FlagErrorOf({"--nocommand-line-test-switch"}), "");
  EXPECT_EQ(FlagErrorOf({"--help"}), "");  // Abseil's usage flags are Abseil's
  EXPECT_EQ(FlagErrorOf({"--", "--no-such-flag"}), "");  // after "--" nothing is a flag
  EXPECT_EQ(FlagErrorOf({"--no-such-flag=1"}), "unknown flag --no-such-flag");
  EXPECT_EQ(FlagErrorOf({"-no-such-flag"}), "unknown flag -no-such-flag");
  EXPECT_EQ(FlagErrorOf({"--command-line-test-value"}),
            "missing value for --command-line-test-value");
  EXPECT_EQ(FlagErrorOf({"--command_line_test_value=abc"}),
            "bad value 'abc' for --command_line_test_value");
  EXPECT_EQ(FlagErrorOf({"--command-line-test-switch=maybe"}),
            "bad value 'maybe' for --command-line-test-switch");
  EXPECT_EQ(FlagErrorOf({"--nocommand-line-test-switch=1"}),
            "--nocommand-line-test-switch takes no value");
  // --undefok names flags that may be unknown, as Abseil has it.
  EXPECT_EQ(FlagErrorOf({"--undefok=old-flag,gone", "--old-flag=1", "--gone"}), "");
  EXPECT_EQ(FlagErrorOf({"--undefok=gone", "--other"}), "unknown flag --other");
}

#include "common/key_value_text.h"

TEST(KeyValueText, VersionLineThenKeyValueLines) {
  auto kv = gradsnap::ParseKeyValueText("fmt v1\na=1\nb=x=y\n\nc\n", "fmt v1");
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_EQ(kv->at("a"), "1");
  EXPECT_EQ(kv->at("b"), "x=y");  // the value is everything after the first '='
  EXPECT_EQ(kv->at("c"), "");
  EXPECT_EQ(kv->size(), 3u);
  EXPECT_TRUE(absl::IsDataLoss(gradsnap::ParseKeyValueText("fmt v2\na=1\n", "fmt v1").status()));
  EXPECT_TRUE(absl::IsDataLoss(gradsnap::ParseKeyValueText("", "fmt v1").status()));
}

#include "common/config_file.h"

TEST(ConfigFile, KeyValueLinesCommentsAndErrors) {
  auto e = gradsnap::ParseConfigText(
      "# comment\n\n  data-dir = /srv/a#b   # trailing\nlisten=127.0.0.1:0\ntls_cert =\n\tx-y=1=2\n");
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->size(), 4u);
  EXPECT_EQ((*e)[0].key, "data-dir");
  EXPECT_EQ((*e)[0].value, "/srv/a#b");  // '#' inside a word is part of the value
  EXPECT_EQ((*e)[0].line, 3);
  EXPECT_EQ((*e)[1].value, "127.0.0.1:0");
  EXPECT_EQ((*e)[2].key, "tls_cert");
  EXPECT_EQ((*e)[2].value, "");
  EXPECT_EQ((*e)[3].value, "1=2");  // everything after the first '='
  EXPECT_EQ(gradsnap::ParseConfigText("a = 1\nb\n").status().message(),
            "line 2: expected 'key = value', got 'b'");
  EXPECT_EQ(gradsnap::ParseConfigText("--a = 1\n").status().message(),
            "line 1: bad key '--a' (a flag name without its dashes)");
  EXPECT_EQ(gradsnap::ParseConfigText(" = 1\n").status().message(),
            "line 1: bad key '' (a flag name without its dashes)");
  EXPECT_EQ(gradsnap::ParseConfigText("a-b = 1\na_b = 2\n").status().message(),
            "line 2: key 'a_b' given twice");
  EXPECT_TRUE(gradsnap::ParseConfigText("").ok());
}

#include <atomic>
#include <mutex>
#include <set>

#include "common/thread_pool.h"

// ForEachConcurrently runs every index once, never more than `threads` at a time, and the
// caller's `meanwhile` while they run: here every call waits until `threads` are inside at
// once (or the last ones are), so a helper that ran them one by one would never get there, and
// one that ran more at once would count too many.
TEST(ForEachConcurrently, EveryIndexOnceAtMostThreadsAtATime) {
  constexpr size_t kN = 37, kThreads = 4;
  std::mutex mu;
  std::multiset<size_t> ran;
  std::atomic<int> inside{0}, most{0}, entered{0};
  bool meanwhile_ran = false;
  gradsnap::ForEachConcurrently(
      kN, kThreads,
      [&](size_t i) {
        const int now = ++inside;
        for (int seen = most.load(); now > seen && !most.compare_exchange_weak(seen, now);) {
        }
        const int mine = ++entered;
        const int k = static_cast<int>(kThreads);
        if (mine <= k) {
          // The first kThreads calls meet: none leaves before all of them came in (a helper
          // that ran them one by one gives up after 30 s and fails the count below). Then they
          // stay 200 ms more, for a helper with a thread too many to start one more call.
          const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
          while (entered.load() < k && std::chrono::steady_clock::now() < give_up) {
            std::this_thread::yield();
          }
          const auto held = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
          while (entered.load() == k && std::chrono::steady_clock::now() < held) {
            std::this_thread::yield();
          }
        }
        --inside;
        std::lock_guard<std::mutex> lock(mu);
        ran.insert(i);
      },
      [&] { meanwhile_ran = true; });
  EXPECT_TRUE(meanwhile_ran);
  EXPECT_EQ(ran.size(), kN);
  for (size_t i = 0; i < kN; ++i) EXPECT_EQ(ran.count(i), 1u) << i;
  EXPECT_EQ(most.load(), static_cast<int>(kThreads));
  gradsnap::ForEachConcurrently(0, kThreads, [&](size_t) { ADD_FAILURE(); });
}
