#include "guard/report/Json.h"

#include "guard/report/EnumNames.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace torch_ext {

namespace {

// What an error calls a value's type (both number types read "number").
constexpr NamedValue<Json::Type> kTypeNames[] = {
    {Json::Type::Null, "null"},     {Json::Type::Bool, "bool"},     {Json::Type::Int, "number"},
    {Json::Type::Double, "number"}, {Json::Type::String, "string"}, {Json::Type::Array, "array"},
    {Json::Type::Object, "object"},
};

const char* typeName(Json::Type t) {
  return nameIn(kTypeNames, t);
}

// A byte of the input for an error message: 'x' when printable, else its code
// (a NUL or a stray UTF-8 byte would cut off or garble the message).
std::string quoted(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (u >= 0x20 && u < 0x7f) return std::string("'") + c + "'";
  char buf[16];
  std::snprintf(buf, sizeof(buf), "byte 0x%02x", u);
  return buf;
}

[[noreturn]] void wrongType(const char* what, const char* want, Json::Type got) {
  throw JsonError(std::string(what) + " must be " + want + ", got " + typeName(got));
}

void escape(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

class Parser {
 public:
  explicit Parser(const std::string& text) : s_(text) {}

  Json parseDocument() {
    Json v = parseValue(0);
    skipWs();
    if (pos_ != s_.size()) fail("unexpected trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw JsonError("invalid JSON at byte " + std::to_string(pos_) + ": " + why);
  }

  void skipWs() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t')) ++pos_;
  }

  char peek() {
    skipWs();
    if (pos_ >= s_.size()) fail("unexpected end of input (truncated?)");
    return s_[pos_];
  }

  void expect(char c) {
    if (peek() != c) fail("expected " + quoted(c));
    ++pos_;
  }

  // `depth`: the arrays and objects around this value.
  Json parseValue(int depth) {
    char c = peek();
    if ((c == '{' || c == '[') && depth >= Json::kMaxDepth) {
      fail("nesting too deep: more than " + std::to_string(Json::kMaxDepth) + " levels of arrays and objects");
    }
    if (c == '{') return parseObject(depth);
    if (c == '[') return parseArray(depth);
    if (c == '"') return Json(parseString());
    if (c == 't') return literal("true", Json(true));
    if (c == 'f') return literal("false", Json(false));
    if (c == 'n') return literal("null", Json());
    if (c == '-' || (c >= '0' && c <= '9')) return parseNumber();
    fail("unexpected character " + quoted(c));
  }

  Json literal(const char* word, Json value) {
    size_t n = std::strlen(word);
    if (s_.compare(pos_, n, word) != 0) {
      // A prefix of the word at the very end means the input was cut off.
      if (pos_ + n > s_.size() && std::string(word).compare(0, s_.size() - pos_, s_, pos_) == 0) {
        fail(std::string("unexpected end of input inside '") + word + "' (truncated?)");
      }
      fail(std::string("expected ") + word);
    }
    pos_ += n;
    return value;
  }

  Json parseNumber() {
    size_t start = pos_;
    bool isInt = true;
    if (s_[pos_] == '-') ++pos_;
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c >= '0' && c <= '9') {
        ++pos_;
      } else if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
        isInt = false;
        ++pos_;
      } else {
        break;
      }
    }
    std::string tok = s_.substr(start, pos_ - start);
    char* end = nullptr;
    if (isInt) {
      errno = 0;
      long long v = std::strtoll(tok.c_str(), &end, 10);
      if (errno == 0 && end == tok.c_str() + tok.size()) return Json(static_cast<int64_t>(v));
    }
    double d = std::strtod(tok.c_str(), &end);
    if (end != tok.c_str() + tok.size() || tok.empty() || tok == "-") {
      // Cut off where a number cannot end ("-", "1e", "1e-", "1.") is truncation.
      const char last = tok.empty() ? '-' : tok.back();
      if (pos_ >= s_.size() && (last == '-' || last == '+' || last == 'e' || last == 'E' || last == '.')) {
        fail("unexpected end of input inside number '" + tok + "' (truncated?)");
      }
      fail("malformed number '" + tok + "'");
    }
    return Json(d);
  }

  static void appendUtf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  uint32_t hex4() {
    if (pos_ + 4 > s_.size()) fail("unterminated \\u escape at end of input (truncated?)");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= c - '0';
      } else if (c >= 'a' && c <= 'f') {
        v |= c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        v |= c - 'A' + 10;
      } else {
        fail("bad \\u escape");
      }
    }
    return v;
  }

  std::string parseString() {
    expect('"');
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail("unterminated string (truncated?)");
      char c = s_[pos_++];
      if (c == '"') break;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) fail("unterminated escape at end of input (truncated?)");
      char e = s_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {
            // A high surrogate must be followed by an escaped low surrogate.
            if (s_.compare(pos_, 2, "\\u") != 0) fail("high surrogate not followed by a low surrogate");
            pos_ += 2;
            uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("high surrogate not followed by a low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("lone low surrogate");
          }
          appendUtf8(out, cp);
          break;
        }
        default:
          fail(quoted(e)[0] == '\'' ? std::string("bad escape '\\") + e + "'"
                                    : "bad escape: a backslash followed by " + quoted(e));
      }
    }
    return out;
  }

  Json parseArray(int depth) {
    expect('[');
    Json::Array a;
    if (peek() == ']') {
      ++pos_;
      return Json(std::move(a));
    }
    while (true) {
      a.push_back(parseValue(depth + 1));
      char c = peek();
      if (c != ']' && c != ',') fail("expected ',' or ']' in array");
      ++pos_;
      if (c == ']') break;
    }
    return Json(std::move(a));
  }

  Json parseObject(int depth) {
    expect('{');
    Json::Object o;
    if (peek() == '}') {
      ++pos_;
      return Json(std::move(o));
    }
    while (true) {
      if (peek() != '"') fail("expected a string key");
      std::string key = parseString();
      expect(':');
      o.emplace_back(std::move(key), parseValue(depth + 1));
      char c = peek();
      if (c != '}' && c != ',') fail("expected ',' or '}' in object");
      ++pos_;
      if (c == '}') break;
    }
    return Json(std::move(o));
  }

  const std::string& s_;
  size_t pos_ = 0;
};

}  // namespace

bool Json::asBool(const char* what) const {
  if (type_ != Type::Bool) wrongType(what, "a bool", type_);
  return b_;
}

int64_t Json::asInt(const char* what) const {
  if (type_ == Type::Int) return i_;
  if (type_ == Type::Double && std::floor(d_) == d_) {
    // Whole, but maybe beyond int64 (1e300, or 1e999 parsed as infinity):
    // converting those is undefined behaviour, not a value.
    if (d_ >= -9223372036854775808.0 && d_ < 9223372036854775808.0) return static_cast<int64_t>(d_);
    char buf[40];
    std::snprintf(buf, sizeof(buf), "%.17g", d_);
    throw JsonError(std::string(what) + " must be an integer that fits in 64 bits, got " + buf);
  }
  wrongType(what, "an integer", type_);
}

double Json::asDouble(const char* what) const {
  if (type_ == Type::Int) return static_cast<double>(i_);
  if (type_ == Type::Double) return d_;
  wrongType(what, "a number", type_);
}

const std::string& Json::asString(const char* what) const {
  if (type_ != Type::String) wrongType(what, "a string", type_);
  return s_;
}

const Json::Array& Json::asArray(const char* what) const {
  if (type_ != Type::Array) wrongType(what, "an array", type_);
  return *a_;
}

const Json::Object& Json::asObject(const char* what) const {
  if (type_ != Type::Object) wrongType(what, "an object", type_);
  return *o_;
}

const Json* Json::get(const std::string& key) const {
  if (type_ != Type::Object) return nullptr;
  for (const auto& kv : *o_) {
    if (kv.first == key) return &kv.second;
  }
  return nullptr;
}

std::string Json::stringOr(const char* key, std::string dflt) const {
  const Json* v = get(key);
  return (v && v->isString()) ? v->asString() : std::move(dflt);
}

int64_t Json::intOr(const char* key, int64_t dflt) const {
  const Json* v = get(key);
  return (v && v->isNumber()) ? v->asInt(key) : dflt;
}

const Json& Json::at(const std::string& key) const {
  if (type_ != Type::Object) throw JsonError("expected an object holding '" + key + "'");
  const Json* v = get(key);
  if (v == nullptr) throw JsonError("missing field '" + key + "'");
  return *v;
}

Json& Json::set(const std::string& key, Json value) {
  if (type_ != Type::Object) {
    type_ = Type::Object;
    o_ = std::make_shared<Object>();
  } else if (o_.use_count() > 1) {
    o_ = std::make_shared<Object>(*o_);  // copy on write: copies share storage
  }
  for (auto& kv : *o_) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return kv.second;
    }
  }
  o_->emplace_back(key, std::move(value));
  return o_->back().second;
}

void Json::push(Json value) {
  if (type_ != Type::Array) {
    type_ = Type::Array;
    a_ = std::make_shared<Array>();
  } else if (a_.use_count() > 1) {
    a_ = std::make_shared<Array>(*a_);
  }
  a_->push_back(std::move(value));
}

void Json::dumpTo(std::string& out) const {
  switch (type_) {
    case Type::Null:
      out += "null";
      break;
    case Type::Bool:
      out += b_ ? "true" : "false";
      break;
    case Type::Int:
      out += std::to_string(i_);
      break;
    case Type::Double: {
      if (!std::isfinite(d_)) {
        out += "null";
        break;
      }
      char buf[40];
      std::snprintf(buf, sizeof(buf), "%.17g", d_);
      out += buf;
      // Keep it a double on the way back: "2" would parse as an integer.
      if (std::strpbrk(buf, ".eEn") == nullptr) out += ".0";
      break;
    }
    case Type::String:
      escape(s_, out);
      break;
    case Type::Array: {
      out += '[';
      bool first = true;
      for (const auto& v : *a_) {
        if (!first) out += ',';
        first = false;
        v.dumpTo(out);
      }
      out += ']';
      break;
    }
    case Type::Object: {
      out += '{';
      bool first = true;
      for (const auto& kv : *o_) {
        if (!first) out += ',';
        first = false;
        escape(kv.first, out);
        out += ':';
        kv.second.dumpTo(out);
      }
      out += '}';
      break;
    }
  }
}

std::string Json::dump() const {
  std::string out;
  dumpTo(out);
  return out;
}

Json Json::parse(const std::string& text) {
  return Parser(text).parseDocument();
}

}  // namespace torch_ext
