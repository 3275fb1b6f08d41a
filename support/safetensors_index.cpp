// See safetensors_index.h.
#include "support/safetensors_index.h"

#include <algorithm>
#include <cstdio>

#include "cpprun/checkpoint_file.h"
#include "support/json.h"

namespace cpprun::detail {
namespace {

constexpr int kMaxIndexDepth = 4;  // {"weight_map": {"name": "file"}} nests 2 deep

[[noreturn]] void bad_index(const std::string& path, const std::string& why) {
  throw CorruptCheckpointError("cpprun: the safetensors index " + path + " is invalid: " + why +
                               ". Save the model again, or use another checkpoint.");
}

bool digits(std::string_view text, std::size_t count) {
  return text.size() == count && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

std::string index_file_name(std::string_view stem) { return std::string(stem) + ".safetensors.index.json"; }
std::string single_file_name(std::string_view stem) { return std::string(stem) + ".safetensors"; }

std::string shard_file_name(int part, int parts, std::string_view stem) {
  char name[64];
  std::snprintf(name, sizeof name, "-%05d-of-%05d.safetensors", part, parts);
  return std::string(stem) + name;
}

bool is_shard_file_name(std::string_view name, std::string_view stem) {
  // STEM "-" 5 digits "-of-" 5 digits ".safetensors"
  const std::string prefix = std::string(stem) + "-";
  constexpr std::string_view middle = "-of-", suffix = ".safetensors";
  if (name.size() != prefix.size() + 5 + middle.size() + 5 + suffix.size()) return false;
  return name.substr(0, prefix.size()) == prefix && digits(name.substr(prefix.size(), 5), 5) &&
         name.substr(prefix.size() + 5, middle.size()) == middle &&
         digits(name.substr(prefix.size() + 5 + middle.size(), 5), 5) &&
         name.substr(name.size() - suffix.size()) == suffix;
}

std::vector<int> partition_by_bytes(const std::vector<std::uint64_t>& bytes, int parts) {
  const std::size_t n = bytes.size();
  std::vector<int> part(n, 0);
  const std::size_t k = std::min<std::size_t>(parts < 1 ? 1 : parts, n);
  if (k <= 1) return part;
  // The least capacity that greedy runs fit in k of (binary search; the linear-partition problem).
  const auto runs = [&](std::uint64_t capacity) {
    std::size_t count = 1;
    std::uint64_t load = 0;
    for (const auto b : bytes) {
      if (load + b > capacity) {
        ++count;
        load = 0;
      }
      load += b;
    }
    return count;
  };
  std::uint64_t lo = *std::max_element(bytes.begin(), bytes.end()), hi = 0;
  for (const auto b : bytes) hi += b;
  while (lo < hi) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    if (runs(mid) <= k) hi = mid;
    else lo = mid + 1;
  }
  // Fill runs up to that capacity; once as many tensors remain as parts, one each: every rank
  // that can have a tensor gets one.
  std::size_t p = 0;
  std::uint64_t load = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0 && (load + bytes[i] > lo || n - i == k - 1 - p)) {
      ++p;
      load = 0;
    }
    load += bytes[i];
    part[i] = static_cast<int>(p);
  }
  return part;
}

std::string write_safetensors_index(const SafetensorsIndex& index) {
  // Laid out as transformers writes it (indent 2, sorted keys), so a diff of two saves reads well.
  std::string out = "{\n  \"metadata\": {";
  bool first = true;
  for (const auto& [key, value] : index.metadata) {
    out += first ? "\n    " : ",\n    ";
    first = false;
    append_json_string(out, key);
    out += ": ";
    if (key == "total_size") {
      out += value;  // a number, as transformers writes and expects it
    } else {
      append_json_string(out, value);
    }
  }
  out += first ? "},\n  \"weight_map\": {" : "\n  },\n  \"weight_map\": {";
  first = true;
  for (const auto& [name, file] : index.weight_map) {
    out += first ? "\n    " : ",\n    ";
    first = false;
    append_json_string(out, name);
    out += ": ";
    append_json_string(out, file);
  }
  out += first ? "}\n}\n" : "\n  }\n}\n";
  return out;
}

SafetensorsIndex read_safetensors_index(std::string_view text, const std::string& path) {
  if (text.size() > kMaxSafetensorsIndexBytes) {
    bad_index(path, "it is " + std::to_string(text.size()) + " bytes, more than the " +
                        std::to_string(kMaxSafetensorsIndexBytes) + " an index may be (one line per tensor)");
  }
  Json root;
  try {
    root = parse_json(text, kMaxIndexDepth);
  } catch (const JsonSyntaxError& e) {
    bad_index(path, std::string("its JSON is ") + e.what());
  }
  if (root.kind != Json::Kind::kObject) bad_index(path, "it is not a JSON object");
  SafetensorsIndex index;
  bool has_map = false;
  for (const auto& [key, value] : root.members) {
    if (key == "metadata") {
      if (value.kind != Json::Kind::kObject) bad_index(path, "its \"metadata\" is not a JSON object");
      for (const auto& [mkey, mvalue] : value.members) {
        if (mvalue.kind == Json::Kind::kString || mvalue.kind == Json::Kind::kNumber) {
          index.metadata[mkey] = mvalue.text;
        }
      }
    } else if (key == "weight_map") {
      if (value.kind != Json::Kind::kObject) bad_index(path, "its \"weight_map\" is not a JSON object");
      has_map = true;
      for (const auto& [name, file] : value.members) {
        if (file.kind != Json::Kind::kString)
          bad_index(path, "its weight_map entry \"" + name + "\" is not a file name");
        // A file beside the index: never a path that could lead elsewhere.
        if (file.text.empty() || file.text.find('/') != std::string::npos || file.text.find('\0') != std::string::npos ||
            file.text == "." || file.text == "..") {
          std::string shown;  // a NUL would end the message where the name does
          for (const char c : file.text) shown += c == '\0' ? std::string("\\u0000") : std::string(1, c);
          bad_index(path, "its weight_map puts \"" + name + "\" in \"" + shown +
                        "\", which is not the name of a file in the index's directory");
        }
        index.weight_map[name] = file.text;
      }
    }
  }
  if (!has_map) bad_index(path, "it has no \"weight_map\"");
  return index;
}

std::vector<std::string> sharded_directory_faults(const SafetensorsIndex& index,
                                                  const std::vector<ShardFileContents>& files) {
  std::vector<std::string> faults;
  std::map<std::string, const ShardFileContents*> by_file;
  for (const auto& f : files) by_file[f.file] = &f;
  // Tensors the index promises.
  std::map<std::string, std::map<std::string, bool>> held;  // file -> its tensors
  for (const auto& f : files) {
    for (const auto& name : f.tensors) held[f.file][name] = true;
  }
  for (const auto& [name, file] : index.weight_map) {
    if (by_file.count(file) && !held[file].count(name)) {
      faults.push_back(file + " lacks \"" + name + "\", which the index places there");
    }
  }
  for (const auto& f : files) {
    for (const auto& name : f.tensors) {
      const auto mapped = index.weight_map.find(name);
      if (mapped == index.weight_map.end()) {
        faults.push_back(f.file + " holds \"" + name + "\", which the index does not list");
      } else if (mapped->second != f.file) {
        faults.push_back(f.file + " holds \"" + name + "\", which the index places in " + mapped->second);
      }
    }
  }
  // One save: the index's id, else the one most files carry (the first file's on a tie).
  std::string expected;
  const auto indexed = index.metadata.find(std::string(kSaveIdKey));
  if (indexed != index.metadata.end()) {
    expected = indexed->second;
  } else if (!files.empty()) {
    std::map<std::string, int> votes;
    for (const auto& f : files) ++votes[f.save_id];
    expected = files.front().save_id;
    for (const auto& [id, count] : votes) {
      if (count > votes[expected]) expected = id;
    }
  }
  const auto id_text = [](const std::string& id) { return id.empty() ? std::string("none") : "\"" + id + "\""; };
  for (const auto& f : files) {
    if (f.save_id != expected) {
      faults.push_back(f.file + " is from another save (save id " + id_text(f.save_id) + ", the " +
                       (indexed != index.metadata.end() ? "index's" : "other files'") + " " + id_text(expected) +
                       ")");
    }
  }
  return faults;
}

}  // namespace cpprun::detail
