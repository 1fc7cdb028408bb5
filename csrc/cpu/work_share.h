// Work sharing that survives a descheduled thread: the parallel loop of the decode kernels.
//
// at::parallel_for (OpenMP) hands each thread a fixed share and waits for every thread at the
// end of the region. When another process wants a core, the OS deschedules one of ours for a
// time slice (milliseconds) and the others idle at the barrier, at every product of every
// layer: decode fell to 0.07-0.13x of its idle speed beside one CPU-bound process (2 cores).
// Here a loop is cut into pieces, and each thread (the calling thread is one) owns a run of
// consecutive pieces, its home range, which it takes front to back; a thread whose range is
// empty takes pieces from the back of the others'. A thread the OS has not run yet finds its
// range taken by whoever ran. The caller waits only for a piece a descheduled thread has
// already claimed (one piece, not a share), and yields its core meanwhile so that thread can
// finish it. A home range is one sequential stream of a product's weights, which the hardware
// prefetchers follow across its pieces; pieces handed out one at a time from one counter
// interleaved the threads piece by piece, every piece a new stream (AMD EPYC Zen 4, 125m, one
// request, engine tg128, interleaved rounds over three processes a build: home ranges 1.24x
// the steps per second for int4, 1.10x int8, 1.03x bf16; fp32, at the read bandwidth's floor,
// 1.01x; docs/kernels.md).
//
// Idle workers spin briefly for the next loop (a decode step's loops are microseconds apart),
// yielding their core after the first microseconds, then sleep on a condition variable: they
// never hold a core the caller or another process needs. The pool has at::get_num_threads() - 1
// workers (--threads / torch.set_num_threads), made on first use and again after a fork (the
// child has no threads).
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
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace work_share {

// One home range's state in one 64-bit word: the loop's number (16 bits) and the range's
// unclaimed pieces [front, back) (24 bits each). A claim is a compare-and-swap of the whole
// word, so a thread that read an earlier loop's word can never claim a piece of the next one.
inline uint64_t pack(uint64_t loop, uint64_t front, uint64_t back) {
  return (loop << 48) | (front << 24) | back;
}
inline uint64_t loop_of(uint64_t s) { return s >> 48; }
inline uint64_t front_of(uint64_t s) { return (s >> 24) & 0xFFFFFF; }
inline uint64_t back_of(uint64_t s) { return s & 0xFFFFFF; }
constexpr int64_t kMaxPieces = (1 << 24) - 1;

// Home range r of `parts` over n pieces: [r * n / parts, (r + 1) * n / parts).
inline int64_t range_start(int64_t n, int r, int parts) { return n * r / parts; }

// An idle worker waits for the next loop with kPauses pauses (~50 µs on an AMD EPYC Zen 4: a
// decode step's loops come sooner), then kYields calls to sched_yield (~0.2 ms where nothing
// else wants the core, about the engine's Python between two steps), then sleeps. Yielding
// rather than pausing gives the core to a thread that wants it: with one busy process beside
// a 2-core decode (three threads for two cores) it is often the caller, whose step waits.
// 125m int8, one request, engine tg128, 2 processes a build, interleaved: beside a busy
// process 1.56x the tokens per second of 20,000 pauses; alone 1.04x.
constexpr int kPauses = 2000, kYields = 450;

class Pool {
 public:
  explicit Pool(int workers) : ranges_(new Range[workers + 1]), parts_(workers + 1) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this, i] { work(i); });
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
    for (int r = 0; r < parts_; ++r)
      ranges_[r].word.store(pack(loop_, range_start(n, r, parts_), range_start(n, r + 1, parts_)),
                            std::memory_order_relaxed);
    state_.store(loop_, std::memory_order_seq_cst);  // the ranges are out before the loop
    if (sleeping_.load(std::memory_order_seq_cst) > 0) {
      { std::lock_guard<std::mutex> lk(mu_); }
      cv_.notify_all();
    }
    claim(loop_, parts_ - 1);
    for (int spins = 0; done_.load(std::memory_order_acquire) < n; ++spins) {
      if (spins < 2000) _mm_pause();
      else sched_yield();  // a descheduled worker holds a piece: let it have this core
    }
  }

 private:
  struct alignas(64) Range {  // a line each: the owner's claims do not bounce between cores
    std::atomic<uint64_t> word{0};
  };

  // The next piece of range r in loop `loop` (its front for the owner, else its back), or -1
  // when the range is empty or the loop is over.
  int64_t take(int r, uint64_t loop, bool owner) {
    std::atomic<uint64_t>& w = ranges_[r].word;
    uint64_t s = w.load(std::memory_order_acquire);
    while (loop_of(s) == loop && front_of(s) < back_of(s)) {
      const uint64_t next = owner ? pack(loop, front_of(s) + 1, back_of(s))
                                  : pack(loop, front_of(s), back_of(s) - 1);
      if (w.compare_exchange_weak(s, next, std::memory_order_acq_rel, std::memory_order_acquire))
        return static_cast<int64_t>(owner ? front_of(s) : back_of(s) - 1);
    }
    return -1;
  }

  // Run pieces of loop `loop`: home range `home` front to back, then the others' from their
  // backs, until none is left (or the loop is over).
  void claim(uint64_t loop, int home) {
    int64_t ran = 0;
    for (int64_t i; (i = take(home, loop, true)) >= 0; ++ran) (*fn_)(i);
    for (int k = 1; k < parts_; ++k)
      for (int64_t i; (i = take((home + k) % parts_, loop, false)) >= 0; ++ran) (*fn_)(i);
    if (ran) done_.fetch_add(ran, std::memory_order_acq_rel);  // the loop cannot end before
  }

  void work(int index) {
    uint64_t seen = 0;  // the last loop this worker took part in
    for (;;) {
      uint64_t s = state_.load(std::memory_order_acquire);
      for (int spins = 0; s == seen && spins < kPauses + kYields; ++spins) {
        if (spins < kPauses) _mm_pause();
        else sched_yield();  // a thread that wants this core (ours or not) gets it
        s = state_.load(std::memory_order_acquire);
      }
      if (s == seen) {
        std::unique_lock<std::mutex> lk(mu_);
        sleeping_.fetch_add(1, std::memory_order_seq_cst);
        cv_.wait(lk, [&] { return stop_ || state_.load(std::memory_order_seq_cst) != seen; });
        sleeping_.fetch_sub(1, std::memory_order_seq_cst);
        if (stop_) return;
        s = state_.load(std::memory_order_acquire);
      }
      seen = s;
      claim(seen, index);
    }
  }

  std::vector<std::thread> threads_;
  std::unique_ptr<Range[]> ranges_;
  const int parts_;                // home ranges: the workers' and the caller's (the last)
  std::atomic<uint64_t> state_{0};  // the current loop's number
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
