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

using Opt = std::optional<at::Tensor>;

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

// x [1, K] fp32 against fp32 W [N, K] (or its transpose [K, N], `wt`) + bias -> [1, N].
at::Tensor blas_gemv(const at::Tensor& x, const at::Tensor& w, const Opt& bias, bool wt) {
  const int64_t N = w.size(wt ? 1 : 0), K = x.size(1);
  const at::Tensor xc = x.contiguous(), wc = w.contiguous();
  at::Tensor y = at::empty({1, N}, x.options());
  sgemv_call(wc.data_ptr<float>(), N, K, wt, xc.data_ptr<float>(), y.data_ptr<float>());
  if (bias.has_value()) y.add_(*bias);
  return y;
}

bool blas_takes(const at::Tensor& x, const at::Tensor& w) {
  return x.size(0) == 1 && x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat &&
         w.dim() == 2 && blas_usable();
}

std::vector<at::Tensor> products(const at::Tensor& x, const std::vector<at::Tensor>& ws,
                                 const std::vector<Opt>& scales, const std::vector<Opt>& biases,
                                 const RowRange& rr) {
  OptList b;
  for (const Opt& o : biases) b.push_back(o);
  const at::ScalarType t = ws[0].scalar_type();
  if (t == at::kByte) {  // int4 (gemv_q4): every row count takes the kernel
    std::vector<at::Tensor> sc;
    for (const Opt& s : scales) sc.push_back(*s);
    return gemv_q4_many(x, ws, sc, b);
  }
  if (t == at::kChar) {
    std::vector<at::Tensor> sc;
    for (const Opt& s : scales) sc.push_back(*s);
    return int8_many(x, ws, sc, b, rr.q8);
  }
  const int64_t M = x.size(0);
  const bool kernel = x.scalar_type() == t &&
                      (t == at::kFloat ? (M >= rr.f32_lo && M <= rr.f32_hi)
                                       : (M >= rr.bf16_lo && M <= rr.bf16_hi));
  if (kernel) return gemv_many(x, ws, b);
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < ws.size(); ++i)
    out.push_back(blas_takes(x, ws[i]) ? blas_gemv(x, ws[i], biases[i], false)
                                       : at::linear(x, ws[i], biases[i]));
  return out;
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

struct Step {  // one call's shared inputs
  int64_t N, C, H, Kh, D;
  float eps;
  const float *cos, *sin;
  const int32_t* r2t;
  int64_t ldr;
  const int64_t *rows, *slots;
  const int32_t* lens;
  RowRange rr;
};

template <typename T>
void write_kv(const T* k, const T* v, T* kb, T* vb, const Step& s) {
  const int64_t row = s.Kh * s.D;
  for (int64_t n = 0; n < s.N; ++n) {
    std::memcpy(kb + s.slots[n] * row, k + n * row, row * sizeof(T));
    std::memcpy(vb + s.slots[n] * row, v + n * row, row * sizeof(T));
  }
}

// x [N, C] (T) <- x + attention(norm(x)) of layer `w` (its kSlots weights), K/V in kb / vb.
template <typename T>
void attention_block(at::Tensor& x, const c10::List<Opt>& w, int64_t base, T* kb, T* vb,
                     const Step& s) {
  auto at_ = [&](int64_t i) { return w.get(base + i); };
  const at::Tensor h = rms_norm(x, *at_(ATTN_NORM), s.eps);
  std::vector<at::Tensor> qkv = products(h, {*at_(Q), *at_(K), *at_(V)},
                                         {at_(Q_SCALE), at_(K_SCALE), at_(V_SCALE)},
                                         {at_(Q_BIAS), at_(K_BIAS), at_(V_BIAS)}, s.rr);
  at::Tensor q = qkv[0].contiguous(), k = qkv[1].contiguous(), v = qkv[2].contiguous();
  T *qp = q.data_ptr<T>(), *kp = k.data_ptr<T>();
  if (at_(Q_NORM).has_value()) {  // per head, before RoPE (HF Qwen3)
    const at::Tensor qw = at_(Q_NORM)->contiguous(), kw = at_(K_NORM)->contiguous();
    rms_rows(qp, qw.data_ptr<T>(), qp, s.N * s.H, s.D, s.eps);
    rms_rows(kp, kw.data_ptr<T>(), kp, s.N * s.Kh, s.D, s.eps);
  }
  rope_rows(qp, s.N, s.H, s.D, s.cos, s.sin);
  rope_rows(kp, s.N, s.Kh, s.D, s.cos, s.sin);
  write_kv(kp, v.data_ptr<T>(), kb, vb, s);  // every row's K/V before any row attends
  at::Tensor att = at::empty({s.N, s.H * s.D}, x.options());
  paged_decode_rows(qp, kb, vb, s.r2t, s.ldr, s.rows, s.lens, s.N, s.H, s.Kh, s.D,
                    1.f / std::sqrt(static_cast<float>(s.D)), att.data_ptr<T>());
  const at::Tensor o = products(att, {*at_(O)}, {at_(O_SCALE)}, {std::nullopt}, s.rr)[0].contiguous();
  add_rows(x.data_ptr<T>(), o.data_ptr<T>(), s.N * s.C);
}

// x <- x + down(silu(gate(norm(x))) · up(norm(x))).
template <typename T>
void mlp_block(at::Tensor& x, const c10::List<Opt>& w, int64_t base, const Step& s) {
  auto at_ = [&](int64_t i) { return w.get(base + i); };
  const at::Tensor h = rms_norm(x, *at_(MLP_NORM), s.eps);
  std::vector<at::Tensor> gu = products(h, {*at_(GATE), *at_(UP)}, {at_(GATE_SCALE), at_(UP_SCALE)},
                                        {std::nullopt, std::nullopt}, s.rr);
  const at::Tensor g = gu[0].contiguous(), u = gu[1].contiguous();
  at::Tensor a = at::empty_like(g);
  swiglu_rows(g.data_ptr<T>(), u.data_ptr<T>(), a.data_ptr<T>(), g.numel());
  const at::Tensor d = products(a, {*at_(DOWN)}, {at_(DOWN_SCALE)}, {std::nullopt}, s.rr)[0].contiguous();
  add_rows(x.data_ptr<T>(), d.data_ptr<T>(), s.N * s.C);
}

template <typename T>
void run_layers(at::Tensor& x, const c10::List<Opt>& w, const at::Tensor& k_buf,
                const at::Tensor& v_buf, const Step& s) {
  const int64_t L = k_buf.size(0), per = k_buf.stride(0);
  for (int64_t l = 0; l < L; ++l) {
    attention_block<T>(x, w, l * kSlots, k_buf.data_ptr<T>() + l * per,
                       v_buf.data_ptr<T>() + l * per, s);
    mlp_block<T>(x, w, l * kSlots, s);
  }
}

// fp32 logits [N, V] of the normed rows h [N, C]; head = [weight [V, C] (fp32, bf16 or int8),
// int8 scale, bias, the fp32 weight's transpose [C, V] or None] (ModelRunner.head_operands).
at::Tensor logits(const at::Tensor& h, const c10::List<Opt>& head, const RowRange& rr) {
  TORCH_CHECK(head.size() == 4 && head.get(0).has_value(),
              "decode_layers: head [weight, scale, bias, transposed weight] (or empty)");
  const Opt wt = head.get(3), bias = head.get(2);
  if (wt.has_value() && blas_takes(h, *wt)) return blas_gemv(h, *wt, bias, true);
  return products(h, {*head.get(0)}, {head.get(1)}, {bias}, rr)[0].to(at::kFloat);
}

// rows [5, N] int64: token ids, positions, request rows, KV lengths, slots; embed [V, C] the
// input embedding (rows looked up here); cos / sin [max_len, D/2] fp32, the model's tables.
at::Tensor decode_layers(const at::Tensor& rows5, const at::Tensor& embed,
                         const c10::List<Opt>& weights, at::IntArrayRef shape, double eps,
                         const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& k_buf,
                         const at::Tensor& v_buf, const at::Tensor& req_to_token,
                         const at::Tensor& norm, const c10::List<Opt>& head) {
  TORCH_CHECK(shape.size() == 8, "decode_layers: shape [H, K, D, f32_lo, f32_hi, bf16_lo, bf16_hi, q8]");
  TORCH_CHECK(embed.dim() == 2 && !embed.is_cuda() && embed.scalar_type() == k_buf.scalar_type() &&
                  (embed.scalar_type() == at::kFloat || embed.scalar_type() == at::kBFloat16),
              "decode_layers: embed [V, C] fp32 or bf16 on the CPU, of the KV pool's dtype");
  TORCH_CHECK(k_buf.dim() == 4 && k_buf.is_contiguous() && v_buf.is_contiguous() &&
                  v_buf.sizes() == k_buf.sizes() &&
                  static_cast<int64_t>(weights.size()) == k_buf.size(0) * kSlots,
              "decode_layers: k_buf / v_buf [L, S, K, D] contiguous and ", kSlots,
              " weights (or None) per layer");
  TORCH_CHECK(rows5.dim() == 2 && rows5.size(0) == 5 && rows5.scalar_type() == at::kLong &&
                  rows5.is_contiguous() && cos.scalar_type() == at::kFloat &&
                  cos.is_contiguous() && sin.is_contiguous() && cos.size(1) == shape[2] / 2 &&
                  req_to_token.scalar_type() == at::kInt && req_to_token.is_contiguous(),
              "decode_layers: rows [5, N] int64 contiguous, cos / sin [max_len, D/2] fp32, "
              "req_to_token int32 contiguous");
  const int64_t N = rows5.size(1), C = embed.size(1), h2 = shape[2] / 2;
  const int64_t *ids = rows5.data_ptr<int64_t>(), *pos = ids + N;
  const at::Tensor ec = embed.contiguous();
  at::Tensor x = at::empty({N, C}, ec.options());
  std::vector<float> cs(N * h2), sn(N * h2);
  std::vector<int32_t> lens(N);
  for (int64_t n = 0; n < N; ++n) {
    TORCH_CHECK(ids[n] >= 0 && ids[n] < embed.size(0) && pos[n] >= 0 && pos[n] < cos.size(0),
                "decode_layers: token id or position out of range");
    std::memcpy(static_cast<char*>(x.data_ptr()) + n * C * ec.element_size(),
                static_cast<const char*>(ec.data_ptr()) + ids[n] * C * ec.element_size(),
                C * ec.element_size());
    std::memcpy(cs.data() + n * h2, cos.data_ptr<float>() + pos[n] * h2, h2 * sizeof(float));
    std::memcpy(sn.data() + n * h2, sin.data_ptr<float>() + pos[n] * h2, h2 * sizeof(float));
    lens[n] = static_cast<int32_t>(ids[3 * N + n]);
  }
  check_kv_indices("decode_layers", req_to_token.data_ptr<int32_t>(), req_to_token.size(0),
                   req_to_token.size(1), ids + 2 * N, lens.data(), N, k_buf.size(1), ids + 4 * N);
  const Step s{N, C, shape[0], shape[1], shape[2], static_cast<float>(eps), cs.data(), sn.data(),
               req_to_token.data_ptr<int32_t>(), req_to_token.size(1), ids + 2 * N, ids + 4 * N,
               lens.data(), {shape[3], shape[4], shape[5], shape[6], shape[7] != 0}};
  if (x.scalar_type() == at::kFloat) run_layers<float>(x, weights, k_buf, v_buf, s);
  else run_layers<c10::BFloat16>(x, weights, k_buf, v_buf, s);
  const at::Tensor h = rms_norm(x, norm, eps);
  return head.size() == 0 ? h : logits(h, head, s.rr);
}
