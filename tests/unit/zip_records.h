// A torch zip archive's records, one of them changed: how the unit tests make a hostile .pt or
// archive from a good one (PyTorch's own writer, so only the edited bytes are wrong).
#pragma once

#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>

#include <functional>
#include <memory>
#include <string>

namespace scratch {

// `payload`'s records rewritten in order, each after `edit(record name, its bytes)`.
inline std::string with_records_edited(const std::string& payload,
                                       const std::function<void(const std::string&, std::string&)>& edit) {
  caffe2::serialize::PyTorchStreamReader reader(
      std::make_shared<caffe2::serialize::MemoryReadAdapter>(payload.data(), static_cast<off_t>(payload.size())));
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&out](const void* data, std::size_t size) {
    out.append(static_cast<const char*>(data), size);
    return size;
  });
  for (const std::string& record : reader.getAllRecords()) {
    auto [data, size] = reader.getRecord(record);
    std::string bytes(static_cast<const char*>(data.get()), size);
    edit(record, bytes);
    writer.writeRecord(record, bytes.data(), bytes.size());
  }
  writer.writeEndOfFile();
  return out;
}

}  // namespace scratch
