// Probing the host for --nproc_per_node=auto|cpu|gpu and --standalone.
#include "command_line/host_facts.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstdint>
#include <filesystem>
#include <system_error>
#include <vector>

namespace cpprun::launcher {
namespace {

int count_nvidia_device_nodes() {
  // /dev/nvidia0, /dev/nvidia1, ...; not nvidiactl, nvidia-uvm, nvidia-caps.
  std::error_code no_dev;
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/dev", no_dev)) {
    const std::string name = entry.path().filename().string();
    count += name.size() > 6 && name.compare(0, 6, "nvidia") == 0 &&
             std::all_of(name.begin() + 6, name.end(), [](unsigned char c) { return std::isdigit(c); });
  }
  return count;
}

// torch._utils.cpu_count(), which torchrun's --nproc_per_node=cpu|auto counts: the CPUs this process
// may run on (sched_getaffinity: taskset, a cgroup cpuset such as Slurm's --cpus-per-task or docker's
// --cpuset-cpus), not the machine's. Online CPUs only if the mask cannot be read, as os.cpu_count().
// The mask grows until the kernel's fits (EINVAL: more than 1024 CPUs), as Python's does.
int count_usable_cpus() {
  for (int cpus = 1024; cpus <= (1 << 20); cpus *= 2) {
    cpu_set_t* mask = CPU_ALLOC(cpus);
    if (mask == nullptr) break;
    const std::size_t size = CPU_ALLOC_SIZE(cpus);
    CPU_ZERO_S(size, mask);
    const bool read = sched_getaffinity(0, size, mask) == 0;
    const int err = errno;
    const int count = read ? CPU_COUNT_S(size, mask) : 0;
    CPU_FREE(mask);
    if (read) return std::max(1, count);
    if (err != EINVAL) break;
  }
  return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
}

}  // namespace

int count_visible_gpus(int device_nodes, const char* cuda_visible_devices) {
  if (cuda_visible_devices == nullptr) return device_nodes;
  const std::string list = cuda_visible_devices;
  std::vector<std::string> entries;  // every piece between commas, empty ones too, as str.split(",")
  for (std::size_t start = 0;;) {
    const std::size_t comma = list.find(',', start);
    entries.push_back(list.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  for (const char* prefix : {"GPU-", "MIG-"}) {
    if (list.rfind(prefix, 0) != 0) continue;
    std::vector<std::string> uuids;
    for (const std::string& entry : entries) {
      if (std::find(uuids.begin(), uuids.end(), entry) != uuids.end()) return 0;
      if (entry.rfind(prefix, 0) != 0) break;
      uuids.push_back(entry);
    }
    return std::min(static_cast<int>(uuids.size()), device_nodes);  // which GPUs they name takes NVML
  }
  std::vector<std::string> ordinals;  // the digits without leading zeros: any length, as Python's int
  for (const std::string& entry : entries) {
    const auto first = entry.find_first_not_of(" \t\n\r\v\f");
    const std::string text = first == std::string::npos ? "" : entry.substr(first);
    const std::size_t sign = !text.empty() && (text[0] == '+' || text[0] == '-') ? 1 : 0;
    std::size_t end = sign;
    while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end])) != 0) ++end;
    if (end == sign) break;  // no number: _strtoul's -1
    const std::size_t nonzero = text.find_first_not_of('0', sign);
    const std::string digits = nonzero >= end ? "0" : text.substr(nonzero, end - nonzero);
    if (text[0] == '-' && digits != "0") break;  // (a negative one is never a repeat)
    if (std::find(ordinals.begin(), ordinals.end(), digits) != ordinals.end()) return 0;
    ordinals.push_back(digits);
  }
  const auto past = std::find_if(ordinals.begin(), ordinals.end(), [&](const std::string& o) {
    return o.size() > 9 || std::stol(o) >= device_nodes;
  });
  return static_cast<int>(past - ordinals.begin());
}

int pick_free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "socket() for --standalone");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    close(fd);
    throw std::system_error(err, std::generic_category(), "binding 127.0.0.1:0 for --standalone");
  }
  close(fd);
  return ntohs(addr.sin_port);
}

std::string random_uuid4() {
  std::uint8_t bytes[16];
  const int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  const bool read_all = fd >= 0 && read(fd, bytes, sizeof(bytes)) == static_cast<ssize_t>(sizeof(bytes));
  const int err = errno;
  if (fd >= 0) close(fd);
  if (!read_all) throw std::system_error(err, std::generic_category(), "reading /dev/urandom for a run id");
  bytes[6] = static_cast<std::uint8_t>((bytes[6] & 0x0f) | 0x40);  // version 4
  bytes[8] = static_cast<std::uint8_t>((bytes[8] & 0x3f) | 0x80);  // RFC 4122 variant
  static const char kHex[] = "0123456789abcdef";
  std::string text;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) text += '-';
    text += kHex[bytes[i] >> 4];
    text += kHex[bytes[i] & 0xf];
  }
  return text;
}

HostFacts probe_host() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) name[0] = '\0';
  return {count_usable_cpus(), count_visible_gpus(count_nvidia_device_nodes(), std::getenv("CUDA_VISIBLE_DEVICES")), pick_free_port,
          name, random_uuid4};
}

}  // namespace cpprun::launcher
