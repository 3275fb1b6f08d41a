// How what was typed maps to cpprun's options: argparse's (so torchrun's) unambiguous prefixes of a
// long option (--nproc 2 for --nproc_per_node 2), which CLI11 lacks, and "did you mean" for a typo.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace cpprun::launcher {

struct OptionSpelling {
  std::string name;          // "--nproc_per_node", "-r"
  int option = 0;            // spellings of one option share it (--nproc_per_node, --nproc-per-node)
  bool takes_value = false;  // the next argument is its value unless written --name=value
  // torchrun has this spelling too; false for cpprun's own options and aliases (--dry_run, --run_id).
  bool torchrun = true;
  std::string value_name;  // what its value may be, as --help writes it ("N|auto|cpu|gpu"); "" for a flag
};

// `args` with each long option that is a prefix of exactly one option written out in full, for
// CLI11; an exact spelling wins. A prefix of several options of which only one is torchrun's is
// that one, as torchrun reads it (--re is --redirects, though cpprun has --restart_backoff too).
// Stops at `--`, at PROGRAM and at an unknown option (CLI11 reports it); skips an option's
// separate value. Throws UsageError for a prefix of several options otherwise, for a flag given a
// value (--run_path=train.py) and for an option whose value is missing (the last word), as argparse
// refuses them, in words of ours rather than CLI11's ("Could not convert: ...").
std::vector<std::string> expand_option_prefixes(const std::vector<std::string>& args,
                                                const std::vector<OptionSpelling>& options);

// Edits (insert, delete, substitute, swap two neighbours) that turn `a` into `b`.
std::size_t edit_distance(const std::string& a, const std::string& b);

// The known option (spelled with its dashes, e.g. "--log_dir") closest to `typed`, if it is close
// enough to be what the user meant: a few edits away for a long name, one for a short one, or
// `typed` cut short ("--nproc" for "--nproc_per_node"). Ties go to the earlier name in `known`.
std::optional<std::string> suggest_option(const std::string& typed, const std::vector<std::string>& known);

}  // namespace cpprun::launcher
