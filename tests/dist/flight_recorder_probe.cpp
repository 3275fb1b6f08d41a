// Ranks that get stuck, are asked for a dump, or terminate, for tests/dist/flight_recorder.sh.
//
// usage: flight_recorder_probe MODE SYNC_DIR   (under cpprun --nproc_per_node=2)
// Two matching all-reduces come first (collectives #1 and #2), then:
//   stuck      rank 1 skips all_reduce #3; rank 0 marks SYNC_DIR/stuck.0 (the Unix time in ms,
//              where the script's time bound starts), waits in #3 until the group's timeout
//              (3 s), prints what it caught, then what a send after it says, and exits 1. Rank 1
//              exits 0 once rank 0's dump is there.
//   request    rank 0 enters all_reduce #3 and marks SYNC_DIR/ready.0; rank 1 marks ready.1 and
//              waits for SYNC_DIR/release before it joins #3; both exit 0. Each rank first
//              checks that its request fd is closed for its children.
//   terminate  rank 0 throws from main (std::terminate); rank 1 exits 0 once rank 0's dump is there.
// Dumps go where CPPRUN_FLIGHT_RECORDER_DIR says (the script sets it).
#include <torch/torch.h>  // what cpprun_torch_program precompiles; the probe itself needs only ATen
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>

#include "cpprun/cpprun.h"
#include "time_mark.h"

namespace fs = std::filesystem;

namespace {

bool wait_for(const fs::path& file, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!fs::exists(file)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

fs::path dump_of(int rank) { return fs::path(std::getenv("CPPRUN_FLIGHT_RECORDER_DIR")) / ("rank_" + std::to_string(rank) + ".json"); }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: flight_recorder_probe MODE SYNC_DIR\n";
    return 2;
  }
  const std::string mode = argv[1];
  const fs::path sync_dir = argv[2];
  cpprun::ProcessGroupOptions options;
  options.timeout = mode == "stuck" ? std::chrono::seconds(3) : std::chrono::seconds(30);
  auto pg = cpprun::init_process_group(options);
  const int rank = pg.rank();

  if (mode == "request") {
    // The request fd must not reach this worker's own children: a child that kept the pipe's
    // read end could swallow the launcher's requests.
    const std::string fd = std::getenv("CPPRUN_FLIGHT_RECORDER_REQUEST_FD");
    const int leaked = std::system(("test -e /proc/$$/fd/" + fd).c_str());
    std::cout << "request fd " << fd << (leaked == 0 ? " reaches" : " does not reach") << " a child" << std::endl;
  }
  for (int i = 0; i < 2; ++i) {
    at::Tensor t = at::ones({3});
    cpprun::all_reduce(pg, t);
  }

  if (mode == "stuck") {
    if (rank == 1) return wait_for(dump_of(0), std::chrono::seconds(20)) ? 0 : 1;
    test_marks::mark_time(sync_dir / "stuck.0");
    try {
      cpprun::all_reduce(pg, at::ones({4096}));
    } catch (const std::exception& e) {  // Gloo's own error types are not all c10::Error
      std::cerr << "rank 0 caught: " << e.what() << std::endl;
      // A message after the timeout, which closed the group's connections: Gloo's bare exception
      // ("Application timeout caused pair closure") reached the caller from send's posting.
      try {
        cpprun::send(pg, at::ones({2}), 1);
      } catch (const std::exception& after) {
        std::cerr << "rank 0's send after the timeout: " << after.what() << std::endl;
      }
      return 1;
    }
    std::cout << "all_reduce #3 returned without rank 1" << std::endl;
    return 0;
  }
  if (mode == "request") {
    at::Tensor t = at::ones({4096});
    if (rank == 0) {
      // Ready once #3 is recorded: the check before an all-reduce makes even all_reduce_async
      // wait for rank 1, so the mark comes from beside the call.
      std::thread mark([&] {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (std::chrono::steady_clock::now() < deadline) {
          const auto entries = cpprun::flight_recorder_entries();
          if (!entries.empty() && entries.back().seq == 3) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        std::ofstream(sync_dir / "ready.0") << "1\n";
      });
      cpprun::all_reduce(pg, t);
      mark.join();
    } else {
      std::ofstream(sync_dir / "ready.1") << "1\n";
      if (!wait_for(sync_dir / "release", std::chrono::seconds(20))) return 1;
      cpprun::all_reduce(pg, t);
    }
    std::cout << "all_reduce #3 gave " << t[0].item<float>() << std::endl;
    return 0;
  }
  if (mode == "terminate") {
    if (rank == 1) return wait_for(dump_of(0), std::chrono::seconds(20)) ? 0 : 1;
    throw std::runtime_error("flight_recorder_probe: rank 0 gives up");  // uncaught: std::terminate
  }
  std::cerr << "flight_recorder_probe: unknown mode " << mode << "\n";
  return 2;
}
