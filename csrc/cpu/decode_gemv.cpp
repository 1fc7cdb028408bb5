// CPU decode GEMV: out[M, N] = x[M, K] · W[N, K]ᵀ (+ bias) for a few rows M (decoding), with
// W fp32, bf16 or int8 (per-row scales), read once from memory: a decode step is bound by the
// bytes of its weights, so the kernel streams each weight row once while the M activation rows
// stay in registers / L1.
//
// Built by astrai/kernels/cpu_build.py with torch.utils.cpp_extension for the CPU found: the
// -m flags decide the code path at compile time (AVX-512, AVX2+FMA; AVX512-VNNI for the int8
// dot), and the op namespace (ASTRAI_CPU_NS) names the variant, so two builds can live in one
// process. Ops (torch.ops.<ns>.*; schemas at the bottom):
//
//   gemv(x, w, bias)                 fp32 x [M,K] against fp32 or bf16 W [N,K] -> fp32 [M,N]
//   gemv_int8(x, q, scale, bias)     int8 W, fp32 activations: exact to x · (s·q)ᵀ in fp32
//   gemv_q8(x, q, scale, bias)       int8 W, activations quantized to int8 per block of QK
//                                    (absmax, as llama.cpp's q8_0 × q8_0 dot): int32 dots,
//                                    VNNI vpdpbusd where the CPU has it
//
// Design (per output-row tile of RT rows, per group of up to MB activation rows): one vector
// accumulator per (activation row, weight row), each weight vector loaded once and used for
// every activation row of the group; horizontal sums once per tile. Threads (at::parallel_for,
// torch's intra-op pool) take contiguous ranges of row tiles, so each streams its own slice.
#include <immintrin.h>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#ifndef ASTRAI_CPU_NS
#define ASTRAI_CPU_NS astrai_cpu
#endif

namespace {

constexpr int RT = 4;   // weight rows per tile
constexpr int QK = 64;  // activation quantization block (gemv_q8)

// -- vectors --------------------------------------------------------------------------------
#if defined(__AVX512F__) && defined(__AVX512BW__)
constexpr int VL = 16;
using vf = __m512;
inline vf vzero() { return _mm512_setzero_ps(); }
inline vf vset1(float a) { return _mm512_set1_ps(a); }
inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(vf a) { return _mm512_reduce_add_ps(a); }
inline vf wload(const float* p) { return _mm512_loadu_ps(p); }
inline vf wload(const c10::BFloat16* p) {  // bf16 -> fp32 is a 16-bit shift
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline vf wload(const int8_t* p) {
  __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int VL = 8;
using vf = __m256;
inline vf vzero() { return _mm256_setzero_ps(); }
inline vf vset1(float a) { return _mm256_set1_ps(a); }
inline vf vload(const float* p) { return _mm256_loadu_ps(p); }
inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(vf a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline vf wload(const float* p) { return _mm256_loadu_ps(p); }
inline vf wload(const c10::BFloat16* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline vf wload(const int8_t* p) {
  __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}
#else
#error "decode_gemv.cpp needs AVX2 and FMA (or AVX-512); the build falls back to torch otherwise"
#endif

inline float to_f(float v) { return v; }
inline float to_f(c10::BFloat16 v) { return static_cast<float>(v); }
inline float to_f(int8_t v) { return static_cast<float>(v); }

// -- float-weight tiles ---------------------------------------------------------------------
// sums[m * RT + r] = Σ_k x[m, k] · W[r, k] for m < MBv, r < R.
template <int MBv, int R, typename W>
inline void dot_tile(const float* x, int64_t ldx, const W* w, int64_t ldw, int64_t K,
                     float* sums) {
  vf acc[MBv][R];
  for (int m = 0; m < MBv; ++m)
    for (int r = 0; r < R; ++r) acc[m][r] = vzero();
  int64_t k = 0;
  for (; k + VL <= K; k += VL) {
    vf xv[MBv];
    for (int m = 0; m < MBv; ++m) xv[m] = vload(x + m * ldx + k);
    for (int r = 0; r < R; ++r) {
      vf wv = wload(w + r * ldw + k);
      for (int m = 0; m < MBv; ++m) acc[m][r] = vfma(wv, xv[m], acc[m][r]);
    }
  }
  for (int m = 0; m < MBv; ++m)
    for (int r = 0; r < R; ++r) {
      float s = vsum(acc[m][r]);
      for (int64_t t = k; t < K; ++t) s += x[m * ldx + t] * to_f(w[r * ldw + t]);
      sums[m * RT + r] = s;
    }
}

template <int MBv, typename W>
inline void dot_rows(int R, const float* x, int64_t ldx, const W* w, int64_t ldw, int64_t K,
                     float* sums) {
  switch (R) {
    case 4: return dot_tile<MBv, 4>(x, ldx, w, ldw, K, sums);
    case 3: return dot_tile<MBv, 3>(x, ldx, w, ldw, K, sums);
    case 2: return dot_tile<MBv, 2>(x, ldx, w, ldw, K, sums);
    default: return dot_tile<MBv, 1>(x, ldx, w, ldw, K, sums);
  }
}

constexpr int MB = 4;  // activation rows per group

template <typename W>
inline void dot_group(int mb, int R, const float* x, int64_t ldx, const W* w, int64_t ldw,
                      int64_t K, float* sums) {
  switch (mb) {
    case 4: return dot_rows<4>(R, x, ldx, w, ldw, K, sums);
    case 3: return dot_rows<3>(R, x, ldx, w, ldw, K, sums);
    case 2: return dot_rows<2>(R, x, ldx, w, ldw, K, sums);
    default: return dot_rows<1>(R, x, ldx, w, ldw, K, sums);
  }
}

// out[m, n] = sums · scale[n] + bias[n]; scale and bias may be null.
inline void store(const float* sums, int mb, int R, int64_t n0, const float* scale,
                  const float* bias, float* out, int64_t ldo) {
  for (int m = 0; m < mb; ++m)
    for (int r = 0; r < R; ++r) {
      float v = sums[m * RT + r];
      if (scale) v *= scale[n0 + r];
      if (bias) v += bias[n0 + r];
      out[m * ldo + n0 + r] = v;
    }
}

// Row tiles split over torch's threads; each thread streams its contiguous slice of W.
template <typename Body>
inline void over_tiles(int64_t N, int64_t K, Body body) {
  const int64_t tiles = (N + RT - 1) / RT;
  // a piece under ~32K weights costs a thread more to start than it saves
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, RT * K));
  at::parallel_for(0, tiles, grain, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * RT;
      body(n0, static_cast<int>(std::min<int64_t>(RT, N - n0)));
    }
  });
}

template <typename W>
void gemv_float_weights(const float* x, int64_t M, int64_t K, const W* w, int64_t ldw,
                        int64_t N, const float* scale, const float* bias, float* out) {
  over_tiles(N, K, [&](int64_t n0, int R) {
    float sums[MB * RT];
    for (int64_t m0 = 0; m0 < M; m0 += MB) {
      const int mb = static_cast<int>(std::min<int64_t>(MB, M - m0));
      dot_group(mb, R, x + m0 * K, K, w + n0 * ldw, ldw, K, sums);
      store(sums, mb, R, n0, scale, bias, out + m0 * N, N);
    }
  });
}

// -- int8 × int8 (quantized activations) ----------------------------------------------------
// Activations per row m and block b of QK values: s = max|x| / 127, xq = round(x / s) (int8),
// zero-padded to whole blocks. The dot of a weight row q with them is
//   Σ_b s_b · Σ_{k∈b} q_k · xq_k.
struct QuantAct {
  std::vector<int8_t> q;   // [M, Kp]
  std::vector<float> s;    // [M, nb]
  std::vector<float> c;    // [M] correction (VNNI): 128 · Σ_b s_b · Σ_{k∈b} xq_k
  std::vector<uint8_t> a;  // [M, Kp] |xq| (AVX2 sign trick)
  int64_t Kp = 0, nb = 0;
};

void quantize_act(const float* x, int64_t M, int64_t K, QuantAct& qa) {
  qa.nb = (K + QK - 1) / QK;
  qa.Kp = qa.nb * QK;
  qa.q.assign(M * qa.Kp, 0);
  qa.s.assign(M * qa.nb, 0.f);
  qa.c.assign(M, 0.f);
  qa.a.assign(M * qa.Kp, 0);
  for (int64_t m = 0; m < M; ++m) {
    double corr = 0;
    for (int64_t b = 0; b < qa.nb; ++b) {
      const int64_t k0 = b * QK, k1 = std::min<int64_t>(K, k0 + QK);
      float amax = 0.f;
      for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(x[m * K + k]));
      const float s = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
      int32_t qsum = 0;
      for (int64_t k = k0; k < k1; ++k) {
        const int32_t v = static_cast<int32_t>(std::nearbyint(x[m * K + k] * inv));
        const int8_t vq = static_cast<int8_t>(std::max(-127, std::min(127, v)));
        qa.q[m * qa.Kp + k] = vq;
        qa.a[m * qa.Kp + k] = static_cast<uint8_t>(vq < 0 ? -vq : vq);
        qsum += vq;
      }
      qa.s[m * qa.nb + b] = s;
      corr += static_cast<double>(s) * qsum;
    }
    qa.c[m] = static_cast<float>(128.0 * corr);
  }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
constexpr bool kVnni = true;
// (q ^ 0x80) is q + 128 as an unsigned byte, so vpdpbusd (u8 × s8) gives Σ (q + 128) · xq; the
// 128 · Σ xq part is the same for every weight row and is taken off once (QuantAct::c).
template <int MBv, int R>
inline void q8_tile(const QuantAct& qa, int64_t m0, const int8_t* w, int64_t ldw, int64_t K,
                    float* sums) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 accf[MBv][R];
  for (int m = 0; m < MBv; ++m)
    for (int r = 0; r < R; ++r) accf[m][r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < qa.nb; ++b) {
    __m512i acci[MBv][R];
    const int64_t k = b * QK;  // QK == 64: one vector per block
    const __mmask64 mask = K - k >= 64 ? ~0ULL : ((1ULL << (K - k)) - 1);
    __m512i xv[MBv];
    for (int m = 0; m < MBv; ++m)
      xv[m] = _mm512_loadu_si512(qa.q.data() + (m0 + m) * qa.Kp + k);
    for (int r = 0; r < R; ++r) {
      __m512i wv = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, w + r * ldw + k), flip);
      for (int m = 0; m < MBv; ++m)
        acci[m][r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, xv[m]);
    }
    for (int m = 0; m < MBv; ++m) {
      const __m512 s = _mm512_set1_ps(qa.s[(m0 + m) * qa.nb + b]);
      for (int r = 0; r < R; ++r)
        accf[m][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acci[m][r]), s, accf[m][r]);
    }
  }
  for (int m = 0; m < MBv; ++m)
    for (int r = 0; r < R; ++r) sums[m * RT + r] = _mm512_reduce_add_ps(accf[m][r]) - qa.c[m0 + m];
}
constexpr int MBQ = 2;
#else
constexpr bool kVnni = false;
// AVX2: maddubs needs one unsigned side, so |xq| against q with xq's sign (llama.cpp's
// trick); |q|, |xq| <= 127 keeps the 16-bit pair sums from saturating.
inline __m256i dot32(const uint8_t* a, const int8_t* sx, const int8_t* w, bool tail, int64_t n) {
  __m256i wv;
  if (tail) {
    alignas(32) int8_t buf[32] = {0};
    std::memcpy(buf, w, static_cast<size_t>(n));
    wv = _mm256_load_si256(reinterpret_cast<const __m256i*>(buf));
  } else {
    wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  }
  const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  const __m256i xs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sx));
  const __m256i p16 = _mm256_maddubs_epi16(av, _mm256_sign_epi8(wv, xs));
  return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}
template <int MBv, int R>
inline void q8_tile(const QuantAct& qa, int64_t m0, const int8_t* w, int64_t ldw, int64_t K,
                    float* sums) {
  __m256 accf[MBv][R];
  for (int m = 0; m < MBv; ++m)
    for (int r = 0; r < R; ++r) accf[m][r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < qa.nb; ++b) {
    for (int r = 0; r < R; ++r) {
      for (int m = 0; m < MBv; ++m) {
        const int64_t row = (m0 + m) * qa.Kp;
        __m256i acc = _mm256_setzero_si256();
        for (int64_t k = b * QK; k < (b + 1) * QK; k += 32) {
          if (K - k <= 0) break;
          const bool tail = K - k < 32;
          acc = _mm256_add_epi32(acc, dot32(qa.a.data() + row + k, qa.q.data() + row + k,
                                            w + r * ldw + k, tail, K - k));
        }
        const __m256 s = _mm256_set1_ps(qa.s[(m0 + m) * qa.nb + b]);
        accf[m][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), s, accf[m][r]);
      }
    }
  }
  for (int m = 0; m < MBv; ++m)
    for (int r = 0; r < R; ++r) sums[m * RT + r] = vsum(accf[m][r]);
}
constexpr int MBQ = 2;
#endif

template <int MBv>
inline void q8_rows(int R, const QuantAct& qa, int64_t m0, const int8_t* w, int64_t ldw,
                    int64_t K, float* sums) {
  switch (R) {
    case 4: return q8_tile<MBv, 4>(qa, m0, w, ldw, K, sums);
    case 3: return q8_tile<MBv, 3>(qa, m0, w, ldw, K, sums);
    case 2: return q8_tile<MBv, 2>(qa, m0, w, ldw, K, sums);
    default: return q8_tile<MBv, 1>(qa, m0, w, ldw, K, sums);
  }
}

void gemv_q8_impl(const float* x, int64_t M, int64_t K, const int8_t* w, int64_t ldw,
                  int64_t N, const float* scale, const float* bias, float* out) {
  thread_local QuantAct qa;
  quantize_act(x, M, K, qa);
  const QuantAct& q = qa;
  over_tiles(N, K, [&](int64_t n0, int R) {
    float sums[MB * RT];
    for (int64_t m0 = 0; m0 < M; m0 += MBQ) {
      const int mb = static_cast<int>(std::min<int64_t>(MBQ, M - m0));
      if (mb == 2) q8_rows<2>(R, q, m0, w + n0 * ldw, ldw, K, sums);
      else q8_rows<1>(R, q, m0, w + n0 * ldw, ldw, K, sums);
      store(sums, mb, R, n0, scale, bias, out + m0 * N, N);
    }
  });
}

// -- ops ------------------------------------------------------------------------------------
void check_rows(const at::Tensor& x, const at::Tensor& w, const char* op) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2, op, ": x [M, K] and w [N, K] expected");
  TORCH_CHECK(x.size(1) == w.size(1), op, ": x has K=", x.size(1), ", w has K=", w.size(1));
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous(), op, ": x must be contiguous fp32");
  TORCH_CHECK(w.stride(1) == 1, op, ": w's rows must be contiguous");
  TORCH_CHECK(!x.is_cuda() && !w.is_cuda(), op, ": CPU tensors only");
}

const float* opt_f32(const std::optional<at::Tensor>& t, int64_t n, const char* what) {
  if (!t.has_value()) return nullptr;
  TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->numel() == n, what,
              " must be a contiguous fp32 vector of ", n);
  return t->data_ptr<float>();
}

at::Tensor gemv(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  check_rows(x, w, "gemv");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  at::Tensor out = at::empty({M, N}, x.options());
  const float* b = opt_f32(bias, N, "gemv: bias");
  if (w.scalar_type() == at::kFloat)
    gemv_float_weights(x.data_ptr<float>(), M, K, w.data_ptr<float>(), w.stride(0), N, nullptr,
                       b, out.data_ptr<float>());
  else if (w.scalar_type() == at::kBFloat16)
    gemv_float_weights(x.data_ptr<float>(), M, K, w.data_ptr<c10::BFloat16>(), w.stride(0), N,
                       nullptr, b, out.data_ptr<float>());
  else
    TORCH_CHECK(false, "gemv: w must be fp32 or bf16, got ", w.scalar_type());
  return out;
}

at::Tensor gemv_int8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                     const std::optional<at::Tensor>& bias) {
  check_rows(x, q, "gemv_int8");
  TORCH_CHECK(q.scalar_type() == at::kChar, "gemv_int8: q must be int8");
  const int64_t M = x.size(0), K = x.size(1), N = q.size(0);
  at::Tensor out = at::empty({M, N}, x.options());
  gemv_float_weights(x.data_ptr<float>(), M, K, q.data_ptr<int8_t>(), q.stride(0), N,
                     opt_f32(scale, N, "gemv_int8: scale"), opt_f32(bias, N, "gemv_int8: bias"),
                     out.data_ptr<float>());
  return out;
}

at::Tensor gemv_q8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                   const std::optional<at::Tensor>& bias) {
  check_rows(x, q, "gemv_q8");
  TORCH_CHECK(q.scalar_type() == at::kChar, "gemv_q8: q must be int8");
  const int64_t M = x.size(0), K = x.size(1), N = q.size(0);
  at::Tensor out = at::empty({M, N}, x.options());
  gemv_q8_impl(x.data_ptr<float>(), M, K, q.data_ptr<int8_t>(), q.stride(0), N,
               opt_f32(scale, N, "gemv_q8: scale"), opt_f32(bias, N, "gemv_q8: bias"),
               out.data_ptr<float>());
  return out;
}

// What this build does: "avx512" / "avx2", and whether the int8 dot is VNNI.
std::vector<int64_t> info() { return {VL, kVnni ? 1 : 0, QK}; }

}  // namespace

TORCH_LIBRARY(ASTRAI_CPU_NS, m) {
  m.def("gemv(Tensor x, Tensor w, Tensor? bias=None) -> Tensor");
  m.def("gemv_int8(Tensor x, Tensor q, Tensor scale, Tensor? bias=None) -> Tensor");
  m.def("gemv_q8(Tensor x, Tensor q, Tensor scale, Tensor? bias=None) -> Tensor");
  m.def("info() -> int[]", &info);
  m.impl("gemv", c10::DispatchKey::CPU, &gemv);
  m.impl("gemv_int8", c10::DispatchKey::CPU, &gemv_int8);
  m.impl("gemv_q8", c10::DispatchKey::CPU, &gemv_q8);
}
