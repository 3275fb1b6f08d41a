// cpprun::fused_cross_entropy's CUDA kernels (training/cross_entropy_rows.h). Not compiled by the
// build: CMake embeds this text in the library (Note [Kernels as text] in CMakeLists.txt), NVRTC
// compiles it at first use for the device at hand, with -DCE_DTYPE=0 (float32), 1 (float64), 2
// (bfloat16) or 3 (float16); tests/unit/cross_entropy_kernels_emulated.cpp compiles it as C++ on
// the CPU (CE_KERNEL defined there) and runs it against a float64 reference.
//
// One block a row. The forward keeps each thread's running maximum m and sum s of exp(x - m) over
// the columns it reads (rescaling s when m grows: the "online softmax"), then merges the block's
// pairs; the backward reads the row again and writes (exp(x - lse) - [j == target]) * scale.
// Where the row's start and length allow, each thread reads and writes 16 bytes at a time.
// No header is included: NVRTC provides the math functions and intrinsics used.
#ifndef CE_KERNEL
#define CE_KERNEL extern "C" __global__
#endif

typedef long long i64;
typedef unsigned short u16;

#if CE_DTYPE == 0
typedef float elem_t;
typedef float acc_t;
__device__ __forceinline__ acc_t load_acc(elem_t v) { return v; }
__device__ __forceinline__ elem_t store_elem(acc_t v) { return v; }
#elif CE_DTYPE == 1
typedef double elem_t;
typedef double acc_t;
__device__ __forceinline__ acc_t load_acc(elem_t v) { return v; }
__device__ __forceinline__ elem_t store_elem(acc_t v) { return v; }
#elif CE_DTYPE == 2
typedef u16 elem_t;  // bfloat16's bits
typedef float acc_t;
__device__ __forceinline__ acc_t load_acc(elem_t v) { return __uint_as_float(((unsigned int)v) << 16); }
__device__ __forceinline__ elem_t store_elem(acc_t v) {  // round to nearest even; a NaN stays a quiet NaN
  unsigned int u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (u16)(u >> 16);
}
#elif CE_DTYPE == 3
typedef u16 elem_t;  // float16's bits
typedef float acc_t;
__device__ __forceinline__ acc_t load_acc(elem_t v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
  return f;
}
__device__ __forceinline__ elem_t store_elem(acc_t v) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
  return h;
}
#else
#error "CE_DTYPE must be 0 (float32), 1 (float64), 2 (bfloat16) or 3 (float16)"
#endif

__device__ __forceinline__ float exp_acc(float x) { return expf(x); }
__device__ __forceinline__ double exp_acc(double x) { return exp(x); }
__device__ __forceinline__ float log_acc(float x) { return logf(x); }
__device__ __forceinline__ double log_acc(double x) { return log(x); }
__device__ __forceinline__ float negative_infinity(float) { return __int_as_float(0xff800000); }
__device__ __forceinline__ double negative_infinity(double) { return __longlong_as_double((i64)0xfff0000000000000ULL); }
__device__ __forceinline__ float quiet_nan(float) { return __int_as_float(0x7fc00000); }
__device__ __forceinline__ double quiet_nan(double) { return __longlong_as_double((i64)0x7ff8000000000000ULL); }

struct alignas(16) chunk_t { unsigned int words[4]; };
#define PER_CHUNK ((i64)(16 / sizeof(elem_t)))
union chunk_view {
  chunk_t raw;
  elem_t e[16 / sizeof(elem_t)];
};

// Adds x to a running (maximum m, sum s of exp(v - m)). A NaN makes s NaN; -inf adds nothing.
__device__ __forceinline__ void push(acc_t& m, acc_t& s, acc_t x) {
  if (x > m) {
    s = s * exp_acc(m - x) + (acc_t)1;
    m = x;
  } else if (x != negative_infinity(x)) {
    s += exp_acc(x - m);
  }
}

// Merges (m2, s2) into (m, s). A pair whose maximum is still -inf has s 0, or NaN from a NaN read.
__device__ __forceinline__ void merge(acc_t& m, acc_t& s, acc_t m2, acc_t s2) {
  if (m2 > m) {
    acc_t t = m; m = m2; m2 = t;
    t = s; s = s2; s2 = t;
  }
  if (m2 != negative_infinity(m2)) s += s2 * exp_acc(m2 - m);
  else s += s2;
}

__device__ __forceinline__ void warp_merge(acc_t& m, acc_t& s) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const acc_t m2 = __shfl_xor_sync(0xffffffffu, m, offset);
    const acc_t s2 = __shfl_xor_sync(0xffffffffu, s, offset);
    merge(m, s, m2, s2);
  }
}

// The block's (m, s), in thread 0. blockDim.x is a multiple of 32, at most 1024.
__device__ __forceinline__ void block_merge(acc_t& m, acc_t& s) {
  __shared__ acc_t warp_m[32];
  __shared__ acc_t warp_s[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  warp_merge(m, s);
  if (lane == 0) {
    warp_m[warp] = m;
    warp_s[warp] = s;
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x >> 5;
    m = lane < warps ? warp_m[lane] : negative_infinity(m);
    s = lane < warps ? warp_s[lane] : (acc_t)0;
    warp_merge(m, s);
  }
}

CE_KERNEL void cpprun_cross_entropy_rows(const elem_t* __restrict__ logits, const i64* __restrict__ target,
                                                     i64 columns, i64 row_stride, i64 ignore_index, int chunked,
                                                     acc_t* __restrict__ row_loss, acc_t* __restrict__ row_lse) {
  const i64 row = blockIdx.x;
  const elem_t* x = logits + row * row_stride;
  acc_t m = negative_infinity((acc_t)0);
  acc_t s = 0;
  i64 done = 0;
  if (chunked) {
    const chunk_t* chunks = (const chunk_t*)x;
    const i64 count = columns / PER_CHUNK;
    for (i64 c = threadIdx.x; c < count; c += blockDim.x) {
      chunk_view v;
      v.raw = chunks[c];
      for (int k = 0; k < PER_CHUNK; ++k) push(m, s, load_acc(v.e[k]));
    }
    done = count * PER_CHUNK;
  }
  for (i64 j = done + threadIdx.x; j < columns; j += blockDim.x) push(m, s, load_acc(x[j]));
  block_merge(m, s);
  if (threadIdx.x == 0) {
    const acc_t lse = m + log_acc(s);
    const i64 t = target[row];
    acc_t loss;
    if (t == ignore_index) loss = 0;
    else if (t < 0 || t >= columns) loss = quiet_nan(lse);
    else loss = lse - load_acc(x[t]);
    row_lse[row] = lse;
    row_loss[row] = loss;
  }
}

CE_KERNEL void cpprun_cross_entropy_grad(const elem_t* __restrict__ logits, const i64* __restrict__ target,
                                                     i64 columns, i64 row_stride, i64 ignore_index, int chunked,
                                                     const acc_t* __restrict__ row_lse,
                                                     const acc_t* __restrict__ row_scale, elem_t* __restrict__ grad) {
  const i64 row = blockIdx.x;
  const elem_t* x = logits + row * row_stride;
  elem_t* g = grad + row * columns;
  const i64 t = target[row];
  const acc_t lse = row_lse[row];
  acc_t scale = row_scale[row];
  if (t == ignore_index) scale = 0;
  else if (t < 0 || t >= columns) scale = quiet_nan(scale);
  i64 done = 0;
  if (chunked) {
    const chunk_t* in = (const chunk_t*)x;
    chunk_t* out = (chunk_t*)g;
    const i64 count = columns / PER_CHUNK;
    for (i64 c = threadIdx.x; c < count; c += blockDim.x) {
      chunk_view v, w;
      v.raw = in[c];
      for (int k = 0; k < PER_CHUNK; ++k) {
        acc_t p = exp_acc(load_acc(v.e[k]) - lse) * scale;
        if (c * PER_CHUNK + k == t) p -= scale;
        w.e[k] = store_elem(p);
      }
      out[c] = w.raw;
    }
    done = count * PER_CHUNK;
  }
  for (i64 j = done + threadIdx.x; j < columns; j += blockDim.x) {
    acc_t p = exp_acc(load_acc(x[j]) - lse) * scale;
    if (j == t) p -= scale;
    g[j] = store_elem(p);
  }
}

#undef PER_CHUNK
