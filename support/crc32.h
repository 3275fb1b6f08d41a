// CRC-32 (the zlib/PNG/zip polynomial, 0xEDB88320 reflected), for the checkpoint footer.
#pragma once

#include <cstdint>
#include <string_view>

namespace cpprun::detail {

// The CRC-32 of `bytes`; pass a previous result as `crc` to continue over more bytes.
std::uint32_t crc32(std::string_view bytes, std::uint32_t crc = 0);

}  // namespace cpprun::detail
