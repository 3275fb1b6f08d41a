// Uses only the installed headers and library: joins the job and all-reduces the ranks.
#include <cpprun/cpprun.h>

#include <ATen/ATen.h>
#include <iostream>

int main() {
  auto group = cpprun::init_process_group();
  at::Tensor t = at::full({4}, static_cast<double>(group.rank() + 1));
  cpprun::all_reduce(group, t);
  const double expected = group.size() * (group.size() + 1) / 2.0;
  const bool ok = t.eq(expected).all().item<bool>();
  std::cout << "consumer rank " << group.rank() << "/" << group.size() << " sum "
            << t[0].item<double>() << (ok ? " ok" : " WRONG") << std::endl;
  return ok ? 0 : 1;
}
