// Probing the host for --nproc_per_node=auto|cpu|gpu and --standalone.
#include "command_line/host_facts.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <system_error>

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

}  // namespace

int count_visible_gpus(int device_nodes, const char* cuda_visible_devices) {
  if (cuda_visible_devices == nullptr) return device_nodes;
  int listed = 0;
  std::istringstream list(cuda_visible_devices);
  for (std::string entry; std::getline(list, entry, ',') && !entry.empty() && entry[0] != '-';) ++listed;
  return std::min(listed, device_nodes);
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

HostFacts probe_host() {
  return {static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN))),
          count_visible_gpus(count_nvidia_device_nodes(), std::getenv("CUDA_VISIBLE_DEVICES")), pick_free_port};
}

}  // namespace cpprun::launcher
