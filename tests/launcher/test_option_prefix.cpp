// Unit tests of long-option prefixes (argparse's allow_abbrev, which torchrun users rely on).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "command_line/launch_config.h"
#include "command_line/option_spelling.h"

using namespace cpprun::launcher;
using Catch::Matchers::Contains;

namespace {

using Args = std::vector<std::string>;

// A few of cpprun's options: two spellings of one, flags, short ones, and a shared prefix.
const std::vector<OptionSpelling> kOptions = {
    {"--nproc_per_node", 0, true}, {"--nproc-per-node", 0, true}, {"--nnodes", 1, true},
    {"--node_rank", 2, true},      {"--no_python", 3, false},     {"--no-python", 3, false},
    {"--tee", 4, true},            {"-t", 4, true},               {"--max_restarts", 5, true},
    {"--master_port", 6, true},    {"-m", 7, false},              {"--help", 8, false},
};

Args expand(const Args& args) { return expand_option_prefixes(args, kOptions); }

std::string ambiguity(const Args& args) {
  try {
    expand(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  FAIL("expected a UsageError");
  return {};
}

}  // namespace

TEST_CASE("option_prefix: an unambiguous prefix becomes the option", "[option_prefix]") {
  CHECK(expand({"--nproc", "2", "x"}) == Args{"--nproc_per_node", "2", "x"});
  CHECK(expand({"--nproc=2", "x"}) == Args{"--nproc_per_node=2", "x"});
  CHECK(expand({"--nproc-per", "2", "x"}) == Args{"--nproc-per-node", "2", "x"});
  CHECK(expand({"--max", "3", "--nn=2", "x"}) == Args{"--max_restarts", "3", "--nnodes=2", "x"});
  CHECK(expand({"--no_", "x"}) == Args{"--no_python", "x"});
  CHECK(expand({"--he"}) == Args{"--help"});
  // Exact spellings stay, even where they are a prefix of another option too.
  CHECK(expand({"--tee", "1", "x"}) == Args{"--tee", "1", "x"});
}

TEST_CASE("option_prefix: an option's value, PROGRAM and what follows are left alone", "[option_prefix]") {
  // The value of --nnodes looks like an option; PROGRAM's own flags are never touched.
  CHECK(expand({"--nnodes", "--max", "./train", "--nproc", "4"}) ==
        Args{"--nnodes", "--max", "./train", "--nproc", "4"});
  CHECK(expand({"--nproc", "2", "--", "--max", "x"}) == Args{"--nproc_per_node", "2", "--", "--max", "x"});
  CHECK(expand({"-t", "1", "--nproc", "2", "x"}) == Args{"-t", "1", "--nproc_per_node", "2", "x"});
  CHECK(expand({"-t1", "--nproc", "2", "x"}) == Args{"-t1", "--nproc_per_node", "2", "x"});
  CHECK(expand({"-m", "pkg", "--nproc", "2"}) == Args{"-m", "pkg", "--nproc", "2"});
  // An unknown option ends the rewriting; the parser reports it.
  CHECK(expand({"--bogus", "--nproc", "2", "x"}) == Args{"--bogus", "--nproc", "2", "x"});
  CHECK(expand({}).empty());
}

TEST_CASE("option_prefix: an ambiguous prefix is an error that lists the candidates", "[option_prefix]") {
  CHECK_THAT(ambiguity({"--n", "2", "x"}),
             Contains("ambiguous option --n: it could be --nproc_per_node, --nnodes, --node_rank, --no_python"));
  CHECK_THAT(ambiguity({"--no=1", "x"}), Contains("ambiguous option --no: it could be --node_rank, --no_python"));
  CHECK_THAT(ambiguity({"--ma", "1", "x"}), Contains("--max_restarts, --master_port"));
}
