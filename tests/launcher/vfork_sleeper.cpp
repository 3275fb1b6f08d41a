// A worker that puts itself in uninterruptible sleep (Linux D state) for SECONDS: it vfork()s, and the
// child sleeps before _exit(); until then the parent waits in the kernel's vfork wait, which /proc
// shows as D (TASK_KILLABLE: SIGKILL and an uncaught SIGTERM still end it). With TIMES, that many
// dwells, 0.3 s apart (state S between). Usage: SECONDS [EXIT_CODE [TIMES]].
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s SECONDS [EXIT_CODE [TIMES]]\n", argv[0]);
    return 2;
  }
  const double seconds = std::atof(argv[1]);
  const int code = argc > 2 ? std::atoi(argv[2]) : 0;
  // Prepared before vfork(): the child may only make system calls on the parent's stack.
  timespec pause{static_cast<time_t>(seconds), static_cast<long>((seconds - static_cast<time_t>(seconds)) * 1e9)};
  const int times = argc > 3 ? std::atoi(argv[3]) : 1;
  for (int i = 0; i < times; ++i) {
    if (i > 0) {
      const timespec gap{0, 300 * 1000 * 1000};
      nanosleep(&gap, nullptr);
    }
    const pid_t child = vfork();
    if (child == 0) {
      syscall(SYS_nanosleep, &pause, nullptr);
      _exit(0);
    }
    if (child < 0) {
      std::perror("vfork");
      return 2;
    }
    int status = 0;
    waitpid(child, &status, 0);
  }
  return code;
}
