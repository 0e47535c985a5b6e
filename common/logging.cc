#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

namespace gradsnap {
namespace {

int LevelFromEnv() {
  const char* env = std::getenv("GRADSNAP_LOG_LEVEL");
  if (env == nullptr) return static_cast<int>(LogLevel::kInfo);
  if (std::strcmp(env, "debug") == 0) return 0;
  if (std::strcmp(env, "warning") == 0) return 2;
  if (std::strcmp(env, "error") == 0) return 3;
  return 1;
}

std::atomic<int>& Threshold() {
  static std::atomic<int> threshold{LevelFromEnv()};
  return threshold;
}

const char* LevelLetter(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "D";
    case LogLevel::kInfo: return "I";
    case LogLevel::kWarning: return "W";
    case LogLevel::kError: return "E";
    case LogLevel::kFatal: return "F";
  }
  return "?";
}

}  // namespace

bool LogEnabled(LogLevel level) {
  return static_cast<int>(level) >= Threshold().load(std::memory_order_relaxed);
}

void SetLogLevel(LogLevel level) { Threshold().store(static_cast<int>(level)); }

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm;
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%H:%M:%S", &tm);
  const char* base = std::strrchr(file, '/');
  stream_ << LevelLetter(level) << buf << "." << (ms < 100 ? (ms < 10 ? "00" : "0") : "") << ms
          << " " << (base ? base + 1 : file) << ":" << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  std::string s = stream_.str();
  ssize_t ignored = ::write(STDERR_FILENO, s.data(), s.size());
  (void)ignored;
  if (level_ == LogLevel::kFatal) std::abort();
}

}  // namespace gradsnap
