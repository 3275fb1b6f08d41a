// CRC-32 (the zlib/PNG/zip polynomial, 0xEDB88320 reflected), for the checkpoint footer.
#pragma once

#include <cstdint>
#include <string_view>

namespace cpprun::detail {

// The CRC-32 of `bytes`; pass a previous result as `crc` to continue over more bytes.
std::uint32_t crc32(std::string_view bytes, std::uint32_t crc = 0);

// The CRC-32 of A followed by B, from A's CRC, B's CRC and B's length: what a file's CRC is when
// its parts are written and checksummed by several processes (checkpoint/rows_in_place.h).
std::uint32_t crc32_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t length_b);

}  // namespace cpprun::detail
