#pragma once

// Json: a minimal JSON value with a writer and a strict parser.
//
// Dumps, the snapshots ranks exchange through the store during an incident, and
// the post-mortem `diagnose` CLI all use one format, so one (de)serialiser serves
// them all. Only what those need: null, bool, number (double or int64), string,
// array, object with insertion order kept. parse() throws JsonError with the
// byte offset, so a truncated dump can be named precisely.

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace torch_ext {

class JsonError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Json {
 public:
  // parse() refuses arrays and objects nested deeper than this (a hostile
  // "[[[[..." would otherwise overflow the stack of its recursive descent).
  static constexpr int kMaxDepth = 200;

  enum class Type : uint8_t { Null, Bool, Int, Double, String, Array, Object };
  using Array = std::vector<Json>;
  using Object = std::vector<std::pair<std::string, Json>>;

  Json() = default;
  Json(std::nullptr_t) {}
  Json(bool b) : type_(Type::Bool), b_(b) {}
  Json(int v) : type_(Type::Int), i_(v) {}
  Json(int64_t v) : type_(Type::Int), i_(v) {}
  Json(uint64_t v) : type_(Type::Int), i_(static_cast<int64_t>(v)) {}
  Json(double v) : type_(Type::Double), d_(v) {}
  Json(const char* s) : type_(Type::String), s_(s) {}
  Json(std::string s) : type_(Type::String), s_(std::move(s)) {}
  Json(Array a) : type_(Type::Array), a_(std::make_shared<Array>(std::move(a))) {}
  Json(Object o) : type_(Type::Object), o_(std::make_shared<Object>(std::move(o))) {}

  static Json array() {
    return Json(Array{});
  }
  static Json object() {
    return Json(Object{});
  }

  Type type() const {
    return type_;
  }
  bool isNull() const {
    return type_ == Type::Null;
  }
  bool isObject() const {
    return type_ == Type::Object;
  }
  bool isArray() const {
    return type_ == Type::Array;
  }
  bool isString() const {
    return type_ == Type::String;
  }
  bool isNumber() const {
    return type_ == Type::Int || type_ == Type::Double;
  }

  // Typed access; throws JsonError naming `what` when the type is wrong.
  bool asBool(const char* what = "value") const;
  int64_t asInt(const char* what = "value") const;
  double asDouble(const char* what = "value") const;
  const std::string& asString(const char* what = "value") const;
  const Array& asArray(const char* what = "value") const;
  const Object& asObject(const char* what = "value") const;

  // Object helpers. get() returns nullptr when absent; at() throws naming the key.
  const Json* get(const std::string& key) const;
  // A member's value where it is there with that type, else `dflt` (old dumps
  // and optional fields).
  std::string stringOr(const char* key, std::string dflt = {}) const;
  int64_t intOr(const char* key, int64_t dflt = 0) const;
  const Json& at(const std::string& key) const;
  Json& set(const std::string& key, Json value);  // appends or replaces
  void push(Json value);                          // arrays

  std::string dump() const;
  static Json parse(const std::string& text);

 private:
  void dumpTo(std::string& out) const;

  Type type_ = Type::Null;
  bool b_ = false;
  int64_t i_ = 0;
  double d_ = 0;
  std::string s_;
  std::shared_ptr<Array> a_;
  std::shared_ptr<Object> o_;
};

}  // namespace torch_ext
