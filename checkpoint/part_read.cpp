// See part_read.h.
#include "checkpoint/part_read.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "cpprun/checkpoint_file.h"
#include "support/file_read.h"

namespace cpprun::detail {

// Note [Each rank reads its own part]
// A parallel load first has each writer read and check its share of the files whole (header, CRC,
// dtypes: Note [Reading a directory on every rank] in parallel_load.cpp); once the team agrees that
// every file holds together and fits, each rank reads what it keeps straight from the files, at
// the offsets the readers reported: FSDP's rows as one byte range (the rows lead, so a rank's rows
// of a tensor are contiguous in the file), a replicated tensor whole, a tensor-parallel split
// whole and then cut. DCP reads so; here it replaced a transfer in which each tensor went from its
// reader to the others (a broadcast, FSDP's rows scattered): on one machine the second read comes
// from the page cache, at memory speed, and costs no other rank anything, where Gloo's loopback
// copied every byte through the kernel on both sides. The price is the disk traffic of a replicated
// model (DDP): every rank reads all of it, as under DCP; FSDP's ranks read 1/W of it each.
// The buffers a read needs beyond the tensors it fills (a staging buffer where the local tensor is
// on a GPU, not contiguous, or cut from a split) are planned before the first read and allocated
// at once, one flat CPU buffer per dtype as large as the largest part, and the team agrees that
// every rank allocated them: a rank out of memory fails the load on every rank, nothing changed.
// Every rank reads the bytes of the file its reader checked: each reader reports each file's size
// and modification time (unchanged across its read), each rank makes sure that every file it will
// read is still that one before its first read changes a tensor (agreed with the buffers), and
// each read checks it again on the descriptor it reads from. A directory saved into during the
// load, or a path that names other files on another node, is refused, naming the file, where the
// ranks would otherwise have loaded tensors of two saves. A read that fails after the first check
// (the file replaced in between, the disk failing) fails the load on every rank too, with the
// tensors read before it loaded.

FilePart own_part(const StateEntry& entry, std::uint64_t tensor_offset, at::ScalarType dtype) {
  FilePart part{tensor_offset, 1};
  if (entry.placement.rows && !entry.placement.tensor_parallel) {
    const RowShard& rows = *entry.placement.rows;  // rows lead: this rank's are one byte range
    part.offset += static_cast<std::uint64_t>(rows.first_row * rows.row_numel) * at::elementSize(dtype);
    part.numel = rows.local_rows * rows.row_numel;
  } else {
    for (const int64_t size : entry.whole_sizes) part.numel *= size;
  }
  return part;
}

bool reads_into_local(const StateEntry& entry) {
  if (entry.placement.tensor_parallel) return false;
  const at::Tensor& local = entry.local;
  return local.device().is_cpu() && local.is_contiguous() && local.numel() == own_part(entry, 0, local.scalar_type()).numel;
}

void StagingBuffers::need(at::ScalarType dtype, int64_t numel) {
  int64_t& largest = largest_[dtype];
  largest = std::max(largest, numel);
}

void StagingBuffers::allocate() {
  for (const auto& [dtype, numel] : largest_) {
    if (numel > 0) buffers_[dtype] = at::empty({numel}, at::TensorOptions().dtype(dtype));
  }
}

at::Tensor StagingBuffers::view(at::ScalarType dtype, int64_t numel) const {
  if (numel == 0) return at::empty({0}, at::TensorOptions().dtype(dtype));
  const auto found = buffers_.find(dtype);
  TORCH_INTERNAL_ASSERT(found != buffers_.end() && numel <= found->second.numel(),
                        "a staging buffer was used beyond what was planned");
  return found->second.narrow(0, 0, numel);
}

namespace {

std::string changed_message(const std::string& path, const FileIdentity& checked, const FileIdentity& now) {
  return "cpprun: " + path + " is not the file its reader checked (" + std::to_string(checked.size) + " bytes then, " +
         std::to_string(now.size) + " now" + (checked.size == now.size ? ", modified since" : "") +
         "): was a checkpoint saved into its directory during the load, or does this rank's node hold another "
         "file at this path? Load a directory no save is writing to, at one path every rank sees.";
}

}  // namespace

void check_unchanged(const std::string& path, const FileIdentity& checked) {
  const FileIdentity now = identity_of(path, "the checkpoint file");
  if (now != checked) throw CorruptCheckpointError(changed_message(path, checked, now));
}

void read_part(const std::string& path, const FileIdentity& checked, const FilePart& part, const at::Tensor& into) {
  TORCH_INTERNAL_ASSERT(into.device().is_cpu() && into.is_contiguous() && into.numel() == part.numel,
                        "a part is read into a contiguous CPU tensor of its size");
  if (part.numel == 0) return;
  try {
    read_file_range(path, "the checkpoint file", checked, part.offset, static_cast<std::size_t>(into.nbytes()),
                    into.data_ptr());
  } catch (const FileChangedError& e) {
    throw CorruptCheckpointError(changed_message(path, checked, e.now));
  }
  into.unsafeGetTensorImpl()->bump_version();
}

}  // namespace cpprun::detail
