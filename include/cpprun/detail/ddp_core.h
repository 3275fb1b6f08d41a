// The non-template part of DistributedDataParallel: everything but calling the wrapped module's
// forward. Users do not need this header's names.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <vector>

#include "cpprun/comm_hooks.h"
#include "cpprun/ddp_options.h"
#include "cpprun/detail/sync_switch.h"
#include "cpprun/process_group.h"

namespace cpprun::detail {

class DdpCore : public SyncSwitch {
 public:
  DdpCore(torch::nn::Module& module, ProcessGroup group, DdpOptions options);
  ~DdpCore();
  DdpCore(const DdpCore&) = delete;
  DdpCore& operator=(const DdpCore&) = delete;

  // Around the wrapped module's forward. `outputs`: the tensors the forward returned, from
  // which parameters that take no part in the loss are found (find_unused_parameters).
  void before_forward();
  void after_forward(const std::vector<at::Tensor>& outputs);

  void set_require_sync(bool sync) override;
  bool require_sync() const override;
  void register_comm_hook(std::shared_ptr<CommHook> hook);
  void join(const std::function<void()>& train_loop);

  const ProcessGroup& group() const;
  const DdpOptions& options() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The tensors in a forward's result: a tensor, a vector of them, or a tuple/pair of them.
inline void collect_tensors(const at::Tensor& t, std::vector<at::Tensor>& out) { out.push_back(t); }
inline void collect_tensors(const std::vector<at::Tensor>& ts, std::vector<at::Tensor>& out) {
  out.insert(out.end(), ts.begin(), ts.end());
}
template <typename... T>
void collect_tensors(const std::tuple<T...>& tuple, std::vector<at::Tensor>& out) {
  std::apply([&](const auto&... item) { (collect_tensors(item, out), ...); }, tuple);
}
template <typename A, typename B>
void collect_tensors(const std::pair<A, B>& pair, std::vector<at::Tensor>& out) {
  collect_tensors(pair.first, out);
  collect_tensors(pair.second, out);
}
// Anything else holds no tensor we can see: unused parameters are then found when backward ends.
template <typename T>
void collect_tensors(const T&, std::vector<at::Tensor>&) {}

}  // namespace cpprun::detail
