// See reader_report.h.
#include "checkpoint/reader_report.h"

#include <c10/util/Exception.h>

#include <cstring>

namespace cpprun::detail {
namespace {

// Fixed-width integers and length-prefixed strings, in this machine's byte order (every rank of
// a job runs on the same kind of machine, as the object collectives assume).
struct ReportWriter {
  std::string out;
  template <typename T>
  void number(T value) {
    out.append(reinterpret_cast<const char*>(&value), sizeof value);
  }
  void text(const std::string& value) {
    number<std::uint64_t>(value.size());
    out += value;
  }
};

struct ReportReader {
  std::string_view in;
  template <typename T>
  T number() {
    TORCH_INTERNAL_ASSERT(in.size() >= sizeof(T), "a reader's report arrived garbled");
    T value;
    std::memcpy(&value, in.data(), sizeof value);
    in.remove_prefix(sizeof value);
    return value;
  }
  std::string text() {
    const auto size = number<std::uint64_t>();
    TORCH_INTERNAL_ASSERT(in.size() >= size, "a reader's report arrived garbled");
    std::string value(in.substr(0, size));
    in.remove_prefix(size);
    return value;
  }
};

}  // namespace

std::string encode_reader_report(const ReaderReport& report) {
  ReportWriter w;
  w.number<std::int32_t>(report.rank);
  w.text(report.failure);
  w.number<std::uint64_t>(report.absent.size());
  for (const auto& file : report.absent) w.text(file);
  w.number<std::uint64_t>(report.files.size());
  for (const auto& file : report.files) {
    w.text(file.file);
    w.text(file.save_id);
    w.number<std::uint64_t>(file.metadata.size());
    for (const auto& [key, value] : file.metadata) {
      w.text(key);
      w.text(value);
    }
    w.number<std::uint64_t>(file.identity.size);
    w.number<std::int64_t>(file.identity.modified_ns);
    w.number<std::uint64_t>(file.tensors.size());
    for (const auto& t : file.tensors) {
      w.text(t.name);
      w.number<std::int8_t>(static_cast<std::int8_t>(t.dtype));
      w.number<std::uint64_t>(t.sizes.size());
      for (const int64_t size : t.sizes) w.number<std::int64_t>(size);
      w.number<std::uint8_t>(t.crc ? 1 : 0);
      w.number<std::uint32_t>(t.crc.value_or(0));
      w.number<std::uint64_t>(t.offset);
    }
  }
  return std::move(w.out);
}

ReaderReport decode_reader_report(std::string_view bytes) {
  ReportReader r{bytes};
  ReaderReport report;
  report.rank = r.number<std::int32_t>();
  report.failure = r.text();
  for (auto n = r.number<std::uint64_t>(); n > 0; --n) report.absent.push_back(r.text());
  for (auto n = r.number<std::uint64_t>(); n > 0; --n) {
    ReadFileInfo file;
    file.file = r.text();
    file.save_id = r.text();
    for (auto k = r.number<std::uint64_t>(); k > 0; --k) {
      std::string key = r.text();
      file.metadata[std::move(key)] = r.text();
    }
    file.identity.size = r.number<std::uint64_t>();
    file.identity.modified_ns = r.number<std::int64_t>();
    for (auto k = r.number<std::uint64_t>(); k > 0; --k) {
      ReadTensorInfo t;
      t.name = r.text();
      t.dtype = static_cast<c10::ScalarType>(r.number<std::int8_t>());
      for (auto d = r.number<std::uint64_t>(); d > 0; --d) t.sizes.push_back(r.number<std::int64_t>());
      const bool has_crc = r.number<std::uint8_t>() != 0;
      const auto crc = r.number<std::uint32_t>();
      if (has_crc) t.crc = crc;
      t.offset = r.number<std::uint64_t>();
      file.tensors.push_back(std::move(t));
    }
    report.files.push_back(std::move(file));
  }
  TORCH_INTERNAL_ASSERT(r.in.empty(), "a reader's report arrived garbled");
  return report;
}

int reader_of_file(std::size_t file_index, int writers) {
  TORCH_INTERNAL_ASSERT(writers > 0);
  return static_cast<int>(file_index % static_cast<std::size_t>(writers));
}

}  // namespace cpprun::detail
