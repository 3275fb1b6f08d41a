// The files a save replaces, kept until the save is known to have succeeded on every rank, so that
// a save that fails puts the previous checkpoint back rather than leaving half of each. See Note [A
// failed save puts the previous files back] in checkpoint/replaced_files.cpp. Users do not need
// this header's names.
#pragma once

#include <string>
#include <vector>

namespace cpprun::detail {

// A save's scope on this thread. While one is open, the checkpoint writers note each file they
// are about to replace (or remove): its current version stays as PATH.prev (a hard link, no copy)
// until the scope ends. done(): the save succeeded, and the previous versions go (or pass to the
// scope around this one, whose save is not over). put_back(): the save failed, and each replaced
// file's previous version goes back in its place (a file that had none is removed). A scope left
// by an exception puts back. Scopes nest: a model's and its optimizer's save inside one scope
// succeed or fail together.
class ReplacedFiles {
 public:
  ReplacedFiles();
  ~ReplacedFiles();
  ReplacedFiles(const ReplacedFiles&) = delete;
  ReplacedFiles& operator=(const ReplacedFiles&) = delete;

  void done() noexcept;
  void put_back() noexcept;
  // Neither: the save's outcome is unknown (a rank that never heard), so the new files and the
  // previous versions (PATH.prev) both stay, for a person to choose.
  void leave() noexcept;

  struct File {
    std::string path;
    bool had_previous = false;  // PATH.prev holds the version this save replaces
    bool replaced = false;      // this save put its own file at PATH (or removed PATH)
  };

 private:
  friend void note_replacing(const std::string& path) noexcept;
  friend void note_replaced(const std::string& path) noexcept;
  static File* find(const std::string& path) noexcept;
  ReplacedFiles* outer_;
  std::vector<File> files_;  // empty once the scope ended (done, put_back, leave)
};

// For the writers, inside this thread's innermost scope (with none open, they do nothing): PATH
// is about to be replaced or removed, and then it was.
void note_replacing(const std::string& path) noexcept;
void note_replaced(const std::string& path) noexcept;

// For a load that refuses DIR's files as not one save: when DIR holds PATH.prev files (a save
// killed before its ranks agreed leaves them, Note [A failed save puts the previous files back]),
// a paragraph naming them and the command that puts the earlier checkpoint back; else "".
std::string interrupted_save_note(const std::string& dir);

}  // namespace cpprun::detail
