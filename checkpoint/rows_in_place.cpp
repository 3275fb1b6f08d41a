// See rows_in_place.h.
#include "checkpoint/rows_in_place.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <system_error>
#include <utility>

#include "checkpoint/sharded_state_dict.h"
#include "checkpoint/state_dict.h"
#include "cpprun/collectives.h"
#include "cpprun/process_group.h"
#include "support/crc32.h"
#include "support/safetensors_index.h"

namespace cpprun::detail {
namespace fs = std::filesystem;

// Note [Each rank writes its own rows]
// A safetensors file's layout (where each tensor's data lies) follows from the names, dtypes and
// shapes alone, and its header records the CRC-32 of the data in 8 hex digits, so the header's
// length is known before any byte is written. A save of FSDP's state therefore needs no gather:
//   1. each writer creates its file at its full size (space reserved: a full disk fails here) as
//      PATH.tmp, with a token drawn for this save where the header will go (Note [Whose temporary
//      file]); the team agrees;
//   2. every rank writes its own rows of each tensor of each file its shard group holds a writer of
//      (pwrite at the tensor's offset plus its first row's), all but the blocks it shares with
//      another writer of the file (Note [One writer a block]), and each writer its own rows and the
//      tensors it holds whole (replicated ones, tensor-parallel ones it gathered); each computes the
//      CRC-32 of every part and flushes what it wrote (fdatasync: on a shared file system only the
//      writing node can flush its writes); the team agrees;
//   3. rank to writer, over the data-parallel group (an all-to-all of the sizes, then, the
//      buffers agreed, one of the bytes): each part's extent and CRC, and the shared blocks'
//      bytes. Each writer writes those, checks that its file's parts tile every tensor exactly,
//      combines their CRCs in the data's order (CRC-32s combine: support/crc32.h), writes the
//      header, flushes the file and renames it into place; the team agrees.
// The file then holds exactly the bytes the gathering save writes (the test compares them). A
// rank's extra memory is a GPU tensor's copy to the CPU, one at a time, and the shared blocks it
// sends; DCP's ranks write what they hold in the same way, each its own file, which is what made
// its FSDP save faster than a gather's. The metadata every rank lays the files out with is the
// root's (save_sharded_tensors broadcasts it), so the ranks agree on every offset.
//
// Note [One writer a block]
// Two processes writing different bytes of one page of a file is safe on a local file system and
// on a coherent cluster file system (Lustre, GPFS), but not on NFS: its client reads the page,
// changes its bytes and may write the whole page back, over bytes another node wrote meanwhile
// (NFS promises only close-to-open consistency). So no two processes write one block of
// kRowsBlockBytes (64 KiB, a multiple of any page size): a rank writes, of each part in another
// writer's file, only the blocks wholly inside it, and sends the bytes at its ends (at most a
// block each; a part smaller than that, whole) to the file's writer, which writes them with
// everything else of the file that is not such an inner block: the header, its own rows, its
// whole tensors.
namespace {

[[noreturn]] void fail_errno(int error, const std::string& what) {
  throw std::system_error(error, std::generic_category(), what);
}

void write_at(int fd, const void* data, std::size_t count, std::uint64_t offset, const std::string& what) {
  const char* at = static_cast<const char*>(data);
  for (std::size_t done = 0; done < count;) {
    const ssize_t n = ::pwrite(fd, at + done, count - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail_errno(n < 0 ? errno : EIO, what + " (" + std::to_string(done) + " of " + std::to_string(count) +
                                                    " bytes at byte " + std::to_string(offset) + " written)");
    done += static_cast<std::size_t>(n);
  }
}

// A file descriptor closed when it goes (errors of an explicit close() are the caller's).
class OpenFile {
 public:
  OpenFile() = default;
  explicit OpenFile(int fd) : fd_(fd) {}
  OpenFile(OpenFile&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  OpenFile& operator=(OpenFile&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  ~OpenFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Flushes the data written through it, and closes it.
  void flush_and_close(const std::string& what) {
    if (::fdatasync(fd_) != 0) fail_errno(errno, what + " (flushing it to disk)");
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) fail_errno(errno, what + " (closing it)");
  }

 private:
  int fd_ = -1;
};

// A writer's file while it is written: removed when it goes, unless renamed into place (path
// cleared), whatever ends the save (a failed collective too).
struct TemporaryFile {
  std::string path;
  void remove() {
    if (!path.empty()) ::unlink(path.c_str());
    path.clear();
  }
  ~TemporaryFile() { remove(); }
};

// As write_file_atomically's (cpprun/atomic_file.h): PATH.tmp beside PATH.
std::string temporary_name(const std::string& file) { return file + ".tmp"; }

// What a rank that does not see the save's directory as the others do is told.
std::string not_shared_advice(const std::string& dir, std::string_view stem) {
  return dir + " is not one directory that every rank shares (or another save into it is running at once). A "
               "sharded save of FSDP's state has each rank write its own rows into the writers' files, as PyTorch's "
               "DCP has every rank write into one directory: save to a file system every node mounts (NFS, "
               "Lustre, ...), one save at a time, or to a single file (\"" + single_file_name(stem) +
               "\"), which the first rank writes alone.";
}

// Note [Whose temporary file]: each writer writes the save's token where its header will go, and
// every rank reads it back from each writer's file it opens, writer 0's always: a rank on a node
// that does not share the directory finds no file, or another save's, and says so instead of
// writing into it.
OpenFile open_writers_file(const std::string& dir, const std::string& file, const std::string& token,
                           const std::string& writer, std::string_view stem, const std::string& what) {
  const std::string path = (fs::path(dir) / temporary_name(file)).string();
  const auto not_shared = [&](const std::string& found) {
    TORCH_CHECK(false, "cpprun: ", what, ": rank ", cpprun::rank(), " ", found, " ", path, ", which ", writer,
                " created there for this save a moment ago: ", not_shared_advice(dir, stem));
  };
  OpenFile fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (fd.get() < 0) {
    const int error = errno;
    if (error == ENOENT) not_shared("finds no file at");
    fail_errno(error, "cpprun: cannot write " + (fs::path(dir) / file).string() + " (opening " + path + ")");
  }
  std::string seen(token.size(), '\0');
  const ssize_t got = ::pread(fd.get(), seen.data(), seen.size(), 0);
  if (got < 0) fail_errno(errno, "cpprun: cannot write " + (fs::path(dir) / file).string() + " (reading " + path + ")");
  if (got != static_cast<ssize_t>(seen.size()) || seen != token) not_shared("finds another save's file at");
  return fd;
}

// What a rank sends the writers (its messages, indexed by writer) and receives, in one byte
// tensor each, cut by the splits: the all-to-all of write_shards_in_place's step 3.
struct Exchange {
  std::vector<int64_t> to_splits, from_splits;
  at::Tensor to, from;
};

}  // namespace

PartSplit split_part(std::uint64_t start, std::uint64_t count) {
  const std::uint64_t end = start + count;
  const std::uint64_t up = (start + kRowsBlockBytes - 1) / kRowsBlockBytes * kRowsBlockBytes;
  const std::uint64_t down = end / kRowsBlockBytes * kRowsBlockBytes;
  if (up >= down) return {end, end};  // no whole block inside: all of it goes to the writer
  return {up, down};
}

namespace {

// A writer's file: its layout, and where each name's data starts.
struct FilePlan {
  std::string file;
  SafetensorsLayout layout;
  std::map<std::string, std::uint64_t> data_of;  // name -> its data's offset in the file
};
FilePlan plan_of_file(const NamedTensors& state, int writer, int writers, std::string_view stem,
                      const std::map<std::string, std::string>& metadata) {
  const StateDictShard shard = state_dict_shard(state, writer, writers, stem);
  FilePlan plan{shard.file, safetensors_layout_of(shard.tensors, metadata), {}};
  for (std::size_t i = 0; i < plan.layout.entries.size(); ++i) {
    plan.data_of[plan.layout.entries[i].name] = plan.layout.data_start + plan.layout.offsets[i];
  }
  return plan;
}

// A part as its file's writer learns of it: its name's index, first byte, bytes, CRC.
struct PartRecord {
  std::uint64_t name, first_byte, bytes, crc;
};

constexpr const char* kReport =
    ". The save fails rather than write a file its CRC does not describe; please report this to cpprun's "
    "developers.";

std::uint32_t written_crc(const at::Tensor& cpu) {
  return crc32(std::string_view(static_cast<const char*>(cpu.data_ptr()), cpu.nbytes()));
}

}  // namespace

std::uint32_t file_crc_of_parts(const SafetensorsLayout& layout, std::vector<WrittenPart> parts,
                                const std::string& file) {
  std::sort(parts.begin(), parts.end(), [](const WrittenPart& a, const WrittenPart& b) {
    return a.name != b.name ? a.name < b.name : a.first_byte < b.first_byte;
  });
  std::uint32_t crc = 0;
  auto next = parts.begin();
  for (const SafetensorsEntry& entry : layout.entries) {  // the data's order
    // Parts of a name the layout lacks sort before or among the entries: none may be left over.
    TORCH_CHECK(next == parts.end() || next->name >= entry.name, "cpprun: internal error writing ", file,
                ": a part of \"", next->name, "\" was written, which the file does not hold", kReport);
    std::uint64_t covered = 0;
    for (; next != parts.end() && next->name == entry.name; ++next) {
      TORCH_CHECK(next->first_byte == covered && next->bytes <= entry.bytes - covered, "cpprun: internal error writing ",
                  file, ": \"", entry.name, "\" (", entry.bytes, " bytes) was written as bytes ", next->first_byte,
                  " to ", next->first_byte + next->bytes, " where bytes from ", covered, " were due", kReport);
      crc = crc32_combine(crc, next->crc, next->bytes);
      covered += next->bytes;
    }
    TORCH_CHECK(covered == entry.bytes, "cpprun: internal error writing ", file, ": \"", entry.name, "\" (",
                entry.bytes, " bytes) was written only up to byte ", covered, kReport);
  }
  TORCH_CHECK(next == parts.end(), "cpprun: internal error writing ", file, ": a part of \"", next->name,
              "\" was written, which the file does not hold", kReport);
  return crc;
}

void write_shards_in_place(const NamedTensors& state, const RowsInPlace& rows, const CheckpointTeam& team,
                           const std::string& dir, std::string_view stem,
                           const std::map<std::string, std::string>& metadata, const std::string& token,
                           const std::string& what, bool& wrote) {
  TORCH_INTERNAL_ASSERT(team.replicas(), "rows written in place without a data-parallel group");
  const ProcessGroup& group = *team.replicas();
  const int me = team.writes() ? team.writer_rank() : -1;
  std::optional<FilePlan> own;  // this writer's file
  OpenFile own_fd;
  TemporaryFile temporary;      // removed unless renamed into place
  std::exception_ptr failure;
  const auto agree = [&] {
    try {
      team.agree(failure, what);
    } catch (...) {
      own_fd = OpenFile();
      temporary.remove();
      throw;
    }
  };

  // 1. Each writer's file, at its full size, the save's token where its header will go.
  if (me >= 0) {
    try {
      own = plan_of_file(state, me, team.writers(), stem, metadata);
      if (!own->file.empty()) {
        const std::string path = (fs::path(dir) / temporary_name(own->file)).string();
        const std::string cannot = "cpprun: cannot write " + (fs::path(dir) / own->file).string();
        own_fd = OpenFile(::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0666));
        if (own_fd.get() < 0) {
          const int error = errno;
          // The first rank created the directory: not there on this rank's node, it is not shared.
          TORCH_CHECK(error != ENOENT, "cpprun: ", what, ": rank ", cpprun::rank(), " finds no directory ", dir,
                      ", which the first rank created for this save a moment ago: ", not_shared_advice(dir, stem));
          fail_errno(error, cannot + " (creating " + path + ")");
        }
        temporary.path = path;
        // The space first: a full disk fails here, before any rank writes (a file system without
        // fallocate gets a sparse file, and meets a full disk in the writes).
        const std::uint64_t size = own->layout.data_start + own->layout.data_bytes;
        int reserved;
        do {
          reserved = ::fallocate(own_fd.get(), 0, 0, static_cast<off_t>(size));
        } while (reserved != 0 && errno == EINTR);
        if (reserved != 0) {
          const int error = errno;
          if (error != EOPNOTSUPP && error != ENOSYS) {
            fail_errno(error, cannot + " (reserving " + std::to_string(size) + " bytes for " + path + ")");
          }
          if (::ftruncate(own_fd.get(), static_cast<off_t>(size)) != 0) {
            fail_errno(errno, cannot + " (making " + path + " " + std::to_string(size) + " bytes)");
          }
        }
        TORCH_INTERNAL_ASSERT(own->layout.data_start > token.size());  // the header overwrites it
        write_at(own_fd.get(), token.data(), token.size(), 0, cannot + " (" + path + ")");
        if (::fdatasync(own_fd.get()) != 0) fail_errno(errno, cannot + " (flushing " + path + ")");
      }
    } catch (...) {
      failure = std::current_exception();
    }
  }
  agree();

  // 2. Every rank's rows into the files that hold them, but for the blocks they share with others
  // (Note [One writer a block]), which go to the file's writer with the parts' CRCs; each writer's
  // own rows and whole tensors into its own file. Message to writer w: the shared blocks' bytes
  // (each as offset, count, bytes), then the PartRecords, then their count.
  const auto writers = static_cast<std::size_t>(group.size());
  std::vector<std::string> messages(writers);
  std::vector<std::vector<PartRecord>> records(writers);
  const auto add_edge = [&](int writer, std::uint64_t offset, const char* bytes, std::uint64_t count) {
    if (count == 0) return;
    std::string& out = messages[static_cast<std::size_t>(writer)];
    const std::uint64_t head[2] = {offset, count};
    out.append(reinterpret_cast<const char*>(head), sizeof head);
    out.append(bytes, count);
  };
  // The writers' job ranks as the errors name them (a slice that writes nothing knows writer w by
  // its index alone: its group is another slice's).
  const auto writer_name = [&](int writer) {
    if (!team.writes()) return "writer " + std::to_string(writer) + " of the save";
    return "rank " + std::to_string(get_process_group_ranks(group)[static_cast<std::size_t>(writer)]);
  };
  try {
    // Writer 0's file is opened by every rank, whether or not it holds rows of it: a rank that
    // does not share the directory finds out even when all its rows go to writers on its own node.
    const FilePlan first = plan_of_file(state, 0, team.writers(), stem, metadata);
    if (me != 0 && !first.file.empty()) (void)open_writers_file(dir, first.file, token, writer_name(0), stem, what);
    // One other writer's file open at a time: the parts come in the files' order.
    std::optional<std::pair<int, FilePlan>> current;
    OpenFile current_fd;
    const auto close_current = [&] {
      if (current) current_fd.flush_and_close("cpprun: cannot write " + (fs::path(dir) / current->second.file).string());
      current.reset();
    };
    for (const RowsInPlace::Part& part : rows.mine) {
      const FilePlan* plan = own ? &*own : nullptr;
      int fd = own_fd.get();
      if (part.writer != me) {
        if (!current || current->first != part.writer) {
          close_current();
          current.emplace(part.writer, plan_of_file(state, part.writer, team.writers(), stem, metadata));
          current_fd = open_writers_file(dir, current->second.file, token, writer_name(part.writer), stem, what);
        }
        plan = &current->second;
        fd = current_fd.get();
      }
      const std::string& name = state[part.name].first;
      const at::Tensor cpu = part.rows.detach().to(at::kCPU).contiguous();
      const char* bytes = static_cast<const char*>(cpu.data_ptr());
      const std::uint64_t start = plan->data_of.at(name) + part.first_byte, count = cpu.nbytes();
      const std::string cannot = "cpprun: cannot write " + (fs::path(dir) / plan->file).string() + " (\"" + name + "\")";
      if (part.writer == me) {
        write_at(fd, bytes, count, start, cannot);
      } else {
        const PartSplit split = split_part(start, count);
        write_at(fd, bytes + (split.inner_begin - start), split.inner_end - split.inner_begin, split.inner_begin, cannot);
        add_edge(part.writer, start, bytes, split.inner_begin - start);
        add_edge(part.writer, split.inner_end, bytes + (split.inner_end - start), start + count - split.inner_end);
      }
      records[static_cast<std::size_t>(part.writer)].push_back({part.name, part.first_byte, count, written_crc(cpu)});
    }
    close_current();
    if (own && !own->file.empty()) {
      const StateDictShard shard = state_dict_shard(state, me, team.writers(), stem);
      std::map<std::string, std::size_t> index;  // name -> its index in `state`
      for (std::size_t i = 0; i < state.size(); ++i) index.emplace(state[i].first, i);
      for (const auto& [name, tensor] : shard.tensors) {
        if (tensor.is_meta()) continue;  // written in place by the rows' ranks
        const at::Tensor cpu = tensor.detach().to(at::kCPU).contiguous();
        write_at(own_fd.get(), cpu.data_ptr(), cpu.nbytes(), own->data_of.at(name),
                 "cpprun: cannot write " + (fs::path(dir) / own->file).string() + " (\"" + name + "\")");
        records[static_cast<std::size_t>(me)].push_back({index.at(name), 0, cpu.nbytes(), written_crc(cpu)});
      }
    }
    for (std::size_t w = 0; w < writers; ++w) {
      const std::uint64_t count = records[w].size();
      messages[w].append(reinterpret_cast<const char*>(records[w].data()), count * sizeof(PartRecord));
      messages[w].append(reinterpret_cast<const char*>(&count), sizeof count);
    }
  } catch (...) {
    failure = std::current_exception();
  }
  agree();

  // 3. What each writer is owed (the shared blocks' bytes, the parts' CRCs), rank to writer: the
  // sizes, then the buffers allocated and agreed (a rank out of memory fails every rank, none is
  // left in the exchange), then the bytes. Each writer writes the shared blocks and its header,
  // and puts its file in place.
  Exchange exchange;
  exchange.to_splits.resize(writers);
  for (std::size_t w = 0; w < writers; ++w) exchange.to_splits[w] = static_cast<int64_t>(messages[w].size());
  {
    const at::Tensor sizes_to = at::tensor(exchange.to_splits, at::kLong);
    at::Tensor sizes_from = at::empty_like(sizes_to);
    all_to_all(group, sizes_from, sizes_to);
    exchange.from_splits.assign(sizes_from.data_ptr<int64_t>(), sizes_from.data_ptr<int64_t>() + writers);
  }
  try {
    int64_t to_bytes = 0, from_bytes = 0;
    for (std::size_t w = 0; w < writers; ++w) to_bytes += exchange.to_splits[w], from_bytes += exchange.from_splits[w];
    exchange.to = at::empty({to_bytes}, at::kByte);
    exchange.from = at::empty({from_bytes}, at::kByte);
    char* at = reinterpret_cast<char*>(exchange.to.data_ptr<std::uint8_t>());
    for (std::string& message : messages) {
      at = std::copy(message.begin(), message.end(), at);
      std::string().swap(message);  // each byte held once
    }
  } catch (...) {
    failure = std::current_exception();
  }
  agree();
  all_to_all(group, exchange.from, exchange.to, exchange.from_splits, exchange.to_splits);
  exchange.to = at::Tensor();
  if (own && !own->file.empty()) {
    try {
      const std::string path = (fs::path(dir) / own->file).string();
      const std::string cannot = "cpprun: cannot write " + path;
      const std::uint64_t file_bytes = own->layout.data_start + own->layout.data_bytes;
      std::vector<WrittenPart> parts;
      const char* from = reinterpret_cast<const char*>(exchange.from.data_ptr<std::uint8_t>());
      for (const int64_t size : exchange.from_splits) {
        const std::string_view message(from, static_cast<std::size_t>(size));
        from += size;
        std::uint64_t count = 0;
        TORCH_INTERNAL_ASSERT(message.size() >= sizeof count);
        std::memcpy(&count, message.data() + message.size() - sizeof count, sizeof count);
        TORCH_INTERNAL_ASSERT(count <= (message.size() - sizeof count) / sizeof(PartRecord));
        const std::size_t records_at = message.size() - sizeof count - count * sizeof(PartRecord);
        for (std::size_t at = records_at; at < message.size() - sizeof count; at += sizeof(PartRecord)) {
          PartRecord r;
          std::memcpy(&r, message.data() + at, sizeof r);
          TORCH_INTERNAL_ASSERT(r.name < state.size());
          parts.push_back({state[r.name].first, r.first_byte, r.bytes, static_cast<std::uint32_t>(r.crc)});
        }
        for (std::size_t at = 0; at < records_at;) {
          std::uint64_t head[2];
          TORCH_INTERNAL_ASSERT(at + sizeof head <= records_at);
          std::memcpy(head, message.data() + at, sizeof head);
          at += sizeof head;
          TORCH_INTERNAL_ASSERT(head[1] <= records_at - at && head[0] <= file_bytes && head[1] <= file_bytes - head[0]);
          write_at(own_fd.get(), message.data() + at, head[1], head[0], cannot + " (a shared block)");
          at += head[1];
        }
      }
      exchange.from = at::Tensor();
      const std::uint32_t crc = file_crc_of_parts(own->layout, std::move(parts), path);
      const std::string header = safetensors_header(own->layout, crc);
      write_at(own_fd.get(), header.data(), header.size(), 0, cannot + " (its header)");
      own_fd.flush_and_close(cannot);
      if (::rename(temporary.path.c_str(), path.c_str()) != 0) {
        fail_errno(errno, cannot + " (renaming " + temporary.path + " over it)");
      }
      temporary.path.clear();
      wrote = true;
      const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);  // the rename's durability
      if (dir_fd >= 0) ::fsync(dir_fd), ::close(dir_fd);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  agree();  // every file in place, or the save failed (the caller removes a file renamed into place)
}

}  // namespace cpprun::detail
