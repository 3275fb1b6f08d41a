// init_process_group()'s failures: each is an error that says what to do, within the timeout,
// never a hang. Runs in a private network namespace (tests/run_isolated.sh) or on loopback.
#include "catch.h"
#include <c10/util/Exception.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "comm/backends.h"
#include "comm/store_address.h"
#include "cpprun/cpprun.h"

using namespace std::chrono_literals;

namespace {

// A listening loopback socket on a free port: the port is "taken" while this lives.
struct TakenPort {
  int fd = -1;
  int port = 0;
  TakenPort() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(fd, 4) == 0);
    socklen_t len = sizeof addr;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
  }
  ~TakenPort() { ::close(fd); }
};

// A loopback port with nothing listening on it.
int free_port() {
  TakenPort probe;
  return probe.port;
}

cpprun::ProcessGroupOptions options_for(int rank, int world, int port, std::chrono::milliseconds timeout) {
  cpprun::DistEnv env;
  env.source = cpprun::EnvSource::kTorchrun;
  env.rank = rank;
  env.world_size = world;
  env.local_rank = rank;
  env.local_world_size = world;
  env.master_addr = "127.0.0.1";
  env.master_port = port;
  cpprun::ProcessGroupOptions options;
  options.env = env;
  options.timeout = timeout;
  return options;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TEST_CASE("process group: a taken MASTER_PORT says so and how to pick another", "[process_group]") {
  TakenPort taken;
  CHECK_THROWS_WITH(cpprun::init_process_group(options_for(0, 2, taken.port, 5s)),
                    Catch::Contains("port " + std::to_string(taken.port) + " is already in use") &&
                        Catch::Contains("--master_port"));
}

TEST_CASE("process group: an unreachable master times out and says so", "[process_group]") {
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(cpprun::init_process_group(options_for(1, 2, free_port(), 2s)),
                    Catch::Contains("rank 1 could not reach the rendezvous store") &&
                        Catch::Contains("Is rank 0 running"));
  CHECK(seconds_since(start) < 30);
}

TEST_CASE("process group: a MASTER_ADDR that does not resolve fails at once, naming it", "[process_group]") {
  for (int rank : {0, 1}) {
    auto options = options_for(rank, 2, free_port(), 60s);
    options.env->master_addr = "nosuch.invalid";
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(cpprun::init_process_group(options),
                      Catch::Contains("MASTER_ADDR=\"nosuch.invalid\" does not resolve"));
    // Without the check, rank 1 retried until the 60 s timeout (rank 0 until the join check's).
    CHECK(seconds_since(start) < 30);
  }
}

TEST_CASE("process group: the store listens on the loopback only when the job is on one host",
          "[process_group]") {
  using cpprun::detail::store_loopback_address;
  cpprun::DistEnv env;
  env.world_size = 4;
  env.local_world_size = 4;
  env.master_addr = "127.0.0.1";
  CHECK(store_loopback_address(env, {"127.0.0.1"}) == "127.0.0.1");
  env.master_addr = "localhost";
  CHECK(store_loopback_address(env, {"::1", "127.0.0.1"}) == "127.0.0.1");
  env.master_addr = "::1";
  CHECK(store_loopback_address(env, {"::1"}) == "::1");
  env.master_addr = "myhost";  // Debian's /etc/hosts maps the host name to 127.0.1.1
  CHECK(store_loopback_address(env, {"127.0.1.1"}) == "127.0.1.1");
  env.local_world_size = 2;  // another node may resolve "myhost" to a routable address
  CHECK(store_loopback_address(env, {"127.0.1.1"}) == std::nullopt);
  env.master_addr = "10.1.2.3";
  CHECK(store_loopback_address(env, {"10.1.2.3"}) == std::nullopt);
  env.local_world_size = 4;
  CHECK(store_loopback_address(env, {"10.1.2.3"}) == std::nullopt);  // other hosts may join through it
}

TEST_CASE("process group: ranks that never arrive are named after the timeout", "[process_group]") {
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(cpprun::init_process_group(options_for(0, 3, free_port(), 2s)),
                    Catch::Contains("Ranks not joined: 1, 2"));
  CHECK(seconds_since(start) < 30);
}

TEST_CASE("process group: a world of one needs no launcher", "[process_group]") {
  cpprun::ProcessGroupOptions options;
  options.env = cpprun::DistEnv{};  // what read_dist_env() returns when nothing is set
  auto group = cpprun::init_process_group(options);
  CHECK(group.rank() == 0);
  CHECK(group.size() == 1);
  CHECK(group.backend() == cpprun::Backend::kGloo);
  auto t = at::arange(5, at::kFloat);
  cpprun::all_reduce(group, t, cpprun::ReduceOp::kAvg);
  CHECK(t.equal(at::arange(5, at::kFloat)));
  CHECK(cpprun::is_initialized());
  // A second call while it exists is refused, as PyTorch's, before joining anything.
  CHECK_THROWS_WITH(cpprun::init_process_group(options), Catch::Contains("destroy_process_group() first"));
  cpprun::destroy_process_group();
  CHECK_FALSE(cpprun::is_initialized());
  auto again = cpprun::init_process_group(options);  // after destroy_process_group, a new one
  CHECK(cpprun::default_group().size() == 1);
  cpprun::destroy_process_group();
}

// Without init_process_group(), DDP and FSDP given no group say what to do (PyTorch's: "Default
// process group has not been initialized"); SyncBatchNorm given none normalises this process's
// batch alone, as torch.nn.SyncBatchNorm does without torch.distributed.
TEST_CASE("process group: without one, the wrappers ask for it and SyncBatchNorm runs alone", "[process_group]") {
  REQUIRE_FALSE(cpprun::is_initialized());
  torch::nn::Linear linear(3, 2);
  const auto asks_for_it = Catch::Contains("call cpprun::init_process_group() first");
  CHECK_THROWS_WITH(cpprun::DistributedDataParallel(linear), asks_for_it);
  CHECK_THROWS_WITH(cpprun::FullyShardedDataParallel(linear), asks_for_it);

  const auto options = torch::nn::BatchNormOptions(4).momentum(0.3);
  cpprun::SyncBatchNorm sync(options);
  torch::nn::BatchNorm1d plain(options);
  sync->to(at::kDouble);
  plain->to(at::kDouble);
  at::manual_seed(3);
  const at::Tensor x = at::randn({6, 4}, at::kDouble) * 3 + 1;
  const at::Tensor weights = at::randn({6, 4}, at::kDouble);
  (sync(x) * weights).sum().backward();
  (plain(x) * weights).sum().backward();
  CHECK(at::allclose(sync->weight.grad(), plain->weight.grad(), 1e-12, 1e-12));
  CHECK(at::allclose(sync->bias.grad(), plain->bias.grad(), 1e-12, 1e-12));
  CHECK(at::allclose(sync->running_mean, plain->running_mean, 1e-12, 1e-12));
  CHECK(at::allclose(sync->running_var, plain->running_var, 1e-12, 1e-12));
}

// As torch.distributed's _get_default_timeout: NCCL's 10 minutes (default_pg_nccl_timeout), the
// others' 30; cpprun took 30 minutes with NCCL too.
TEST_CASE("process group: an unset timeout is PyTorch's default for the backend", "[process_group]") {
  CHECK(cpprun::default_timeout(cpprun::Backend::kNccl) == std::chrono::minutes(10));
  CHECK(cpprun::default_timeout(cpprun::Backend::kGloo) == std::chrono::minutes(30));
  CHECK(cpprun::default_timeout(cpprun::Backend::kAuto) == std::chrono::minutes(30));
  cpprun::ProcessGroupOptions options;
  options.env = cpprun::DistEnv{};
  CHECK_FALSE(options.timeout.has_value());
  auto group = cpprun::init_process_group(options);
  CHECK(group.timeout() == std::chrono::minutes(30));
  cpprun::destroy_process_group();
  options.timeout = std::chrono::seconds(90);
  CHECK(cpprun::init_process_group(options).timeout() == std::chrono::seconds(90));
  cpprun::destroy_process_group();
}

TEST_CASE("process group: a non-positive timeout is refused", "[process_group]") {
  cpprun::ProcessGroupOptions options;
  options.env = cpprun::DistEnv{};
  options.timeout = 0ms;
  CHECK_THROWS_WITH(cpprun::init_process_group(options), Catch::Contains("timeout must be positive"));
}

TEST_CASE("process group: nccl in a CPU-only build is a clear error", "[process_group]") {
  cpprun::ProcessGroupOptions options;
  options.env = cpprun::DistEnv{};
  options.backend = cpprun::Backend::kNccl;
  if (at::hasCUDA()) return;  // a CUDA build with a GPU may well create it
  CHECK_THROWS_WITH(cpprun::init_process_group(options), Catch::Contains("nccl"));
}

// Note [Members wait for each other after connecting] (comm/process_group.cpp): a group's members
// return from its creation together, and one that never counts itself in makes the others fail
// at the timeout, saying how many arrived and which call made the group.
TEST_CASE("process group: a new group's members wait for each other; one missing is a timeout that says so",
          "[process_group]") {
  {
    auto store = c10::make_intrusive<c10d::HashStore>();
    std::thread other([&] { cpprun::detail::wait_for_every_member(*store, 2, 10s, "new_group([0, 1])"); });
    cpprun::detail::wait_for_every_member(*store, 2, 10s, "new_group([0, 1])");
    other.join();
  }
  auto store = c10::make_intrusive<c10d::HashStore>();
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(cpprun::detail::wait_for_every_member(*store, 3, 300ms, "new_group([0, 1, 2])"),
                    Catch::Contains("cpprun: new_group([0, 1, 2]): 1 of the group's 3 ranks finished connecting") &&
                        Catch::Contains("0.3 s"));
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  cpprun::detail::wait_for_every_member(*store, 1, 300ms, "alone");  // a group of one waits for nobody
}
