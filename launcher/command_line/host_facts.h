// Facts about this machine that option parsing needs (core counts, a free port), kept behind a
// struct so the parser stays pure and tests can supply their own.
#pragma once

#include <functional>
#include <string>

namespace cpprun::launcher {

struct HostFacts {
  int cpu_count = 1;  // the CPUs this process may run on (its affinity mask), as torch._utils.cpu_count()
  int gpu_count = 0;
  // Called for --standalone and a one-node job without --master_port. Returns a TCP port that was
  // free on 127.0.0.1 a moment ago.
  std::function<int()> pick_free_port;
  std::string hostname;  // gethostname(): ${hostname} of --log_line_prefix_template
  // A fresh run id for a one-node job without --master_port (torchrun's uuid4).
  std::function<std::string()> random_run_id;
};

// Reads the real machine: the CPUs this process may run on, visible NVIDIA GPUs, and the real free-port picker.
HostFacts probe_host();

// Binds 127.0.0.1:0, reads the port the kernel chose, closes the socket. Throws std::system_error.
int pick_free_port();

// A random version-4 UUID ("1b4e28ba-2fa1-4d2f-883f-0016d3cca427") from /dev/urandom, as torchrun's
// uuid.uuid4() run ids. Throws std::system_error.
std::string random_uuid4();

// GPUs a CUDA program would see: the /dev/nvidiaN nodes, narrowed by CUDA_VISIBLE_DEVICES as
// torch.cuda.device_count() (torchrun's --nproc_per_node=gpu) reads it before CUDA starts
// (torch/cuda/__init__.py: _parse_visible_devices, _device_count_nvml). Ordinals: each entry's
// leading [+-]digits, as strtoul; the list stops at an entry without any or a negative one, a
// repeated ordinal hides every GPU, and the list is cut at the first ordinal past the last GPU
// ("4,5" on a 4-GPU node: none). UUIDs (GPU-..., MIG-...): the list stops at the first entry
// without that prefix, a repeated one hides every GPU. Null means unset.
int count_visible_gpus(int device_nodes, const char* cuda_visible_devices);

}  // namespace cpprun::launcher
