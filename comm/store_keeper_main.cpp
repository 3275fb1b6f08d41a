// cpprun-store-keeper: serves the workers' c10d store -- LibTorch's own TCPStore server, its libuv
// backend -- on a listening socket that cpprun's agent bound and handed down as a descriptor, so that
// the agent, which links no LibTorch, hosts the store as torchrun's agent does. cpprun starts one per
// round and stops it (launcher/workers/store_keeper.h); it serves until its standard input ends,
// which is when cpprun closes its end or dies. Note [Store keeper] in launcher/workers/store_keeper_plan.h.
//   usage: cpprun-store-keeper --listen-fd=FD --host=ADDRESS --port=PORT
// ADDRESS:PORT is where the socket is bound (a loopback address), which TCPStore's server reaches
// itself at. Its log reaches cpprun's console through comm/store_keeper_log.h's relay. One file
// with c10d's TCPStore header alone (not torch.h), linked with libtorch_cpu and
// c10 alone (nothing of CUDA), so that it serves within a fraction of a second.
#include <sys/socket.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>

#include "comm/store_keeper_log.h"

namespace {

constexpr const char* kUsage =
    "usage: cpprun-store-keeper --listen-fd=FD --host=ADDRESS --port=PORT (started by cpprun)";

// The value of `--name=VALUE` in `arg`, if it is that option.
bool option(const std::string& arg, const std::string& name, std::string& value) {
  const std::string prefix = "--" + name + "=";
  if (arg.rfind(prefix, 0) != 0) return false;
  value = arg.substr(prefix.size());
  return true;
}

int whole_number(const std::string& text, const char* what) {
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || value < 0 || value > 65535) {
    std::cerr << "cpprun-store-keeper: --" << what << "=" << text << " is not a whole number from 0 to 65535; "
              << kUsage << "\n";
    std::exit(2);
  }
  return static_cast<int>(value);
}

}  // namespace

int main(int argc, char** argv) {
  std::string fd_text, host, port_text;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    std::string value;
    if (option(arg, "listen-fd", value)) {
      fd_text = value;
    } else if (option(arg, "host", value)) {
      host = value;
    } else if (option(arg, "port", value)) {
      port_text = value;
    } else {
      std::cerr << "cpprun-store-keeper: unknown argument '" << arg << "'; " << kUsage << "\n";
      return 2;
    }
  }
  if (fd_text.empty() || host.empty() || port_text.empty()) {
    std::cerr << "cpprun-store-keeper: " << kUsage << "\n";
    return 2;
  }
  const int fd = whole_number(fd_text, "listen-fd");
  const int port = whole_number(port_text, "port");
  int listening = 0;
  socklen_t size = sizeof(listening);
  errno = 0;
  if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &size) != 0 || listening == 0) {
    std::cerr << "cpprun-store-keeper: descriptor " << fd << " is not a listening socket"
              << (errno != 0 ? std::string(" (") + std::strerror(errno) + ")" : std::string()) << "; " << kUsage
              << "\n";
    return 2;
  }
  // A worker that goes away while the server writes to it must not end the store for the others.
  std::signal(SIGPIPE, SIG_IGN);
  cpprun::keeper::relay_stderr();  // Note [The keeper's log never stops the store]
  try {
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(port);
    options.isServer = true;
    options.waitWorkers = false;  // the workers count themselves in (torch's env://, cpprun's join check)
    options.masterListenFd = fd;  // LibTorch's libuv server takes the socket over
    options.useLibUV = true;
    const auto store = c10::make_intrusive<c10d::TCPStore>(host, options);
    char bytes[256];
    for (;;) {
      const ssize_t got = read(STDIN_FILENO, bytes, sizeof(bytes));
      if (got > 0 || (got < 0 && errno == EINTR)) continue;
      break;  // EOF: cpprun closed its end, or is gone
    }
  } catch (const std::exception& e) {
    std::cerr << "cpprun-store-keeper: cannot serve the workers' store on descriptor " << fd << " (" << host << ":"
              << port << "): " << e.what() << "\n";
    cpprun::keeper::finish_relay();
    return 1;
  }
  std::_Exit(0);  // the store holds nothing worth a tidy shutdown
}
