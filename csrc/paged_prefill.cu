// Ragged paged prefill attention (causal within each request, prefix K/V read from the pool).
//
// Request b owns query rows qo_indptr[b]..qo_indptr[b+1] of q [N, H, D] and keys
// kv_indices[kv_indptr[b]..kv_indptr[b+1]] (token slots of k_buf/v_buf [S, K, D], in position
// order, the new tokens last). Query i of request b sits at position kv_len - qo_len + i and,
// with causal, sees keys 0..that position. A block owns one head and one tile of BQ = 64 query
// rows of one request; its 4 warps own 16 rows each. Keys stream through shared memory in tiles
// of BK = 64, gathered slot by slot; S = Q K^T and O += P V run on the tensor cores (WMMA
// 16x16x16, fp16/bf16 in, fp32 accumulate) and the online softmax (FlashAttention-2, Dao 2023)
// runs on the fp32 S tile in shared memory, two lanes per row.
//
// WMMA's element-to-lane map is opaque, so to rescale the O accumulators row by row each warp
// loads a tile whose every element holds its own row index into a fragment of the same type:
// element i of that fragment then names the row of element i of every O fragment.
#include "common.cuh"

namespace astrai {

namespace wmma = nvcuda::wmma;

constexpr int kPrefillBQ = 64;
constexpr int kPrefillBK = 64;
constexpr int kPrefillWarps = kPrefillBQ / 16;

template <int D> struct PrefillSmem {
  static constexpr int KLD = D + 8;                                  // K/V/Q row stride (elems)
  static constexpr int SLD = (D > kPrefillBK ? D : kPrefillBK) + 4;  // S/O row stride (floats)
  static constexpr int PLD = kPrefillBK + 8;                         // P row stride (elems)
  static constexpr size_t align(size_t n) { return (n + 127) / 128 * 128; }
  static constexpr size_t k_off = 0;
  static constexpr size_t v_off = k_off + align(size_t(kPrefillBK) * KLD * 2);
  // The Q tile is read into registers once, then its bytes hold the S/O tiles.
  static constexpr size_t s_bytes = align(size_t(kPrefillWarps) * 16 * SLD * 4);
  static constexpr size_t q_bytes = align(size_t(kPrefillBQ) * KLD * 2);
  static constexpr size_t s_off = v_off + align(size_t(kPrefillBK) * KLD * 2);
  static constexpr size_t p_off = s_off + (s_bytes > q_bytes ? s_bytes : q_bytes);
  static constexpr size_t alpha_off = p_off + align(size_t(kPrefillWarps) * 16 * PLD * 2);
  static constexpr size_t rows_off = alpha_off + align(size_t(kPrefillWarps) * 16 * 4);
  static constexpr size_t job_off = rows_off + align(16 * 16 * 4);
  static constexpr size_t bytes = job_off + 128;
};

template <typename T, int D>
__global__ void __launch_bounds__(kPrefillWarps * 32) paged_prefill_kernel(
    const T* __restrict__ q, const T* __restrict__ k_buf, const T* __restrict__ v_buf,
    const int* __restrict__ qo_indptr, const int* __restrict__ kv_indptr,
    const int* __restrict__ kv_indices, T* __restrict__ out, int B, int H, int K, int64_t q_sn,
    int64_t q_sh, int64_t kv_ss, int64_t kv_sh, float scale, int causal) {
  using L = PrefillSmem<D>;
  constexpr int BQ = kPrefillBQ, BK = kPrefillBK, VEC = Vec16<T>::n, DT = D / 16;
  ASTRAI_DYNAMIC_SMEM(unsigned char, smem);
  T* sK = reinterpret_cast<T*>(smem + L::k_off);
  T* sV = reinterpret_cast<T*>(smem + L::v_off);
  T* sQ = reinterpret_cast<T*>(smem + L::s_off);
  float* sS_all = reinterpret_cast<float*>(smem + L::s_off);
  T* sP_all = reinterpret_cast<T*>(smem + L::p_off);
  float* sAlpha_all = reinterpret_cast<float*>(smem + L::alpha_off);
  float* sRows = reinterpret_cast<float*>(smem + L::rows_off);
  int* sJob = reinterpret_cast<int*>(smem + L::job_off);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int h = blockIdx.y;
  const int kh = h / (H / K);

  // Which (request, query tile) is this block? Tiles are numbered request by request; the grid
  // has ceil(N / BQ) + B blocks along x, an upper bound on the tile count, and the rest exit.
  if (tid == 0) {
    int t = blockIdx.x, req = -1;
    for (int r = 0; r < B; ++r) {
      const int nt = ceil_div(qo_indptr[r + 1] - qo_indptr[r], BQ);
      if (t < nt) { req = r; break; }
      t -= nt;
    }
    sJob[0] = req;
    sJob[1] = t;
  }
  for (int i = tid; i < 256; i += blockDim.x) sRows[i] = float(i / 16);
  __syncthreads();
  const int req = sJob[0];
  if (req < 0) return;
  const int q_begin = qo_indptr[req];
  const int q_len = qo_indptr[req + 1] - q_begin;
  const int kv_begin = kv_indptr[req];
  const int kv_len = kv_indptr[req + 1] - kv_begin;
  const int offset = kv_len - q_len;  // position of query row 0
  const int q0 = sJob[1] * BQ;
  const int q_rows = min(BQ, q_len - q0);

  // Q tile -> shared (zeros past the request's last row) -> registers.
  for (int e = tid; e < BQ * (D / VEC); e += blockDim.x) {
    const int r = e / (D / VEC), c = (e % (D / VEC)) * VEC;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (r < q_rows)
      val = *reinterpret_cast<const uint4*>(q + int64_t(q_begin + q0 + r) * q_sn + h * q_sh + c);
    *reinterpret_cast<uint4*>(sQ + r * L::KLD + c) = val;
  }
  __syncthreads();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> qf[DT];
#pragma unroll
  for (int kk = 0; kk < DT; ++kk)
    wmma::load_matrix_sync(qf[kk], sQ + (warp * 16) * L::KLD + kk * 16, L::KLD);
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> rowf, of[DT];
  wmma::load_matrix_sync(rowf, sRows, 16, wmma::mem_row_major);
#pragma unroll
  for (int n = 0; n < DT; ++n) wmma::fill_fragment(of[n], 0.f);

  float* sS = sS_all + warp * 16 * L::SLD;
  T* sP = sP_all + warp * 16 * L::PLD;
  float* sAlpha = sAlpha_all + warp * 16;
  // Softmax ownership: lanes 2r and 2r+1 share row r of the warp's 16, half the columns each.
  const int my_row = lane / 2, my_half = lane % 2;
  const int row_in_req = q0 + warp * 16 + my_row;
  const bool row_ok = row_in_req < q_len;
  const int row_pos = offset + row_in_req;
  float m_i = -INFINITY, l_i = 0.f;
  const bool warp_active = warp * 16 < q_rows;  // warp-uniform

  const int kv_end = causal ? min(kv_len, offset + q0 + q_rows) : kv_len;
  for (int j0 = 0; j0 < kv_end; j0 += BK) {
    __syncthreads();  // everyone is done with the previous K/V tile (and with sQ, the first time)
    for (int e = tid; e < BK * (D / VEC); e += blockDim.x) {
      const int r = e / (D / VEC), c = (e % (D / VEC)) * VEC;
      uint4 kval = make_uint4(0, 0, 0, 0), vval = make_uint4(0, 0, 0, 0);
      if (j0 + r < kv_end) {
        const int64_t base = int64_t(kv_indices[kv_begin + j0 + r]) * kv_ss + kh * kv_sh + c;
        kval = *reinterpret_cast<const uint4*>(k_buf + base);
        vval = *reinterpret_cast<const uint4*>(v_buf + base);
      }
      *reinterpret_cast<uint4*>(sK + r * L::KLD + c) = kval;
      *reinterpret_cast<uint4*>(sV + r * L::KLD + c) = vval;
    }
    __syncthreads();

    // A warp whose 16 rows all lie past the request's end (decode rows in a mixed step)
    // only helps load K/V.
    if (warp_active) {
      // S (16 x BK) = Q_w (16 x D) K^T: K is [BK, D] row-major, i.e. K^T column-major.
#pragma unroll
      for (int c = 0; c < BK / 16; ++c) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> sf;
        wmma::fill_fragment(sf, 0.f);
#pragma unroll
        for (int kk = 0; kk < DT; ++kk) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> kf;
          wmma::load_matrix_sync(kf, sK + (c * 16) * L::KLD + kk * 16, L::KLD);
          wmma::mma_sync(sf, qf[kk], kf, sf);
        }
        wmma::store_matrix_sync(sS + c * 16, sf, L::SLD, wmma::mem_row_major);
      }
      __syncwarp();

      // Online softmax over this tile's columns for row my_row.
      float s_max = -INFINITY;
      for (int c = my_half * (BK / 2); c < (my_half + 1) * (BK / 2); ++c) {
        const int j = j0 + c;
        const bool ok = row_ok && j < kv_end && (!causal || j <= row_pos);
        const float s = ok ? sS[my_row * L::SLD + c] * scale : -INFINITY;
        sS[my_row * L::SLD + c] = s;
        s_max = fmaxf(s_max, s);
      }
      s_max = fmaxf(s_max, __shfl_xor_sync(0xffffffffu, s_max, 1));
      const float m_new = fmaxf(m_i, s_max);
      // A row with nothing visible yet (padding rows) keeps p = 0 instead of exp(-inf + inf).
      const float alpha = m_new == -INFINITY ? 1.f : ASTRAI_EXP(m_i - m_new);
      float p_sum = 0.f;
      for (int c = my_half * (BK / 2); c < (my_half + 1) * (BK / 2); ++c) {
        const float s = sS[my_row * L::SLD + c];
        const float p = s == -INFINITY ? 0.f : ASTRAI_EXP(s - m_new);
        const T pt = from_float<T>(p);
        sP[my_row * L::PLD + c] = pt;
        p_sum += to_float(pt);  // the sum of exactly what P V multiplies
      }
      p_sum += __shfl_xor_sync(0xffffffffu, p_sum, 1);
      l_i = l_i * alpha + p_sum;
      m_i = m_new;
      if (my_half == 0) sAlpha[my_row] = alpha;
      __syncwarp();

      // O = diag(alpha) O + P V.
#pragma unroll
      for (int n = 0; n < DT; ++n) {
#pragma unroll
        for (int i = 0; i < of[n].num_elements; ++i) of[n].x[i] *= sAlpha[int(rowf.x[i])];
      }
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> pf;
        wmma::load_matrix_sync(pf, sP + kk * 16, L::PLD);
#pragma unroll
        for (int n = 0; n < DT; ++n) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> vf;
          wmma::load_matrix_sync(vf, sV + (kk * 16) * L::KLD + n * 16, L::KLD);
          wmma::mma_sync(of[n], pf, vf, of[n]);
        }
      }
    }
  }

  // O / l, through the warp's S area (fp32) to the output dtype.
  __syncthreads();  // (with no key tile at all, other warps' Q rows may still be in that area)
  if (my_half == 0) sAlpha[my_row] = l_i > 0.f ? 1.f / l_i : 0.f;
  __syncwarp();
#pragma unroll
  for (int n = 0; n < DT; ++n) {
#pragma unroll
    for (int i = 0; i < of[n].num_elements; ++i) of[n].x[i] *= sAlpha[int(rowf.x[i])];
    wmma::store_matrix_sync(sS + n * 16, of[n], L::SLD, wmma::mem_row_major);
  }
  __syncwarp();
  for (int e = lane; e < 16 * D; e += 32) {
    const int r = e / D, d = e % D;
    const int row = q0 + warp * 16 + r;
    if (row < q_len) out[(int64_t(q_begin + row) * H + h) * D + d] = from_float<T>(sS[r * L::SLD + d]);
  }
}

template <typename T, int D>
int paged_prefill_launch(const void* q, const void* k_buf, const void* v_buf, const int* qo_indptr,
                         const int* kv_indptr, const int* kv_indices, void* out, int B, int N,
                         int H, int K, int64_t q_sn, int64_t q_sh, int64_t kv_ss, int64_t kv_sh,
                         float scale, int causal, cudaStream_t stream) {
  if (B == 0 || N == 0) return 0;
  const size_t smem = PrefillSmem<D>::bytes;
  auto kernel = &paged_prefill_kernel<T, D>;
  int err = int(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  if (err != 0) return err;
  dim3 grid(ceil_div(N, kPrefillBQ) + B, H), block(kPrefillWarps * 32);
  ASTRAI_LAUNCH(kernel, grid, block, smem, stream, static_cast<const T*>(q),
                static_cast<const T*>(k_buf), static_cast<const T*>(v_buf), qo_indptr, kv_indptr,
                kv_indices, static_cast<T*>(out), B, H, K, q_sn, q_sh, kv_ss, kv_sh, scale, causal);
  return int(cudaGetLastError());
}

template <typename T>
int paged_prefill_dispatch(int D, const void* q, const void* k_buf, const void* v_buf,
                           const int* qo, const int* kvp, const int* kvi, void* out, int B, int N,
                           int H, int K, int64_t q_sn, int64_t q_sh, int64_t kv_ss, int64_t kv_sh,
                           float scale, int causal, cudaStream_t stream) {
#define ASTRAI_PREFILL_CASE(DIM)                                                                  \
  case DIM:                                                                                       \
    return paged_prefill_launch<T, DIM>(q, k_buf, v_buf, qo, kvp, kvi, out, B, N, H, K, q_sn,     \
                                        q_sh, kv_ss, kv_sh, scale, causal, stream);
  switch (D) {
    ASTRAI_PREFILL_CASE(32)
    ASTRAI_PREFILL_CASE(64)
    ASTRAI_PREFILL_CASE(128)
  }
#undef ASTRAI_PREFILL_CASE
  return -1;
}

}  // namespace astrai

// q [N, H, D] (strides q_sn, q_sh; last dim contiguous), k_buf/v_buf [S, K, D] (strides kv_ss,
// kv_sh), qo_indptr/kv_indptr [B+1] int32, kv_indices int32, out [N, H, D] contiguous.
// fp16 and bf16 only (tensor cores). Returns a cudaError_t code; -1 = unsupported.
extern "C" int astrai_paged_prefill(const void* q, const void* k_buf, const void* v_buf, int dtype,
                                    const int* qo_indptr, const int* kv_indptr,
                                    const int* kv_indices, void* out, int B, int N, int H, int K,
                                    int D, int64_t q_sn, int64_t q_sh, int64_t kv_ss,
                                    int64_t kv_sh, float scale, int causal, cudaStream_t stream) {
  using namespace astrai;
  if (K <= 0 || H % K != 0) return -1;
  switch (dtype) {
    case kFloat16:
      return paged_prefill_dispatch<__half>(D, q, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices,
                                            out, B, N, H, K, q_sn, q_sh, kv_ss, kv_sh, scale,
                                            causal, stream);
    case kBFloat16:
      return paged_prefill_dispatch<__nv_bfloat16>(D, q, k_buf, v_buf, qo_indptr, kv_indptr,
                                                   kv_indices, out, B, N, H, K, q_sn, q_sh, kv_ss,
                                                   kv_sh, scale, causal, stream);
  }
  return -1;
}
