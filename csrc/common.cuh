// Shared helpers for astrai's CUDA kernels: element types, vector loads, warp reductions.
//
// The kernels are plain CUDA C++ (no torch headers: the CPU torch wheel lacks the generated
// c10 CUDA headers) with `extern "C"` launchers over raw pointers and a stream.
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

// Two 16-bit elements in one 32-bit register, the first in the low half (PTX's .f16x2 order).
template <typename T>
__device__ __forceinline__ uint32_t pack2(T lo, T hi) {
  static_assert(sizeof(T) == 2, "pack2 takes 16-bit elements");
  uint16_t a, b;
  memcpy(&a, &lo, 2);
  memcpy(&b, &hi, 2);
  return uint32_t(a) | (uint32_t(b) << 16);
}

// D (16x8, fp32) += A (16x16) B (16x8) on the tensor cores, fp16 or bf16 inputs: PTX
// mma.sync.m16n8k16.row.col. With g = lane / 4 and t = lane % 4 (PTX ISA, "Matrix Fragments
// for mma.m16n8k16"): a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..], a[2] = A[g][2t+8..],
// a[3] = A[g+8][2t+8..]; b[0] = B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g];
// d[0..1] = D[g][2t..2t+1], d[2..3] = D[g+8][2t..2t+1].
#ifndef ASTRAI_EMU
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4],
                                          const uint32_t (&b)[2]);
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4],
                                                  const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                         const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

}  // namespace astrai
