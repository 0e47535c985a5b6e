// TempDir: a fresh directory for one test or drill, removed with its contents on destruction.
//
// Not thread-safe per object; each test owns its directories.
#ifndef GRADSNAP_TESTS_TESTING_TEMP_DIR_H_
#define GRADSNAP_TESTS_TESTING_TEMP_DIR_H_

#include <string>

namespace gradsnap {
namespace testing {

class TempDir {
 public:
  // mkdtemp("<parent>/gradsnap-<tag>-XXXXXX"); `parent` empty: $TMPDIR, else /tmp. `keep`:
  // left in place on destruction (a drill's post-mortem). path() is "" when mkdtemp failed.
  explicit TempDir(const std::string& tag = "test", const std::string& parent = "",
                   bool keep = false);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path()/name (not created).
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  // path()/name, created as a directory (with its parents).
  std::string Sub(const std::string& name) const;

 private:
  std::string path_;
  bool keep_;
};

}  // namespace testing
}  // namespace gradsnap

#endif  // GRADSNAP_TESTS_TESTING_TEMP_DIR_H_
