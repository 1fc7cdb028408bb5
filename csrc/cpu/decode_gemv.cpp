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
//   gemv(x, w, bias)                 x [..., K] against fp32 or bf16 W [N, K] -> [..., N]
//                                    (bf16 x bf16: vdpbf16ps where the CPU has AVX512-BF16)
//   gemv_int8(x, q, scale, bias)     int8 W, fp32 activations: exact to x · (s·q)ᵀ in fp32
//   gemv_q8(x, q, scale, bias)       int8 W, activations quantized to int8 per block of QK
//                                    (absmax, as llama.cpp's q8_0 × q8_0 dot): int32 dots,
//                                    VNNI vpdpbusd where the CPU has it
//   gemv_q4(x, q, scale, bias)       int4 W in groups of 32 (q4_0's layout, fp32 scales),
//                                    activations as gemv_q8's: int32 group dots (maddubs,
//                                    vpdpbusd on AVX512-VNNI)
//   rms_norm(x, w, eps)              the norm before those products, one pass per row
//   paged_decode(q, k_buf, v_buf, ...) one query per request against the paged KV pool
//   DecodePlan(weights, ...)         a model's blocks' weights, checked once (a class)
//   decode_layers(plan, rows, ...)   every block of the plan's Llama-family decoder for a
//                                    few query rows, then the final norm and the LM head
//                                    (decode_layers.h)
//   *_many(x, [w...], ...)           the same against several matrices (q, k, v; gate, up) in
//                                    one parallel region, the activations quantized once
//
// x is fp32 or bf16 (the products are fp32 either way), the result in x's dtype.
//
// Design (per output-row tile of RT rows, per group of up to MB activation rows): the tile's
// weight rows read one after another, each weight vector loaded once and used for every
// activation row of the group (two vector accumulators per activation row for float weights);
// a horizontal sum per (row, activation row). Threads (work_share.h: torch's thread count,
// pieces claimed from a counter, so a descheduled thread's share is taken by the others) take
// contiguous ranges of row tiles, so each streams its own slice sequentially. A prefill's
// int8 / int4 products on AVX-512 turn the tile around (lane_product): activation rows in
// the vector lanes.
#include <immintrin.h>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/linear.h>
#include <c10/util/BFloat16.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <string>
#include <thread>
#include <vector>

#include "work_share.h"

#ifndef ASTRAI_CPU_NS
#define ASTRAI_CPU_NS astrai_cpu
#endif
#define ASTRAI_STR_(x) #x
#define ASTRAI_STR(x) ASTRAI_STR_(x)  // the namespace as a string (decode_layers' schema)

// The Fortran sgemv of the BLAS torch links (MKL in the x86 wheels), where it exports one: the
// native decode step calls it for a lone fp32 row (decode_layers.h `sgemv_call`). Weak: absent,
// the step keeps at::linear.
extern "C" void sgemv_(const char* trans, const int* m, const int* n, const float* alpha,
                       const float* a, const int* lda, const float* x, const int* incx,
                       const float* beta, float* y, const int* incy) __attribute__((weak));

namespace {

#ifndef ASTRAI_RT
#define ASTRAI_RT 16
#endif
// Weight rows per tile, the unit a thread takes. 16 rather than 4: a tile's calls, pointer
// setup and stores cost a one-row int8 decode product 1.18x its steps per second (int4 1.03x,
// fp32 1.02x; 125m preset, 2 threads, interleaved, AMD EPYC Zen 3).
constexpr int RT = ASTRAI_RT;
#ifndef ASTRAI_PF
#define ASTRAI_PF 0
#endif
// Software prefetch distance in bytes (0: none). Each thread reads its weights as one
// sequential stream, which the hardware prefetchers follow: 2048 bytes ahead cost 0.6x the
// single-thread bandwidth on an AMD EPYC (Zen 4) (docs/kernels.md).
constexpr int PF = ASTRAI_PF;
#ifndef ASTRAI_QPF
#define ASTRAI_QPF 2048
#endif
// The same for the int8 and int4 weights of gemv_q8 / gemv_q4, whose products are bound as
// much by their arithmetic as by their reads: 2048 bytes ahead gave 1.10x (int8) and 1.16x
// (int4) the decode steps per second of none, one request, 125m, 2 threads, on an AMD EPYC
// (Zen 3) VM (1024: 1.10x / 1.11x; 4096: 1.05x / 1.15x), and nothing measurable with four;
// the AVX-512 VNNI int8 product's one decode row 1.11x its bandwidth (12 layers of the 125m
// shape) and engine tg128 1.11x (20 interleaved rounds) on a Xeon Ice Lake. On an AMD EPYC
// Zen 4 the int4 tiles keep it (none: 1b engine tg128 0.95x) and the VNNI int8 product goes
// without (g_q8_prefetch).
constexpr int QPF = ASTRAI_QPF;
#ifndef ASTRAI_FPF
#define ASTRAI_FPF 1024
#endif
// The same for float weights read as several streams (dot_streams): 1024 bytes ahead read
// 1.06-1.12x (one row) and 1.15x (4 rows) the bytes per second of none (12 layers of the
// 125m shape, fp32, 2 threads, Xeon Ice Lake; 2048: 1.12x one row).
constexpr int FPF = ASTRAI_FPF;
#ifdef ASTRAI_PF_NTA
#define PF_HINT _MM_HINT_NTA
#elif defined(ASTRAI_PF_T1)
#define PF_HINT _MM_HINT_T1
#else
#define PF_HINT _MM_HINT_T0
#endif
#ifndef ASTRAI_QK
#define ASTRAI_QK 128
#endif
constexpr int QK = ASTRAI_QK;  // activation quantization block (gemv_q8), a multiple of 64
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
constexpr bool kVnni = true;
#else
constexpr bool kVnni = false;
#endif

// -- vectors --------------------------------------------------------------------------------
// The horizontal sum of 8 floats (AVX2's vsum, and the AVX2 int8 dot on either path).
inline float hsum256(__m256 a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
constexpr int VL = 16;
using vf = __m512;
inline vf vzero() { return _mm512_setzero_ps(); }
inline vf vset1(float a) { return _mm512_set1_ps(a); }
inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(vf a) { return _mm512_reduce_add_ps(a); }
inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline void vstore(float* p, vf a) { _mm512_storeu_ps(p, a); }
inline vf vmaxv(vf a, vf b) { return _mm512_max_ps(a, b); }
inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
inline vf vfloor(vf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
inline vf vpow2i(vf n) { return _mm512_scalef_ps(vset1(1.f), n); }  // 2^n, n integral
inline vf vmaxabs(vf m, vf a) { return _mm512_max_ps(m, _mm512_abs_ps(a)); }
inline vf vnegabs(vf a) { return _mm512_or_ps(a, vset1(-0.f)); }  // -|a|
inline vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
inline vf vwhere_neg(vf a, vf x, vf y) {  // x where a < 0, else y
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, vzero(), _CMP_LT_OQ), y, x);
}
inline float vmax(vf a) { return _mm512_reduce_max_ps(a); }
inline void vround_store(vf a, int32_t* p) {  // nearest, ties to even (MXCSR default)
  _mm512_storeu_si512(p, _mm512_cvtps_epi32(a));
}
inline vf wload(const float* p) { return _mm512_loadu_ps(p); }
inline vf wload(const c10::BFloat16* p) {  // bf16 -> fp32 is a 16-bit shift
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline vf wload(const c10::Half* p) {  // fp16 -> fp32 (F16C): a 16-bit KV pool's rows
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
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
inline float vsum(vf a) { return hsum256(a); }
inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline void vstore(float* p, vf a) { _mm256_storeu_ps(p, a); }
inline vf vmaxv(vf a, vf b) { return _mm256_max_ps(a, b); }
inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
inline vf vfloor(vf a) { return _mm256_floor_ps(a); }
inline vf vpow2i(vf n) {  // 2^n for integral n in [-126, 127]: the exponent bits
  const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
  return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
}
inline vf vmaxabs(vf m, vf a) {
  return _mm256_max_ps(m, _mm256_andnot_ps(_mm256_set1_ps(-0.f), a));
}
inline vf vnegabs(vf a) { return _mm256_or_ps(a, vset1(-0.f)); }  // -|a|
inline vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
inline vf vwhere_neg(vf a, vf x, vf y) {  // x where a < 0, else y
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, vzero(), _CMP_LT_OQ));
}
inline float vmax(vf a) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline void vround_store(vf a, int32_t* p) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_cvtps_epi32(a));
}
inline vf wload(const float* p) { return _mm256_loadu_ps(p); }
inline vf wload(const c10::BFloat16* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline vf wload(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
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
inline float to_f(c10::Half v) { return static_cast<float>(v); }

// -- float-weight tiles ---------------------------------------------------------------------
// sums[m * RT + r] = Σ_k x[m, k] · W[r, k] for m < MBv, r < R. The R rows are read one after
// another, so each thread reads its weights as one sequential stream, which the CPU's stream
// prefetchers follow (R rows read side by side are R short streams: 0.7x the bandwidth,
// measured on an AMD EPYC; on an Intel CPU a decode step's rows read several tiles at once,
// over_tile_streams); two accumulators per activation row hide the FMA latency.
template <int MBv, typename W>
inline void dot_tile(int R, const float* x, int64_t ldx, const W* w, int64_t ldw, int64_t K,
                     float* sums) {
  for (int r = 0; r < R; ++r) {
    const W* wr = w + r * ldw;
    vf a0[MBv], a1[MBv];
    for (int m = 0; m < MBv; ++m) a0[m] = a1[m] = vzero();
    int64_t k = 0;
    for (; k + 2 * VL <= K; k += 2 * VL) {
      if (PF && (k * static_cast<int64_t>(sizeof(W))) % 64 == 0)
        _mm_prefetch(reinterpret_cast<const char*>(wr + k) + PF, PF_HINT);
      const vf w0 = wload(wr + k), w1 = wload(wr + k + VL);
      for (int m = 0; m < MBv; ++m) {
        a0[m] = vfma(w0, vload(x + m * ldx + k), a0[m]);
        a1[m] = vfma(w1, vload(x + m * ldx + k + VL), a1[m]);
      }
    }
    if (k + VL <= K) {
      const vf w0 = wload(wr + k);
      for (int m = 0; m < MBv; ++m) a0[m] = vfma(w0, vload(x + m * ldx + k), a0[m]);
      k += VL;
    }
    for (int m = 0; m < MBv; ++m) {
      float s = vsum(vadd(a0[m], a1[m]));
      for (int64_t t = k; t < K; ++t) s += x[m * ldx + t] * to_f(wr[t]);
      sums[m * RT + r] = s;
    }
  }
}

constexpr int MB = 4;  // activation rows per group (bf16 and int8 tiles)
// Activation rows per group of float-weight products: 8 with AVX-512's 32 vector registers
// (dot_tile<8> keeps 16 accumulators live), 4 with AVX2's 16. A verify step's 5 to 9 rows
// then read the weights once or twice, not two or three times.
constexpr int MBF = VL == 16 ? 8 : 4;

template <typename W>
inline void dot_group(int mb, int R, const float* x, int64_t ldx, const W* w, int64_t ldw,
                      int64_t K, float* sums) {
  switch (mb) {
    case 4: return dot_tile<4>(R, x, ldx, w, ldw, K, sums);
    case 3: return dot_tile<3>(R, x, ldx, w, ldw, K, sums);
    case 2: return dot_tile<2>(R, x, ldx, w, ldw, K, sums);
    default: return dot_tile<1>(R, x, ldx, w, ldw, K, sums);
  }
}

// Groups of 5 to 8 rows (AVX-512), out of line: compiled into float_rows beside the smaller
// tiles, they cost the 2- and 3-row tiles 15-25% (GCC 12, AMD EPYC Zen 4).
template <typename W>
__attribute__((noinline)) void wide_group(int mb, int R, const float* x, int64_t ldx,
                                          const W* w, int64_t ldw, int64_t K, float* sums) {
  switch (mb) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
    case 8: return dot_tile<8>(R, x, ldx, w, ldw, K, sums);
    case 7: return dot_tile<7>(R, x, ldx, w, ldw, K, sums);
    case 6: return dot_tile<6>(R, x, ldx, w, ldw, K, sums);
    case 5: return dot_tile<5>(R, x, ldx, w, ldw, K, sums);
#endif
    default: return dot_group(mb, R, x, ldx, w, ldw, K, sums);
  }
}

// out[m, n] = sums · scale[n] + bias[n]; scale and bias may be null. Both: one fused
// multiply-add, written out (the compiler may fuse a product and a sum in one inlined copy and
// not in another, and a row's bits would hang on its caller).
inline void store(const float* sums, int mb, int R, int64_t n0, const float* scale,
                  const float* bias, float* out, int64_t ldo) {
  for (int m = 0; m < mb; ++m)
    for (int r = 0; r < R; ++r) {
      float v = sums[m * RT + r];
      if (scale && bias) v = std::fma(v, scale[n0 + r], bias[n0 + r]);
      else if (scale) v *= scale[n0 + r];
      else if (bias) v += bias[n0 + r];
      out[m * ldo + n0 + r] = v;
    }
}

// One weight matrix of a call: several (q, k, v; gate, up) share the activations and one
// parallel region.
struct Mat {
  const void* w;
  int64_t ldw, N;
  const float* scale;  // per-row scale (int8), group scales (int4 rows) or null
  const float* bias;   // or null
  float* out;          // [M, N]
  const uint16_t* scale16 = nullptr;  // int4 in 16-row tiles (q4t_tiles): their fp16 scales
};

// A tile of a product: its matrix, first row and row count.
struct TileRef {
  const Mat* mat;
  int64_t n0;
  int R;
};

// The row tiles of every matrix of a call, numbered across the matrices.
struct TileIndex {
  const std::vector<Mat>& mats;
  std::vector<int64_t> first;  // first tile of each matrix, then the count
  int64_t grain;               // tiles a piece takes at least
  TileIndex(const std::vector<Mat>& m, int64_t K) : mats(m), first(m.size() + 1, 0) {
    for (size_t i = 0; i < m.size(); ++i) first[i + 1] = first[i] + (m[i].N + RT - 1) / RT;
    // a piece under ~32K weights costs a thread more to start than it saves
    grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, RT * K));
  }
  int64_t count() const { return first.back(); }
  TileRef at(int64_t t) const {
    size_t i = 0;
    while (t >= first[i + 1]) ++i;
    const int64_t n0 = (t - first[i]) * RT;
    return TileRef{&mats[i], n0, static_cast<int>(std::min<int64_t>(RT, mats[i].N - n0))};
  }
};

// Row tiles of every matrix split over torch's threads; each thread streams a contiguous
// slice of the weights. A decode step's few rows share the work through work_share.h; a
// prefill's many (`team`) through torch's own OpenMP team, whose threads are the ones the
// step's torch ops (attention, norms) just used: a second pool's threads would meet them
// still spinning for the cores (int8 prefill 0.8x on 2 cores).
template <typename Body>
inline void over_tiles(const std::vector<Mat>& mats, int64_t K, Body body, bool team = false) {
  const TileIndex index(mats, K);
  const auto tiles = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const TileRef tile = index.at(t);
      body(*tile.mat, tile.n0, tile.R);
    }
  };
  if (team) at::parallel_for(0, index.count(), index.grain, tiles);
  else work_share::parallel(index.count(), index.grain, tiles);
}

// Read streams a thread's piece of a decode product is cut into (over_tile_streams), at most:
// 8 on an Intel CPU, whose L2 stream prefetcher keeps more lines in flight for several
// streams than for one (a streaming read of 256 KB-4 MB matrices in 16 pieces over 2
// threads, each piece read as 4 runs taken a 256-byte turn each: 1.25-1.35x the bytes per
// second of one run with a 2 KB software prefetch, Xeon Ice Lake, 2 vCPUs), 1 elsewhere (not
// measured: an AMD EPYC read 4 adjacent rows side by side at 0.5-0.6x). A product takes as
// many as its accumulators allow: 8 for one fp32 row, 4 or 2 otherwise.
constexpr int kMaxStreams = 8;
int cpu_streams() {
  __builtin_cpu_init();
  return __builtin_cpu_is("intel") ? kMaxStreams : 1;
}
std::atomic<int> g_streams{cpu_streams()};  // set_streams changes it (tests: every count)
inline int streams() { return g_streams.load(std::memory_order_relaxed); }

inline int most_rows(const TileRef* tiles, int n) {
  int rows = 0;
  for (int s = 0; s < n; ++s) rows = std::max(rows, tiles[s].R);
  return rows;
}

// Row r of each of n tiles that has one: its weights wr[k] and result slot out[k] (sums[s] +
// r); returns k, how many.
template <typename W>
inline int row_of_each(int r, int n, const TileRef* tiles, float* const* sums, const W** wr,
                       float** out) {
  int k = 0;
  for (int s = 0; s < n; ++s)
    if (r < tiles[s].R) {
      const Mat& mat = *tiles[s].mat;
      wr[k] = static_cast<const W*>(mat.w) + (tiles[s].n0 + r) * mat.ldw;
      out[k++] = sums[s] + r;
    }
  return k;
}

// The piece t0 .. t1 of `index` (fewer than S tiles) as up to S runs of consecutive rows (as
// equal as can be), each the one or two tiles (parts of tiles, within one matrix) its rows
// lie in: a run holds at most RT rows (fewer than S tiles of RT rows in S runs), so it meets
// at most two tiles. lists[r][0 .. len[r]); returns the number of runs.
inline int row_runs(const TileIndex& index, int64_t t0, int64_t t1, int S, TileRef (*lists)[2],
                    int* len) {
  int64_t rows = 0;
  for (int64_t t = t0; t < t1; ++t) rows += index.at(t).R;
  const int runs = static_cast<int>(std::min<int64_t>(S, rows));
  int64_t t = t0, used = 0;  // rows of tile t already in earlier runs
  TileRef tile = index.at(t);
  for (int r = 0; r < runs; ++r) {
    int64_t want = rows / runs + (r < rows % runs);
    len[r] = 0;
    while (want > 0) {
      if (used == tile.R) {
        tile = index.at(++t);
        used = 0;
      }
      const int take = static_cast<int>(std::min<int64_t>(want, tile.R - used));
      lists[r][len[r]++] = TileRef{tile.mat, tile.n0 + used, take};
      used += take;
      want -= take;
    }
  }
  return runs;
}

// The tiles of every matrix in over_tiles' pieces, each piece cut into up to S runs of
// consecutive tiles (as equal as can be) read together: body(tiles, n) gets the j-th tile
// of each run still holding one (n <= S), so a thread reads S streams of weights at once. A
// piece of fewer tiles than S is cut into runs of rows instead where the weights are rows
// (`rows`; not int4 tiles): 768-row products take 3 tiles a piece in 16 pieces, and read as 3
// streams ran at 0.9x the bytes per second of the larger products (125m, one fp32 row).
template <typename Body>
inline void over_tile_streams(const std::vector<Mat>& mats, int64_t K, int S, Body body,
                              bool rows = true) {
  const TileIndex index(mats, K);
  work_share::parallel(index.count(), index.grain, [&](int64_t t0, int64_t t1) {
    const int64_t L = t1 - t0;  // pieces are never empty
    TileRef set[kMaxStreams];
    if (rows && L < S) {
      TileRef lists[kMaxStreams][2];
      int len[kMaxStreams];
      const int runs = row_runs(index, t0, t1, S, lists, len);
      const int most = *std::max_element(len, len + runs);
      for (int j = 0; j < most; ++j) {
        int n = 0;
        for (int r = 0; r < runs; ++r)
          if (j < len[r]) set[n++] = lists[r][j];
        body(set, n);
      }
      return;
    }
    const int64_t runs = std::min<int64_t>(S, L);
    const int64_t base = L / runs, extra = L % runs;  // the first `extra` runs hold one more
    for (int64_t j = 0; j < base + (extra > 0); ++j) {
      int n = 0;
      for (int64_t r = 0, start = t0; r < runs; start += base + (r < extra), ++r)
        if (j < base + (r < extra)) set[n++] = index.at(start + j);
      body(set, n);
    }
  });
}

// store() of the sums of n tiles (sums[s]) for activation rows [m0, m0 + mb).
inline void store_tiles(float* const* sums, int n, const TileRef* tiles, int mb, int64_t m0) {
  for (int s = 0; s < n; ++s) {
    const Mat& mat = *tiles[s].mat;
    store(sums[s], mb, tiles[s].R, tiles[s].n0, mat.scale, mat.bias, mat.out + m0 * mat.N,
          mat.N);
  }
}

// Activation rows [0, M) in groups of near equal size, at most `most` rows each (9 rows in
// groups of up to 8 are 5 + 4, not 8 + 1): body(m0, mb) for each group in order.
template <typename Body>
inline void near_equal_groups(int64_t M, int most, Body body) {
  const int64_t groups = (M + most - 1) / most;
  for (int64_t g = 0, m0 = 0; g < groups; ++g) {
    const int mb = static_cast<int>(M / groups + (g < M % groups));
    body(m0, mb);
    m0 += mb;
  }
}

// One tile of a float-weight product, every activation row: groups of near equal size (9
// rows are 5 + 4, not 8 + 1). Out of line: inlined into over_tiles' lambda, the 2- and 3-row
// tiles ran 15-25% slower (GCC 12, AMD EPYC Zen 4).
template <typename W>
__attribute__((noinline)) void float_rows(const Mat& mat, int64_t n0, int R, const float* x,
                                          int64_t M, int64_t K) {
  float sums[MBF * RT];
  const W* w = static_cast<const W*>(mat.w) + n0 * mat.ldw;
  near_equal_groups(M, MBF, [&](int64_t m0, int mb) {
    if (mb > MB) wide_group(mb, R, x + m0 * K, K, w, mat.ldw, K, sums);
    else dot_group(mb, R, x + m0 * K, K, w, mat.ldw, K, sums);
    store(sums, mb, R, n0, mat.scale, mat.bias, mat.out + m0 * mat.N, mat.N);
  });
}

// S weight rows (anywhere: wr[s]) against activation rows [0, MBv): out[s][m · RT], each
// row's sum the sequence dot_tile gives it (two accumulators over 2·VL steps, one VL step,
// the tail), so a row's result does not depend on which rows share its pass.
template <int MBv, int S, typename W>
__attribute__((noinline)) void dot_streams(const float* x, int64_t ldx, const W* const* wr,
                                           int64_t K, float* const* out) {
  vf a0[MBv][S], a1[MBv][S];
  for (int m = 0; m < MBv; ++m)
    for (int i = 0; i < S; ++i) a0[m][i] = a1[m][i] = vzero();
  int64_t k = 0;
  for (; k + 2 * VL <= K; k += 2 * VL) {
    vf x0[MBv], x1[MBv];
    for (int m = 0; m < MBv; ++m) {
      x0[m] = vload(x + m * ldx + k);
      x1[m] = vload(x + m * ldx + k + VL);
    }
    for (int i = 0; i < S; ++i) {
      if constexpr (sizeof(W) * 2 * VL >= 64)  // once a cache line
        for (int l = 0; l < static_cast<int>(sizeof(W) * 2 * VL / 64); ++l)
          _mm_prefetch(reinterpret_cast<const char*>(wr[i] + k) + 64 * l + FPF, _MM_HINT_T0);
      const vf w0 = wload(wr[i] + k), w1 = wload(wr[i] + k + VL);
      for (int m = 0; m < MBv; ++m) {
        a0[m][i] = vfma(w0, x0[m], a0[m][i]);
        a1[m][i] = vfma(w1, x1[m], a1[m][i]);
      }
    }
  }
  if (k + VL <= K) {
    for (int i = 0; i < S; ++i) {
      const vf w0 = wload(wr[i] + k);
      for (int m = 0; m < MBv; ++m) a0[m][i] = vfma(w0, vload(x + m * ldx + k), a0[m][i]);
    }
    k += VL;
  }
  for (int m = 0; m < MBv; ++m)
    for (int i = 0; i < S; ++i) {
      float s = vsum(vadd(a0[m][i], a1[m][i]));
      for (int64_t t = k; t < K; ++t) s += x[m * ldx + t] * to_f(wr[i][t]);
      out[i][m * RT] = s;
    }
}

// Tiles a float-weight decode pass reads together, for mb activation rows: one row, all the
// streams; up to 4 rows, up to 4 (4 rows against 4 streams spill accumulators, and still read
// 1.38x the bytes per second of 2 streams, 12 layers of the 125m shape, 2 threads, Xeon Ice
// Lake); beyond, one tile at a time (float_rows).
inline int float_streams_for(int64_t mb) {
  return mb == 1 ? streams() : mb <= 4 ? std::min(4, streams()) : 1;
}

template <int MBv, typename W>
inline void dot_streams_n(int n, const float* x, int64_t ldx, const W* const* wr, int64_t K,
                          float* const* out) {
  switch (n) {
    case 8: if constexpr (MBv == 1) return dot_streams<1, 8>(x, ldx, wr, K, out); break;
    case 7: if constexpr (MBv == 1) return dot_streams<1, 7>(x, ldx, wr, K, out); break;
    case 6: if constexpr (MBv == 1) return dot_streams<1, 6>(x, ldx, wr, K, out); break;
    case 5: if constexpr (MBv == 1) return dot_streams<1, 5>(x, ldx, wr, K, out); break;
    case 4: return dot_streams<MBv, 4>(x, ldx, wr, K, out);
    case 3: return dot_streams<MBv, 3>(x, ldx, wr, K, out);
    case 2: return dot_streams<MBv, 2>(x, ldx, wr, K, out);
    default: return dot_streams<MBv, 1>(x, ldx, wr, K, out);
  }
  TORCH_CHECK(false, "dot_streams: ", n, " rows with ", MBv, " activation rows");
}

// n tiles (over_tile_streams) against activation rows [0, mb), mb <= 4, a row of each at a
// time: sums[s][m · RT + r].
template <typename W>
void float_streams(int mb, int n, const TileRef* tiles, const float* x, int64_t K,
                   float* const* sums) {
  for (int r = 0, rows = most_rows(tiles, n); r < rows; ++r) {
    const W* wr[kMaxStreams];
    float* out[kMaxStreams];
    const int k = row_of_each(r, n, tiles, sums, wr, out);
    switch (mb) {
      case 4: dot_streams_n<4>(k, x, K, wr, K, out); break;
      case 3: dot_streams_n<3>(k, x, K, wr, K, out); break;
      case 2: dot_streams_n<2>(k, x, K, wr, K, out); break;
      default: dot_streams_n<1>(k, x, K, wr, K, out);
    }
  }
}

template <typename W>
void gemv_float_weights(const float* x, int64_t M, int64_t K, const std::vector<Mat>& mats) {
  if (float_streams_for(M) > 1) {  // a decode step's rows: several tiles a pass
    over_tile_streams(mats, K, float_streams_for(M), [&](const TileRef* tiles, int n) {
      float sums[kMaxStreams][MB * RT];
      float* out[kMaxStreams];
      for (int s = 0; s < kMaxStreams; ++s) out[s] = sums[s];
      float_streams<W>(static_cast<int>(M), n, tiles, x, K, out);
      store_tiles(out, n, tiles, static_cast<int>(M), 0);
    });
    return;
  }
  over_tiles(mats, K,
             [&](const Mat& mat, int64_t n0, int R) { float_rows<W>(mat, n0, R, x, M, K); });
}

// -- bf16 × bf16 (AVX512-BF16) --------------------------------------------------------------
// bf16 activations against bf16 weights with vdpbf16ps: 32 products of bf16 pairs per
// instruction, accumulated in fp32 (torch's bf16 GEMM keeps the same fp32 accumulator).
#if defined(__AVX512BF16__)
constexpr bool kBf16Dot = true;
// Two accumulators a row (steps of 64 pairs, then one of 32, then the scalar tail), where one
// chain of vdpbf16ps waited its latency each step, and groups of up to 4 activation rows
// (gemv_bf16_dot; 2 before). Each row's sum is that sequence whatever rows share its tile;
// one row alone takes it in 256-bit halves (bf16_one). A step's weights are asked for 1 KB
// ahead. 125m bf16, 2 cores, AMD EPYC Zen 4, engine tg128, interleaved rounds: one request
// 1.06x, 4 requests 1.08x the steps per second of one accumulator in pairs of rows, then the
// prefetch 1.25x of none (2 KB 1.19x; one row 1.02x, so bf16_one reads without).
template <int MBv, int R>
inline void bf16_tile(const c10::BFloat16* x, int64_t ldx, const c10::BFloat16* w, int64_t ldw,
                      int64_t K, float* sums) {
  static_assert(MBv >= 2, "one activation row: bf16_one");
  __m512 a0[MBv][R], a1[MBv][R];
  for (int m = 0; m < MBv; ++m)
    for (int r = 0; r < R; ++r) a0[m][r] = a1[m][r] = _mm512_setzero_ps();
  const auto pairs = [](const c10::BFloat16* p) { return (__m512bh)_mm512_loadu_si512(p); };
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    __m512bh x0[MBv], x1[MBv];
    for (int m = 0; m < MBv; ++m) {
      x0[m] = pairs(x + m * ldx + k);
      x1[m] = pairs(x + m * ldx + k + 32);
    }
    for (int r = 0; r < R; ++r) {
      for (int l = 0; l < 2; ++l)  // both lines of the step's weights, 1 KB ahead (above)
        _mm_prefetch(reinterpret_cast<const char*>(w + r * ldw + k) + 64 * l + 1024, _MM_HINT_T0);
      const __m512bh w0 = pairs(w + r * ldw + k), w1 = pairs(w + r * ldw + k + 32);
      for (int m = 0; m < MBv; ++m) {
        a0[m][r] = _mm512_dpbf16_ps(a0[m][r], x0[m], w0);
        a1[m][r] = _mm512_dpbf16_ps(a1[m][r], x1[m], w1);
      }
    }
  }
  if (k + 32 <= K) {
    for (int r = 0; r < R; ++r) {
      const __m512bh w0 = pairs(w + r * ldw + k);
      for (int m = 0; m < MBv; ++m) a0[m][r] = _mm512_dpbf16_ps(a0[m][r], pairs(x + m * ldx + k), w0);
    }
    k += 32;
  }
  for (int m = 0; m < MBv; ++m)
    for (int r = 0; r < R; ++r) {
      float s = _mm512_reduce_add_ps(_mm512_add_ps(a0[m][r], a1[m][r]));
      for (int64_t t = k; t < K; ++t)
        s += static_cast<float>(x[m * ldx + t]) * static_cast<float>(w[r * ldw + t]);
      sums[m * RT + r] = s;
    }
}

// The sum bf16_tile gives each of its rows, for one activation row, in 256-bit halves of its
// vectors: each lane takes the same products and additions, so the bits are the tile's (a row
// alone gets what it gets in a group). One request's decode, 125m bf16, 2 cores of an AMD
// EPYC Zen 4, engine tg128 in interleaved rounds: 1.06-1.09x the steps per second of the
// 512-bit tile (its weights read as fp32 through the float tiles: 1.03-1.12x, other bits).
inline void bf16_one(const c10::BFloat16* x, const c10::BFloat16* w, int64_t K, float* sums) {
  __m256 a0l = _mm256_setzero_ps(), a0h = a0l, a1l = a0l, a1h = a0l;
  const auto pairs = [](const c10::BFloat16* p) {
    return (__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  };
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    a0l = _mm256_dpbf16_ps(a0l, pairs(x + k), pairs(w + k));
    a0h = _mm256_dpbf16_ps(a0h, pairs(x + k + 16), pairs(w + k + 16));
    a1l = _mm256_dpbf16_ps(a1l, pairs(x + k + 32), pairs(w + k + 32));
    a1h = _mm256_dpbf16_ps(a1h, pairs(x + k + 48), pairs(w + k + 48));
  }
  if (k + 32 <= K) {
    a0l = _mm256_dpbf16_ps(a0l, pairs(x + k), pairs(w + k));
    a0h = _mm256_dpbf16_ps(a0h, pairs(x + k + 16), pairs(w + k + 16));
    k += 32;
  }
  const auto whole = [](__m256 l, __m256 h) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(l), h, 1);
  };
  float s = _mm512_reduce_add_ps(_mm512_add_ps(whole(a0l, a0h), whole(a1l, a1h)));
  for (; k < K; ++k) s += static_cast<float>(x[k]) * static_cast<float>(w[k]);
  sums[0] = s;
}

// R rows one after another (a sequential stream, as dot_tile reads them).
template <int MBv>
inline void bf16_rows(int R, const c10::BFloat16* x, int64_t ldx, const c10::BFloat16* w,
                      int64_t ldw, int64_t K, float* sums) {
  for (int r = 0; r < R; ++r)
    if constexpr (MBv == 1) bf16_one(x, w + r * ldw, K, sums + r);
    else bf16_tile<MBv, 1>(x, ldx, w + r * ldw, ldw, K, sums + r);
}

void gemv_bf16_dot(const c10::BFloat16* x, int64_t M, int64_t K, const std::vector<Mat>& mats) {
  over_tiles(mats, K, [&](const Mat& mat, int64_t n0, int R) {
    float sums[MB * RT];
    const c10::BFloat16* w = static_cast<const c10::BFloat16*>(mat.w) + n0 * mat.ldw;
    // up to 4 rows a group (a tile's weights read once for 4 requests)
    near_equal_groups(M, 4, [&](int64_t m0, int mb) {
      switch (mb) {
        case 4: bf16_rows<4>(R, x + m0 * K, K, w, mat.ldw, K, sums); break;
        case 3: bf16_rows<3>(R, x + m0 * K, K, w, mat.ldw, K, sums); break;
        case 2: bf16_rows<2>(R, x + m0 * K, K, w, mat.ldw, K, sums); break;
        default: bf16_rows<1>(R, x + m0 * K, K, w, mat.ldw, K, sums);
      }
      store(sums, mb, R, n0, mat.scale, mat.bias, mat.out + m0 * mat.N, mat.N);
    });
  });
}
#else
constexpr bool kBf16Dot = false;
#endif

// int4 groups (gemv_q4): G4 values along K share a scale; a weight vector holds Q4S / G4 of
// them, 2 in 256 bits and 4 in 512 (q4_span).
constexpr int64_t G4 = 32;
constexpr int Q4S = VL == 16 ? 4 * G4 : 2 * G4;
constexpr int Q4T = 16;  // rows of a tile of int4 weights in tiles (q4t_tiles)

// -- int8 × int8 (quantized activations) ----------------------------------------------------
// Activations per row m and block b of QK values: s = max|x| / 127, xq = round(x / s) (int8,
// ties to even), zero-padded to whole blocks. The dot of a weight row q with them is
//   Σ_b s_b · Σ_{k∈b} q_k · xq_k.
struct QuantAct {
  std::vector<int8_t> q;   // [M, Kp]
  std::vector<float> s;    // [M, nb]
  std::vector<float> c;    // [M] correction (VNNI): 128 · Σ_b s_b · Σ_{k∈b} xq_k
  std::vector<uint8_t> a;  // [M, Kp] |xq| (AVX2 sign trick)
  std::vector<int32_t> c8;  // [M, Kp / 8] the int4 offsets of gemv_q4's lanes (q4_span)
  int64_t Kp = 0, nb = 0;
};

// One block of n <= QK values (zero-padded to QK in `buf`): its scale, int8 values, their sum.
inline float quantize_block(const float* x, int64_t n, int8_t* q, int32_t& qsum) {
  alignas(64) float buf[QK];
  const float* v = x;
  if (n < QK) {
    std::memset(buf, 0, sizeof buf);
    std::memcpy(buf, x, static_cast<size_t>(n) * sizeof(float));
    v = buf;
  }
  vf am = vzero();
  for (int i = 0; i < QK; i += VL) am = vmaxabs(am, vload(v + i));
  const float amax = vmax(am);
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  alignas(64) int32_t iv[QK];
  for (int i = 0; i < QK; i += VL) vround_store(vmul(vload(v + i), vset1(inv)), iv + i);
  int32_t sum = 0;
  for (int i = 0; i < QK; ++i) {
    q[i] = static_cast<int8_t>(iv[i]);  // |x / s| <= 127 by construction
    sum += iv[i];
  }
  qsum = sum;
  return amax / 127.f;
}

void quantize_act(const float* x, int64_t M, int64_t K, QuantAct& qa, bool magnitudes = !kVnni,
                  bool pairs = false) {
  qa.nb = (K + QK - 1) / QK;
  qa.Kp = qa.nb * QK;
  qa.q.resize(M * qa.Kp);
  qa.s.resize(M * qa.nb);
  qa.c.resize(M);
  qa.a.resize(M * qa.Kp);
  if (pairs) qa.c8.resize(M * (qa.Kp / 8));
  for (int64_t m = 0; m < M; ++m) {
    double corr = 0;
    for (int64_t b = 0; b < qa.nb; ++b) {
      const int64_t k0 = b * QK;
      int32_t qsum = 0;
      const float s = quantize_block(x + m * K + k0, std::min<int64_t>(QK, K - k0),
                                     qa.q.data() + m * qa.Kp + k0, qsum);
      qa.s[m * qa.nb + b] = s;
      corr += static_cast<double>(s) * qsum;
    }
    qa.c[m] = static_cast<float>(128.0 * corr);
    if (magnitudes)
      for (int64_t k = 0; k < qa.Kp; ++k) {
        const int8_t v = qa.q[m * qa.Kp + k];
        qa.a[m * qa.Kp + k] = static_cast<uint8_t>(v < 0 ? -v : v);
      }
    if (pairs) {  // gemv_q4's layout: see q4_span
      int8_t* v = qa.q.data() + m * qa.Kp;
      int32_t* c8 = qa.c8.data() + m * (qa.Kp / 8);
      for (int64_t p = 0; p < qa.Kp / Q4S; ++p, v += Q4S, c8 += Q4S / 8) {
        int8_t t[Q4S];
        for (int g = 0; g < Q4S / G4; ++g) {
          std::memcpy(t + 16 * g, v + G4 * g, 16);
          std::memcpy(t + Q4S / 2 + 16 * g, v + G4 * g + 16, 16);
        }
        std::memcpy(v, t, Q4S);
        for (int i = 0; i < Q4S / 8; ++i) {
          int32_t sum = 0;
          for (int j = 0; j < 4; ++j) sum += v[4 * i + j] + v[Q4S / 2 + 4 * i + j];
          c8[i] = -8 * sum;
        }
      }
    }
  }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// Whether q8_block asks for its weights QPF bytes ahead: not on an AMD CPU (Zen 4 is the first
// with AVX-512), whose hardware prefetchers follow a row's stream better alone (125m int8,
// one request, 2 cores, AMD EPYC Zen 4, 8 interleaved rounds: engine tg128 1.07x with none,
// the 1b shape 1.04x; 512 bytes ahead 1.01x, 4096 1.03x).
bool q8_prefetch() {
  __builtin_cpu_init();
  return QPF > 0 && !__builtin_cpu_is("amd");
}
const bool g_q8_prefetch = q8_prefetch();

// (q ^ 0x80) is q + 128 as an unsigned byte, so vpdpbusd (u8 × s8) gives Σ (q + 128) · xq; the
// 128 · Σ xq part is the same for every weight row and is taken off once (QuantAct::c).
template <int MBv, int R, bool MASKED>
inline void q8_block(const int8_t* const* xr, const float* const* sr, const int8_t* const* wr,
                     int64_t b, int64_t K, __m512 (&accf)[MBv][R]) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i acci[MBv][R];
  for (int j = 0; j < QK / 64; ++j) {
    const int64_t k = b * QK + j * 64;
    __mmask64 mask = ~0ULL;
    if (MASKED) mask = K - k >= 64 ? ~0ULL : K - k <= 0 ? 0ULL : ((1ULL << (K - k)) - 1);
    __m512i xv[MBv];
    for (int m = 0; m < MBv; ++m) xv[m] = _mm512_loadu_si512(xr[m] + k);
    for (int r = 0; r < R; ++r) {
      if (g_q8_prefetch) _mm_prefetch(reinterpret_cast<const char*>(wr[r] + k + QPF), _MM_HINT_T0);
      const __m512i wv = _mm512_xor_si512(
          MASKED ? _mm512_maskz_loadu_epi8(mask, wr[r] + k) : _mm512_loadu_si512(wr[r] + k), flip);
      for (int m = 0; m < MBv; ++m)
        acci[m][r] = _mm512_dpbusd_epi32(j == 0 ? _mm512_setzero_si512() : acci[m][r], wv, xv[m]);
    }
  }
  for (int m = 0; m < MBv; ++m) {
    const __m512 s = _mm512_set1_ps(sr[m][b]);
    for (int r = 0; r < R; ++r)
      accf[m][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acci[m][r]), s, accf[m][r]);
  }
}

// R weight rows (anywhere: wr[r]) against activation rows [m0, m0 + MBv):
// out[r][m · RT]. Each row's arithmetic is one sequence whatever rows share its tile.
template <int MBv, int R>
__attribute__((noinline)) void q8_tile_rows(const QuantAct& qa, int64_t m0,
                                            const int8_t* const* wr, int64_t K,
                                            float* const* out) {
  const int8_t* xr[MBv];
  const float* sr[MBv];
  for (int m = 0; m < MBv; ++m) {
    xr[m] = qa.q.data() + (m0 + m) * qa.Kp;
    sr[m] = qa.s.data() + (m0 + m) * qa.nb;
  }
  __m512 accf[MBv][R];
  for (int m = 0; m < MBv; ++m)
    for (int r = 0; r < R; ++r) accf[m][r] = _mm512_setzero_ps();
  const int64_t full = K / QK;
  for (int64_t b = 0; b < full; ++b) q8_block<MBv, R, false>(xr, sr, wr, b, K, accf);
  if (full < qa.nb) q8_block<MBv, R, true>(xr, sr, wr, full, K, accf);
  for (int m = 0; m < MBv; ++m)
    for (int r = 0; r < R; ++r)
      out[r][m * RT] = _mm512_reduce_add_ps(accf[m][r]) - qa.c[m0 + m];
}

template <int MBv, int R>
inline void q8_tile(const QuantAct& qa, int64_t m0, const int8_t* w, int64_t ldw, int64_t K,
                    float* sums) {
  const int8_t* wr[R];
  float* out[R];
  for (int r = 0; r < R; ++r) {
    wr[r] = w + r * ldw;
    out[r] = sums + r;
  }
  q8_tile_rows<MBv, R>(qa, m0, wr, K, out);
}

template <int MBv>
inline void q8_stream_rows(int n, const QuantAct& qa, int64_t m0, const int8_t* const* wr,
                           int64_t K, float* const* out) {
  switch (n) {
    case 4: return q8_tile_rows<MBv, 4>(qa, m0, wr, K, out);
    case 3: return q8_tile_rows<MBv, 3>(qa, m0, wr, K, out);
    case 2: return q8_tile_rows<MBv, 2>(qa, m0, wr, K, out);
    default: return q8_tile_rows<MBv, 1>(qa, m0, wr, K, out);
  }
}

// n tiles (over_tile_streams) against activation rows [m0, m0 + mb), mb <= 2, read together
// a row of each at a time: sums[s][m · RT + r].
inline void q8_streams(int mb, int n, const TileRef* tiles, const QuantAct& qa, int64_t m0,
                       int64_t K, float* const* sums) {
  for (int r = 0, rows = most_rows(tiles, n); r < rows; ++r) {
    const int8_t* wr[4];
    float* out[4];
    const int k = row_of_each(r, n, tiles, sums, wr, out);
    if (mb == 2) q8_stream_rows<2>(k, qa, m0, wr, K, out);
    else q8_stream_rows<1>(k, qa, m0, wr, K, out);
  }
}
constexpr int MBQ = 2, MBP = 2;

// R rows one after another (a sequential stream, as dot_tile reads them), each against
// activation rows [m0, m0 + mb), mb <= 2.
inline void q8_rows(int mb, int R, const QuantAct& qa, int64_t m0, const int8_t* w,
                    int64_t ldw, int64_t K, float* sums, bool /*pairs*/) {
  for (int r = 0; r < R; ++r) {
    if (mb == 2) q8_tile<2, 1>(qa, m0, w + r * ldw, ldw, K, sums + r);
    else q8_tile<1, 1>(qa, m0, w + r * ldw, ldw, K, sums + r);
  }
}
#else
// AVX2: maddubs needs one unsigned side, so |xq| against q with xq's sign (llama.cpp's
// trick); |q|, |xq| <= 127 keeps the 16-bit pair sums from saturating. Also the path of an
// AVX-512 CPU without VNNI (Skylake-SP/X), whose vf is __m512: this code keeps its own
// 256-bit vectors and their horizontal sum (hsum256), never vsum(vf).
//
// A tile is R weight rows against MBv activation rows: each 32 weight bytes loaded once for
// the MBv rows, each 32 activation bytes once for the R rows (MBv = 4, R = 2: 8 exact int32
// dots from 6 loads). Per (activation row, weight row) the arithmetic is one sequence
// whatever the tile: the block's int32 lanes (exact), then accf += lanes · s_b in block
// order, then one horizontal sum — so a row's result never depends on its tile or batch.
template <int MBv, int R>
inline void q8_tile(const QuantAct& qa, int64_t m0, const int8_t* const* wr, int64_t nfull,
                    float* sums, int64_t lds) {
  const __m256i ones = _mm256_set1_epi16(1);
  const uint8_t* A[MBv];
  const int8_t* X[MBv];
  const float* S[MBv];
  for (int m = 0; m < MBv; ++m) {
    A[m] = qa.a.data() + (m0 + m) * qa.Kp;
    X[m] = qa.q.data() + (m0 + m) * qa.Kp;
    S[m] = qa.s.data() + (m0 + m) * qa.nb;
  }
  __m256 accf[MBv][R];
  for (int m = 0; m < MBv; ++m)
    for (int r = 0; r < R; ++r) accf[m][r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < qa.nb; ++b) {
    // the last block of a K that is no multiple of QK reads zero-padded copies (wr[R + r])
    const int8_t* const* w = b < nfull ? wr : wr + R;
    const int64_t wo = b < nfull ? b * QK : 0;
    __m256i acc[MBv][R];
    for (int j = 0; j < QK / 32; ++j) {
      const int64_t k = b * QK + j * 32;
      if (QPF && (j & 1) == 0)  // once a cache line
        for (int r = 0; r < R; ++r)
          _mm_prefetch(reinterpret_cast<const char*>(w[r] + wo + j * 32) + QPF, _MM_HINT_T0);
      __m256i wv[R];
      for (int r = 0; r < R; ++r)
        wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + wo + j * 32));
      for (int m = 0; m < MBv; ++m) {
        const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(A[m] + k));
        const __m256i xs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(X[m] + k));
        for (int r = 0; r < R; ++r) {
          const __m256i d =
              _mm256_madd_epi16(_mm256_maddubs_epi16(av, _mm256_sign_epi8(wv[r], xs)), ones);
          acc[m][r] = j == 0 ? d : _mm256_add_epi32(acc[m][r], d);
        }
      }
    }
    for (int m = 0; m < MBv; ++m) {
      const __m256 s = _mm256_set1_ps(S[m][b]);
      for (int r = 0; r < R; ++r)
        accf[m][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[m][r]), s, accf[m][r]);
    }
  }
  for (int m = 0; m < MBv; ++m)
    for (int r = 0; r < R; ++r) sums[m * lds + r] = hsum256(accf[m][r]);
}

// The R (<= 2) weight rows of a tile against activation rows [m0, m0 + mb), mb <= 4.
template <int R>
inline void q8_group(int mb, const QuantAct& qa, int64_t m0, const int8_t* const* wr,
                     int64_t nfull, float* sums) {
  switch (mb) {
    case 4: return q8_tile<4, R>(qa, m0, wr, nfull, sums, RT);
    case 3: return q8_tile<3, R>(qa, m0, wr, nfull, sums, RT);
    case 2: return q8_tile<2, R>(qa, m0, wr, nfull, sums, RT);
    default: return q8_tile<1, R>(qa, m0, wr, nfull, sums, RT);
  }
}
constexpr int MBQ = 4;
#ifndef ASTRAI_MBP
#define ASTRAI_MBP 4
#endif
constexpr int MBP = ASTRAI_MBP;  // activation rows per register tile of a prefill

// R rows of a weight tile against activation rows [m0, m0 + mb): with `pairs`, two weight
// rows at a time (the last alone), else one after another. Two rows read side by side are
// two short streams, which the hardware prefetchers follow worse than one: 0.6x the
// bandwidth of one row at a time with one activation row (AMD EPYC Zen 3, weights from
// memory), so pairs serve a prefill, whose weight tiles are reused by many activation rows.
// A short last block reads zero-padded copies of its weights.
#ifndef ASTRAI_RW
#define ASTRAI_RW 2
#endif
constexpr int RW = ASTRAI_RW;  // weight rows per register tile of a prefill
inline void q8_rows(int mb, int R, const QuantAct& qa, int64_t m0, const int8_t* w,
                    int64_t ldw, int64_t K, float* sums, bool pairs) {
  const int64_t nfull = K / QK;
  alignas(32) int8_t pad[RW][QK];
  int r = 0;
  if (pairs)
    for (; r + RW <= R; r += RW) {
      const int8_t* wr[2 * RW];
      for (int i = 0; i < RW; ++i) {
        wr[i] = w + (r + i) * ldw;
        wr[RW + i] = pad[i];
        if (nfull < qa.nb) {
          std::memset(pad[i], 0, QK);
          std::memcpy(pad[i], wr[i] + nfull * QK, static_cast<size_t>(K - nfull * QK));
        }
      }
      q8_group<RW>(mb, qa, m0, wr, nfull, sums + r);
    }
  for (; r < R; ++r) {
    const int8_t* one[2] = {w + r * ldw, pad[0]};
    if (nfull < qa.nb) {
      std::memset(pad[0], 0, QK);
      std::memcpy(pad[0], one[0] + nfull * QK, static_cast<size_t>(K - nfull * QK));
    }
    q8_group<1>(mb, qa, m0, one, nfull, sums + r);
  }
}
#endif

// Activation rows per pass over the weights of a product of many rows (a prefill): their
// quantized values (2·K bytes a row) stay in L2 while every weight tile meets them.
constexpr int64_t MC = 64;
// Products of more activation rows than this read their weights two rows at a time.
constexpr int64_t PAIRS_FROM = 4;
// Products of more activation rows than this (a prefill: a decode step has at most a few
// rows a request) run on torch's OpenMP team (over_tiles).
constexpr int64_t TEAM_FROM = 16;

#if defined(__AVX512F__) && defined(__AVX512BW__)
// -- many activation rows against int8 weights: one activation row per int32 lane -----------
// A prefill's product on the AVX-512 builds (more than TEAM_FROM rows). The activations,
// quantized as for gemv_q8 (natural order), are laid out 16 rows side by side, 4 values of a
// row per 32-bit lane, stored as xq + 128 (unsigned); a weight tile's rows are copied as
// signed int8 (int4 weights unpacked to v = u - 8), zero-padded to whole blocks. Then per
// weight row r, 16 activation rows and group g of G values (int4: 32 with scale d[r][g]; int8:
// a block of QK, the row's scale applied at the store), exact in int32:
//   Σ_k (xq_k + 128) · w_k - 128 · Σ_k w_k   (vpdpbusd, each 4 weight bytes broadcast)
// and acc += float(that) · s_b (· d_g), groups in order. Each (activation row, weight row)
// pair is a lane, so a group costs one conversion and one fma per 16 pairs (the per-row tiles
// above: one each), and a row's result never depends on the other rows of its batch.
constexpr int LN = 16;
static_assert(RT == 16, "lane_product stores a tile's 16 results of a row as one vector");
#ifndef ASTRAI_LR
#define ASTRAI_LR 4
#endif
#ifndef ASTRAI_LG
#define ASTRAI_LG 2
#endif
constexpr int LR = ASTRAI_LR;  // weight rows per register tile
constexpr int LG = ASTRAI_LG;  // groups of 16 activation rows per register tile

struct LaneAct {
  std::vector<uint8_t> x;  // [M / 16][Kp / 4][16 lanes][4]
  std::vector<float> s;    // [M / 16][nb][16 lanes]
  int64_t groups = 0, Kp = 0, nb = 0;
};

void lane_act(const QuantAct& qa, int64_t M, LaneAct& la) {
  la.groups = (M + LN - 1) / LN;
  la.Kp = qa.Kp;
  la.nb = qa.nb;
  la.x.assign(la.groups * qa.Kp * LN, 0x80);  // rows past M: xq = 0
  la.s.assign(la.groups * qa.nb * LN, 0.f);
  for (int64_t m = 0; m < M; ++m) {
    const int64_t j = m / LN, l = m % LN;
    const int8_t* q = qa.q.data() + m * qa.Kp;
    uint8_t* dst = la.x.data() + j * qa.Kp * LN + l * 4;
    for (int64_t c = 0; c < qa.Kp / 4; ++c)
      for (int i = 0; i < 4; ++i) dst[c * 64 + i] = static_cast<uint8_t>(q[4 * c + i] ^ 0x80);
    for (int64_t b = 0; b < qa.nb; ++b) la.s[(j * qa.nb + b) * LN + l] = qa.s[m * qa.nb + b];
  }
}

// acc + Σ over each lane's 4 bytes of x (unsigned) · the 4 weights at w (signed).
inline __m512i lane_dot(__m512i acc, __m512i x, const int8_t* w) {
  int32_t w4;
  std::memcpy(&w4, w, 4);
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(acc, x, _mm512_set1_epi32(w4));
#else  // int4 weights only: |w| <= 8 keeps maddubs' int16 pair sums from saturating
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(x, _mm512_set1_epi32(w4)),
                                                 _mm512_set1_epi16(1)));
#endif
}

// R weight rows (w: [R][Kp] int8, corr: [R][Kp / G] the -128 · Σ w of each group, d[r]: the
// row's group scales when SCALED) against the 16 · MG activation rows of lane groups
// [j0, j0 + MG), `ng` groups; out[(r · MG + j) · 16 + lane].
template <int R, int MG, int G, bool SCALED>
__attribute__((noinline)) void lane_tile(const LaneAct& la, int64_t j0, const int8_t* w,
                                         const int32_t* corr, const float* const* d,
                                         int64_t ng, float* out) {
  const int64_t Kp = la.Kp;
  __m512 f[R][MG];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < MG; ++j) f[r][j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < ng; ++g) {
    __m512i acc[R][MG];
    for (int r = 0; r < R; ++r) {
      const __m512i c0 = _mm512_set1_epi32(corr[r * (Kp / G) + g]);
      for (int j = 0; j < MG; ++j) acc[r][j] = c0;
    }
    const uint8_t* xg = la.x.data() + (j0 * Kp + g * G) * LN;
    for (int c = 0; c < G / 4; ++c) {
      __m512i xv[MG];
      for (int j = 0; j < MG; ++j) xv[j] = _mm512_loadu_si512(xg + j * Kp * LN + c * 64);
      for (int r = 0; r < R; ++r) {
        const int8_t* wp = w + r * Kp + g * G + 4 * c;
        for (int j = 0; j < MG; ++j) acc[r][j] = lane_dot(acc[r][j], xv[j], wp);
      }
    }
    const int64_t b = g * G / QK;
    for (int j = 0; j < MG; ++j) {
      const __m512 sb = _mm512_loadu_ps(la.s.data() + ((j0 + j) * la.nb + b) * LN);
      for (int r = 0; r < R; ++r) {
        const __m512 sc = SCALED ? _mm512_mul_ps(sb, _mm512_set1_ps(d[r][g])) : sb;
        f[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][j]), sc, f[r][j]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < MG; ++j) _mm512_storeu_ps(out + (r * MG + j) * LN, f[r][j]);
}

// Every matrix of `mats` against the M activation rows of `la`: tiles over torch's OpenMP
// team, each tile's rows copied to signed int8 by fill(mat, n0, R, dst [RT][Kp], Kp) first
// (int4 in tiles: by q4t_unpack, their scales with them).
void q4t_unpack(const Mat& mat, int64_t n0, int64_t K, int8_t* w, int64_t Kp, float* ds);

template <int G, bool SCALED, typename Fill>
void lane_product(const LaneAct& la, int64_t M, int64_t K, const std::vector<Mat>& mats,
                  Fill fill) {
  const int64_t Kp = la.Kp, ng = SCALED ? K / G : la.nb;
  over_tiles(mats, K, [&](const Mat& mat, int64_t n0, int R) {
    thread_local std::vector<int8_t> w_;  // thread_local: reached through __tls_get_addr,
    thread_local std::vector<int32_t> corr_;  // so once, by reference
    thread_local std::vector<float> tb_;
    std::vector<int8_t>& w = w_;
    std::vector<int32_t>& corr = corr_;
    std::vector<float>& tb = tb_;
    const int Rp = (R + LR - 1) / LR * LR;  // rows a register tile runs (padded ones zero)
    w.assign(static_cast<size_t>(Rp) * Kp, 0);
    corr.assign(static_cast<size_t>(Rp) * (Kp / G), 0);
    thread_local std::vector<float> ds_;
    std::vector<float>& ds = ds_;
    if (SCALED && mat.scale16) {  // int4 in tiles: R = Q4T
      ds.resize(static_cast<size_t>(Q4T) * (K / G));
      q4t_unpack(mat, n0, K, w.data(), Kp, ds.data());
    } else {
      fill(mat, n0, R, w.data(), Kp);
    }
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int r = 0; r < R; ++r)
      for (int64_t g = 0; g < Kp / G; ++g) {
        __m256i sum = _mm256_setzero_si256();  // Σ w of the group: 1 · w in pairs, then in 4s
        for (int k = 0; k < G; k += 32)
          sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(
                    ones8, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                               w.data() + r * Kp + g * G + k))), ones16));
        corr[r * (Kp / G) + g] = -128 * _mm512_reduce_add_epi32(_mm512_zextsi256_si512(sum));
      }
    const float* d[RT + LR];
    for (int r = 0; r < Rp; ++r)
      d[r] = !SCALED ? nullptr
             : mat.scale16 ? ds.data() + std::min(r, R - 1) * (K / G)
                           : mat.scale + (n0 + std::min(r, R - 1)) * (K / G);
    // the tile's results [M][RT] first, then one masked 16-float store per activation row:
    // stores straight into the output's columns touch a cache line each
    tb.resize(la.groups * LN * RT);
    float* const tp = tb.data();
    alignas(64) float res[LR * LG * LN];
    for (int64_t j0 = 0; j0 < la.groups;) {
      const int mg = la.groups - j0 >= LG ? LG : 1;
      for (int r0 = 0; r0 < R; r0 += LR) {
        const int8_t* wr = w.data() + r0 * Kp;
        const int32_t* cr = corr.data() + r0 * (Kp / G);
        if (mg == LG) lane_tile<LR, LG, G, SCALED>(la, j0, wr, cr, d + r0, ng, res);
        else lane_tile<LR, 1, G, SCALED>(la, j0, wr, cr, d + r0, ng, res);
        for (int r = 0; r < std::min(LR, R - r0); ++r)
          for (int j = 0; j < mg; ++j)
            for (int l = 0; l < LN; ++l)
              tp[((j0 + j) * LN + l) * RT + r0 + r] = res[(r * mg + j) * LN + l];
      }
      j0 += mg;
    }
    const __mmask16 mask = static_cast<__mmask16>((1u << R) - 1);
    const __m512 sc = SCALED || !mat.scale ? _mm512_set1_ps(1.f)
                                           : _mm512_maskz_loadu_ps(mask, mat.scale + n0);
    const __m512 bias = mat.bias ? _mm512_maskz_loadu_ps(mask, mat.bias + n0) : _mm512_setzero_ps();
    float* out = mat.out + n0;
    const int64_t N = mat.N;
    for (int64_t m = 0; m < M; ++m)
      _mm512_mask_storeu_ps(out + m * N, mask, _mm512_fmadd_ps(_mm512_loadu_ps(tp + m * RT), sc, bias));
  }, true);
}
#endif

void gemv_q8_impl(const float* x, int64_t M, int64_t K, const std::vector<Mat>& mats) {
  thread_local QuantAct qa;
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  if (M > TEAM_FROM) {  // a prefill: rows in the lanes
    thread_local LaneAct la;
    quantize_act(x, M, K, qa, false);
    lane_act(qa, M, la);
    lane_product<QK, false>(la, M, K, mats, [K](const Mat& mat, int64_t n0, int R, int8_t* w, int64_t Kp) {
      for (int r = 0; r < R; ++r)
        std::memcpy(w + r * Kp, static_cast<const int8_t*>(mat.w) + (n0 + r) * mat.ldw, K);
    });
    return;
  }
#endif
  quantize_act(x, M, K, qa);  // once for every matrix of the call
  const QuantAct& q = qa;
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  if (M <= 2 * MBQ && streams() > 1) {  // a decode step's rows: several tiles a pass
    over_tile_streams(mats, K, std::min(4, streams()), [&](const TileRef* tiles, int n) {
      float sums[4][MB * RT];
      float* out[4] = {sums[0], sums[1], sums[2], sums[3]};
      for (int64_t m0 = 0; m0 < M; m0 += MBQ) {
        const int mb = static_cast<int>(std::min<int64_t>(MBQ, M - m0));
        q8_streams(mb, n, tiles, q, m0, K, out);
        store_tiles(out, n, tiles, mb, m0);
      }
    });
    return;
  }
#endif
  const bool pairs = M > PAIRS_FROM;
  for (int64_t mc = 0; mc < M; mc += MC) {
    const int64_t mend = std::min(M, mc + MC);
    over_tiles(mats, K, [&](const Mat& mat, int64_t n0, int R) {
      float sums[MB * RT];
      const int8_t* w = static_cast<const int8_t*>(mat.w) + n0 * mat.ldw;
      const int64_t step = pairs ? MBP : MBQ;
      for (int64_t m0 = mc; m0 < mend; m0 += step) {
        const int mb = static_cast<int>(std::min<int64_t>(step, mend - m0));
        q8_rows(mb, R, q, m0, w, mat.ldw, K, sums, pairs);
        store(sums, mb, R, n0, mat.scale, mat.bias, mat.out + m0 * mat.N, mat.N);
      }
    }, M > TEAM_FROM);
  }
}

// -- ops ------------------------------------------------------------------------------------
// x [..., K] fp32 or bf16 (computed in fp32); each output [..., N_i] in x's dtype; a bias in
// any float dtype; weights [N_i, K] (rows made contiguous if they are not).
using OptList = c10::List<std::optional<at::Tensor>>;
using Opt = std::optional<at::Tensor>;

void gemv_q4_impl(const float* x, int64_t M, int64_t K, const std::vector<Mat>& mats);

enum class Fmt { F32, BF16, I8, I4 };

// The format of weights of dtype t: int4 values are packed in uint8; None for another dtype.
std::optional<Fmt> fmt_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return Fmt::F32;
    case at::kBFloat16: return Fmt::BF16;
    case at::kChar: return Fmt::I8;
    case at::kByte: return Fmt::I4;
    default: return std::nullopt;
  }
}

// The matrices one activation multiplies (q, k, v; gate, up; a lone one), checked and turned
// into Mats once: the ops below make one per call, the native decode step one per product of
// the model when its plan is made (decode_layers.h), so a step's products touch no tensor.
struct Product {
  Fmt fmt = Fmt::F32;
  int64_t K = 0;
  std::vector<Mat> mats;          // `out` is set by each run
  std::vector<at::Tensor> ws;     // the weights as given: torch's product outside the kernels
  std::vector<Opt> biases;
  std::vector<at::Tensor> keep;   // copies made here (fp32 biases and scales, contiguous rows)
};

const float* f32_vector(const Opt& t, int64_t n, const char* what, Product& p) {
  if (!t.has_value()) return nullptr;
  TORCH_CHECK(t->numel() == n && !t->is_cuda(), what, " must be a CPU vector of ", n);
  at::Tensor v = t->to(at::kFloat).contiguous();
  p.keep.push_back(v);
  return v.data_ptr<float>();
}

// `op`'s product of K-wide activations with ws: fp32 or bf16 [N, K]; int8 [N, K] with fp32
// per-row scales; int4 [N, K/2] uint8 with fp32 scales [N, K/32], or in tiles (q4t_tiles)
// [N/16, K/32, 256] uint8 with fp16 scales [N/16, K/32, 16]. scales: one per weight (int8,
// int4) or empty; biases: one per weight (or None), or empty.
Product make_product(int64_t K, const std::vector<at::Tensor>& ws, const std::vector<Opt>& scales,
                     const std::vector<Opt>& biases, const char* op) {
  TORCH_CHECK(!ws.empty(), op, ": no weights");
  TORCH_CHECK(biases.empty() || biases.size() == ws.size(), op, ": one bias (or None) per weight");
  const at::ScalarType t = ws[0].scalar_type();
  Product p;
  p.K = K;
  p.ws = ws;
  p.biases = biases.empty() ? std::vector<Opt>(ws.size()) : biases;
  const std::optional<Fmt> fmt = fmt_of(t);
  TORCH_CHECK(fmt.has_value(), op, ": weights fp32, bf16, int8 or int4 (uint8), got ", t);
  p.fmt = *fmt;
  const bool scaled = p.fmt == Fmt::I8 || p.fmt == Fmt::I4;
  TORCH_CHECK(scales.size() == (scaled ? ws.size() : 0) &&
                  std::all_of(scales.begin(), scales.end(), [](const Opt& s) { return s.has_value(); }),
              op, scaled ? ": one scale per weight" : ": no scales for float weights");
  if (p.fmt == Fmt::I4) TORCH_CHECK(K % G4 == 0, op, ": K = ", K, " must be a multiple of ", G4);
  for (size_t i = 0; i < ws.size(); ++i) {
    at::Tensor w = ws[i];
    TORCH_CHECK(w.scalar_type() == t && !w.is_cuda(), op, ": weights of one dtype on the CPU");
    Mat mat{};
    if (p.fmt == Fmt::I4 && w.dim() == 3) {  // tiles
      const at::Tensor& sc = *scales[i];
      TORCH_CHECK(w.size(1) == K / G4 && w.size(2) == Q4T * 16 && w.is_contiguous(), op,
                  ": weight ", i, " must be contiguous uint8 [N/", Q4T, ", ", K / G4, ", ",
                  Q4T * 16, "] on the CPU");
      TORCH_CHECK(sc.scalar_type() == at::kHalf && sc.is_contiguous() && !sc.is_cuda() &&
                      sc.dim() == 3 && sc.size(0) == w.size(0) && sc.size(1) == K / G4 &&
                      sc.size(2) == Q4T,
                  op, ": scale ", i, " must be contiguous fp16 [", w.size(0), ", ", K / G4,
                  ", ", Q4T, "]");
      mat.N = w.size(0) * Q4T;
      mat.scale16 = reinterpret_cast<const uint16_t*>(sc.data_ptr<at::Half>());
    } else if (p.fmt == Fmt::I4) {
      const at::Tensor& sc = *scales[i];
      TORCH_CHECK(w.dim() == 2 && w.size(1) * 2 == K && w.is_contiguous(), op, ": weight ", i,
                  " must be contiguous uint8 [N, ", K / 2, "] on the CPU");
      mat.N = w.size(0);
      TORCH_CHECK(sc.scalar_type() == at::kFloat && sc.is_contiguous() && !sc.is_cuda() &&
                      sc.dim() == 2 && sc.size(0) == mat.N && sc.size(1) == K / G4,
                  op, ": scale ", i, " must be contiguous fp32 [", mat.N, ", ", K / G4, "]");
      mat.ldw = w.stride(0);
      mat.scale = sc.data_ptr<float>();
    } else {
      TORCH_CHECK(w.dim() == 2 && w.size(1) == K, op, ": weight ", i,
                  " must be a CPU matrix [N, ", K, "]");
      if (w.stride(1) != 1) {
        w = w.contiguous();
        p.keep.push_back(w);
      }
      mat.N = w.size(0);
      mat.ldw = w.stride(0);
      if (scaled) mat.scale = f32_vector(scales[i], mat.N, "scale", p);
    }
    mat.w = w.data_ptr();
    mat.bias = f32_vector(p.biases[i], mat.N, "bias", p);
    p.mats.push_back(mat);
  }
  return p;
}

// outs[i] [M, N_i] fp32 = the product of the activations: xf [M, K] fp32, and xb the same
// rows in bf16 where they are bf16 (bf16 weights take them as they are on AVX512-BF16), else
// null; `q8`: int8 weights quantize the activations (gemv_q8) rather than keep them fp32.
void run_product(Product& p, int64_t M, const float* xf, const c10::BFloat16* xb, bool q8,
                 float* const* outs) {
  for (size_t i = 0; i < p.mats.size(); ++i) p.mats[i].out = outs[i];
  switch (p.fmt) {
    case Fmt::I4: gemv_q4_impl(xf, M, p.K, p.mats); break;
    case Fmt::I8:
      if (q8) gemv_q8_impl(xf, M, p.K, p.mats);
      else gemv_float_weights<int8_t>(xf, M, p.K, p.mats);
      break;
    case Fmt::F32: gemv_float_weights<float>(xf, M, p.K, p.mats); break;
    case Fmt::BF16:
#if defined(__AVX512BF16__)
      if (xb != nullptr) {
        gemv_bf16_dot(xb, M, p.K, p.mats);
        break;
      }
#endif
      gemv_float_weights<c10::BFloat16>(xf, M, p.K, p.mats);
      break;
  }
}

// x as fp32 rows [M, K]: x itself when it is that already (a decode step's activations), so a
// product of the step creates no view or copy of them.
at::Tensor rows_f32(const at::Tensor& x, int64_t K) {
  if (x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous()) return x;
  return x.reshape({-1, K}).to(at::kFloat).contiguous();
}

std::vector<Opt> opt_vector(const OptList& l) {
  std::vector<Opt> v;
  for (size_t i = 0; i < l.size(); ++i) v.push_back(l.get(i));
  return v;
}

// One op call: x against ws of the formats in `allowed`, the outputs in x's dtype and shape.
std::vector<at::Tensor> many(const at::Tensor& x, at::TensorList ws, const at::TensorList* scales,
                             const OptList& biases, const char* op,
                             std::initializer_list<Fmt> allowed, const char* formats, bool q8) {
  TORCH_CHECK(x.dim() >= 1 && !x.is_cuda() &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              op, ": x must be a fp32 or bf16 CPU tensor [..., K]");
  TORCH_CHECK(!ws.empty(), op, ": no weights");
  const std::optional<Fmt> fmt = fmt_of(ws[0].scalar_type());
  TORCH_CHECK(fmt && std::find(allowed.begin(), allowed.end(), *fmt) != allowed.end(), op,
              ": weights must be ", formats, ", got ", ws[0].scalar_type());
  std::vector<Opt> sc;
  if (scales != nullptr)
    for (const at::Tensor& s : *scales) sc.push_back(s);
  const int64_t K = x.size(-1);
  Product p = make_product(K, ws.vec(), sc, opt_vector(biases), op);  // one scale per weight
  const at::Tensor x2 = rows_f32(x, K);
  const int64_t M = x2.size(0);
  std::vector<at::Tensor> outs;
  std::vector<float*> out_ptrs;
  for (const Mat& m : p.mats) {
    outs.push_back(at::empty({M, m.N}, x2.options()));
    out_ptrs.push_back(outs.back().data_ptr<float>());
  }
  at::Tensor xb;
  if (p.fmt == Fmt::BF16 && kBf16Dot && x.scalar_type() == at::kBFloat16)
    xb = x.reshape({-1, K}).contiguous();  // bf16 activations as they are: vdpbf16ps
  run_product(p, M, x2.data_ptr<float>(), xb.defined() ? xb.data_ptr<c10::BFloat16>() : nullptr,
              q8, out_ptrs.data());
  std::vector<int64_t> lead = x.sizes().vec();
  lead.pop_back();
  std::vector<at::Tensor> res;
  for (at::Tensor& o : outs) {
    at::Tensor r = x.scalar_type() == at::kFloat ? o : o.to(x.scalar_type());
    if (lead.size() != 1) {  // [M, N] is already x's shape for 2-D x
      std::vector<int64_t> shape = lead;
      shape.push_back(o.size(1));
      r = r.view(shape);
    }
    res.push_back(std::move(r));
  }
  return res;
}

std::vector<at::Tensor> gemv_many(const at::Tensor& x, at::TensorList ws, const OptList& biases) {
  return many(x, ws, nullptr, biases, "gemv", {Fmt::F32, Fmt::BF16}, "fp32 or bf16", false);
}

std::vector<at::Tensor> int8_many(const at::Tensor& x, at::TensorList qs, at::TensorList scales,
                                  const OptList& biases, bool quantized) {
  return many(x, qs, &scales, biases, quantized ? "gemv_q8" : "gemv_int8", {Fmt::I8}, "int8",
              quantized);
}

std::vector<at::Tensor> gemv_int8_many(const at::Tensor& x, at::TensorList qs,
                                       at::TensorList scales, const OptList& biases) {
  return int8_many(x, qs, scales, biases, false);
}

std::vector<at::Tensor> gemv_q8_many(const at::Tensor& x, at::TensorList qs,
                                     at::TensorList scales, const OptList& biases) {
  return int8_many(x, qs, scales, biases, true);
}

// x [..., K] against int4 weights: q [N, K/2] uint8 (the layout below) with scale [N, K/32]
// fp32, or in tiles (q4t_tiles): q [N/16, K/32, 256] uint8 with scale [N/16, K/32, 16] fp16.
std::vector<at::Tensor> gemv_q4_many(const at::Tensor& x, at::TensorList qs,
                                     at::TensorList scales, const OptList& biases) {
  return many(x, qs, &scales, biases, "gemv_q4", {Fmt::I4}, "int4 (uint8)", false);
}

OptList one_bias(const std::optional<at::Tensor>& bias) {
  OptList b;
  b.push_back(bias);
  return b;
}

at::Tensor gemv(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  return gemv_many(x, {w}, one_bias(bias))[0];
}

at::Tensor gemv_int8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                     const std::optional<at::Tensor>& bias) {
  return int8_many(x, {q}, {scale}, one_bias(bias), false)[0];
}

at::Tensor gemv_q8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                   const std::optional<at::Tensor>& bias) {
  return int8_many(x, {q}, {scale}, one_bias(bias), true)[0];
}

at::Tensor gemv_q4(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                   const std::optional<at::Tensor>& bias) {
  return gemv_q4_many(x, {q}, {scale}, one_bias(bias))[0];
}

// -- int4 weights × int8 activations ------------------------------------------------------
// Weights in groups of G4 = 32 along K with one fp32 scale each, laid out as llama.cpp's q4_0
// block: byte j of a group holds value j in its low nibble and value j + 16 in its high one,
// each stored as u = v + 8 (v in [-8, 7]); W[n, 32g + j] = d[n, g] · v. The activations are
// quantized per row and block of QK as for gemv_q8 (a group of 32 lies inside one block), so
//   y[m, n] = Σ_g d[n, g] · s[m, b(g)] · Σ_{j<32} v_j · xq_j,
// each group's dot an exact int32: the stored u are unsigned, so maddubs / vpdpbusd take them
// as they are against xq (u8 × s8), and -8 · Σ xq (per int32 lane, QuantAct::c8) is added:
// Σ u · xq - 8 · Σ xq = Σ v · xq.
//
// A weight vector holds the bytes of several groups (a "span": 2 groups in 256 bits, 4 in
// 512; a last short span is zero-padded), which unpack into their low nibbles
//   lo = [u_g[0..15] for each group g]  and the high ones  hi = [u_g[16..31] for each g],
// and quantize_act(pairs) lays each Q4S activations out to match, [x_g[0..15] for each g,
// then x_g[16..31] for each g], so one load of each serves every group of the span: int32
// lane i holds 8 products of group i / 4, exact, plus c8's offset of the same 8 values. Then
// float lanes times each group's scale spread over its 4 lanes.

// The 32 stored values u = v + 8 of a group, in [0, 15]: its 16 bytes in both halves, the
// upper half shifted down a nibble (dequant_q4).
inline __m256i unpack_q4(const uint8_t* p) {
  const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_and_si256(_mm256_srlv_epi32(b, _mm256_set_epi32(4, 4, 4, 4, 0, 0, 0, 0)),
                          _mm256_set1_epi8(0x0F));
}

// Activation rows [m0, m0 + MBv) of a tile: their lane offsets, values and block scales.
template <int MBv>
struct ActRows {
  const int32_t* C[MBv];
  const int8_t* X[MBv];
  const float* S[MBv];
  ActRows(const QuantAct& qa, int64_t m0) {
    for (int m = 0; m < MBv; ++m) {
      C[m] = qa.c8.data() + (m0 + m) * (qa.Kp / 8);
      X[m] = qa.q.data() + (m0 + m) * qa.Kp;
      S[m] = qa.s.data() + (m0 + m) * qa.nb;
    }
  }
};

#if defined(__AVX512F__) && defined(__AVX512BW__)
// 512 bits: a span is 4 groups, one activation block (QK = 128) holds exactly one. The lanes
// of a span: vpdpbusd twice from the offsets (VNNI), else maddubs(lo) + maddubs(hi) in int16
// (|sum| <= 4 · 15 · 127, no saturation) and one madd.
inline __m512i q4_lanes(__m512i off, __m512i lo, __m512i xl, __m512i hi, __m512i xh) {
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(off, lo, xl), hi, xh);
#else
  const __m512i s16 = _mm512_add_epi16(_mm512_maddubs_epi16(lo, xl), _mm512_maddubs_epi16(hi, xh));
  return _mm512_add_epi32(_mm512_madd_epi16(s16, _mm512_set1_epi16(1)), off);
#endif
}

// Span b of R weight rows against MBv activation rows: acc += float(lanes) · (scales · s_b).
// `left` (MASKED): the groups of a last short span, 1 to 3.
template <int MBv, int R, bool MASKED>
inline void q4_span(const int32_t* const* C, const int8_t* const* X, const float* const* S,
                    const uint8_t* const* w, const float* const* d, int64_t b, int left,
                    __m512 (&acc)[MBv][R]) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  __m512i lo[R], hi[R];
  __m512 dv[R];
  for (int r = 0; r < R; ++r) {
    const uint8_t* p = w[r] + b * 2 * G4;
    if (QPF) _mm_prefetch(reinterpret_cast<const char*>(p) + QPF, _MM_HINT_T0);
    const __m512i bytes = MASKED ? _mm512_maskz_loadu_epi8((1ULL << (16 * left)) - 1, p)
                                 : _mm512_loadu_si512(p);
    lo[r] = _mm512_and_si512(bytes, low);
    hi[r] = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low);
    const __m128 d4 = MASKED ? _mm_maskz_loadu_ps(static_cast<__mmask8>((1 << left) - 1), d[r] + 4 * b)
                             : _mm_loadu_ps(d[r] + 4 * b);
    dv[r] = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(d4));
  }
  for (int m = 0; m < MBv; ++m) {
    const int8_t* x = X[m] + b * Q4S;
    const __m512i xl = _mm512_loadu_si512(x), xh = _mm512_loadu_si512(x + Q4S / 2);
    const __m512i off = _mm512_loadu_si512(C[m] + b * (Q4S / 8));
    const __m512 sb = _mm512_set1_ps(S[m][b]);
    for (int r = 0; r < R; ++r) {
      const __m512 dot = _mm512_cvtepi32_ps(q4_lanes(off, lo[r], xl, hi[r], xh));
      acc[m][r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(dv[r], sb), acc[m][r]);
    }
  }
}

// R weight rows (w[r], scales d[r]) against MBv activation rows; per (activation row, weight
// row) one sequence whatever the tile (spans in order, one horizontal sum), so a row's result
// never depends on its tile or batch. Out of line, as the 256-bit tile.
template <int MBv, int R>
__attribute__((noinline)) void q4_tile(const QuantAct& qa, int64_t m0, const uint8_t* const* w,
                                       const float* const* d, int64_t K, float* sums) {
  static_assert(QK == Q4S, "an activation block is one span");
  const ActRows<MBv> a(qa, m0);
  const int32_t* const* C = a.C;
  const int8_t* const* X = a.X;
  const float* const* S = a.S;
  __m512 acc[MBv][R];
  for (int m = 0; m < MBv; ++m)
    for (int r = 0; r < R; ++r) acc[m][r] = _mm512_setzero_ps();
  const int64_t groups = K / G4, nfull = groups / 4;
  for (int64_t b = 0; b < nfull; ++b) q4_span<MBv, R, false>(C, X, S, w, d, b, 4, acc);
  if (const int left = static_cast<int>(groups - 4 * nfull); left > 0)
    q4_span<MBv, R, true>(C, X, S, w, d, nfull, left, acc);
  for (int m = 0; m < MBv; ++m)
    for (int r = 0; r < R; ++r) sums[m * RT + r] = _mm512_reduce_add_ps(acc[m][r]);
}
#else
// 256 bits: a span is 2 groups (a "pair"; a last odd group is a pair alone, its partner's
// activations zero). maddubs(lo) + maddubs(hi) adds in int16 (|sum| <= 4 · 15 · 127, no
// saturation) before one madd, then float lanes times [d_g ×4 | d_g+1 ×4]. Per two groups:
// 2 maddubs, 1 madd, 1 cvt, 1 fma (one group at a time took 2, 2, 2, 2).
inline __m256i q4_bytes(const uint8_t* p, bool alone) {
  return alone ? _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))
               : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
inline __m256 q4_scales(const float* d, bool alone) {
  if (alone) return _mm256_broadcast_ss(d);
  const __m128 two = _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(d)));
  return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(two),
                                  _mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0));
}

// Pair p (groups 2p, 2p + 1) of R weight rows against MBv activation rows: t[m][r] =
// float(exact lanes) · scales, or t += that (`first` false).
template <int MBv, int R, bool first>
inline void q4_span(const int32_t* const* C, const int8_t* const* X, const uint8_t* const* w,
                    const float* const* d, int64_t p, bool alone, __m256 (&t)[MBv][R]) {
  const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0F);
  if (QPF && (p & 1) == 0)  // once a cache line
    for (int r = 0; r < R; ++r)
      _mm_prefetch(reinterpret_cast<const char*>(w[r] + p * G4) + QPF, _MM_HINT_T0);
  __m256i lo[R], hi[R];
  __m256 dv[R];
  for (int r = 0; r < R; ++r) {
    const __m256i b = q4_bytes(w[r] + p * G4, alone);
    lo[r] = _mm256_and_si256(b, low);
    hi[r] = _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
    dv[r] = q4_scales(d[r] + 2 * p, alone);
  }
  for (int m = 0; m < MBv; ++m) {
    const int8_t* x = X[m] + p * Q4S;
    const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + Q4S / 2));
    const __m256i off = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(C[m] + p * 8));
    for (int r = 0; r < R; ++r) {
      const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo[r], xl),
                                           _mm256_maddubs_epi16(hi[r], xh));
      const __m256 dot = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(s16, ones), off));
      t[m][r] = first ? _mm256_mul_ps(dot, dv[r]) : _mm256_fmadd_ps(dot, dv[r], t[m][r]);
    }
  }
}

// R weight rows (w[r], scales d[r]) against MBv activation rows. Per (activation row, weight
// row) one sequence whatever the tile: within an activation block b (two pairs; the last
// block one or two), t_e and t_o hold the products of its first and second pair, computed
// independently of each other, acc += (t_e + t_o) · s_b, and one horizontal sum at the end.
// Out of line: inlined into over_tiles' lambda, a decode row's accumulators spilled to the
// stack.
template <int MBv, int R>
__attribute__((noinline)) void q4_tile(const QuantAct& qa, int64_t m0, const uint8_t* const* w,
                                       const float* const* d, int64_t K, float* sums) {
  static_assert(QK == 2 * Q4S, "an activation block holds two pairs of groups");
  const ActRows<MBv> a(qa, m0);
  const int32_t* const* C = a.C;
  const int8_t* const* X = a.X;
  const float* const* S = a.S;
  __m256 acc[MBv][R], te[MBv][R], to[MBv][R];
  for (int m = 0; m < MBv; ++m)
    for (int r = 0; r < R; ++r) acc[m][r] = _mm256_setzero_ps();
  const int64_t groups = K / G4, nfull = groups / 4;
  for (int64_t b = 0; b < nfull; ++b) {
    q4_span<MBv, R, true>(C, X, w, d, 2 * b, false, te);
    q4_span<MBv, R, true>(C, X, w, d, 2 * b + 1, false, to);
    for (int m = 0; m < MBv; ++m) {
      const __m256 sb = _mm256_set1_ps(S[m][b]);
      for (int r = 0; r < R; ++r)
        acc[m][r] = _mm256_fmadd_ps(_mm256_add_ps(te[m][r], to[m][r]), sb, acc[m][r]);
    }
  }
  if (const int64_t left = groups - 4 * nfull; left > 0) {  // a last block of 1 to 3 groups
    q4_span<MBv, R, true>(C, X, w, d, 2 * nfull, left == 1, te);
    if (left == 3) q4_span<MBv, R, false>(C, X, w, d, 2 * nfull + 1, true, te);
    for (int m = 0; m < MBv; ++m) {
      const __m256 sb = _mm256_set1_ps(S[m][nfull]);
      for (int r = 0; r < R; ++r) acc[m][r] = _mm256_fmadd_ps(te[m][r], sb, acc[m][r]);
    }
  }
  for (int m = 0; m < MBv; ++m)
    for (int r = 0; r < R; ++r) sums[m * RT + r] = hsum256(acc[m][r]);
}
#endif

template <int R>
inline void q4_group(int mb, const QuantAct& qa, int64_t m0, const uint8_t* const* w,
                     const float* const* d, int64_t K, float* sums) {
  switch (mb) {
    case 4: return q4_tile<4, R>(qa, m0, w, d, K, sums);
    case 3: return q4_tile<3, R>(qa, m0, w, d, K, sums);
    case 2: return q4_tile<2, R>(qa, m0, w, d, K, sums);
    default: return q4_tile<1, R>(qa, m0, w, d, K, sums);
  }
}

// -- int4 weights in tiles of Q4T = 16 rows (an engine's layers) --------------------------
// The layout astrai/model/quant4.py `tile_rows` makes: per tile and group g, 4 vectors of 64
// bytes, vector i holding bytes 4i..4i+3 of the 16 rows' q4_0 group (row r in 32-bit lane r:
// u_{4i..4i+3} in the low nibbles, u_{16+4i..} in the high ones); beside them (a tensor of
// their own) the 16 rows' fp16 scales of each group. A weight row is a lane, so per group
// and activation row, exact in int32,
//   lanes = -8 · Σ_{k∈g} xq_k + Σ_i dot(lo_i, xq[4i..]) + Σ_i dot(hi_i, xq[16 + 4i..])
// (each 4 activation bytes broadcast) and acc_b += float(lanes) · d_g, acc += acc_b · s_b
// per block: no horizontal sums and no scale shuffles, two streams a tile (the row layout:
// two a row). With VNNI the
// high nibbles stay in place (byte & 0xF0 = 16 · hi, one op) and their sum is shifted back,
// exactly (every product is a multiple of 16); without, maddubs would saturate on them, so
// they are shifted down first. A row's result never depends on its batch. AVX2 takes a tile
// as two halves of 8 rows, its 8 maddubs of a group summed in int16 (at most 8 · 2 · 15 ·
// 127 = 30480, no saturation) before one madd: per group and half 8 maddubs, 8 adds, 1 madd,
// 1 conversion, 1 multiply and 1 fmadd.
// Activation rows come quantized in gemv_q4's pairs (quantize_act): in each span of Q4S
// values, group j's low half at 16j, its high half Q4S / 2 further.
inline int64_t q4t_x(int64_t g) {
  return (g / (Q4S / G4)) * Q4S + 16 * (g % (Q4S / G4));
}

// The bytes and the scales of the tile holding row n0 of `mat` (int4 in tiles).
inline const uint8_t* q4t_bytes(const Mat& mat, int64_t n0, int64_t K) {
  return static_cast<const uint8_t*>(mat.w) + n0 / Q4T * (K / G4) * (Q4T * 16);
}
inline const uint16_t* q4t_scales(const Mat& mat, int64_t n0, int64_t K) {
  return mat.scale16 + n0 / Q4T * (K / G4) * Q4T;
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
inline __m512i q4t_dot(__m512i acc, __m512i u, const int8_t* x) {
  int32_t x4;
  std::memcpy(&x4, x, 4);
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(acc, u, _mm512_set1_epi32(x4));
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, _mm512_set1_epi32(x4)),
                                                 _mm512_set1_epi16(1)));
#endif
}

// S tiles (w[s]: its groups, d[s]: its scales), read together a group at a time, against
// activation rows [m0, m0 + MBv) quantized in gemv_q4's pairs (quantize_act), cg [M][K / G4]
// their groups' -8 · Σ xq: sums[s][m · RT + r]. Each tile's arithmetic is the one-tile
// sequence, so a row's result does not depend on which tiles share its pass.
template <int MBv, int S>
__attribute__((noinline)) void q4t_tiles(const QuantAct& qa, const int32_t* cg, int64_t m0,
                                         const uint8_t* const* w, const uint16_t* const* d,
                                         int64_t K, float* const* sums) {
  static_assert(QK == Q4S, "an activation block is one span of 4 groups");
  const int64_t G = K / G4;
  const __m512i low = _mm512_set1_epi8(0x0F);
  const ActRows<MBv> a(qa, m0);
  const int32_t* C[MBv];
  for (int m = 0; m < MBv; ++m) C[m] = cg + (m0 + m) * G;
  __m512 acc[S][MBv], accb[S][MBv];
  for (int s = 0; s < S; ++s)
    for (int m = 0; m < MBv; ++m) acc[s][m] = accb[s][m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const int64_t xo = q4t_x(g);
    for (int s = 0; s < S; ++s) {
      const uint8_t* p = w[s] + g * (Q4T * 16);
      __m512i lo[4], hi[4];
      for (int i = 0; i < 4; ++i) {
        if (QPF) _mm_prefetch(reinterpret_cast<const char*>(p) + 64 * i + QPF, _MM_HINT_T0);
        const __m512i bytes = _mm512_loadu_si512(p + 64 * i);
        lo[i] = _mm512_and_si512(bytes, low);
#if defined(__AVX512VNNI__)
        hi[i] = _mm512_andnot_si512(low, bytes);
#else
        hi[i] = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low);
#endif
      }
      const __m512 dv = _mm512_cvtph_ps(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d[s] + g * Q4T)));
      for (int m = 0; m < MBv; ++m) {
        const int8_t* x = a.X[m] + xo;
        __m512i l = _mm512_set1_epi32(C[m][g]), h = _mm512_setzero_si512();
        for (int i = 0; i < 4; ++i) {
          l = q4t_dot(l, lo[i], x + 4 * i);
          h = q4t_dot(h, hi[i], x + Q4S / 2 + 4 * i);
        }
#if defined(__AVX512VNNI__)
        h = _mm512_srai_epi32(h, 4);
#endif
        accb[s][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(l, h)), dv, accb[s][m]);
      }
    }
    if (g % (QK / G4) == QK / G4 - 1 || g == G - 1)
      for (int s = 0; s < S; ++s)
        for (int m = 0; m < MBv; ++m) {
          acc[s][m] = _mm512_fmadd_ps(accb[s][m], _mm512_set1_ps(a.S[m][g / (QK / G4)]), acc[s][m]);
          accb[s][m] = _mm512_setzero_ps();
        }
  }
  for (int s = 0; s < S; ++s)
    for (int m = 0; m < MBv; ++m) _mm512_storeu_ps(sums[s] + m * RT, acc[s][m]);
}
#else
template <int MBv, int S>
__attribute__((noinline)) void q4t_tiles(const QuantAct& qa, const int32_t* cg, int64_t m0,
                                         const uint8_t* const* w, const uint16_t* const* d,
                                         int64_t K, float* const* sums) {
  const int64_t G = K / G4;
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const ActRows<MBv> a(qa, m0);
  const int32_t* C[MBv];
  for (int m = 0; m < MBv; ++m) C[m] = cg + (m0 + m) * G;
  __m256 acc[S][MBv][2];
  for (int s = 0; s < S; ++s)
    for (int m = 0; m < MBv; ++m) acc[s][m][0] = acc[s][m][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const int64_t xo = q4t_x(g);
    for (int s = 0; s < S; ++s) {
      const uint8_t* p = w[s] + g * (Q4T * 16);
      if (QPF)
        for (int i = 0; i < 4; ++i)
          _mm_prefetch(reinterpret_cast<const char*>(p) + 64 * i + QPF, _MM_HINT_T0);
      for (int h = 0; h < 2; ++h) {  // rows 8h..8h + 7
        __m256i lo[4], hi[4];
        for (int i = 0; i < 4; ++i) {
          const __m256i bytes =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * i + 32 * h));
          lo[i] = _mm256_and_si256(bytes, low);
          hi[i] = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low);
        }
        const __m256 dv = _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(d[s] + g * Q4T + 8 * h)));
        for (int m = 0; m < MBv; ++m) {
          const int8_t* x = a.X[m] + xo;
          __m256i s16 = _mm256_setzero_si256();
          for (int i = 0; i < 4; ++i) {
            int32_t xl, xh;
            std::memcpy(&xl, x + 4 * i, 4);
            std::memcpy(&xh, x + Q4S / 2 + 4 * i, 4);
            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(lo[i], _mm256_set1_epi32(xl)));
            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(hi[i], _mm256_set1_epi32(xh)));
          }
          const __m256i lanes = _mm256_add_epi32(_mm256_madd_epi16(s16, ones),
                                                 _mm256_set1_epi32(C[m][g]));
          const __m256 sc = _mm256_mul_ps(dv, _mm256_set1_ps(a.S[m][g / (QK / G4)]));
          acc[s][m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), sc, acc[s][m][h]);
        }
      }
    }
  }
  for (int s = 0; s < S; ++s)
    for (int m = 0; m < MBv; ++m) {
      _mm256_storeu_ps(sums[s] + m * RT, acc[s][m][0]);
      _mm256_storeu_ps(sums[s] + m * RT + 8, acc[s][m][1]);
    }
}

// A tile against activation rows [m0, m0 + MBv) on AVX2 where a product has more than MB
// rows (gemv_q4's MC loop: a prefill, many requests): rows 8h..8h + 7 over the whole K, then
// the other 8, each group's arithmetic that of q4t_tiles (the same bits). q4t_tiles takes both
// halves a group at a time, as a decode row's one read of its weights wants, but its 2 · MBv
// accumulators beside 8 unpacked vectors outgrow AVX2's 16 registers and the compiler keeps
// them on the stack; here MBv accumulators, MBv int16 sums and one vector of bytes at a time
// fit (two layers of the 125m shape's int4 products, 512 rows: 1.5x the multiply-adds a
// second; 8 rows 1.27x; 2 threads, a Xeon Ice Lake running the AVX2 build).
template <int MBv>
__attribute__((noinline)) void q4t_prefill(const QuantAct& qa, const int32_t* cg, int64_t m0,
                                           const uint8_t* w, const uint16_t* d, int64_t K,
                                           float* sums) {
  const int64_t G = K / G4;
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const ActRows<MBv> a(qa, m0);
  const int32_t* C[MBv];
  for (int m = 0; m < MBv; ++m) C[m] = cg + (m0 + m) * G;
  for (int h = 0; h < 2; ++h) {
    __m256 acc[MBv];
    for (int m = 0; m < MBv; ++m) acc[m] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
      const int64_t xo = q4t_x(g);
      const uint8_t* p = w + g * (Q4T * 16) + 32 * h;
      __m256i s16[MBv];
      for (int m = 0; m < MBv; ++m) s16[m] = _mm256_setzero_si256();
      for (int i = 0; i < 4; ++i) {
        const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * i));
        const __m256i lo = _mm256_and_si256(bytes, low);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low);
        for (int m = 0; m < MBv; ++m) {
          int32_t xl, xh;
          std::memcpy(&xl, a.X[m] + xo + 4 * i, 4);
          std::memcpy(&xh, a.X[m] + xo + Q4S / 2 + 4 * i, 4);
          s16[m] = _mm256_add_epi16(s16[m], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xl)));
          s16[m] = _mm256_add_epi16(s16[m], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh)));
          asm("" : "+x"(s16[m]));  // summed in order, in a register: reassociated, they spill
        }
      }
      const __m256 dv =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d + g * Q4T + 8 * h)));
      for (int m = 0; m < MBv; ++m) {
        const __m256i lanes = _mm256_add_epi32(_mm256_madd_epi16(s16[m], ones),
                                               _mm256_set1_epi32(C[m][g]));
        const __m256 sc = _mm256_mul_ps(dv, _mm256_set1_ps(a.S[m][g / (QK / G4)]));
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), sc, acc[m]);
      }
    }
    for (int m = 0; m < MBv; ++m) _mm256_storeu_ps(sums + m * RT + 8 * h, acc[m]);
  }
}

// q4t_prefill on the tile from row n0 of `mat` (int4 in tiles), mb <= MB rows.
inline void q4t_prefill_rows(int mb, const Mat& mat, int64_t n0, const QuantAct& qa,
                             const int32_t* cg, int64_t m0, int64_t K, float* sums) {
  static_assert(MB == 4, "q4t_prefill_rows dispatches 1 to 4 rows");
  const uint8_t* w = q4t_bytes(mat, n0, K);
  const uint16_t* d = q4t_scales(mat, n0, K);
  switch (mb) {
    case 4: return q4t_prefill<4>(qa, cg, m0, w, d, K, sums);
    case 3: return q4t_prefill<3>(qa, cg, m0, w, d, K, sums);
    case 2: return q4t_prefill<2>(qa, cg, m0, w, d, K, sums);
    default: return q4t_prefill<1>(qa, cg, m0, w, d, K, sums);
  }
}

#endif

// Activation rows a pass of int4 tiles takes with S tiles together (their accumulators stay
// in registers): 4 tiles up to 2 rows, 2 up to 4.
inline int q4t_streams(int64_t rows) { return std::min<int>(streams(), rows <= 2 ? 4 : 2); }

template <int MBv>
inline void q4t_set_rows(int n, const QuantAct& qa, const int32_t* cg, int64_t m0,
                         const uint8_t* const* w, const uint16_t* const* d, int64_t K,
                         float* const* sums) {
  switch (n) {
    case 4: if constexpr (MBv <= 2) return q4t_tiles<MBv, 4>(qa, cg, m0, w, d, K, sums); break;
    case 3: if constexpr (MBv <= 2) return q4t_tiles<MBv, 3>(qa, cg, m0, w, d, K, sums); break;
    case 2: return q4t_tiles<MBv, 2>(qa, cg, m0, w, d, K, sums);
    default: return q4t_tiles<MBv, 1>(qa, cg, m0, w, d, K, sums);
  }
  TORCH_CHECK(false, "q4t_set: ", n, " tiles with ", MBv, " rows");
}

// n tiles of int4 weights in tiles (at most q4t_streams(mb)) against activation rows
// [m0, m0 + mb): sums[s][m · RT + r].
inline void q4t_set(int mb, int n, const TileRef* tiles, const QuantAct& qa,
                    const int32_t* cg, int64_t m0, int64_t K, float* const* sums) {
  const uint8_t* w[4];
  const uint16_t* d[4];
  for (int s = 0; s < n; ++s) {
    w[s] = q4t_bytes(*tiles[s].mat, tiles[s].n0, K);
    d[s] = q4t_scales(*tiles[s].mat, tiles[s].n0, K);
  }
  switch (mb) {
    case 4: return q4t_set_rows<4>(n, qa, cg, m0, w, d, K, sums);
    case 3: return q4t_set_rows<3>(n, qa, cg, m0, w, d, K, sums);
    case 2: return q4t_set_rows<2>(n, qa, cg, m0, w, d, K, sums);
    default: return q4t_set_rows<1>(n, qa, cg, m0, w, d, K, sums);
  }
}

// The group offsets of q4t_tiles from gemv_q4's pairs (c8: 4 per group of the AVX-512 span).
void q4t_offsets(const QuantAct& qa, int64_t M, int64_t K, std::vector<int32_t>& cg) {
  const int64_t G = K / G4;
  cg.resize(M * G);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < G; ++g) {
      const int32_t* c = qa.c8.data() + m * (qa.Kp / 8) + (g / (Q4S / G4)) * (Q4S / 8) +
                         4 * (g % (Q4S / G4));  // 4 a group: its low half's 4 dwords
      cg[m * G + g] = c[0] + c[1] + c[2] + c[3];
    }
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// A tile's weights as lane_product copies them (signed int8 [16][Kp], v = u - 8) and its
// scales as fp32 [16][K / G4].
void q4t_unpack(const Mat& mat, int64_t n0, int64_t K, int8_t* w, int64_t Kp, float* ds) {
  const int64_t G = K / G4;
  const uint8_t* q = q4t_bytes(mat, n0, K);
  const uint16_t* d = q4t_scales(mat, n0, K);
  const __m512i low = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
  alignas(64) int32_t v[8][Q4T];  // [lo 0..3, hi 0..3][row]: 4 values each
  for (int64_t g = 0; g < G; ++g) {
    for (int i = 0; i < 4; ++i) {
      const __m512i bytes = _mm512_loadu_si512(q + g * (Q4T * 16) + 64 * i);
      _mm512_store_si512(v[i], _mm512_sub_epi8(_mm512_and_si512(bytes, low), eight));
      _mm512_store_si512(v[4 + i], _mm512_sub_epi8(
          _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low), eight));
    }
    for (int r = 0; r < Q4T; ++r) {
      int32_t* dst = reinterpret_cast<int32_t*>(w + r * Kp + g * G4);
      for (int c = 0; c < 8; ++c) dst[c] = v[c][r];
      ds[r * G + g] = _cvtsh_ss(d[g * Q4T + r]);
    }
  }
}
#endif

// The R rows of a tile from row n0 of `mat` against activation rows [m0, m0 + mb), two weight
// rows at a time (the last alone) for any mb: an int4 product is bound by its arithmetic more
// than its reads (a decode row reads its bytes at about 0.9x the int8 product's rate, 2
// threads, AMD EPYC Zen 3), so the activations shared by two rows pay where two read streams
// cost (q8_rows) nothing measurable; single rows with more than two activation rows measured
// 0.95x.
inline void q4_rows(int mb, int R, const QuantAct& qa, int64_t m0, const Mat& mat,
                    int64_t n0, int64_t K, float* sums) {
  const uint8_t* w = static_cast<const uint8_t*>(mat.w) + n0 * mat.ldw;
  const float* d = mat.scale + n0 * (K / G4);
  const uint8_t* wr[RT];
  const float* dr[RT];
  for (int r = 0; r < R; ++r) {
    wr[r] = w + r * mat.ldw;
    dr[r] = d + r * (K / G4);
  }
  int r = 0;
  for (; r + 2 <= R; r += 2) q4_group<2>(mb, qa, m0, wr + r, dr + r, K, sums + r);
  if (r < R) q4_group<1>(mb, qa, m0, wr + r, dr + r, K, sums + r);
}
void gemv_q4_impl(const float* x, int64_t M, int64_t K, const std::vector<Mat>& mats) {
  thread_local QuantAct qa;
#if defined(__AVX512F__) && defined(__AVX512BW__)
  if (M > TEAM_FROM) {  // a prefill: rows in the lanes, the weights unpacked a tile at a time
    thread_local LaneAct la;
    quantize_act(x, M, K, qa, false);
    lane_act(qa, M, la);
    lane_product<G4, true>(la, M, K, mats, [K](const Mat& mat, int64_t n0, int R, int8_t* w, int64_t Kp) {
      const __m256i eight = _mm256_set1_epi8(8);
      for (int r = 0; r < R; ++r) {
        const uint8_t* q = static_cast<const uint8_t*>(mat.w) + (n0 + r) * mat.ldw;
        for (int64_t g = 0; g < K / G4; ++g)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + r * Kp + g * G4),
                              _mm256_sub_epi8(unpack_q4(q + g * 16), eight));
      }
    });
    return;
  }
#endif
  quantize_act(x, M, K, qa, false, true);  // once for every matrix of the call, in pairs
  const QuantAct& q = qa;
  thread_local std::vector<int32_t> cg_;
  std::vector<int32_t>& cg = cg_;
  if (std::any_of(mats.begin(), mats.end(), [](const Mat& m) { return m.scale16 != nullptr; }))
    q4t_offsets(qa, M, K, cg);
  if (M <= MB &&
      std::all_of(mats.begin(), mats.end(), [](const Mat& m) { return m.scale16 != nullptr; })) {
    // a decode step's rows, every matrix in tiles: several tiles a pass (over_tile_streams)
    over_tile_streams(mats, K, q4t_streams(M), [&](const TileRef* tiles, int n) {
      float sums[4][MB * RT];
      float* out[4] = {sums[0], sums[1], sums[2], sums[3]};
      q4t_set(static_cast<int>(M), n, tiles, q, cg.data(), 0, K, out);
      store_tiles(out, n, tiles, static_cast<int>(M), 0);  // tiles carry no row scale
    }, false);
    return;
  }
  for (int64_t mc = 0; mc < M; mc += MC) {
    const int64_t mend = std::min(M, mc + MC);
    over_tiles(mats, K, [&](const Mat& mat, int64_t n0, int R) {
      float sums[MB * RT];
      for (int64_t m0 = mc; m0 < mend; m0 += MB) {
        const int mb = static_cast<int>(std::min<int64_t>(MB, mend - m0));
        if (mat.scale16) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
          const TileRef tile{&mat, n0, R};
          float* out[1] = {sums};
          q4t_set(mb, 1, &tile, q, cg.data(), m0, K, out);
#else
          q4t_prefill_rows(mb, mat, n0, q, cg.data(), m0, K, sums);
#endif
        } else {
          q4_rows(mb, R, q, m0, mat, n0, K, sums);
        }
        store(sums, mb, R, n0, nullptr, mat.bias, mat.out + m0 * mat.N, mat.N);
      }
    }, M > TEAM_FROM);
  }
}

// The weights W [N, K] fp32 of int4 q [N, K/2] and scale [N, K/32]: W = d · (u - 8), as
// astrai/model/quant4.py dequantize_groups computes them (the same bits), rows over torch's
// OpenMP team (a prefill multiplies them with torch's GEMM right after: over_tiles says
// why not the decode pool).
at::Tensor dequant_q4(const at::Tensor& q, const at::Tensor& scale) {
  TORCH_CHECK(q.scalar_type() == at::kByte && q.dim() == 2 && q.is_contiguous() && !q.is_cuda(),
              "dequant_q4: q must be contiguous uint8 [N, K/2] on the CPU");
  const int64_t N = q.size(0), K = q.size(1) * 2;
  TORCH_CHECK(K % G4 == 0, "dequant_q4: K = ", K, " must be a multiple of ", G4);
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && !scale.is_cuda() &&
                  scale.dim() == 2 && scale.size(0) == N && scale.size(1) == K / G4,
              "dequant_q4: scale must be contiguous fp32 [", N, ", ", K / G4, "]");
  at::Tensor out = at::empty({N, K}, scale.options());
  const uint8_t* pq = q.data_ptr<uint8_t>();
  const float* pd = scale.data_ptr<float>();
  float* po = out.data_ptr<float>();
  at::parallel_for(0, N, std::max<int64_t>(1, 65536 / K), [&](int64_t n0, int64_t n1) {
    const __m256 eight = _mm256_set1_ps(8.f);
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t g = 0; g < K / G4; ++g) {
        alignas(32) uint8_t u[32];
        _mm256_store_si256(reinterpret_cast<__m256i*>(u), unpack_q4(pq + n * (K / 2) + g * 16));
        const __m256 dv = _mm256_set1_ps(pd[n * (K / G4) + g]);
        for (int c = 0; c < 4; ++c) {
          const __m256i iv = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(u + 8 * c)));
          _mm256_storeu_ps(po + n * K + g * G4 + 8 * c,
                           _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(iv), eight), dv));
        }
      }
  });
  return out;
}


// Σ x² in VL lanes (then their sum, then the tail): torch's own reduction also sums in
// lanes, so neither order is the reference's; a sequential sum would be a latency chain of
// C adds on every norm of a decode step.
template <typename T>
float sum_squares(const T* x, int64_t C) {
  vf acc = vzero();
  int64_t c = 0;
  for (; c + VL <= C; c += VL) {
    const vf v = wload(x + c);
    acc = vfma(v, v, acc);
  }
  float ss = vsum(acc);
  for (; c < C; ++c) ss += to_f(x[c]) * to_f(x[c]);
  return ss;
}

// RMSNorm of a few rows (the norms around a decode step's products), as astrai/model/norm.py:
// fp32: x · rsqrt(mean(x²) + eps) · w; bf16: w · bf16(x · rsqrt(mean(x²) + eps)) with the
// statistics in fp32 and each product rounded once to bf16, as HF Llama's RMSNorm. One
// thread: a row is a few KB, less than a parallel region costs.
template <typename T>
void rms_rows(const T* x, const T* w, T* out, int64_t rows, int64_t C, float eps) {
  for (int64_t i = 0; i < rows; ++i) {
    const T* xr = x + i * C;
    T* o = out + i * C;
    const float ss = sum_squares(xr, C);
    const float r = 1.f / std::sqrt(ss / static_cast<float>(C) + eps);
    for (int64_t c = 0; c < C; ++c) {
      if constexpr (std::is_same_v<T, float>) {
        o[c] = xr[c] * r * w[c];
      } else {
        const T normed = static_cast<T>(static_cast<float>(xr[c]) * r);
        o[c] = static_cast<T>(static_cast<float>(w[c]) * static_cast<float>(normed));
      }
    }
  }
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  TORCH_CHECK(!x.is_cuda() && x.scalar_type() == w.scalar_type() && w.dim() == 1 &&
                  x.size(-1) == w.size(0) &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "rms_norm: x [..., C] and w [C] of one dtype, fp32 or bf16, on the CPU");
  const at::Tensor xc = x.contiguous(), wc = w.contiguous();
  at::Tensor out = at::empty_like(xc);
  const int64_t C = x.size(-1), rows = C ? xc.numel() / C : 0;
  if (x.scalar_type() == at::kFloat)
    rms_rows(xc.data_ptr<float>(), wc.data_ptr<float>(), out.data_ptr<float>(), rows, C,
             static_cast<float>(eps));
  else
    rms_rows(xc.data_ptr<c10::BFloat16>(), wc.data_ptr<c10::BFloat16>(),
             out.data_ptr<c10::BFloat16>(), rows, C, static_cast<float>(eps));
  return out;
}

// Decode attention over the paged KV pool (the engine's layout, astrai/infer/cache/record.py):
// one query per request, q [B, H, D]; request b attends to slots req_to_token[row_b, :len_b]
// of k_buf / v_buf [S, Kh, D]; query head h reads kv head h / (H / Kh). The math of
// astrai/kernels/reference.py paged_decode_ref in fp32 (scores, softmax, weighted sum), the
// result rounded once to q's dtype. Threads take (request, kv head) pairs; the H / Kh query
// heads of a pair share each key and value read.
// e^x for x <= 0 (softmax after the max is taken off), Cephes' expf polynomial: relative
// error ~1e-7; below -87 it is 0.
inline vf vexp_neg(vf x) {
  x = vmaxv(x, vset1(-87.f));
  const vf n = vfloor(vfma(x, vset1(1.44269504088896341f), vset1(0.5f)));
  vf r = vfma(n, vset1(-0.693359375f), x);
  r = vfma(n, vset1(2.12194440e-4f), r);
  vf y = vset1(1.9875691500e-4f);
  y = vfma(y, r, vset1(1.3981999507e-3f));
  y = vfma(y, r, vset1(8.3334519073e-3f));
  y = vfma(y, r, vset1(4.1665795894e-2f));
  y = vfma(y, r, vset1(1.6666665459e-1f));
  y = vfma(y, r, vset1(5.0000001201e-1f));
  y = vfma(y, vmul(r, r), vadd(r, vset1(1.f)));
  return vmul(y, vpow2i(n));
}

// silu(a) = a · sigmoid(a), the sigmoid from e = e^-|a| <= 1 (vexp_neg: no overflow):
// 1 / (1 + e) for a >= 0, e / (1 + e) below. NaN stays NaN.
inline vf vsilu(vf a) {
  const vf e = vexp_neg(vnegabs(a)), one = vset1(1.f);
  return vmul(a, vdiv(vwhere_neg(a, e, one), vadd(one, e)));
}

// s[0:n] <- softmax(s[0:n]), in place.
inline void softmax(float* s, int64_t n) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, s[i]);
  const vf m = vset1(mx);
  vf acc = vzero();
  int64_t i = 0;
  for (; i + VL <= n; i += VL) {
    const vf e = vexp_neg(vadd(vload(s + i), vmul(m, vset1(-1.f))));
    vstore(s + i, e);
    acc = vadd(acc, e);
  }
  float sum = vsum(acc);
  for (; i < n; ++i) sum += (s[i] = std::exp(s[i] - mx));
  const float inv = n ? 1.f / sum : 0.f;
  const vf iv = vset1(inv);
  for (i = 0; i + VL <= n; i += VL) vstore(s + i, vmul(vload(s + i), iv));
  for (; i < n; ++i) s[i] *= inv;
}

template <typename T>
inline float dot(const float* a, const T* b, int64_t n) {
  vf acc = vzero();
  int64_t i = 0;
  for (; i + VL <= n; i += VL) acc = vfma(vload(a + i), wload(b + i), acc);
  float s = vsum(acc);
  for (; i < n; ++i) s += a[i] * to_f(b[i]);
  return s;
}

// Scores of one query head against four keys at once (four independent FMA chains: one key
// at a time waits on each chain's latency). q fp32 [D], pre-scaled.
template <typename T>
inline void dot4(const float* q, const T* const* k, int64_t D, float* s, int64_t ld) {
  vf a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
  int64_t d = 0;
  for (; d + VL <= D; d += VL) {
    const vf x = vload(q + d);
    a0 = vfma(x, wload(k[0] + d), a0);
    a1 = vfma(x, wload(k[1] + d), a1);
    a2 = vfma(x, wload(k[2] + d), a2);
    a3 = vfma(x, wload(k[3] + d), a3);
  }
  float r[4] = {vsum(a0), vsum(a1), vsum(a2), vsum(a3)};
  for (; d < D; ++d)
    for (int u = 0; u < 4; ++u) r[u] += q[d] * to_f(k[u][d]);
  for (int u = 0; u < 4; ++u) s[u * ld] = r[u];
}

// out[0:NV·VL] += Σ_j p[j] · v_j[off : off + NV·VL], the accumulators in registers.
template <typename T, int NV>
inline void weigh_block(const float* p, const T* vb, const int32_t* slots, int64_t L,
                        int64_t row, int64_t off, float* out) {
  vf a[NV];
  for (int u = 0; u < NV; ++u) a[u] = vload(out + u * VL);
  for (int64_t j = 0; j < L; ++j) {
    const vf pj = vset1(p[j]);
    const T* vr = vb + static_cast<int64_t>(slots[j]) * row + off;
    for (int u = 0; u < NV; ++u) a[u] = vfma(pj, wload(vr + u * VL), a[u]);
  }
  for (int u = 0; u < NV; ++u) vstore(out + u * VL, a[u]);
}

// out [D] += Σ_j p[j] · v_j, v_j the value row of slot j at offset `off` (its kv head).
template <typename T>
void weigh_values(const float* p, const T* vb, const int32_t* slots, int64_t L, int64_t row,
                  int64_t off, int64_t D, float* out) {
  int64_t d = 0;
  for (; d + 4 * VL <= D; d += 4 * VL) weigh_block<T, 4>(p, vb, slots, L, row, off + d, out + d);
  for (; d + VL <= D; d += VL) weigh_block<T, 1>(p, vb, slots, L, row, off + d, out + d);
  for (; d < D; ++d) {
    float a = out[d];
    for (int64_t j = 0; j < L; ++j) a += p[j] * to_f(vb[static_cast<int64_t>(slots[j]) * row + off + d]);
    out[d] = a;
  }
}

// Positions per pass of decode attention: a pass reads its positions' key (then value) rows
// once for every head of the piece, so a row ([kv head, D], the heads adjacent) is fetched
// from memory once and met by the other heads in cache (head by head over all positions,
// each head walked the pool at the row's stride). The pass's rows stay in a 32 KB L1 data
// cache while its heads meet them (AMD Zen 3 / Zen 4; Intel's is 48 KB since Ice Lake): 16 KB
// of rows a pass, 8 to 64 rows. 4 requests of ~600 positions, 125m int4 on 2 cores of an AMD
// EPYC (Zen 4): 8, 16 or 32 rows of 768 bytes 1.18-1.20x the decode steps per second of 64
// rows (48 KB), 4 rows 1.13x; with the L2 prefetch below, 64 rows 0.87x 16 KB, 6 KB 1.02x.
constexpr int64_t KV_PASS_BYTES = 16384;
inline int64_t kv_pass(int64_t row_bytes) {
  return std::clamp<int64_t>(KV_PASS_BYTES / std::max<int64_t>(row_bytes, 1), 8, 64);
}

// Ask for the n pool rows `slots` (the `cols` elements from `off` of each row) ahead of use: a
// pass's rows are scattered over the pool at the row stride, which the hardware prefetchers
// do not follow, so read one by one they cost a memory latency each. Into the L2 (T1), not the
// L1: a whole pass asked for at once into the L1 evicts the rows the pass is reading (4
// requests of ~600 positions, 125m int4, 2 cores, AMD EPYC Zen 4: 1.27x the decode steps per
// second of T0, whose figure no prefetch at all beat by 1.11x).
template <typename T>
void fetch_rows(const T* b, const int32_t* slots, int64_t n, int64_t row, int64_t off,
                int64_t cols) {
  const uintptr_t bytes = static_cast<uintptr_t>(cols) * sizeof(T);
  for (int64_t j = 0; j < n; ++j) {
    const uintptr_t p =
        reinterpret_cast<uintptr_t>(b + static_cast<int64_t>(slots[j]) * row + off);
    for (uintptr_t line = p & ~uintptr_t{63}; line < p + bytes; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T1);
  }
}

// One piece of decode attention: the nh = nkv · G query heads qf [nh, D] (fp32, pre-scaled)
// of kv heads h0 .. h0 + nkv over the L slots `slots`; sc [nh, L] scratch; acc [nh, D] out.
template <typename T>
void attend_piece(const float* qf, const T* kb, const T* vb, const int32_t* slots, int64_t L,
                  int64_t Kh, int64_t h0, int64_t nkv, int64_t G, int64_t D, float* sc,
                  float* acc) {
  const int64_t row = Kh * D, pass = kv_pass(nkv * D * static_cast<int64_t>(sizeof(T)));
  // each pass asks for the next one's rows (after the last key pass: the first value pass)
  fetch_rows(kb, slots, std::min(L, pass), row, h0 * D, nkv * D);
  for (int64_t j0 = 0; j0 < L; j0 += pass) {
    const int64_t j1 = std::min(L, j0 + pass);
    if (j1 < L) fetch_rows(kb, slots + j1, std::min(L - j1, pass), row, h0 * D, nkv * D);
    else fetch_rows(vb, slots, std::min(L, pass), row, h0 * D, nkv * D);
    for (int64_t kh = 0; kh < nkv; ++kh) {
      const int64_t off = (h0 + kh) * D;
      int64_t j = j0;
      for (; j + 4 <= j1; j += 4) {
        const T* k[4];
        for (int u = 0; u < 4; ++u) k[u] = kb + static_cast<int64_t>(slots[j + u]) * row + off;
        for (int64_t g = 0; g < G; ++g)
          dot4(qf + (kh * G + g) * D, k, D, sc + (kh * G + g) * L + j, 1);
      }
      for (; j < j1; ++j)
        for (int64_t g = 0; g < G; ++g)
          sc[(kh * G + g) * L + j] =
              dot(qf + (kh * G + g) * D, kb + static_cast<int64_t>(slots[j]) * row + off, D);
    }
  }
  for (int64_t i = 0; i < nkv * G; ++i) softmax(sc + i * L, L);
  std::fill(acc, acc + nkv * G * D, 0.f);
  for (int64_t j0 = 0; j0 < L; j0 += pass) {
    const int64_t n = std::min(pass, L - j0);
    if (j0 + n < L)
      fetch_rows(vb, slots + j0 + n, std::min(L - j0 - n, pass), row, h0 * D, nkv * D);
    for (int64_t i = 0; i < nkv * G; ++i)
      weigh_values(sc + i * L + j0, vb, slots + j0, n, row, (h0 + i / G) * D, D, acc + i * D);
  }
}

// Checks the indices a caller hands the decode attention before any memory is read through
// them — each row's request row of req_to_token, its KV length, and every slot of its first
// `len` entries — so an upstream bug raises instead of reading (or, with `slots`, writing)
// outside the pool. O(total KV length): the attention reads those slots anyway.
void check_kv_indices(const char* op, const int32_t* r2t, int64_t n_rows, int64_t ldr,
                      const int64_t* rows, const int32_t* lens, int64_t B, int64_t S,
                      const int64_t* slots = nullptr) {
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(rows[b] >= 0 && rows[b] < n_rows, op, ": request row ", rows[b],
                " outside req_to_token's ", n_rows, " rows");
    TORCH_CHECK(lens[b] >= 1 && lens[b] <= ldr, op, ": KV length ", lens[b], " outside 1..", ldr);
    if (slots != nullptr)
      TORCH_CHECK(slots[b] >= 0 && slots[b] < S, op, ": K/V slot ", slots[b],
                  " outside the pool's ", S, " slots");
    const int32_t* r = r2t + rows[b] * ldr;
    for (int64_t j = 0; j < lens[b]; ++j)
      TORCH_CHECK(r[j] >= 0 && r[j] < S, op, ": req_to_token[", rows[b], ", ", j, "] = ", r[j],
                  " outside the pool's ", S, " slots");
  }
}

template <typename T, typename KV>
void paged_decode_rows(const T* q, const KV* kb, const KV* vb, const int32_t* r2t, int64_t ldr,
                       const int64_t* rows, const int32_t* lens, int64_t B, int64_t H,
                       int64_t Kh, int64_t D, float scale, T* out) {
  const int64_t G = H / Kh;
  // pieces: (request, a contiguous run of kv heads); each key / value row is read once per
  // piece, position by position (the pool is [slot, kv head, D]: heads are adjacent)
  const int64_t per = std::max<int64_t>(1, (Kh + 1) / 2), pieces = (Kh + per - 1) / per;
  work_share::parallel(B * pieces, 1, [&](int64_t p0, int64_t p1) {
    std::vector<float> qf, acc, sc;
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t b = p / pieces, h0 = (p % pieces) * per, h1 = std::min(Kh, h0 + per);
      const int64_t nh = (h1 - h0) * G, L = lens[b];  // query heads of the piece
      qf.resize(nh * D);
      acc.resize(nh * D);
      sc.resize(nh * L);
      for (int64_t i = 0; i < nh * D; ++i)
        qf[i] = static_cast<float>(q[(b * H + h0 * G) * D + i]) * scale;
      attend_piece(qf.data(), kb, vb, r2t + rows[b] * ldr, L, Kh, h0, h1 - h0, G, D, sc.data(),
                   acc.data());
      for (int64_t i = 0; i < nh * D; ++i)
        out[(b * H + h0 * G) * D + i] = static_cast<T>(acc[i]);
    }
  });
}

at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                        const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                        const at::Tensor& seq_lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && k_buf.dim() == 3 && v_buf.sizes() == k_buf.sizes() &&
                  q.size(2) == k_buf.size(2) && q.size(1) % k_buf.size(1) == 0,
              "paged_decode: q [B, H, D], k_buf / v_buf [S, K, D] with K dividing H");
  TORCH_CHECK(q.scalar_type() == k_buf.scalar_type() && v_buf.scalar_type() == q.scalar_type() &&
                  (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16),
              "paged_decode: q, k_buf, v_buf of one dtype, fp32 or bf16");
  TORCH_CHECK(k_buf.is_contiguous() && v_buf.is_contiguous() && !q.is_cuda(),
              "paged_decode: contiguous CPU K/V buffers");
  const at::Tensor qc = q.contiguous();
  const at::Tensor r2t = req_to_token.to(at::kInt).contiguous();
  const at::Tensor rows = req_pool_indices.to(at::kLong).contiguous();
  const at::Tensor lens = seq_lens.to(at::kInt).contiguous();
  at::Tensor out = at::empty_like(qc);
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), Kh = k_buf.size(1);
  TORCH_CHECK(r2t.dim() == 2 && rows.numel() == B && lens.numel() == B,
              "paged_decode: one request row and one length per query, req_to_token 2-D");
  check_kv_indices("paged_decode", r2t.data_ptr<int32_t>(), r2t.size(0), r2t.size(1),
                   rows.data_ptr<int64_t>(), lens.data_ptr<int32_t>(), B, k_buf.size(0));
  const float sc = static_cast<float>(scale);
  if (q.scalar_type() == at::kFloat)
    paged_decode_rows(qc.data_ptr<float>(), k_buf.data_ptr<float>(), v_buf.data_ptr<float>(),
                      r2t.data_ptr<int32_t>(), r2t.size(1), rows.data_ptr<int64_t>(),
                      lens.data_ptr<int32_t>(), B, H, Kh, D, sc, out.data_ptr<float>());
  else
    paged_decode_rows(qc.data_ptr<c10::BFloat16>(), k_buf.data_ptr<c10::BFloat16>(),
                      v_buf.data_ptr<c10::BFloat16>(), r2t.data_ptr<int32_t>(), r2t.size(1),
                      rows.data_ptr<int64_t>(), lens.data_ptr<int32_t>(), B, H, Kh, D, sc,
                      out.data_ptr<c10::BFloat16>());
  return out;
}

#include "decode_layers.h"

// The index of r[0 .. V)'s first maximum (a NaN counts as the maximum: its first one), in one
// pass: 4 × 8 lanes each keep their greatest value and its first index (a later equal value
// does not replace it), then the lanes' greatest value is found and, of the lanes that hold
// it, the least index. A second pass looked for the maximum's index one float at a time:
// 26 µs for 32,000 logits (Xeon, warm), a few percent of a small model's decode step.
inline int64_t first_max(const float* r, int64_t V) {
  constexpr int64_t W = 32;  // floats a turn: 4 vectors of 8
  int64_t i = 0;
  float best = -INFINITY;
  int64_t at = 0;
  bool nan = false;
  if (V >= W && V <= INT32_MAX) {
    __m256 m[4], un = _mm256_setzero_ps();
    __m256i idx[4];
    const __m256i step = _mm256_set1_epi32(W);
    __m256i cur[4];
    for (int u = 0; u < 4; ++u) {
      m[u] = _mm256_set1_ps(-INFINITY);
      idx[u] = _mm256_set1_epi32(0);
      cur[u] = _mm256_setr_epi32(8 * u, 8 * u + 1, 8 * u + 2, 8 * u + 3, 8 * u + 4, 8 * u + 5,
                                 8 * u + 6, 8 * u + 7);
    }
    for (; i + W <= V; i += W) {
      for (int u = 0; u < 4; ++u) {
        const __m256 v = _mm256_loadu_ps(r + i + 8 * u);
        const __m256 gt = _mm256_cmp_ps(v, m[u], _CMP_GT_OQ);
        un = _mm256_or_ps(un, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        m[u] = _mm256_blendv_ps(m[u], v, gt);
        idx[u] = _mm256_castps_si256(
            _mm256_blendv_ps(_mm256_castsi256_ps(idx[u]), _mm256_castsi256_ps(cur[u]), gt));
        cur[u] = _mm256_add_epi32(cur[u], step);
      }
    }
    nan = _mm256_movemask_ps(un) != 0;
    alignas(32) float mv[4][8];
    alignas(32) int32_t iv[4][8];
    for (int u = 0; u < 4; ++u) {
      _mm256_store_ps(mv[u], m[u]);
      _mm256_store_si256(reinterpret_cast<__m256i*>(iv[u]), idx[u]);
    }
    for (int u = 0; u < 4; ++u)
      for (int l = 0; l < 8; ++l) best = std::max(best, mv[u][l]);
    at = V;  // lowered below: some lane holds `best` (no lane keeps a NaN)
    for (int u = 0; u < 4; ++u)
      for (int l = 0; l < 8; ++l)
        if (mv[u][l] == best) at = std::min<int64_t>(at, iv[u][l]);
  } else if (V > 0) {
    best = r[0];
    nan = std::isnan(best);
    i = 1;
  }
  for (; i < V && !nan; ++i) {  // the tail: later indices, so only a greater value wins
    nan = std::isnan(r[i]);
    if (r[i] > best) best = r[i], at = i;
  }
  if (nan) {
    at = 0;
    while (!std::isnan(r[at])) ++at;
  }
  return at;
}

// The index of each row's first maximum, x [B, V] fp32 -> [B] int64, as torch's max(dim=-1)
// gives it (a NaN counts as the maximum: its first one). One thread: a greedy step's logits
// are a few rows, and torch's reduction opens an OpenMP region whose spinning threads then
// compete with the decode pool's for the cores (0.7x the steps per second with 4 requests on
// 2 cores).
at::Tensor first_argmax(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && !x.is_cuda() && x.size(1) > 0,
              "first_argmax: x must be a fp32 CPU tensor [B, V] with V >= 1");
  const at::Tensor xc = x.contiguous();
  const int64_t B = xc.size(0), V = xc.size(1);
  at::Tensor out = at::empty({B}, xc.options().dtype(at::kLong));
  const float* px = xc.data_ptr<float>();
  int64_t* po = out.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) po[b] = first_max(px + b * V, V);
  return out;
}

// What this build is: floats per vector (16: AVX-512, 8: AVX2), VNNI (1/0), the block QK,
// AVX512-BF16 dots (1/0), the rows of a tile of int4 weights in tiles (0: rows only).
std::vector<int64_t> info() { return {VL, kVnni ? 1 : 0, QK, kBf16Dot ? 1 : 0, Q4T}; }

// Read streams a decode product's thread takes at once from now on (over_tile_streams): 1 to
// kMaxStreams (each product takes at most what it can), 0 this CPU's choice (cpu_streams); returns the number in force. For tests and
// measurements: call it between products, never during one.
int64_t set_streams(int64_t n) {
  TORCH_CHECK(n >= 0 && n <= kMaxStreams, "set_streams: 0 to ", kMaxStreams, ", got ", n);
  g_streams.store(n ? static_cast<int>(n) : cpu_streams());
  return streams();
}

// The work-sharing loop over n items in pieces of at least `grain`, for tests: [2, n] int64,
// row 0 how many times item i ran (once), row 1 whether the calling thread ran it. The first
// piece each worker runs sleeps stall_us first, as a thread the OS deschedules mid-piece.
at::Tensor share_probe(int64_t n, int64_t grain, int64_t stall_us) {
  TORCH_CHECK(n >= 1 && grain >= 1 && stall_us >= 0, "share_probe: n, grain >= 1, stall_us >= 0");
  std::vector<std::atomic<int64_t>> runs(n);
  at::Tensor out = at::zeros({2, n}, at::kLong);
  int64_t* by_caller = out.data_ptr<int64_t>() + n;
  const std::thread::id caller = std::this_thread::get_id();
  std::mutex mu;
  std::vector<std::thread::id> stalled;
  work_share::parallel(n, grain, [&](int64_t i0, int64_t i1) {
    const std::thread::id me = std::this_thread::get_id();
    const bool mine = me == caller;
    if (!mine && stall_us > 0) {
      std::unique_lock<std::mutex> lk(mu);
      if (std::find(stalled.begin(), stalled.end(), me) == stalled.end()) {
        stalled.push_back(me);
        lk.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(stall_us));
      }
    }
    for (int64_t i = i0; i < i1; ++i) {
      runs[i].fetch_add(1);
      by_caller[i] = mine;
    }
  });
  for (int64_t i = 0; i < n; ++i) out.data_ptr<int64_t>()[i] = runs[i].load();
  return out;
}

// decode_layers' per-block weight order by name: astrai/infer/native_step.py packs each
// block's weights by these names, so the order lives here alone.
std::vector<std::string> slot_names() {
  return std::vector<std::string>(kSlotNames, kSlotNames + kSlots);
}

}  // namespace

TORCH_LIBRARY(ASTRAI_CPU_NS, m) {
  m.def("gemv(Tensor x, Tensor w, Tensor? bias=None) -> Tensor");
  m.def("gemv_int8(Tensor x, Tensor q, Tensor scale, Tensor? bias=None) -> Tensor");
  m.def("gemv_q8(Tensor x, Tensor q, Tensor scale, Tensor? bias=None) -> Tensor");
  m.def("gemv_many(Tensor x, Tensor[] w, Tensor?[] bias) -> Tensor[]");
  m.def("gemv_int8_many(Tensor x, Tensor[] q, Tensor[] scale, Tensor?[] bias) -> Tensor[]");
  m.def("gemv_q8_many(Tensor x, Tensor[] q, Tensor[] scale, Tensor?[] bias) -> Tensor[]");
  m.def("gemv_q4(Tensor x, Tensor q, Tensor scale, Tensor? bias=None) -> Tensor");
  m.def("gemv_q4_many(Tensor x, Tensor[] q, Tensor[] scale, Tensor?[] bias) -> Tensor[]");
  m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor");
  m.def("paged_decode(Tensor q, Tensor k_buf, Tensor v_buf, Tensor req_to_token, "
        "Tensor req_pool_indices, Tensor seq_lens, float scale) -> Tensor");
  m.class_<DecodePlan>("DecodePlan")
      .def(torch::init<c10::List<Opt>, std::vector<int64_t>, double, at::Tensor, at::Tensor>());
  m.def("decode_layers(__torch__.torch.classes." ASTRAI_STR(ASTRAI_CPU_NS) ".DecodePlan plan, "
        "Tensor rows, Tensor cos, Tensor sin, Tensor k_buf, Tensor v_buf, Tensor req_to_token, "
        "Tensor?[] head) -> Tensor");
  m.def("first_argmax(Tensor x) -> Tensor");
  m.def("dequant_q4(Tensor q, Tensor scale) -> Tensor");
  m.def("info() -> int[]", &info);
  m.def("slot_names() -> str[]", &slot_names);
  m.def("set_streams(int n) -> int", &set_streams);
  m.def("share_probe(int n, int grain, int stall_us) -> Tensor", &share_probe);
  m.impl("gemv", c10::DispatchKey::CPU, &gemv);
  m.impl("gemv_int8", c10::DispatchKey::CPU, &gemv_int8);
  m.impl("gemv_q8", c10::DispatchKey::CPU, &gemv_q8);
  m.impl("gemv_many", c10::DispatchKey::CPU, &gemv_many);
  m.impl("gemv_int8_many", c10::DispatchKey::CPU, &gemv_int8_many);
  m.impl("gemv_q8_many", c10::DispatchKey::CPU, &gemv_q8_many);
  m.impl("gemv_q4", c10::DispatchKey::CPU, &gemv_q4);
  m.impl("gemv_q4_many", c10::DispatchKey::CPU, &gemv_q4_many);
  m.impl("rms_norm", c10::DispatchKey::CPU, &rms_norm);
  m.impl("paged_decode", c10::DispatchKey::CPU, &paged_decode);
  m.impl("decode_layers", c10::DispatchKey::CPU, &decode_layers);
  m.impl("first_argmax", c10::DispatchKey::CPU, &first_argmax);
  m.impl("dequant_q4", c10::DispatchKey::CPU, &dequant_q4);
}
