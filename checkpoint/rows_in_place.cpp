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
#include <functional>
#include <optional>
#include <system_error>
#include <utility>

#include "checkpoint/sharded_state_dict.h"
#include "checkpoint/state_dict.h"
#include "cpprun/collectives.h"
#include "cpprun/detail/replaced_files.h"
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
//   2. rank to writer, over the data-parallel group (an all-to-all of the sizes, then, the buffers
//      agreed, one of the bytes): the bytes at the ends of each rank's rows in another writer's
//      file, the blocks it shares with that writer (Note [One writer a block]); the team agrees;
//   3. every rank writes its own rows of each tensor of each file its shard group holds a writer of
//      (pwrite at the tensor's offset plus its first row's), all but those shared blocks, and each
//      writer its own rows, the tensors it holds whole (replicated ones, tensor-parallel ones it
//      gathered) and the shared blocks it received; each computes the CRC-32 of every part it
//      wrote and flushes what it wrote into other writers' files (fdatasync: on a shared file
//      system only the writing node can flush its writes; a writer's own file, in step 4);
//   4. rank to writer (an all-to-all as in 2): each part's extent and CRC. Each writer checks that
//      its file's parts tile every tensor exactly, combines their CRCs in the data's order (CRC-32s
//      combine: support/crc32.h), writes the header, flushes the file and renames it into place;
//      the team agrees.
// The file then holds exactly the bytes the gathering save writes (the test compares them). A
// rank's extra memory is a GPU tensor's copy to the CPU, one at a time, and the shared blocks it
// sends (a writer holds those it received from step 2 to step 3); DCP's ranks write what they
// hold in the same way, each its own file, which is what made its FSDP save faster than a
// gather's. The metadata every rank lays the files out with is the
// root's (in_place_stamp broadcasts it), so the ranks agree on every offset. Steps 1 and 2 are
// ShardsInPlace's constructor, 3 its write(), 4 its finish() after the records' exchange: so
// save_async runs 1 and 2 on the calling thread and 3 and 4 on its background thread, the records
// going through the store instead (Note [An asynchronous save in place] in async_save.cpp).
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

}  // namespace

// The types ShardsInPlace::Impl holds (so not in an anonymous namespace).

// A file descriptor closed when it goes (errors of an explicit close() are the caller's).
class InPlaceFile {
 public:
  InPlaceFile() = default;
  explicit InPlaceFile(int fd) : fd_(fd) {}
  InPlaceFile(InPlaceFile&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  InPlaceFile& operator=(InPlaceFile&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  ~InPlaceFile() {
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
struct InPlaceTemporaryFile {
  std::string path;
  void remove() {
    if (!path.empty()) ::unlink(path.c_str());
    path.clear();
  }
  ~InPlaceTemporaryFile() { remove(); }
};

namespace {

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
InPlaceFile open_writers_file(const std::string& dir, const std::string& file, const std::string& token,
                              const std::string& writer, std::string_view stem, const std::string& what) {
  const std::string path = (fs::path(dir) / temporary_name(file)).string();
  const auto not_shared = [&](const std::string& found) {
    TORCH_CHECK(false, "cpprun: ", what, ": rank ", cpprun::rank(), " ", found, " ", path, ", which ", writer,
                " created there for this save a moment ago: ", not_shared_advice(dir, stem));
  };
  InPlaceFile fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
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

}  // namespace

PartSplit split_part(std::uint64_t start, std::uint64_t count) {
  const std::uint64_t end = start + count;
  const std::uint64_t up = (start + kRowsBlockBytes - 1) / kRowsBlockBytes * kRowsBlockBytes;
  const std::uint64_t down = end / kRowsBlockBytes * kRowsBlockBytes;
  if (up >= down) return {end, end};  // no whole block inside: all of it goes to the writer
  return {up, down};
}

// A writer's file: its layout, and where each name's data starts.
struct InPlaceFilePlan {
  std::string file;
  SafetensorsLayout layout;
  std::map<std::string, std::uint64_t> data_of;   // name -> its data's offset in the file
  std::map<std::string, std::uint64_t> bytes_of;  // name -> its data's bytes
};

namespace {

InPlaceFilePlan plan_of_file(const NamedTensors& state, int writer, int writers, std::string_view stem,
                             const std::map<std::string, std::string>& metadata) {
  const StateDictShard shard = state_dict_shard(state, writer, writers, stem);
  InPlaceFilePlan plan{shard.file, safetensors_layout_of(shard.tensors, metadata), {}, {}};
  for (std::size_t i = 0; i < plan.layout.entries.size(); ++i) {
    plan.data_of[plan.layout.entries[i].name] = plan.layout.data_start + plan.layout.offsets[i];
    plan.bytes_of[plan.layout.entries[i].name] = plan.layout.entries[i].bytes;
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

std::uint32_t written_crc(const char* bytes, std::uint64_t count) {
  return crc32(std::string_view(bytes, static_cast<std::size_t>(count)));
}

// TENSOR's bytes, in its order, as a 1-D byte tensor where it lies (a GPU's stays there).
at::Tensor bytes_of(const at::Tensor& tensor) {
  return tensor.detach().contiguous().reshape({-1}).view(at::kByte);
}

}  // namespace

// What each rank of a group sent this one, in one byte tensor cut by `splits` (by rank).
struct InPlaceReceived {
  at::Tensor bytes;
  std::vector<int64_t> splits;
  const char* data() const {
    return bytes.defined() ? reinterpret_cast<const char*>(bytes.data_ptr<std::uint8_t>()) : nullptr;
  }
  std::vector<std::string_view> messages() const {
    std::vector<std::string_view> out;
    const char* at = data();
    for (const int64_t size : splits) {
      out.emplace_back(at, static_cast<std::size_t>(size));
      at += size;
    }
    return out;
  }
};

namespace {

// Sends messages[w] to rank w of GROUP and returns what each rank sent this one: the sizes, then
// the buffers allocated and agreed through `agree` (a rank out of memory, or whose `failure` is
// set, fails every rank, none left in the exchange), then the bytes. Collective; allocates nothing
// after the agreement.
InPlaceReceived exchange(const ProcessGroup& group, std::vector<std::string> messages, std::exception_ptr failure,
                  const std::function<void(std::exception_ptr)>& agree) {
  const auto ranks = static_cast<std::size_t>(group.size());
  std::vector<int64_t> to_splits(ranks);
  InPlaceReceived received;
  received.splits.resize(ranks);
  for (std::size_t w = 0; w < ranks; ++w) to_splits[w] = static_cast<int64_t>(messages[w].size());
  {
    const at::Tensor sizes_to = at::tensor(to_splits, at::kLong);
    at::Tensor sizes_from = at::empty_like(sizes_to);
    all_to_all(group, sizes_from, sizes_to);
    received.splits.assign(sizes_from.data_ptr<int64_t>(), sizes_from.data_ptr<int64_t>() + ranks);
  }
  at::Tensor to;
  try {
    int64_t to_bytes = 0, from_bytes = 0;
    for (std::size_t w = 0; w < ranks; ++w) to_bytes += to_splits[w], from_bytes += received.splits[w];
    to = at::empty({to_bytes}, at::kByte);
    received.bytes = at::empty({from_bytes}, at::kByte);
    char* at = reinterpret_cast<char*>(to.data_ptr<std::uint8_t>());
    for (std::string& message : messages) {
      at = std::copy(message.begin(), message.end(), at);
      std::string().swap(message);  // each byte held once
    }
  } catch (...) {
    if (!failure) failure = std::current_exception();
  }
  agree(failure);
  all_to_all(group, received.bytes, to, received.splits, to_splits);
  return received;
}

// A shared block's bytes as its sender puts them in a message to the file's writer.
struct EdgeHead {
  std::uint64_t name, first_byte, count;
};

}  // namespace

std::uint32_t file_crc_of_parts(const SafetensorsLayout& layout, std::vector<WrittenPart> parts,
                                const std::string& file) {
  std::sort(parts.begin(), parts.end(), [](const WrittenPart& a, const WrittenPart& b) {
    return a.name != b.name ? a.name < b.name : a.first_byte < b.first_byte;
  });
  // In name order, as the CRC is recorded (Note [The CRC is over the tensors in name order]); the
  // data's own order is by element size first (Note [Data in alignment order]).
  std::vector<const SafetensorsEntry*> by_name;
  for (const SafetensorsEntry& entry : layout.entries) by_name.push_back(&entry);
  std::sort(by_name.begin(), by_name.end(), [](const auto* a, const auto* b) { return a->name < b->name; });
  std::uint32_t crc = 0;
  auto next = parts.begin();
  for (const SafetensorsEntry* named : by_name) {
    const SafetensorsEntry& entry = *named;
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

struct ShardsInPlace::Impl {
  Impl(NamedTensors state_, RowsInPlace rows_, const CheckpointTeam& team_, std::string dir_, std::string_view stem_,
       std::string token_, std::string what_, std::map<std::string, std::string> metadata_)
      : state(std::move(state_)), rows(std::move(rows_)), team(team_), dir(std::move(dir_)), stem(stem_),
        token(std::move(token_)), what(std::move(what_)), metadata(std::move(metadata_)) {}

  NamedTensors state;
  RowsInPlace rows;
  CheckpointTeam team;
  std::string dir, stem, token, what;
  std::map<std::string, std::string> metadata;
  int me = -1;  // this rank's writer index; -1: a rank that writes nothing (a tensor-parallel slice but the first)
  std::optional<InPlaceFilePlan> own;  // this writer's file
  InPlaceFile own_fd;
  InPlaceTemporaryFile temporary;      // removed unless renamed into place
  // The shared blocks of this writer's file that other ranks sent (Note [One writer a block]):
  // where each lies in `received`.
  struct Edge {
    std::uint64_t name, first_byte, at, count;
  };
  InPlaceReceived received;
  std::vector<Edge> edges;
  std::vector<bool> has_file;  // by writer: whether it writes a file of this save (fewer tensors than writers)

  InPlaceFilePlan plan(int writer) const { return plan_of_file(state, writer, team.writers(), stem, metadata); }
  // The writer's job rank as the errors name it (a slice that writes nothing knows writer w by its
  // index alone: its group is another slice's).
  std::string writer_name(int writer) const {
    if (!team.writes()) return "writer " + std::to_string(writer) + " of the save";
    return "rank " + std::to_string(get_process_group_ranks(*team.replicas())[static_cast<std::size_t>(writer)]);
  }
  std::string cannot(const std::string& file) const {
    return "cpprun: cannot write " + (fs::path(dir) / file).string();
  }

  // Step 1: this writer's file at its full size, the save's token where its header will go.
  void create_file() {
    own = plan(me);
    if (own->file.empty()) return;
    const std::string path = (fs::path(dir) / temporary_name(own->file)).string();
    const std::string fail = cannot(own->file);
    own_fd = InPlaceFile(::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0666));
    if (own_fd.get() < 0) {
      const int error = errno;
      // The first rank created the directory: not there on this rank's node, it is not shared.
      TORCH_CHECK(error != ENOENT, "cpprun: ", what, ": rank ", cpprun::rank(), " finds no directory ", dir,
                  ", which the first rank created for this save a moment ago: ", not_shared_advice(dir, stem));
      fail_errno(error, fail + " (creating " + path + ")");
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
        fail_errno(error, fail + " (reserving " + std::to_string(size) + " bytes for " + path + ")");
      }
      if (::ftruncate(own_fd.get(), static_cast<off_t>(size)) != 0) {
        fail_errno(errno, fail + " (making " + path + " " + std::to_string(size) + " bytes)");
      }
    }
    TORCH_INTERNAL_ASSERT(own->layout.data_start > token.size());  // the header overwrites it
    write_at(own_fd.get(), token.data(), token.size(), 0, fail + " (" + path + ")");
    if (::fdatasync(own_fd.get()) != 0) fail_errno(errno, fail + " (flushing " + path + ")");
  }

  // Step 2's messages: to each writer, the bytes of this rank's rows at the ends of its parts in
  // that writer's file (each an EdgeHead, then its bytes).
  std::vector<std::string> edges_to_writers() const {
    std::vector<std::string> messages(static_cast<std::size_t>(team.replicas()->size()));
    std::map<int, InPlaceFilePlan> plans;
    for (const RowsInPlace::Part& part : rows.mine) {
      if (part.writer == me) continue;  // a writer's own rows: all of them written by it
      auto plan = plans.find(part.writer);
      if (plan == plans.end()) plan = plans.emplace(part.writer, this->plan(part.writer)).first;
      const std::uint64_t start = plan->second.data_of.at(state[part.name].first) + part.first_byte;
      const std::uint64_t count = part.rows.nbytes();
      const PartSplit split = split_part(start, count);
      const at::Tensor bytes = bytes_of(part.rows);
      std::string& out = messages[static_cast<std::size_t>(part.writer)];
      const auto add = [&](std::uint64_t from, std::uint64_t n) {  // from: into the part
        if (n == 0) return;
        const EdgeHead head{part.name, part.first_byte + from, n};
        out.append(reinterpret_cast<const char*>(&head), sizeof head);
        const at::Tensor cpu = bytes.narrow(0, static_cast<int64_t>(from), static_cast<int64_t>(n)).to(at::kCPU);
        out.append(reinterpret_cast<const char*>(cpu.data_ptr<std::uint8_t>()), n);
      };
      add(0, split.inner_begin - start);
      add(split.inner_end - start, start + count - split.inner_end);
    }
    return messages;
  }

  // The edges in `received` (a message from each rank), kept for write().
  void keep_edges() {
    const char* start = received.data();
    for (const std::string_view message : received.messages()) {
      TORCH_INTERNAL_ASSERT(message.empty() || (own && !own->file.empty()),
                            "shared blocks sent to a rank without a file");
      for (std::size_t at = 0; at < message.size();) {
        EdgeHead head;
        TORCH_INTERNAL_ASSERT(message.size() - at >= sizeof head, "a shared block's message cut short");
        std::memcpy(&head, message.data() + at, sizeof head);
        at += sizeof head;
        TORCH_INTERNAL_ASSERT(head.name < state.size() && head.count <= message.size() - at);
        const std::string& name = state[head.name].first;
        const auto bytes = own->bytes_of.find(name);
        TORCH_INTERNAL_ASSERT(bytes != own->bytes_of.end() && head.first_byte <= bytes->second &&
                                  head.count <= bytes->second - head.first_byte,
                              "a shared block outside its tensor");
        const auto offset = static_cast<std::uint64_t>(message.data() + at - start);  // in `received`
        edges.push_back({head.name, head.first_byte, offset, head.count});
        at += head.count;
      }
    }
  }
};

ShardsInPlace::ShardsInPlace(NamedTensors state, RowsInPlace rows, const CheckpointTeam& team, std::string dir,
                             std::string_view stem, std::map<std::string, std::string> metadata,
                             const std::string& token, std::string what)
    : impl_(std::make_unique<Impl>(std::move(state), std::move(rows), team, std::move(dir), stem, token,
                                   std::move(what), std::move(metadata))) {
  TORCH_INTERNAL_ASSERT(team.replicas(), "rows written in place without a data-parallel group");
  Impl& s = *impl_;
  s.me = team.writes() ? team.writer_rank() : -1;
  for (int w = 0; w < team.writers(); ++w) {
    s.has_file.push_back(!state_dict_shard(s.state, w, team.writers(), s.stem).file.empty());
  }
  const auto agree = [&](std::exception_ptr failure) {
    try {
      team.agree(failure, s.what);
    } catch (...) {
      abandon();
      throw;
    }
  };
  // 1. Each writer's file.
  std::exception_ptr failure;
  if (s.me >= 0) {
    try {
      s.create_file();
    } catch (...) {
      failure = std::current_exception();
    }
  }
  agree(failure);
  // 2. The bytes of each rank's rows that share a block with another's go to the file's writer.
  std::vector<std::string> messages;
  try {
    messages = s.edges_to_writers();
  } catch (...) {
    failure = std::current_exception();
  }
  messages.resize(static_cast<std::size_t>(team.replicas()->size()));
  s.received = exchange(*team.replicas(), std::move(messages), failure, agree);
  try {
    s.keep_edges();
  } catch (...) {
    failure = std::current_exception();
  }
  agree(failure);
}

ShardsInPlace::~ShardsInPlace() = default;
ShardsInPlace::ShardsInPlace(ShardsInPlace&&) noexcept = default;
ShardsInPlace& ShardsInPlace::operator=(ShardsInPlace&&) noexcept = default;

bool ShardsInPlace::writes_file() const { return impl_->own && !impl_->own->file.empty(); }

bool ShardsInPlace::has_file(int writer) const {
  return writer >= 0 && writer < static_cast<int>(impl_->has_file.size()) && impl_->has_file[writer];
}

void ShardsInPlace::abandon() noexcept {
  impl_->own_fd = InPlaceFile();
  impl_->temporary.remove();
}

std::vector<std::string> ShardsInPlace::write() {
  Impl& s = *impl_;
  // Once written, or failed: what an asynchronous save copied goes now, not when its thread ends
  // (finish() needs the names alone).
  struct Release {
    Impl& s;
    ~Release() {
      std::vector<RowsInPlace::Part>().swap(s.rows.mine);
      std::vector<Impl::Edge>().swap(s.edges);
      s.received = InPlaceReceived();
      for (auto& item : s.state) item.second = at::Tensor();
    }
  } release{s};
  std::vector<std::vector<PartRecord>> records(static_cast<std::size_t>(s.team.replicas()->size()));
  // Writer 0's file is opened by every rank, whether or not it holds rows of it: a rank that does
  // not share the directory finds out even when all its rows go to writers on its own node.
  const InPlaceFilePlan first = s.plan(0);
  if (s.me != 0 && !first.file.empty()) {
    (void)open_writers_file(s.dir, first.file, s.token, s.writer_name(0), s.stem, s.what);
  }
  // Every rank's rows into the files that hold them, but for the blocks they share with others
  // (Note [One writer a block]): the writer has those. One other writer's file open at a time:
  // the parts come in the files' order.
  std::optional<std::pair<int, InPlaceFilePlan>> current;
  InPlaceFile current_fd;
  const auto close_current = [&] {
    if (current) current_fd.flush_and_close(s.cannot(current->second.file));
    current.reset();
  };
  for (const RowsInPlace::Part& part : s.rows.mine) {
    const InPlaceFilePlan* plan = s.own ? &*s.own : nullptr;
    int fd = s.own_fd.get();
    if (part.writer != s.me) {
      if (!current || current->first != part.writer) {
        close_current();
        current.emplace(part.writer, s.plan(part.writer));
        current_fd =
            open_writers_file(s.dir, current->second.file, s.token, s.writer_name(part.writer), s.stem, s.what);
      }
      plan = &current->second;
      fd = current_fd.get();
    }
    const std::string& name = s.state[part.name].first;
    const at::Tensor cpu = part.rows.detach().to(at::kCPU).contiguous();
    const char* bytes = static_cast<const char*>(cpu.data_ptr());
    const std::uint64_t start = plan->data_of.at(name) + part.first_byte, count = cpu.nbytes();
    const std::string fail = s.cannot(plan->file) + " (\"" + name + "\")";
    std::uint64_t begin = start, end = start + count;  // what this rank writes of it
    if (part.writer != s.me) {
      const PartSplit split = split_part(start, count);
      begin = split.inner_begin, end = split.inner_end;
    }
    if (begin == end) continue;
    write_at(fd, bytes + (begin - start), end - begin, begin, fail);
    records[static_cast<std::size_t>(part.writer)].push_back(
        {part.name, part.first_byte + (begin - start), end - begin, written_crc(bytes + (begin - start), end - begin)});
  }
  close_current();
  if (s.me >= 0 && s.own && !s.own->file.empty()) {
    // The rest of this writer's file but its header: the tensors it holds whole, the shared blocks.
    std::vector<PartRecord>& mine = records[static_cast<std::size_t>(s.me)];
    std::map<std::string, std::size_t> index;  // name -> its index in `state`
    for (std::size_t i = 0; i < s.state.size(); ++i) index.emplace(s.state[i].first, i);
    for (const auto& [name, tensor] : state_dict_shard(s.state, s.me, s.team.writers(), s.stem).tensors) {
      if (tensor.is_meta()) continue;  // written in place by the rows' ranks
      const at::Tensor cpu = tensor.detach().to(at::kCPU).contiguous();
      const char* bytes = static_cast<const char*>(cpu.data_ptr());
      write_at(s.own_fd.get(), bytes, cpu.nbytes(), s.own->data_of.at(name),
               s.cannot(s.own->file) + " (\"" + name + "\")");
      mine.push_back({index.at(name), 0, cpu.nbytes(), written_crc(bytes, cpu.nbytes())});
    }
    const char* received = s.received.data();
    for (const Impl::Edge& edge : s.edges) {
      const std::uint64_t at = s.own->data_of.at(s.state[edge.name].first) + edge.first_byte;
      write_at(s.own_fd.get(), received + edge.at, edge.count, at, s.cannot(s.own->file) + " (a shared block)");
      mine.push_back({edge.name, edge.first_byte, edge.count, written_crc(received + edge.at, edge.count)});
    }
  }
  std::vector<std::string> out(records.size());
  for (std::size_t w = 0; w < records.size(); ++w) {
    out[w].assign(reinterpret_cast<const char*>(records[w].data()), records[w].size() * sizeof(PartRecord));
  }
  return out;
}

std::string ShardsInPlace::finish(const std::vector<std::string>& records) {
  Impl& s = *impl_;
  TORCH_INTERNAL_ASSERT(writes_file(), "finish() on a rank without a file");
  const std::string path = (fs::path(s.dir) / s.own->file).string();
  const std::string fail = s.cannot(s.own->file);
  std::vector<WrittenPart> parts;
  for (const std::string& packed : records) {
    TORCH_INTERNAL_ASSERT(packed.size() % sizeof(PartRecord) == 0, "a rank's records of ", path, " cut short");
    for (std::size_t at = 0; at < packed.size(); at += sizeof(PartRecord)) {
      PartRecord r;
      std::memcpy(&r, packed.data() + at, sizeof r);
      TORCH_INTERNAL_ASSERT(r.name < s.state.size());
      parts.push_back({s.state[r.name].first, r.first_byte, r.bytes, static_cast<std::uint32_t>(r.crc)});
    }
  }
  const std::uint32_t crc = file_crc_of_parts(s.own->layout, std::move(parts), path);
  const std::string header = safetensors_header(s.own->layout, crc);
  write_at(s.own_fd.get(), header.data(), header.size(), 0, fail + " (its header)");
  s.own_fd.flush_and_close(fail);
  note_replacing(path);  // Note [A failed save puts the previous files back]
  if (::rename(s.temporary.path.c_str(), path.c_str()) != 0) {
    fail_errno(errno, fail + " (renaming " + s.temporary.path + " over it)");
  }
  note_replaced(path);
  s.temporary.path.clear();
  const int dir_fd = ::open(s.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);  // the rename's durability
  if (dir_fd >= 0) ::fsync(dir_fd), ::close(dir_fd);
  return path;
}

void write_shards_in_place(const NamedTensors& state, const RowsInPlace& rows, const CheckpointTeam& team,
                           const std::string& dir, std::string_view stem,
                           const std::map<std::string, std::string>& metadata, const std::string& token,
                           const std::string& what) {
  ShardsInPlace job(state, rows, team, dir, stem, metadata, token, what);  // its temporary file goes with it
  const auto agree = [&](std::exception_ptr failure) { team.agree(failure, what); };
  // 3. Every rank's rows into the files; the records of what each wrote go to the file's writer.
  std::vector<std::string> records;
  std::exception_ptr failure;
  try {
    records = job.write();
  } catch (...) {
    failure = std::current_exception();
  }
  records.resize(static_cast<std::size_t>(team.replicas()->size()));
  const InPlaceReceived received = exchange(*team.replicas(), std::move(records), failure, agree);
  // 4. Each writer puts its file in place; the team agrees (the caller's ReplacedFiles undoes a
  // file put in place when the save failed).
  if (job.writes_file()) {
    try {
      std::vector<std::string> from_each;
      for (const std::string_view message : received.messages()) from_each.emplace_back(message);
      job.finish(from_each);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  agree(failure);
}

}  // namespace cpprun::detail
