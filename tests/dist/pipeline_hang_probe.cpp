// A pipeline that stops, for tests/dist/pipeline_hang.sh (under cpprun --nproc_per_node=2, a 3 s
// group timeout). Both ranks run one 1F1B step; then, by MODE:
//   leave: rank 0 leaves its loop early, as a careless user's off-by-one would, and lingers (60 s)
//          while rank 1 calls step() again and waits at the step's opening agreement;
//   stall: both begin a second step, and stage 0's forward stalls (60 s: a stuck data loader or
//          kernel) while stage 1 waits for its message.
// Rank 1 must fail at the timeout naming the stage it waits on; the launcher then stops rank 0.
// usage: pipeline_hang_probe SYNC_DIR [leave|stall]   (rank 1 marks SYNC_DIR/waiting.1 before its
// second step)
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "cpprun/cpprun.h"
#include "time_mark.h"

namespace {

std::atomic<bool> stall_forward{false};

// Passes its input through; sleeps 60 s first once stall_forward is set.
struct StallImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) {
    if (stall_forward) std::this_thread::sleep_for(std::chrono::seconds(60));
    return x;
  }
};
TORCH_MODULE(Stall);

}  // namespace

int main(int argc, char** argv) {
  return cpprun::record([&] {
    const std::string sync_dir = argc > 1 ? argv[1] : ".";
    const std::string mode = argc > 2 ? argv[2] : "leave";
    TORCH_CHECK(mode == "leave" || mode == "stall", "pipeline_hang_probe: MODE is leave or stall, not ", mode);
    cpprun::ProcessGroupOptions options;
    options.timeout = std::chrono::seconds(3);
    auto group = cpprun::init_process_group(options);
    torch::manual_seed(0);
    torch::nn::Sequential net;
    net->push_back("in", torch::nn::Linear(4, 8));
    net->push_back("stall", Stall());
    net->push_back("act", torch::nn::Tanh());
    net->push_back("out", torch::nn::Linear(8, 2));
    cpprun::PipelineStage stage(net, {{"in", "stall", "act"}, {"out"}}, group);
    cpprun::Schedule1F1B schedule(stage, 2, [](const at::Tensor& out, const at::Tensor& y) { return torch::mse_loss(out, y); });
    const auto x = torch::randn({4, 4}), y = torch::randn({4, 2});
    schedule.step(x, y);
    if (group.rank() == 0) {
      if (mode == "stall") {
        stall_forward = true;
        schedule.step(x, y);  // stalls in stage 0's first forward; the launcher should stop it first
      }
      std::this_thread::sleep_for(std::chrono::seconds(60));  // "done": the launcher should stop it first
      return 0;
    }
    test_marks::mark_time(sync_dir + "/waiting.1");
    schedule.step(x, y);  // waits for stage 0, which never sends
    return 0;
  });
}
