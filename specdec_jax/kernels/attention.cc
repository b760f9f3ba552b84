// Attention of decode requests (the decoder's in cached decode calls, the encoder's in
// Model.start) as one XLA FFI custom call for the CPU:
//
//   out[b, t, h, :] = softmax_{s < n}(q[b, t, h, :] . k[b, g, s, :] + bias[b, h, t, s]) @ v[b, g, :n, :]
//   with g = h / (H / Hkv): grouped-query attention reads each K/V head for H / Hkv query heads,
//   and n = lengths[b, t] clipped to 1..S: the keys past a row's length are never read; with
//   the attribute window > 0 (a sliding-window layer) the row reads the keys s in
//   [max(n - window, 0), n) only (window 0: all n); with the attribute softcap > 0 (Gemma 2's
//   attention-logit soft-cap) the dot products q . k become softcap * tanh(q . k / softcap)
//   before the bias is added (softcap 0: none)
//
//   q    [B, T, H, D] float32       (the new tokens' queries; T = tokens in the call)
//   k, v [B, Hkv, S, D] f32|bf16    (the heads-major decoder caches, or the encoder's K/V;
//                                    Hkv divides H, Hkv = H without grouping)
//   bias [B|1, H|1, T|1, S] float32 (relative position bias, a draft tree's hidden branches
//                                    as -1e10), or no elements: no bias
//   lengths [B, T] int32            (the keys each query row attends to)
//   out  [B, T, H, D] float32
//
// Why a kernel: XLA:CPU computes a T-row attention with other kernels than a 1-row one, so
// the rows of a k-token verify call would round differently from 1-token steps, and a
// sentence's encoding depends on the padded length of its batch. Running it one query row
// at a time in XLA keeps the decoder's rows equal but costs ~8 small ops per row and layer.
//
// Numerics, fixed per (b, t, h) row and independent of T, B, H, of threads and of the
// instruction set (8-lane AVX2 vectors on every build), and of keys appended under the mask
// (hence of the padded length S) as long as the row has one unmasked key and the masked
// values are finite: a masked key's weight is exactly 0 and adds exact zeros. Hence a length
// is bitwise the same row with the keys past it masked in the bias (their weights are exact
// zeros, their lanes' partial sums unchanged), whatever S. (A row whose keys are all masked
// gets near-uniform weights over its n keys, as XLA's softmax does when n = S.)
//   logit[s] = hsum8(acc), acc = fma(q[d0..d0+7], k[s, d0..d0+7], acc) for d0 = 0, 8, ...
//              (a partial last group is zero-padded); with a softcap c > 0, then
//              tanh1(logit / c) * c (tanh1: a fixed rational function); then + bias[s];
//   e[s]     = exp8(logit[s] - max_s logit) (a fixed polynomial; arguments below
//              ln(FLT_MIN) give 0), sum = hsum8 of the 8-lane running sum over s;
//   p[s]     = e[s] / sum, rounded to bfloat16 (to nearest even) when v is bfloat16 (as
//              XLA's path casts the probabilities to the compute dtype);
//   out[d]   = one float32 accumulator per d, fma(p[s], v[s, d], .) for s = 0, 1, ..., S-1.
// Row r of a T-row call is therefore bitwise the 1-row call on that row. NaN in q, k or
// bias gives NaN, as XLA's softmax does. A window is bitwise the same row with the keys
// before it masked in the bias: their logits are -inf (exp8 gives 0, the lanes' partial
// sums unchanged) and their terms of the weighted sum (exact zeros) are skipped. Without a
// softcap a row's operations are those of the kernel before it had one (the same bits).
//
// Threads: (b, h) pairs are split into chunks over XLA's intra-op pool (pool.h); the T rows
// of a pair run one after another on one thread, so its K/V stay in cache between them.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "pool.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using V8 = __m256;

// Lanes summed in a fixed tree: (0+4, 1+5, 2+6, 3+7), then (0+2, 1+3), then 0+1.
inline float hsum8(V8 a) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// e^x per lane: x = n ln2 + r (Cody-Waite, |r| <= ln2 / 2), e^r by a degree-6 polynomial in
// Horner form (Cephes' expf coefficients), times 2^n. 1-2 ulp; x < ln(FLT_MIN) gives 0,
// NaN stays NaN. Callers pass x <= 0 (logit - max); the upper clamp keeps 2^n finite.
inline V8 exp8(V8 x) {
  const V8 lo = _mm256_set1_ps(-87.33654475f);  // ln(FLT_MIN): below it, 0
  const V8 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  // max/min return their second operand when one is NaN: x second, so NaN passes through.
  x = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(lo, x));
  const V8 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f),
                                               _mm256_set1_ps(0.5f)));
  V8 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  V8 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

// tanh(x) as Eigen's and XLA:CPU's float approximation computes it: an odd rational function
// of degrees 13/6 in fma Horner form (Eigen's coefficients), x itself for |x| < 0.0004, and
// the argument clamped to +-7.99881172 (where the function reaches +-1 under fma). At most 5
// ulp from tanh; NaN stays NaN. Scalar, with one operation sequence on every build.
inline float tanh1(float x) {
  if (!(std::fabs(x) >= 0.0004f)) return x;  // tiny, or NaN
  const float c = std::min(7.99881172180175781f, std::max(-7.99881172180175781f, x));
  const float x2 = c * c;
  float p = __builtin_fmaf(x2, -2.76076847742355e-16f, 2.00018790482477e-13f);
  p = __builtin_fmaf(x2, p, -8.60467152213735e-11f);
  p = __builtin_fmaf(x2, p, 5.12229709037114e-08f);
  p = __builtin_fmaf(x2, p, 1.48572235717979e-05f);
  p = __builtin_fmaf(x2, p, 6.37261928875436e-04f);
  p = __builtin_fmaf(x2, p, 4.89352455891786e-03f);
  float q = __builtin_fmaf(x2, 1.19825839466702e-06f, 1.18534705686654e-04f);
  q = __builtin_fmaf(x2, q, 2.26843463243900e-03f);
  q = __builtin_fmaf(x2, q, 4.89352518554385e-03f);
  return c * p / q;
}

// Eight values at src as float32 (bfloat16 widened exactly by a 16-bit shift).
inline V8 load8(const float* src) { return _mm256_loadu_ps(src); }
inline V8 load8(const uint16_t* src) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline float load1(const float* src) { return *src; }
inline float load1(const uint16_t* src) {
  const uint32_t bits = static_cast<uint32_t>(*src) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// float32 -> the nearest bfloat16 (ties to even), kept as float32.
inline V8 round_bf16(V8 x) {
  const __m256i b = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_add_epi32(b, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF)));
  return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32(int(0xFFFF0000u))));
}

struct Attention {
  int64_t B, T, H, S, D;
  int64_t group;                   // query heads per K/V head (H / Hkv)
  const float* q;
  const void* k;
  const void* v;
  const float* bias;                // nullptr: no bias
  int64_t bias_b, bias_h, bias_t;  // bias strides; 0 along a broadcast dimension
  const int32_t* lengths;          // [B, T]
  int64_t window;                  // keys before length - window are not read; 0: none
  float softcap;                   // logits soft-capped at it (before the bias); 0: none
  float* out;
  bool bf16;                       // k and v are bfloat16 (else float32)
};

// One query row over its S = lengths[b, t] keys. scratch: 2 * S8 floats, S8 = a.S rounded up
// to 8.
template <typename KV>
void row(const Attention& a, int64_t b, int64_t h, int64_t t, float* scratch) {
  const int64_t S = std::clamp<int64_t>(a.lengths[b * a.T + t], 1, a.S);
  const int64_t lo = a.window > 0 ? std::max<int64_t>(S - a.window, 0) : 0;  // first key read
  const int64_t D = a.D, S8 = (S + 7) / 8 * 8, D8 = D / 8 * 8;
  const float* q = a.q + ((b * a.T + t) * a.H + h) * D;
  const int64_t kv = b * (a.H / a.group) + h / a.group;  // the K/V head of query head h
  const KV* k = static_cast<const KV*>(a.k) + kv * a.S * D;
  const KV* v = static_cast<const KV*>(a.v) + kv * a.S * D;
  const float* bias = a.bias ? a.bias + b * a.bias_b + h * a.bias_h + t * a.bias_t : nullptr;
  float* logit = scratch;
  float* prob = scratch + S8;

  alignas(32) float q_tail[8] = {0};  // the zero-padded last group of d
  for (int64_t d = D8; d < D; ++d) q_tail[d - D8] = q[d];
  float top = -__builtin_inff();
  for (int64_t s = 0; s < lo; ++s) logit[s] = -__builtin_inff();  // before the window
  for (int64_t s = lo; s < S; ++s) {
    const KV* ks = k + s * D;
    V8 acc = _mm256_setzero_ps();
    for (int64_t d = 0; d < D8; d += 8) acc = _mm256_fmadd_ps(load8(q + d), load8(ks + d), acc);
    if (D8 < D) {
      alignas(32) float k_tail[8] = {0};
      for (int64_t d = D8; d < D; ++d) k_tail[d - D8] = load1(ks + d);
      acc = _mm256_fmadd_ps(_mm256_load_ps(q_tail), _mm256_load_ps(k_tail), acc);
    }
    float dot = hsum8(acc);
    if (a.softcap > 0.0f) dot = tanh1(dot / a.softcap) * a.softcap;
    logit[s] = bias ? dot + bias[s] : dot;
    top = std::max(top, logit[s]);
  }
  for (int64_t s = S; s < S8; ++s) logit[s] = -__builtin_inff();  // exp8 gives 0

  const V8 vtop = _mm256_set1_ps(top);
  V8 total = _mm256_setzero_ps();
  for (int64_t s = 0; s < S8; s += 8) {
    const V8 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(logit + s), vtop));
    _mm256_storeu_ps(prob + s, e);
    total = _mm256_add_ps(total, e);
  }
  const V8 vsum = _mm256_set1_ps(hsum8(total));
  for (int64_t s = 0; s < S8; s += 8) {
    V8 p = _mm256_div_ps(_mm256_loadu_ps(prob + s), vsum);
    if (a.bf16) p = round_bf16(p);
    _mm256_storeu_ps(prob + s, p);
  }

  float* o = a.out + ((b * a.T + t) * a.H + h) * D;
  constexpr int G = 4;  // groups of 8 columns per pass (independent accumulators)
  int64_t d0 = 0;
  for (; d0 + 8 * G <= D8; d0 += 8 * G) {
    V8 acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
    for (int64_t s = lo; s < S; ++s) {
      const V8 p = _mm256_set1_ps(prob[s]);
      for (int g = 0; g < G; ++g)
        acc[g] = _mm256_fmadd_ps(p, load8(v + s * D + d0 + 8 * g), acc[g]);
    }
    for (int g = 0; g < G; ++g) _mm256_storeu_ps(o + d0 + 8 * g, acc[g]);
  }
  for (; d0 < D8; d0 += 8) {
    V8 acc = _mm256_setzero_ps();
    for (int64_t s = lo; s < S; ++s)
      acc = _mm256_fmadd_ps(_mm256_set1_ps(prob[s]), load8(v + s * D + d0), acc);
    _mm256_storeu_ps(o + d0, acc);
  }
  for (int64_t d = D8; d < D; ++d) {  // columns past the last group of 8
    float acc = 0.0f;
    for (int64_t s = lo; s < S; ++s) acc = __builtin_fmaf(prob[s], load1(v + s * D + d), acc);
    o[d] = acc;
  }
}

// Rows of the (b, h) pairs [p0, p1), all T query rows of each; scratch: 2 * S8 floats.
void pairs(const Attention& a, int64_t p0, int64_t p1, float* scratch) {
  for (int64_t pair = p0; pair < p1; ++pair)
    for (int64_t t = 0; t < a.T; ++t) {
      if (a.bf16) row<uint16_t>(a, pair / a.H, pair % a.H, t, scratch);
      else row<float>(a, pair / a.H, pair % a.H, t, scratch);
    }
}

ffi::Error AttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::AnyBuffer k,
                         ffi::AnyBuffer v, ffi::Buffer<ffi::F32> bias,
                         ffi::Buffer<ffi::S32> lengths, ffi::ResultBuffer<ffi::F32> out,
                         int64_t nthreads, int64_t chunks_per_thread, int64_t window,
                         float softcap) {
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(),
             bd = bias.dimensions(), ld = lengths.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4 || bd.size() != 4)
    return ffi::Error::InvalidArgument("decode_attention: q, k, v and bias must be 4-D");
  if (ld.size() != 2 || ld[0] != qd[0] || ld[1] != qd[1])
    return ffi::Error::InvalidArgument("decode_attention: lengths must be [B, T] of q");
  const bool has_bias = bias.element_count() > 0;
  const int64_t B = qd[0], T = qd[1], H = qd[2], D = qd[3], S = kd[2], Hkv = kd[1];
  if (kd[0] != B || Hkv < 1 || H % Hkv != 0 || kd[3] != D ||
      !std::equal(kd.begin(), kd.end(), vd.begin()))
    return ffi::Error::InvalidArgument("decode_attention: k, v must be [B, Hkv, S, D] of q");
  if (k.element_type() != v.element_type() ||
      (k.element_type() != ffi::DataType::F32 && k.element_type() != ffi::DataType::BF16))
    return ffi::Error::InvalidArgument("decode_attention: k, v must both be f32 or bf16");
  if (has_bias && ((bd[0] != B && bd[0] != 1) || (bd[1] != H && bd[1] != 1) ||
                   (bd[2] != T && bd[2] != 1) || bd[3] != S))
    return ffi::Error::InvalidArgument("decode_attention: bias must be [B|1, H|1, T|1, S]");
  Attention a{B, T, H, S, D, H / Hkv, q.typed_data(), k.untyped_data(), v.untyped_data(),
              has_bias ? bias.typed_data() : nullptr, 0, 0, 0, lengths.typed_data(),
              std::max<int64_t>(window, 0), softcap > 0.0f ? softcap : 0.0f, out->typed_data(),
              k.element_type() == ffi::DataType::BF16};
  a.bias_t = bd[2] == 1 ? 0 : S;
  a.bias_h = bd[1] == 1 ? 0 : bd[2] * S;
  a.bias_b = bd[0] == 1 ? 0 : bd[1] * bd[2] * S;
  if (B * T * H == 0 || D == 0) return ffi::Error::Success();
  if (S == 0) {  // nothing to attend to: XLA's softmax over no keys sums nothing either
    std::memset(a.out, 0, sizeof(float) * B * T * H * D);
    return ffi::Error::Success();
  }
  const int64_t npairs = B * H, S8 = (S + 7) / 8 * 8;
  const int64_t nchunks = specdec::chunk_count(pool, nthreads, chunks_per_thread, npairs);
  std::vector<float> scratch;  // per chunk (allocated here: nothing throws on the pool)
  try {
    scratch.resize(static_cast<size_t>(nchunks * 2 * S8));
  } catch (const std::bad_alloc&) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted, "decode_attention: out of memory");
  }
  specdec::parallel_chunks(pool, nthreads, nchunks, [&a, &scratch, npairs, nchunks, S8](int64_t c) {
    pairs(a, npairs * c / nchunks, npairs * (c + 1) / nchunks, scratch.data() + c * 2 * S8);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecDecodeAttention, AttentionImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("nthreads")
                                  .Attr<int64_t>("chunks")
                                  .Attr<int64_t>("window")
                                  .Attr<float>("softcap"));
