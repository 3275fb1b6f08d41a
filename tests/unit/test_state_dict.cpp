// State dicts by name (cpprun/state_dict.h): round trips through .safetensors and .pt, strict
// loading's one error, strict(false)'s report, and the safetensors reader's refusals.
#include "catch.h"
#include <torch/torch.h>
#include <sys/stat.h>

#include <fstream>
#include <functional>
#include <string>

#include "error_text.h"
#include "cpprun/checkpoint_file.h"
#include "cpprun/model_checkpoint.h"
#include "cpprun/optimizer_state_dict.h"
#include "cpprun/state_dict.h"
#include "checkpoint/state_dict.h"
#include "scratch_files.h"
#include "zip_records.h"
#include "support/safetensors.h"

namespace {

// Python's nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)) has the same names.
torch::nn::Sequential small_net(int64_t out = 3) {
  return torch::nn::Sequential(torch::nn::Linear(4, out), torch::nn::BatchNorm1d(out));
}

// Every dtype both formats name, as buffers.
struct Typed : torch::nn::Module {
  Typed() {
    register_buffer("f64", torch::arange(6, torch::kDouble).reshape({2, 3}) / 7);
    register_buffer("bf16", torch::arange(5, torch::kFloat).to(torch::kBFloat16) * 0.5);
    register_buffer("f16", torch::arange(3, torch::kFloat).to(torch::kHalf));
    register_buffer("i64", torch::tensor({int64_t{-1}, int64_t{1} << 40}, torch::kLong));
    register_buffer("i32", torch::tensor({-7, 9}, torch::kInt));
    register_buffer("u8", torch::tensor({0, 255}, torch::kByte));
    register_buffer("flag", torch::tensor({true, false}));
    register_buffer("scalar", torch::tensor(3.5));
    register_buffer("empty", torch::empty({0, 4}));
  }
};

// A tied weight: one tensor under two names, as an LM's embedding and head.
struct Tied : torch::nn::Module {
  torch::Tensor shared = register_parameter("embed", torch::randn({3, 2}));
  Tied() { register_parameter("head", shared); }
};

void scramble(torch::nn::Module& m) {
  torch::NoGradGuard no_grad;
  for (auto& t : m.parameters()) t.uniform_(-5, 5);
  for (auto& b : m.buffers()) {
    if (b.is_floating_point()) b.fill_(42);
    else b.zero_();
  }
}

void require_equal_state(torch::nn::Module& a, torch::nn::Module& b) {
  auto sa = a.named_parameters();
  auto sb = b.named_parameters();
  REQUIRE(sa.size() == sb.size());
  for (const auto& item : sa) CHECK(torch::equal(item.value(), sb[item.key()]));
  auto ba = a.named_buffers();
  auto bb = b.named_buffers();
  REQUIRE(ba.size() == bb.size());
  for (const auto& item : ba) CHECK(torch::equal(item.value(), bb[item.key()]));
}

void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A hand-made safetensors file: the header's length, the header JSON, then `data`.
std::string file(const std::string& header, const std::string& data) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xFF));
  return out + header + data;
}
// What the reader says of `bytes`, read as h.safetensors.
std::string error(const std::string& bytes) {
  return error_text_of([&] { cpprun::detail::read_safetensors(bytes, "h.safetensors"); });
}

}  // namespace

TEST_CASE("state_dict: a module round-trips through .safetensors, .pt and .pth", "[state_dict]") {
  scratch::ScratchDir dir("state_dict_roundtrip");
  for (const char* name : {"m.safetensors", "m.pt", "m.pth"}) {
    const std::string path = (dir.path / name).string();
    auto saved = small_net();
    cpprun::save_state_dict(saved, path);
    auto loaded = small_net();
    scramble(*loaded);
    const auto report = cpprun::load_state_dict(loaded, path);
    CHECK(report.missing_keys.empty());
    CHECK(report.unexpected_keys.empty());
    require_equal_state(*saved, *loaded);

    Typed typed;
    cpprun::save_state_dict(typed, path);
    Typed other;
    scramble(other);
    cpprun::load_state_dict(other, path);
    require_equal_state(typed, other);
  }
}

TEST_CASE("state_dict: a tied weight is listed under both names and loads", "[state_dict]") {
  scratch::ScratchDir dir("state_dict_tied");
  for (const char* name : {"t.safetensors", "t.pt"}) {
    const std::string path = (dir.path / name).string();
    auto tied = std::make_shared<Tied>();
    cpprun::save_state_dict(tied, path);
    const auto bytes = name[2] == 's' ? scratch::contents(path) : cpprun::read_checkpoint_file(path);
    const auto file = cpprun::detail::decode_state_dict(bytes, path);
    REQUIRE(file.size() == 2);
    auto other = std::make_shared<Tied>();
    cpprun::load_state_dict(other, path);
    CHECK(torch::equal(other->shared, tied->shared));
    CHECK(other->named_parameters()["head"].data_ptr() == other->shared.data_ptr());  // still tied
  }
}

TEST_CASE("state_dict: a strict load lists every difference in one error, names the file, changes nothing",
          "[state_dict]") {
  scratch::ScratchDir dir("state_dict_strict");
  for (const char* name : {"s.safetensors", "s.pt"}) {
    const std::string path = (dir.path / name).string();
    auto wide = small_net(5);  // other shapes under the same names
    cpprun::save_state_dict(wide, path);
    auto net = small_net();
    auto before = small_net();
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < net->parameters().size(); ++i) before->parameters()[i].copy_(net->parameters()[i]);
    const std::string shapes = error_text_of([&] { cpprun::load_state_dict(net, path); });
    CHECK_THAT(shapes, Catch::Matchers::Contains("load_state_dict refused " + path));
    CHECK_THAT(shapes, Catch::Matchers::Contains("0.weight: file float32 [5, 4], module float32 [3, 4]"));
    CHECK_THAT(shapes, Catch::Matchers::Contains("1.running_var: file float32 [5], module float32 [3]"));
    CHECK_THAT(shapes, Catch::Matchers::Contains("shape or dtype differs (6)"));
    CHECK_THROWS_AS(cpprun::load_state_dict(net, path), cpprun::StateDictMismatchError);
    require_equal_state(*net, *before);

    // Other names: a model with an extra layer misses names the file lacks, and vice versa.
    auto longer = torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3), torch::nn::Linear(3, 2));
    const std::string names = error_text_of([&] { cpprun::load_state_dict(longer, path); });
    CHECK_THAT(names, Catch::Matchers::Contains("missing from the file (2): 2.bias, 2.weight"));
    auto shorter = torch::nn::Sequential(torch::nn::Linear(4, 5));
    const std::string extra = error_text_of([&] { cpprun::load_state_dict(shorter, path); });
    CHECK_THAT(extra, Catch::Matchers::Contains(
                          "in the file but not in the module (5): 1.bias, 1.num_batches_tracked, 1.running_mean"));
  }
}

TEST_CASE("state_dict: a BatchNorm whose module->to(dtype) converted num_batches_tracked is told why", "[state_dict]") {
  scratch::ScratchDir dir("state_dict_int_buffer");
  const std::string path = (dir.path / "bn.safetensors").string();
  cpprun::save_state_dict(small_net(), path);  // num_batches_tracked int64, as Python's .double() keeps it
  auto converted = small_net();
  converted->to(torch::kDouble);  // LibTorch converts the int64 buffer too
  const std::string message = error_text_of([&] { cpprun::load_state_dict(converted, path); });
  CHECK_THAT(message, Catch::Matchers::Contains("1.num_batches_tracked: file int64 [], module float64 []"));
  CHECK_THAT(message, Catch::Matchers::Contains("LibTorch's module->to(dtype) converted it"));
  // A file of another shape alone gets no such hint.
  cpprun::save_state_dict(small_net(5), path);
  CHECK_THAT(error_text_of([&] { cpprun::load_state_dict(small_net(), path); }),
             !Catch::Matchers::Contains("module->to(dtype)"));
}

// A half-precision export for a float32 model: strict(false), which the usual hint offers, would load
// none of it, so the message says how to convert instead (PyTorch's load_state_dict casts).
TEST_CASE("state_dict: a file that differs in dtype alone is told how to load it converted", "[state_dict]") {
  scratch::ScratchDir dir("state_dict_dtype_only");
  for (const char* name : {"h.safetensors", "h.pt"}) {
    const std::string path = (dir.path / name).string();
    auto half = torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::Linear(3, 2));
    half->to(torch::kBFloat16);
    cpprun::save_state_dict(half, path);
    auto net = torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::Linear(3, 2));
    const std::string message = error_text_of([&] { cpprun::load_state_dict(net, path); });
    CHECK_THAT(message, Catch::Matchers::Contains("0.weight: file bfloat16 [3, 4], module float32 [3, 4]"));
    CHECK_THAT(message, Catch::Matchers::Contains(
                            "Every difference is of dtype alone (file bfloat16, module float32). PyTorch's"));
    CHECK_THAT(message, !Catch::Matchers::Contains("To load only what fits"));
  }
  // A difference of shape too: the usual hint, not this one.
  const std::string path = (dir.path / "mixed.safetensors").string();
  auto other = torch::nn::Sequential(torch::nn::Linear(4, 5), torch::nn::Linear(5, 2));
  other->to(torch::kBFloat16);
  cpprun::save_state_dict(other, path);
  auto net = torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::Linear(3, 2));
  const std::string message = error_text_of([&] { cpprun::load_state_dict(net, path); });
  CHECK_THAT(message, !Catch::Matchers::Contains("of dtype alone"));
  CHECK_THAT(message, Catch::Matchers::Contains("To load only what fits"));
}

TEST_CASE("load_full_state_dict: real numbers convert, a bool or complex one is refused rather than cast", "[state_dict]") {
  scratch::ScratchDir dir("full_state_dtypes");
  const std::string path = (dir.path / "full.pt").string();
  torch::nn::Linear linear(4, 3);
  const auto archive_of = [&](const at::Tensor& weight) {
    torch::serialize::OutputArchive archive;
    archive.write("weight", weight);
    archive.write("bias", at::arange(3, at::kDouble));
    archive.save_to(path);  // as torch::save writes it: no footer
  };
  archive_of(at::ones({3, 4}, at::kDouble));  // float64 into float32: converts, as before
  cpprun::load_full_state_dict(linear, path);
  CHECK(linear->weight.equal(at::ones({3, 4})));
  CHECK(linear->bias.equal(at::arange(3, at::kFloat)));
  archive_of(at::full({3, 4}, 2, at::kLong));  // an integer tensor too (Module::load's copy_ did)
  cpprun::load_full_state_dict(linear, path);
  CHECK(linear->weight.equal(at::full({3, 4}, 2.0)));
  const at::Tensor before = linear->weight.detach().clone();
  for (const auto type : {at::kBool, at::kComplexFloat}) {
    archive_of(at::zeros({3, 4}, type));  // copy_ made a bool 1.0, and dropped a complex's imaginary part
    CHECK_THAT(error_text_of([&] { cpprun::load_full_state_dict(linear, path); }),
               Catch::Matchers::Contains("\"weight\" is " + std::string(c10::toString(type)) +
                                         " in the file but Float in the model") &&
                   Catch::Matchers::Contains("Nothing was loaded"));
    CHECK(linear->weight.equal(before));
  }
}

TEST_CASE("state_dict: strict(false) loads what fits and reports the rest", "[state_dict]") {
  scratch::ScratchDir dir("state_dict_lenient");
  const std::string path = (dir.path / "l.safetensors").string();
  auto source = torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::Linear(3, 7));
  cpprun::save_state_dict(source, path);
  auto target = torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::Linear(3, 2), torch::nn::Linear(2, 2));
  const auto report = cpprun::load_state_dict(target, path, cpprun::StateDictOptions().strict(false));
  CHECK(report.missing_keys == std::vector<std::string>{"2.bias", "2.weight"});
  CHECK(report.unexpected_keys.empty());
  REQUIRE(report.mismatched.size() == 2);
  CHECK(report.mismatched[0] == "1.bias: file float32 [7], module float32 [2]");
  CHECK(report.mismatched[1] == "1.weight: file float32 [7, 3], module float32 [2, 3]");
  CHECK(torch::equal(target[0]->as<torch::nn::Linear>()->weight, source[0]->as<torch::nn::Linear>()->weight));
  CHECK(torch::equal(target[0]->as<torch::nn::Linear>()->bias, source[0]->as<torch::nn::Linear>()->bias));
}

TEST_CASE("state_dict: damaged files are refused, naming the file and the fault, the model unchanged",
          "[state_dict]") {
  scratch::ScratchDir dir("state_dict_faults");
  const std::string good = (dir.path / "good.safetensors").string();
  auto source = small_net();
  cpprun::save_state_dict(source, good);
  const std::string bytes = scratch::contents(good);
  auto net = small_net();
  auto before = torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3));
  {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < net->parameters().size(); ++i) before->parameters()[i].copy_(net->parameters()[i]);
  }
  const auto refused = [&](const std::string& file_name, const std::string& contents, const std::string& why) {
    const std::string path = (dir.path / file_name).string();
    write_bytes(path, contents);
    const std::string message = error_text_of([&] { cpprun::load_state_dict(net, path); });
    CHECK_THAT(message, Catch::Matchers::Contains(path));
    CHECK_THAT(message, Catch::Matchers::Contains(why));
    CHECK_THROWS_AS(cpprun::load_state_dict(net, path), cpprun::CorruptCheckpointError);
    require_equal_state(*net, *before);
  };
  const uint64_t header = static_cast<uint8_t>(bytes[0]) | static_cast<uint64_t>(static_cast<uint8_t>(bytes[1])) << 8;
  refused("short.safetensors", bytes.substr(0, 5), "fewer than the 8 of the header length");
  refused("cut_header.safetensors", bytes.substr(0, 8 + header / 2), "only " + std::to_string(header / 2) + " follow");
  std::string claims = bytes;
  claims[5] = '\x01';  // a header length of 2^40 bytes
  refused("claims.safetensors", claims, "more than the format's limit");
  std::string more = bytes;
  more[0] = static_cast<char>(bytes.size() & 0xFF), more[1] = static_cast<char>((bytes.size() >> 8) & 0xFF);
  refused("more.safetensors", more, "bytes but only");
  refused("cut_data.safetensors", bytes.substr(0, bytes.size() - 4), "lie outside the file's");
  refused("added.safetensors", bytes + "xxxx", "added to?");
  std::string flipped = bytes;
  flipped[bytes.size() - 3] ^= 0x10;
  refused("flipped.safetensors", flipped, "the CRC-32 of its");
  std::string json = bytes;
  json[8 + 1] = '}';
  refused("json.safetensors", json, "JSON header is malformed");

  // A .pt of ours carries cpprun's footer: a flipped byte is caught.
  const std::string pt = (dir.path / "good.pt").string();
  cpprun::save_state_dict(source, pt);
  std::string pt_bytes = scratch::contents(pt);
  pt_bytes[pt_bytes.size() / 2] ^= 0x01;
  refused("flipped.pt", pt_bytes, "is damaged: the CRC-32");
  refused("not_zip.pt", "hello", "is not a torch.save file");
  CHECK_THAT(error_text_of([&] { cpprun::save_state_dict(net, (dir.path / "x.npz").string()); }),
             Catch::Matchers::Contains("a name ending in .safetensors writes Hugging Face's safetensors"));
}

TEST_CASE("safetensors: the reader refuses headers the format does not allow", "[state_dict]") {
  const auto ok = cpprun::detail::read_safetensors(
      file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
           R"("b\u00e9":{"dtype":"U8","shape":[],"data_offsets":[8,9]}})",
           std::string(9, '\0')),
      "h.safetensors");
  REQUIRE(ok.tensors.size() == 2);
  CHECK(ok.tensors[1].name == "b\xc3\xa9");
  CHECK_THAT(error(file(R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", "x")),
             Catch::Matchers::Contains("the dtype \"Q7\", which is not one safetensors defines"));
  // A valid file of a dtype cpprun lacks is not called invalid: what it lacks is named.
  const std::string f4 = error(file(R"({"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}})", "x"));
  CHECK_THAT(f4, Catch::Matchers::Contains("has dtype F4, whose elements are smaller than a byte"));
  CHECK_THAT(f4, !Catch::Matchers::Contains("invalid"));
  CHECK_THAT(error(file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, 'x'))),
             Catch::Matchers::Contains("is F32 of 3 elements (12 bytes) but its data_offsets span 8 bytes"));
  CHECK_THAT(error(file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],)"
                        R"("data_offsets":[2,6]}})", std::string(6, 'x'))),
             Catch::Matchers::Contains("overlap at byte 2"));
  CHECK_THAT(error(file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", std::string(4, 'x'))),
             Catch::Matchers::Contains("no tensor covers data bytes 0 to 2"));
  CHECK_THAT(error(file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[0],)"
                        R"("data_offsets":[1,1]}})", "x")),
             Catch::Matchers::Contains("the key \"a\" appears twice"));
  CHECK_THAT(error(file(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", "x")),
             Catch::Matchers::Contains("not a non-negative integer"));
  CHECK_THAT(error(file(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,1]}})", "x")),
             Catch::Matchers::Contains("more elements than the file has bytes"));
  CHECK_THAT(error(file(R"([1])", "")), Catch::Matchers::Contains("does not start with '{'"));
  CHECK_THAT(error(file(std::string(20, '[') , "")), Catch::Matchers::Contains("does not start with '{'"));
  CHECK_THAT(error(file("{\"a\":" + std::string(20, '[') + std::string(20, ']') + "}", "")),
             Catch::Matchers::Contains("nested too deeply"));
  CHECK_THAT(error(file(R"({"__metadata__":{"k":1}})", "")), Catch::Matchers::Contains("is not a string"));
}

TEST_CASE("safetensors: a shape whose element count overflows 64 bits is refused by name", "[state_dict]") {
  // 32 x 2^59 = 2^64: wrapped to 0 elements, it passed as an empty tensor beside 32 or more data
  // bytes, and LibTorch then threw without naming the file. A 0 before the overflowing dimensions
  // does not make them fit either (LibTorch multiplies them all).
  CHECK_THAT(error(file(R"({"a":{"dtype":"F32","shape":[32,576460752303423488],"data_offsets":[0,0]},)"
                        R"("b":{"dtype":"U8","shape":[64],"data_offsets":[0,64]}})", std::string(64, 'x'))),
             Catch::Matchers::Contains("tensor \"a\"'s shape has more elements than a 64-bit count holds") &&
                 Catch::Matchers::Contains("h.safetensors"));
  CHECK_THAT(error(file(R"({"a":{"dtype":"F32","shape":[0,1099511627776,1099511627776],)"
                        R"("data_offsets":[0,0]}})", "")),
             Catch::Matchers::Contains("more elements than a 64-bit count holds"));
  CHECK(cpprun::detail::read_safetensors(file(R"({"a":{"dtype":"F32","shape":[0,768],"data_offsets":[0,0]}})", ""),
                                         "h.safetensors").tensors.size() == 1);
}

TEST_CASE("state_dict: what is not a regular file is refused by name, not read without end", "[state_dict]") {
  scratch::ScratchDir dir("state_dict_not_regular");
  auto net = small_net();
  // A FIFO with no writer blocked the read forever; /dev/zero grew memory without bound; a
  // directory read as 0 bytes. Each now fails at once, naming the path and what it is.
  const std::string fifo = (dir.path / "fifo.safetensors").string();
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THAT(error_text_of([&] { cpprun::load_state_dict(net, fifo); }),
             Catch::Matchers::Contains(fifo) && Catch::Matchers::Contains("a FIFO (named pipe), not a regular file"));
  const std::string zero = (dir.path / "zero.safetensors").string();
  std::filesystem::create_symlink("/dev/zero", zero);
  CHECK_THAT(error_text_of([&] { cpprun::load_state_dict(net, zero); }),
             Catch::Matchers::Contains("a character device, not a regular file"));
  const std::string sharded = (dir.path / "sharded").string() + "/";
  cpprun::save_state_dict(net, sharded);
  const std::string shard = sharded + "model-00001-of-00001.safetensors";
  std::filesystem::remove(shard);
  std::filesystem::create_directory(shard);
  CHECK_THAT(error_text_of([&] { cpprun::load_state_dict(net, sharded); }),
             Catch::Matchers::Contains(shard + ": it is a directory, not a regular file"));
  // A link to a regular file is followed (Hugging Face's cache links its blobs).
  const std::string real = (dir.path / "real.safetensors").string(), link = (dir.path / "link.safetensors").string();
  cpprun::save_state_dict(net, real);
  std::filesystem::create_symlink(real, link);
  cpprun::load_state_dict(net, link);
}

TEST_CASE("state_dict: tied names the file gives different values are refused, the module unchanged",
          "[state_dict]") {
  scratch::ScratchDir dir("state_dict_tied_differ");
  // A file saved from an untied twin: "embed" and "head" differ. Loading both into the tied module
  // would keep whichever came last.
  struct Untied : torch::nn::Module {
    torch::Tensor embed = register_parameter("embed", torch::randn({3, 2}));
    torch::Tensor head = register_parameter("head", torch::randn({3, 2}));
  };
  const std::string path = (dir.path / "untied.safetensors").string();
  cpprun::save_state_dict(std::make_shared<Untied>(), path);
  auto tied = std::make_shared<Tied>();
  const torch::Tensor before = tied->shared.clone();
  const std::string message = error_text_of([&] { cpprun::load_state_dict(tied, path); });
  CHECK_THAT(message, Catch::Matchers::Contains(path) && Catch::Matchers::Contains("\"embed\" and \"head\"") &&
                          Catch::Matchers::Contains("ties them"));
  CHECK(torch::equal(tied->shared, before));
  // Equal copies (what a tied module saves) load, as before.
  const std::string same = (dir.path / "tied.safetensors").string();
  cpprun::save_state_dict(std::make_shared<Tied>(), same);
  cpprun::load_state_dict(tied, same);
}

// `good`'s records with data.pkl replaced by `pickle`, as a .pt without cpprun's footer.
std::string with_pickle(const std::string& good, const std::string& pickle) {
  return scratch::with_records_edited(cpprun::read_checkpoint_file(good), [&](const std::string& record, std::string& bytes) {
    if (record == "data.pkl") bytes = pickle;
  });
}

TEST_CASE("torch.save reader: values nested far deeper than a state dict are refused, not a stack overflow",
          "[state_dict]") {
  scratch::ScratchDir dir("state_dict_deep_pickle");
  const std::string good = (dir.path / "good.pt").string();
  cpprun::save_state_dict(small_net(), good);
  const auto refused = [&](const std::string& name, const std::string& pickle, const std::string& why) {
    const std::string path = (dir.path / name).string();
    write_bytes(path, with_pickle(good, pickle));
    CHECK_THAT(error_text_of([&] { cpprun::detail::read_state_dict_file(path); }),
               Catch::Matchers::Contains(path) && Catch::Matchers::Contains(why));
  };
  // A million nested one-tuples (a 1 MB data.pkl): freed one inside the other, they overflowed the
  // stack (SIGSEGV).
  refused("deep.pt", std::string("\x80\x02)", 3) + std::string(1000000, '\x85') + ".", "nest more than 64 deep");
  // ']' an empty list, 'q' memo 0, 'h' memo 0 again, 'a' append it to itself: a value holding itself.
  refused("cycle.pt", std::string("\x80\x02]q\x00h\x00" "a.", 9), "a value holds itself");
  // A list changed after it was placed in another: ']' an outer list, ']' an inner one, 'q' memo 0,
  // 'a' the inner into the outer, 'h' memo 0 again, 'K' 1, 'a' appended to the inner.
  refused("changed.pt", std::string("\x80\x02]]q\x00" "ah\x00K\x01" "a.", 13), "changes a value after placing it");
  // Five million one-byte pushes (None): ~150 bytes each in the reader, gigabytes from a few
  // megabytes (58 KB deflated); refused at the cap of Note [Bounded unpickling].
  refused("pushes.pt", std::string("\x80\x02", 2) + std::string(5000000, 'N') + ".", "pushes more than 4194304 values");
  // The memo and the MARKs grew uncounted: one dict memoized 5 million times (MEMOIZE, protocol 4's),
  // or 5 million MARKs, held gigabytes from a file of some 50 KB deflated (torch.load refuses both).
  refused("memo.pt", std::string("\x80\x02}", 3) + std::string(5000000, '\x94') + ".",
          "stores more memo entries (2) than it pushed values (1)");
  refused("marks.pt", std::string("\x80\x02", 2) + std::string(5000000, '(') + ".",
          "opens more than 256 MARKs at once");
  // LONG_BINPUT ('r') under 5 million keys of its own.
  std::string puts("\x80\x02}", 3);
  for (uint32_t key = 0; key < 5000000; ++key) {
    puts += 'r';
    for (int b = 0; b < 4; ++b) puts += static_cast<char>((key >> (8 * b)) & 0xff);
  }
  refused("puts.pt", puts + ".", "stores more memo entries (2) than it pushed values (1)");
  // The real file still reads.
  CHECK(cpprun::detail::read_state_dict_file(good).size() == small_net()->named_parameters().size() +
                                                               small_net()->named_buffers().size());
}

TEST_CASE("torch.save reader: a storage record of another size is refused before it is read", "[state_dict]") {
  scratch::ScratchDir dir("state_dict_storage_size");
  const std::string good = (dir.path / "good.pt").string();
  cpprun::save_state_dict(small_net(), good);
  // Every storage record 1 MiB of zeros: what a 1 GiB zip bomb's directory declares, in miniature.
  const std::string out = scratch::with_records_edited(cpprun::read_checkpoint_file(good),
                                                       [](const std::string& record, std::string& bytes) {
                                                         if (record.rfind("data/", 0) == 0) bytes.assign(1 << 20, '\0');
                                                       });
  const std::string path = (dir.path / "sizes.pt").string();
  write_bytes(path, out);
  CHECK_THAT(error_text_of([&] { cpprun::detail::read_state_dict_file(path); }),
             Catch::Matchers::Contains(path) && Catch::Matchers::Contains("holds 1048576 bytes, not"));
}

namespace {

// small_net() under a child named `child`: its names are small_net()'s with "child." before them,
// as torch.save(ddp_model.state_dict()) has DDP's "module.".
struct Holder : torch::nn::Module {
  torch::nn::Sequential inner;
  explicit Holder(const std::string& child) : inner(register_module(child, small_net())) {}
};

void copy_state(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < from.parameters().size(); ++i) to.parameters()[i].copy_(from.parameters()[i]);
  for (std::size_t i = 0; i < from.buffers().size(); ++i) to.buffers()[i].copy_(from.buffers()[i]);
}

}  // namespace

// See Note [A prefix all names share]: listing 4 missing and 4 unexpected names and suggesting
// strict(false) (which would load nothing) was all the error said.
TEST_CASE("state_dict: a prefix every name of one side carries is named, with the option that fixes it",
          "[state_dict]") {
  scratch::ScratchDir dir("state_dict_prefix");
  for (const std::string prefix : {"module", "_orig_mod", "model"}) {
    auto saved = std::make_shared<Holder>(prefix);
    scramble(*saved);
    const std::string path = (dir.path / (prefix + ".pt")).string();
    cpprun::save_state_dict(saved, path);
    auto net = small_net();
    const std::string message = error_text_of([&] { cpprun::load_state_dict(net, path); });
    const std::string fix = "StateDictOptions().consume_prefix_in_state_dict_if_present(\"" + prefix + ".\")";
    CHECK_THAT(message, Catch::Matchers::Contains("\nEvery name the file holds and the module lacks is one of the "
                                                  "module's with \"" + prefix + ".\" before it") &&
                            Catch::Matchers::Contains(fix) && !Catch::Matchers::Contains("strict(false)"));
    CHECK_THROWS_AS(cpprun::load_state_dict(net, path), cpprun::StateDictMismatchError);
    const auto options = cpprun::StateDictOptions().consume_prefix_in_state_dict_if_present(prefix + ".");
    cpprun::load_state_dict(net, path, options);
    auto expected = small_net();
    copy_state(*saved->inner, *expected);
    require_equal_state(*net, *expected);
    // In memory too, as PyTorch's consume_prefix_in_state_dict_if_present before load_state_dict.
    auto again = small_net();
    cpprun::set_model_state_dict(again, cpprun::get_model_state_dict(saved), options);
    require_equal_state(*again, *expected);
  }
  // DDP around a torch.compile'd model: "module._orig_mod.", the shortest prefix that fits.
  auto both = std::make_shared<torch::nn::Module>();
  both->register_module("module", std::make_shared<Holder>("_orig_mod"));
  const std::string nested = (dir.path / "nested.safetensors").string();
  cpprun::save_state_dict(both, nested);
  auto net = small_net();
  CHECK_THAT(error_text_of([&] { cpprun::load_state_dict(net, nested); }),
             Catch::Matchers::Contains("consume_prefix_in_state_dict_if_present(\"module._orig_mod.\")"));
  // The reverse: the module holds the file's model under a child: file_key_prefix.
  const std::string plain = (dir.path / "plain.safetensors").string();
  cpprun::save_state_dict(small_net(), plain);
  auto holder = std::make_shared<Holder>("model");
  CHECK_THAT(error_text_of([&] { cpprun::load_state_dict(holder, plain); }),
             Catch::Matchers::Contains("\nEvery name the module holds and the file lacks is one of the file's "
                                       "with \"model.\" before it") &&
                 Catch::Matchers::Contains("StateDictOptions().file_key_prefix(\"model.\")"));
  cpprun::load_state_dict(holder, plain, cpprun::StateDictOptions().file_key_prefix("model."));
  // Names that merely differ get no prefix hint, and keep strict(false)'s.
  const std::string other = (dir.path / "other.pt").string();
  cpprun::save_state_dict(torch::nn::Sequential(torch::nn::Linear(4, 3)), other);
  auto wider = torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::Linear(3, 3));
  CHECK_THAT(error_text_of([&] { cpprun::load_state_dict(wider, other); }),
             !Catch::Matchers::Contains("Every name") && Catch::Matchers::Contains("strict(false)"));
}

// See Note [Whole files that are not state dicts]: both were CorruptCheckpointError ("the value
// of \"model\" is not a tensor", "names the global __main__.Net").
TEST_CASE("torch.save reader: a checkpoint dict or a whole module is told apart from a damaged file",
          "[state_dict]") {
  scratch::ScratchDir dir("state_dict_not_a_state_dict");
  const std::string good = (dir.path / "good.pt").string();
  cpprun::save_state_dict(small_net(), good);
  const std::string body = [&] {
    std::string pickle;
    scratch::with_records_edited(cpprun::read_checkpoint_file(good), [&](const std::string& record, std::string& bytes) {
      if (record == "data.pkl") pickle = bytes;
    });
    REQUIRE(pickle.substr(0, 2) == std::string("\x80\x02", 2));
    return pickle.substr(2, pickle.size() - 3);  // the state dict, without PROTO and STOP
  }();
  const auto text = [](const std::string& s) {  // BINUNICODE
    std::string out = "X";
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((s.size() >> (8 * i)) & 0xFF));
    return out + s;
  };
  // {"model": <the state dict>, "epoch": 3}: torch.save({"model": model.state_dict(), "epoch": 3}).
  const std::string checkpoint = (dir.path / "checkpoint.pth.tar").string();
  write_bytes(checkpoint, with_pickle(good, std::string("\x80\x02}(", 4) + text("model") + body + text("epoch") +
                                                std::string("K\x03u.", 4)));
  auto net = small_net();
  const std::string message = error_text_of([&] { cpprun::load_state_dict(net, checkpoint); });
  CHECK_THAT(message, Catch::Matchers::Contains(checkpoint + " is a torch.save file, but not of a state dict") &&
                          Catch::Matchers::Contains("\"model\" (a state dict of 7 tensors), \"epoch\" (an int)") &&
                          Catch::Matchers::Contains("the state dict is under \"model\"") &&
                          Catch::Matchers::Contains("torch.save(torch.load(\"" + checkpoint + "\")[\"model\"], \"model.pt\")"));
  CHECK_THROWS_AS(cpprun::load_state_dict(net, checkpoint), cpprun::StateDictMismatchError);
  // torch.save(model): protocol 2's NEWOBJ of the module's class.
  const std::string whole = (dir.path / "whole.pt").string();
  write_bytes(whole, with_pickle(good, std::string("\x80\x02" "c__main__\nNet\n", 16) + std::string("q\0)\x81q\x01.", 7)));
  CHECK_THAT(error_text_of([&] { cpprun::load_state_dict(net, whole); }),
             Catch::Matchers::Contains("names the Python class or function __main__.Net") &&
                 Catch::Matchers::Contains("torch.save(model.state_dict(), \"model.pt\")"));
  CHECK_THROWS_AS(cpprun::load_state_dict(net, whole), cpprun::StateDictMismatchError);
  // A damaged one is still CorruptCheckpointError.
  const std::string cut = (dir.path / "cut.pt").string();
  write_bytes(cut, with_pickle(good, body.substr(0, body.size() / 2)));
  CHECK_THROWS_AS(cpprun::load_state_dict(net, cut), cpprun::CorruptCheckpointError);
}

// See Note [A file's format from its first bytes]: model.ckpt and checkpoint.pth.tar (torch.save
// takes any name) were refused by extension.
TEST_CASE("state_dict: a load tells the format from the file's bytes; a save names which extension picks which",
          "[state_dict]") {
  scratch::ScratchDir dir("state_dict_sniff");
  auto source = small_net();
  scramble(*source);
  const std::string pt = (dir.path / "a.pt").string(), st = (dir.path / "a.safetensors").string();
  cpprun::save_state_dict(source, pt);
  cpprun::save_state_dict(source, st);
  const std::pair<std::string, std::string> renamed[] = {
      {pt, "checkpoint.pth.tar"}, {st, "model.ckpt"}, {pt, "no_extension"}, {st, "swapped.pt"}, {pt, "swapped.safetensors"}};
  for (const auto& [from, name] : renamed) {
    const auto to = dir.path / name;
    std::filesystem::copy_file(from, to);
    auto net = small_net();
    cpprun::load_state_dict(net, to.string());
    require_equal_state(*net, *source);
  }
  auto net = small_net();
  CHECK_THAT(error_text_of([&] { cpprun::save_state_dict(net, (dir.path / "model.ckpt").string()); }),
             Catch::Matchers::Contains("a name ending in .safetensors writes Hugging Face's safetensors, one ending "
                                       "in .pt, .pth or .bin torch.save's dict of tensors"));
  const std::string garbage = (dir.path / "notes.txt").string();
  write_bytes(garbage, "not a checkpoint at all");
  CHECK_THAT(error_text_of([&] { cpprun::load_state_dict(net, garbage); }),
             Catch::Matchers::Contains(garbage + " (23 bytes) is neither torch.save's format"));
  CHECK_THROWS_AS(cpprun::load_state_dict(net, garbage), cpprun::CorruptCheckpointError);  // not a c10::Error
  // Safetensors under any name: with JSON white space before the header's '{' (which the reference
  // reader takes), and cut short (its reader says so, not "neither format"). Both were refused as
  // neither format under a name of no known extension.
  {
    const std::string header = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
    const std::string four("\0\0\x80\x3f", 4);  // 1.0f
    const std::string spaced = (dir.path / "spaced.ckpt").string();
    write_bytes(spaced, file("  \n" + header, four));
    CHECK(cpprun::detail::read_state_dict_file(spaced).size() == 1);
    const std::string cut = (dir.path / "cut_short").string();
    write_bytes(cut, file(header, four).substr(0, 20));
    CHECK_THAT(error_text_of([&] { cpprun::detail::read_state_dict_file(cut); }),
               Catch::Matchers::Contains("cut short"));
  }
  // What does not exist says so, file or directory.
  for (const std::string missing : {"missing.pt", "missing", "missing/"}) {
    const std::string path = (dir.path / missing).string();
    CHECK_THAT(error_text_of([&] { cpprun::load_state_dict(net, path); }),
               Catch::Matchers::Contains(path + " does not exist"));
  }
}

TEST_CASE("state_dict: a PyTorch torch.distributed.checkpoint directory is named, with the conversion",
          "[state_dict]") {
  scratch::ScratchDir dir("state_dict_dcp");
  const auto dcp = dir.path / "dcp";
  std::filesystem::create_directory(dcp);
  write_bytes(dcp / ".metadata", "x");
  write_bytes(dcp / "__0_0.distcp", "x");
  auto net = small_net();
  for (const std::string path : {dcp.string(), dcp.string() + "/", (dcp / ".metadata").string()}) {
    const std::string message = error_text_of([&] { cpprun::load_state_dict(net, path); });
    CHECK_THAT(message, Catch::Matchers::Contains("torch.distributed.checkpoint (DCP)") &&
                            Catch::Matchers::Contains("python scripts/dcp_convert.py to-cpprun " + dcp.string()) &&
                            Catch::Matchers::Contains(" OUT_DIR"));
    CHECK_THROWS_AS(cpprun::load_state_dict(net, path), cpprun::StateDictMismatchError);
  }
}

TEST_CASE("state_dict: the model and its optimizer save to a directory named with or without '/'", "[state_dict]") {
  scratch::ScratchDir dir("state_dict_model_and_optimizer");
  auto net = small_net();
  torch::optim::Adam opt(net->parameters(), 0.1);
  net->forward(torch::randn({5, 4})).sum().backward();
  opt.step();
  const std::string ck = (dir.path / "ck").string();  // as dcp.save(checkpoint_id="ck"): created
  cpprun::save_state_dict(net, opt, ck);
  CHECK(std::filesystem::is_directory(ck));
  auto again = small_net();
  torch::optim::Adam opt2(again->parameters(), 0.1);
  cpprun::load_state_dict(again, opt2, ck);
  require_equal_state(*again, *net);
  CHECK(opt2.state().size() == opt.state().size());
  const std::string missing = (dir.path / "nope").string();
  CHECK_THAT(error_text_of([&] { cpprun::load_state_dict(again, opt2, missing); }),
             Catch::Matchers::Contains(missing + " does not exist"));
  const std::string file = (dir.path / "model.safetensors").string();
  CHECK_THAT(error_text_of([&] { cpprun::save_state_dict(net, opt, file); }),
             Catch::Matchers::Contains("reads as a file's name"));
  cpprun::save_state_dict(net, (dir.path / "plain.pt").string());
  CHECK_THAT(error_text_of([&] { cpprun::save_state_dict(net, opt, (dir.path / "plain.pt").string()); }),
             Catch::Matchers::Contains("is a file, but the model and its optimizer in one call take a directory"));
}
