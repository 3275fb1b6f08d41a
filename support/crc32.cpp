// See crc32.h. On x86-64 with PCLMULQDQ (every x86-64 server since 2010), carry-less
// multiplication folds 64 bytes a step (about 14 GB/s here); elsewhere, and for what is left over,
// slicing-by-8 (eight table lookups per 8 bytes, about 1.5 GB/s). A checkpoint's CRC is computed
// once by the writer and once by each reader, over every byte: at 1.5 GB/s it was a tenth of a
// load of 400 MB of optimizer state.
#include "support/crc32.h"

#include <array>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CPPRUN_CRC32_CLMUL 1
#endif

namespace cpprun::detail {
namespace {

using Tables = std::array<std::array<std::uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[0][i] = c;
  }
  for (std::uint32_t i = 0; i < 256; ++i) {
    for (std::size_t s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  }
  return t;
}

constexpr Tables kTables = make_tables();

#ifdef CPPRUN_CRC32_CLMUL
// Note [CRC-32 by carry-less multiplication]: Intel's "Fast CRC Computation for Generic Polynomials
// Using PCLMULQDQ Instruction" (Gopal et al., 2009), for the reflected polynomial 0xEDB88320: four
// 128-bit lanes, each folded 64 bytes ahead by multiplying with x^(512+32) and x^(512-32) mod P
// (k1, k2), then the lanes folded into one 16 bytes apart (k3, k4), 128 bits to 64 and 64 to 32
// (k5), and a Barrett reduction (P' and u). The constants are the paper's (the same as Linux's
// crc32-pclmul and zlib-ng's); unit.checkpoint_file checks the result against the table's over
// every length and alignment.
#define CPPRUN_CLMUL_TARGET __attribute__((target("pclmul,sse4.1")))

CPPRUN_CLMUL_TARGET inline __m128i load16(const unsigned char* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

CPPRUN_CLMUL_TARGET inline __m128i fold16(__m128i x, __m128i k, __m128i next) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}

// The register after `n` bytes (a multiple of 16, at least 64) from `crc` (already inverted).
CPPRUN_CLMUL_TARGET std::uint32_t crc32_clmul(const unsigned char* p, std::size_t n, std::uint32_t crc) {
  const __m128i k1k2 = _mm_set_epi64x(0x1c6e41596, 0x154442bd4);
  const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);
  const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124);
  const __m128i barrett = _mm_set_epi64x(0x1f7011641, 0x1db710641);  // u, P'
  const __m128i low32 = _mm_set_epi32(0, 0, 0, -1);
  __m128i x1 = _mm_xor_si128(load16(p), _mm_cvtsi32_si128(static_cast<int>(crc)));
  __m128i x2 = load16(p + 16), x3 = load16(p + 32), x4 = load16(p + 48);
  for (p += 64, n -= 64; n >= 64; p += 64, n -= 64) {
    x1 = fold16(x1, k1k2, load16(p));
    x2 = fold16(x2, k1k2, load16(p + 16));
    x3 = fold16(x3, k1k2, load16(p + 32));
    x4 = fold16(x4, k1k2, load16(p + 48));
  }
  x1 = fold16(fold16(fold16(x1, k3k4, x2), k3k4, x3), k3k4, x4);
  for (; n >= 16; p += 16, n -= 16) x1 = fold16(x1, k3k4, load16(p));
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x10), _mm_srli_si128(x1, 8));                    // 128 -> 64
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), k5, 0x00), _mm_srli_si128(x1, 4));  // 64 -> 32
  __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x1, low32), barrett, 0x10);
  t = _mm_clmulepi64_si128(_mm_and_si128(t, low32), barrett, 0x00);
  return static_cast<std::uint32_t>(_mm_extract_epi32(_mm_xor_si128(t, x1), 1));
}

bool has_clmul() {
  static const bool has = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return has;
}
#endif

// Note [Combining CRC-32s]
// The register (without the inversions at both ends) is a polynomial over GF(2) reduced mod P, and
// appending n bytes multiplies what came before by x^(8n) mod P; the inversions cancel, so
// crc(A B) = crc(A) * x^(8|B|) mod P  xor  crc(B). In the reflected form, bit 31 is the
// coefficient of x^0 and bit 0 that of x^31: multiplying by x shifts right, and a coefficient
// carried past x^31 folds back as P's low terms (0xEDB88320).
std::uint32_t multiply_mod_p(std::uint32_t a, std::uint32_t b) {
  std::uint32_t product = 0;
  for (int bit = 31; bit >= 0; --bit) {  // a's coefficient of x^(31 - bit), b holding b * x^(31 - bit)
    if ((a >> bit) & 1) product ^= b;
    b = (b & 1) ? (b >> 1) ^ 0xEDB88320u : b >> 1;
  }
  return product;
}

// x^(8 n) mod P, by squaring: O(log n) multiplications.
std::uint32_t x_to_8n_mod_p(std::uint64_t n) {
  std::uint32_t result = 0x80000000u;  // x^0
  std::uint32_t power = 0x00800000u;   // x^8
  for (; n != 0; n >>= 1) {
    if (n & 1) result = multiply_mod_p(result, power);
    power = multiply_mod_p(power, power);
  }
  return result;
}

}  // namespace

std::uint32_t crc32_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t length_b) {
  return multiply_mod_p(crc_a, x_to_8n_mod_p(length_b)) ^ crc_b;
}

std::uint32_t crc32(std::string_view bytes, std::uint32_t crc) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  std::size_t n = bytes.size();
  crc = ~crc;
#ifdef CPPRUN_CRC32_CLMUL
  if (n >= 64 && has_clmul()) {
    const std::size_t folded = n & ~std::size_t{15};
    crc = crc32_clmul(p, folded, crc);
    p += folded;
    n -= folded;
  }
#endif
  for (; n >= 8; p += 8, n -= 8) {
    // Little-endian assembly of the next 8 bytes, whatever the host's byte order.
    const std::uint32_t lo = crc ^ (p[0] | p[1] << 8 | p[2] << 16 | static_cast<std::uint32_t>(p[3]) << 24);
    const std::uint32_t hi = p[4] | p[5] << 8 | p[6] << 16 | static_cast<std::uint32_t>(p[7]) << 24;
    crc = kTables[7][lo & 0xFF] ^ kTables[6][(lo >> 8) & 0xFF] ^ kTables[5][(lo >> 16) & 0xFF] ^ kTables[4][lo >> 24] ^
          kTables[3][hi & 0xFF] ^ kTables[2][(hi >> 8) & 0xFF] ^ kTables[1][(hi >> 16) & 0xFF] ^ kTables[0][hi >> 24];
  }
  for (; n > 0; ++p, --n) crc = kTables[0][(crc ^ *p) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

}  // namespace cpprun::detail

#undef CPPRUN_CLMUL_TARGET
#undef CPPRUN_CRC32_CLMUL
