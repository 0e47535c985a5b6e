#include "tests/testing/temp_dir.h"

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>

namespace gradsnap {
namespace testing {

TempDir::TempDir(const std::string& tag, const std::string& parent, bool keep) : keep_(keep) {
  std::string base = parent;
  if (base.empty()) {
    const char* env = std::getenv("TMPDIR");
    base = env != nullptr && *env != '\0' ? env : "/tmp";
  }
  std::error_code ec;
  std::filesystem::create_directories(base, ec);
  std::string tmpl = base + "/gradsnap-" + tag + "-XXXXXX";
  path_ = ::mkdtemp(tmpl.data()) != nullptr ? tmpl : "";
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!keep_ && !path_.empty()) std::filesystem::remove_all(path_, ec);
}

std::string TempDir::Sub(const std::string& name) const {
  const std::string dir = File(name);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  return dir;
}

}  // namespace testing
}  // namespace gradsnap
