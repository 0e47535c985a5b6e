// Minimal leveled logging to stderr (Debian's Abseil has no absl/log).
//
//   GS_LOG(INFO) << "opened " << path;
//   GS_CHECK(n > 0) << "n=" << n;      // aborts with file:line: for programming errors only,
//                                      // never for bad input or I/O failures (use Status).
// Thread-safe: each message is formatted in a local buffer and written with one write(2).
// GRADSNAP_LOG_LEVEL=debug|info|warning|error sets the threshold (default: info).
#ifndef GRADSNAP_COMMON_LOGGING_H_
#define GRADSNAP_COMMON_LOGGING_H_

#include <sstream>

namespace gradsnap {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

// True when messages at `level` are printed.
bool LogEnabled(LogLevel level);
// Overrides GRADSNAP_LOG_LEVEL (tests and --quiet flags).
void SetLogLevel(LogLevel level);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();  // writes the line; aborts for kFatal
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// Swallows the stream when the level is disabled.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace gradsnap

#define GS_LOG_LEVEL_DEBUG ::gradsnap::LogLevel::kDebug
#define GS_LOG_LEVEL_INFO ::gradsnap::LogLevel::kInfo
#define GS_LOG_LEVEL_WARNING ::gradsnap::LogLevel::kWarning
#define GS_LOG_LEVEL_ERROR ::gradsnap::LogLevel::kError
#define GS_LOG_LEVEL_FATAL ::gradsnap::LogLevel::kFatal

#define GS_LOG(level)                                        \
  !::gradsnap::LogEnabled(GS_LOG_LEVEL_##level)              \
      ? (void)0                                              \
      : ::gradsnap::LogVoidify() &                           \
            ::gradsnap::LogMessage(GS_LOG_LEVEL_##level, __FILE__, __LINE__).stream()

#define GS_CHECK(cond)                                                            \
  (cond) ? (void)0                                                                \
         : ::gradsnap::LogVoidify() &                                             \
               ::gradsnap::LogMessage(::gradsnap::LogLevel::kFatal, __FILE__, __LINE__) \
                       .stream()                                                  \
                   << "Check failed: " #cond " "

#endif  // GRADSNAP_COMMON_LOGGING_H_
