// Paged decode attention: one query token per request against its cached K/V.
//
// Request b's keys sit in token slots req_to_token[req_pool_indices[b], 0:seq_lens[b]] of the
// pool k_buf/v_buf [S, K, D] (page size 1: the req_to_token row is the page table). Query head h
// reads kv head h / (H / K) (GQA). A block serves one request, one kv head, up to GMAX of the
// query heads that share it (so K/V are read once for the group) and one split of the sequence:
// with few requests the sequence is cut into `num_splits` pieces whose partial softmaxes are
// merged by a second kernel through their log-sum-exp (split-KV, "flash-decoding").
//
// Inside a block, a "token group" of TPT = D / VEC lanes owns one key at a time (VEC elements
// per lane, one 16-byte load), keeps an online softmax (running max m, sum l, accumulator) per
// query head, and the groups are merged through shared memory at the end.
#include "common.cuh"

#include <type_traits>

namespace astrai {

constexpr int kDecodeWarps = 4;
constexpr int kDecodeGroupMax = 8;  // most query heads per block
constexpr int kDecodeUnroll = 4;    // keys per token group in flight (raw 16-byte registers)

// GM: query heads per block (1, 2, 4 or 8), the GQA group size rounded up to a power of two.
template <typename T, int D, int GM>
__global__ void __launch_bounds__(kDecodeWarps * 32) paged_decode_kernel(
    const T* __restrict__ q, const T* __restrict__ k_buf, const T* __restrict__ v_buf,
    const int* __restrict__ req_to_token, const int* __restrict__ req_pool_indices,
    const int* __restrict__ seq_lens, T* __restrict__ out, float* __restrict__ part_o,
    float* __restrict__ part_lse, int H, int K, int num_splits, int64_t q_sb, int64_t q_sh,
    int64_t kv_ss, int64_t kv_sh, int64_t r2t_stride, float scale) {
  constexpr int VEC = Vec16<T>::n;
  constexpr int TPT = D / VEC;               // lanes per key
  constexpr int TPW = 32 / TPT;              // keys per warp per step
  constexpr int NTG = kDecodeWarps * TPW;    // token groups per block
  constexpr int G = GM;
  static_assert(D % VEC == 0 && TPT <= 32 && 32 % TPT == 0, "unsupported head dim");

  __shared__ float s_m[NTG][G];
  __shared__ float s_l[NTG][G];
  __shared__ float s_acc[NTG][G][D];

  const int b = blockIdx.x;
  const int group = H / K;
  const int chunks = ceil_div(group, G);
  const int kh = blockIdx.y / chunks;
  const int h0 = kh * group + (blockIdx.y % chunks) * G;
  const int gcount = min(G, kh * group + group - h0);
  const int split = blockIdx.z;

  const int lane = threadIdx.x % 32;
  const int tg = (threadIdx.x / 32) * TPW + lane / TPT;
  const int d0 = (lane % TPT) * VEC;

  float qv[G][VEC];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (g < gcount) {
      load16(q + b * q_sb + (h0 + g) * q_sh + d0, qv[g]);
#pragma unroll
      for (int i = 0; i < VEC; ++i) qv[g][i] *= scale;
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) qv[g][i] = 0.f;
    }
  }

  const int len = seq_lens[b];
  const int* slots = req_to_token + int64_t(req_pool_indices[b]) * r2t_stride;
  const int chunk = ceil_div(len, num_splits);
  const int start = split * chunk;
  const int end = min(len, start + chunk);

  float m[G], l[G], acc[G][VEC];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[g][i] = 0.f;
  }

  const T* kbase = k_buf + kh * kv_sh + d0;
  const T* vbase = v_buf + kh * kv_sh + d0;
  // The loop bounds are uniform over the block, so every lane reaches every shuffle.
  for (int base = start; base < end; base += NTG * kDecodeUnroll) {
    int slot[kDecodeUnroll];
    bool ok[kDecodeUnroll];
#pragma unroll
    for (int u = 0; u < kDecodeUnroll; ++u) {
      int t = base + u * NTG + tg;
      ok[u] = t < end;
      slot[u] = ok[u] ? slots[t] : 0;
    }
    // Issue every load of the U keys before using any (memory-level parallelism); the raw
    // 16-byte words cost the same registers as widening two keys would.
    uint4 kraw[kDecodeUnroll], vraw[kDecodeUnroll];
#pragma unroll
    for (int u = 0; u < kDecodeUnroll; ++u) {
      kraw[u] = vraw[u] = make_uint4(0, 0, 0, 0);
      if (ok[u]) {
        kraw[u] = *reinterpret_cast<const uint4*>(kbase + int64_t(slot[u]) * kv_ss);
        vraw[u] = *reinterpret_cast<const uint4*>(vbase + int64_t(slot[u]) * kv_ss);
      }
    }
#pragma unroll
    for (int u = 0; u < kDecodeUnroll; ++u) {
      float kv[VEC], vv[VEC];
      widen16<T>(kraw[u], kv);
      widen16<T>(vraw[u], vv);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < VEC; ++i) s += qv[g][i] * kv[i];
        s = group_sum<TPT>(s);
        if (ok[u] && g < gcount) {
          float m_new = fmaxf(m[g], s);
          float alpha = ASTRAI_EXP(m[g] - m_new);  // exp(-inf) = 0 on the first key
          float p = ASTRAI_EXP(s - m_new);
          l[g] = l[g] * alpha + p;
#pragma unroll
          for (int i = 0; i < VEC; ++i) acc[g][i] = acc[g][i] * alpha + p * vv[i];
          m[g] = m_new;
        }
      }
    }
  }

#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (d0 == 0) {
      s_m[tg][g] = m[g];
      s_l[tg][g] = l[g];
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i) s_acc[tg][g][d0 + i] = acc[g][i];
  }
  __syncthreads();

  for (int o = threadIdx.x; o < gcount * D; o += blockDim.x) {
    const int g = o / D, d = o % D;
    float mx = -INFINITY;
    for (int j = 0; j < NTG; ++j) mx = fmaxf(mx, s_m[j][g]);
    float L = 0.f, O = 0.f;
    if (mx != -INFINITY) {
      for (int j = 0; j < NTG; ++j) {
        if (s_m[j][g] == -INFINITY) continue;
        float w = ASTRAI_EXP(s_m[j][g] - mx);
        L += w * s_l[j][g];
        O += w * s_acc[j][g][d];
      }
    }
    const int h = h0 + g;
    const float val = L > 0.f ? O / L : 0.f;
    if (num_splits == 1) {
      out[(int64_t(b) * H + h) * D + d] = from_float<T>(val);
    } else {
      const int64_t row = (int64_t(b) * H + h) * num_splits + split;
      part_o[row * D + d] = val;
      if (d == 0) part_lse[row] = L > 0.f ? mx + ASTRAI_LOG(L) : -INFINITY;
    }
  }
}

// Merge the splits of one (request, head): out = sum_s exp(lse_s - M) o_s / sum_s exp(lse_s - M).
template <typename T, int D>
__global__ void __launch_bounds__(D) decode_combine_kernel(
    const float* __restrict__ part_o, const float* __restrict__ part_lse, T* __restrict__ out,
    int num_splits) {
  const int64_t row = blockIdx.x;  // b * H + h
  const int d = threadIdx.x;
  const float* lse = part_lse + row * num_splits;
  float mx = -INFINITY;
  for (int s = 0; s < num_splits; ++s) mx = fmaxf(mx, lse[s]);
  float L = 0.f, O = 0.f;
  if (mx != -INFINITY) {
    for (int s = 0; s < num_splits; ++s) {
      if (lse[s] == -INFINITY) continue;
      float w = ASTRAI_EXP(lse[s] - mx);
      L += w;
      O += w * part_o[(row * num_splits + s) * D + d];
    }
  }
  out[row * D + d] = from_float<T>(L > 0.f ? O / L : 0.f);
}

template <typename T, int D, int GM>
int paged_decode_launch(const void* q, const void* k_buf, const void* v_buf,
                        const int* req_to_token, const int* req_pool_indices, const int* seq_lens,
                        void* out, float* part_o, float* part_lse, int B, int H, int K,
                        int num_splits, int64_t q_sb, int64_t q_sh, int64_t kv_ss, int64_t kv_sh,
                        int64_t r2t_stride, float scale, cudaStream_t stream) {
  if (B == 0) return 0;
  const int chunks = ceil_div(H / K, GM);
  dim3 grid(B, K * chunks, num_splits), block(kDecodeWarps * 32);
  auto kernel = &paged_decode_kernel<T, D, GM>;
  ASTRAI_LAUNCH(kernel, grid, block, 0, stream, static_cast<const T*>(q),
                static_cast<const T*>(k_buf), static_cast<const T*>(v_buf), req_to_token,
                req_pool_indices, seq_lens, static_cast<T*>(out), part_o, part_lse, H, K,
                num_splits, q_sb, q_sh, kv_ss, kv_sh, r2t_stride, scale);
  int err = int(cudaGetLastError());
  if (err != 0 || num_splits == 1) return err;
  auto combine = &decode_combine_kernel<T, D>;
  ASTRAI_LAUNCH(combine, dim3(B * H), dim3(D), 0, stream, part_o, part_lse, static_cast<T*>(out),
                num_splits);
  return int(cudaGetLastError());
}

template <typename T, int GM>
int paged_decode_dispatch_d(int D, const void* q, const void* k_buf, const void* v_buf,
                            const int* r2t, const int* rpi, const int* lens, void* out,
                            float* part_o, float* part_lse, int B, int H, int K, int num_splits,
                            int64_t q_sb, int64_t q_sh, int64_t kv_ss, int64_t kv_sh,
                            int64_t r2t_stride, float scale, cudaStream_t stream) {
#define ASTRAI_DECODE_CASE(DIM)                                                                   \
  case DIM:                                                                                       \
    return paged_decode_launch<T, DIM, GM>(q, k_buf, v_buf, r2t, rpi, lens, out, part_o, part_lse, B, \
                                       H, K, num_splits, q_sb, q_sh, kv_ss, kv_sh, r2t_stride,    \
                                       scale, stream);
  switch (D) {
    ASTRAI_DECODE_CASE(32)
    ASTRAI_DECODE_CASE(64)
    ASTRAI_DECODE_CASE(128)
  }
#undef ASTRAI_DECODE_CASE
  return -1;
}

template <typename T>
int paged_decode_dispatch(int D, const void* q, const void* k_buf, const void* v_buf,
                          const int* r2t, const int* rpi, const int* lens, void* out,
                          float* part_o, float* part_lse, int B, int H, int K, int num_splits,
                          int64_t q_sb, int64_t q_sh, int64_t kv_ss, int64_t kv_sh,
                          int64_t r2t_stride, float scale, cudaStream_t stream) {
  const int group = H / K;
  auto run = [&](auto gm) {
    return paged_decode_dispatch_d<T, decltype(gm)::value>(
        D, q, k_buf, v_buf, r2t, rpi, lens, out, part_o, part_lse, B, H, K, num_splits, q_sb,
        q_sh, kv_ss, kv_sh, r2t_stride, scale, stream);
  };
  if (group == 1) return run(std::integral_constant<int, 1>());
  if (group == 2) return run(std::integral_constant<int, 2>());
  if (group <= 4) return run(std::integral_constant<int, 4>());
  return run(std::integral_constant<int, kDecodeGroupMax>());
}

}  // namespace astrai

// q [B, H, D] (strides q_sb, q_sh; last dim contiguous); k_buf/v_buf [S, K, D] (strides kv_ss,
// kv_sh); req_to_token [R, r2t_stride] int32; out [B, H, D] contiguous. With num_splits > 1,
// part_o [B, H, num_splits, D] and part_lse [B, H, num_splits] are fp32 workspaces.
// Returns a cudaError_t code (0 = launched); -1 = unsupported dtype or head dim.
extern "C" int astrai_paged_decode(const void* q, const void* k_buf, const void* v_buf, int dtype,
                                   const int* req_to_token, const int* req_pool_indices,
                                   const int* seq_lens, void* out, float* part_o, float* part_lse,
                                   int B, int H, int K, int D, int num_splits, int64_t q_sb,
                                   int64_t q_sh, int64_t kv_ss, int64_t kv_sh, int64_t r2t_stride,
                                   float scale, cudaStream_t stream) {
  using namespace astrai;
  if (K <= 0 || H % K != 0 || num_splits < 1) return -1;
  switch (dtype) {
    case kFloat32:
      return paged_decode_dispatch<float>(D, q, k_buf, v_buf, req_to_token, req_pool_indices,
                                            seq_lens, out, part_o, part_lse, B, H, K, num_splits,
                                            q_sb, q_sh, kv_ss, kv_sh, r2t_stride, scale, stream);
    case kFloat16:
      return paged_decode_dispatch<__half>(D, q, k_buf, v_buf, req_to_token, req_pool_indices,
                                             seq_lens, out, part_o, part_lse, B, H, K, num_splits,
                                             q_sb, q_sh, kv_ss, kv_sh, r2t_stride, scale, stream);
    case kBFloat16:
      return paged_decode_dispatch<__nv_bfloat16>(
          D, q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens, out, part_o, part_lse, B,
          H, K, num_splits, q_sb, q_sh, kv_ss, kv_sh, r2t_stride, scale, stream);
  }
  return -1;
}
