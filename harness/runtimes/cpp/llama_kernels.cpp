// ExecuTorch runtime kernels for the three llama:: operators the 8da4w-fast program calls, with no
// libtorch: llama::custom_sdpa.out, llama::update_cache.out, llama::update_cache_with_indices.out.
//
// The executorch wheel ships these kernels only inside libcustom_ops_aot_lib.so, which also holds
// the export-time ATen operators and so links libtorch_cpu and the Python extension. A program
// that must not carry libtorch (the whole point of et_native: peak RSS) registers its own.
// Semantics follow the operators' schemas and the export-time checks in
// executorch/extension/llm/custom_ops/custom_ops.py:
//   q [B, S, H, D]; k, v [B, L, Hkv, D] (H a multiple of Hkv: grouped-query attention, no copy);
//   out [B, S, H, D]. With a float mask [S, L] (added to the scores) every one of the L keys is
//   read; without one, query i reads keys [0, start_pos + i] when is_causal, else the first
//   start_pos + S. scale defaults to 1/sqrt(D).
//   update_cache: cache[:, start_pos : start_pos + S] = value.
//   update_cache_with_indices: cache[b, indices[b, s]] = value[b, s] (start_pos must be 0: the
//   harness never offsets indices, and an offset's meaning is not in the schema).
// Float32 only, contiguous tensors only: anything else fails the call with a logged reason.

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include <executorch/extension/kernel_util/make_boxed_from_unboxed_functor.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/kernel/thread_parallel_interface.h>

namespace harness_native {

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::runtime::Error;
using executorch::runtime::KernelRuntimeContext;

namespace {

bool contiguous_float(const Tensor& t, int dim) {
  return t.scalar_type() == ScalarType::Float && t.dim() == dim &&
      executorch::runtime::tensor_is_contiguous(t);
}

#define HN_CHECK(ctx, cond, ret, ...)    \
  do {                                   \
    if (!(cond)) {                       \
      ET_LOG(Error, __VA_ARGS__);        \
      (ctx).fail(Error::InvalidArgument); \
      return ret;                        \
    }                                    \
  } while (0)

// eight independent partial sums: vectorizes without -ffast-math
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

Tensor& custom_sdpa_out(KernelRuntimeContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        int64_t start_pos, const std::optional<Tensor>& mask, double dropout_p,
                        bool is_causal, std::optional<double> scale, Tensor& out) {
  HN_CHECK(ctx, contiguous_float(q, 4) && contiguous_float(k, 4) && contiguous_float(v, 4), out,
           "custom_sdpa: q, k, v must be contiguous 4-D float32 tensors");
  HN_CHECK(ctx, dropout_p == 0.0, out, "custom_sdpa: dropout is not supported");
  const int64_t B = q.size(0), S = q.size(1), H = q.size(2), D = q.size(3);
  const int64_t L = k.size(1), Hkv = k.size(2);
  HN_CHECK(ctx, k.size(0) == B && v.size(0) == B && v.size(1) == L && v.size(2) == Hkv &&
                    k.size(3) == D && v.size(3) == D && Hkv > 0 && H % Hkv == 0,
           out, "custom_sdpa: k/v shapes do not match q (GQA needs H %% Hkv == 0)");
  const float* m = nullptr;
  if (mask.has_value()) {
    HN_CHECK(ctx, contiguous_float(*mask, 2) && mask->size(0) == S && mask->size(1) == L, out,
             "custom_sdpa: the mask must be a contiguous float32 [S, L] tensor");
    HN_CHECK(ctx, !is_causal, out, "custom_sdpa: a mask together with is_causal is not supported");
    m = mask->const_data_ptr<float>();
  } else {
    HN_CHECK(ctx, start_pos >= 0 && start_pos + S <= L, out,
             "custom_sdpa: start_pos + S exceeds the key length");
  }
  HN_CHECK(ctx, executorch::runtime::resize_tensor(out, q.sizes()) == Error::Ok, out,
           "custom_sdpa: cannot resize out to q's shape");
  const float sc = scale.has_value() ? static_cast<float>(*scale) : 1.0f / std::sqrt(static_cast<float>(D));
  const float* qd = q.const_data_ptr<float>();
  const float* kd = k.const_data_ptr<float>();
  const float* vd = v.const_data_ptr<float>();
  float* od = out.mutable_data_ptr<float>();
  const int64_t group = H / Hkv;
  const float neg_inf = -std::numeric_limits<float>::infinity();

  // one work item per (batch, query, head)
  executorch::extension::parallel_for(0, B * S * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> p(L);
    for (int64_t w = begin; w < end; ++w) {
      const int64_t b = w / (S * H), i = (w / H) % S, h = w % H, hk = h / group;
      const int64_t keys = m ? L : (is_causal ? start_pos + i + 1 : start_pos + S);
      const float* qv = qd + ((b * S + i) * H + h) * D;
      float mx = neg_inf;
      for (int64_t j = 0; j < keys; ++j) {
        // a masked key is never read: a slot no call has written yet may hold anything, NaN too
        if (m && m[i * L + j] == neg_inf) {
          p[j] = neg_inf;
          continue;
        }
        float s = dot(qv, kd + ((b * L + j) * Hkv + hk) * D, D) * sc;
        if (m) s += m[i * L + j];
        p[j] = s;
        mx = s > mx ? s : mx;
      }
      float* o = od + ((b * S + i) * H + h) * D;
      std::memset(o, 0, sizeof(float) * D);
      if (mx == neg_inf) continue;  // every key masked: zeros, never NaN
      float sum = 0.f;
      for (int64_t j = 0; j < keys; ++j) {
        p[j] = std::exp(p[j] - mx);
        sum += p[j];
      }
      const float inv = 1.f / sum;
      for (int64_t j = 0; j < keys; ++j) {
        if (p[j] == 0.f) continue;
        const float wgt = p[j] * inv;
        const float* vv = vd + ((b * L + j) * Hkv + hk) * D;
        for (int64_t d = 0; d < D; ++d) o[d] += wgt * vv[d];
      }
    }
  });
  return out;
}

namespace {
bool cache_args_ok(KernelRuntimeContext& ctx, const Tensor& value, const Tensor& cache) {
  HN_CHECK(ctx, contiguous_float(value, 4) && contiguous_float(cache, 4), false,
           "update_cache: value and cache must be contiguous 4-D float32 tensors");
  HN_CHECK(ctx, value.size(0) == cache.size(0) && value.size(2) == cache.size(2) &&
                    value.size(3) == cache.size(3),
           false, "update_cache: value and cache differ in batch, heads or head_dim");
  return true;
}
}  // namespace

Tensor& update_cache_out(KernelRuntimeContext& ctx, const Tensor& value, Tensor& cache,
                         int64_t start_pos, Tensor& out) {
  if (!cache_args_ok(ctx, value, cache)) return out;
  const int64_t B = value.size(0), S = value.size(1), L = cache.size(1);
  const int64_t row = value.size(2) * value.size(3);
  HN_CHECK(ctx, start_pos >= 0 && start_pos + S <= L, out,
           "update_cache: start_pos %ld + %ld new positions exceed the cache's %ld", (long)start_pos,
           (long)S, (long)L);
  const float* src = value.const_data_ptr<float>();
  float* dst = cache.mutable_data_ptr<float>();
  for (int64_t b = 0; b < B; ++b)
    std::memcpy(dst + (b * L + start_pos) * row, src + b * S * row, sizeof(float) * S * row);
  return out;  // a placeholder, as in the operator's schema: the cache is what changed
}

Tensor& update_cache_with_indices_out(KernelRuntimeContext& ctx, const Tensor& value, Tensor& cache,
                                      int64_t start_pos, const Tensor& indices, Tensor& out) {
  if (!cache_args_ok(ctx, value, cache)) return out;
  const int64_t B = value.size(0), S = value.size(1), L = cache.size(1);
  const int64_t row = value.size(2) * value.size(3);
  HN_CHECK(ctx, start_pos == 0, out, "update_cache_with_indices: only start_pos 0 is supported");
  HN_CHECK(ctx, indices.scalar_type() == ScalarType::Long && indices.dim() == 2 &&
                    indices.size(0) == B && indices.size(1) == S &&
                    executorch::runtime::tensor_is_contiguous(indices),
           out, "update_cache_with_indices: indices must be a contiguous int64 [B, S] tensor");
  const int64_t* idx = indices.const_data_ptr<int64_t>();
  const float* src = value.const_data_ptr<float>();
  float* dst = cache.mutable_data_ptr<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) {
      const int64_t slot = idx[b * S + s];
      HN_CHECK(ctx, slot >= 0 && slot < L, out, "update_cache_with_indices: slot %ld outside [0, %ld)",
               (long)slot, (long)L);
      std::memcpy(dst + (b * L + slot) * row, src + (b * S + s) * row, sizeof(float) * row);
    }
  return out;
}

}  // namespace harness_native

EXECUTORCH_LIBRARY(llama, "custom_sdpa.out", harness_native::custom_sdpa_out);
EXECUTORCH_LIBRARY(llama, "update_cache.out", harness_native::update_cache_out);
EXECUTORCH_LIBRARY(llama, "update_cache_with_indices.out", harness_native::update_cache_with_indices_out);
