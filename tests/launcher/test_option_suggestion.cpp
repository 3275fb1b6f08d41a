// Unit tests of "did you mean": the distance, and which mistakes get which suggestion.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "command_line/option_spelling.h"

using namespace cpprun::launcher;

namespace {

const std::vector<std::string> kKnown = {"--help",        "-h",           "--nproc_per_node", "--nproc-per-node",
                                         "--nnodes",      "--master_addr", "--master_port",   "--standalone",
                                         "--log_dir",     "--log-dir",    "-r",               "--redirects",
                                         "--tee",         "-t",           "--max_restarts"};

std::string suggest(const std::string& typed) { return suggest_option(typed, kKnown).value_or("(none)"); }

}  // namespace

TEST_CASE("option_suggestion: edit distance counts inserts, deletes, substitutions and swaps",
          "[option_suggestion]") {
  CHECK(edit_distance("", "") == 0);
  CHECK(edit_distance("abc", "abc") == 0);
  CHECK(edit_distance("abc", "") == 3);
  CHECK(edit_distance("kitten", "sitting") == 3);
  CHECK(edit_distance("nnodes", "nndoes") == 1);  // one swap
  CHECK(edit_distance("ab", "ba") == 1);
}

TEST_CASE("option_suggestion: typos get the closest option", "[option_suggestion]") {
  CHECK(suggest("--nproc_per_nod") == "--nproc_per_node");
  CHECK(suggest("--nprocs-per-node") == "--nproc-per-node");  // the typed spelling's twin
  CHECK(suggest("-nproc_per_node") == "--nproc_per_node");
  CHECK(suggest("--nndoes") == "--nnodes");
  CHECK(suggest("--standalon") == "--standalone");
  CHECK(suggest("--logdir") == "--log_dir");
  CHECK(suggest("--redirect") == "--redirects");
  CHECK(suggest("--max_restart") == "--max_restarts");
}

TEST_CASE("option_suggestion: abbreviations, as argparse would accept them", "[option_suggestion]") {
  CHECK(suggest("--nproc") == "--nproc_per_node");
  CHECK(suggest("--stand") == "--standalone");
}

TEST_CASE("option_suggestion: nothing for names that are nobody's typo", "[option_suggestion]") {
  CHECK(suggest("--bogus") == "(none)");
  CHECK(suggest("--lr") == "(none)");
  CHECK(suggest("-x") == "(none)");
  CHECK(suggest("--") == "(none)");
  CHECK(suggest("--completely-different") == "(none)");
}
