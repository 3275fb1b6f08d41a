// fused_cross_entropy's CUDA kernels (training/cross_entropy_kernels.cuh, the very text NVRTC
// compiles) compiled as C++ and run on the CPU under tests/unit/cuda_emulation.h, against a float64
// log-sum-exp written from its definition: float32, float64 and bfloat16 logits (float16's two
// conversions are PTX, compiled in unit but not run here); rows of 3 to 4,099 classes, blocks of
// 128 and 512 threads, rows read 16 bytes at a time and one element at a time, rows that do not
// follow each other (a stride), ignored and out-of-range targets, rows holding -inf, all -inf, a
// NaN. The arguments go in with the host's types (training/cross_entropy_rows_cuda.cpp). Exit 1
// with a MISMATCH line per wrong value (the first 40).
#include "cuda_emulation.h"

#define CE_KERNEL static  // each dtype's kernels in a namespace of their own

namespace f32 {
#define CE_DTYPE 0
#include "training/cross_entropy_kernels.cuh"
#undef CE_DTYPE
}  // namespace f32
namespace f64 {
#define CE_DTYPE 1
#include "training/cross_entropy_kernels.cuh"
#undef CE_DTYPE
}  // namespace f64
namespace bf16 {
#define CE_DTYPE 2
#include "training/cross_entropy_kernels.cuh"
#undef CE_DTYPE
}  // namespace bf16

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <new>
#include <random>
#include <string>

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();
constexpr long long kIgnore = -100;

long failures = 0, checks = 0;
// Per dtype (0 float32, 1 float64, 2 bfloat16), the largest share of its bound a finite difference
// used: the loss and lse's, the gradient's. The bounds are set by reasoning; these measure them.
double most_used[3][2] = {};

// Both NaN, or the same infinity, or both finite (the caller then compares them).
bool alike(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return true;
}

// Whether `got` is `want`: both NaN, the same infinity, or finite and within `bound`; counts the
// share of the bound a finite difference used (`which`: 0 the loss and lse, 1 the gradient).
bool within(int dtype, int which, double got, double want, double bound) {
  if (!alike(got, want)) return false;
  if (!std::isfinite(want)) return true;
  const double difference = std::fabs(got - want);
  if (bound > 0) most_used[dtype][which] = std::max(most_used[dtype][which], difference / bound);
  return difference <= bound;
}

// bfloat16 by its definition: float32's top 16 bits, rounded to nearest even.
uint16_t to_bf16(float f) {
  if (std::isnan(f)) return 0x7fc0;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
double from_bf16(uint16_t b) {
  const uint32_t u = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// What each dtype's kernels take, and how the test writes and reads their elements.
template <int Dtype>
struct Kind;
template <>
struct Kind<0> {
  using elem = float;
  using acc = float;
  static constexpr const char* name = "float32";
  static constexpr auto forward = &f32::cpprun_cross_entropy_rows;
  static constexpr auto backward = &f32::cpprun_cross_entropy_grad;
  static elem put(double v) { return static_cast<float>(v); }
  static double get(elem e) { return e; }
};
template <>
struct Kind<1> {
  using elem = double;
  using acc = double;
  static constexpr const char* name = "float64";
  static constexpr auto forward = &f64::cpprun_cross_entropy_rows;
  static constexpr auto backward = &f64::cpprun_cross_entropy_grad;
  static elem put(double v) { return v; }
  static double get(elem e) { return e; }
};
template <>
struct Kind<2> {
  using elem = uint16_t;
  using acc = float;
  static constexpr const char* name = "bfloat16";
  static constexpr auto forward = &bf16::cpprun_cross_entropy_rows;
  static constexpr auto backward = &bf16::cpprun_cross_entropy_grad;
  static elem put(double v) { return to_bf16(static_cast<float>(v)); }
  static double get(elem e) { return from_bf16(e); }
};

// 16-byte aligned and of the exact size, as the CUDA allocator's blocks start.
template <typename T>
struct Buffer {
  explicit Buffer(size_t n) : data(static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(16)))) {}
  ~Buffer() { ::operator delete(data, std::align_val_t(16)); }
  T* data;
};

void mismatch(const std::string& where, const char* what, long row, long column, double got, double want) {
  if (++failures <= 40) {
    std::printf("MISMATCH %s: %s row %ld column %ld: got %.17g, want %.17g\n", where.c_str(), what, row, column, got,
                want);
  }
}

double reference_lse(const std::vector<double>& row) {
  double m = -kInf;
  for (double v : row) {
    if (std::isnan(v)) return kNaN;
    m = std::max(m, v);
  }
  if (m == -kInf) return -kInf;
  long double sum = 0;
  for (double v : row) sum += std::exp(static_cast<long double>(v) - m);
  return m + std::log(static_cast<double>(sum));
}

struct Case {
  long rows, columns, stride;
  unsigned block;
  int chunked, scenario;
};

template <int Dtype>
void run_case(const Case& c, std::mt19937_64& rng) {
  using K = Kind<Dtype>;
  using Elem = typename K::elem;
  using Acc = typename K::acc;
  const std::string where = std::string(K::name) + " rows " + std::to_string(c.rows) + " columns " +
                            std::to_string(c.columns) + " stride " + std::to_string(c.stride) + " block " +
                            std::to_string(c.block) + " chunked " + std::to_string(c.chunked) + " scenario " +
                            std::to_string(c.scenario);
  const long rows = c.rows, columns = c.columns, stride = c.stride;
  Buffer<Elem> x(static_cast<size_t>((rows - 1) * stride + columns));
  for (long i = 0; i < (rows - 1) * stride + columns; ++i) x.data[i] = K::put(1234.5);  // between rows: never read
  std::normal_distribution<double> normal(0.0, 3.0);
  std::vector<std::vector<double>> values(rows, std::vector<double>(columns));
  Buffer<long long> target(rows);
  Buffer<Acc> scale(rows), loss(rows), lse(rows);
  for (long r = 0; r < rows; ++r) {
    const int contents = static_cast<int>((r + c.scenario) % 4);  // plain, some -inf, all -inf, one NaN
    for (long j = 0; j < columns; ++j) {
      double v = normal(rng) + (r % 2 ? 5.0 : -2.0);
      if ((contents == 1 && j % 3 == 1) || contents == 2) v = -kInf;
      if (contents == 3 && j == columns / 2) v = kNaN;
      x.data[r * stride + j] = K::put(v);
      values[r][j] = K::get(x.data[r * stride + j]);
    }
    long long t = 0;
    switch ((r * 2 + c.scenario) % 6) {
      case 0: t = 0; break;
      case 1: t = kIgnore; break;
      case 2: t = columns - 1; break;
      case 3: t = columns; break;  // out of range
      case 4: t = columns / 2; break;
      default: t = r % 2 ? -1 : static_cast<long long>(rng() % columns); break;  // -1: out of range
    }
    if (contents == 1 && t >= 0 && t < columns && std::isinf(values[r][t])) t = (t + 1) % columns;
    target.data[r] = t;
    scale.data[r] = static_cast<Acc>(r % 3 == 2 ? -0.75 : 0.5 + 0.25 * r);
    loss.data[r] = lse.data[r] = static_cast<Acc>(777);
  }
  Buffer<Elem> grad(static_cast<size_t>(rows * columns));
  for (long i = 0; i < rows * columns; ++i) grad.data[i] = K::put(999.0);

  // The host's argument types: pointers, int64_t columns, row stride and ignore_index, int chunked.
  const int64_t columns64 = columns, stride64 = stride, ignore64 = kIgnore;
  cuda_emulation::launch(K::forward, static_cast<unsigned>(rows), c.block, static_cast<const Elem*>(x.data),
                         static_cast<const long long*>(target.data), columns64, stride64, ignore64, c.chunked,
                         loss.data, lse.data);
  cuda_emulation::launch(K::backward, static_cast<unsigned>(rows), c.block, static_cast<const Elem*>(x.data),
                         static_cast<const long long*>(target.data), columns64, stride64, ignore64, c.chunked,
                         static_cast<const Acc*>(lse.data), static_cast<const Acc*>(scale.data), grad.data);

  const double loss_tolerance = Dtype == 1 ? 1e-12 : Dtype == 0 ? 1e-5 : 1e-6;
  for (long r = 0; r < rows; ++r) {
    const double want_lse = reference_lse(values[r]);
    const long long t = target.data[r];
    const bool ignored = t == kIgnore, outside = !ignored && (t < 0 || t >= columns);
    const double want_loss = ignored ? 0.0 : outside ? kNaN : want_lse - values[r][t];
    const double size = std::max({1.0, std::fabs(want_lse), std::fabs(want_loss)});
    checks += 2;
    if (!within(Dtype, 0, lse.data[r], want_lse, loss_tolerance * size)) {
      mismatch(where, "lse", r, -1, lse.data[r], want_lse);
    }
    if (!within(Dtype, 0, loss.data[r], want_loss, loss_tolerance * size)) {
      mismatch(where, "loss", r, -1, loss.data[r], want_loss);
    }
    const double s = ignored ? 0.0 : outside ? kNaN : static_cast<double>(scale.data[r]);
    for (long j = 0; j < columns; ++j) {
      const double want = (std::exp(values[r][j] - want_lse) - (j == t ? 1.0 : 0.0)) * s;
      const double got = K::get(grad.data[r * columns + j]);
      ++checks;
      bool ok;
      if (Dtype == 2) {  // within one bfloat16 unit in the last place of the reference rounded to it
        const double rounded = from_bf16(to_bf16(static_cast<float>(want)));
        int exponent = 0;  // the unit counts only where both are finite
        std::frexp(std::max(std::fabs(got), std::fabs(rounded)), &exponent);
        ok = within(Dtype, 1, got, rounded, std::ldexp(1.0, std::max(exponent - 1, -126) - 7));
      } else {
        const double relative = Dtype == 0 ? 1e-5 : 1e-12;
        const double absolute = (Dtype == 0 ? 1e-6 : 1e-15) * (std::isfinite(s) ? std::fabs(s) : 0.0);
        ok = within(Dtype, 1, got, want, relative * std::fabs(want) + absolute);
      }
      if (!ok) mismatch(where, "gradient", r, j, got, want);
    }
  }
}

template <int Dtype>
long run_all() {
  using Elem = typename Kind<Dtype>::elem;
  std::mt19937_64 rng(12345 + Dtype);
  const long per_chunk = 16 / static_cast<long>(sizeof(Elem));
  long cases = 0;
  for (auto [rows, columns] : {std::pair<long, long>{5, 3}, {6, 117}, {4, 1000}, {3, 4099}, {3, 4096}, {2, 8}}) {
    for (unsigned block : {128u, 512u}) {
      if (block == 512 && columns < 1000) continue;  // threads with nothing to read: 128 shows it
      for (int strided = 0; strided < 2; ++strided) {
        // A stride that keeps rows 16-byte aligned where their length allows, else one that does not.
        const long stride = strided ? (columns % per_chunk == 0 ? columns + per_chunk : columns + 5) : columns;
        // The host reads 16 bytes at a time only where the row's start and length allow it.
        const bool chunkable = (stride * static_cast<long>(sizeof(Elem))) % 16 == 0 &&
                               (columns * static_cast<long>(sizeof(Elem))) % 16 == 0;
        for (int chunked = 0; chunked <= (chunkable ? 1 : 0); ++chunked) {
          for (int scenario = 0; scenario < 2; ++scenario) {
            run_case<Dtype>({rows, columns, stride, block, chunked, scenario}, rng);
            ++cases;
          }
        }
      }
    }
  }
  return cases;
}

}  // namespace

int main() {
  const long cases = run_all<0>() + run_all<1>() + run_all<2>();
  std::printf("cross_entropy_kernels_emulated: %ld cases, %ld values checked, %ld mismatches\n", cases, checks,
              failures);
  const char* names[3] = {Kind<0>::name, Kind<1>::name, Kind<2>::name};
  for (int dtype = 0; dtype < 3; ++dtype) {
    std::printf("  %s: the most of its bound a difference used: loss and lse %.3g, gradient %.3g\n", names[dtype],
                most_used[dtype][0], most_used[dtype][1]);
  }
  return failures == 0 ? 0 : 1;
}
