// Python's torch.save format for a dict of tensors: a zip holding data.pkl (a protocol-2 pickle of
// an OrderedDict whose values are torch._utils._rebuild_tensor_v2 calls, storages referenced by
// persistent id; _rebuild_tensor_v3 over untyped bytes for the dtypes without a legacy storage
// class: uint16/32/64, float8) and data/<key> (each storage's raw little-endian bytes). torch.load(path) with its
// default weights_only=True returns what we write; we read what torch.save(model.state_dict())
// writes. Our own pickle reader: LibTorch's torch::pickle_load cannot read a Python state dict
// (the OrderedDict's BUILD of its _metadata), and it would run any global the file names.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cpprun::detail {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// The zip's bytes. Tensors may live on any device; they are written from CPU copies. Two names
// of one tensor (tied weights) share one storage, as torch.save writes them.
std::string encode_torch_save(const NamedTensors& tensors);

// The dict in a torch.save zip, in its order, on the CPU. Only what a weights_only load allows:
// dicts, tensors, storages, dtypes, plain values; any other global is refused. A view saved with
// its negation or conjugation pending (metadata {'neg': True}) comes back with it applied. Throws
// CorruptCheckpointError naming `path` when the bytes are not such a file, StateDictMismatchError
// when they are a sound torch.save file of something else (a checkpoint dict holding the state
// dict under a key, a whole module), saying how to save the state dict alone.
NamedTensors decode_torch_save(std::string_view bytes, const std::string& path);

// Whether `head` (a file's first bytes, 16 or more) starts as torch.save's format before PyTorch 1.6
// (_use_new_zipfile_serialization=False): a pickle of its magic number, in any pickle protocol.
bool is_legacy_torch_save(std::string_view head);

}  // namespace cpprun::detail
