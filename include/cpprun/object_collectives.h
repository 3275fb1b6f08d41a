// Collectives of C++ values rather than tensors, as torch.distributed's broadcast_object_list,
// all_gather_object, gather_object and scatter_object_list: a value travels as the bytes its
// ObjectCodec writes.
//
//   std::string run_name = rank == 0 ? make_name() : "";
//   cpprun::broadcast_object(group, run_name);                       // every rank: rank 0's name
//   auto counts = cpprun::all_gather_object(group, std::vector<int64_t>{seen, skipped});
//
// Codecs come for std::string, std::vector of trivially copyable elements, and trivially
// copyable values (int, double, a plain struct). Not for pointers, member pointers,
// std::string_view, std::reference_wrapper or std::span: their bytes are an address in the
// sender's memory, not what it points to (refused when compiled; a struct holding a pointer is
// trivially copyable too, cannot be told apart, and needs a codec of its own).
// torch::serialize archives travel as their bytes (archive_bytes / load_archive below). To send
// your own type, specialise ObjectCodec:
//
//   template <> struct cpprun::ObjectCodec<Config> {
//     static std::string encode(const Config& c) { return c.to_json(); }
//     static Config decode(const std::string& bytes) { return Config::from_json(bytes); }
//   };
//
// The bytes are copied as they are: types whose layout differs between ranks' builds (a
// trivially copyable struct compiled differently) need a codec of their own. Each value travels
// with its C++ type's name (hashed): ranks that pass different types are refused, naming this
// rank's, rather than one decoding the other's bytes as its own (PyTorch pickles the type with the
// value). `root` is a rank of `group` (PyTorch's group_src), not a rank of the world (PyTorch's src).
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#if __has_include(<span>) && __cplusplus >= 202002L
#include <span>
#endif
#include <vector>

#include "cpprun/process_group.h"

namespace torch::serialize {
class OutputArchive;
class InputArchive;
}  // namespace torch::serialize

namespace cpprun {

namespace detail {
// The standard's trivially copyable types that refer to memory elsewhere.
template <typename T>
struct refers_elsewhere : std::bool_constant<std::is_pointer_v<T> || std::is_member_pointer_v<T> ||
                                             std::is_null_pointer_v<T>> {};
template <typename C, typename Traits>
struct refers_elsewhere<std::basic_string_view<C, Traits>> : std::true_type {};
template <typename T>
struct refers_elsewhere<std::reference_wrapper<T>> : std::true_type {};
#if __has_include(<span>) && __cplusplus >= 202002L
template <typename T, std::size_t N>
struct refers_elsewhere<std::span<T, N>> : std::true_type {};
#endif
// Trivially copyable, and its bytes are its value: not an address into this process's memory.
template <typename T>
constexpr bool copied_as_bytes = std::is_trivially_copyable_v<T> && !refers_elsewhere<T>::value;
template <typename T>
constexpr bool always_false = false;
}  // namespace detail

// encode(const T&) -> std::string; decode(const std::string&) -> T. Specialise it for your types.
template <typename T, typename Enable = void>
struct ObjectCodec {
  static_assert(detail::always_false<T>,
                "cpprun::ObjectCodec: no codec for this type. Pointers, std::string_view and the like would send an "
                "address in this process, not what it points to: send a std::string or std::vector, or specialise "
                "cpprun::ObjectCodec<T> (see cpprun/object_collectives.h).");
};

template <>
struct ObjectCodec<std::string> {
  static std::string encode(const std::string& value) { return value; }
  static std::string decode(const std::string& bytes) { return bytes; }
};

template <typename T>
struct ObjectCodec<T, std::enable_if_t<detail::copied_as_bytes<T>>> {
  static std::string encode(const T& value) {
    return std::string(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  static T decode(const std::string& bytes);
};

template <typename T>
struct ObjectCodec<std::vector<T>, std::enable_if_t<detail::copied_as_bytes<T>>> {
  static std::string encode(const std::vector<T>& value) {
    return std::string(reinterpret_cast<const char*>(value.data()), value.size() * sizeof(T));
  }
  static std::vector<T> decode(const std::string& bytes);
};

namespace detail {
// Throws c10::Error: `bytes` cannot be a `type` of `expected` bytes (or a multiple of them).
[[noreturn]] void throw_bad_object_size(const char* type, std::size_t bytes, std::size_t expected);

// What a value's sender says of its C++ type (Note [An object's type on the wire] in
// comm/object_collectives.cpp): its mangled name, hashed. None (tag 0): bytes, unchecked.
struct ObjectType {
  uint64_t tag = 0;
  const char* name = nullptr;  // typeid's, mangled
};
uint64_t object_type_tag(const char* mangled_name);
template <typename T>
ObjectType object_type() {
  return ObjectType{object_type_tag(typeid(T).name()), typeid(T).name()};
}

void broadcast_bytes(const ProcessGroup& group, std::string& bytes, int root, ObjectType type);
std::vector<std::string> all_gather_bytes(const ProcessGroup& group, const std::string& bytes, ObjectType type);
std::vector<std::string> gather_bytes(const ProcessGroup& group, const std::string& bytes, int root, ObjectType type);
std::string scatter_bytes(const ProcessGroup& group, const std::vector<std::string>& pieces, int root, ObjectType type);
}  // namespace detail

template <typename T>
T ObjectCodec<T, std::enable_if_t<detail::copied_as_bytes<T>>>::decode(const std::string& bytes) {
  if (bytes.size() != sizeof(T)) detail::throw_bad_object_size("trivially copyable value", bytes.size(), sizeof(T));
  T value;
  std::memcpy(static_cast<void*>(&value), bytes.data(), sizeof(T));
  return value;
}

template <typename T>
std::vector<T> ObjectCodec<std::vector<T>, std::enable_if_t<detail::copied_as_bytes<T>>>::decode(
    const std::string& bytes) {
  if (bytes.size() % sizeof(T) != 0) detail::throw_bad_object_size("vector's elements", bytes.size(), sizeof(T));
  std::vector<T> value(bytes.size() / sizeof(T));
  if (!value.empty()) std::memcpy(static_cast<void*>(value.data()), bytes.data(), bytes.size());
  return value;
}

// The byte-level collectives the templates below are built on. Collective: every rank calls.
// Every rank's `bytes` becomes rank `root`'s (its size is sent first).
void broadcast_bytes(const ProcessGroup& group, std::string& bytes, int root = 0);
// Every rank's bytes, in rank order (of any sizes).
std::vector<std::string> all_gather_bytes(const ProcessGroup& group, const std::string& bytes);
// Rank `root` gets every rank's bytes, in rank order; the others an empty vector.
std::vector<std::string> gather_bytes(const ProcessGroup& group, const std::string& bytes, int root = 0);
// Rank r gets pieces[r] of rank `root`'s `pieces` (one per rank of the group; the others' are not read).
std::string scatter_bytes(const ProcessGroup& group, const std::vector<std::string>& pieces, int root = 0);

// Every rank's `value` becomes rank `root`'s.
template <typename T>
void broadcast_object(const ProcessGroup& group, T& value, int root = 0) {
  std::string bytes = group.rank() == root ? ObjectCodec<T>::encode(value) : std::string();
  detail::broadcast_bytes(group, bytes, root, detail::object_type<T>());
  if (group.rank() != root) value = ObjectCodec<T>::decode(bytes);
}

// Every rank's `value`, in rank order.
template <typename T>
std::vector<T> all_gather_object(const ProcessGroup& group, const T& value) {
  std::vector<T> values;
  const auto type = detail::object_type<T>();
  for (const std::string& bytes : detail::all_gather_bytes(group, ObjectCodec<T>::encode(value), type)) {
    values.push_back(ObjectCodec<T>::decode(bytes));
  }
  return values;
}

// Rank `root` gets every rank's `value`, in rank order; the others an empty vector
// (torch.distributed.gather_object).
template <typename T>
std::vector<T> gather_object(const ProcessGroup& group, const T& value, int root = 0) {
  std::vector<T> values;
  const auto type = detail::object_type<T>();
  for (const std::string& bytes : detail::gather_bytes(group, ObjectCodec<T>::encode(value), root, type)) {
    values.push_back(ObjectCodec<T>::decode(bytes));
  }
  return values;
}

// Rank r gets values[r] of rank `root`'s `values`, which holds one per rank of the group (the
// other ranks' `values` are not read: pass {}), as torch.distributed.scatter_object_list.
template <typename T>
T scatter_object(const ProcessGroup& group, const std::vector<T>& values, int root = 0) {
  std::vector<std::string> pieces;
  if (group.rank() == root) {
    for (const T& value : values) pieces.push_back(ObjectCodec<T>::encode(value));
  }
  return ObjectCodec<T>::decode(detail::scatter_bytes(group, pieces, root, detail::object_type<T>()));
}

// A torch::serialize archive as bytes and back (what torch::save writes), e.g. to broadcast a
// state rank 0 read from disk:
//   std::string bytes; if (rank == 0) { OutputArchive out; ...write...; bytes = archive_bytes(out); }
//   cpprun::broadcast_object(group, bytes);
//   torch::serialize::InputArchive in; cpprun::load_archive(in, bytes);
std::string archive_bytes(torch::serialize::OutputArchive& archive);
void load_archive(torch::serialize::InputArchive& archive, const std::string& bytes);

}  // namespace cpprun
