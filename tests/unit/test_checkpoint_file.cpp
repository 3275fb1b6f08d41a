// Atomic writes and checksummed checkpoint files: what is written reads back; a flipped byte, a
// cut or a growth is refused naming the file; a failed write leaves no temporary file and the old
// contents, and says why.
#include "catch.h"
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "cpprun/atomic_file.h"
#include "cpprun/checkpoint_file.h"
#include "support/crc32.h"
#include "scratch_files.h"
#include "zip_records.h"

namespace fs = std::filesystem;
using scratch::contents;
using scratch::ScratchDir;

namespace {

void overwrite(const fs::path& file, const std::string& bytes) { std::ofstream(file, std::ios::binary) << bytes; }

std::string payload_of(std::size_t n) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 131 % 251);
  return s;
}

// Files longer than `bytes` cannot be written while this lives: write() fails with EFBIG (as on a
// full disk, a write fails part-way) because SIGXFSZ, which would kill us, is ignored.
struct FileSizeLimit {
  rlimit saved{};
  struct sigaction saved_action {};
  explicit FileSizeLimit(rlim_t bytes) {
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    REQUIRE(::sigaction(SIGXFSZ, &ignore, &saved_action) == 0);
    rlimit limited = saved;
    limited.rlim_cur = bytes;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &limited) == 0);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved);
    ::sigaction(SIGXFSZ, &saved_action, nullptr);
  }
};

// The message of the `Error` that `fn` throws ("<nothing thrown>" if none; other types propagate).
template <typename Error, typename Fn>
std::string message_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<nothing thrown>";
}

}  // namespace

TEST_CASE("checkpoint_file: CRC-32 is the standard one", "[checkpoint_file]") {
  CHECK(cpprun::detail::crc32("123456789") == 0xCBF43926u);  // the catalogued check value
  CHECK(cpprun::detail::crc32("") == 0u);
  const std::string long_text = payload_of(1000);  // past the 8-byte fast path, odd tail
  CHECK(cpprun::detail::crc32(long_text.substr(300), cpprun::detail::crc32(long_text.substr(0, 300))) ==
        cpprun::detail::crc32(long_text));
}

TEST_CASE("checkpoint_file: the CRC-32 of two parts combines from theirs", "[checkpoint_file]") {
  const std::string text = payload_of(5000);
  // Every split of short texts (empty parts included), and long second parts.
  for (const std::size_t total : {std::size_t{0}, std::size_t{1}, std::size_t{9}, std::size_t{64}, std::size_t{200}}) {
    for (std::size_t cut = 0; cut <= total; ++cut) {
      const std::string_view a(text.data(), cut), b(text.data() + cut, total - cut);
      INFO(cut << " + " << b.size());
      CHECK(cpprun::detail::crc32_combine(cpprun::detail::crc32(a), cpprun::detail::crc32(b), b.size()) ==
            cpprun::detail::crc32(text.substr(0, total)));
    }
  }
  for (const std::size_t cut : {std::size_t{1}, std::size_t{777}, std::size_t{4999}}) {
    const std::string_view a(text.data(), cut), b(text.data() + cut, text.size() - cut);
    CHECK(cpprun::detail::crc32_combine(cpprun::detail::crc32(a), cpprun::detail::crc32(b), b.size()) ==
          cpprun::detail::crc32(text));
  }
  // Three parts, combined left to right as a file's data section is.
  const std::string_view x(text.data(), 100), y(text.data() + 100, 1000), z(text.data() + 1100, 3900);
  std::uint32_t crc = cpprun::detail::crc32_combine(cpprun::detail::crc32(x), cpprun::detail::crc32(y), y.size());
  crc = cpprun::detail::crc32_combine(crc, cpprun::detail::crc32(z), z.size());
  CHECK(crc == cpprun::detail::crc32(text));
}

namespace {

// CRC-32 one bit at a time, as the polynomial defines it: what the fast paths must equal.
std::uint32_t crc32_by_bits(std::string_view bytes, std::uint32_t crc) {
  crc = ~crc;
  for (const char c : bytes) {
    crc ^= static_cast<unsigned char>(c);
    for (int k = 0; k < 8; ++k) crc = (crc & 1) ? 0xEDB88320u ^ (crc >> 1) : crc >> 1;
  }
  return ~crc;
}

}  // namespace

TEST_CASE("checkpoint_file: CRC-32 equals the bitwise definition at every length and alignment",
          "[checkpoint_file]") {
  // Lengths across the carry-less path's thresholds (64 bytes, then 16-byte steps and a table
  // tail), from every offset in a 16-byte line, continuing from a nonzero CRC too.
  std::string bytes(700, '\0');
  std::uint32_t state = 12345;
  for (char& c : bytes) c = static_cast<char>((state = state * 1103515245u + 12345u) >> 16);
  int mismatches = 0;
  for (std::size_t offset = 0; offset < 16; ++offset) {
    for (std::size_t n = 0; n + offset <= 680; n += (n < 200 ? 1 : 7)) {
      const std::string_view part(bytes.data() + offset, n);
      for (std::uint32_t from : {0u, 0xDEADBEEFu}) {
        if (cpprun::detail::crc32(part, from) != crc32_by_bits(part, from)) ++mismatches;
      }
    }
  }
  CHECK(mismatches == 0);
}

TEST_CASE("checkpoint_file: what is written reads back, and any damage is refused naming the file",
          "[checkpoint_file]") {
  ScratchDir dir("checkpoint_file");
  const std::string path = (dir.path / "ckpt.bin").string();
  const std::string payload = payload_of(10007);
  cpprun::write_checkpoint_file(path, payload);
  CHECK(cpprun::read_checkpoint_file(path) == payload);
  CHECK_FALSE(fs::exists(path + ".tmp"));
  const std::string good = contents(path);
  REQUIRE(good.size() == payload.size() + 20);

  auto refused = [&](const std::string& bytes, const std::string& why) {
    overwrite(path, bytes);
    try {
      cpprun::read_checkpoint_file(path);
      FAIL("a damaged file was read: " << why);
    } catch (const cpprun::CorruptCheckpointError& e) {
      const std::string message = e.what();
      INFO(message);
      CHECK(message.find("checkpoint " + path + " is damaged") != std::string::npos);
      CHECK(message.find(why) != std::string::npos);
    }
  };
  for (std::size_t at : {std::size_t{0}, payload.size() / 2, payload.size() - 1}) {
    std::string flipped = good;
    flipped[at] ^= 0x01;  // one bit
    refused(flipped, "CRC-32");
  }
  std::string bad_crc = good;
  bad_crc[good.size() - 1] ^= 0x80;  // the recorded checksum itself
  refused(bad_crc, "CRC-32");
  refused(good.substr(0, good.size() - 1), "checksum footer");  // cut short: no footer
  refused(good.substr(0, 10), "checksum footer");
  refused("", "checksum footer");
  std::string longer = good;
  longer.insert(100, "x");  // one byte more in the payload
  refused(longer, "cut short or added to");

  fs::remove(path);
  try {
    cpprun::read_checkpoint_file(path);
    FAIL("a missing file was read");
  } catch (const std::system_error& e) {
    CHECK(std::string(e.what()).find(path) != std::string::npos);
    CHECK(e.code() == std::errc::no_such_file_or_directory);
  }
}

TEST_CASE("checkpoint_file: a torch archive round-trips, is still a torch archive, and a flipped byte is refused",
          "[checkpoint_file]") {
  ScratchDir dir("checkpoint_file");
  const std::string path = (dir.path / "model.pt").string();
  const at::Tensor weights = at::arange(1000, at::kFloat);
  torch::serialize::OutputArchive out;
  out.write("weights", weights);
  cpprun::save_checkpoint(out, path);

  torch::serialize::InputArchive in;
  cpprun::load_checkpoint(in, path);
  at::Tensor loaded;
  in.read("weights", loaded);
  CHECK(loaded.equal(weights));

  torch::serialize::InputArchive plain;  // the footer does not stop torch's own reader
  plain.load_from(path);
  plain.read("weights", loaded);
  CHECK(loaded.equal(weights));

  std::string bytes = contents(path);
  bytes[bytes.size() / 2] ^= 0x10;
  overwrite(path, bytes);
  torch::serialize::InputArchive again;
  CHECK_THAT(message_of<cpprun::CorruptCheckpointError>([&] { cpprun::load_checkpoint(again, path); }),
             Catch::Matchers::Contains(path) && Catch::Matchers::Contains("CRC-32"));

  // A file torch wrote itself has no footer: refused unless the caller accepts unchecked files.
  out.save_to(path);
  torch::serialize::InputArchive unchecked;
  CHECK_THAT(message_of<cpprun::CorruptCheckpointError>([&] { cpprun::load_checkpoint(unchecked, path); }),
             Catch::Matchers::Contains("checksum footer"));
  cpprun::load_checkpoint(unchecked, path, cpprun::UncheckedFiles::kAccept);
  unchecked.read("weights", loaded);
  CHECK(loaded.equal(weights));
}

TEST_CASE("checkpoint_file: an archive whose TorchScript code defines a method is refused before TorchScript runs it",
          "[checkpoint_file]") {
  ScratchDir dir("checkpoint_file_code");
  torch::serialize::OutputArchive out;
  out.write("weights", at::arange(4, at::kFloat));
  std::string payload;
  out.save_to([&payload](const void* data, std::size_t size) {
    payload.append(static_cast<const char*>(data), size);
    return size;
  });
  // The same archive with `method` added to its module's code.
  const auto with_method = [&payload](const std::string& method) {
    bool had_code = false;
    std::string crafted = scratch::with_records_edited(payload, [&](const std::string& record, std::string& bytes) {
      if (record != "code/__torch__.py") return;
      had_code = true;
      CHECK(bytes.find("def") == std::string::npos);  // what torch::save writes declares attributes only
      bytes += method;
    });
    CHECK(had_code);
    return crafted;
  };
  const std::string path = (dir.path / "code.pt").string();
  // A __setstate__ (a crafted one spun forever in it); with a tab after `def`, which TorchScript's
  // lexer takes as well (a method so written compiled and ran at load); behind a quote left open in
  // a comment.
  const std::string body = "(self: __torch__.Module, state: Tuple[Tensor, bool]) -> NoneType:\n"
                           "    while True:\n      pass\n    return None\n";
  for (const std::string& method : {"  def __setstate__" + body, "  def\t__setstate__" + body,
                                    "  # it's\n  def __setstate__" + body}) {
    INFO(method);
    cpprun::write_checkpoint_file(path, with_method(method));  // a valid footer proves nothing of its origin
    torch::serialize::InputArchive in;
    CHECK_THAT(message_of<std::runtime_error>([&] { cpprun::load_checkpoint(in, path); }),
               Catch::Matchers::Contains(path) && Catch::Matchers::Contains("defines a method (def") &&
                   Catch::Matchers::Contains("__setstate__") && Catch::Matchers::Contains("runs no code"));
  }
  // The archive as torch::save wrote it still loads.
  cpprun::write_checkpoint_file(path, payload);
  torch::serialize::InputArchive good;
  cpprun::load_checkpoint(good, path);
}

TEST_CASE("atomic_file: a failed write keeps the old file, removes the temporary one and says why",
          "[checkpoint_file]") {
  ScratchDir dir("checkpoint_file");
  const std::string path = (dir.path / "state.bin").string();
  cpprun::write_file_atomically(path, "old contents");
  REQUIRE(contents(path) == "old contents");

  SECTION("the file system refuses the data part-way (EFBIG under RLIMIT_FSIZE, as ENOSPC on a full disk)") {
    std::string message;
    int error = 0;
    {
      FileSizeLimit limit(4096);
      try {
        cpprun::write_file_atomically(path, payload_of(100000));
      } catch (const std::system_error& e) {
        message = e.what();
        error = e.code().value();
      }
    }
    INFO(message);
    CHECK(error == EFBIG);
    CHECK(message.find("cannot write " + path) != std::string::npos);
    CHECK(message.find(std::strerror(EFBIG)) != std::string::npos);
  }
  SECTION("the rename fails (a directory is in the way)") {
    const std::string blocked = (dir.path / "blocked").string();
    fs::create_directories(fs::path(blocked) / "inside");
    CHECK_THAT(message_of<std::system_error>([&] { cpprun::write_file_atomically(blocked, "new"); }),
               Catch::Matchers::Contains("cannot write " + blocked));
    CHECK_FALSE(fs::exists(blocked + ".tmp"));
  }
  SECTION("the directory does not exist") {
    const std::string nowhere = (dir.path / "no_such_dir" / "file").string();
    CHECK_THAT(message_of<std::system_error>([&] { cpprun::write_file_atomically(nowhere, "new"); }),
               Catch::Matchers::Contains(nowhere) && Catch::Matchers::Contains(std::strerror(ENOENT)));
  }
  CHECK(contents(path) == "old contents");
  CHECK_FALSE(fs::exists(path + ".tmp"));
}
