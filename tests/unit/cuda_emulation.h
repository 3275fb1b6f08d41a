// Just enough of CUDA to compile a kernel's source as C++ and run it on the CPU, for kernels the
// library compiles at run time with NVRTC (Note [Kernels as text] in CMakeLists.txt), which CI has
// no GPU to run. Each CUDA thread of a block is a std::thread, so __syncthreads() and the warp
// shuffles are real rendezvous: a missing barrier or a wrong lane shows as a wrong result (seen:
// a kernel without its __syncthreads, or shuffling at offset 8 before 16, fails the test). Blocks
// run one after another, so a __shared__ variable may be a function-local static.
//
// What it does not emulate: memory coalescing, timing, warp divergence rules, and PTX inline asm
// (float16's conversions, compiled by NVRTC in unit but not run here).
#pragma once

#include <math.h>  // expf, logf, exp, log at global scope, as NVRTC gives the kernel

#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static  // one block at a time

struct EmulatedDim3 {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local EmulatedDim3 threadIdx, blockIdx, blockDim;

namespace cuda_emulation {

struct Warp {
  std::barrier<> arrived{32};
  alignas(8) unsigned char value[32][8];
  int offset[32];
};
inline thread_local std::barrier<>* block_barrier = nullptr;
inline thread_local Warp* my_warp = nullptr;

// Every lane publishes its value, all 32 meet, each reads its partner's, all meet again (so no
// lane overwrites a value another has not read). All 32 lanes must call it, as on a GPU.
template <typename T>
T shuffle_xor(unsigned mask, T v, int offset) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  if (mask != 0xffffffffu) {
    std::fprintf(stderr, "cuda_emulation: __shfl_xor_sync with mask %x (only the full warp is emulated)\n", mask);
    std::abort();
  }
  const int lane = static_cast<int>(threadIdx.x & 31);
  Warp& warp = *my_warp;
  std::memcpy(warp.value[lane], &v, sizeof(T));
  warp.offset[lane] = offset;
  warp.arrived.arrive_and_wait();
  const int partner = lane ^ offset;
  if (warp.offset[partner] != offset) {
    std::fprintf(stderr, "cuda_emulation: lanes %d and %d shuffled at different offsets\n", lane, partner);
    std::abort();
  }
  T r;
  std::memcpy(&r, warp.value[partner], sizeof(T));
  warp.arrived.arrive_and_wait();
  return r;
}

// Runs `kernel` on `grid` blocks of `block` threads (a multiple of 32), blocks one after another:
// the same `block` threads run every block, meeting at a barrier between two.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), unsigned grid, unsigned block, Args... args) {
  if (block == 0 || block % 32 != 0 || block > 1024) {
    std::fprintf(stderr, "cuda_emulation: a block of %u threads\n", block);
    std::abort();
  }
  std::barrier<> barrier(block);
  std::vector<std::unique_ptr<Warp>> warps;
  for (unsigned w = 0; w < block / 32; ++w) warps.push_back(std::make_unique<Warp>());
  std::vector<std::thread> threads;
  threads.reserve(block);
  for (unsigned t = 0; t < block; ++t) {
    threads.emplace_back([&, t] {
      threadIdx = {t, 0, 0};
      blockDim = {block, 1, 1};
      block_barrier = &barrier;
      my_warp = warps[t / 32].get();
      for (unsigned b = 0; b < grid; ++b) {
        blockIdx = {b, 0, 0};
        kernel(static_cast<Params>(args)...);
        barrier.arrive_and_wait();  // the block ends before the next begins (its __shared__ are reused)
      }
    });
  }
  for (auto& thread : threads) thread.join();
}

}  // namespace cuda_emulation

inline void __syncthreads() { cuda_emulation::block_barrier->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned mask, float v, int offset) {
  return cuda_emulation::shuffle_xor(mask, v, offset);
}
inline double __shfl_xor_sync(unsigned mask, double v, int offset) {
  return cuda_emulation::shuffle_xor(mask, v, offset);
}
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }
