// Fused rotary position embedding, in place on x [N, heads, D] (rotate-half pairing: element i
// pairs with i + D/2, the HF Llama layout of astrai/model/rope.py `apply_rope`):
//   x1' = x1 cos - x2 sin,  x2' = x2 cos + x1 sin,  cos/sin = table[positions[n], i].
// One thread per (token, head, pair); the arithmetic is fp32, rounded once to x's dtype.
#include "common.cuh"

namespace astrai {

template <typename T>
__global__ void __launch_bounds__(256) rotary_kernel(
    T* __restrict__ x, const int64_t* __restrict__ positions, const float* __restrict__ cos_t,
    const float* __restrict__ sin_t, int64_t n_tokens, int heads, int half, int64_t stride_n,
    int64_t stride_h, int64_t table_stride) {
  int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t total = n_tokens * heads * half;
  if (idx >= total) return;
  int i = int(idx % half);
  int64_t row = idx / half;  // token * heads + head
  int h = int(row % heads);
  int64_t n = row / heads;
  int64_t pos = positions[n];
  float c = cos_t[pos * table_stride + i];
  float s = sin_t[pos * table_stride + i];
  T* p = x + n * stride_n + int64_t(h) * stride_h;
  float x1 = to_float(p[i]);
  float x2 = to_float(p[i + half]);
  p[i] = from_float<T>(x1 * c - x2 * s);
  p[i + half] = from_float<T>(x2 * c + x1 * s);
}

template <typename T>
int rotary_launch(void* x, const int64_t* positions, const float* cos_t, const float* sin_t,
                  int64_t n_tokens, int heads, int head_dim, int64_t stride_n, int64_t stride_h,
                  int64_t table_stride, cudaStream_t stream) {
  int half = head_dim / 2;
  int64_t total = n_tokens * heads * half;
  if (total == 0) return 0;
  dim3 grid(unsigned((total + 255) / 256)), block(256);
  auto kernel = &rotary_kernel<T>;
  ASTRAI_LAUNCH(kernel, grid, block, 0, stream, static_cast<T*>(x), positions, cos_t, sin_t,
                n_tokens, heads, half, stride_n, stride_h, table_stride);
  return int(cudaGetLastError());
}

}  // namespace astrai

// Returns a cudaError_t code (0 = launched); -1 = unsupported dtype.
extern "C" int astrai_rotary(void* x, int dtype, const int64_t* positions, const float* cos_t,
                             const float* sin_t, int64_t n_tokens, int heads, int head_dim,
                             int64_t stride_n, int64_t stride_h, int64_t table_stride,
                             cudaStream_t stream) {
  using namespace astrai;
  switch (dtype) {
    case kFloat32:
      return rotary_launch<float>(x, positions, cos_t, sin_t, n_tokens, heads, head_dim, stride_n,
                                  stride_h, table_stride, stream);
    case kFloat16:
      return rotary_launch<__half>(x, positions, cos_t, sin_t, n_tokens, heads, head_dim,
                                   stride_n, stride_h, table_stride, stream);
    case kBFloat16:
      return rotary_launch<__nv_bfloat16>(x, positions, cos_t, sin_t, n_tokens, heads, head_dim,
                                          stride_n, stride_h, table_stride, stream);
  }
  return -1;
}

extern "C" const char* astrai_error_string(int code) {
  return code < 0 ? "unsupported dtype or head dim" : cudaGetErrorString(cudaError_t(code));
}
