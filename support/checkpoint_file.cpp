// See cpprun/checkpoint_file.h.
//
// Note [Checkpoint footer]
// A checkpoint file is PAYLOAD, then 20 bytes: the magic "cpprunCK", the payload's length (u64,
// little-endian) and its CRC-32 (u32, little-endian).
// - A footer, not a header: the checksum is known once the payload is, and torch's zip reader
//   (torch::load, Python's torch.load) finds its directory from the end and ignores what follows,
//   so the file still loads in plain PyTorch.
// - In the file itself, not in a side file: one rename publishes payload and checksum together;
//   a crash between two renames could pair a checkpoint with another's checksum.
// - The length catches truncation and appended bytes with a clear message before the CRC does.
// - CRC-32 detects every error burst up to 32 bits and any other accidental damage (bit flips on
//   disk, a torn copy) but for a 2^-32 chance, at a small fraction of the cost of writing. It does
//   not guard against deliberate tampering; that would take a keyed hash, which we do not need.
#include "cpprun/checkpoint_file.h"

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/in_memory_adapter.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <optional>
#include <system_error>

#include "cpprun/atomic_file.h"
#include "support/crc32.h"
#include "support/file_read.h"

namespace cpprun {
namespace {

constexpr std::string_view kMagic = "cpprunCK";
constexpr std::size_t kFooterSize = 8 + 8 + 4;

void put_le(std::string& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

std::uint64_t get_le(std::string_view in, int bytes) {
  std::uint64_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) value = value << 8 | static_cast<unsigned char>(in[i]);
  return value;
}

std::string hex(std::uint32_t value) {
  char text[11];
  std::snprintf(text, sizeof text, "0x%08x", value);
  return text;
}

[[noreturn]] void corrupt(const std::string& path, const std::string& why) {
  throw CorruptCheckpointError("cpprun: checkpoint " + path + " is damaged: " + why +
                               ". It cannot be trusted: use an earlier checkpoint, or start afresh.");
}

bool has_footer(std::string_view bytes) {
  return bytes.size() >= kFooterSize && bytes.substr(bytes.size() - kFooterSize, kMagic.size()) == kMagic;
}

// Checks a file's bytes against its footer and drops the footer.
void verify_and_strip(const std::string& path, std::string& bytes) {
  if (!has_footer(bytes)) {
    corrupt(path, "it does not end in cpprun's checksum footer (" + std::to_string(bytes.size()) +
                      " bytes; cut short, or not written by cpprun::save_checkpoint)");
  }
  const std::string_view footer = std::string_view(bytes).substr(bytes.size() - kFooterSize);
  const std::uint64_t length = get_le(footer.substr(kMagic.size()), 8);
  const auto recorded = static_cast<std::uint32_t>(get_le(footer.substr(kMagic.size() + 8), 4));
  const std::size_t actual_length = bytes.size() - kFooterSize;
  if (length != actual_length) {
    corrupt(path, "its footer records " + std::to_string(length) + " bytes of data but it holds " +
                      std::to_string(actual_length) + " (cut short or added to)");
  }
  const std::uint32_t actual = detail::crc32(std::string_view(bytes).substr(0, actual_length));
  if (actual != recorded) {
    corrupt(path, "the CRC-32 of its " + std::to_string(actual_length) + " bytes is " + hex(actual) + " but " +
                      hex(recorded) + " was recorded when it was written (its bytes changed since)");
  }
  bytes.resize(actual_length);
}

// Where the word `def` first stands in `code` (TorchScript's lexer takes `def` followed by any
// whitespace, a tab too), shortened to its line; nothing when it never does. Strings and comments
// are not skipped: telling them apart is the lexer's work, and a quote left open in a comment
// would hide the method after it. What torch::save writes has no such word (a parameter named
// "def" would be refused: no module of any library has one).
std::optional<std::string> first_def(std::string_view code) {
  const auto word_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (std::size_t i = code.find("def"); i != std::string_view::npos; i = code.find("def", i + 1)) {
    if ((i == 0 || !word_char(code[i - 1])) && (i + 3 == code.size() || !word_char(code[i + 3]))) {
      const std::size_t end = std::min(code.find('\n', i), code.size());
      return std::string(code.substr(i, std::min<std::size_t>(end - i, 60)));
    }
  }
  return std::nullopt;
}

// Note [An archive runs no code]
// A torch archive is a TorchScript module: torch::jit::load compiles the Python-like code in its
// code/ records and runs the __setstate__ it may define on the values it unpickles, so a crafted
// file could spin forever or allocate gigabytes inside the load (and the CRC footer proves no
// origin: anyone can compute it). What torch::save and cpprun's OutputArchives write declares
// attributes only, no method, so an archive whose code holds the word `def` anywhere (followed
// by a space, a tab or anything else the lexer takes) is refused before TorchScript sees it. Its records are sized from the zip's directory before any is read.
void refuse_archive_code(const std::string& payload, const std::string& path) {
  constexpr std::size_t kMaxCodeBytes = std::size_t{16} << 20;
  const auto refuse = [&](const std::string& why) {
    throw std::runtime_error("cpprun: checkpoint " + path + " is refused: " + why +
                             ". cpprun reads archives of tensors and values (torch::save of a module, cpprun's "
                             "own), whose loading runs no code");
  };
  try {
    caffe2::serialize::PyTorchStreamReader zip(
        std::make_shared<caffe2::serialize::MemoryReadAdapter>(payload.data(), static_cast<off_t>(payload.size())));
    for (const std::string& record : zip.getAllRecords()) {
      if (record.rfind("code/", 0) != 0 || record.size() < 3 || record.compare(record.size() - 3, 3, ".py") != 0) {
        continue;
      }
      if (zip.getRecordSize(record) > kMaxCodeBytes) refuse("its TorchScript code " + record + " is over 16 MiB");
      auto [data, size] = zip.getRecord(record);
      const std::string_view code(static_cast<const char*>(data.get()), size);
      if (const auto method = first_def(code)) {
        refuse("its TorchScript code " + record + " defines a method (" + *method +
               "), which loading it would compile and may run");
      }
    }
  } catch (const c10::Error& e) {
    throw std::runtime_error("cpprun: checkpoint " + path + " is not a torch archive: " + e.what_without_backtrace());
  }
}

}  // namespace

void write_checkpoint_file(const std::string& path, std::string_view payload) {
  std::string footer;  // written after the payload, which is not copied
  footer.reserve(kFooterSize);
  footer.append(kMagic);
  put_le(footer, payload.size(), 8);
  put_le(footer, detail::crc32(payload), 4);
  write_file_atomically(path, std::vector<std::string_view>{payload, footer});
}

std::string read_checkpoint_file(const std::string& path) {
  std::string bytes = detail::read_regular_file(path, "checkpoint");
  verify_and_strip(path, bytes);
  return bytes;
}

std::string read_checkpoint_file(const std::string& path, UncheckedFiles unchecked) {
  std::string bytes = detail::read_regular_file(path, "checkpoint");
  if (unchecked == UncheckedFiles::kRefuse || has_footer(bytes)) verify_and_strip(path, bytes);
  return bytes;
}

void save_checkpoint(torch::serialize::OutputArchive& archive, const std::string& path) {
  // In memory first: the checksum covers exactly the bytes that are written.
  std::string payload;
  archive.save_to([&payload](const void* data, std::size_t size) {
    payload.append(static_cast<const char*>(data), size);
    return size;
  });
  write_checkpoint_file(path, payload);
}

void load_checkpoint(torch::serialize::InputArchive& archive, const std::string& path, UncheckedFiles unchecked) {
  std::string payload = detail::read_regular_file(path, "checkpoint");
  if (unchecked == UncheckedFiles::kRefuse || has_footer(payload)) verify_and_strip(path, payload);
  refuse_archive_code(payload, path);
  try {
    archive.load_from(payload.data(), payload.size());
  } catch (const c10::Error& e) {
    throw std::runtime_error("cpprun: checkpoint " + path + " is not a torch archive: " +
                             e.what_without_backtrace());
  }
}

}  // namespace cpprun
