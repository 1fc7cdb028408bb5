// Whole decode layers: every block of a Llama-family decoder (Llama, Qwen2's q/k/v biases,
// Qwen3's QK-norm, Mistral within its window) for a few query rows in one call, then the final
// norm — what astrai/model/block.py and attention.py compute, with the products of the kernels
// above, the paged decode attention above, and the small ops between them (RoPE, the K/V write,
// residual adds, SwiGLU) as loops over the few rows: a decode step of a small model is bound by
// the per-operator overhead of those, not by their arithmetic (docs/engine.md "Native decode
// step"). Included by decode_gemv.cpp, inside its namespace (its includes at its top).
//
// Each row is one query: its token's position, its request's row of req_to_token, its KV
// length (position + 1) and the slot its K/V go to. A request verifying k speculative tokens
// brings k + 1 rows with consecutive positions: every row's K/V is written before any row
// attends, so row i sees the rows before it and not those after — causal attention over the
// pool, as vLLM and FlashInfer run a verify step as a decode of several queries per request.
//
// Rounding follows the torch ops it replaces: every product and elementwise result is
// rounded once to the activations' dtype T (bf16: each multiply of RoPE and SwiGLU too), the
// norms and softmax in fp32.

// Rows a product goes to the kernel for, per weight format (fast_path.DecodeKernels); outside,
// at::linear (torch's GEMV / GEMM). int8 products always take the kernel.
struct RowRange {
  int64_t f32_lo, f32_hi, bf16_lo, bf16_hi;
  bool q8;  // int8 weights: activations quantized per block (gemv_q8) or fp32 (gemv_int8)
};

// y [N] = W · x for one fp32 row x [K] through the BLAS's sgemv: W [N, K] (`wt` false) or
// its transpose [K, N] (`wt` true; a long LM head streams faster that way). One fp32 row is
// the BLAS's to take (RowRange) and at::linear's dispatch, checks and allocation cost ~2 µs a
// product, a tenth of a small model's step. The integers are passed as 64-bit values: read as
// LP64 or ILP64 ints, a little-endian BLAS sees the same numbers.
void sgemv_call(const float* w, int64_t N, int64_t K, bool wt, const float* x, float* y) {
  const int64_t m = wt ? N : K, n = wt ? K : N, one = 1;
  const float alpha = 1.f, beta = 0.f;
  auto i = [](const int64_t& v) { return reinterpret_cast<const int*>(&v); };
  sgemv_(wt ? "N" : "T", i(m), i(n), &alpha, w, i(m), x, i(one), &beta, y, i(one));
}

// Whether sgemv_ is there and computes what the loop does (once per process).
bool blas_usable() {
  static const bool ok = [] {
    if (sgemv_ == nullptr) return false;
    const int64_t N = 5, K = 3;
    float w[N * K], wt[K * N], x[K] = {1.f, -2.f, 0.5f}, y[N], yt[N];
    for (int64_t r = 0; r < N; ++r)
      for (int64_t k = 0; k < K; ++k) w[r * K + k] = wt[k * N + r] = 0.25f * (r + 1) - 0.5f * k;
    sgemv_call(w, N, K, false, x, y);
    sgemv_call(wt, N, K, true, x, yt);
    for (int64_t r = 0; r < N; ++r) {
      float ref = 0.f;
      for (int64_t k = 0; k < K; ++k) ref += w[r * K + k] * x[k];
      if (std::abs(y[r] - ref) > 1e-5f || std::abs(yt[r] - ref) > 1e-5f) return false;
    }
    return true;
  }();
  return ok;
}

template <typename T>
inline float rnd(float v) {  // v rounded to T
  return static_cast<float>(static_cast<T>(v));
}

// RoPE, rotate-half pairing, in place on x [N, heads, D] with cos / sin [N, D/2] fp32
// (astrai/model/rope.py `rotate`: x · [cos, cos] + [x2, x1] · [-sin, sin], the factors in T).
template <typename T>
void rope_rows(T* x, int64_t N, int64_t heads, int64_t D, const float* cos, const float* sin) {
  const int64_t h2 = D / 2;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < heads; ++h) {
      T* r = x + (n * heads + h) * D;
      for (int64_t i = 0; i < h2; ++i) {
        const float c = rnd<T>(cos[n * h2 + i]), s = rnd<T>(sin[n * h2 + i]);
        const float a = static_cast<float>(r[i]), b = static_cast<float>(r[i + h2]);
        r[i] = static_cast<T>(rnd<T>(a * c) + rnd<T>(-(b * s)));
        r[i + h2] = static_cast<T>(rnd<T>(b * c) + rnd<T>(a * s));
      }
    }
}

template <typename T>
void add_rows(T* x, const T* y, int64_t n) {  // x += y
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<T>(static_cast<float>(x[i]) + static_cast<float>(y[i]));
}

// silu(g) · u, each rounded to T; silu in VL lanes (vsilu: a decode step of a 125m model takes
// 27,648 of them, 157 µs of a 4.3 ms step one std::exp at a time on one thread, 27 in lanes).
template <typename T>
void swiglu_rows(const T* g, const T* u, T* out, int64_t n) {
  alignas(64) float sl[VL];
  for (int64_t i0 = 0; i0 < n; i0 += VL) {
    const int64_t m = std::min<int64_t>(VL, n - i0);
    if (m == VL) {
      vstore(sl, vsilu(wload(g + i0)));
    } else {
      for (int64_t i = 0; i < VL; ++i) sl[i] = i < m ? to_f(g[i0 + i]) : 0.f;
      vstore(sl, vsilu(vload(sl)));
    }
    for (int64_t i = 0; i < m; ++i)
      out[i0 + i] = static_cast<T>(rnd<T>(sl[i]) * static_cast<float>(u[i0 + i]));
  }
}

constexpr int64_t kSlots = 21;  // weights per layer in decode_layers' list
enum Slot : int64_t {
  ATTN_NORM, Q, K, V, Q_SCALE, K_SCALE, V_SCALE, Q_BIAS, K_BIAS, V_BIAS, Q_NORM, K_NORM,
  O, O_SCALE, MLP_NORM, GATE, UP, DOWN, GATE_SCALE, UP_SCALE, DOWN_SCALE
};
// The names of the slots, in the enum's order (the `slot_names` op hands them to Python).
constexpr const char* kSlotNames[] = {
  "attn_norm", "q", "k", "v", "q_scale", "k_scale", "v_scale", "q_bias", "k_bias", "v_bias",
  "q_norm", "k_norm", "o", "o_scale", "mlp_norm", "gate", "up", "down", "gate_scale",
  "up_scale", "down_scale"};
static_assert(sizeof(kSlotNames) / sizeof(kSlotNames[0]) == kSlots && DOWN_SCALE == kSlots - 1,
              "one name per slot");

struct Step {  // one call's rows
  int64_t N;
  const float *cos, *sin;  // [N, D/2]: each row's RoPE factors
  const int32_t* r2t;
  int64_t ldr;
  const int64_t *rows, *slots;
  const int32_t* lens;
};

// Each row's K/V into its slot, rounded to the pool's dtype KV where it is narrower (as the
// eager path's `.to`: to nearest, ties to even).
template <typename T, typename KV>
void write_kv(const T* k, const T* v, KV* kb, KV* vb, int64_t row, const Step& s) {
  for (int64_t n = 0; n < s.N; ++n) {
    KV *kd = kb + s.slots[n] * row, *vd = vb + s.slots[n] * row;
    if constexpr (std::is_same_v<T, KV>) {
      std::memcpy(kd, k + n * row, row * sizeof(T));
      std::memcpy(vd, v + n * row, row * sizeof(T));
    } else {
      for (int64_t i = 0; i < row; ++i) {
        kd[i] = static_cast<KV>(static_cast<float>(k[n * row + i]));
        vd[i] = static_cast<KV>(static_cast<float>(v[n * row + i]));
      }
    }
  }
}

template <typename T>
constexpr at::ScalarType dtype_of() {
  return std::is_same_v<T, float> ? at::kFloat : at::kBFloat16;
}

// The step's weights, checked once and held as products and raw pointers (decode_plan): a
// step then touches no tensor between its parallel loops. Those stretches are serial — the
// other threads wait — and a tensor's metadata, evicted by the weights streamed since the
// previous step, costs a few cache misses at each touch: ~8 µs between two loops of a 125m
// int4 step (0.5 ms a step in all, 61 loops) with a tensor per operand, ~3 µs (0.18 ms)
// with the plan (2-core Xeon, timed inside the operator). The plan reads the weights' own storage (in-place updates are seen); it
// copies only a bias or scale not in fp32 and a weight whose rows are not contiguous.
class DecodePlan : public torch::CustomClassHolder {
 public:
  // weights: kSlots per block (slot_names); shape [H, K, D, f32_lo, f32_hi, bf16_lo,
  // bf16_hi, q8]; embed [V, C] the input embedding, fp32 or bf16 (the activations' dtype);
  // norm [C] the final norm's gain.
  DecodePlan(const c10::List<Opt>& weights, std::vector<int64_t> shape, double eps,
             at::Tensor embed, at::Tensor norm) {
    TORCH_CHECK(shape.size() == 8, "decode_plan: shape [H, K, D, f32_lo, f32_hi, bf16_lo, bf16_hi, q8]");
    TORCH_CHECK(embed.dim() == 2 && !embed.is_cuda() &&
                    (embed.scalar_type() == at::kFloat || embed.scalar_type() == at::kBFloat16),
                "decode_plan: embed [V, C] fp32 or bf16 on the CPU");
    TORCH_CHECK(weights.size() % kSlots == 0 && !weights.empty(), "decode_plan: ", kSlots,
                " weights (or None) per block");
    embed_ = embed.contiguous();
    dtype_ = embed.scalar_type();
    H_ = shape[0], Kh_ = shape[1], D_ = shape[2], C_ = embed.size(1);
    TORCH_CHECK(H_ > 0 && Kh_ > 0 && H_ % Kh_ == 0 && D_ > 0 && D_ % 2 == 0,
                "decode_plan: H, K, D positive, K dividing H, D even");
    rr_ = {shape[3], shape[4], shape[5], shape[6], shape[7] != 0};
    eps_ = static_cast<float>(eps);
    norm_ = gain(norm, C_, "norm");
    for (size_t base = 0; base < weights.size(); base += kSlots) {
      auto at_ = [&](int64_t i) { return weights.get(base + i); };
      Layer l;
      l.attn_norm = gain(at_(ATTN_NORM), C_, "attn_norm");
      l.mlp_norm = gain(at_(MLP_NORM), C_, "mlp_norm");
      TORCH_CHECK(at_(Q_NORM).has_value() == at_(K_NORM).has_value(),
                  "decode_plan: q_norm and k_norm together");
      if (at_(Q_NORM).has_value()) {
        l.q_norm = gain(at_(Q_NORM), D_, "q_norm");
        l.k_norm = gain(at_(K_NORM), D_, "k_norm");
      }
      l.qkv = product({Q, K, V}, {Q_SCALE, K_SCALE, V_SCALE}, {Q_BIAS, K_BIAS, V_BIAS}, at_, C_,
                      {H_ * D_, Kh_ * D_, Kh_ * D_}, "q / k / v");
      l.o = product({O}, {O_SCALE}, {-1}, at_, H_ * D_, {C_}, "o");
      const int64_t F = at_(GATE).has_value() ? out_rows(*at_(GATE)) : 0;
      TORCH_CHECK(layers_.empty() || F == F_, "decode_plan: blocks of one MLP width");
      F_ = F;
      l.gu = product({GATE, UP}, {GATE_SCALE, UP_SCALE}, {-1, -1}, at_, C_, {F, F}, "gate / up");
      l.down = product({DOWN}, {DOWN_SCALE}, {-1}, at_, F, {C_}, "down");
      layers_.push_back(std::move(l));
    }
  }

  // rows [5, N] int64: token ids, positions, request rows, KV lengths, slots; cos / sin
  // [max_len, D/2] fp32 the model's RoPE tables; k_buf / v_buf [L, S, K, D] the KV pool;
  // head [weight, scale, bias, the fp32 weight's transpose or None] (or empty: the normed
  // rows [N, C] are returned, not logits).
  at::Tensor run(const at::Tensor& rows5, const at::Tensor& cos, const at::Tensor& sin,
                 const at::Tensor& k_buf, const at::Tensor& v_buf,
                 const at::Tensor& req_to_token, const c10::List<Opt>& head) {
    std::lock_guard<std::mutex> lk(mu_);  // one step at a time: the scratch is the plan's
    const int64_t L = static_cast<int64_t>(layers_.size()), h2 = D_ / 2;
    const at::ScalarType kv = k_buf.scalar_type();
    TORCH_CHECK(k_buf.dim() == 4 && k_buf.is_contiguous() && v_buf.is_contiguous() &&
                    v_buf.sizes() == k_buf.sizes() && k_buf.size(0) == L &&
                    k_buf.size(2) == Kh_ && k_buf.size(3) == D_ && !k_buf.is_cuda() &&
                    v_buf.scalar_type() == kv &&
                    (kv == dtype_ || (dtype_ == at::kFloat && (kv == at::kBFloat16 || kv == at::kHalf))),
                "decode_layers: k_buf / v_buf [", L, ", S, ", Kh_, ", ", D_,
                "] contiguous on the CPU, of the embedding's dtype (fp32 activations: or bf16 / fp16)");
    TORCH_CHECK(rows5.dim() == 2 && rows5.size(0) == 5 && rows5.scalar_type() == at::kLong &&
                    rows5.is_contiguous() && cos.scalar_type() == at::kFloat &&
                    sin.scalar_type() == at::kFloat && cos.dim() == 2 &&
                    cos.sizes() == sin.sizes() && cos.is_contiguous() && sin.is_contiguous() &&
                    cos.size(1) == h2 && req_to_token.scalar_type() == at::kInt &&
                    req_to_token.dim() == 2 && req_to_token.is_contiguous(),
                "decode_layers: rows [5, N] int64 contiguous, cos / sin [max_len, D/2] fp32, "
                "req_to_token int32 contiguous");
    const int64_t N = rows5.size(1);
    const int64_t *ids = rows5.data_ptr<int64_t>(), *pos = ids + N;
    cs_.resize(N * h2);
    sn_.resize(N * h2);
    lens_.resize(N);
    for (int64_t n = 0; n < N; ++n) {
      TORCH_CHECK(ids[n] >= 0 && ids[n] < embed_.size(0) && pos[n] >= 0 && pos[n] < cos.size(0),
                  "decode_layers: token id or position out of range");
      std::memcpy(cs_.data() + n * h2, cos.data_ptr<float>() + pos[n] * h2, h2 * sizeof(float));
      std::memcpy(sn_.data() + n * h2, sin.data_ptr<float>() + pos[n] * h2, h2 * sizeof(float));
      lens_[n] = static_cast<int32_t>(ids[3 * N + n]);
    }
    check_kv_indices("decode_layers", req_to_token.data_ptr<int32_t>(), req_to_token.size(0),
                     req_to_token.size(1), ids + 2 * N, lens_.data(), N, k_buf.size(1), ids + 4 * N);
    const Step s{N, cs_.data(), sn_.data(), req_to_token.data_ptr<int32_t>(),
                 req_to_token.size(1), ids + 2 * N, ids + 4 * N, lens_.data()};
    at::Tensor h = at::empty({N, C_}, embed_.options());
    if (dtype_ == at::kBFloat16) return step<c10::BFloat16, c10::BFloat16>(ids, k_buf, v_buf, s, h, head);
    if (kv == at::kBFloat16) return step<float, c10::BFloat16>(ids, k_buf, v_buf, s, h, head);
    if (kv == at::kHalf) return step<float, c10::Half>(ids, k_buf, v_buf, s, h, head);
    return step<float, float>(ids, k_buf, v_buf, s, h, head);
  }

 private:
  struct Layer {
    const void *attn_norm = nullptr, *mlp_norm = nullptr, *q_norm = nullptr, *k_norm = nullptr;
    Product qkv, o, gu, down;
  };

  // Per-row working rows of a step (T: the activations; fp32: a bf16 step's product inputs
  // and outputs), carved from one buffer the plan keeps and grows.
  template <typename T>
  struct Rows {
    T *x, *h, *q, *k, *v, *att, *o, *g, *u, *a, *d;
    float *f_in, *f_out;
  };

  static int64_t out_rows(const at::Tensor& w) {  // int4 in tiles: [N/16, K/32, 256]
    return w.dim() == 3 ? w.size(0) * Q4T : w.size(0);
  }

  const void* gain(const Opt& w, int64_t n, const char* what) {
    TORCH_CHECK(w.has_value() && w->numel() == n && w->scalar_type() == dtype_ && !w->is_cuda(),
                "decode_plan: ", what, " must be a CPU vector of ", n, " in the embedding's dtype");
    at::Tensor c = w->contiguous();
    keep_.push_back(c);
    return c.data_ptr();
  }

  // The product of slots `ws` (their scales and biases; -1: none), checked against the
  // block's widths: K inputs, outputs `N`; float weights of the activations' dtype.
  template <typename Get>
  Product product(std::initializer_list<int64_t> ws, std::initializer_list<int64_t> scales,
                  std::initializer_list<int64_t> biases, const Get& at_, int64_t K,
                  std::initializer_list<int64_t> N, const char* what) {
    std::vector<at::Tensor> w;
    std::vector<Opt> sc, b;
    for (int64_t i : ws) {
      TORCH_CHECK(at_(i).has_value(), "decode_plan: a block without its ", what, " weights");
      w.push_back(*at_(i));
    }
    const at::ScalarType t = w[0].scalar_type();
    if (t == at::kChar || t == at::kByte)
      for (int64_t i : scales) sc.push_back(at_(i));
    else
      TORCH_CHECK(t == dtype_, "decode_plan: ", what, " weights ", t,
                  " with activations ", dtype_);
    for (int64_t i : biases) b.push_back(i < 0 ? std::nullopt : at_(i));
    Product p = make_product(K, w, sc, b, "decode_plan");
    auto n = N.begin();
    for (const Mat& m : p.mats)
      TORCH_CHECK(m.N == *n++, "decode_plan: ", what, " weights of ", m.N, " rows, expected ",
                  *(n - 1));
    return p;
  }

  template <typename T>
  Rows<T> rows(int64_t N) {
    const int64_t C = C_, HD = H_ * D_, KD = Kh_ * D_, F = F_;
    auto up = [](int64_t n) { return (n + 15) / 16 * 16; };  // 64-byte aligned rows
    const int64_t t_sizes[] = {C, C, HD, KD, KD, HD, C, F, F, F, C};
    const int64_t f_in = std::max({C, HD, F}), f_out = std::max({HD + 2 * KD, 2 * F, C});
    int64_t bytes = 0;
    for (int64_t n : t_sizes) bytes += up(N * n) * sizeof(T);
    bytes += (up(N * f_in) + up(N * f_out)) * sizeof(float);
    if (!scratch_.defined() || scratch_.numel() < bytes)
      scratch_ = at::empty({bytes}, at::TensorOptions().dtype(at::kByte));
    char* p = static_cast<char*>(scratch_.data_ptr());
    auto take = [&](int64_t n, size_t each) {
      char* q = p;
      p += up(N * n) * each;
      return q;
    };
    Rows<T> r;
    T** ts[] = {&r.x, &r.h, &r.q, &r.k, &r.v, &r.att, &r.o, &r.g, &r.u, &r.a, &r.d};
    for (int i = 0; i < 11; ++i) *ts[i] = reinterpret_cast<T*>(take(t_sizes[i], sizeof(T)));
    r.f_in = reinterpret_cast<float*>(take(f_in, sizeof(float)));
    r.f_out = reinterpret_cast<float*>(take(f_out, sizeof(float)));
    return r;
  }

  // outs[i] [M, N_i] (T) = in [M, K] (T) against p's matrices: the kernels, or torch's
  // product for float weights outside their rows (RowRange): the BLAS's sgemv for one fp32
  // row, else at::linear. A bf16 step's products run in fp32 and are rounded once to bf16.
  template <typename T>
  void multiply(Product& p, const T* in, int64_t M, T* const* outs, float* f_in, float* f_out) {
    const int64_t K = p.K;
    const bool f32 = p.fmt == Fmt::F32, bf16 = p.fmt == Fmt::BF16;
    if ((f32 && (M < rr_.f32_lo || M > rr_.f32_hi)) ||
        (bf16 && (M < rr_.bf16_lo || M > rr_.bf16_hi))) {
      for (size_t i = 0; i < p.mats.size(); ++i) {
        const Mat& m = p.mats[i];
        if constexpr (std::is_same_v<T, float>) {
          if (M == 1 && m.ldw == K && blas_usable()) {
            sgemv_call(static_cast<const float*>(m.w), m.N, K, false, in, outs[i]);
            if (m.bias != nullptr)
              for (int64_t j = 0; j < m.N; ++j) outs[i][j] += m.bias[j];
            continue;
          }
        }
        const auto opts = at::TensorOptions().dtype(dtype_of<T>());
        const at::Tensor x = at::from_blob(const_cast<T*>(in), {M, K}, opts);
        at::from_blob(outs[i], {M, m.N}, opts).copy_(at::linear(x, p.ws[i], p.biases[i]));
      }
      return;
    }
    if constexpr (std::is_same_v<T, float>) {
      run_product(p, M, in, nullptr, rr_.q8, outs);
    } else {
      for (int64_t i = 0; i < M * K; ++i) f_in[i] = static_cast<float>(in[i]);
      float* fo[3];
      int64_t off = 0;
      for (size_t i = 0; i < p.mats.size(); ++i) {
        fo[i] = f_out + off;
        off += M * p.mats[i].N;
      }
      run_product(p, M, f_in, bf16 && kBf16Dot ? in : nullptr, rr_.q8, fo);
      for (size_t i = 0; i < p.mats.size(); ++i)
        for (int64_t j = 0; j < M * p.mats[i].N; ++j) outs[i][j] = static_cast<T>(fo[i][j]);
    }
  }

  template <typename T, typename KV>
  void layer(Layer& l, KV* kb, KV* vb, const Step& s, const Rows<T>& r) {
    const int64_t N = s.N, C = C_, D = D_;
    rms_rows(r.x, static_cast<const T*>(l.attn_norm), r.h, N, C, eps_);
    multiply<T>(l.qkv, r.h, N, std::array<T*, 3>{r.q, r.k, r.v}.data(), r.f_in, r.f_out);
    if (l.q_norm != nullptr) {  // per head, before RoPE (HF Qwen3)
      rms_rows(r.q, static_cast<const T*>(l.q_norm), r.q, N * H_, D, eps_);
      rms_rows(r.k, static_cast<const T*>(l.k_norm), r.k, N * Kh_, D, eps_);
    }
    rope_rows(r.q, N, H_, D, s.cos, s.sin);
    rope_rows(r.k, N, Kh_, D, s.cos, s.sin);
    write_kv(r.k, r.v, kb, vb, Kh_ * D, s);  // every row's K/V before any row attends
    paged_decode_rows(r.q, kb, vb, s.r2t, s.ldr, s.rows, s.lens, N, H_, Kh_, D,
                      1.f / std::sqrt(static_cast<float>(D)), r.att);
    multiply<T>(l.o, r.att, N, &r.o, r.f_in, r.f_out);
    add_rows(r.x, r.o, N * C);
    rms_rows(r.x, static_cast<const T*>(l.mlp_norm), r.h, N, C, eps_);
    multiply<T>(l.gu, r.h, N, std::array<T*, 2>{r.g, r.u}.data(), r.f_in, r.f_out);
    swiglu_rows(r.g, r.u, r.a, N * F_);
    multiply<T>(l.down, r.a, N, &r.d, r.f_in, r.f_out);
    add_rows(r.x, r.d, N * C);
  }

  template <typename T, typename KV>
  at::Tensor step(const int64_t* ids, const at::Tensor& k_buf, const at::Tensor& v_buf,
                  const Step& s, at::Tensor& h, const c10::List<Opt>& head) {
    const int64_t N = s.N, C = C_, per = k_buf.stride(0);
    const Rows<T> r = rows<T>(N);
    const T* e = embed_.data_ptr<T>();
    for (int64_t n = 0; n < N; ++n) std::memcpy(r.x + n * C, e + ids[n] * C, C * sizeof(T));
    KV *kb = k_buf.data_ptr<KV>(), *vb = v_buf.data_ptr<KV>();
    for (size_t l = 0; l < layers_.size(); ++l) layer<T, KV>(layers_[l], kb + l * per, vb + l * per, s, r);
    rms_rows(r.x, static_cast<const T*>(norm_), h.data_ptr<T>(), N, C, eps_);
    return head.size() == 0 ? h : logits<T>(h, head, r);
  }

  // fp32 logits [N, V] of the normed rows h [N, C]; head = [weight [V, C] (fp32, bf16, int8
  // or int4), its scale, bias, the fp32 weight's transpose [C, V] or None]
  // (ModelRunner.head_operands): passed each step, as the transpose is refreshed when the
  // weight changes.
  template <typename T>
  at::Tensor logits(const at::Tensor& h, const c10::List<Opt>& head, const Rows<T>& r) {
    TORCH_CHECK(head.size() == 4 && head.get(0).has_value(),
                "decode_layers: head [weight, scale, bias, transposed weight] (or empty)");
    const int64_t N = h.size(0), C = C_;
    const Opt w = head.get(0), scale = head.get(1), bias = head.get(2), wt = head.get(3);
    if constexpr (std::is_same_v<T, float>) {
      if (wt.has_value() && N == 1 && wt->scalar_type() == at::kFloat && wt->dim() == 2 &&
          wt->size(0) == C && blas_usable()) {
        const at::Tensor wc = wt->contiguous();
        at::Tensor y = at::empty({1, wc.size(1)}, h.options());
        sgemv_call(wc.data_ptr<float>(), wc.size(1), C, true, h.data_ptr<float>(), y.data_ptr<float>());
        if (bias.has_value()) y.add_(*bias);
        return y;
      }
    }
    const bool scaled = w->scalar_type() == at::kChar || w->scalar_type() == at::kByte;
    Product p = make_product(C, {*w}, scaled ? std::vector<Opt>{scale} : std::vector<Opt>{},
                             {bias}, "decode_layers head");
    TORCH_CHECK(scaled || w->scalar_type() == dtype_, "decode_layers: head weight ",
                w->scalar_type(), " with activations ", dtype_);
    const int64_t V = p.mats[0].N;
    at::Tensor out = at::empty({N, V}, h.options());
    T* o = out.data_ptr<T>();
    if constexpr (std::is_same_v<T, float>) {
      multiply<T>(p, h.data_ptr<T>(), N, &o, nullptr, nullptr);
      return out;
    } else {
      at::Tensor f = at::empty({N, V}, h.options().dtype(at::kFloat));
      float* fo = f.data_ptr<float>();
      multiply<T>(p, h.data_ptr<T>(), N, &o, r.f_in, fo);
      // the logits rounded to T, then widened (what out.to(kFloat) gives), in this thread:
      // at::to opens an OpenMP region from 32K elements (4 rows of a 32K vocabulary), whose
      // threads then spin on the cores the next step's pool wants (bf16, 4 concurrent
      // requests, AMD EPYC Zen 4: 1.36x the steps per second)
      for (int64_t i = 0; i < N * V; ++i) fo[i] = static_cast<float>(o[i]);
      return f;
    }
  }

  std::vector<Layer> layers_;
  at::Tensor embed_;
  const void* norm_ = nullptr;
  std::vector<at::Tensor> keep_;  // contiguous gains
  int64_t H_ = 0, Kh_ = 0, D_ = 0, C_ = 0, F_ = 0;
  float eps_ = 0.f;
  RowRange rr_{};
  at::ScalarType dtype_ = at::kFloat;
  at::Tensor scratch_;
  std::vector<float> cs_, sn_;
  std::vector<int32_t> lens_;
  std::mutex mu_;
};

at::Tensor decode_layers(const c10::intrusive_ptr<DecodePlan>& plan, const at::Tensor& rows,
                         const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& k_buf,
                         const at::Tensor& v_buf, const at::Tensor& req_to_token,
                         const c10::List<Opt>& head) {
  return plan->run(rows, cos, sin, k_buf, v_buf, req_to_token, head);
}
