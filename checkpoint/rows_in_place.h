// A sharded save in which FSDP's tensors are written where they lie: each rank writes its own rows
// of each tensor straight into the file that holds it, at the tensor's offset, as DCP's ranks write
// what they hold, instead of gathering the whole tensor to the file's writer first. Only the bytes
// at the ends of a rank's rows (at most a 64 KiB block each) go to the file's writer; no rank holds
// a whole tensor it does not own, and the files are the gathering save's byte for byte. See
// Note [Each rank writes its own rows] in the .cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/checkpoint_team.h"
#include "support/safetensors.h"
#include "support/torch_save_file.h"

namespace cpprun::detail {

// Which tensors of a save are written in place, and this rank's part of them
// (gather_for_writers fills it; the save's state holds those tensors as meta tensors).
struct RowsInPlace {
  // Whether any tensor is: it follows from the placements, so it is the same on every rank of the
  // team, and every rank takes the in-place save's steps.
  bool used = false;
  struct Part {
    std::size_t name = 0;     // its index in the save's state
    at::Tensor rows;          // this rank's rows of it (its local tensor)
    std::uint64_t first_byte = 0;  // where they start in the tensor's data
    int writer = 0;           // the writer whose file holds the name
  };
  std::vector<Part> mine;
};

// Of a part of `count` bytes at byte `start` of another writer's file, the bytes a rank writes
// itself: [inner_begin, inner_end), the blocks of kRowsBlockBytes wholly inside it (empty when
// there is none: inner_begin == inner_end). Its bytes before and after go to the file's writer,
// so that no two processes write one block (Note [One writer a block] in the .cpp). Pure.
inline constexpr std::uint64_t kRowsBlockBytes = 64 * 1024;
struct PartSplit {
  std::uint64_t inner_begin = 0, inner_end = 0;
};
PartSplit split_part(std::uint64_t start, std::uint64_t count);

// One part of a file's data as a rank wrote it: `bytes` bytes of tensor `name` from its byte
// `first_byte`, and their CRC-32.
struct WrittenPart {
  std::string name;
  std::uint64_t first_byte = 0;
  std::uint64_t bytes = 0;
  std::uint32_t crc = 0;
};
// The CRC-32 of a file's data section from the parts every rank wrote: each entry of `layout`
// must be covered by its parts exactly, with neither a gap nor an overlap (else an error naming
// the tensor and the bytes amiss, which only a defect of cpprun's can cause: never a file whose
// CRC describes bytes it does not hold).
// Pure: the decision of ShardsInPlace::finish, unit-tested on its own.
std::uint32_t file_crc_of_parts(const SafetensorsLayout& layout, std::vector<WrittenPart> parts,
                                const std::string& file);

// One sharded save's files written in place (Note [Each rank writes its own rows] in the .cpp), in
// three steps: the constructor's collectives (each writer creates its file; the bytes of each
// rank's rows that share a block with another's go to the file's writer), then write() (no
// collective: this rank's rows into the files), then, once the file's writer has every rank's
// records of what it wrote, finish() on that writer. write_shards_in_place below runs them one
// after another; save_async runs the constructor on the calling thread and the rest on its
// background thread, the records going through the group's store (checkpoint/async_save.cpp).
class ShardsInPlace {
 public:

  // Collective over `team`. `state`: the save's names and shapes (the same on every rank), each
  // writer's whole tensors in it, those written in place as meta tensors; `rows`: this rank's parts
  // of those, gather_for_writers's (a part on a GPU is copied to the CPU while it is written);
  // STEM's files, `metadata` in each header and `token` the same on every rank (the root's). Each
  // writer creates its file at its full size as PATH.tmp, `token` where its header will go so that
  // every rank can tell the file is this save's. A failure on any rank is raised on every rank,
  // nothing left behind (`what` names the save): its own error on a rank that failed, a
  // FailedElsewhereError (core/failure_agreement.h) on the others.
  ShardsInPlace(NamedTensors state, RowsInPlace rows, const CheckpointTeam& team, std::string dir,
                std::string_view stem, std::map<std::string, std::string> metadata, const std::string& token,
                std::string what);
  ~ShardsInPlace();  // a temporary file not put in place is removed
  ShardsInPlace(ShardsInPlace&&) noexcept;
  ShardsInPlace& operator=(ShardsInPlace&&) noexcept;

  // Writes this rank's rows into the files and, on a writer, the rest of its file but the header:
  // its whole tensors and the shared blocks it was sent; flushes what it wrote into the other
  // writers' files (a writer's own, finish() flushes). Returns, for each writer (by its
  // index), the records of what this rank wrote into its file, for its finish(). No collective;
  // once (the rows are let go).
  std::vector<std::string> write();
  // On a writer: with every writer's records for its file (write()'s entry of this writer's index
  // on each, in their order), checks that the parts tile every tensor, writes the header (the CRC
  // combined from the parts'), flushes and renames the file into place. Returns its path. No
  // collective; only where writes_file().
  std::string finish(const std::vector<std::string>& records);
  // Removes the temporary file now (the save failed).
  void abandon() noexcept;
  // Whether finish() is this rank's to call (a writer with a file).
  bool writes_file() const;
  // Whether writer WRITER (its index) has a file of this save: with fewer tensors than writers,
  // the last have none.
  bool has_file(int writer) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The files of a sharded save of `state` written in place: ShardsInPlace's steps, the records sent
// to each writer with an all-to-all. Collective over `team` (every rank calls it when rows.used); a
// failure on any rank is raised on every rank once each writer removed its temporary file. The
// file put in place is noted in this thread's ReplacedFiles, for the caller's undo.
void write_shards_in_place(const NamedTensors& state, const RowsInPlace& rows, const CheckpointTeam& team,
                           const std::string& dir, std::string_view stem,
                           const std::map<std::string, std::string>& metadata, const std::string& token,
                           const std::string& what);

}  // namespace cpprun::detail
