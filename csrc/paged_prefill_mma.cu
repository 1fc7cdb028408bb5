// Ragged paged prefill attention, register-resident variant (FlashAttention-2 layout).
//
// Same contract, tiling and job mapping as paged_prefill.cu (64 query rows of one request and
// one head per block, 4 warps of 16 rows, keys streamed in gathered tiles of 64), but the
// tensor-core work is PTX mma.sync.m16n8k16 with documented fragment layouts, so S stays in
// registers: its accumulator fragments are masked, exponentiated and re-packed as the A operand
// of P V in place (the C fragment of two adjacent 8-column tiles is exactly an A fragment), and
// O is rescaled row by row in registers. Each quad of lanes (lane / 4) shares two rows, so the
// softmax reductions are two shuffles. No S/P/O round trips through shared memory.
#include "common.cuh"

namespace astrai {

constexpr int kMmaBQ = 64;
constexpr int kMmaBK = 64;
constexpr int kMmaWarps = kMmaBQ / 16;

template <int D> struct MmaSmem {
  static constexpr int LD = D + 8;  // row stride (elements): 16-byte rows, fewer bank conflicts
  static constexpr size_t tile = (size_t(kMmaBK) * LD * 2 + 127) / 128 * 128;
  static constexpr size_t k_off = 0, v_off = tile, q_off = 2 * tile;
  static constexpr size_t job_off = q_off + (size_t(kMmaBQ) * LD * 2 + 127) / 128 * 128;
  static constexpr size_t bytes = job_off + 128;
};

// Two adjacent elements as one 32-bit word (p is 4-byte aligned by construction).
template <typename T>
__device__ __forceinline__ uint32_t ld_pair(const T* p) {
#ifdef ASTRAI_EMU
  uint32_t r;
  memcpy(&r, p, 4);
  return r;
#else
  return *reinterpret_cast<const uint32_t*>(p);
#endif
}

template <typename T>
__device__ __forceinline__ void st_pair(T* p, uint32_t v) {
#ifdef ASTRAI_EMU
  memcpy(p, &v, 4);
#else
  *reinterpret_cast<uint32_t*>(p) = v;
#endif
}

template <typename T, int D>
__global__ void __launch_bounds__(kMmaWarps * 32) paged_prefill_mma_kernel(
    const T* __restrict__ q, const T* __restrict__ k_buf, const T* __restrict__ v_buf,
    const int* __restrict__ qo_indptr, const int* __restrict__ kv_indptr,
    const int* __restrict__ kv_indices, T* __restrict__ out, int B, int H, int K, int64_t q_sn,
    int64_t q_sh, int64_t kv_ss, int64_t kv_sh, float scale, int causal) {
  using L = MmaSmem<D>;
  constexpr int BQ = kMmaBQ, BK = kMmaBK, VEC = Vec16<T>::n, KT = D / 16, NT = BK / 8,
                OT = D / 8;
  ASTRAI_DYNAMIC_SMEM(unsigned char, smem);
  T* sK = reinterpret_cast<T*>(smem + L::k_off);
  T* sV = reinterpret_cast<T*>(smem + L::v_off);
  T* sQ = reinterpret_cast<T*>(smem + L::q_off);
  int* sJob = reinterpret_cast<int*>(smem + L::job_off);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int h = blockIdx.y, kh = h / (H / K);

  if (tid == 0) {  // (request, query tile) of this block, as in paged_prefill.cu
    int tile = blockIdx.x, req = -1;
    for (int r = 0; r < B; ++r) {
      const int nt = ceil_div(qo_indptr[r + 1] - qo_indptr[r], BQ);
      if (tile < nt) { req = r; break; }
      tile -= nt;
    }
    sJob[0] = req;
    sJob[1] = tile;
  }
  __syncthreads();
  const int req = sJob[0];
  if (req < 0) return;
  const int q_begin = qo_indptr[req], q_len = qo_indptr[req + 1] - q_begin;
  const int kv_begin = kv_indptr[req], kv_len = kv_indptr[req + 1] - kv_begin;
  const int offset = kv_len - q_len;
  const int q0 = sJob[1] * BQ, q_rows = min(BQ, q_len - q0);

  for (int e = tid; e < BQ * (D / VEC); e += blockDim.x) {
    const int r = e / (D / VEC), c = (e % (D / VEC)) * VEC;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (r < q_rows)
      val = *reinterpret_cast<const uint4*>(q + int64_t(q_begin + q0 + r) * q_sn + h * q_sh + c);
    *reinterpret_cast<uint4*>(sQ + r * L::LD + c) = val;
  }
  __syncthreads();
  const int r0 = warp * 16 + g;  // this lane's rows in the tile: r0 and r0 + 8
  uint32_t qa[KT][4];
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) {
    qa[kk][0] = ld_pair(sQ + r0 * L::LD + kk * 16 + 2 * t);
    qa[kk][1] = ld_pair(sQ + (r0 + 8) * L::LD + kk * 16 + 2 * t);
    qa[kk][2] = ld_pair(sQ + r0 * L::LD + kk * 16 + 8 + 2 * t);
    qa[kk][3] = ld_pair(sQ + (r0 + 8) * L::LD + kk * 16 + 8 + 2 * t);
  }

  const bool warp_active = warp * 16 < q_rows;  // warp-uniform
  const int row[2] = {q0 + r0, q0 + r0 + 8};
  const bool row_ok[2] = {row[0] < q_len, row[1] < q_len};
  const int row_pos[2] = {offset + row[0], offset + row[1]};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // l: this lane's partial sums
  float o[OT][4];
#pragma unroll
  for (int n = 0; n < OT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

  const int kv_end = causal ? min(kv_len, offset + q0 + q_rows) : kv_len;
  for (int j0 = 0; j0 < kv_end; j0 += BK) {
    __syncthreads();  // the previous K/V tile is consumed
    for (int e = tid; e < BK * (D / VEC); e += blockDim.x) {
      const int r = e / (D / VEC), c = (e % (D / VEC)) * VEC;
      uint4 kval = make_uint4(0, 0, 0, 0), vval = make_uint4(0, 0, 0, 0);
      if (j0 + r < kv_end) {
        const int64_t base = int64_t(kv_indices[kv_begin + j0 + r]) * kv_ss + kh * kv_sh + c;
        kval = *reinterpret_cast<const uint4*>(k_buf + base);
        vval = *reinterpret_cast<const uint4*>(v_buf + base);
      }
      *reinterpret_cast<uint4*>(sK + r * L::LD + c) = kval;
      *reinterpret_cast<uint4*>(sV + r * L::LD + c) = vval;
    }
    __syncthreads();
    if (!warp_active) continue;

    // S (16 x BK) = Q K^T: B[k][n] = K[key n][dim k], two adjacent dims of one key per register.
    float s[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
      const T* krow = sK + (n * 8 + g) * L::LD + 2 * t;
#pragma unroll
      for (int kk = 0; kk < KT; ++kk) {
        const uint32_t kb[2] = {ld_pair(krow + kk * 16), ld_pair(krow + kk * 16 + 8)};
        mma_16816<T>(s[n], qa[kk], kb);
      }
    }

    // Mask, scale, and the online softmax for rows r0 (e = 0, 1) and r0 + 8 (e = 2, 3).
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e / 2, j = j0 + n * 8 + 2 * t + (e % 2);
        const bool ok = row_ok[i] && j < kv_end && (!causal || j <= row_pos[i]);
        s[n][e] = ok ? s[n][e] * scale : -INFINITY;
        mx[i] = fmaxf(mx[i], s[n][e]);
      }
    }
    float alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float m_new = fmaxf(m[i], mx[i]);
      alpha[i] = m_new == -INFINITY ? 1.f : ASTRAI_EXP(m[i] - m_new);
      m[i] = m_new;
      l[i] *= alpha[i];
    }
    uint32_t pa[NT / 2][4];  // P as the A operand of P V, key block kk = n / 2
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      T p[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e / 2;
        p[e] = from_float<T>(s[n][e] == -INFINITY ? 0.f : ASTRAI_EXP(s[n][e] - m[i]));
        l[i] += to_float(p[e]);  // the sum of exactly what P V multiplies
      }
      pa[n / 2][(n % 2) * 2 + 0] = pack2(p[0], p[1]);  // row r0,     keys 2t..2t+1 (+8 if odd n)
      pa[n / 2][(n % 2) * 2 + 1] = pack2(p[2], p[3]);  // row r0 + 8
    }
#pragma unroll
    for (int n = 0; n < OT; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    // O (16 x D) += P V: B[k][n] = V[key k][dim n], two keys of one dim per register.
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      const uint32_t a[4] = {pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3]};
      const T* vcol = sV + (kk * 16 + 2 * t) * L::LD + g;
#pragma unroll
      for (int n = 0; n < OT; ++n) {
        const T* v = vcol + n * 8;
        const uint32_t vb[2] = {pack2(v[0], v[L::LD]), pack2(v[8 * L::LD], v[9 * L::LD])};
        mma_16816<T>(o[n], a, vb);
      }
    }
  }

  // Row sums over the quad, then O / l straight to the output (two elements per store).
  float inv[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    inv[i] = l[i] > 0.f ? 1.f / l[i] : 0.f;
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!row_ok[i]) continue;
    T* orow = out + (int64_t(q_begin + row[i]) * H + h) * D + 2 * t;
#pragma unroll
    for (int n = 0; n < OT; ++n) {
      const uint32_t pair = pack2(from_float<T>(o[n][2 * i] * inv[i]),
                                  from_float<T>(o[n][2 * i + 1] * inv[i]));
      st_pair(orow + n * 8, pair);
    }
  }
}

template <typename T, int D>
int paged_prefill_mma_launch(const void* q, const void* k_buf, const void* v_buf,
                             const int* qo_indptr, const int* kv_indptr, const int* kv_indices,
                             void* out, int B, int N, int H, int K, int64_t q_sn, int64_t q_sh,
                             int64_t kv_ss, int64_t kv_sh, float scale, int causal,
                             cudaStream_t stream) {
  if (B == 0 || N == 0) return 0;
  const size_t smem = MmaSmem<D>::bytes;
  auto kernel = &paged_prefill_mma_kernel<T, D>;
  int err = int(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  if (err != 0) return err;
  dim3 grid(ceil_div(N, kMmaBQ) + B, H), block(kMmaWarps * 32);
  ASTRAI_LAUNCH(kernel, grid, block, smem, stream, static_cast<const T*>(q),
                static_cast<const T*>(k_buf), static_cast<const T*>(v_buf), qo_indptr, kv_indptr,
                kv_indices, static_cast<T*>(out), B, H, K, q_sn, q_sh, kv_ss, kv_sh, scale, causal);
  return int(cudaGetLastError());
}

template <typename T>
int paged_prefill_mma_dispatch(int D, const void* q, const void* k_buf, const void* v_buf,
                               const int* qo, const int* kvp, const int* kvi, void* out, int B,
                               int N, int H, int K, int64_t q_sn, int64_t q_sh, int64_t kv_ss,
                               int64_t kv_sh, float scale, int causal, cudaStream_t stream) {
#define ASTRAI_PREFILL_MMA_CASE(DIM)                                                              \
  case DIM:                                                                                       \
    return paged_prefill_mma_launch<T, DIM>(q, k_buf, v_buf, qo, kvp, kvi, out, B, N, H, K, q_sn, \
                                            q_sh, kv_ss, kv_sh, scale, causal, stream);
  switch (D) {
    ASTRAI_PREFILL_MMA_CASE(32)
    ASTRAI_PREFILL_MMA_CASE(64)
    ASTRAI_PREFILL_MMA_CASE(128)
  }
#undef ASTRAI_PREFILL_MMA_CASE
  return -1;
}

}  // namespace astrai

// Same arguments as astrai_paged_prefill.
extern "C" int astrai_paged_prefill_mma(const void* q, const void* k_buf, const void* v_buf,
                                        int dtype, const int* qo_indptr, const int* kv_indptr,
                                        const int* kv_indices, void* out, int B, int N, int H,
                                        int K, int D, int64_t q_sn, int64_t q_sh, int64_t kv_ss,
                                        int64_t kv_sh, float scale, int causal,
                                        cudaStream_t stream) {
  using namespace astrai;
  if (K <= 0 || H % K != 0) return -1;
  switch (dtype) {
    case kFloat16:
      return paged_prefill_mma_dispatch<__half>(D, q, k_buf, v_buf, qo_indptr, kv_indptr,
                                                kv_indices, out, B, N, H, K, q_sn, q_sh, kv_ss,
                                                kv_sh, scale, causal, stream);
    case kBFloat16:
      return paged_prefill_mma_dispatch<__nv_bfloat16>(D, q, k_buf, v_buf, qo_indptr, kv_indptr,
                                                       kv_indices, out, B, N, H, K, q_sn, q_sh,
                                                       kv_ss, kv_sh, scale, causal, stream);
  }
  return -1;
}
