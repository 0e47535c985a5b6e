// Command lines spell flags with dashes (--data-dir, DESIGN.md section 6); Abseil's flag names
// use underscores. UnderscoredArgv rewrites the name part of every "--flag[=value]" argument,
// up to a lone "--", so both spellings reach absl::ParseCommandLine as the same flag. Values
// are left alone. Used by every main() that parses Abseil flags.
//
// THREAD SAFETY: not thread-safe; build it once in main().
#ifndef GRADSNAP_COMMON_FLAG_NAMES_H_
#define GRADSNAP_COMMON_FLAG_NAMES_H_

#include <string>
#include <vector>

namespace gradsnap {

class UnderscoredArgv {
 public:
  UnderscoredArgv(int argc, char** argv);
  UnderscoredArgv(const UnderscoredArgv&) = delete;
  UnderscoredArgv& operator=(const UnderscoredArgv&) = delete;

  int argc() const { return static_cast<int>(ptrs_.size()); }
  // Valid while this object lives.
  char** argv() { return ptrs_.data(); }
  const std::vector<char*>& args() const { return ptrs_; }

 private:
  std::vector<std::string> strings_;
  std::vector<char*> ptrs_;
};

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_FLAG_NAMES_H_
