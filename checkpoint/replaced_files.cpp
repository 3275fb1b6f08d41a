// See cpprun/detail/replaced_files.h.
#include "cpprun/detail/replaced_files.h"

#include <algorithm>
#include <filesystem>
#include <string>
#include <system_error>

// Note [A failed save puts the previous files back]
// A save of several files (a sharded directory, a model and its optimizer) puts each file in
// place as it is written, by rename, atomically, and the index last. When a later file fails (a
// full disk, which the optimizer's state, the larger part, usually meets), the files already in
// place have replaced the earlier checkpoint's, and removing them (what a failed save did) left
// neither checkpoint: an index naming missing files, or a new model beside the old optimizer,
// which a load refuses. So before a writer replaces a file, the file's current version is kept as
// PATH.prev, a hard link (no bytes copied; the rename then leaves the old data only there, still
// allocated: a save over a checkpoint needs room for both until it ends, where each rename used
// to free the old file's space as it went; docs/checkpoints.md says so). When
// the ranks agree that the save failed, each puts its previous versions back (renamed over the new
// files) and removes the new files that replaced none; when they agree it succeeded, each removes
// its PATH.prev. A model and its optimizer saved together (save_state_dict(model, optimizer, dir),
// save_async with both) are one scope: the model's previous files stay until the optimizer's save
// ends, and go back when it fails. A process killed mid-save leaves PATH.prev beside the new
// files (the earlier data), which no load reads and the next save of PATH removes; a load that
// then refuses the directory's mix of two saves names them and the command that renames them back
// (interrupted_save_note), rather than doing it itself: a load does not write, and whether the
// newer files or the earlier ones are wanted is the person's call. Where a hard link cannot be
// made (a file system without them), nothing is kept, and a failed save removes its files as
// before. PyTorch's DCP and save_pretrained overwrite in place and keep nothing; torchtitan and the
// Trainer save each step into a directory of its own, which avoids the question (and which works
// here too).

namespace cpprun::detail {
namespace {

namespace fs = std::filesystem;

thread_local ReplacedFiles* innermost = nullptr;

constexpr const char* kPreviousSuffix = ".prev";

std::string previous_of(const std::string& path) { return path + kPreviousSuffix; }

// DIR for a POSIX shell, in single quotes (a quote inside closed, escaped, reopened).
std::string shell_quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

ReplacedFiles::ReplacedFiles() : outer_(innermost) { innermost = this; }

ReplacedFiles::~ReplacedFiles() {
  put_back();  // nothing left after done() or leave(); a scope left by an exception puts back
  innermost = outer_;
}

// PATH's entry in this thread's innermost scope that has one (a save inside a scope of its own
// noted it first, or the scope around it did, whose PATH.prev is then the one to keep).
ReplacedFiles::File* ReplacedFiles::find(const std::string& path) noexcept {
  for (ReplacedFiles* scope = innermost; scope; scope = scope->outer_) {
    for (auto& file : scope->files_) {
      if (file.path == path) return &file;
    }
  }
  return nullptr;
}

void note_replacing(const std::string& path) noexcept {
  ReplacedFiles* scope = innermost;
  if (!scope || ReplacedFiles::find(path)) return;
  auto& files = scope->files_;
  try {
    ReplacedFiles::File file{path};
    std::error_code ignored;
    fs::remove(previous_of(path), ignored);  // a killed save's, not this one's
    std::error_code not_linked;
    if (fs::is_regular_file(path, ignored)) fs::create_hard_link(path, previous_of(path), not_linked);
    file.had_previous = fs::is_regular_file(path, ignored) && !not_linked;
    files.push_back(std::move(file));
  } catch (...) {
    // Out of memory noting it: the save goes on, and a failure removes nothing of this file.
  }
}

void note_replaced(const std::string& path) noexcept {
  if (ReplacedFiles::File* file = ReplacedFiles::find(path)) file->replaced = true;
}

std::string interrupted_save_note(const std::string& dir) {
  std::vector<std::string> previous;
  const std::size_t suffix = std::char_traits<char>::length(kPreviousSuffix);
  std::error_code error;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (name.size() > suffix && name.compare(name.size() - suffix, suffix, kPreviousSuffix) == 0) previous.push_back(name);
  }
  if (previous.empty()) return "";
  std::sort(previous.begin(), previous.end());
  std::string shown = dir;  // "run/ck/" and "run/ck" alike
  while (shown.size() > 1 && shown.back() == '/') shown.pop_back();
  const std::string quoted = shell_quoted(shown);
  constexpr std::size_t kNamed = 6;  // a sharded save's many files: the first few say enough
  std::string names;
  for (std::size_t i = 0; i < previous.size() && i < kNamed; ++i) names += (i ? ", " : "") + previous[i];
  if (previous.size() > kNamed) names += ", ...";
  return "\n" + shown + " holds " + std::to_string(previous.size()) + " file(s) named NAME.prev (" + names +
         "): the versions a save that did not finish (a killed process) was "
         "replacing, which are the earlier checkpoint's (a part saved before it by a call of its own, which "
         "finished, kept no earlier files). To go back to them, rename each over its NAME:\n  for f in " +
         quoted + "/*.prev; do mv -f \"$f\" \"${f%.prev}\"; done\nor, to keep the newer files, save again.";
}

void ReplacedFiles::put_back() noexcept {
  for (auto it = files_.rbegin(); it != files_.rend(); ++it) {
    std::error_code ignored;
    const std::string previous = previous_of(it->path);
    if (it->had_previous) {
      // Renamed back when this save replaced it; else PATH.prev is a second name of PATH's file.
      if (it->replaced) fs::rename(previous, it->path, ignored);
      fs::remove(previous, ignored);
    } else if (it->replaced) {
      fs::remove(it->path, ignored);
    }
  }
  files_.clear();
}

void ReplacedFiles::leave() noexcept {
  files_.clear();
}

void ReplacedFiles::done() noexcept {
  if (outer_) {
    auto& outer = outer_->files_;
    try {
      outer.reserve(outer.size() + files_.size());  // the only step that can throw: before any move
    } catch (...) {
      // Out of memory passing them on: their previous versions go now, as without the outer scope.
    }
    if (outer.capacity() >= outer.size() + files_.size()) {
      for (auto& file : files_) {
        const bool known = std::any_of(outer.begin(), outer.end(), [&](const auto& f) { return f.path == file.path; });
        if (!known) outer.push_back(std::move(file));
      }
      files_.clear();
      return;
    }
  }
  for (const auto& file : files_) {
    std::error_code ignored;
    if (file.had_previous) fs::remove(previous_of(file.path), ignored);
  }
  files_.clear();
}

}  // namespace cpprun::detail
