// The safetensors header's JSON read straight into its entries, with no generic JSON tree: the
// tree cost about 24 times the header (2.3 GB for a 95 MB header of tiny entries), and a file we
// read must not make us allocate far more than its size. See Note [Streaming safetensors header].
// No LibTorch.
#pragma once

#include <string>
#include <string_view>

#include "support/safetensors.h"

namespace cpprun::detail {

// The text of the CorruptCheckpointError for an invalid safetensors file: "cpprun: safetensors file
// PATH is invalid: WHY. Write it again, or use another file."
std::string invalid_safetensors_message(const std::string& path, const std::string& why);

// The header's tensors (in the header's order, each `data` a view into `data`) and metadata,
// checked as read_safetensors documents but for the tiling of the data section and the CRC: the
// JSON's syntax (at most 8 levels deep, no key twice in an object, nothing after it), the fields
// of each entry, its dtype, shape and data_offsets within `data` and agreeing with each other, and
// __metadata__'s values strings. `header` starts with '{' after JSON white space. Throws CorruptCheckpointError naming `path`.
SafetensorsFile parse_safetensors_header(std::string_view header, std::string_view data, const std::string& path);

}  // namespace cpprun::detail
