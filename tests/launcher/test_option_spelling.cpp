// Unit tests of option spellings: long-option prefixes (argparse's allow_abbrev, which torchrun
// users rely on) and "did you mean" (the distance, and which mistakes get which suggestion).
#include "catch.h"

#include <string>
#include <vector>

#include "command_line/launch_config.h"
#include "command_line/option_spelling.h"
#include "usage_error_text.h"

using namespace cpprun::launcher;
using Catch::Matchers::Contains;
using Args = std::vector<std::string>;

namespace {

// A few of cpprun's options: two spellings of one, flags, short ones, and a shared prefix.
const std::vector<OptionSpelling> kOptions = {
    {"--nproc_per_node", 0, true}, {"--nproc-per-node", 0, true}, {"--nnodes", 1, true},
    {"--node_rank", 2, true},      {"--no_python", 3, false},     {"--no-python", 3, false},
    {"--tee", 4, true},            {"-t", 4, true},               {"--max_restarts", 5, true},
    {"--master_port", 6, true},    {"-m", 7, false},              {"--help", 8, false},
};

Args expand(const Args& args) { return expand_option_prefixes(args, kOptions); }

std::string ambiguity(const Args& args) {
  return usage_error_text([&] { expand(args); });
}

// The spellings "did you mean" chooses among.
const std::vector<std::string> kKnown = {"--help",        "-h",           "--nproc_per_node", "--nproc-per-node",
                                         "--nnodes",      "--master_addr", "--master_port",   "--standalone",
                                         "--log_dir",     "--log-dir",    "-r",               "--redirects",
                                         "--tee",         "-t",           "--max_restarts"};

std::string suggest(const std::string& typed) { return suggest_option(typed, kKnown).value_or("(none)"); }

}  // namespace

TEST_CASE("option_spelling: an unambiguous prefix becomes the option", "[option_spelling]") {
  CHECK(expand({"--nproc", "2", "x"}) == Args{"--nproc_per_node", "2", "x"});
  CHECK(expand({"--nproc=2", "x"}) == Args{"--nproc_per_node=2", "x"});
  CHECK(expand({"--nproc-per", "2", "x"}) == Args{"--nproc-per-node", "2", "x"});
  CHECK(expand({"--max", "3", "--nn=2", "x"}) == Args{"--max_restarts", "3", "--nnodes=2", "x"});
  CHECK(expand({"--no_", "x"}) == Args{"--no_python", "x"});
  CHECK(expand({"--he"}) == Args{"--help"});
  // Exact spellings stay, even where they are a prefix of another option too.
  CHECK(expand({"--tee", "1", "x"}) == Args{"--tee", "1", "x"});
}

TEST_CASE("option_spelling: an option's value, PROGRAM and what follows are left alone", "[option_spelling]") {
  // PROGRAM's own flags are never touched.
  CHECK(expand({"--nnodes", "2", "./train", "--nproc", "4"}) == Args{"--nnodes", "2", "./train", "--nproc", "4"});
  // A value that looks like an option is refused, as argparse refuses it: once taken as the value
  // ("--log-dir --redirects=3" made a log dir named "--redirects=3" and redirected nothing).
  CHECK_THAT(ambiguity({"--nnodes", "--max", "./train"}),
             Contains("argument --nnodes: expected one argument (the next word, --max, is an option"));
  CHECK_THAT(ambiguity({"--tee", "--no-python", "./train"}), Contains("argument --tee: expected one argument"));
  CHECK_THAT(ambiguity({"-t", "-m", "pkg"}), Contains("argument -t: expected one argument"));
  // A negative number is a value (argparse's rule), and so is a lone "-".
  CHECK(expand({"--max_restarts", "-1", "x"}) == Args{"--max_restarts", "-1", "x"});
  CHECK(expand({"--tee", "-", "x"}) == Args{"--tee", "-", "x"});
  CHECK(expand({"--nnodes", "-.5", "x"}) == Args{"--nnodes", "-.5", "x"});
  CHECK(expand({"--nnodes", "-1.5", "x"}) == Args{"--nnodes", "-1.5", "x"});
  CHECK_THAT(ambiguity({"--nnodes", "-1.", "x"}), Contains("argument --nnodes: expected one argument"));
  // argparse takes a word with a space in it as a value, unless it is one of its options: torchrun
  // users write --log_line_prefix_template "- ${rank} -".
  CHECK(expand({"--tee", "- ${rank} -", "x"}) == Args{"--tee", "- ${rank} -", "x"});
  CHECK(expand({"--tee", "--- epoch", "x"}) == Args{"--tee", "--- epoch", "x"});
  CHECK_THAT(ambiguity({"--tee", "--nproc=2 3", "x"}), Contains("argument --tee: expected one argument"));
  CHECK(expand({"--nproc", "2", "--", "--max", "x"}) == Args{"--nproc_per_node", "2", "--", "--max", "x"});
  CHECK(expand({"-t", "1", "--nproc", "2", "x"}) == Args{"-t", "1", "--nproc_per_node", "2", "x"});
  CHECK(expand({"-t1", "--nproc", "2", "x"}) == Args{"-t1", "--nproc_per_node", "2", "x"});
  CHECK(expand({"-m", "pkg", "--nproc", "2"}) == Args{"-m", "pkg", "--nproc", "2"});
  // An unknown option ends the rewriting; the parser reports it.
  CHECK(expand({"--bogus", "--nproc", "2", "x"}) == Args{"--bogus", "--nproc", "2", "x"});
  CHECK(expand({}).empty());
}

TEST_CASE("option_spelling: --name= is an empty value, not the next argument", "[option_spelling]") {
  // argparse (torchrun) reads --tee= as the empty string; CLI11 would take PROGRAM as the value.
  CHECK(expand({"--tee=", "./train", "--x"}) == Args{"--tee", "", "./train", "--x"});
  CHECK(expand({"--nproc=", "./train"}) == Args{"--nproc_per_node", "", "./train"});
  CHECK(expand({"--nnodes=", "--nproc", "2", "x"}) == Args{"--nnodes", "", "--nproc_per_node", "2", "x"});
  // A value that ends in = is a value.
  CHECK(expand({"--tee=a=", "x"}) == Args{"--tee=a=", "x"});
  // A flag written with = is refused, as argparse refuses it ("ignored explicit argument ''").
  CHECK_THAT(ambiguity({"--no_python=", "x"}),
             Contains("--no_python is a flag and takes no value (--no_python= was given); write --no_python alone\n"));
  // A short option with '=': argparse's value is what follows it (CLI11 would read "=3").
  CHECK(expand({"-t=3", "--nproc", "2", "x"}) == Args{"-t3", "--nproc_per_node", "2", "x"});
  CHECK(expand({"-t==3", "x"}) == Args{"-t=3", "x"});
  CHECK(expand({"-t=", "x"}) == Args{"-t", "", "x"});
}

TEST_CASE("option_spelling: an ambiguous prefix is an error that lists the candidates", "[option_spelling]") {
  CHECK_THAT(ambiguity({"--n", "2", "x"}),
             Contains("ambiguous option --n: it could be --nproc_per_node, --nnodes, --node_rank, --no_python"));
  CHECK_THAT(ambiguity({"--no=1", "x"}), Contains("ambiguous option --no: it could be --node_rank, --no_python"));
  CHECK_THAT(ambiguity({"--ma", "1", "x"}), Contains("--max_restarts, --master_port"));
}

TEST_CASE("option_spelling: a prefix of one torchrun option and cpprun's own is torchrun's option, as torchrun "
          "reads it",
          "[option_spelling]") {
  // torchrun's --redirects, --run_path and --no_python beside options and an alias torchrun lacks.
  const std::vector<OptionSpelling> options = {
      {"--redirects", 0, true},        {"-r", 0, true},
      {"--restart_backoff", 1, true, false}, {"--restart-backoff", 1, true, false},
      {"--rdzv_id", 2, true},          {"--rdzv-id", 2, true},
      {"--run_id", 2, true, false},    {"--run-id", 2, true, false},
      {"--run_path", 3, false},        {"--run-path", 3, false},
      {"--no_python", 4, false},       {"--no-python", 4, false},
      {"--no_job_secret", 5, false, false}, {"--no-job-secret", 5, false, false},
  };
  const auto with = [&](const Args& args) { return expand_option_prefixes(args, options); };
  CHECK(with({"--re=0", "x"}) == Args{"--redirects=0", "x"});
  CHECK(with({"--re", "0", "x"}) == Args{"--redirects", "0", "x"});
  CHECK(with({"--run_", "x"}) == Args{"--run_path", "x"});
  CHECK(with({"--run-", "x"}) == Args{"--run-path", "x"});
  CHECK(with({"--no-", "x"}) == Args{"--no-python", "x"});
  CHECK(with({"--no_", "x"}) == Args{"--no_python", "x"});
  // cpprun's own options stay reachable by a prefix of their own, and written out.
  CHECK(with({"--rest=1", "x"}) == Args{"--restart_backoff=1", "x"});
  CHECK(with({"--run_i=j", "x"}) == Args{"--run_id=j", "x"});
  CHECK(with({"--no_j", "x"}) == Args{"--no_job_secret", "x"});
  // Ambiguous among torchrun's own options too: still an error naming all of them.
  CHECK_THAT(usage_error_text([&] { with({"--r", "x"}); }),
             Contains("ambiguous option --r: it could be --redirects, --restart_backoff, --rdzv_id, --run_path"));
}

TEST_CASE("option_spelling: a flag given a value and a missing value are said in words, not CLI11's",
          "[option_spelling]") {
  const std::vector<OptionSpelling> options = {
      {"--run_path", 0, false}, {"--nproc_per_node", 1, true, true, "N|auto|cpu|gpu"}, {"-m", 2, false},
      {"--log_dir", 3, true, true, "DIR"}, {"--nnodes", 4, true}};
  const auto error = [&](const Args& args) { return usage_error_text([&] { expand_option_prefixes(args, options); }); };
  CHECK_THAT(error({"--run_path=train.py"}),
             Contains("--run_path is a flag and takes no value (--run_path=train.py was given); write --run_path alone "
                      "(if 'train.py' is PROGRAM: --run_path train.py)"));
  CHECK_THAT(error({"--run_p=x", "train.py"}),
             Contains("--run_path is a flag and takes no value (--run_p=x was given)"));
  CHECK_THAT(error({"-m=pkg"}), Contains("-m is a flag and takes no value"));
  CHECK_THAT(error({"--run_path=", "t.py"}), Contains("--run_path is a flag and takes no value"));
  CHECK_THAT(error({"--nproc_per_node"}),
             Contains("--nproc_per_node expects a value (N, auto, cpu or gpu): write --nproc_per_node=VALUE, "
                      "then PROGRAM"));
  CHECK_THAT(error({"--nproc"}), Contains("--nproc_per_node expects a value (N, auto, cpu or gpu)"));
  CHECK_THAT(error({"--log_dir=/l", "--log_dir"}), Contains("--log_dir expects a value (DIR)"));
  CHECK_THAT(error({"--nnodes"}), Contains("--nnodes expects a value: write --nnodes=VALUE"));
  // Values given either way still pass; a flag's value after it is PROGRAM, not its value.
  CHECK(expand_option_prefixes({"--nproc_per_node", "2", "x"}, options) == Args{"--nproc_per_node", "2", "x"});
  CHECK(expand_option_prefixes({"--run_path", "t.py"}, options) == Args{"--run_path", "t.py"});
}

TEST_CASE("option_spelling: edit distance counts inserts, deletes, substitutions and swaps",
          "[option_spelling]") {
  CHECK(edit_distance("", "") == 0);
  CHECK(edit_distance("abc", "abc") == 0);
  CHECK(edit_distance("abc", "") == 3);
  CHECK(edit_distance("kitten", "sitting") == 3);
  CHECK(edit_distance("nnodes", "nndoes") == 1);  // one swap
  CHECK(edit_distance("ab", "ba") == 1);
}

TEST_CASE("option_spelling: typos get the closest option", "[option_spelling]") {
  CHECK(suggest("--nproc_per_nod") == "--nproc_per_node");
  CHECK(suggest("--nprocs-per-node") == "--nproc-per-node");  // the typed spelling's twin
  CHECK(suggest("-nproc_per_node") == "--nproc_per_node");
  CHECK(suggest("--nndoes") == "--nnodes");
  CHECK(suggest("--standalon") == "--standalone");
  CHECK(suggest("--logdir") == "--log_dir");
  CHECK(suggest("--redirect") == "--redirects");
  CHECK(suggest("--max_restart") == "--max_restarts");
}

TEST_CASE("option_spelling: abbreviations, as argparse would accept them", "[option_spelling]") {
  CHECK(suggest("--nproc") == "--nproc_per_node");
  CHECK(suggest("--stand") == "--standalone");
}

TEST_CASE("option_spelling: nothing for names that are nobody's typo", "[option_spelling]") {
  CHECK(suggest("--bogus") == "(none)");
  CHECK(suggest("--lr") == "(none)");
  CHECK(suggest("-x") == "(none)");
  CHECK(suggest("--") == "(none)");
  CHECK(suggest("--completely-different") == "(none)");
}
