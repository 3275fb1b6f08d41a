// What a rank reads of a tensor in a checked file of a sharded directory (a parallel load:
// checkpoint/parallel_load.h for the model, checkpoint/optimizer_state_dict.cpp for the optimizer's
// state): its own part straight from the file, as PyTorch's DCP reads. FSDP's rows of a tensor are
// one byte range of it (rows lead), read alone; a replicated tensor is read whole; a tensor-parallel
// split is read whole and cut. So no rank receives a tensor from another, and a ZeRO-3 rank reads
// 1/W of the bytes. The buffers a read needs beyond the tensors it fills are planned before the
// first read and allocated at once (StagingBuffers), and the team agrees on them: see Note [Each
// rank reads its own part] in the .cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <string>

#include "checkpoint/state_view.h"
#include "support/file_read.h"

namespace cpprun::detail {

// The elements of a tensor that a rank reads: `numel` of them from byte `offset` of the file.
struct FilePart {
  std::uint64_t offset = 0;
  int64_t numel = 0;
};
// The part of a tensor of `dtype` (the entry's, or its optimizer state's), stored from byte
// `tensor_offset` of a file, that a rank reads for an entry: with FSDP's rows (and no
// tensor-parallel split) this rank's rows, else the whole.
FilePart own_part(const StateEntry& entry, std::uint64_t tensor_offset, at::ScalarType dtype);
// Whether the part is read straight into entry.local (a contiguous CPU tensor of exactly the
// part); else through a staging buffer, then copied (or, for a split, cut) into it.
bool reads_into_local(const StateEntry& entry);

// One flat CPU buffer per dtype, as large as the largest need declared: what the reads that cannot
// land in place pass through, one at a time.
class StagingBuffers {
 public:
  void need(at::ScalarType dtype, int64_t numel);
  // Throws what the allocator throws (out of memory); the caller agrees it over the team.
  void allocate();
  // The first `numel` elements of the buffer of this dtype.
  at::Tensor view(at::ScalarType dtype, int64_t numel) const;

 private:
  std::map<at::ScalarType, int64_t> largest_;
  std::map<at::ScalarType, at::Tensor> buffers_;
};

// Reads `part` of a tensor in the file PATH, the file `checked` identifies (its reader's), into
// `into` (contiguous, CPU, part.numel elements), marking it written (its version counter, as a
// copy_ would). Throws naming PATH: CorruptCheckpointError when it is no longer that file.
void read_part(const std::string& path, const FileIdentity& checked, const FilePart& part, const at::Tensor& into);
// Throws CorruptCheckpointError, as read_part would, unless PATH is still the file `checked`
// identifies: what each rank makes sure of before its first read changes a tensor.
void check_unchanged(const std::string& path, const FileIdentity& checked);

}  // namespace cpprun::detail
