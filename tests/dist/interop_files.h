// What the PyTorch-parity probes (tp_, pipeline_, syncbn_pytorch_parity, powersgd_parity) share
// with their Python side: named tensors in safetensors files, read by name and written whole.
#pragma once

#include <map>
#include <string>

#include "checkpoint/state_dict.h"
#include "cpprun/atomic_file.h"

namespace interop {

inline std::map<std::string, at::Tensor> read_tensors(const std::string& path) {
  std::map<std::string, at::Tensor> out;
  for (auto& [name, tensor] : cpprun::detail::read_state_dict_file(path)) out[name] = tensor;
  return out;
}

inline void write_tensors(const std::string& path, const cpprun::detail::NamedTensors& tensors) {
  cpprun::write_file_atomically(path, cpprun::detail::encode_state_dict(tensors, path));
}

}  // namespace interop
