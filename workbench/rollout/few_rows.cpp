// workbench::few_rows_linear(x [M, K], packed [S, K, 16], bias [N]?, N) -> x @ w.T + bias,
// float32 on the CPU, where packed holds w [N, K] in strips of 16 output columns
// (packed[s, k, j] = w[16 s + j, k], zero past N): rollout.few_rows packs, builds and loads
// this file; its docstring says why it exists.
//
// Glossary: a strip is 16 output columns, its weights one contiguous [K, 16] block, read
// front to back (few pages, one prefetch stream each). A panel is NS strips; for each k,
// its strips' vectors at row k are loaded once and multiplied by x[m, k] of a block of up to
// 8 rows m (6 without AVX-512), so each weight loaded feeds M fused multiply-adds into
// accumulators that stay in registers over the whole of K (no horizontal sums). NS is the
// most that fits the register file beside the weights: 32 vector registers with AVX-512, 16
// without. A panel's weights (K * 64 bytes a strip) stay in cache while every block of rows
// passes over them.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>

namespace {

#if defined(__AVX512F__)
constexpr int VW = 16;
constexpr int REGS = 32;
constexpr int MAX_ROWS = 8;
#else
constexpr int VW = 8;
constexpr int REGS = 16;
constexpr int MAX_ROWS = 6;  // 6 rows' accumulators of a strip, its 2 vectors, a broadcast
#endif
typedef float vec __attribute__((vector_size(VW * 4)));
typedef float uvec __attribute__((vector_size(VW * 4), aligned(4)));  // unaligned access
constexpr int STRIP = 16;
constexpr int SV = STRIP / VW;  // vectors a strip

constexpr int panel_strips(int M) {
  int nb = (REGS - 2) / (M + 1);  // M * NB accumulators + NB weight vectors + a broadcast
  int ns = nb / SV;
  return ns < 1 ? 1 : (ns > 8 / SV ? 8 / SV : ns);
}

// out[m, 16 s0 : 16 (s0 + NS)] = x[m, :] @ strips s0.. (+ bias), m < M, columns < N only
template <int M, int NS>
void panel(const float* x, int64_t K, const float* packed, const float* bias, float* out,
           int64_t N, int64_t s0) {
  constexpr int NB = NS * SV;
  vec acc[M][NB];
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < NB; ++j) acc[m][j] = vec{};
  const float* w[NS];
  for (int j = 0; j < NS; ++j) w[j] = packed + (s0 + j) * K * STRIP;
  for (int64_t k = 0; k < K; ++k) {
    vec wv[NB];
    for (int j = 0; j < NS; ++j)
      for (int v = 0; v < SV; ++v) wv[j * SV + v] = *(const uvec*)(w[j] + k * STRIP + v * VW);
    for (int m = 0; m < M; ++m) {
      vec xv = vec{} + x[m * K + k];
      for (int j = 0; j < NB; ++j) acc[m][j] += xv * wv[j];
    }
  }
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < NB; ++j) {
      const int64_t n = s0 * STRIP + j * VW;
      vec r = acc[m][j];
      float* o = out + m * N + n;
      if (n + VW <= N) {
        if (bias) r += *(const uvec*)(bias + n);
        *(uvec*)o = r;
      } else {
        for (int64_t l = 0; n + l < N; ++l) o[l] = r[l] + (bias ? bias[n + l] : 0.f);
      }
    }
}

template <int M>
void rows_of_panel(const float* x, int64_t K, const float* packed, const float* bias,
                   float* out, int64_t N, int64_t s0, int64_t strips) {
  constexpr int NS = panel_strips(M);
  if (strips == NS) {
    panel<M, NS>(x, K, packed, bias, out, N, s0);
  } else {
    for (int64_t s = s0; s < s0 + strips; ++s) panel<M, 1>(x, K, packed, bias, out, N, s);
  }
}

// one panel (strips s0 .. s0 + strips) for every block of up to 8 rows
void panel_all_rows(const float* x, int64_t M, int64_t K, const float* packed,
                    const float* bias, float* out, int64_t N, int64_t s0, int64_t strips) {
  for (int64_t m0 = 0; m0 < M; m0 += MAX_ROWS) {
    const float* xr = x + m0 * K;
    float* o = out + m0 * N;
    switch (std::min<int64_t>(M - m0, MAX_ROWS)) {
      case 8: rows_of_panel<8>(xr, K, packed, bias, o, N, s0, strips); break;
      case 7: rows_of_panel<7>(xr, K, packed, bias, o, N, s0, strips); break;
      case 6: rows_of_panel<6>(xr, K, packed, bias, o, N, s0, strips); break;
      case 5: rows_of_panel<5>(xr, K, packed, bias, o, N, s0, strips); break;
      case 4: rows_of_panel<4>(xr, K, packed, bias, o, N, s0, strips); break;
      case 3: rows_of_panel<3>(xr, K, packed, bias, o, N, s0, strips); break;
      case 2: rows_of_panel<2>(xr, K, packed, bias, o, N, s0, strips); break;
      default: rows_of_panel<1>(xr, K, packed, bias, o, N, s0, strips); break;
    }
  }
}

at::Tensor few_rows_linear(const at::Tensor& x_in, const at::Tensor& packed_in,
                           const std::optional<at::Tensor>& bias_in, int64_t N) {
  TORCH_CHECK(x_in.dim() == 2 && packed_in.dim() == 3 && packed_in.size(2) == STRIP &&
                  x_in.size(1) == packed_in.size(1) && N > 0 &&
                  N <= packed_in.size(0) * STRIP && N > (packed_in.size(0) - 1) * STRIP,
              "few_rows_linear: x [M, K], packed [ceil(N / 16), K, 16] and N expected, got ",
              x_in.sizes(), ", ", packed_in.sizes(), " and N = ", N);
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && packed_in.scalar_type() == at::kFloat,
              "few_rows_linear: float32 only, got ", x_in.scalar_type(), " and ",
              packed_in.scalar_type());
  const at::Tensor x = x_in.contiguous(), packed = packed_in.contiguous();
  std::optional<at::Tensor> bias;
  if (bias_in.has_value()) {
    TORCH_CHECK(bias_in->dim() == 1 && bias_in->size(0) == N &&
                    bias_in->scalar_type() == at::kFloat,
                "few_rows_linear: bias [N] float32 expected, got ", bias_in->sizes());
    bias = bias_in->contiguous();
  }
  const int64_t M = x.size(0), K = x.size(1), S = packed.size(0);
  at::Tensor out = at::empty({M, N}, x.options());
  if (M == 0) return out;
  const float* b = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  const float* xp = x.data_ptr<float>();
  const float* wp = packed.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t ns = panel_strips(static_cast<int>(std::min<int64_t>(M, MAX_ROWS)));
  const int64_t panels = (S + ns - 1) / ns;
  // a thread's share at least ~64K multiply-adds: below that, forking costs more than it saves
  const int64_t grain = std::max<int64_t>(1, 65536 / (M * K * ns * STRIP));
  at::parallel_for(0, panels, grain, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t s0 = p * ns;
      panel_all_rows(xp, M, K, wp, b, op, N, s0, std::min(ns, S - s0));
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(workbench, m) {
  m.def("few_rows_linear(Tensor x, Tensor packed, Tensor? bias, int n) -> Tensor");
}

TORCH_LIBRARY_IMPL(workbench, CPU, m) { m.impl("few_rows_linear", &few_rows_linear); }
