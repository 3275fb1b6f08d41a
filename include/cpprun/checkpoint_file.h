// Checkpoint files that notice damage: the payload (e.g. a torch archive), then a footer with its
// length and CRC-32, written with write_file_atomically(). Reading verifies both and refuses a
// damaged file with an error naming it, rather than training on from corrupted weights.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace torch::serialize {
class InputArchive;
class OutputArchive;
}  // namespace torch::serialize

namespace cpprun {

// A checkpoint file that fails its check: no footer (truncated, or not written by cpprun), a
// length that differs from the file's, or a checksum that does not match its bytes.
class CorruptCheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Writes payload + footer to PATH atomically (throws std::system_error as write_file_atomically).
void write_checkpoint_file(const std::string& path, std::string_view payload);
// The payload of a file write_checkpoint_file() wrote. Throws CorruptCheckpointError when the
// check fails, std::system_error when PATH cannot be read.
std::string read_checkpoint_file(const std::string& path);

// A torch archive as a checkpoint file; the footer does not stop torch::load or Python's
// torch.load from reading the file, but only load_checkpoint() checks it.
void save_checkpoint(torch::serialize::OutputArchive& archive, const std::string& path);
// Whether load_checkpoint() takes a file without cpprun's footer (one torch::save wrote) as it is.
// A file with the footer is always checked.
enum class UncheckedFiles { kRefuse, kAccept };
// Checks PATH, then loads it into `archive`. Errors name PATH.
void load_checkpoint(torch::serialize::InputArchive& archive, const std::string& path,
                     UncheckedFiles unchecked = UncheckedFiles::kRefuse);
// The payload of PATH: checked when it ends in cpprun's footer, else (kAccept) taken as it is.
std::string read_checkpoint_file(const std::string& path, UncheckedFiles unchecked);

}  // namespace cpprun
