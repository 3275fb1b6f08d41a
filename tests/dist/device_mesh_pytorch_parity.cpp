// The C++ side of device_mesh_pytorch_parity.sh: with no process group yet, each rank calls
// cpprun::init_device_mesh("cpu", {2, 2}, {"dp", "tp"}) (which joins the default group, as
// PyTorch's), writes its groups' ranks and its coordinate to DIR/cpp.RANK in the format
// device_mesh_pytorch_parity.py writes PyTorch's, then which of the calls in CASES it refuses.
//   cpprun --nproc_per_node=4 device_mesh_pytorch_parity DIR
#include <torch/torch.h>

#include <cstdint>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cpprun/cpprun.h"

namespace {

std::string listed(const std::vector<int>& values) { return "[" + c10::Join(", ", values) + "]"; }

}  // namespace

int main(int argc, char** argv) {
  TORCH_CHECK(argc == 2, "usage: cpprun --nproc_per_node=4 device_mesh_pytorch_parity DIR");
  const bool initialized_before = cpprun::is_initialized();
  cpprun::DeviceMesh mesh = cpprun::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  const int rank = cpprun::rank();
  std::ofstream out(std::string(argv[1]) + "/cpp." + std::to_string(rank));
  out << "initialized before " << (initialized_before ? "True" : "False") << " after "
      << (cpprun::is_initialized() ? "True" : "False") << "\n";
  out << "rank " << rank << " dp " << listed(cpprun::get_process_group_ranks(mesh.group("dp"))) << " tp "
      << listed(cpprun::get_process_group_ranks(mesh.group("tp"))) << " coordinate "
      << listed({mesh.coordinate("dp"), mesh.coordinate("tp")}) << "\n";
  // The same cases, in the same order, as the Python side's CASES.
  using Shape = std::vector<int64_t>;
  using Names = std::vector<std::string>;
  const std::vector<std::pair<std::string, std::function<void()>>> cases = {
      {"repeated_names", [] { cpprun::init_device_mesh("cpu", Shape{2, 2}, Names{"dp", "dp"}); }},
      {"fewer_names", [] { cpprun::init_device_mesh("cpu", Shape{2, 2}, Names{"dp"}); }},
      {"more_names", [] { cpprun::init_device_mesh("cpu", Shape{4}, Names{"dp", "tp"}); }},
      {"bigger_than_world", [] { cpprun::init_device_mesh("cpu", Shape{2, 4}); }},
      {"device_index", [] { cpprun::init_device_mesh("cuda:0", Shape{4}); }},
      {"negative_size", [] { cpprun::init_device_mesh("cpu", Shape{-2, -2}); }},
      {"one_d", [] { cpprun::init_device_mesh("cpu", Shape{4}); }},
      {"three_d", [] { cpprun::init_device_mesh(c10::kCPU, Shape{1, 2, 2}, Names{"pp", "dp", "tp"}); }},
  };
  for (const auto& [name, call] : cases) {
    std::string outcome = "accepted";
    try {
      call();
    } catch (const c10::Error&) {
      outcome = "refused";
    }
    out << name << " " << outcome << "\n";
  }
  out.close();
  cpprun::destroy_process_group();
  return 0;
}
