// Short requests to a group's c10d store, for notices between ranks that must not be collectives
// (see Note [Asynchronous save across ranks] in checkpoint/async_save.cpp). Safe from any thread: c10d's
// store clients serialise their requests, and neither call waits for a key to appear, so a
// background thread never holds the store's connection while training uses it. Users do not need
// this header's names.
#pragma once

#include <optional>
#include <string>

#include "cpprun/process_group.h"

namespace cpprun::detail {

// Sets KEY (under the group's own prefix) to VALUE.
void store_set(const ProcessGroup& group, const std::string& key, const std::string& value);
// KEY's value, or nothing when no rank has set it yet.
std::optional<std::string> store_try_get(const ProcessGroup& group, const std::string& key);
// Removes KEY (once read: the store keeps what it is told until then).
void store_delete(const ProcessGroup& group, const std::string& key);

}  // namespace cpprun::detail
