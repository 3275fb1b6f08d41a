// See save_ids.h.
#include "checkpoint/save_ids.h"

#include <filesystem>
#include <map>
#include <mutex>
#include <system_error>

#include "checkpoint/sharded_state_dict.h"

// Note [One save id for a model and its optimizer]
// Every file of a sharded save records a save id, and a load refuses a directory whose model and
// optimizer files come from different saves. The natural code saves them in two calls with the
// same options and no id,
//     cpprun::save_state_dict(model, "ck/", options);
//     cpprun::save_optimizer_state_dict(model, optimizer, "ck/", options);
// so an id drawn per call would make that checkpoint unloadable after the data is written. So a
// process remembers, per directory, its last save there (id, step, the stems it wrote), and a save
// with no id given joins that save when it is the other half of it: the same step (or neither
// has one) and a stem not yet written. The model saved twice (another epoch, the same or no step)
// is a new save, as is anything at another step; so the safety check keeps its point: files of
// two saves (another step, another run, another process) are still refused. Rank 0 decides and
// broadcasts the id (the other ranks keep no memory), so every rank writes the same one. A given
// id is remembered as well: an optimizer saved after a model with a given id joins it.
// What the memory cannot see is training between two saves at no step into one directory; the
// step is what tells two saves apart, as the documentation says.

namespace cpprun::detail {
namespace {
namespace fs = std::filesystem;

std::mutex memory_mutex;
std::map<std::string, DirectorySave>& memory() {
  static std::map<std::string, DirectorySave> saves;  // canonical directory -> its last save
  return saves;
}

std::string canonical_directory(const std::string& dir) {
  std::error_code error;
  fs::path path = fs::weakly_canonical(fs::absolute(dir, error), error);
  if (error) path = fs::absolute(dir).lexically_normal();
  if (!path.has_filename()) path = path.parent_path();  // "ck/" and "ck" alike
  return path.string();
}

bool disjoint(const std::set<std::string>& a, const std::set<std::string>& b) {
  for (const auto& item : a) {
    if (b.count(item)) return false;
  }
  return true;
}

}  // namespace

DirectorySave next_directory_save(const std::optional<DirectorySave>& last, const std::optional<std::string>& given,
                                  const std::optional<int64_t>& step, const std::set<std::string>& stems,
                                  const std::string& fresh_id) {
  const bool joins = given ? last && last->save_id == *given
                           : last && last->step == step && disjoint(last->stems, stems);
  if (!joins) return {given.value_or(fresh_id), step, stems};
  DirectorySave out = *last;
  out.step = step;
  out.stems.insert(stems.begin(), stems.end());
  return out;
}

std::string claim_save_id(const std::string& dir, const StateDictSaveOptions& options,
                          const std::set<std::string>& stems) {
  const std::string key = canonical_directory(dir);
  const std::string fresh = options.save_id() ? std::string() : new_save_id();
  std::lock_guard<std::mutex> lock(memory_mutex);
  const auto found = memory().find(key);
  const std::optional<DirectorySave> last =
      found == memory().end() ? std::nullopt : std::optional<DirectorySave>(found->second);
  DirectorySave next = next_directory_save(last, options.save_id(), options.step(), stems, fresh);
  std::string id = next.save_id;
  memory()[key] = std::move(next);
  return id;
}

void forget_failed_save(const std::string& dir, const std::string& save_id, const std::set<std::string>& stems) noexcept {
  try {
    const std::string key = canonical_directory(dir);
    std::lock_guard<std::mutex> lock(memory_mutex);
    const auto found = memory().find(key);
    if (found == memory().end() || found->second.save_id != save_id) return;
    for (const auto& stem : stems) found->second.stems.erase(stem);
  } catch (...) {
    // Forgetting is a courtesy to a retry; the save's own error is what the caller raises.
  }
}

}  // namespace cpprun::detail
