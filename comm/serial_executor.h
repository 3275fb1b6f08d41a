// Runs tasks one at a time on a thread of its own, in the order they were submitted. Our own
// multi-step collectives (the ring reduce-scatter) run here, so that async calls return at once
// and, being issued in the same order on every rank, also execute in the same order.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <utility>

namespace cpprun::detail {

class SerialExecutor {
 public:
  SerialExecutor() = default;
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  ~SerialExecutor() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

  std::shared_future<void> submit(std::function<void()> fn) {
    // The future shares the task's state, the callable included. So the task runs the callable
    // out of a holder it empties first: what the callable captured (e.g. the tensors a
    // collective reads) goes as soon as it has run, not when the last Work waiting on it does.
    auto holder = std::make_shared<std::function<void()>>(std::move(fn));
    std::packaged_task<void()> task([holder] {
      std::function<void()> run = std::exchange(*holder, nullptr);
      run();
    });
    std::shared_future<void> done = task.get_future().share();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(task));
      if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });  // lazily: most groups never need it
    }
    wake_.notify_one();
    return done;
  }

 private:
  void loop() {
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and everything submitted has run
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();  // an exception is stored in the task's future
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace cpprun::detail
