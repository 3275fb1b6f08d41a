// See cpprun/detail/group_store.h.
#include "cpprun/detail/group_store.h"

#include <c10/util/Exception.h>

#include <cstdint>
#include <vector>

#include "comm/group_impl.h"

namespace cpprun::detail {

void store_set(const ProcessGroup& group, const std::string& key, const std::string& value) {
  auto& impl = GroupAccess::impl(group);
  TORCH_INTERNAL_ASSERT(impl.store, "a process group without a store");
  impl.store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::optional<std::string> store_try_get(const ProcessGroup& group, const std::string& key) {
  auto& impl = GroupAccess::impl(group);
  TORCH_INTERNAL_ASSERT(impl.store, "a process group without a store");
  // check() answers at once; get() of a key that exists does too (it waits only for a missing one).
  if (!impl.store->check({key})) return std::nullopt;
  const std::vector<uint8_t> bytes = impl.store->get(key);
  return std::string(bytes.begin(), bytes.end());
}

void store_delete(const ProcessGroup& group, const std::string& key) {
  auto& impl = GroupAccess::impl(group);
  TORCH_INTERNAL_ASSERT(impl.store, "a process group without a store");
  impl.store->deleteKey(key);
}

}  // namespace cpprun::detail
