// Host emulation of the small slice of CUDA that astrai's kernels use, for CPU tests.
//
// Compile a .cu with a host C++20 compiler and -DASTRAI_EMU: every block of a launch runs in
// turn, each of its threads as a fiber (ucontext) on the calling OS thread, switched
// round-robin at every barrier, so barriers, warp shuffles, shared memory and WMMA tiles
// behave as the CUDA programming guide specifies them (a WMMA fragment here holds
// the whole tile in every lane: its element order is opaque on the GPU too, so kernels may only
// map over it uniformly or pair it with another fragment of the same type). This checks the
// kernels' indexing, masking and numerics on any machine; it says nothing about speed or about
// races the scheduling here happens not to expose.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <vector_types.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <memory>
#include <functional>
#include <type_traits>
#include <vector>

#include <ucontext.h>

#undef __host__
#undef __device__
#undef __global__
#undef __shared__
#undef __forceinline__
#undef __launch_bounds__
#undef __align__
#define __host__
#define __device__
#define __global__
#define __shared__ static
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

// cuda_fp16.h brings the runtime's types (cudaStream_t, cudaError_t); its functions would need
// libcudart, so the few the launchers call are replaced here.
namespace astrai_emu {
inline cudaError_t get_last_error() { return cudaSuccess; }
inline const char* error_string(cudaError_t) { return "no error (host emulation)"; }
template <class F> inline cudaError_t func_set_attribute(F, cudaFuncAttribute, int) {
  return cudaSuccess;
}
}  // namespace astrai_emu
#define cudaGetLastError astrai_emu::get_last_error
#define cudaGetErrorString astrai_emu::error_string
#define cudaFuncSetAttribute astrai_emu::func_set_attribute

namespace astrai_emu {

// One block's threads as fibers. Only one runs at a time, so no locks: a thread waiting at
// a barrier yields to the scheduler until the barrier's generation moves on.
struct Barrier {
  int count = 0, gen = 0, alive = 0;
};

struct Block {
  int n = 0;
  std::vector<ucontext_t> ctx;
  std::vector<char> done;
  ucontext_t sched;
  Barrier bar;
  std::vector<Barrier> warps;
  std::vector<unsigned char> smem;
  std::vector<double> xchg;  // one 8-byte slot per thread for shuffles
  std::vector<uint32_t> mma_regs;  // 6 registers per thread for warp-wide mma
  const std::function<void()>* body = nullptr;
};

inline thread_local Block* block = nullptr;
inline thread_local int linear_tid = 0;

inline void* dynamic_smem() {
  auto p = reinterpret_cast<std::uintptr_t>(block->smem.data());
  return reinterpret_cast<void*>((p + 127) & ~std::uintptr_t(127));
}

inline void yield() { swapcontext(&block->ctx[linear_tid], &block->sched); }

inline void arrive_and_wait(Barrier& b) {
  const int gen = b.gen;
  if (++b.count == b.alive) {  // the last to arrive releases the others
    b.count = 0;
    ++b.gen;
    return;
  }
  while (b.gen == gen) yield();
}

// A returned thread no longer holds back its block's or warp's barriers.
inline void drop(Barrier& b) {
  --b.alive;
  if (b.count > 0 && b.count == b.alive) {
    b.count = 0;
    ++b.gen;
  }
}

}  // namespace astrai_emu

using std::max;
using std::min;

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

inline void __syncthreads() { astrai_emu::arrive_and_wait(astrai_emu::block->bar); }
inline void __syncwarp(unsigned = 0xffffffffu) {
  astrai_emu::arrive_and_wait(astrai_emu::block->warps[astrai_emu::linear_tid / 32]);
}

template <class T> inline T astrai_emu_exchange(T v, int src_lane) {
  static_assert(sizeof(T) <= sizeof(double), "shuffle of a value wider than 8 bytes");
  auto* b = astrai_emu::block;
  int w = astrai_emu::linear_tid / 32, lane = astrai_emu::linear_tid % 32;
  std::memcpy(&b->xchg[32 * w + lane], &v, sizeof(T));
  __syncwarp();
  T r;
  std::memcpy(&r, &b->xchg[32 * w + src_lane], sizeof(T));
  __syncwarp();
  return r;
}
template <class T> inline T __shfl_xor_sync(unsigned, T v, int mask, int = 32) {
  return astrai_emu_exchange(v, (astrai_emu::linear_tid % 32) ^ mask);
}
template <class T> inline T __shfl_sync(unsigned, T v, int src, int = 32) {
  return astrai_emu_exchange(v, src);
}

inline float nvcuda_emu_elem(__half v) { return __half2float(v); }
inline float nvcuda_emu_elem(__nv_bfloat16 v) { return __bfloat162float(v); }

// mma.sync.m16n8k16 (row.col, fp32 accumulate) as the PTX ISA lays out its fragments: every
// lane posts its A and B registers, then rebuilds the rows and columns of its own outputs.
template <typename T>
inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  auto* blk = astrai_emu::block;
  const int w = astrai_emu::linear_tid / 32, lane = astrai_emu::linear_tid % 32;
  uint32_t* regs = blk->mma_regs.data() + size_t(w) * 32 * 6;
  for (int i = 0; i < 4; ++i) regs[lane * 6 + i] = a[i];
  regs[lane * 6 + 4] = b[0];
  regs[lane * 6 + 5] = b[1];
  __syncwarp();
  auto half_of = [](uint32_t r, int hi) {
    T v;
    uint16_t bits = uint16_t(hi ? r >> 16 : r & 0xffffu);
    std::memcpy(&v, &bits, 2);
    return nvcuda_emu_elem(v);
  };
  auto A = [&](int r, int k) {  // A[r][k], 16 x 16
    int owner = (r % 8) * 4 + (k % 8) / 2;
    int reg = (r < 8 ? 0 : 1) + (k < 8 ? 0 : 2);
    return half_of(regs[owner * 6 + reg], k % 2);
  };
  auto Bm = [&](int k, int n) {  // B[k][n], 16 x 8
    int owner = n * 4 + (k % 8) / 2;
    return half_of(regs[owner * 6 + 4 + (k < 8 ? 0 : 1)], k % 2);
  };
  const int g = lane / 4, t = lane % 4;
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int r = g + (e < 2 ? 0 : 8), c = 2 * t + (e % 2);
    float acc = d[e];
    for (int k = 0; k < 16; ++k) acc += A(r, k) * Bm(k, c);
    out[e] = acc;
  }
  __syncwarp();
  for (int e = 0; e < 4; ++e) d[e] = out[e];
}

#define ASTRAI_DYNAMIC_SMEM(type, name) type* name = static_cast<type*>(astrai_emu::dynamic_smem())
#define ASTRAI_EXP(x) expf(x)
#define ASTRAI_LOG(x) logf(x)

namespace astrai_emu {

inline void fiber_entry() {
  Block* b = block;
  (*b->body)();
  b->done[linear_tid] = 1;
  drop(b->warps[linear_tid / 32]);
  drop(b->bar);
}  // returns to b->sched through uc_link

inline void launch(dim3 grid, dim3 blk, size_t smem_bytes, const std::function<void()>& body) {
  constexpr size_t kStack = 256 * 1024;
  const int n = int(blk.x * blk.y * blk.z);
  std::vector<char> stacks(size_t(n) * kStack);
  Block* saved = block;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        Block b;
        b.n = n;
        b.ctx.resize(n);
        b.done.assign(n, 0);
        b.bar.alive = n;
        b.warps.resize((n + 31) / 32);
        for (int w = 0; w < int(b.warps.size()); ++w) b.warps[w].alive = min(32, n - 32 * w);
        b.smem.assign(smem_bytes + 128, 0);
        b.xchg.assign(b.warps.size() * 32, 0.0);
        b.mma_regs.assign(b.warps.size() * 32 * 6, 0u);
        b.body = &body;
        block = &b;
        for (int t = 0; t < n; ++t) {
          getcontext(&b.ctx[t]);
          b.ctx[t].uc_stack.ss_sp = stacks.data() + size_t(t) * kStack;
          b.ctx[t].uc_stack.ss_size = kStack;
          b.ctx[t].uc_link = &b.sched;
          makecontext(&b.ctx[t], fiber_entry, 0);
        }
        blockIdx = uint3{bx, by, bz};
        blockDim = blk;
        gridDim = grid;
        for (int left = n; left > 0;) {
          left = 0;
          for (int t = 0; t < n; ++t) {
            if (b.done[t]) continue;
            linear_tid = t;
            threadIdx = uint3{unsigned(t) % blk.x, unsigned(t) / blk.x % blk.y,
                              unsigned(t) / (blk.x * blk.y)};
            swapcontext(&b.sched, &b.ctx[t]);
            left += !b.done[t];
          }
        }
      }
  block = saved;
}

}  // namespace astrai_emu

#define ASTRAI_LAUNCH(kernel, grid, block_, smem, stream, ...) \
  ((void)(stream), astrai_emu::launch((grid), (block_), (smem), [=] { kernel(__VA_ARGS__); }))

// ---- WMMA (nvcuda::wmma) on 16x16x16 tiles: each lane holds the whole tile -------------------
namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K> struct tile_shape;
template <int M, int N, int K> struct tile_shape<matrix_a, M, N, K> { static constexpr int r = M, c = K; };
template <int M, int N, int K> struct tile_shape<matrix_b, M, N, K> { static constexpr int r = K, c = N; };
template <int M, int N, int K> struct tile_shape<accumulator, M, N, K> { static constexpr int r = M, c = N; };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static constexpr int rows = tile_shape<Use, M, N, K>::r, cols = tile_shape<Use, M, N, K>::c;
  static constexpr int num_elements = rows * cols;
  float x[num_elements];  // row-major tile, values already rounded to T
};

inline float elem(float v) { return v; }
inline float elem(__half v) { return __half2float(v); }
inline float elem(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class Use, int M, int N, int K, class T, class Layout, class P>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const P* p, unsigned ldm) {
  using F = fragment<Use, M, N, K, T, Layout>;
  constexpr bool col = std::is_same<Layout, col_major>::value;
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c)
      f.x[r * F::cols + c] = elem(col ? p[c * ldm + r] : p[r * ldm + c]);
}

template <int M, int N, int K>
void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm,
                      layout_t l) {
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c)
      f.x[r * N + c] = l == mem_col_major ? p[c * ldm + r] : p[r * ldm + c];
}

template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm,
                       layout_t l) {
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) (l == mem_col_major ? p[c * ldm + r] : p[r * ldm + c]) = f.x[r * N + c];
}

template <class Use, int M, int N, int K, class T, class Layout, class V>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, V v) {
  for (int i = 0; i < fragment<Use, M, N, K, T, Layout>::num_elements; ++i) f.x[i] = elem(v);
}

template <int M, int N, int K, class T, class LA, class LB>
void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, T, LA>& a,
              const fragment<matrix_b, M, N, K, T, LB>& b,
              const fragment<accumulator, M, N, K, float>& c) {
  float out[M * N];
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      float s = c.x[m * N + n];
      for (int k = 0; k < K; ++k) s += a.x[m * K + k] * b.x[k * N + n];
      out[m * N + n] = s;
    }
  std::memcpy(d.x, out, sizeof(out));
}

}  // namespace wmma
}  // namespace nvcuda
