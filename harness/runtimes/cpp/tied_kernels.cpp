// harness::q4_linear.out: the tied lm_head of the 8da4w-fast program, computed from the token
// table's own INT4 data, so the table is stored once (quantized_decomposed::embedding_4bit reads
// the same tensors for the lookup). Before, XNNPACK carried a second, packed copy of it (201 MB at
// E2B size).
//
//   q4_linear.out(x [..., D] f32, packed [V, D/2] u8, scales [V, D/G] f32, row_sums [V] f32,
//                 float softcap, *, out [..., V] f32)
//   softcap > 0: out = tanh(out / softcap) * softcap, Gemma's final logit softcapping, fused so
//   that no [s, V] intermediate is planned outside (XNNPACK cleared 2 GB of workspace per prefill).
//   packed: embedding_4bit's layout: byte j of a row holds weight 2j in its high nibble and weight
//           2j+1 in its low nibble, each stored as w + 8 (w in [-8, 7]).
//   row_sums[n] = sum over groups g of scales[n, g] * (sum of row n's weights w in g).
//
// Numerics: torchao's 8da4w (IntxUnpackedToInt8Tensor, int8_asym_per_token): each row of x is
// quantized to INT8 as choose_qparams_affine(ASYMMETRIC) + quantize_affine compute it in fp32
// (scale = (max(x, 0) - min(x, 0)) / 255 clamped to the smallest normal, zp = -128 -
// round(min / scale) clamped, q = clamp(round(x * (1 / scale)) + zp)), and out[n] = s_x *
// sum_g scales[n, g] * sum_{k in g} (q_k - zp) * w_nk. The integer part is exact: with v = q + 128
// (unsigned) and u = w + 8 (the stored nibble), sum (q - zp) w = sum v w - (128 + zp) sum w, and
// sum v w = sum v u - 8 sum v. The x86 paths compute sum v w directly (u8 x s8 dot products after
// subtracting 8 from the nibbles); the others compute sum v u (u8 x u8) and add -8 sum v, per token
// and group. The zero-point term is row_sums, once per row. Eager PyTorch dequantizes both sides
// and runs an FP32 matmul: the two differ by FP32 rounding only.
//
// Paths, chosen per call: AVX-512 VNNI (G a multiple of 128), AVX2 (G a multiple of 64), NEON
// (aarch64, dot-product instructions where the CPU has them; G a multiple of 32), else portable
// C++. HARNESS_Q4_PATH=portable|avx2|avx512vnni|neon forces one (tests hold every path to eager).

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#endif

#include <executorch/extension/kernel_util/make_boxed_from_unboxed_functor.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/kernel/thread_parallel_interface.h>

namespace harness_native {
namespace q4 {

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::runtime::Error;
using executorch::runtime::KernelRuntimeContext;

// The quantized activations of M tokens: v = q + 128 split into even and odd positions (matching
// the nibbles of a packed byte), and per token its scale, c = 128 + zp and, per group, -8 * sum v.
struct Acts {
  int64_t m = 0, d = 0, groups = 0;
  std::vector<uint8_t> even, odd;  // [m, d/2] each
  std::vector<float> scale, c;      // [m]
  std::vector<int32_t> corr;        // [m, groups]
};

void quantize_tokens(const float* x, int64_t m, int64_t d, int64_t group, Acts& a) {
  a.m = m;
  a.d = d;
  a.groups = d / group;
  a.even.resize(m * d / 2);
  a.odd.resize(m * d / 2);
  a.scale.resize(m);
  a.c.resize(m);
  a.corr.resize(m * a.groups);
  std::vector<uint8_t> v(d);
  for (int64_t t = 0; t < m; ++t) {
    const float* row = x + t * d;
    float mn = 0.0f, mx = 0.0f;
    bool finite = true;
    for (int64_t k = 0; k < d; ++k) {
      mn = std::min(mn, row[k]);
      mx = std::max(mx, row[k]);
      finite = finite && std::isfinite(row[k]);
    }
    float scale = (mx - mn) / 255.0f;
    scale = std::max(scale, FLT_MIN);
    const float zp = std::min(127.0f, std::max(-128.0f, -128.0f - std::nearbyint(mn / scale)));
    const float inv = 1.0f / scale;
    for (int64_t k = 0; k < d; ++k) {
      const float q = std::min(127.0f, std::max(-128.0f, std::nearbyint(row[k] * inv) + zp));
      v[k] = static_cast<uint8_t>(static_cast<int32_t>(q) + 128);
    }
    for (int64_t j = 0; j < d / 2; ++j) {
      a.even[t * d / 2 + j] = v[2 * j];
      a.odd[t * d / 2 + j] = v[2 * j + 1];
    }
    for (int64_t g = 0; g < a.groups; ++g) {
      int32_t s = 0;
      for (int64_t k = g * group; k < (g + 1) * group; ++k) s += v[k];
      a.corr[t * a.groups + g] = -8 * s;
    }
    // a NaN or infinity in stays visible: the token's outputs are NaN (eager's are NaN or inf)
    a.scale[t] = finite ? scale : std::numeric_limits<float>::quiet_NaN();
    a.c[t] = 128.0f + zp;
  }
}

struct Weights {
  const uint8_t* packed;  // [n, d/2]
  const float* scales;    // [n, groups]
  const float* row_sums;  // [n]
  int64_t n, d, group;
  float softcap;          // > 0: out = tanh(out / softcap) * softcap (Gemma's final logit softcapping)
};

inline float finish(const Acts& a, const Weights& w, int64_t t, int64_t row, float y) {
  const float v = a.scale[t] * (y - a.c[t] * w.row_sums[row]);
  return w.softcap > 0.0f ? std::tanh(v / w.softcap) * w.softcap : v;
}

// rows [lo, hi) for every token, portable C++ (the compiler vectorizes the inner loop)
void rows_portable(const Acts& a, const Weights& w, int64_t lo, int64_t hi, float* out) {
  const int64_t half = w.group / 2, bytes = w.d / 2, groups = w.d / w.group;
  for (int64_t r = lo; r < hi; ++r) {
    const uint8_t* p = w.packed + r * bytes;
    const float* s = w.scales + r * groups;
    for (int64_t t = 0; t < a.m; ++t) {
      const uint8_t* ve = a.even.data() + t * bytes;
      const uint8_t* vo = a.odd.data() + t * bytes;
      float y = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        int32_t acc = a.corr[t * groups + g];
        for (int64_t j = g * half; j < (g + 1) * half; ++j)
          acc += static_cast<int32_t>(ve[j]) * (p[j] >> 4) + static_cast<int32_t>(vo[j]) * (p[j] & 15);
        y += s[g] * static_cast<float>(acc);
      }
      out[t * w.n + r] = finish(a, w, t, r, y);
    }
  }
}

// Tiles of RB rows x TB tokens: each unpacked weight load serves TB tokens, each activation load
// RB rows, and the RB * TB accumulators are independent chains (the dot products' latency, not
// their throughput, bounds a single chain). One plan for every path: a decode token takes 4 rows
// at a time, a prefill 2 rows x 4 tokens (E2B's lm_head, 64 tokens, AVX-512, host B: 2x4 191-203
// ms, 3x4 198, 4x4 209, 4x2 237).
constexpr int TILE_RB = 2, TILE_TB = 4;
template <class K, int RB>
void token_tiles(const Acts& a, const Weights& w, int64_t r, float* out) {
  int64_t t = 0;
  for (; t + TILE_TB <= a.m; t += TILE_TB) K::template run<RB, TILE_TB>(a, w, r, t, out);
  switch (a.m - t) {
    case 3: K::template run<RB, 3>(a, w, r, t, out); break;
    case 2: K::template run<RB, 2>(a, w, r, t, out); break;
    case 1: K::template run<RB, 1>(a, w, r, t, out); break;
    default: break;
  }
}

template <class K>
void tiles(const Acts& a, const Weights& w, int64_t lo, int64_t hi, float* out) {
  int64_t r = lo;
  if (a.m == 1) {
    for (; r + 4 <= hi; r += 4) K::template run<4, 1>(a, w, r, 0, out);
  } else {
    for (; r + TILE_RB <= hi; r += TILE_RB) token_tiles<K, TILE_RB>(a, w, r, out);
  }
  for (; r < hi; ++r) token_tiles<K, 1>(a, w, r, out);
}

#if defined(__x86_64__)
// x86: the nibbles become signed weights (u - 8) before the dot products, so that
// sum v * w needs no per-group correction: u8 activations x s8 weights, exact in int32.

// AVX-512 VNNI: one 64-byte load is 128 weights.
struct Avx512 {
  template <int RB, int TB>
  static void run(const Acts& a, const Weights& w, int64_t r0, int64_t t0, float* out) {
    if (w.group == 128)  // E2B's group: one load per group, the loop known to the compiler
      run_chunks<RB, TB, 1>(a, w, r0, t0, out);
    else
      run_chunks<RB, TB, 0>(a, w, r0, t0, out);
  }

  // CH: 64-byte loads per group (0: w.group / 128 at run time)
  template <int RB, int TB, int CH>
  __attribute__((target("avx512f,avx512bw,avx512vnni"))) static void run_chunks(
      const Acts& a, const Weights& w, int64_t r0, int64_t t0, float* out) {
    const int64_t bytes = w.d / 2, groups = w.d / w.group, chunks = CH ? CH : w.group / 128;
    const __m512i nib = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
    __m512 accf[RB][TB];
    for (int r = 0; r < RB; ++r)
      for (int t = 0; t < TB; ++t) accf[r][t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      __m512i acc[RB][TB];
      for (int r = 0; r < RB; ++r)
        for (int t = 0; t < TB; ++t) acc[r][t] = _mm512_setzero_si512();
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t off = (g * chunks + c) * 64;
        __m512i hi[RB], lo[RB];
        for (int r = 0; r < RB; ++r) {
          // the same bytes two tiles ahead (the hardware prefetcher alone leaves the loads waiting)
          _mm_prefetch(reinterpret_cast<const char*>(w.packed + (r0 + r + 2 * RB) * bytes + off), _MM_HINT_T0);
          const __m512i x = _mm512_loadu_si512(w.packed + (r0 + r) * bytes + off);
          hi[r] = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(x, 4), nib), eight);
          lo[r] = _mm512_sub_epi8(_mm512_and_si512(x, nib), eight);
        }
        for (int t = 0; t < TB; ++t) {
          const __m512i e = _mm512_loadu_si512(a.even.data() + (t0 + t) * bytes + off);
          const __m512i o = _mm512_loadu_si512(a.odd.data() + (t0 + t) * bytes + off);
          for (int r = 0; r < RB; ++r) {
            acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], e, hi[r]);
            acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], o, lo[r]);
          }
        }
      }
      for (int r = 0; r < RB; ++r) {
        const __m512 sg = _mm512_set1_ps(w.scales[(r0 + r) * groups + g]);
        for (int t = 0; t < TB; ++t) accf[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][t]), sg, accf[r][t]);
      }
    }
    for (int r = 0; r < RB; ++r)
      for (int t = 0; t < TB; ++t)
        out[(t0 + t) * w.n + r0 + r] = finish(a, w, t0 + t, r0 + r, _mm512_reduce_add_ps(accf[r][t]));
  }
};

// AVX2: one 32-byte load is 64 weights; maddubs (u8 x s8 -> s16 pairs, at most 2 * 255 * 8, no
// saturation) then madd with ones to s32.
struct Avx2 {
  template <int RB, int TB>
  __attribute__((target("avx2,fma"))) static void run(const Acts& a, const Weights& w, int64_t r0, int64_t t0,
                                                       float* out) {
    const int64_t bytes = w.d / 2, groups = w.d / w.group, chunks = w.group / 64;
    const __m256i nib = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8), ones = _mm256_set1_epi16(1);
    __m256 accf[RB][TB];
    for (int r = 0; r < RB; ++r)
      for (int t = 0; t < TB; ++t) accf[r][t] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      __m256i acc[RB][TB];
      for (int r = 0; r < RB; ++r)
        for (int t = 0; t < TB; ++t) acc[r][t] = _mm256_setzero_si256();
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t off = (g * chunks + c) * 32;
        __m256i hi[RB], lo[RB];
        for (int r = 0; r < RB; ++r) {
          if (c % 2 == 0)  // one 64-byte line per two chunks, two tiles ahead (as AVX-512)
            _mm_prefetch(reinterpret_cast<const char*>(w.packed + (r0 + r + 2 * RB) * bytes + off), _MM_HINT_T0);
          const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.packed + (r0 + r) * bytes + off));
          hi[r] = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(x, 4), nib), eight);
          lo[r] = _mm256_sub_epi8(_mm256_and_si256(x, nib), eight);
        }
        for (int t = 0; t < TB; ++t) {
          const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.even.data() + (t0 + t) * bytes + off));
          const __m256i o = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.odd.data() + (t0 + t) * bytes + off));
          for (int r = 0; r < RB; ++r) {
            const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(e, hi[r]), _mm256_maddubs_epi16(o, lo[r]));
            acc[r][t] = _mm256_add_epi32(acc[r][t], _mm256_madd_epi16(pairs, ones));
          }
        }
      }
      for (int r = 0; r < RB; ++r) {
        const __m256 sg = _mm256_set1_ps(w.scales[(r0 + r) * groups + g]);
        for (int t = 0; t < TB; ++t) accf[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][t]), sg, accf[r][t]);
      }
    }
    for (int r = 0; r < RB; ++r)
      for (int t = 0; t < TB; ++t) {
        __m128 v = _mm_add_ps(_mm256_castps256_ps128(accf[r][t]), _mm256_extractf128_ps(accf[r][t], 1));
        v = _mm_add_ps(v, _mm_movehl_ps(v, v));
        v = _mm_add_ss(v, _mm_movehdup_ps(v));
        out[(t0 + t) * w.n + r0 + r] = finish(a, w, t0 + t, r0 + r, _mm_cvtss_f32(v));
      }
  }
};
#endif

#if defined(__aarch64__)
// NEON: one 16-byte load is 32 weights, unsigned nibbles against unsigned activations (the
// per-group correction -8 sum v goes into lane 0). With the dot-product extension (the Pi 5's
// Cortex-A76 has it) udot sums four u8 x u8 products into each u32 lane; without, umull + uadalp.
// udot is emitted as its encoding on fixed registers (udot v0.4s, v1.16b, v2.16b), so that the rest
// of the file stays baseline ARMv8 code and the assembler needs no extension: it runs only where
// the hwcap says the CPU has it.
inline uint32x4_t udot(uint32x4_t acc, uint8x16_t a, uint8x16_t b) {
  register uint32x4_t v0 asm("v0") = acc;
  register uint8x16_t v1 asm("v1") = a;
  register uint8x16_t v2 asm("v2") = b;
  asm(".inst 0x6e829420" : "+w"(v0) : "w"(v1), "w"(v2));
  return v0;
}

template <bool DOT>
struct Neon {
  template <int RB, int TB>
  static void run(const Acts& a, const Weights& w, int64_t r0, int64_t t0, float* out) {
    const int64_t bytes = w.d / 2, groups = w.d / w.group, chunks = w.group / 32;
    const uint8x16_t nib = vdupq_n_u8(0x0F);
    float32x4_t accf[RB][TB];
    for (int r = 0; r < RB; ++r)
      for (int t = 0; t < TB; ++t) accf[r][t] = vdupq_n_f32(0.0f);
    for (int64_t g = 0; g < groups; ++g) {
      uint32x4_t acc[RB][TB];
      for (int r = 0; r < RB; ++r)
        for (int t = 0; t < TB; ++t) acc[r][t] = vdupq_n_u32(0);
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t off = (g * chunks + c) * 16;
        uint8x16_t hi[RB], lo[RB];
        for (int r = 0; r < RB; ++r) {
          const uint8x16_t x = vld1q_u8(w.packed + (r0 + r) * bytes + off);
          hi[r] = vshrq_n_u8(x, 4);
          lo[r] = vandq_u8(x, nib);
        }
        for (int t = 0; t < TB; ++t) {
          const uint8x16_t e = vld1q_u8(a.even.data() + (t0 + t) * bytes + off);
          const uint8x16_t o = vld1q_u8(a.odd.data() + (t0 + t) * bytes + off);
          for (int r = 0; r < RB; ++r) {
            if constexpr (DOT) {
              acc[r][t] = udot(acc[r][t], e, hi[r]);
              acc[r][t] = udot(acc[r][t], o, lo[r]);
            } else {
              uint16x8_t prod = vmull_u8(vget_low_u8(e), vget_low_u8(hi[r]));
              prod = vmlal_u8(prod, vget_high_u8(e), vget_high_u8(hi[r]));
              prod = vmlal_u8(prod, vget_low_u8(o), vget_low_u8(lo[r]));
              prod = vmlal_u8(prod, vget_high_u8(o), vget_high_u8(lo[r]));  // at most 4 * 255 * 15 a lane
              acc[r][t] = vpadalq_u16(acc[r][t], prod);
            }
          }
        }
      }
      for (int r = 0; r < RB; ++r) {
        const float32x4_t sg = vdupq_n_f32(w.scales[(r0 + r) * groups + g]);
        for (int t = 0; t < TB; ++t) {
          int32x4_t total = vreinterpretq_s32_u32(acc[r][t]);
          total = vsetq_lane_s32(vgetq_lane_s32(total, 0) + a.corr[(t0 + t) * groups + g], total, 0);
          accf[r][t] = vfmaq_f32(accf[r][t], vcvtq_f32_s32(total), sg);
        }
      }
    }
    for (int r = 0; r < RB; ++r)
      for (int t = 0; t < TB; ++t)
        out[(t0 + t) * w.n + r0 + r] = finish(a, w, t0 + t, r0 + r, vaddvq_f32(accf[r][t]));
  }
};
#endif

enum class Path { portable, avx2, avx512vnni, neon, neon_dot };

const char* path_name(Path p) {
  switch (p) {
    case Path::avx2: return "avx2";
    case Path::avx512vnni: return "avx512vnni";
    case Path::neon: return "neon";
    case Path::neon_dot: return "neon";
    default: return "portable";
  }
}

// The fastest path this CPU and group size allow, or the one HARNESS_Q4_PATH names (if it is
// available: else the call fails, so a test cannot pass on a path it did not run).
bool choose_path(int64_t group, Path& out) {
  Path best = Path::portable;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (group % 128 == 0 && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw"))
    best = Path::avx512vnni;
  else if (group % 64 == 0 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    best = Path::avx2;
#elif defined(__aarch64__)
  if (group % 32 == 0) best = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) ? Path::neon_dot : Path::neon;
#endif
  const char* want = std::getenv("HARNESS_Q4_PATH");
  if (want == nullptr || *want == '\0') {
    out = best;
    return true;
  }
  const std::string w(want);
  if (w == "portable") {
    out = Path::portable;
    return true;
  }
#if defined(__x86_64__)
  if (w == "avx2" && group % 64 == 0 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    out = Path::avx2;
    return true;
  }
  if (w == "avx512vnni" && best == Path::avx512vnni) {
    out = best;
    return true;
  }
#elif defined(__aarch64__)
  if (w == "neon" && group % 32 == 0) {
    out = best;
    return true;
  }
#endif
  ET_LOG(Error, "HARNESS_Q4_PATH=%s is not available here (group %lld); this CPU's best is %s", want,
         static_cast<long long>(group), path_name(best));
  return false;
}

void run_rows(Path path, const Acts& a, const Weights& w, int64_t lo, int64_t hi, float* out) {
#if defined(__x86_64__)
  if (path == Path::avx512vnni) return tiles<Avx512>(a, w, lo, hi, out);
  if (path == Path::avx2) return tiles<Avx2>(a, w, lo, hi, out);
#elif defined(__aarch64__)
  if (path == Path::neon_dot) return tiles<Neon<true>>(a, w, lo, hi, out);
  if (path == Path::neon) return tiles<Neon<false>>(a, w, lo, hi, out);
#endif
  (void)path;
  rows_portable(a, w, lo, hi, out);
}

#define Q4_CHECK(cond, ...)                 \
  do {                                      \
    if (!(cond)) {                          \
      ET_LOG(Error, __VA_ARGS__);           \
      ctx.fail(Error::InvalidArgument);     \
      return out;                           \
    }                                       \
  } while (0)

Tensor& q4_linear_out(KernelRuntimeContext& ctx, const Tensor& x, const Tensor& packed, const Tensor& scales,
                      const Tensor& row_sums, double softcap, Tensor& out) {
  using executorch::runtime::tensor_is_contiguous;
  Q4_CHECK(x.scalar_type() == ScalarType::Float && x.dim() >= 1 && tensor_is_contiguous(x),
           "q4_linear: x must be a contiguous float tensor");
  Q4_CHECK(packed.scalar_type() == ScalarType::Byte && packed.dim() == 2 && tensor_is_contiguous(packed),
           "q4_linear: packed must be a contiguous uint8 [V, D/2] tensor");
  const int64_t d = x.size(x.dim() - 1), n = packed.size(0);
  Q4_CHECK(packed.size(1) * 2 == d, "q4_linear: packed holds %lld weights per row, x has %lld",
           static_cast<long long>(packed.size(1) * 2), static_cast<long long>(d));
  Q4_CHECK(scales.scalar_type() == ScalarType::Float && scales.dim() == 2 && scales.size(0) == n &&
               scales.size(1) > 0 && d % scales.size(1) == 0 && tensor_is_contiguous(scales),
           "q4_linear: scales must be a contiguous float [V, D/G] tensor");
  const int64_t group = d / scales.size(1);
  Q4_CHECK(group % 2 == 0, "q4_linear: group size %lld must be even", static_cast<long long>(group));
  Q4_CHECK(row_sums.scalar_type() == ScalarType::Float && row_sums.dim() == 1 && row_sums.size(0) == n,
           "q4_linear: row_sums must be a float [V] tensor");
  executorch::aten::SizesType sizes[executorch::runtime::kTensorDimensionLimit];
  for (ssize_t i = 0; i + 1 < x.dim(); ++i) sizes[i] = x.size(i);
  sizes[x.dim() - 1] = static_cast<executorch::aten::SizesType>(n);
  Q4_CHECK(executorch::runtime::resize_tensor(out, {sizes, static_cast<size_t>(x.dim())}) == Error::Ok &&
               out.scalar_type() == ScalarType::Float,
           "q4_linear: cannot resize out to [..., %lld]", static_cast<long long>(n));
  Path path;
  Q4_CHECK(choose_path(group, path), "q4_linear: no such path");
  const int64_t m = x.numel() / d;
  Acts a;
  quantize_tokens(x.const_data_ptr<float>(), m, d, group, a);
  const Weights w{packed.const_data_ptr<uint8_t>(), scales.const_data_ptr<float>(),
                  row_sums.const_data_ptr<float>(), n, d, group, static_cast<float>(softcap)};
  float* o = out.mutable_data_ptr<float>();
  executorch::extension::parallel_for(0, n, 64, [&](int64_t lo, int64_t hi) { run_rows(path, a, w, lo, hi, o); });
  return out;
}

}  // namespace q4
}  // namespace harness_native

EXECUTORCH_LIBRARY(harness, "q4_linear.out", harness_native::q4::q4_linear_out);
