// See state_dict.h.
#include "checkpoint/state_dict.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <string_view>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>
#include <unordered_set>

#include "core/failure_agreement.h"
#include "cpprun/atomic_file.h"
#include "cpprun/checkpoint_file.h"
#include "cpprun/collectives.h"
#include "cpprun/detail/replaced_files.h"
#include "cpprun/object_collectives.h"
#include "cpprun/state_dict.h"
#include "checkpoint/sharded_state_dict.h"
#include "support/crc32.h"
#include "support/file_read.h"
#include "support/safetensors_index.h"
#include "support/safetensors.h"
#include "support/torch_save_file.h"

namespace cpprun::detail {
namespace {

enum class StateDictFormat { kSafetensors, kTorchSave };

// The format PATH's extension names, if it names one.
std::optional<StateDictFormat> format_named_by(const std::string& path) {
  std::string ext = path.substr(std::min(path.size(), path.find_last_of('.')));
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  if (ext == ".safetensors") return StateDictFormat::kSafetensors;
  // .bin: transformers' pytorch_model.bin, a torch.save file.
  if (ext == ".pt" || ext == ".pth" || ext == ".bin") return StateDictFormat::kTorchSave;
  return std::nullopt;
}

// The format a save writes: the extension's, as nothing else says which (a load reads any name).
StateDictFormat format_of(const std::string& path) {
  const auto format = format_named_by(path);
  TORCH_CHECK(format, "cpprun: cannot tell which format to save \"", path, "\" in from its name: a name ending in "
              ".safetensors writes Hugging Face's safetensors, one ending in .pt, .pth or .bin torch.save's dict of "
              "tensors, one ending in '/' a directory in Hugging Face's sharded layout. (Loading takes any name: "
              "it tells the format from the file's first bytes.)");
  return *format;
}

// Note [A file's format from its first bytes]
// torch.save and torch.load take any name (ImageNet's example saves checkpoint.pth.tar, Lightning
// model.ckpt), so a load looks at the bytes: a zip archive ("PK\3\4") is torch.save's format, and
// torch.save's pre-1.6 pickle starts with its magic number; safetensors starts with its header's
// length (8 bytes, little-endian) and the header's '{', after any JSON white space (the reference
// reader's serde_json skips it). A length past the file's end is still safetensors, cut short: its
// reader says so. A file that is neither (a damaged one) is read as its extension says, so its
// error is that format's; with no known extension either, it is refused, saying what its bytes are not.
std::optional<StateDictFormat> format_of_bytes(const FileHead& head) {
  const std::string_view bytes = head.bytes;
  if (bytes.substr(0, 4) == std::string_view("PK\x03\x04", 4)) return StateDictFormat::kTorchSave;
  if (is_legacy_torch_save(bytes)) return StateDictFormat::kTorchSave;  // its reader names the format
  const std::size_t brace = bytes.size() > 8 ? bytes.find_first_not_of(" \t\n\r", 8) : std::string_view::npos;
  if (brace != std::string_view::npos && bytes[brace] == '{') {
    std::uint64_t length = 0;
    for (int i = 7; i >= 0; --i) length = length << 8 | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
    if (length <= kMaxSafetensorsHeaderBytes) return StateDictFormat::kSafetensors;  // else a text with a '{'
  }
  return std::nullopt;
}

// A file of PyTorch's torch.distributed.checkpoint (dcp.save writes DIR/.metadata and
// DIR/__R_0.distcp): not something load_state_dict reads, but scripts/dcp_convert.py converts it.
bool is_dcp_checkpoint_file(const std::string& path) {
  const std::string name = std::filesystem::path(path).filename().string();
  return name == ".metadata" || (name.size() > 7 && name.compare(name.size() - 7, 7, ".distcp") == 0);
}

StateDictFormat format_to_read(const std::string& path) {
  std::error_code ignored;
  if (!std::filesystem::exists(path, ignored) && !std::filesystem::is_symlink(path, ignored)) {
    throw std::system_error(std::make_error_code(std::errc::no_such_file_or_directory),
                            "cpprun: load_state_dict: " + path + " does not exist");
  }
  if (is_dcp_checkpoint_file(path)) {
    throw StateDictMismatchError("cpprun: load_state_dict: " + path + " is a file of a PyTorch "
                                 "torch.distributed.checkpoint (DCP) directory, which cpprun does not read. Convert "
                                 "the directory once: python scripts/dcp_convert.py to-cpprun " +
                                 std::filesystem::path(path).parent_path().string() + " OUT_DIR, then load OUT_DIR/.");
  }
  const FileHead head = read_file_head(path, "state dict", 64);  // refuses a FIFO, a device, a directory
  if (const auto format = format_of_bytes(head)) return *format;
  if (const auto format = format_named_by(path)) return *format;
  throw CorruptCheckpointError("cpprun: load_state_dict: " + path + " (" + std::to_string(head.size) +
                               " bytes) is neither torch.save's format (a zip archive) nor safetensors (an 8-byte "
                               "header length, then '{'): which program wrote it? Save the model's state dict with "
                               "torch.save(model.state_dict(), path) or safetensors.torch.save_file.");
}

// safetensors' dtype names for ours.
constexpr std::pair<at::ScalarType, const char*> kSafetensorsDtypes[] = {
    {at::kFloat, "F32"},  {at::kDouble, "F64"}, {at::kHalf, "F16"},  {at::kBFloat16, "BF16"},
    {at::kLong, "I64"},   {at::kInt, "I32"},    {at::kShort, "I16"}, {at::kChar, "I8"},
    {at::kByte, "U8"},    {at::kBool, "BOOL"},  {at::kFloat8_e4m3fn, "F8_E4M3"}, {at::kFloat8_e5m2, "F8_E5M2"},
    {at::kUInt16, "U16"}, {at::kUInt32, "U32"}, {at::kUInt64, "U64"}, {at::kFloat8_e4m3fnuz, "F8_E4M3FNUZ"},
    {at::kFloat8_e5m2fnuz, "F8_E5M2FNUZ"}, {at::kFloat8_e8m0fnu, "F8_E8M0"}, {at::kComplexFloat, "C64"}};

// PyTorch's spelling of a dtype (torch.float32), for messages.
std::string dtype_name(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    default: return c10::toString(type);
  }
}

std::string tensor_description(const at::Tensor& t) {
  std::ostringstream out;
  out << dtype_name(t.scalar_type()) << " " << t.sizes();
  return out.str();
}

std::string join_keys(const std::vector<std::string>& items, const std::string& separator) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? separator : "") + items[i];
  return out;
}

// join_keys for a message: the first 50, then how many more (a crafted file of a million names
// must not make a message of hundreds of megabytes).
std::string join_shown(const std::vector<std::string>& items, const std::string& separator) {
  constexpr std::size_t kShown = 50;
  if (items.size() <= kShown) return join_keys(items, separator);
  return join_keys(std::vector<std::string>(items.begin(), items.begin() + kShown), separator) + separator +
         "... and " + std::to_string(items.size() - kShown) + " more";
}

}  // namespace

// Note [A prefix all names share]
// torch.save(ddp_model.state_dict()) names every tensor "module.<name>" (DDP holds the model as
// its child "module"), a torch.compile'd model "_orig_mod.<name>", a Lightning module's
// "model.<name>": each name the module lacks is one of its own with a prefix before it. The reverse
// is a submodule's file (a base model's) into a model holding it. Listing both sets of names and
// suggesting strict(false), which would load nothing, does not help: the prefix is found instead
// (the shortest whole-segment prefix that all names the one side lacks share, which taken away
// leaves names the other side lacks) and the option that fixes it is the hint's first line.
namespace {

// Whether every name of `prefixed` is P + a name of `plain`, for P a whole-segment prefix that all
// of `prefixed` share: the shortest such P, or empty.
std::string prefix_over(const std::vector<std::string>& prefixed, const std::vector<std::string>& plain) {
  if (prefixed.empty() || plain.empty()) return {};
  std::string common = prefixed.front();
  for (const auto& name : prefixed) {
    std::size_t n = 0;
    while (n < common.size() && n < name.size() && common[n] == name[n]) ++n;
    common.resize(n);
  }
  const std::set<std::string> others(plain.begin(), plain.end());
  for (std::size_t dot = common.find('.'); dot != std::string::npos; dot = common.find('.', dot + 1)) {
    const std::string prefix = common.substr(0, dot + 1);
    const bool all = std::all_of(prefixed.begin(), prefixed.end(),
                                 [&](const std::string& name) { return others.count(name.substr(prefix.size())) > 0; });
    if (all) return prefix;
  }
  return {};
}

}  // namespace

PrefixFix prefix_fix(const StateDictLoadReport& report) {
  if (auto prefix = prefix_over(report.unexpected_keys, report.missing_keys); !prefix.empty()) {
    return {std::move(prefix), true};
  }
  return {prefix_over(report.missing_keys, report.unexpected_keys), false};
}

namespace {

// The dtypes of mismatched items that differ in dtype alone ("NAME: file bfloat16 [4, 3], module
// float32 [4, 3]", compare_state's form, a directory's " (in FILE)" after it), as "file bfloat16,
// module float32" once each; empty when any item differs in shape, or cannot be read so.
std::set<std::string> dtype_only_differences(const std::vector<std::string>& mismatched) {
  std::set<std::string> pairs;
  for (const auto& item : mismatched) {
    const std::size_t file = item.rfind(": file ");
    if (file == std::string::npos) return {};
    std::string rest = item.substr(file + 7);
    if (const std::size_t in = rest.find(" (in "); in != std::string::npos) rest.resize(in);
    const std::size_t module = rest.find(", module ");
    if (module == std::string::npos) return {};
    const std::string ours = rest.substr(0, module), theirs = rest.substr(module + 9);
    const std::size_t a = ours.find(' '), b = theirs.find(' ');
    if (a == std::string::npos || b == std::string::npos || ours.substr(a) != theirs.substr(b)) return {};
    pairs.insert("file " + ours.substr(0, a) + ", module " + theirs.substr(0, b));
  }
  return pairs;
}

}  // namespace

// `file_of`: a directory's tensors -> their files, added to each unexpected or mismatched name.
std::string mismatch_message(const StateDictLoadReport& report, const std::string& path,
                             const std::map<std::string, std::string>& file_of) {
  const auto located = [&](const std::vector<std::string>& items, bool name_ends_at_colon) {
    if (file_of.empty()) return items;
    std::vector<std::string> out;
    for (const auto& item : items) {
      const auto found = file_of.find(name_ends_at_colon ? item.substr(0, item.find(": ")) : item);
      out.push_back(found == file_of.end() ? item : item + " (in " + found->second + ")");
    }
    return out;
  };
  const bool directory = !file_of.empty();
  std::string message = "cpprun: load_state_dict refused " + path +
                        ": its tensors do not match the module's, and nothing was loaded.";
  if (!report.missing_keys.empty()) {
    message += std::string("\n  missing from the ") + (directory ? "index and its files" : "file") + " (" +
               std::to_string(report.missing_keys.size()) + "): " + join_shown(report.missing_keys, ", ");
  }
  if (!report.unexpected_keys.empty()) {
    message += std::string("\n  in the ") + (directory ? "files" : "file") + " but not in the module (" +
               std::to_string(report.unexpected_keys.size()) +
               "): " + join_shown(located(report.unexpected_keys, false), ", ");
  }
  if (!report.mismatched.empty()) {
    message += "\n  shape or dtype differs (" + std::to_string(report.mismatched.size()) + "):\n    " +
               join_shown(located(report.mismatched, true), "\n    ");
  }
  // See Note [A prefix all names share]: the hint's first line.
  const PrefixFix fix = prefix_fix(report);
  if (!fix.prefix.empty() && fix.file_has_it) {
    message += "\nEvery name the file holds and the module lacks is one of the module's with \"" + fix.prefix +
               "\" before it (torch.save(" +
               "ddp_model.state_dict()) writes DDP's \"module.\", a torch.compile'd model \"_orig_mod.\"): load it "
               "with StateDictOptions().consume_prefix_in_state_dict_if_present(\"" + fix.prefix + "\"), as "
               "PyTorch's torch.nn.modules.utils.consume_prefix_in_state_dict_if_present.";
  } else if (!fix.prefix.empty()) {
    message += "\nEvery name the module holds and the file lacks is one of the file's with \"" + fix.prefix +
               "\" before it (a "
               "submodule's file, as a base model's for a model with a head): load it with "
               "StateDictOptions().file_key_prefix(\"" + fix.prefix + "\").";
  }
  // LibTorch's Module::to(dtype) converts every buffer, where Python's .double() / .to(dtype) leave
  // integer ones alone: BatchNorm's num_batches_tracked then no longer matches any file of the model.
  const bool integer_buffer_converted =
      std::any_of(report.mismatched.begin(), report.mismatched.end(), [](const std::string& item) {
        return item.find("num_batches_tracked: file int64") != std::string::npos;
      });
  if (integer_buffer_converted) {
    message += "\nnum_batches_tracked is int64 in the file: LibTorch's module->to(dtype) converted it with the "
               "floating-point tensors (Python's .to(dtype) leaves integer buffers alone). Build the model in "
               "that dtype instead (torch::set_default_dtype before constructing it), or convert only the "
               "floating-point parameters and buffers.";
  }
  if (!fix.prefix.empty()) return message;  // strict(false) would load nothing
  // Another dtype alone (a bfloat16 export for a float32 model): strict(false) would load none of
  // them either, so the hint says how to convert instead (PyTorch's load_state_dict casts).
  const std::set<std::string> dtypes = dtype_only_differences(report.mismatched);
  if (!dtypes.empty() && !integer_buffer_converted && report.missing_keys.empty() && report.unexpected_keys.empty()) {
    std::string pairs;
    for (const auto& pair : dtypes) pairs += (pairs.empty() ? "" : "; ") + pair;
    return message + "\nEvery difference is of dtype alone (" + pairs + "). PyTorch's load_state_dict would "
           "convert them; cpprun refuses, as another dtype is more often another model's file. To load it "
           "converted: write the file in the module's dtype (PyTorch: {k: v.to(dtype) for k, v in "
           "sd.items()}), or build the module in the file's dtype (torch::set_default_dtype before constructing "
           "it), load, then convert its floating-point tensors. strict(false) would leave these as they are.";
  }
  return message + "\nIs it another model's file? To load only what fits, pass StateDictOptions().strict(false).";
}

// Lists split by '\x01', items by '\0'.
std::string encode_report(const StateDictLoadReport& report) {
  const std::string nul(1, '\0');
  return join_keys(report.missing_keys, nul) + '\x01' + join_keys(report.unexpected_keys, nul) + '\x01' +
         join_keys(report.mismatched, nul);
}
std::string describe_report(const StateDictLoadReport& report) {
  const auto list = [](const std::vector<std::string>& names) { return "[" + join_shown(names, ", ") + "]"; };
  return "missing " + list(report.missing_keys) + ", unexpected " + list(report.unexpected_keys) + ", mismatched " +
         list(report.mismatched);
}
StateDictLoadReport decode_report(const std::string& bytes) {
  std::vector<std::vector<std::string>> lists(1);
  std::string item;
  bool has_item = false;
  for (const char c : bytes) {
    if (c == '\x01' || c == '\0') {
      if (has_item) lists.back().push_back(item);
      item.clear();
      has_item = false;
      if (c == '\x01') lists.emplace_back();
    } else {
      item.push_back(c);
      has_item = true;
    }
  }
  if (has_item) lists.back().push_back(item);
  TORCH_INTERNAL_ASSERT(lists.size() == 3, "a state dict load report arrived garbled");
  return {lists[0], lists[1], lists[2]};
}

namespace {

// Note [State dict order]: Python's Module.state_dict() goes module by module, depth first
// (torch/nn/modules/module.py state_dict, _save_to_state_dict): each module's own parameters,
// then its own buffers, then its children's in registration order. LibTorch's named_parameters()
// and named_buffers() each walk the tree alike, so all parameters then all buffers put a
// BatchNorm's running_mean after every later layer's weight, where PyTorch's files have it
// beside its weight.
void add_module_state(const torch::nn::Module& module, const std::string& prefix, NamedTensors& out) {
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    if (item.value().defined()) out.emplace_back(prefix + item.key(), item.value());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/false)) {
    if (item.value().defined()) out.emplace_back(prefix + item.key(), item.value());
  }
  for (const auto& child : module.named_children()) add_module_state(*child.value(), prefix + child.key() + ".", out);
}

}  // namespace

NamedTensors module_state(torch::nn::Module& module) {
  NamedTensors out;
  add_module_state(module, "", out);
  return out;
}

StateDictLoadReport compare_state(const NamedTensors& module, const NamedTensors& file) {
  std::map<std::string, const at::Tensor*> in_file;
  for (const auto& [name, tensor] : file) in_file[name] = &tensor;
  std::map<std::string, bool> in_module;
  StateDictLoadReport report;
  for (const auto& [name, tensor] : module) {
    in_module[name] = true;
    const auto found = in_file.find(name);
    if (found == in_file.end()) {
      report.missing_keys.push_back(name);
    } else if (found->second->sizes() != tensor.sizes() || found->second->scalar_type() != tensor.scalar_type()) {
      report.mismatched.push_back(name + ": file " + tensor_description(*found->second) + ", module " +
                                  tensor_description(tensor));
    }
  }
  for (const auto& [name, tensor] : file) {
    if (!in_module.count(name)) report.unexpected_keys.push_back(name);
  }
  // Sorted, so that a message reads the same whichever order the file keeps.
  for (auto* list : {&report.missing_keys, &report.unexpected_keys, &report.mismatched}) {
    std::sort(list->begin(), list->end());
  }
  return report;
}

std::string read_state_dict_bytes(const std::string& path) { return read_regular_file(path, "state dict"); }

namespace {

const char* safetensors_dtype_of(const std::string& name, const at::Tensor& tensor) {
  for (const auto& [type, text] : kSafetensorsDtypes) {
    if (type == tensor.scalar_type()) return text;
  }
  TORCH_CHECK(false, "cpprun: cannot write tensor \"", name, "\" of dtype ", tensor.scalar_type(),
              " to a safetensors file (the format has no name for it).");
}

}  // namespace

SafetensorsLayout safetensors_layout_of(const NamedTensors& tensors, std::map<std::string, std::string> metadata) {
  std::vector<SafetensorsEntry> entries;
  entries.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    entries.push_back({name, safetensors_dtype_of(name, tensor), tensor.sizes().vec(),
                       static_cast<std::uint64_t>(tensor.numel()) * tensor.element_size()});
  }
  metadata["format"] = "pt";  // as encode_safetensors
  return safetensors_layout(std::move(entries), std::move(metadata));
}

std::string encode_safetensors(const NamedTensors& tensors, std::map<std::string, std::string> metadata) {
  std::vector<at::Tensor> cpu;  // keeps the bytes alive while written
  cpu.reserve(tensors.size());
  std::vector<SafetensorsTensor> entries;
  for (const auto& [name, tensor] : tensors) {
    const char* dtype = safetensors_dtype_of(name, tensor);
    cpu.push_back(tensor.detach().to(at::kCPU).contiguous());
    entries.push_back({name, dtype, cpu.back().sizes().vec(),
                       std::string_view(static_cast<const char*>(cpu.back().data_ptr()), cpu.back().nbytes())});
  }
  metadata["format"] = "pt";  // what transformers looks for
  return write_safetensors(std::move(entries), std::move(metadata));
}

void write_safetensors_file(const std::string& path, const NamedTensors& tensors,
                            std::map<std::string, std::string> metadata) {
  std::vector<at::Tensor> cpu;  // the bytes written: the tensors themselves where they can be
  cpu.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) cpu.push_back(tensor.detach().to(at::kCPU).contiguous());
  std::map<std::string_view, std::string_view> data_of;  // by name: the CRC's order
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    data_of[tensors[i].first] = std::string_view(static_cast<const char*>(cpu[i].data_ptr()), cpu[i].nbytes());
  }
  std::uint32_t crc = 0;
  for (const auto& [name, data] : data_of) crc = crc32(data, crc);
  const SafetensorsLayout layout = safetensors_layout_of(tensors, std::move(metadata));
  const std::string header = safetensors_header(layout, crc);
  std::vector<std::string_view> parts{header};  // the header, then each tensor's bytes in the data's order
  for (const SafetensorsEntry& entry : layout.entries) parts.push_back(data_of.at(entry.name));
  write_file_atomically(path, parts);
}

std::string encode_state_dict(const NamedTensors& tensors, const std::string& path) {
  if (format_of(path) == StateDictFormat::kTorchSave) return encode_torch_save(tensors);
  return encode_safetensors(tensors, {});
}

at::ScalarType safetensors_scalar_type(const SafetensorsTensor& entry, const std::string& path) {
  for (const auto& [type, name] : kSafetensorsDtypes) {
    if (entry.dtype == name) return type;
  }
  throw CorruptCheckpointError("cpprun: safetensors file " + path + ": tensor \"" + entry.name + "\" has dtype " +
                               entry.dtype + ", which LibTorch has no type for.");
}

NamedTensors decode_safetensors(const SafetensorsFile& file, const std::string& path) {
  NamedTensors out;
  for (const auto& entry : file.tensors) {
    const at::ScalarType type = safetensors_scalar_type(entry, path);
    at::Tensor tensor;
    try {
      tensor = at::empty(entry.shape, at::TensorOptions().dtype(type));
    } catch (const c10::Error& e) {
      throw CorruptCheckpointError("cpprun: safetensors file " + path + ": tensor \"" + entry.name + "\" of shape " +
                                   c10::str(c10::IntArrayRef(entry.shape)) + " cannot be made: " + e.what_without_backtrace());
    }
    if (!entry.data.empty()) std::memcpy(tensor.data_ptr(), entry.data.data(), entry.data.size());
    out.emplace_back(entry.name, std::move(tensor));
  }
  return out;
}

NamedTensors decode_state_dict(std::string_view bytes, const std::string& path) {
  if (format_of(path) == StateDictFormat::kTorchSave) return decode_torch_save(bytes, path);
  return decode_safetensors(read_safetensors(bytes, path), path);
}

// A tensor the module holds under two names (tied weights: GPT-2's wte.weight and lm_head.weight)
// takes one value; when the file holds both names with different bytes, whichever came last would
// silently win, so the file is refused (PyTorch's load_state_dict lets the last one win).
void refuse_disagreeing_ties(const NamedTensors& mine, const NamedTensors& file, const std::string& where,
                             const SameTiedValues& same) {
  std::map<std::string, const at::Tensor*> by_name;
  for (const auto& [name, tensor] : file) by_name[name] = &tensor;
  std::map<const c10::TensorImpl*, std::pair<std::string, const at::Tensor*>> first_of;
  for (const auto& [name, tensor] : mine) {
    const auto found = by_name.find(name);
    if (found == by_name.end() || found->second->sizes() != tensor.sizes() ||
        found->second->scalar_type() != tensor.scalar_type()) {
      continue;
    }
    const auto [seen, is_first] = first_of.try_emplace(tensor.unsafeGetTensorImpl(), name, found->second);
    if (is_first) continue;
    if (same) {
      if (same(seen->second.first, *seen->second.second, name, *found->second)) continue;
    } else {
      const at::Tensor a = seen->second.second->contiguous(), b = found->second->contiguous();
      if (std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0) continue;
    }
    throw_disagreeing_ties(where, seen->second.first, name);
  }
}

void throw_disagreeing_ties(const std::string& where, const std::string& first, const std::string& second) {
  throw StateDictMismatchError("cpprun: " + where + " holds \"" + first + "\" and \"" + second +
                               "\" with different values, but the module ties them (one tensor under both names), "
                               "so it cannot load both; nothing was loaded. Was one of them edited, or is the file "
                               "from a model that does not tie them?");
}


bool renames_file_keys(const StateDictOptions& options) {
  return !options.file_key_prefix().empty() || !options.consume_prefix_in_state_dict_if_present().empty();
}

std::string as_module_name(const std::string& file_name, const StateDictOptions& options) {
  const std::string& consumed = options.consume_prefix_in_state_dict_if_present();
  const bool has = !consumed.empty() && file_name.compare(0, consumed.size(), consumed) == 0;
  return options.file_key_prefix() + (has ? file_name.substr(consumed.size()) : file_name);
}

namespace {

// The file's names as the module's (StateDictOptions::consume_prefix_in_state_dict_if_present,
// then file_key_prefix).
NamedTensors as_module_names(const NamedTensors& file, const StateDictOptions& options) {
  NamedTensors renamed;
  renamed.reserve(file.size());
  for (const auto& [name, tensor] : file) renamed.emplace_back(as_module_name(name, options), tensor);
  return renamed;
}

}  // namespace

void warn_left_as_they_were(const StateDictLoadReport& report, const std::string& where, bool first) {
  if (!first || report.mismatched.empty()) return;
  std::string listed;
  for (std::size_t i = 0; i < report.mismatched.size() && i < 8; ++i) listed += "\n  " + report.mismatched[i];
  if (report.mismatched.size() > 8) listed += "\n  ... (" + std::to_string(report.mismatched.size() - 8) + " more)";
  std::cerr << "cpprun: warning: a strict(false) load of " << where << " left " << report.mismatched.size()
            << " tensor(s) of the module as they were: their dtype or shape differs from the file's (cpprun loads "
               "what fits; PyTorch's load_state_dict(strict=False) casts another dtype). Cast the checkpoint to the "
               "model's dtype, or check StateDictLoadReport::mismatched:"
            << listed << "\n" << std::flush;
}

StateDictLoadReport check_named_tensors(const NamedTensors& mine, const NamedTensors& file_as_saved,
                                        const std::string& where, const StateDictOptions& options,
                                        const std::map<std::string, std::string>& file_of_as_saved,
                                        const SameTiedValues& same) {
  const bool renamed = renames_file_keys(options);
  std::map<std::string, std::string> renamed_file_of;
  if (renamed) {
    for (const auto& [name, in_file] : file_of_as_saved) renamed_file_of.emplace(as_module_name(name, options), in_file);
  }
  const NamedTensors file = renamed ? as_module_names(file_as_saved, options) : file_as_saved;
  const auto& file_of = renamed ? renamed_file_of : file_of_as_saved;
  StateDictLoadReport report = compare_state(mine, file);
  const bool differs = !report.missing_keys.empty() || !report.unexpected_keys.empty() || !report.mismatched.empty();
  if (options.strict() && differs) throw StateDictMismatchError(mismatch_message(report, where, file_of));
  refuse_disagreeing_ties(mine, file, where, same);
  return report;
}

void copy_named_tensors(const NamedTensors& mine, const NamedTensors& file_as_saved, const StateDictOptions& options) {
  const NamedTensors file = renames_file_keys(options) ? as_module_names(file_as_saved, options) : file_as_saved;
  std::map<std::string, const at::Tensor*> by_name;
  for (const auto& [name, tensor] : file) by_name[name] = &tensor;
  at::NoGradGuard no_grad;
  for (const auto& [name, tensor] : mine) {
    const auto found = by_name.find(name);
    if (found != by_name.end() && found->second->sizes() == tensor.sizes() &&
        found->second->scalar_type() == tensor.scalar_type()) {
      tensor.copy_(*found->second);  // in place: FSDP's memory stays where it is
    }
  }
}

StateDictLoadReport load_named_tensors(const NamedTensors& mine, const NamedTensors& file, const std::string& where,
                                       const StateDictOptions& options,
                                       const std::map<std::string, std::string>& file_of) {
  StateDictLoadReport report = check_named_tensors(mine, file, where, options, file_of);
  copy_named_tensors(mine, file, options);
  return report;
}

void write_state_dict_file(const NamedTensors& state, const std::string& path, const StateDictSaveOptions& options,
                           std::map<std::string, std::string> metadata) {
  // .pt: cpprun's checksum footer, which torch.load ignores (Note [Checkpoint footer]);
  // .safetensors: the checksum is in the header's __metadata__, with the step when given.
  note_replacing(path);  // Note [A failed save puts the previous files back]
  if (format_of(path) == StateDictFormat::kTorchSave) {
    TORCH_INTERNAL_ASSERT(metadata.empty(), "a .pt file holds no metadata: ", path);
    write_checkpoint_file(path, encode_torch_save(state));
  } else {
    if (options.step()) metadata[std::string(kStepKey)] = std::to_string(*options.step());
    if (options.save_id()) metadata[std::string(kSaveIdKey)] = *options.save_id();
    write_safetensors_file(path, state, std::move(metadata));
  }
  note_replaced(path);
}

void check_state_dict_path(const std::string& path) {
  if (is_sharded_state_dict_path(path)) {
    check_sharded_save_path(path);
  } else {
    (void)format_of(path);
  }
}

NamedTensors read_state_dict_file(const std::string& path) {
  const StateDictFormat format = format_to_read(path);  // See Note [A file's format from its first bytes]
  // A .pt that torch.save wrote has no footer and is read as it is; ours is checked.
  if (format == StateDictFormat::kTorchSave) {
    return decode_torch_save(read_checkpoint_file(path, UncheckedFiles::kAccept), path);
  }
  return decode_safetensors(read_safetensors(read_state_dict_bytes(path), path), path);
}

StateDictLoadReport load_state_dict_file(const NamedTensors& into, const std::string& path,
                                         const StateDictOptions& options) {
  if (is_sharded_state_dict_path(path)) return load_sharded_state_dict(into, path, options);
  return load_named_tensors(into, read_state_dict_file(path), path, options);
}

void save_state_dict(const NamedTensors& state, const CheckpointTeam& team, const std::string& path,
                     const StateDictSaveOptions& options) {
  if (is_sharded_state_dict_path(path)) {
    save_sharded_tensors(state, team, path, options, kModelStem);
    return;
  }
  std::exception_ptr failure;
  if (team.is_root()) {
    try {
      write_state_dict_file(state, path, options);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  // Also the barrier: the file exists when save returns, on every rank.
  team.agree(failure, "saving the state dict to " + path);
}

StateDictLoadReport load_state_dict(const NamedTensors& into, const CheckpointTeam& team, const std::string& path,
                                    const StateDictOptions& options) {
  return load_on_root_and_broadcast(into, team, [&] { return load_state_dict_file(into, path, options); });
}

StateDictLoadReport load_on_root_and_broadcast(const NamedTensors& into, const CheckpointTeam& team,
                                               const std::function<StateDictLoadReport()>& load_on_root) {
  if (team.alone()) return load_on_root();
  std::exception_ptr failure;
  StateDictLoadReport report;
  if (team.is_root()) {
    try {
      report = load_on_root();
    } catch (...) {
      failure = std::current_exception();
    }
  }
  // Only the root reads: every rank raises its error (the missing keys, the damaged file), not a
  // bare "rank 0 failed", as load_optimizer_state_dict does.
  team.share_root_failure(failure);
  std::vector<at::Tensor> tensors;  // each once: a tied tensor is listed under each of its names
  std::unordered_set<const c10::TensorImpl*> listed;
  for (const auto& [name, tensor] : into) {
    if (listed.insert(tensor.unsafeGetTensorImpl()).second) tensors.push_back(tensor);
  }
  team.broadcast_tensors(tensors);
  std::string bytes = team.is_root() ? encode_report(report) : std::string();
  team.broadcast_bytes(bytes);
  return decode_report(bytes);
}

}  // namespace cpprun::detail
