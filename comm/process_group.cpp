// init_process_group(): store, join check, backend groups, and the default group.
#include <ATen/Context.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#ifdef CPPRUN_WITH_NCCL
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <sstream>
#include <vector>

#include "comm/backends.h"
#include "comm/consistency_check.h"
#include "comm/flight_recorder.h"
#include "comm/group_impl.h"
#include "comm/rank_join.h"
#include "comm/store_address.h"
#include "cpprun/launcher_contract.h"
#include "cpprun/store_port.h"

namespace cpprun {
namespace {

using Millis = std::chrono::milliseconds;

std::string seconds(Millis t) {
  std::ostringstream out;
  out << static_cast<double>(t.count()) / 1000.0 << " s";
  return out.str();
}

std::string where(const DistEnv& env) {
  return "MASTER_ADDR=" + env.master_addr + " MASTER_PORT=" + std::to_string(env.master_port);
}

// Rank 0 starts the store's server at MASTER_ADDR:MASTER_PORT (unless the launcher hosts it);
// the others connect to it. MASTER_ADDR is resolved first, so that a name that does not resolve
// fails at once instead of after the timeout. In a job on one host the server listens on the
// loopback only (c10d's own listens on every interface): see store_address.h. Errors from c10d
// are turned into ones that say what to do.
c10::intrusive_ptr<c10d::Store> connect_store(const DistEnv& env, Millis timeout) {
  if (env.world_size == 1 && env.source == EnvSource::kSingleProcess) {
    return c10::make_intrusive<c10d::HashStore>();  // a world of one: no server, no port
  }
  const std::vector<std::string> resolved = detail::resolve_master(env);
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(env.master_port);
  opts.isServer = env.rank == 0 && !env.agent_hosts_store;
  opts.numWorkers = env.world_size;
  opts.waitWorkers = false;  // the join check below waits, and names who is missing
  opts.timeout = timeout;
  if (opts.isServer) {
    if (auto loopback = detail::store_loopback_address(env, resolved)) {
      // LibTorch 2.15's libuv store server takes over a socket we bound (uv_tcp_open).
      opts.masterListenFd = detail::listen_on(*loopback, env.master_port, env);
    }
  }
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, opts);
    if (!env.agent_hosts_store) return store;  // rank 0's own store: new with every attempt
    // A launcher's store that outlived the workers' restarts must not show an attempt the last one's
    // keys (its joined ranks, Gloo's addresses): older torchrun kept one store for the job, and
    // its env:// put each attempt under this prefix; 2.15's agent opens a new store per attempt,
    // where the prefix changes nothing.
    return c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_" + std::to_string(env.restart_count), store);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    if (opts.isServer && reports_port_in_use(what)) {
      detail::throw_port_in_use(env, "c10d said: " + what);
    }
    TORCH_CHECK(opts.isServer, "cpprun: rank ", env.rank,
                " could not reach the rendezvous store at ", where(env), " within ",
                seconds(timeout), ". Is rank 0 running, and is MASTER_ADDR an address of rank "
                "0's host that this host can reach? (MASTER_ADDR/MASTER_PORT are set by cpprun "
                "or torchrun; the wait is ProcessGroupOptions::timeout.)\nc10d said: ", what);
    TORCH_CHECK(false, "cpprun: rank 0 could not start the rendezvous store at ", where(env),
                ": ", what);
  }
}

// Gloo must listen on an interface the other ranks reach: GLOO_SOCKET_IFNAME when given, the
// loopback when the job is on this host, else the address the host name resolves to. Under
// cpprun's store tunnel MASTER_ADDR is the loopback on every node, which then says nothing of
// where the other ranks are (their agents set GLOO_SOCKET_IFNAME when they can tell).
std::shared_ptr<::gloo::transport::Device> gloo_device(const DistEnv& env) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  const std::string& addr = env.master_addr;
  const char* tunnelled = std::getenv(contract::kStoreTunnelVariable);
  const bool local = (tunnelled == nullptr || std::string(tunnelled) != "1") &&
                     (addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1");
  if (local || env.world_size == env.local_world_size) {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

#ifdef CPPRUN_WITH_NCCL
constexpr bool kNcclBuilt = true;
#else
constexpr bool kNcclBuilt = false;
#endif

int visible_gpus() { return at::hasCUDA() ? static_cast<int>(at::getNumGPUs()) : 0; }

// A rank has a GPU of its own when its node has one for every local rank: NCCL refuses two ranks
// on one GPU. This is the rank's vote; the job uses GPUs only when every rank votes yes
// (Note [One device choice per job]).
bool gpu_for_every_local_rank(const DistEnv& env) {
  return visible_gpus() > 0 && visible_gpus() >= env.local_world_size;
}

std::string too_few_gpus(const DistEnv& env) {
  return std::to_string(env.local_world_size) + " ranks on this node (LOCAL_WORLD_SIZE) but " +
         std::to_string(visible_gpus()) + " GPU(s) visible, and NCCL needs one GPU per rank";
}

// Note [LibTorch's flight-recorder variables]
// LibTorch's process groups read TORCH_FR_BUFFER_SIZE (else TORCH_NCCL_TRACE_BUFFER_SIZE) by
// std::stoi inside their constructors: given "abc" or a number past int's range, Gloo's
// constructor threw between starting its threads and returning, and the process hung with no
// timeout or aborted ("terminate called without an active exception"; an audit, 2026-12-07;
// torchrun's workers alike). So the values are read here first, as LibTorch would, and refused
// naming the variable.
void check_libtorch_trace_variables() {
  for (const char* name : {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}) {
    const char* value = std::getenv(name);
    if (value == nullptr) continue;
    bool whole = false;  // as LibTorch reads it: std::stoi, which ignores what follows a number
    try {
      (void)std::stoi(value);
      whole = true;
    } catch (const std::exception&) {
    }
    TORCH_CHECK(whole, "cpprun: ", name, " is \"", value, "\", which LibTorch's process group cannot read: it takes a "
                "whole number of flight-recorder entries (default 2000) and, given anything else, its constructor "
                "hangs or aborts. Set a whole number, or unset it.");
  }
}

}  // namespace

c10::intrusive_ptr<detail::C10dGroup> detail::make_gloo(const c10::intrusive_ptr<c10d::Store>& store,
                                                        const DistEnv& env, int rank, int size, Millis timeout) {
  check_libtorch_trace_variables();
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  opts->devices.push_back(gloo_device(env));
  opts->threads = 2;  // as torch.distributed: enough to overlap two collectives
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("gloo", store);
  return c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, opts);
}

// Note [Members wait for each other after connecting]
// Gloo's constructor returns on a member once its own side of every pair is connected, which can
// be before a peer has finished its side: a member that then exited at once (the last test of a
// binary creating a subgroup) closed the connection under the peer's handshake, and the peer failed
// with Gloo's "Connection closed by peer" (dist.comm.detail.np2, once in a full run, 2026-12-06).
// So the members wait for each other through the store before the group is used: each counts
// itself in, and the last one in says so; one round trip to the store per member and group.
// PyTorch has the same wait (_store_based_barrier) but makes it only with
// TORCH_DIST_INIT_BARRIER=1, off by default since 2023 for its cost at scale (there every rank of
// the world joins each new_group's, members or not); cpprun always makes it, members only. With
// TORCH_GLOO_LAZY_INIT=1 Gloo connects at the first collective instead, and this wait no longer
// covers the handshake.
void detail::wait_for_every_member(c10d::Store& store, int size, Millis timeout, const std::string& what) {
  if (size <= 1) return;
  const std::string counted = "cpprun_connected";
  if (store.add(counted, 1) == size) store.set("cpprun_all_connected", std::vector<uint8_t>{1});
  try {
    store.wait({"cpprun_all_connected"}, timeout);
  } catch (const c10::DistStoreError& e) {
    int64_t arrived = -1;
    try {
      arrived = store.add(counted, 0);
    } catch (const c10::Error&) {
    }
    TORCH_CHECK(false, "cpprun: ", what, ": ", arrived < 0 ? std::string("not all") : std::to_string(arrived),
                " of the group's ", size, " ranks finished connecting within its timeout (", seconds(timeout),
                "); the others failed or are stuck before it (the launcher names a rank that failed). The store "
                "said: ", e.what_without_backtrace());
  }
}

c10::intrusive_ptr<detail::C10dGroup> detail::make_nccl(const c10::intrusive_ptr<c10d::Store>& store,
                                                        const DistEnv& env, int rank, int size, Millis timeout) {
#ifdef CPPRUN_WITH_NCCL
  // NCCL binds each rank to the GPU that is current when it first communicates.
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(env.local_rank));
  check_libtorch_trace_variables();
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("nccl", store);
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, rank, size, opts);
#else
  (void)store, (void)env, (void)rank, (void)size, (void)timeout;
  TORCH_INTERNAL_ASSERT(false, "make_nccl called in a build without NCCL");
#endif
}

namespace {

// Backend::kNccl fails here, on the rank that cannot use it, before it joins the others.
void check_nccl_possible(const DistEnv& env) {
#ifndef CPPRUN_WITH_NCCL
  TORCH_CHECK(false, "cpprun: backend nccl was asked for, but cpprun was built against a "
              "LibTorch without CUDA/NCCL. Use Backend::kGloo (or kAuto), or rebuild cpprun "
              "against a CUDA LibTorch (see docs/development.md, 'Which LibTorch').");
#endif
  TORCH_CHECK(visible_gpus() > 0, "cpprun: backend nccl was asked for, but no GPU is visible to "
              "this process (check CUDA_VISIBLE_DEVICES and the driver). Use Backend::kGloo.");
  TORCH_CHECK(gpu_for_every_local_rank(env), "cpprun: backend nccl was asked for, but there are ",
              too_few_gpus(env), ". Launch --nproc_per_node=", visible_gpus(), ", or use Backend::kGloo.");
}

// kAuto follows the job-wide vote, so that every rank picks the same backend.
Backend resolve_backend(Backend asked, const DistEnv& env, bool every_rank_has_gpu) {
  if (asked != Backend::kAuto) return asked;
  if (kNcclBuilt && visible_gpus() > 0 && env.local_rank == 0) {
    if (!gpu_for_every_local_rank(env)) {
      std::cerr << "cpprun: " << too_few_gpus(env) << ": every rank uses the CPU and Gloo. Launch "
                   "--nproc_per_node=" << visible_gpus() << " to train on the GPUs, or set "
                   "CUDA_VISIBLE_DEVICES= to hide them and silence this.\n";
    } else if (!every_rank_has_gpu) {
      std::cerr << "cpprun: this node has a GPU for each of its ranks, but another node does not: every "
                   "rank uses the CPU and Gloo, as one job must use one backend.\n";
    }
  }
  return kNcclBuilt && every_rank_has_gpu ? Backend::kNccl : Backend::kGloo;
}

// The default group, as torch.distributed's WORLD.
std::mutex default_mutex;
std::optional<ProcessGroup> default_pg;
bool default_pg_has_gpus = false;  // the default group's job-wide vote, for local_device()
int groups_created = 0;  // names each group's keys in the store; same order on every rank

}  // namespace

ProcessGroup::ProcessGroup(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {
  TORCH_INTERNAL_ASSERT(impl_ != nullptr);
}
int ProcessGroup::rank() const { return impl_->env.rank; }
int ProcessGroup::size() const { return impl_->env.world_size; }
Backend ProcessGroup::backend() const { return impl_->backend; }
const DistEnv& ProcessGroup::env() const { return impl_->env; }
std::chrono::milliseconds ProcessGroup::timeout() const { return impl_->timeout; }
bool ProcessGroup::is_member() const { return impl_->member; }

std::chrono::milliseconds default_timeout(Backend backend) {
  return backend == Backend::kNccl ? std::chrono::minutes(10) : std::chrono::minutes(30);
}

ProcessGroup init_process_group(const ProcessGroupOptions& given) {
  ProcessGroupOptions options = given;
  if (!options.timeout) options.timeout = default_timeout(options.backend);
  TORCH_CHECK(options.timeout->count() > 0, "cpprun: ProcessGroupOptions::timeout must be "
              "positive, got ", options.timeout->count(), " ms.");
  {
    // As torch.distributed ("trying to initialize the default process group twice!"): a second
    // call would join the job again as another world group, which the default group's users
    // (the wrappers, the sampler, default_group()) would not see.
    std::lock_guard<std::mutex> lock(default_mutex);
    TORCH_CHECK(!default_pg, "cpprun: init_process_group() was called while the default group exists (PyTorch "
                "refuses this too: \"trying to initialize the default process group twice\"). Use "
                "cpprun::default_group() for it, cpprun::new_group(ranks) for another group of the job, or "
                "call cpprun::destroy_process_group() first.");
  }
  auto impl = std::make_shared<detail::GroupImpl>();
  impl->env = options.env ? *options.env : read_dist_env();
  impl->timeout = *options.timeout;
  if (options.backend == Backend::kNccl) check_nccl_possible(impl->env);
  impl->debug_level = options.debug_level ? *options.debug_level : read_debug_level();
  impl->check_collectives = detail::read_check_collectives(process_env());
  const DistEnv& env = impl->env;
  detail::start_flight_recorder(env);  // bad CPPRUN_FLIGHT_RECORDER_* values fail here

  if (env.source == EnvSource::kSingleProcess && env.rank == 0) {
    std::cerr << "cpprun: no RANK/WORLD_SIZE in the environment; running as a single process "
                 "(world size 1). Use `cpprun --nproc_per_node=N` for more.\n";
  }
  int group_index;
  {
    std::lock_guard<std::mutex> lock(default_mutex);
    group_index = groups_created++;
  }
  impl->recorded = detail::recorded_world_group(group_index, env.world_size);
  auto root = connect_store(env, *options.timeout);
  impl->store = c10::make_intrusive<c10d::PrefixStore>("cpprun/" + std::to_string(group_index), root);
  const detail::JoinResult joined =
      detail::join_ranks(*impl->store, env, *options.timeout, gpu_for_every_local_rank(env));
  impl->backend = resolve_backend(options.backend, env, joined.every_rank_has_gpu);

  impl->gloo = detail::make_gloo(impl->store, env, env.rank, env.world_size, *options.timeout);
  if (impl->backend == Backend::kNccl) {
    impl->nccl = detail::make_nccl(impl->store, env, env.rank, env.world_size, *options.timeout);
  }
  detail::wait_for_every_member(*impl->store, env.world_size, *options.timeout, "init_process_group");
  ProcessGroup group = detail::GroupAccess::make(std::move(impl));
  std::lock_guard<std::mutex> lock(default_mutex);
  TORCH_CHECK(!default_pg, "cpprun: init_process_group() ran on two threads at once; call it once.");
  default_pg = group;
  default_pg_has_gpus = joined.every_rank_has_gpu;
  return group;
}

bool is_initialized() {
  std::lock_guard<std::mutex> lock(default_mutex);
  return default_pg.has_value();
}

ProcessGroup default_group() {
  std::lock_guard<std::mutex> lock(default_mutex);
  TORCH_CHECK(default_pg, "cpprun: no process group yet; call cpprun::init_process_group() first.");
  return *default_pg;
}

void destroy_process_group() {
  std::lock_guard<std::mutex> lock(default_mutex);
  default_pg.reset();
}

int rank() { return is_initialized() ? default_group().rank() : read_dist_env().rank; }
int world_size() { return is_initialized() ? default_group().size() : read_dist_env().world_size; }
int local_rank() {
  return is_initialized() ? default_group().env().local_rank : read_dist_env().local_rank;
}

c10::Device local_device() {
  std::optional<bool> job_has_gpus;
  {
    std::lock_guard<std::mutex> lock(default_mutex);
    if (default_pg) job_has_gpus = default_pg_has_gpus;
  }
  const DistEnv env = job_has_gpus ? default_group().env() : read_dist_env();
  if (job_has_gpus ? *job_has_gpus : gpu_for_every_local_rank(env)) {
    return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(env.local_rank));
  }
  return c10::Device(c10::DeviceType::CPU);
}

const char* to_string(Backend backend) {
  switch (backend) {
    case Backend::kAuto: return "auto";
    case Backend::kGloo: return "gloo";
    case Backend::kNccl: return "nccl";
  }
  return "?";
}

}  // namespace cpprun
