#pragma once

// EnumNames: the one way an enum of the guard gets its name and is parsed back.
// Each enum lists its (value, name) pairs once, next to its declaration, as a
// specialisation of EnumTable; enumName() and enumFromName() read that list.
// Names are what users and files see (reports, dumps, the store), so a value
// is never written as a number.

#include <cstddef>
#include <optional>
#include <string_view>

namespace torch_ext {

template <typename E>
struct NamedValue {
  E value;
  const char* name;
};

// Specialise with `static constexpr NamedValue<E> kEntries[] = {...};`.
template <typename E>
struct EnumTable;

// Lookups in any (value, name) table: an enum's EnumTable, or a second
// spelling of it kept beside the first (e.g. a wire format's short tags).
template <typename E, size_t N>
const char* nameIn(const NamedValue<E> (&table)[N], E value, const char* unknown = "?") {
  for (const auto& nv : table) {
    if (nv.value == value) return nv.name;
  }
  return unknown;
}

template <typename E, size_t N>
std::optional<E> valueIn(const NamedValue<E> (&table)[N], std::string_view name) {
  for (const auto& nv : table) {
    if (name == nv.name) return nv.value;
  }
  return std::nullopt;
}

template <typename E>
const char* enumName(E value, const char* unknown = "?") {
  return nameIn(EnumTable<E>::kEntries, value, unknown);
}

template <typename E>
std::optional<E> enumFromName(std::string_view name) {
  return valueIn(EnumTable<E>::kEntries, name);
}

template <typename E>
constexpr size_t enumCount() {
  return sizeof(EnumTable<E>::kEntries) / sizeof(EnumTable<E>::kEntries[0]);
}

}  // namespace torch_ext
