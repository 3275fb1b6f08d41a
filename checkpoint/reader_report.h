// What a rank that read its share of a sharded directory (checkpoint/parallel_load.h) tells the
// others: the files it found missing, or its error, or what each of its files holds (names,
// dtypes, shapes, save id; no values). Every rank decides from every reader's report alike. Also
// who reads which file. Pure: no I/O, no collective.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "support/file_read.h"

namespace cpprun::detail {

struct ReadTensorInfo {
  std::string name;  // as the file names it
  c10::ScalarType dtype = c10::kFloat;
  std::vector<int64_t> sizes;
  // The CRC-32 of its bytes, for a tensor under a name the model ties to another (the tie check
  // compares values the ranks do not share); none otherwise.
  std::optional<std::uint32_t> crc;
  std::uint64_t offset = 0;  // where its bytes start in the file (the header's length included)
};

struct ReadFileInfo {
  std::string file;     // its name in the directory
  std::string save_id;  // kSaveIdKey, "" when it has none
  std::map<std::string, std::string> metadata;  // its __metadata__ (an optimizer's kind and groups)
  std::vector<ReadTensorInfo> tensors;          // in the file's order
  FileIdentity identity;  // the file the reader checked: every rank reads its parts from that file
};

struct ReaderReport {
  int rank = 0;                     // the job's rank of the reader, for "(raised on rank R)"
  std::string failure;              // describe_failure's bytes (core/failure_agreement.h); empty: none
  std::vector<std::string> absent;  // files of its share the directory lacks (then nothing is read)
  std::vector<ReadFileInfo> files;  // what it read
};

std::string encode_reader_report(const ReaderReport& report);
ReaderReport decode_reader_report(std::string_view bytes);

// File `file_index` (of the index's files in name order) is read by writer file_index mod
// `writers` (checkpoint/checkpoint_team.h): each of W writers reads about 1/W of the files, at any
// world size the directory was saved at (the save's writer r wrote file r + 1).
int reader_of_file(std::size_t file_index, int writers);

}  // namespace cpprun::detail
