// Work sharing that survives a descheduled thread: the parallel loop of the decode kernels.
//
// at::parallel_for (OpenMP) hands each thread a fixed share and waits for every thread at the
// end of the region. When another process wants a core, the OS deschedules one of ours for a
// time slice (milliseconds) and the others idle at the barrier, at every product of every
// layer: decode fell to 0.07-0.13x of its idle speed beside one CPU-bound process (2 cores).
// Here a loop is cut into pieces that any thread claims from one atomic counter; the calling
// thread claims pieces too and returns once every piece is done. A thread the OS has not run
// yet finds nothing left when it wakes: its share was taken by whoever ran. The caller waits
// only for a piece a descheduled thread has already claimed (one piece, not a share), and
// yields its core meanwhile so that thread can finish it.
//
// Idle workers spin briefly for the next loop (a decode step's loops are microseconds apart),
// then sleep on a condition variable: they never hold a core the caller or another process
// needs. The pool has at::get_num_threads() - 1 workers (--threads / torch.set_num_threads),
// made on first use and again after a fork (the child has no threads).
#pragma once

#include <ATen/Parallel.h>
#include <immintrin.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace work_share {

// One loop's state in one 64-bit word: the loop's number (16 bits), its piece count (24) and
// the next unclaimed piece (24). A claim is a compare-and-swap of the whole word, so a thread
// that read an earlier loop's word can never claim a piece of the next one.
inline uint64_t pack(uint64_t loop, uint64_t total, uint64_t next) {
  return (loop << 48) | (total << 24) | next;
}
inline uint64_t loop_of(uint64_t s) { return s >> 48; }
inline uint64_t total_of(uint64_t s) { return (s >> 24) & 0xFFFFFF; }
inline uint64_t next_of(uint64_t s) { return s & 0xFFFFFF; }
constexpr int64_t kMaxPieces = (1 << 24) - 1;

class Pool {
 public:
  explicit Pool(int workers) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { work(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  int workers() const { return static_cast<int>(threads_.size()); }

  // piece(i) for every i < n, on this thread and the workers; returns when all are done.
  void run(int64_t n, const std::function<void(int64_t)>& piece) {
    fn_ = &piece;
    done_.store(0, std::memory_order_relaxed);
    loop_ = (loop_ + 1) & 0xFFFF;
    state_.store(pack(loop_, static_cast<uint64_t>(n), 0), std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst) > 0) {
      { std::lock_guard<std::mutex> lk(mu_); }
      cv_.notify_all();
    }
    claim(loop_);
    for (int spins = 0; done_.load(std::memory_order_acquire) < n; ++spins) {
      if (spins < 2000) _mm_pause();
      else sched_yield();  // a descheduled worker holds a piece: let it have this core
    }
  }

 private:
  // Claim and run pieces of loop `loop` until none is left (or the loop is over).
  void claim(uint64_t loop) {
    uint64_t s = state_.load(std::memory_order_acquire);
    while (loop_of(s) == loop && next_of(s) < total_of(s)) {
      if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel,
                                        std::memory_order_acquire))
        continue;  // s now holds the current word
      (*fn_)(static_cast<int64_t>(next_of(s)));  // the loop cannot end before this piece
      done_.fetch_add(1, std::memory_order_acq_rel);
      s = state_.load(std::memory_order_acquire);
    }
  }

  void work() {
    uint64_t seen = 0;  // the last loop this worker took part in
    for (;;) {
      uint64_t s = state_.load(std::memory_order_acquire);
      for (int spins = 0; loop_of(s) == seen && spins < 20000; ++spins) {
        _mm_pause();  // ~100 µs: the next product of a decode step comes sooner
        s = state_.load(std::memory_order_acquire);
      }
      if (loop_of(s) == seen) {
        std::unique_lock<std::mutex> lk(mu_);
        sleeping_.fetch_add(1, std::memory_order_seq_cst);
        cv_.wait(lk, [&] {
          return stop_ || loop_of(state_.load(std::memory_order_seq_cst)) != seen;
        });
        sleeping_.fetch_sub(1, std::memory_order_seq_cst);
        if (stop_) return;
        s = state_.load(std::memory_order_acquire);
      }
      seen = loop_of(s);
      claim(seen);
    }
  }

  std::vector<std::thread> threads_;
  std::atomic<uint64_t> state_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<int> sleeping_{0};
  const std::function<void(int64_t)>* fn_ = nullptr;
  uint64_t loop_ = 0;  // written by the calling thread only
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

// The process's pool for `threads` threads in all (the caller is one), remade when the count
// changes or after a fork. One caller at a time: the engine's steps hold its lock.
// Never destroyed at exit (joining threads during static destruction can hang).
inline Pool* pool_for(int threads) {
  static Pool* pool = nullptr;
  static pid_t owner = 0;
  const pid_t pid = getpid();
  if (owner != pid) {  // a forked child inherits the object but none of its threads: leave it
    pool = nullptr;
    owner = pid;
  }
  if (pool == nullptr || pool->workers() != threads - 1) {
    delete pool;
    pool = new Pool(threads - 1);
  }
  return pool;
}

// body(p0, p1) over [0, n), shared by at::get_num_threads() threads in pieces of at least
// `grain` (up to PIECES_PER_THREAD per thread, so a thread that runs late finds others' work
// to take); inline on one thread or one piece.
constexpr int64_t PIECES_PER_THREAD = 8;

template <typename Body>
inline void parallel(int64_t n, int64_t grain, const Body& body) {
  if (n <= 0) return;
  const int threads = at::get_num_threads();
  const int64_t most = std::min<int64_t>(kMaxPieces, PIECES_PER_THREAD * threads);
  const int64_t pieces = std::min<int64_t>((n + std::max<int64_t>(1, grain) - 1) /
                                               std::max<int64_t>(1, grain), most);
  grain = (n + pieces - 1) / pieces;
  const int64_t used = (n + grain - 1) / grain;  // 33 in 16 pieces of 3 fill 11: none empty
  if (threads <= 1 || used <= 1 || at::in_parallel_region()) {
    body(0, n);
    return;
  }
  static std::mutex one_caller;  // two engines stepping at once take turns here
  std::lock_guard<std::mutex> lk(one_caller);
  const std::function<void(int64_t)> piece = [&](int64_t i) {
    body(i * grain, std::min(n, (i + 1) * grain));
  };
  pool_for(threads)->run(used, piece);
}

}  // namespace work_share
