// An allocator that counts every CPU tensor's bytes, for the multi-rank tests that bound a call's
// tensor memory (a save, a load, parallelize_module).
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "dist_test_support.h"

namespace dist_test {

// Note [Counting the save's tensor memory]
// Every CPU tensor's bytes, on every thread (Gloo's included), through an allocator that wraps
// LibTorch's: its peak during a call (a save), less what was live before, is the call's extra
// tensor memory, which a rank holding the whole model gathered cannot keep below the model's size.
struct CountingAllocator final : c10::Allocator {
  struct Block {
    c10::DataPtr inner;
    std::size_t bytes;
    CountingAllocator* owner;
  };
  c10::Allocator* inner = nullptr;
  std::atomic<int64_t> live{0}, peak{0};

  static void release(void* context) {
    auto* block = static_cast<Block*>(context);
    block->owner->live -= static_cast<int64_t>(block->bytes);
    delete block;
  }
  // Non-zero: the next allocation of at least this many bytes fails, once (a rank out of memory).
  std::atomic<std::size_t> fail_at_least{0};

  c10::DataPtr allocate(std::size_t bytes) override {
    if (std::size_t armed = fail_at_least.load(); armed != 0 && bytes >= armed &&
                                                   fail_at_least.compare_exchange_strong(armed, 0)) {
      TORCH_CHECK(false, "test: an allocation of ", bytes, " bytes made to fail on rank ", group().rank());
    }
    c10::DataPtr data = inner->allocate(bytes);
    void* at = data.get();
    const int64_t now = live += static_cast<int64_t>(bytes);
    for (int64_t seen = peak.load(); now > seen && !peak.compare_exchange_weak(seen, now);) {
    }
    return {at, new Block{std::move(data), bytes, this}, &release, c10::Device(c10::kCPU)};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
  // The peak starts again from what is live now, which it returns.
  int64_t start() {
    peak = live.load();
    return live.load();
  }
};

// Installed as LibTorch's CPU allocator on first use, for the rest of the process.
inline CountingAllocator& counting_allocator() {
  static CountingAllocator* counting = [] {
    auto* c = new CountingAllocator;  // lives as long as the tensors it made
    c->inner = c10::GetCPUAllocator();
    c10::SetCPUAllocator(c, /*priority=*/1);
    return c;
  }();
  return *counting;
}

}  // namespace dist_test
