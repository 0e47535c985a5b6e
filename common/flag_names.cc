#include "common/flag_names.h"

#include <algorithm>

namespace gradsnap {

UnderscoredArgv::UnderscoredArgv(int argc, char** argv) : strings_(argv, argv + argc) {
  for (size_t i = 1; i < strings_.size(); ++i) {
    std::string& a = strings_[i];
    if (a == "--") break;
    if (a.size() < 3 || a[0] != '-' || a[1] != '-') continue;
    const size_t end = std::min(a.find('='), a.size());
    for (size_t k = 2; k < end; ++k) {
      if (a[k] == '-') a[k] = '_';
    }
  }
  ptrs_.reserve(strings_.size());
  for (std::string& s : strings_) ptrs_.push_back(s.data());
}

}  // namespace gradsnap
