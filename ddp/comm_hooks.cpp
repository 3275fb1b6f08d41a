// The built-in communication hooks. Each leaves the bucket holding the average over ranks.
#include "cpprun/comm_hooks.h"

#include <ATen/ATen.h>

namespace cpprun {
namespace {

class AllReduceHook : public CommHook {
 public:
  Work run(const ProcessGroup& group, GradBucket& bucket) override {
    return all_reduce_async(group, bucket.buffer, ReduceOp::kAvg);
  }
  std::string name() const override { return "allreduce"; }
};

// Sends the bucket in a 16-bit type: divided by the world size first, so the sum cannot
// overflow where the average would not; the result is copied back into the bucket.
class CompressHook : public CommHook {
 public:
  CompressHook(at::ScalarType wire, std::string name) : wire_(wire), name_(std::move(name)) {}
  Work run(const ProcessGroup& group, GradBucket& bucket) override {
    at::Tensor compressed = bucket.buffer.to(wire_).div_(group.size());
    at::Tensor buffer = bucket.buffer;
    return all_reduce_async(group, compressed, ReduceOp::kSum).then([buffer, compressed]() mutable {
      buffer.copy_(compressed);
    });
  }
  std::string name() const override { return name_; }

 private:
  at::ScalarType wire_;
  std::string name_;
};

// PyTorch's noop_hook: the bucket as it is, nothing sent.
class NoopHook : public CommHook {
 public:
  Work run(const ProcessGroup&, GradBucket&) override { return Work(); }
  std::string name() const override { return "noop"; }
};

}  // namespace

std::shared_ptr<CommHook> noop_hook() { return std::make_shared<NoopHook>(); }
std::shared_ptr<CommHook> allreduce_hook() { return std::make_shared<AllReduceHook>(); }
std::shared_ptr<CommHook> fp16_compress_hook() { return std::make_shared<CompressHook>(at::kHalf, "fp16_compress"); }
std::shared_ptr<CommHook> bf16_compress_hook() { return std::make_shared<CompressHook>(at::kBFloat16, "bf16_compress"); }

}  // namespace cpprun
