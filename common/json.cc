#include "common/json.h"

#include <algorithm>
#include <cctype>
#include <iterator>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace gradsnap {
namespace {

constexpr int kMaxDepth = 64;

// The one-character escapes of JSON strings: "\\n" stands for kEscapes[index of 'n' in kEscaped].
constexpr char kEscaped[] = {'"', '\\', '/', 'b', 'f', 'n', 'r', 't'};
constexpr char kEscapes[] = {'"', '\\', '/', '\b', '\f', '\n', '\r', '\t'};

class Parser {
 public:
  explicit Parser(absl::string_view s) : s_(s) {}

  bool Value(JsonValue* out, int depth) {
    if (depth > kMaxDepth) return false;
    Space();
    if (pos_ >= s_.size()) return false;
    const char c = s_[pos_];
    if (c == '{') return Object(out, depth);
    if (c == '[') return Array(out, depth);
    if (c == '"') {
      out->type = JsonValue::Type::kString;
      return String(&out->text);
    }
    if (Literal("true")) {
      out->type = JsonValue::Type::kBool;
      out->boolean = true;
      return true;
    }
    if (Literal("false")) {
      out->type = JsonValue::Type::kBool;
      return true;
    }
    if (Literal("null")) return true;
    return Number(out);
  }

  bool AtEnd() {
    Space();
    return pos_ == s_.size();
  }
  size_t pos() const { return pos_; }

 private:
  void Space() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Literal(absl::string_view w) {
    if (s_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }
  bool Number(JsonValue* out) {
    const size_t start = pos_;
    while (pos_ < s_.size() &&
           (std::isdigit(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '-' ||
            s_[pos_] == '+' || s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
    }
    if (pos_ == start) return false;
    out->type = JsonValue::Type::kNumber;
    out->text = std::string(s_.substr(start, pos_ - start));
    double d;
    return absl::SimpleAtod(out->text, &d);
  }
  bool Hex4(uint32_t* v) {
    if (pos_ + 4 > s_.size()) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      *v <<= 4;
      if (c >= '0' && c <= '9')
        *v |= c - '0';
      else if (c >= 'a' && c <= 'f')
        *v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        *v |= c - 'A' + 10;
      else
        return false;
    }
    return true;
  }
  void Utf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }
  bool String(std::string* out) {
    ++pos_;  // opening quote
    while (pos_ < s_.size()) {
      const char c = s_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= s_.size()) return false;
      const char e = s_[pos_++];
      if (e != 'u') {
        const char* k = std::find(std::begin(kEscaped), std::end(kEscaped), e);
        if (k == std::end(kEscaped)) return false;
        out->push_back(kEscapes[k - std::begin(kEscaped)]);
        continue;
      }
      uint32_t cp;
      if (!Hex4(&cp)) return false;
      if (cp >= 0xd800 && cp < 0xdc00) {  // surrogate pair
        uint32_t lo;
        if (!Literal("\\u") || !Hex4(&lo) || lo < 0xdc00 || lo >= 0xe000) return false;
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
      }
      Utf8(cp, out);
    }
    return false;
  }
  // The elements of an array or object, from its opening bracket through `close`, each read by
  // element() (false: malformed).
  template <typename Element>
  bool List(char close, Element element) {
    ++pos_;  // the opening bracket
    Space();
    if (pos_ < s_.size() && s_[pos_] == close) return ++pos_, true;
    for (;;) {
      if (!element()) return false;
      Space();
      if (pos_ >= s_.size()) return false;
      const char c = s_[pos_++];
      if (c == close) return true;
      if (c != ',') return false;
    }
  }
  bool Array(JsonValue* out, int depth) {
    out->type = JsonValue::Type::kArray;
    return List(']', [&] {
      out->array.emplace_back();
      return Value(&out->array.back(), depth + 1);
    });
  }
  bool Object(JsonValue* out, int depth) {
    out->type = JsonValue::Type::kObject;
    return List('}', [&] {
      Space();
      std::string key;
      if (pos_ >= s_.size() || s_[pos_] != '"' || !String(&key)) return false;
      Space();
      if (pos_ >= s_.size() || s_[pos_++] != ':') return false;
      JsonValue v;
      if (!Value(&v, depth + 1)) return false;
      out->object[key] = std::move(v);  // a repeated key: the last one wins
      return true;
    });
  }

  absl::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

std::string JsonQuote(absl::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('"');
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
  return out;
}

const JsonValue* JsonValue::Find(const std::string& key) const {
  if (type != Type::kObject) return nullptr;
  auto it = object.find(key);
  return it == object.end() ? nullptr : &it->second;
}

bool JsonValue::AsUint(uint64_t* v) const {
  return type == Type::kNumber && absl::SimpleAtoi(text, v);
}

bool JsonValue::AsInt(int64_t* v) const {
  return type == Type::kNumber && absl::SimpleAtoi(text, v);
}

absl::StatusOr<JsonValue> ParseJson(absl::string_view text, absl::string_view what) {
  Parser p(text);
  JsonValue v;
  if (!p.Value(&v, 0) || !p.AtEnd()) {
    return absl::DataLossError(
        absl::StrCat(what, ": malformed JSON near byte ", p.pos(), " of ", text.size()));
  }
  return v;
}

}  // namespace gradsnap
