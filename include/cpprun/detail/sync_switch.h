// What no_sync() switches: whether the next backward reduces gradients across ranks.
#pragma once

namespace cpprun::detail {

class SyncSwitch {
 public:
  virtual ~SyncSwitch() = default;
  virtual void set_require_sync(bool sync) = 0;
  virtual bool require_sync() const = 0;
};

}  // namespace cpprun::detail
