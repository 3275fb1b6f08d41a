// argparse, and so torchrun, accepts any unambiguous prefix of a long option (--nproc 2 for
// --nproc_per_node 2); CLI11 does not. This rewrites such prefixes to the full spelling before
// CLI11 parses. Pure, unit-tested.
#pragma once

#include <string>
#include <vector>

namespace cpprun::launcher {

struct OptionSpelling {
  std::string name;          // "--nproc_per_node", "-r"
  int option = 0;            // spellings of one option share it (--nproc_per_node, --nproc-per-node)
  bool takes_value = false;  // the next argument is its value unless written --name=value
};

// Returns `args` with each long option that is a prefix of exactly one option's spellings written
// out in full (the first spelling that matches). An exact spelling always wins. Stops, leaving the
// rest untouched, at `--`, at the first argument that is not an option (PROGRAM) and at an unknown
// option (CLI11 reports it); an option's separate value is skipped. Throws UsageError for a prefix
// of several options, listing them.
std::vector<std::string> expand_option_prefixes(const std::vector<std::string>& args,
                                                const std::vector<OptionSpelling>& options);

}  // namespace cpprun::launcher
