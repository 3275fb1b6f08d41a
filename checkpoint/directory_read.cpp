// See directory_read.h.
#include "checkpoint/directory_read.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <exception>
#include <filesystem>
#include <optional>
#include <set>
#include <utility>

#include "checkpoint/sharded_state_dict.h"
#include "checkpoint/state_dict.h"
#include "core/failure_agreement.h"
#include "cpprun/checkpoint_file.h"
#include "cpprun/process_group.h"
#include "support/crc32.h"
#include "support/file_read.h"
#include "support/safetensors.h"

namespace cpprun::detail {
namespace {

// This rank's share: its files checked for, then read and checked (what they hold reported, not
// decoded: every rank then reads its own part). A failure is kept in `failure` and described in
// the report.
ReaderReport read_share(const std::vector<std::string>& files, const std::string& dir,
                        const std::function<bool(const std::string&)>& wants_crc, std::exception_ptr& failure) {
  ReaderReport report;
  report.rank = cpprun::rank();
  try {
    for (const auto& file : files) {
      if (!std::filesystem::exists(std::filesystem::path(dir) / file)) report.absent.push_back(file);
    }
    if (!report.absent.empty()) return report;  // every rank refuses the load, listing them
    for (const auto& file : files) {
      const std::string file_path = (std::filesystem::path(dir) / file).string();
      // The file these bytes came from: unchanged from before the read to after it.
      const FileIdentity before = identity_of(file_path, "the checkpoint file");
      const std::string bytes = read_state_dict_bytes(file_path);
      const FileIdentity after = identity_of(file_path, "the checkpoint file");
      if (after != before || after.size != bytes.size()) {
        throw CorruptCheckpointError("cpprun: " + file_path + " changed while it was read: was a checkpoint being "
                                     "saved into " + dir + " during the load? Load a directory no save is writing to.");
      }
      const SafetensorsFile parsed = read_safetensors(bytes, file_path);
      ReadFileInfo info{file, {}, parsed.metadata, {}, after};
      const auto id = parsed.metadata.find(std::string(kSaveIdKey));
      if (id != parsed.metadata.end()) info.save_id = id->second;
      // Described from the checked header and bytes, never decoded: each rank reads its part later.
      for (const auto& tensor : parsed.tensors) {
        ReadTensorInfo t{tensor.name, safetensors_scalar_type(tensor, file_path), tensor.shape, std::nullopt,
                         static_cast<std::uint64_t>(tensor.data.data() - bytes.data())};
        if (wants_crc && wants_crc(tensor.name)) t.crc = crc32(tensor.data);
        info.tensors.push_back(std::move(t));
      }
      report.files.push_back(std::move(info));
    }
  } catch (...) {
    failure = std::current_exception();
    report.failure = describe_failure(failure);
    report.absent.clear();
    report.files.clear();
  }
  return report;
}

}  // namespace

TeamDirectoryRead read_directory_on_writers(const CheckpointTeam& team, const std::string& dir, std::string_view stem,
                                            const std::string& index_text,
                                            const std::function<bool(const std::string&)>& wants_crc) {
  TeamDirectoryRead out;
  out.dir = dir;
  out.index_path = (std::filesystem::path(dir) / index_file_name(stem)).string();
  out.index = read_safetensors_index(index_text, out.index_path);
  const std::map<std::string, std::vector<std::string>> promised = files_of_index(out.index);
  std::vector<std::string> share;
  for (const auto& [file, names] : promised) {
    const int reader = reader_of_file(out.files.size(), team.writers());
    if (team.writes() && reader == team.writer_rank()) share.push_back(file);
    out.files.push_back(file);
  }

  // Read, tell, decide alike (Note [Reading a directory on every rank]).
  std::exception_ptr failure;
  const ReaderReport own = read_share(share, dir, wants_crc, failure);
  for (const auto& bytes : team.gather_from_writers(encode_reader_report(own))) {
    out.reports.push_back(decode_reader_report(bytes));
  }
  std::set<std::string> absent_set;
  for (const auto& report : out.reports) absent_set.insert(report.absent.begin(), report.absent.end());
  if (!absent_set.empty()) {
    std::vector<std::string> absent;
    for (const auto& [file, names] : promised) {
      if (absent_set.count(file)) absent.push_back(file);
    }
    throw absent_files_error(out.index_path, dir, promised, absent);
  }
  for (const auto& report : out.reports) {
    if (report.failure.empty()) continue;
    if (failure) std::rethrow_exception(failure);  // this rank's own, when it failed too
    throw_described_failure(report.failure, report.rank);
  }
  for (const auto& report : out.reports) {
    for (const auto& file : report.files) out.info_of[file.file] = &file;
  }
  std::vector<ShardFileContents> contents;
  for (const auto& [file, names] : promised) {
    const auto found = out.info_of.find(file);
    TORCH_INTERNAL_ASSERT(found != out.info_of.end(), "no reader read ", file);
    ShardFileContents seen{file, {}, found->second->save_id};
    for (const auto& t : found->second->tensors) seen.tensors.push_back(t.name);
    contents.push_back(std::move(seen));
  }
  const std::vector<std::string> faults = sharded_directory_faults(out.index, contents);
  if (!faults.empty()) throw directory_faults_error(dir, faults);
  return out;
}

}  // namespace cpprun::detail
