// Host emulation of the small slice of CUDA that astrai's kernels use, for CPU tests.
//
// Compile a .cu with a host C++20 compiler and -DASTRAI_EMU: every block of a launch runs in
// turn, each of its threads as a std::thread, so barriers, warp shuffles, shared memory and
// WMMA tiles behave as the CUDA programming guide specifies them (a WMMA fragment here holds
// the whole tile in every lane: its element order is opaque on the GPU too, so kernels may only
// map over it uniformly or pair it with another fragment of the same type). This checks the
// kernels' indexing, masking and numerics on any machine; it says nothing about speed or about
// races the scheduling here happens not to expose.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <vector_types.h>

#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

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

struct Block {
  explicit Block(int nthreads, size_t smem)
      : bar(nthreads), smem(smem + 128), xchg((nthreads + 31) / 32 * 32) {
    for (int w = 0; w < (nthreads + 31) / 32; ++w) {
      int n = nthreads - 32 * w < 32 ? nthreads - 32 * w : 32;
      warps.emplace_back(std::make_unique<std::barrier<>>(n));
    }
  }
  std::barrier<> bar;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<unsigned char> smem;
  std::vector<double> xchg;  // one 8-byte slot per thread for shuffles
};

inline thread_local Block* block = nullptr;
inline thread_local int linear_tid = 0;

inline void* dynamic_smem() {
  auto p = reinterpret_cast<std::uintptr_t>(block->smem.data());
  return reinterpret_cast<void*>((p + 127) & ~std::uintptr_t(127));
}

}  // namespace astrai_emu

using std::max;
using std::min;

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

inline void __syncthreads() { astrai_emu::block->bar.arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) {
  astrai_emu::block->warps[astrai_emu::linear_tid / 32]->arrive_and_wait();
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

#define ASTRAI_DYNAMIC_SMEM(type, name) type* name = static_cast<type*>(astrai_emu::dynamic_smem())
#define ASTRAI_EXP(x) expf(x)
#define ASTRAI_LOG(x) logf(x)

namespace astrai_emu {

template <class F> void launch(dim3 grid, dim3 blk, size_t smem, F f) {
  int n = int(blk.x * blk.y * blk.z);
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        Block b(n, smem);
        std::vector<std::thread> threads;
        threads.reserve(n);
        for (int t = 0; t < n; ++t) {
          threads.emplace_back([&, t] {
            block = &b;
            linear_tid = t;
            threadIdx = uint3{unsigned(t) % blk.x, unsigned(t) / blk.x % blk.y,
                              unsigned(t) / (blk.x * blk.y)};
            blockIdx = uint3{bx, by, bz};
            blockDim = blk;
            gridDim = grid;
            f();
            // A returned thread no longer holds back its block's or warp's barriers.
            b.warps[t / 32]->arrive_and_drop();
            b.bar.arrive_and_drop();
          });
        }
        for (auto& th : threads) th.join();
      }
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
