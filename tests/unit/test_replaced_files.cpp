// detail::ReplacedFiles (Note [A failed save puts the previous files back]): what a save's scope
// keeps, puts back and removes, with real files in a scratch directory, as the writers note them.
#include "catch.h"

#include <unistd.h>  // getpid

#include <cstdlib>  // std::system
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>

#include "cpprun/detail/replaced_files.h"

namespace {

namespace fs = std::filesystem;
using cpprun::detail::note_replaced;
using cpprun::detail::note_replacing;
using cpprun::detail::ReplacedFiles;

struct ReplacedScratch {
  fs::path dir = fs::temp_directory_path() / ("cpprun_replaced_files_" + std::to_string(::getpid()));
  ReplacedScratch() {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~ReplacedScratch() { fs::remove_all(dir); }
  std::string path(const std::string& name) const { return (dir / name).string(); }
  // Every file in the directory and its contents.
  std::map<std::string, std::string> files() const {
    std::map<std::string, std::string> out;
    for (const auto& entry : fs::directory_iterator(dir)) {
      std::ifstream in(entry.path());
      out[entry.path().filename().string()] = std::string(std::istreambuf_iterator<char>(in), {});
    }
    return out;
  }
};

// What a writer does: notes PATH, replaces it by rename (as write_file_atomically does), notes it.
void write_noted(const std::string& path, const std::string& text) {
  note_replacing(path);
  std::ofstream(path + ".tmp") << text;
  fs::rename(path + ".tmp", path);
  note_replaced(path);
}

}  // namespace

TEST_CASE("ReplacedFiles: a failed save puts back what it replaced and removes what it added", "[replaced_files]") {
  ReplacedScratch s;
  std::ofstream(s.path("model.safetensors")) << "old model";
  std::ofstream(s.path("optimizer.safetensors")) << "old optimizer";
  {
    ReplacedFiles scope;
    write_noted(s.path("model.safetensors"), "new model");
    write_noted(s.path("extra.safetensors"), "new file");
    note_replacing(s.path("optimizer.safetensors"));  // its write failed before the rename
    CHECK(s.files().count("model.safetensors.prev") == 1);
    scope.put_back();
  }
  CHECK(s.files() == std::map<std::string, std::string>{{"model.safetensors", "old model"},
                                                        {"optimizer.safetensors", "old optimizer"}});
  // Left by an exception: the same.
  try {
    ReplacedFiles scope;
    write_noted(s.path("model.safetensors"), "new model");
    throw std::runtime_error("the disk is full");
  } catch (const std::runtime_error&) {
  }
  CHECK(s.files().at("model.safetensors") == "old model");
  CHECK(s.files().size() == 2);
}

TEST_CASE("ReplacedFiles: a save that succeeds keeps nothing of the previous files", "[replaced_files]") {
  ReplacedScratch s;
  std::ofstream(s.path("model.safetensors")) << "old model";
  std::ofstream(s.path("model.safetensors.prev")) << "a killed save's";
  {
    ReplacedFiles scope;
    write_noted(s.path("model.safetensors"), "new model");
    write_noted(s.path("index.json"), "new index");
    scope.done();
  }
  CHECK(s.files() ==
        std::map<std::string, std::string>{{"model.safetensors", "new model"}, {"index.json", "new index"}});
  // Outside any scope the writers' notes do nothing.
  write_noted(s.path("model.safetensors"), "newer model");
  CHECK(s.files().size() == 2);
}

TEST_CASE("ReplacedFiles: nested saves end with the outer one; removed files come back", "[replaced_files]") {
  ReplacedScratch s;
  std::ofstream(s.path("model.safetensors")) << "old model";
  std::ofstream(s.path("model-00001-of-00002.safetensors")) << "an earlier save's shard";
  std::ofstream(s.path("optimizer.safetensors")) << "old optimizer";
  const auto before = s.files();
  {
    ReplacedFiles together;
    {
      ReplacedFiles model;
      write_noted(s.path("model.safetensors"), "new model");
      // An earlier save's file that this save removes (as an index's cleaning does).
      note_replacing(s.path("model-00001-of-00002.safetensors"));
      fs::remove(s.path("model-00001-of-00002.safetensors"));
      note_replaced(s.path("model-00001-of-00002.safetensors"));
      model.done();  // the model's save succeeded, but the pair is not over
    }
    CHECK(s.files().count("model.safetensors.prev") == 1);
    {
      ReplacedFiles optimizer;
      write_noted(s.path("optimizer.safetensors"), "new optimizer");
      optimizer.put_back();  // the optimizer's failed
    }
    CHECK(s.files().at("optimizer.safetensors") == "old optimizer");
  }  // the pair left by its failure: the model comes back too
  CHECK(s.files() == before);
  {
    ReplacedFiles together;
    {
      ReplacedFiles model;
      write_noted(s.path("model.safetensors"), "new model");
      model.done();
    }
    {
      ReplacedFiles optimizer;
      write_noted(s.path("optimizer.safetensors"), "new optimizer");
      optimizer.done();
    }
    together.done();
  }
  CHECK(s.files() == std::map<std::string, std::string>{{"model.safetensors", "new model"},
                                                        {"model-00001-of-00002.safetensors", "an earlier save's shard"},
                                                        {"optimizer.safetensors", "new optimizer"}});
  // An outcome nobody knows: both versions stay.
  {
    ReplacedFiles unknown;
    write_noted(s.path("model.safetensors"), "unknown model");
    unknown.leave();
  }
  CHECK(s.files().at("model.safetensors") == "unknown model");
  CHECK(s.files().at("model.safetensors.prev") == "new model");
}

TEST_CASE("ReplacedFiles: a save cut short is named by the load's refusal, with a command that puts it back",
          "[replaced_files]") {
  ReplacedScratch s;
  CHECK(cpprun::detail::interrupted_save_note(s.dir.string()).empty());
  // A directory whose name the command must quote: a space and a single quote.
  const fs::path dir = s.dir / "it's a run";
  fs::create_directories(dir);
  std::ofstream((dir / "model.safetensors").string()) << "old model";
  std::ofstream((dir / "optimizer.safetensors").string()) << "old optimizer";
  {
    ReplacedFiles killed;  // the model's file renamed into place, then the process killed
    write_noted((dir / "model.safetensors").string(), "new model");
    killed.leave();
  }
  const std::string note = cpprun::detail::interrupted_save_note(dir.string() + "/");
  INFO(note);
  CHECK_THAT(note, Catch::Contains(dir.string() + " holds 1 file(s) named NAME.prev (model.safetensors.prev)"));
  const std::string command = "for f in '" + s.dir.string() + "/it'\\''s a run'/*.prev; do mv -f \"$f\" \"${f%.prev}\"; done";
  REQUIRE_THAT(note, Catch::Contains(command));
  CHECK(std::system(command.c_str()) == 0);
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::ifstream in(entry.path());
    files[entry.path().filename().string()] = std::string(std::istreambuf_iterator<char>(in), {});
  }
  CHECK(files == std::map<std::string, std::string>{{"model.safetensors", "old model"},
                                                    {"optimizer.safetensors", "old optimizer"}});
  CHECK(cpprun::detail::interrupted_save_note(dir.string()).empty());
}
