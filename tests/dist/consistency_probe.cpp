// Ranks that call mismatched collectives, for tests/dist/consistency.sh, and a job that holds its
// store open while the script looks at where it listens.
//
// usage: consistency_probe MODE SYNC_DIR   (under cpprun --nproc_per_node=2)
// Two matching all-reduces come first, so the mismatch is collective #3. A rank that catches the
// error prints it, marks SYNC_DIR/failed.RANK and waits for the other ranks' marks before it
// exits 1, so that every rank's message is printed before cpprun stops the job. A rank that gets
// through prints its result and exits 0.
//
// With CPPRUN_PROBE_UNCAUGHT=1 the probe is the careless user of tests/dist/fault_cases.sh
// instead: the group keeps its default timeout, nothing is caught (an error ends the rank
// through std::terminate), and no rank waits for another's mark.
//
// Time marks for the scripts' bounds, which start there and not at the job's start (start-up on a
// loaded machine is no part of what they bound), each the Unix time in milliseconds: every process
// writes SYNC_DIR/joining.PID before it joins the group, and every rank SYNC_DIR/fault.RANK just
// before its mismatched call.
#include <torch/torch.h>  // what cpprun_torch_program precompiles; the probe itself needs only ATen
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include <unistd.h>

#include "cpprun/cpprun.h"
#include "time_mark.h"

namespace fs = std::filesystem;
using cpprun::ReduceOp;

namespace {

bool wait_for(const fs::path& file, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!fs::exists(file)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// The mismatched call of each mode; rank 0 differs from the others.
void mismatched_call(const std::string& mode, const cpprun::ProcessGroup& pg, const fs::path& sync_dir) {
  const bool first = pg.rank() == 0;
  if (mode == "broadcast_size") {  // the root sends fewer elements than the others expect
    at::Tensor t = at::full({first ? 4 : 8}, first ? 7.0 : -1.0);
    cpprun::broadcast(pg, t, 0);
    std::cout << "result " << t << std::endl;
  } else if (mode == "broadcast_size_root_larger") {
    at::Tensor t = at::full({first ? 8 : 4}, first ? 7.0 : -1.0);
    cpprun::broadcast(pg, t, 0);
    std::cout << "result " << t << std::endl;
  } else if (mode == "op") {
    at::Tensor t = at::ones({4});
    if (first) {
      cpprun::all_reduce(pg, t);
    } else {
      cpprun::broadcast(pg, t, 0);
    }
    std::cout << "result " << t << std::endl;
  } else if (mode == "dtype") {
    at::Tensor t = at::ones({4}, first ? at::kFloat : at::kDouble);
    cpprun::all_reduce(pg, t);
    std::cout << "result " << t << std::endl;
  } else if (mode == "all_reduce_op") {  // a wrong result on every rank, unchecked
    at::Tensor t = at::full({4}, first ? 1.0 : 2.0);
    cpprun::all_reduce(pg, t, first ? ReduceOp::kSum : ReduceOp::kMax);
    std::cout << "result " << t << std::endl;
  } else if (mode == "all_reduce_size") {  // Gloo's abort (SIGABRT), unchecked
    at::Tensor t = at::ones({first ? 4 : 8});
    cpprun::all_reduce(pg, t);
    std::cout << "result " << t << std::endl;
  } else if (mode == "all_gather_size") {
    const int64_t n = first ? 4 : 8;
    at::Tensor out = at::zeros({pg.size() * n});
    cpprun::all_gather_into(pg, out, at::ones({n}));
    std::cout << "result " << out << std::endl;
  } else if (mode == "skip_and_exit") {  // rank 0 skips all_reduce #3 and returns
    at::Tensor t = at::ones({4});
    if (!first) cpprun::all_reduce(pg, t);
    std::cout << "result " << t << std::endl;
  } else if (mode == "skip_then_identical") {
    // Rank 0 skips one of three identical all-reduces: its next pairs with the others' skipped
    // one (no check can tell them apart), and the others' last finds rank 0 gone.
    at::Tensor t = at::ones({4});
    for (int i = 0; i < (first ? 2 : 3); ++i) cpprun::all_reduce(pg, t);
    std::cout << "result " << t << std::endl;
  } else if (mode == "object_against_tensor") {  // rank 0 broadcasts an object, rank 1 a tensor
    if (pg.rank() == 0) {
      std::string name = "run";
      cpprun::broadcast_object(pg, name);
    } else {
      at::Tensor t = at::ones({4});
      cpprun::all_reduce(pg, t);
    }
  } else if (mode == "save_alone") {  // rank 0 saves a checkpoint alone; rank 1 trains on
    torch::nn::Linear net(4, 2);
    auto ddp = cpprun::DistributedDataParallel(net.ptr(), pg);
    if (pg.rank() == 0) {
      cpprun::save_state_dict(ddp, (sync_dir / "model.safetensors").string());
    } else {
      ddp->forward(at::ones({3, 4})).sum().backward();
    }
  } else if (mode == "reduce_scatter_op") {
    at::Tensor out = at::zeros({4});
    cpprun::reduce_scatter(pg, out, at::ones({pg.size() * 4}), first ? ReduceOp::kSum : ReduceOp::kMax);
    std::cout << "result " << out << std::endl;
  } else {
    TORCH_CHECK(false, "consistency_probe: unknown mode ", mode);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: consistency_probe MODE SYNC_DIR\n";
    return 2;
  }
  const std::string mode = argv[1];
  const fs::path sync_dir = argv[2];
  const bool uncaught = std::getenv("CPPRUN_PROBE_UNCAUGHT") != nullptr;
  cpprun::ProcessGroupOptions options;
  if (!uncaught) options.timeout = std::chrono::seconds(30);
  test_marks::mark_time(sync_dir / ("joining." + std::to_string(getpid())));
  auto pg = cpprun::init_process_group(options);

  if (mode == "store_binding") {  // hold the job while the script inspects the listening sockets
    if (pg.rank() == 0) {
      std::ofstream(sync_dir / "store_port") << pg.env().master_port << "\n";
      if (!wait_for(sync_dir / "inspected", std::chrono::seconds(25))) return 1;
    }
    cpprun::barrier(pg);
    return 0;
  }

  for (int i = 0; i < 2; ++i) {  // collectives #1 and #2 match
    at::Tensor t = at::ones({3});
    cpprun::all_reduce(pg, t);
    TORCH_CHECK(t.sum().item<double>() == 3.0 * pg.size(), "matching all_reduce gave ", t);
  }
  test_marks::mark_time(sync_dir / ("fault." + std::to_string(pg.rank())));
  if (uncaught) {
    mismatched_call(mode, pg, sync_dir);
    return 0;
  }
  try {
    mismatched_call(mode, pg, sync_dir);
  } catch (const c10::Error& e) {
    std::cerr << "rank " << pg.rank() << " caught: " << e.what_without_backtrace() << std::endl;
    std::ofstream(sync_dir / ("failed." + std::to_string(pg.rank()))) << "1\n";
    for (int r = 0; r < pg.size(); ++r) wait_for(sync_dir / ("failed." + std::to_string(r)), std::chrono::seconds(10));
    return 1;
  }
  return 0;
}
