// Which save id a save into a checkpoint directory records. See Note [One save id for a model
// and its optimizer] in the .cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "cpprun/state_dict_options.h"

namespace cpprun::detail {

// The last save this process made into one directory: its id, its step, and the stems of the
// files it wrote there ("model", "optimizer").
struct DirectorySave {
  std::string save_id;
  std::optional<int64_t> step;
  std::set<std::string> stems;
  bool operator==(const DirectorySave&) const = default;
};

// The decision, pure: what a save of STEMS at STEP into a directory whose last save was LAST
// records, and is then remembered for it. A given id is taken as it is (joining LAST's stems when
// it is LAST's id). No id given: the save joins LAST (its id) when LAST has the same step (or
// neither has one) and wrote none of STEMS; otherwise it is a new save, FRESH_ID.
DirectorySave next_directory_save(const std::optional<DirectorySave>& last, const std::optional<std::string>& given,
                                  const std::optional<int64_t>& step, const std::set<std::string>& stems,
                                  const std::string& fresh_id);

// The doing, on the rank that draws the id (rank 0, or a process alone): decides with this
// process's memory of DIR (by canonical path) and remembers the result. Thread-safe.
std::string claim_save_id(const std::string& dir, const StateDictSaveOptions& options,
                          const std::set<std::string>& stems);
// A save that failed wrote nothing: DIR's memory no longer counts STEMS as written under SAVE_ID
// (a retry of the same save joins the same id). Thread-safe; never throws.
void forget_failed_save(const std::string& dir, const std::string& save_id, const std::set<std::string>& stems) noexcept;

}  // namespace cpprun::detail
