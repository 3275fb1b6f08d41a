// What cpprun's safetensors reader makes of each file named, one JSON line a file, for
// safetensors_header_interop.py to compare with Python's safetensors (Hugging Face's Rust reader):
//   {"file": F, "tensors": [[name, dtype, [shape...], begin, end], ...], "metadata": {k: v}}
//   {"file": F, "error": message}
// Usage: safetensors_header_dump FILE... No LibTorch.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>

#include "support/json.h"
#include "support/safetensors.h"

int main(int argc, char** argv) {
  using cpprun::detail::append_json_string;
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::string line = "{\"file\": ";
    append_json_string(line, argv[i]);
    try {
      const auto file = cpprun::detail::read_safetensors(bytes, argv[i]);
      const char* data = bytes.data() + bytes.size();  // the data section's start, found below
      for (const auto& t : file.tensors) {
        if (t.data.data() < data) data = t.data.data();
      }
      line += ", \"tensors\": [";
      for (std::size_t k = 0; k < file.tensors.size(); ++k) {
        const auto& t = file.tensors[k];
        line += k ? ", [" : "[";
        append_json_string(line, t.name);
        line += ", ";
        append_json_string(line, t.dtype);
        line += ", [";
        for (std::size_t d = 0; d < t.shape.size(); ++d) line += (d ? ", " : "") + std::to_string(t.shape[d]);
        line += "], " + std::to_string(t.data.data() - data) + ", " + std::to_string(t.data.data() - data + t.data.size()) + "]";
      }
      line += "], \"metadata\": {";
      bool first = true;
      for (const auto& [key, value] : file.metadata) {
        line += first ? "" : ", ";
        first = false;
        append_json_string(line, key);
        line += ": ";
        append_json_string(line, value);
      }
      line += "}}";
    } catch (const std::exception& e) {
      line += ", \"error\": ";
      append_json_string(line, e.what());
      line += "}";
    }
    std::cout << line << "\n";
  }
  return 0;
}
