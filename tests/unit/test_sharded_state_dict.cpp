// State dicts in Hugging Face's sharded layout (checkpoint/sharded_state_dict.h): the partition and the
// index as pure decisions, a module's round trip through a directory, a 4-rank save played in one
// process, and every way a directory can fail to hold together, each named, the model unchanged.
#include "catch.h"
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <string>

#include "error_text.h"
#include "checkpoint/part_read.h"
#include "checkpoint/reader_report.h"
#include "checkpoint/rows_in_place.h"
#include "checkpoint/sharded_state_dict.h"
#include "checkpoint/state_dict.h"
#include "checkpoint/writer_plan.h"
#include "cpprun/checkpoint_file.h"
#include "cpprun/state_dict.h"
#include "scratch_files.h"
#include "support/crc32.h"
#include "support/file_read.h"
#include "support/safetensors.h"
#include "support/safetensors_index.h"

namespace {

namespace fs = std::filesystem;
using cpprun::detail::partition_by_bytes;

// Nine tensors: parameters, then BatchNorm's buffers (Python's nn.Sequential has the same names).
torch::nn::Sequential net(int64_t hidden = 8) {
  return torch::nn::Sequential(torch::nn::Linear(4, hidden), torch::nn::BatchNorm1d(hidden),
                               torch::nn::Linear(hidden, 3));
}

void scramble_all(torch::nn::Module& m, double value) {
  torch::NoGradGuard no_grad;
  for (auto& t : m.parameters()) t.fill_(value);
  for (auto& b : m.buffers()) b.fill_(static_cast<int64_t>(value));
}

void require_same_state(torch::nn::Module& a, torch::nn::Module& b) {
  const auto sa = cpprun::detail::module_state(a);
  const auto sb = cpprun::detail::module_state(b);
  REQUIRE(sa.size() == sb.size());
  for (std::size_t i = 0; i < sa.size(); ++i) {
    INFO(sa[i].first);
    CHECK(sa[i].first == sb[i].first);
    CHECK(torch::equal(sa[i].second, sb[i].second));
  }
}

void write_file_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// What 4 ranks of one save write, played here: each rank's file, then the index.
void save_as_ranks(torch::nn::Module& module, const fs::path& dir, int world, const std::string& save_id) {
  const auto state = cpprun::detail::module_state(module);
  fs::create_directories(dir);
  const cpprun::detail::ShardedSaveStamp stamp{save_id, 7, {}};
  for (int rank = 0; rank < world; ++rank) {
    cpprun::detail::write_state_dict_shard(state, dir.string(), rank, world, stamp);
  }
  cpprun::detail::write_state_dict_index(state, dir.string(), world, stamp);
}

}  // namespace

TEST_CASE("hf_sharded: tensors split into contiguous runs of about equal bytes", "[state_dict]") {
  CHECK(partition_by_bytes({}, 4).empty());
  CHECK(partition_by_bytes({10, 10, 10, 10}, 4) == std::vector<int>{0, 1, 2, 3});
  CHECK(partition_by_bytes({10, 10, 10, 10}, 2) == std::vector<int>{0, 0, 1, 1});
  CHECK(partition_by_bytes({10, 10, 10, 10}, 1) == std::vector<int>{0, 0, 0, 0});
  // Fewer tensors than ranks: the parts used are numbered without gaps.
  CHECK(partition_by_bytes({10, 10}, 4) == std::vector<int>{0, 1});
  // One tensor outweighs the rest: still one tensor per rank while there are enough.
  CHECK(partition_by_bytes({1000, 1, 1, 1}, 4) == std::vector<int>{0, 1, 2, 3});
  CHECK(partition_by_bytes({1000, 1, 1, 1}, 2) == std::vector<int>{0, 1, 1, 1});
  CHECK(partition_by_bytes({1, 1, 1, 1000, 1}, 3) == std::vector<int>{0, 0, 0, 1, 2});
  CHECK(partition_by_bytes({0, 0, 0}, 3) == std::vector<int>{0, 1, 2});
  // Any split: in order, no gaps, every part used, none above the mean plus one tensor.
  std::vector<std::uint64_t> bytes;
  for (int i = 0; i < 50; ++i) bytes.push_back(static_cast<std::uint64_t>((i * 37) % 11 + 1) * 100);
  const auto part = partition_by_bytes(bytes, 7);
  std::vector<std::uint64_t> load(7, 0);
  for (std::size_t i = 0; i < part.size(); ++i) {
    if (i) CHECK((part[i] == part[i - 1] || part[i] == part[i - 1] + 1));
    load[part[i]] += bytes[i];
  }
  CHECK(part.back() == 6);
  const auto total = std::accumulate(bytes.begin(), bytes.end(), std::uint64_t{0});
  for (const auto l : load) {
    CHECK(l > 0);
    CHECK(l * 7 <= total + 7 * 1100);
  }
}

TEST_CASE("hf_sharded: each tensor's writer follows the files' plan, from sizes alone",
          "[state_dict]") {
  using cpprun::detail::writers_of_pieces;
  // Four tensors of one piece each: the writer of each is its file's run, as state_dict_shard writes.
  CHECK(writers_of_pieces({10, 10, 10, 10}, {0, 1, 2, 3}, 4, 2) ==
        std::vector<std::vector<int>>{{0}, {0}, {1}, {1}});
  CHECK(writers_of_pieces({10, 10, 10, 10}, {0, 1, 2, 3}, 4, 1) ==
        std::vector<std::vector<int>>{{0}, {0}, {0}, {0}});
  // More writers than tensors: the last writers write nothing.
  CHECK(writers_of_pieces({10, 10}, {0, 1}, 2, 4) == std::vector<std::vector<int>>{{0}, {1}});
  // A tied tensor (piece 0 under names 0 and 3) whose names fall in two files has both writers; a
  // piece no name refers to has none.
  CHECK(writers_of_pieces({10, 10, 10, 10}, {0, 1, 2, 0}, 4, 2) ==
        std::vector<std::vector<int>>{{0, 1}, {0}, {1}, {}});
  CHECK(writers_of_pieces({1000, 1, 1, 1}, {0, 1, 2, 3}, 4, 2) ==
        std::vector<std::vector<int>>{{0}, {1}, {1}, {1}});
  CHECK(writers_of_pieces({}, {}, 0, 3).empty());
  // Against the files' own plan: each name's writer is the rank whose shard holds it.
  auto module = net();
  const auto state = cpprun::detail::module_state(*module);
  std::vector<std::uint64_t> bytes;
  std::vector<std::size_t> piece;
  for (const auto& [name, tensor] : state) {
    bytes.push_back(tensor.nbytes());
    piece.push_back(piece.size());
  }
  for (int world = 1; world <= 5; ++world) {
    const auto writers = writers_of_pieces(bytes, piece, state.size(), world);
    for (int rank = 0; rank < world; ++rank) {
      for (const auto& [name, tensor] : cpprun::detail::state_dict_shard(state, rank, world).tensors) {
        const auto at = std::find_if(state.begin(), state.end(), [&](const auto& item) { return item.first == name; });
        INFO(name << " at world " << world);
        CHECK(writers[static_cast<std::size_t>(at - state.begin())] == std::vector<int>{rank});
      }
    }
  }
}

TEST_CASE("hf_sharded: a file written in place by parts is encode_safetensors's file; its CRC combines the parts'",
          "[state_dict]") {
  using cpprun::detail::WrittenPart;
  auto module = net();
  const auto state = cpprun::detail::module_state(*module);
  const std::map<std::string, std::string> metadata = {{"cpprun_save_id", "00ff"}, {"cpprun_step", "3"}};
  const std::string whole = cpprun::detail::encode_safetensors(state, metadata);
  // The layout from meta tensors alone, then each tensor's bytes in two parts (its rows split as
  // two ranks hold them), written in place in a reversed order, and the header last.
  cpprun::detail::NamedTensors shapes;
  for (const auto& [name, tensor] : state) shapes.emplace_back(name, torch::empty(tensor.sizes(), tensor.options().device(torch::kMeta)));
  const auto layout = cpprun::detail::safetensors_layout_of(shapes, metadata);
  std::string file(layout.data_start + layout.data_bytes, '\0');
  std::vector<WrittenPart> parts;
  for (auto it = state.rbegin(); it != state.rend(); ++it) {
    const auto& [name, tensor] = *it;
    const auto at = std::find_if(layout.entries.begin(), layout.entries.end(), [&](const auto& e) { return e.name == name; });
    REQUIRE(at != layout.entries.end());
    const std::uint64_t offset = layout.data_start + layout.offsets[static_cast<std::size_t>(at - layout.entries.begin())];
    const std::string bytes(static_cast<const char*>(tensor.data_ptr()), tensor.nbytes());
    const std::size_t cut = bytes.size() / 2;
    for (const auto& [first, count] : {std::pair<std::size_t, std::size_t>{cut, bytes.size() - cut}, {0, cut}}) {
      file.replace(offset + first, count, bytes.substr(first, count));
      parts.push_back({name, first, count, cpprun::detail::crc32(bytes.substr(first, count))});
    }
  }
  const auto crc = cpprun::detail::file_crc_of_parts(layout, parts, "f");
  const std::string header = cpprun::detail::safetensors_header(layout, crc);
  file.replace(0, header.size(), header);
  CHECK(file == whole);

  // Parts that do not tile a tensor exactly are refused, naming it: never a CRC of a torn file.
  const std::string first = layout.entries[0].name;
  const auto of_first = [&](std::vector<WrittenPart> changed) {
    return error_text_of([&] { cpprun::detail::file_crc_of_parts(layout, changed, "f.safetensors"); });
  };
  std::vector<WrittenPart> missing = parts, overlapping = parts, extra = parts;
  missing.erase(std::find_if(missing.begin(), missing.end(), [&](const auto& p) { return p.name == first && p.first_byte > 0; }));
  CHECK_THAT(of_first(missing), Catch::Contains("f.safetensors: \"" + first + "\"") && Catch::Contains("only up to byte"));
  for (auto& p : overlapping) {
    if (p.name == first && p.first_byte > 0) p.first_byte -= 4, p.bytes += 4;
  }
  CHECK_THAT(of_first(overlapping), Catch::Contains("where bytes from"));
  extra.push_back({"zzz.unknown", 0, 4, 0});
  CHECK_THAT(of_first(extra), Catch::Contains("\"zzz.unknown\" was written, which the file does not hold"));
  extra.back().name = "a.unknown";
  CHECK_THAT(of_first(extra), Catch::Contains("\"a.unknown\" was written, which the file does not hold"));
}

TEST_CASE("hf_sharded: a safetensors file written from the tensors' memory is encode_safetensors's bytes",
          "[state_dict]") {
  // Names out of order, a non-contiguous tensor, bf16, an empty tensor, a 0-d one.
  const cpprun::detail::NamedTensors tensors = {
      {"z.weight", torch::arange(12, torch::kFloat).reshape({3, 4}).t()},
      {"a.bias", torch::ones({5}, torch::kBFloat16)},
      {"m.empty", torch::zeros({0, 3}, torch::kDouble)},
      {"step", torch::scalar_tensor(7.0, torch::kFloat)}};
  const std::map<std::string, std::string> metadata = {{"cpprun_step", "7"}};
  scratch::ScratchDir dir("write_safetensors_file");
  const std::string path = (dir.path / "model.safetensors").string();
  cpprun::detail::write_safetensors_file(path, tensors, metadata);
  CHECK(scratch::contents(path) == cpprun::detail::encode_safetensors(tensors, metadata));
  CHECK(!fs::exists(path + ".tmp"));
}

TEST_CASE("hf_sharded: a part in another writer's file: its whole blocks written by its rank, its ends by the writer",
          "[state_dict]") {
  using cpprun::detail::split_part;
  constexpr std::uint64_t B = cpprun::detail::kRowsBlockBytes;
  const auto inner = [](std::uint64_t start, std::uint64_t count) {
    const auto s = split_part(start, count);
    return std::make_pair(s.inner_begin, s.inner_end);
  };
  CHECK(inner(100, 50) == std::make_pair(150ul, 150ul));            // inside one block: all to the writer
  CHECK(inner(B - 10, 20) == std::make_pair(B + 10, B + 10));       // across a boundary, no whole block
  CHECK(inner(B, B) == std::make_pair(B, 2 * B));                   // exactly one block: all its own
  CHECK(inner(B, B + 7) == std::make_pair(B, 2 * B));               // from a boundary: a tail
  CHECK(inner(B - 3, B + 3) == std::make_pair(B, 2 * B));           // to a boundary: a head
  CHECK(inner(10, 3 * B) == std::make_pair(B, 3 * B));              // a head, two blocks, a tail
  CHECK(inner(5 * B, 0) == std::make_pair(5 * B, 5 * B));           // nothing
  CHECK(inner(7, 0) == std::make_pair(7ul, 7ul));
  // Any part: head, inner and tail tile it, the inner part is whole blocks, the ends less than one.
  for (const std::uint64_t start : {std::uint64_t{0}, std::uint64_t{1}, B - 1, B, B + 1, 3 * B + 17}) {
    for (const std::uint64_t count : {std::uint64_t{0}, std::uint64_t{1}, B - 1, B, B + 1, 2 * B, 5 * B + 3}) {
      const auto s = split_part(start, count);
      INFO(start << " + " << count);
      CHECK(start <= s.inner_begin);
      CHECK(s.inner_begin <= s.inner_end);
      CHECK(s.inner_end <= start + count);
      if (s.inner_begin < s.inner_end) {
        CHECK(s.inner_begin % B == 0);
        CHECK(s.inner_end % B == 0);
        CHECK(s.inner_begin - start < B);
        CHECK(start + count - s.inner_end < B);
      } else {
        CHECK(s.inner_end == start + count);  // no whole block inside: none of it between two boundaries
        CHECK((start + count) / B * B <= (start + B - 1) / B * B);
      }
    }
  }
}

TEST_CASE("hf_sharded: file names and the index are transformers'", "[state_dict]") {
  CHECK(cpprun::detail::shard_file_name(1, 4) == "model-00001-of-00004.safetensors");
  CHECK(cpprun::detail::is_shard_file_name("model-00012-of-00100.safetensors"));
  CHECK_FALSE(cpprun::detail::is_shard_file_name("model.safetensors"));
  CHECK_FALSE(cpprun::detail::is_shard_file_name("model-0001-of-00004.safetensors"));
  cpprun::detail::SafetensorsIndex index;
  index.metadata = {{"total_size", "1234"}, {"cpprun_save_id", "ab\"c"}};
  index.weight_map = {{"a.weight", "model-00001-of-00002.safetensors"}, {"b", "model-00002-of-00002.safetensors"}};
  const std::string text = cpprun::detail::write_safetensors_index(index);
  CHECK_THAT(text, Catch::Matchers::Contains("\"total_size\": 1234"));  // a number, as transformers writes it
  const auto back = cpprun::detail::read_safetensors_index(text, "i.json");
  CHECK(back.metadata == index.metadata);
  CHECK(back.weight_map == index.weight_map);
  const auto error = [](const std::string& json) {
    return error_text_of([&] { cpprun::detail::read_safetensors_index(json, "i.json"); });
  };
  CHECK_THAT(error(R"({"metadata": {}})"), Catch::Matchers::Contains("no \"weight_map\""));
  CHECK_THAT(error(R"({"weight_map": {"a": "../../etc/passwd"}})"),
             Catch::Matchers::Contains("not the name of a file in the index's directory"));
  CHECK_THAT(error(R"({"weight_map": {"a": 3}})"), Catch::Matchers::Contains("is not a file name"));
  // A NUL ends the name the file system sees: "model.safetensors\0junk" opened model.safetensors.
  CHECK_THAT(error(R"({"weight_map": {"a": "model.safetensors\u0000junk"}})"),
             Catch::Matchers::Contains("not the name of a file in the index's directory"));
  CHECK_THAT(error(R"({"weight_map": {"a": "f")"),
             Catch::Matchers::Contains("i.json is invalid: its JSON is malformed"));
}

TEST_CASE("hf_sharded: a module round-trips through a directory, its index, or a lone model.safetensors",
          "[state_dict]") {
  scratch::ScratchDir dir("hf_sharded_roundtrip");
  auto source = net();
  const std::string out = (dir.path / "hf").string() + "/";
  cpprun::save_state_dict(source, out, cpprun::StateDictSaveOptions().step(42));
  CHECK(fs::exists(dir.path / "hf/model-00001-of-00001.safetensors"));
  REQUIRE(fs::exists(dir.path / "hf/model.safetensors.index.json"));
  const auto file =
      cpprun::detail::read_safetensors(scratch::contents(dir.path / "hf/model-00001-of-00001.safetensors"), "f");
  CHECK(file.metadata.at("cpprun_step") == "42");
  CHECK(file.metadata.at("format") == "pt");
  CHECK(file.metadata.at("cpprun_save_id").size() == 32);
  for (const std::string& path : {out, (dir.path / "hf").string(), out + "model.safetensors.index.json"}) {
    INFO(path);
    auto target = net();
    scramble_all(*target, 3);
    cpprun::load_state_dict(target, path);
    require_same_state(*target, *source);
  }
  // A directory holding one model.safetensors (save_pretrained of a small model) loads too.
  fs::create_directories(dir.path / "single");
  cpprun::save_state_dict(source, (dir.path / "single/model.safetensors").string());
  auto target = net();
  scramble_all(*target, 3);
  cpprun::load_state_dict(target, (dir.path / "single").string());
  require_same_state(*target, *source);
  // Both in one directory: which one is meant? Refused.
  fs::copy_file(dir.path / "single/model.safetensors", dir.path / "hf/model.safetensors");
  CHECK_THAT(error_text_of([&] { cpprun::load_state_dict(target, out); }),
             Catch::Matchers::Contains("holds both model.safetensors.index.json and model.safetensors"));
  // A new save into it removes what transformers would load in its place.
  cpprun::save_state_dict(source, out);
  CHECK_FALSE(fs::exists(dir.path / "hf/model.safetensors"));
  CHECK_THAT(error_text_of([&] { cpprun::load_state_dict(target, (dir.path / "nothing_here").string() + "/"); }),
             Catch::Matchers::Contains("nothing_here/ does not exist"));
}

TEST_CASE("hf_sharded: a 4-rank save loads whole; a later 2-rank save into it leaves no stale shard",
          "[state_dict]") {
  scratch::ScratchDir dir("hf_sharded_ranks");
  auto source = net();
  save_as_ranks(*source, dir.path, 4, "first");
  for (int r = 1; r <= 4; ++r) CHECK(fs::exists(dir.path / cpprun::detail::shard_file_name(r, 4)));
  auto target = net();
  scramble_all(*target, 3);
  cpprun::load_state_dict(target, dir.path.string());
  require_same_state(*target, *source);
  // The index's total_size is the tensors' bytes.
  const auto index = cpprun::detail::read_safetensors_index(
      scratch::contents(dir.path / "model.safetensors.index.json"), "i");
  int64_t bytes = 0;
  for (const auto& [name, t] : cpprun::detail::module_state(*source)) bytes += static_cast<int64_t>(t.nbytes());
  CHECK(index.metadata.at("total_size") == std::to_string(bytes));
  CHECK(index.metadata.at("cpprun_step") == "7");

  save_as_ranks(*source, dir.path, 2, "second");
  CHECK_FALSE(fs::exists(dir.path / cpprun::detail::shard_file_name(3, 4)));
  CHECK(fs::exists(dir.path / cpprun::detail::shard_file_name(2, 2)));
  scramble_all(*target, 3);
  cpprun::load_state_dict(target, dir.path.string());
  require_same_state(*target, *source);
}

TEST_CASE("hf_sharded: a directory that does not hold together is refused, naming the file; nothing loads",
          "[state_dict]") {
  scratch::ScratchDir scratch_dir("hf_sharded_faults");
  auto source = net();
  auto target = net();
  scramble_all(*target, 3);
  auto before = net();
  scramble_all(*before, 3);
  const auto refused = [&](const fs::path& dir, const std::vector<std::string>& expected) {
    const std::string message = error_text_of([&] { cpprun::load_state_dict(target, dir.string()); });
    for (const auto& text : expected) CHECK_THAT(message, Catch::Matchers::Contains(text));
    CHECK_THROWS_AS(cpprun::load_state_dict(target, dir.string()), cpprun::CorruptCheckpointError);
    require_same_state(*target, *before);
  };
  const auto fresh = [&](const std::string& name) {
    const fs::path dir = scratch_dir.path / name;
    save_as_ranks(*source, dir, 4, "aaaa");
    return dir;
  };
  const std::string file2 = cpprun::detail::shard_file_name(2, 4);

  // Mixed saves: rank 1's file comes from another save (a crash between two saves, a copy).
  const fs::path mixed = fresh("mixed");
  {
    const auto state = cpprun::detail::module_state(*source);
    cpprun::detail::write_state_dict_shard(state, mixed.string(), 1, 4, {"bbbb", std::nullopt, {}});
  }
  refused(mixed, {file2 + " is from another save (save id \"bbbb\", the index's \"aaaa\")"});
  // Without an id in the index (as Python writes it), the odd one out is the file most others disagree with.
  {
    auto index = cpprun::detail::read_safetensors_index(scratch::contents(mixed / "model.safetensors.index.json"), "i");
    index.metadata.erase("cpprun_save_id");
    write_file_bytes(mixed / "model.safetensors.index.json", cpprun::detail::write_safetensors_index(index));
  }
  refused(mixed, {file2 + " is from another save (save id \"bbbb\", the other files' \"aaaa\")"});

  // A shard file is missing.
  const fs::path missing = fresh("missing");
  fs::remove(missing / cpprun::detail::shard_file_name(3, 4));
  refused(missing, {"names 1 file(s) that " + missing.string() + " lacks", cpprun::detail::shard_file_name(3, 4)});

  // The index places a tensor in a file that does not hold it.
  const fs::path lacks = fresh("lacks");
  {
    auto index = cpprun::detail::read_safetensors_index(scratch::contents(lacks / "model.safetensors.index.json"), "i");
    const std::string moved = "0.weight";  // file 1 holds it; the index now says file 2
    REQUIRE(index.weight_map.at(moved) == cpprun::detail::shard_file_name(1, 4));
    index.weight_map[moved] = file2;
    write_file_bytes(lacks / "model.safetensors.index.json", cpprun::detail::write_safetensors_index(index));
    // (File 1 held only "0.weight": the index names it no more, so it is not read.)
    refused(lacks, {file2 + " lacks \"" + moved + "\", which the index places there", "1 fault(s)"});
    // A tensor the index places elsewhere than the file that holds it.
    index.weight_map["0.bias"] = cpprun::detail::shard_file_name(1, 4);
    write_file_bytes(lacks / "model.safetensors.index.json", cpprun::detail::write_safetensors_index(index));
    refused(lacks, {file2 + " holds \"0.bias\", which the index places in " + cpprun::detail::shard_file_name(1, 4),
                    cpprun::detail::shard_file_name(1, 4) + " lacks \"0.bias\""});
  }

  // A shard's header cut short (a truncated copy).
  const fs::path truncated = fresh("truncated");
  {
    const std::string bytes = scratch::contents(truncated / file2);
    write_file_bytes(truncated / file2, bytes.substr(0, 40));
    refused(truncated, {(truncated / file2).string(), "follow (cut short?)"});
  }

  // A damaged index.
  const fs::path bad_index = fresh("bad_index");
  write_file_bytes(bad_index / "model.safetensors.index.json", "{\"weight_map\": {\"x\": ");
  refused(bad_index, {(bad_index / "model.safetensors.index.json").string(), "malformed"});
}

TEST_CASE("hf_sharded: an index naming a thousand absent files is refused in a message of fifty", "[state_dict]") {
  scratch::ScratchDir dir("hf_sharded_absent");
  cpprun::detail::SafetensorsIndex index;
  for (int i = 0; i < 1000; ++i) index.weight_map["t" + std::to_string(i)] = "f" + std::to_string(i) + ".safetensors";
  write_file_bytes(dir.path / "model.safetensors.index.json", cpprun::detail::write_safetensors_index(index));
  auto target = net();
  const std::string message = error_text_of([&] { cpprun::load_state_dict(target, dir.path.string()); });
  CHECK_THAT(message, Catch::Matchers::Contains("names 1000 file(s) that") && Catch::Matchers::Contains("... and 950 more"));
  CHECK(message.size() < 8000);
}

TEST_CASE("hf_sharded: an index larger than any real one is refused before it is parsed", "[state_dict]") {
  // 64 MiB of index would parse into a GiB of JSON tree; the largest models' indexes are a few MB.
  scratch::ScratchDir dir("hf_sharded_huge_index");
  std::string huge = R"({"weight_map": {"a": "model-00001-of-00001.safetensors"}, "metadata": {"pad": ")";
  huge.append(cpprun::detail::kMaxSafetensorsIndexBytes, 'x');
  huge += "\"}}";
  write_file_bytes(dir.path / "model.safetensors.index.json", huge);
  auto target = net();
  // Of the kind every damaged index is: a caller that skips damaged checkpoints skips it.
  CHECK_THROWS_AS(cpprun::load_state_dict(target, dir.path.string()), cpprun::CorruptCheckpointError);
  CHECK_THAT(error_text_of([&] { cpprun::load_state_dict(target, dir.path.string()); }),
             Catch::Matchers::Contains("model.safetensors.index.json: it is " + std::to_string(huge.size()) +
                                       " bytes, more than the " +
                                       std::to_string(cpprun::detail::kMaxSafetensorsIndexBytes)));
  CHECK_THAT(error_text_of([&] { cpprun::detail::read_safetensors_index(huge, "i.json"); }),
             Catch::Matchers::Contains("i.json is invalid: it is " + std::to_string(huge.size()) + " bytes"));
}

TEST_CASE("hf_sharded: a strict load of another model's directory lists every difference with its file",
          "[state_dict]") {
  scratch::ScratchDir dir("hf_sharded_strict");
  auto other = net(6);
  save_as_ranks(*other, dir.path, 4, "x");
  auto target = net();
  const std::string message = error_text_of([&] { cpprun::load_state_dict(target, dir.path.string()); });
  CHECK_THAT(message, Catch::Matchers::Contains("load_state_dict refused " + dir.path.string()));
  CHECK_THAT(message, Catch::Matchers::Contains("0.weight: file float32 [6, 4], module float32 [8, 4] (in "
                                                "model-00001-of-00004.safetensors)"));
  CHECK_THAT(message, Catch::Matchers::Contains("shape or dtype differs (7)"));
  CHECK_THROWS_AS(cpprun::load_state_dict(target, dir.path.string()), cpprun::StateDictMismatchError);
  const auto report = cpprun::load_state_dict(target, dir.path.string(), cpprun::StateDictOptions().strict(false));
  CHECK(report.mismatched.size() == 7);
  CHECK(report.missing_keys.empty());
}

// What a reader tells the others of its files (checkpoint/reader_report.h) survives the trip, the
// offset of each tensor's bytes included: the other ranks read their parts at it.
TEST_CASE("hf_sharded: a reader's report decodes to what was encoded", "[state_dict]") {
  cpprun::detail::ReaderReport report;
  report.rank = 3;
  report.absent = {"model-00002-of-00004.safetensors"};
  cpprun::detail::ReadFileInfo file{"model-00001-of-00004.safetensors", "0123", {{"cpprun_step", "7"}}, {}, {4096, 1764979200123456789}};
  file.tensors.push_back({"fc.weight", c10::kDouble, {13, 8}, std::nullopt, 88});
  file.tensors.push_back({"fc.bias", c10::kBFloat16, {13}, 0xdeadbeefu, 88 + 13 * 8 * 8});
  report.files.push_back(file);
  const auto back = cpprun::detail::decode_reader_report(cpprun::detail::encode_reader_report(report));
  CHECK(back.rank == 3);
  CHECK(back.absent == report.absent);
  REQUIRE(back.files.size() == 1);
  CHECK(back.files[0].metadata == file.metadata);
  CHECK(back.files[0].identity == file.identity);
  REQUIRE(back.files[0].tensors.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    const auto& got = back.files[0].tensors[i];
    const auto& sent = file.tensors[i];
    CHECK(got.name == sent.name);
    CHECK(got.dtype == sent.dtype);
    CHECK(got.sizes == sent.sizes);
    CHECK(got.crc == sent.crc);
    CHECK(got.offset == sent.offset);
  }
}

// A rank's part of a tensor is a byte range of the file, read from the file its reader checked:
// one that ends before the part, or that is no longer that file (saved again, at the same size), is
// an error naming it, never a short tensor or another save's bytes.
TEST_CASE("hf_sharded: a part of a file is read at its offset, from the file that was checked", "[state_dict]") {
  scratch::ScratchDir dir("part_read");
  const std::string path = (dir.path / "f.bin").string();
  const auto write = [&](char first) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    for (int i = 0; i < 64; ++i) out.put(static_cast<char>(first + i));
  };
  write(0);
  const auto checked = cpprun::detail::identity_of(path, "the checkpoint file");
  CHECK(checked.size == 64);
  char got[8] = {};
  cpprun::detail::read_file_range(path, "the checkpoint file", checked, 40, sizeof got, got);
  for (int i = 0; i < 8; ++i) CHECK(got[i] == static_cast<char>(40 + i));
  CHECK_THROWS_WITH(cpprun::detail::read_file_range(path, "the checkpoint file", checked, 60, sizeof got, got),
                    Catch::Matchers::Contains(path) && Catch::Matchers::Contains("it is 64 bytes, and ends before"));

  // Saved again, at the same size: its time differs (set apart, as a later save's would be).
  write(1);
  const auto later = std::filesystem::last_write_time(path) + std::chrono::seconds(2);
  std::filesystem::last_write_time(path, later);
  CHECK(cpprun::detail::identity_of(path, "the checkpoint file") != checked);
  CHECK_THROWS_AS(cpprun::detail::read_file_range(path, "the checkpoint file", checked, 40, sizeof got, got),
                  cpprun::detail::FileChangedError);
  CHECK_THROWS_WITH(cpprun::detail::check_unchanged(path, checked),
                    Catch::Matchers::Contains(path) && Catch::Matchers::Contains("is not the file its reader checked"));
}
