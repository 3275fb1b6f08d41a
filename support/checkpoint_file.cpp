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

#include <cerrno>
#include <cstdio>
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

}  // namespace

void write_checkpoint_file(const std::string& path, std::string_view payload) {
  std::string bytes;
  bytes.reserve(payload.size() + kFooterSize);
  bytes.append(payload);
  bytes.append(kMagic);
  put_le(bytes, payload.size(), 8);
  put_le(bytes, detail::crc32(payload), 4);
  write_file_atomically(path, bytes);
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
  try {
    archive.load_from(payload.data(), payload.size());
  } catch (const c10::Error& e) {
    throw std::runtime_error("cpprun: checkpoint " + path + " is not a torch archive: " +
                             e.what_without_backtrace());
  }
}

}  // namespace cpprun
