// Shared helpers for astrai's CUDA kernels: element types, vector loads, warp reductions.
//
// The kernels are plain CUDA C++ (no torch headers: the CPU torch wheel lacks the generated
// c10 CUDA headers, see issue 10) with `extern "C"` launchers over raw pointers and a stream.
// Compiled with -DASTRAI_EMU by a host C++ compiler, the same sources run on the CPU under
// csrc/emu/cuda_emu.h, which is how CI checks the kernels' indexing and math without a GPU.
#pragma once

#ifdef ASTRAI_EMU
#include "emu/cuda_emu.h"
#else
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>
#define ASTRAI_DYNAMIC_SMEM(type, name) extern __shared__ __align__(128) unsigned char name##_raw[]; \
  type* name = reinterpret_cast<type*>(name##_raw)
#define ASTRAI_EXP(x) __expf(x)
#define ASTRAI_LOG(x) __logf(x)
#define ASTRAI_LAUNCH(kernel, grid, block, smem, stream, ...) \
  kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#endif

#include <cstdint>
#include <cstring>
#include <math.h>

namespace astrai {

// Element-type codes shared with astrai/kernels/_lib.py.
enum DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}

// Elements of T in one 16-byte access.
template <typename T> struct Vec16 { static constexpr int n = 16 / sizeof(T); };

// Load 16 bytes (VEC = 16 / sizeof(T) elements) and widen to fp32. `p` must be 16-byte aligned.
template <typename T>
__device__ __forceinline__ void load16(const T* __restrict__ p, float (&out)[Vec16<T>::n]) {
  constexpr int V = Vec16<T>::n;
  uint4 raw = *reinterpret_cast<const uint4*>(p);
  T e[V];
  memcpy(e, &raw, sizeof(raw));  // register moves; no aliasing assumptions
#pragma unroll
  for (int i = 0; i < V; ++i) out[i] = to_float(e[i]);
}

// Widen 16 raw bytes (already in registers) to fp32.
template <typename T>
__device__ __forceinline__ void widen16(const uint4& raw, float (&out)[Vec16<T>::n]) {
  T e[Vec16<T>::n];
  memcpy(e, &raw, sizeof(raw));
#pragma unroll
  for (int i = 0; i < Vec16<T>::n; ++i) out[i] = to_float(e[i]);
}

// Butterfly sum over aligned groups of WIDTH lanes (a power of two <= 32); every lane of the
// warp must call it (full mask), each gets its group's sum.
template <int WIDTH>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = WIDTH / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__host__ __device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

}  // namespace astrai
