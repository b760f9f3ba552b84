// Skinny products Y[M, N] = X[M, K] @ W[K, N] for small M (decode steps), as one XLA FFI
// custom call for the CPU. Adapted from the skinny-product study (issue 13).
//
// W is packed once per model into 16-column panels, so that each panel is one contiguous
// stream, read from memory ONCE per call whatever M is (all M rows use a column tile while
// it sits in registers / L1):
//   float32 :  Wp[P][K][16]        P = ceil(N / 16), columns zero-padded
//   bfloat16:  Wp[P][K2][16][2]    K2 = ceil(K / 2): 32-bit lane n of a 64-byte row holds
//                                  (W[2k][n], W[2k+1][n]); K zero-padded to even
// The kind follows the packed dtype: float32 panels -> "f32", bfloat16 panels -> "bf16cvt"
// (bf16 weights widened to float32 by a shift / mask, activations stay float32).
//
// Numerics, fixed by construction and independent of M, of the tiling and of threads:
// every output element y[m, n] is ONE float32 accumulator, started at +0.0f and updated
// in order k = 0, 1, ..., K-1 by acc = fma(x[m, k], w[k, n], acc) (vfmadd231ps). The
// register tiling (rows per block, panels per tile) changes with M, the per-element
// instruction sequence does not: row r of an M-row call is bitwise the 1-row call on it.
//
// Threads: column tiles are split into chunks, run by the calling thread and helpers of
// XLA's intra-op pool (pool.h).
//
// Two instruction sets, one arithmetic: AVX-512F + FMA (a panel row is one zmm register)
// or AVX2 + FMA (two ymm registers). Built with -mavx512f -mfma or -mavx2 -mfma, whichever
// the CPU has (the Python side checks /proc/cpuinfo). Both run the same per-element FMA
// sequence, so they give bitwise the same results; only the register tiling differs.
// Headers: the XLA FFI API inside jaxlib (jax.ffi.include_dir()); nothing is linked.

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

#include "pool.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

enum class Kind { kF32, kBf16Cvt };

struct Problem {
  Kind kind;
  int64_t M, K, N, P;  // P = number of 16-column panels
  const float* x;      // [M, K]
  const void* w;       // packed panels
  float* y;            // [M, N]
  int prefetch;        // software prefetch distance, in panel rows (0 = off)
};

// Vec: L float32 lanes; a 16-column panel row is VPP = 16 / L of them.
#if defined(__AVX512F__) && defined(__FMA__)
constexpr int L = 16;
constexpr int kMaxMR = 14;  // MR * NV accumulators + NV (2 NV) weights + 1 <= 32 zmm
using Vec = __m512;
inline Vec v_bcast(float x) { return _mm512_set1_ps(x); }
inline Vec v_zero() { return _mm512_setzero_ps(); }
inline Vec v_load(const float* src) { return _mm512_loadu_ps(src); }
inline Vec v_fma(Vec x, Vec w, Vec acc) { return _mm512_fmadd_ps(x, w, acc); }
// L lanes of (W[2kk][n], W[2kk+1][n]) bf16 pairs -> the even and odd rows as float32.
inline void v_bf16_pairs(const uint32_t* src, Vec* even, Vec* odd) {
  const __m512i v = _mm512_loadu_si512(src);
  *even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  *odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xFFFF0000u))));
}
inline void v_store(float* dst, Vec a, int64_t valid) {
  if (valid >= L) _mm512_storeu_ps(dst, a);
  else if (valid > 0) _mm512_mask_storeu_ps(dst, static_cast<__mmask16>((1u << valid) - 1u), a);
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int L = 8;
constexpr int kMaxMR = 6;   // 2 MR * NV accumulators + 2 NV weights + 1 <= 16 ymm
using Vec = __m256;
inline Vec v_bcast(float x) { return _mm256_set1_ps(x); }
inline Vec v_zero() { return _mm256_setzero_ps(); }
inline Vec v_load(const float* src) { return _mm256_loadu_ps(src); }
inline Vec v_fma(Vec x, Vec w, Vec acc) { return _mm256_fmadd_ps(x, w, acc); }
inline void v_bf16_pairs(const uint32_t* src, Vec* even, Vec* odd) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
  *even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  *odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(int(0xFFFF0000u))));
}
inline void v_store(float* dst, Vec a, int64_t valid) {
  if (valid >= L) {
    _mm256_storeu_ps(dst, a);
  } else if (valid > 0) {  // the last, partial panel of a row
    alignas(32) float tmp[L];
    _mm256_store_ps(tmp, a);
    std::memcpy(dst, tmp, sizeof(float) * valid);
  }
}
#else
#error "skinny.cc needs AVX-512F or AVX2, and FMA"
#endif
constexpr int VPP = 16 / L;

// acc[m][j * VPP + h] holds y[m0 + m, (p0 + j) * 16 + h * L + (0 .. L-1)].
template <int MR, int NV>
inline void store_tile(const Problem& p, int64_t m0, int64_t p0, Vec (&acc)[MR][NV * VPP]) {
  for (int m = 0; m < MR; ++m)
    for (int i = 0; i < NV * VPP; ++i) {
      const int64_t col = p0 * 16 + i * L;
      v_store(p.y + (m0 + m) * p.N + col, acc[m][i], p.N - col);
    }
}

// One register tile: MR rows x NV panels (16 columns each), the full K.
template <int MR, int NV>
void tile_f32(const Problem& p, int64_t m0, int64_t p0) {
  const int64_t K = p.K;
  const float* __restrict w = static_cast<const float*>(p.w) + p0 * K * 16;
  const float* __restrict x = p.x + m0 * K;
  Vec acc[MR][NV * VPP];
  for (int m = 0; m < MR; ++m)
    for (int i = 0; i < NV * VPP; ++i) acc[m][i] = v_zero();
  const int pf = p.prefetch;
  for (int64_t k = 0; k < K; ++k) {
    Vec wv[NV * VPP];
    for (int j = 0; j < NV; ++j) {
      const float* src = w + j * K * 16 + k * 16;
      if (pf) _mm_prefetch(reinterpret_cast<const char*>(src + pf * 16), _MM_HINT_T0);
      for (int h = 0; h < VPP; ++h) wv[j * VPP + h] = v_load(src + h * L);
    }
    for (int m = 0; m < MR; ++m) {
      const Vec xb = v_bcast(x[m * K + k]);
      for (int i = 0; i < NV * VPP; ++i) acc[m][i] = v_fma(xb, wv[i], acc[m][i]);
    }
  }
  store_tile<MR, NV>(p, m0, p0, acc);
}

// bfloat16 tiles widen every weight vector of a row pair first when the accumulators, the
// widened weights and two broadcasts fit the vector registers (16 ymm on AVX2); otherwise
// (more accumulators: more independent FMA chains, needed to hide the FMA latency at 1-2
// rows) they widen one column vector at a time. Same FMA sequence per element either way.
template <int MR, int NV>
constexpr bool kWidenFirst = VPP == 1 || MR * NV * VPP + 2 * NV * VPP + 2 <= 16;

template <int MR, int NV>
void tile_bf16cvt(const Problem& p, int64_t m0, int64_t p0) {
  const int64_t K = p.K, K2 = (p.K + 1) / 2;
  const uint32_t* __restrict w = static_cast<const uint32_t*>(p.w) + p0 * K2 * 16;
  const float* __restrict x = p.x + m0 * K;
  Vec acc[MR][NV * VPP];
  for (int m = 0; m < MR; ++m)
    for (int i = 0; i < NV * VPP; ++i) acc[m][i] = v_zero();
  const int pf = p.prefetch;
  const int64_t pairs = K / 2;  // complete (even, odd) pairs
  for (int64_t kk = 0; kk < pairs; ++kk) {
    if (pf)
      for (int j = 0; j < NV; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(w + j * K2 * 16 + (kk + pf) * 16), _MM_HINT_T0);
    if constexpr (kWidenFirst<MR, NV>) {  // all weights of the row pair, then row by row
      Vec we[NV * VPP], wo[NV * VPP];      // W[2kk][n], W[2kk+1][n]
      for (int i = 0; i < NV * VPP; ++i)
        v_bf16_pairs(w + (i / VPP) * K2 * 16 + kk * 16 + (i % VPP) * L, &we[i], &wo[i]);
      for (int m = 0; m < MR; ++m) {
        const Vec xe = v_bcast(x[m * K + 2 * kk]);
        for (int i = 0; i < NV * VPP; ++i) acc[m][i] = v_fma(xe, we[i], acc[m][i]);
        const Vec xo = v_bcast(x[m * K + 2 * kk + 1]);
        for (int i = 0; i < NV * VPP; ++i) acc[m][i] = v_fma(xo, wo[i], acc[m][i]);
      }
    } else {  // one column vector at a time, widened just before its FMAs
      for (int i = 0; i < NV * VPP; ++i) {
        Vec we, wo;
        v_bf16_pairs(w + (i / VPP) * K2 * 16 + kk * 16 + (i % VPP) * L, &we, &wo);
        for (int m = 0; m < MR; ++m) acc[m][i] = v_fma(v_bcast(x[m * K + 2 * kk]), we, acc[m][i]);
        for (int m = 0; m < MR; ++m)
          acc[m][i] = v_fma(v_bcast(x[m * K + 2 * kk + 1]), wo, acc[m][i]);
      }
    }
  }
  if (K & 1) {  // the last, unpaired k (its odd half is the zero padding)
    const int64_t kk = pairs;
    for (int j = 0; j < NV; ++j)
      for (int h = 0; h < VPP; ++h) {
        Vec we, wo;
        v_bf16_pairs(w + j * K2 * 16 + kk * 16 + h * L, &we, &wo);
        for (int m = 0; m < MR; ++m)
          acc[m][j * VPP + h] = v_fma(v_bcast(x[m * K + 2 * kk]), we, acc[m][j * VPP + h]);
      }
  }
  store_tile<MR, NV>(p, m0, p0, acc);
}

using TileFn = void (*)(const Problem&, int64_t, int64_t);

template <Kind KD, int NV, int MR>
constexpr TileFn pick_one() {
  if constexpr (KD == Kind::kF32) return &tile_f32<MR, NV>;
  else return &tile_bf16cvt<MR, NV>;
}

template <Kind KD, int NV, int... MRs>
constexpr std::array<TileFn, sizeof...(MRs) + 1> make_table(std::integer_sequence<int, MRs...>) {
  return {nullptr, pick_one<KD, NV, MRs + 1>()...};
}

template <Kind KD, int NV>
TileFn tile_for(int mr) {
  static constexpr auto table = make_table<KD, NV>(std::make_integer_sequence<int, kMaxMR>{});
  return table[mr];
}

template <Kind KD>
TileFn get_tile(int nv, int mr) {
  switch (nv) {
    case 8: return tile_for<KD, 8>(mr);
    case 4: return tile_for<KD, 4>(mr);
    case 2: return tile_for<KD, 2>(mr);
    default: return tile_for<KD, 1>(mr);
  }
}

TileFn get_tile(Kind kd, int nv, int mr) {
  return kd == Kind::kF32 ? get_tile<Kind::kF32>(nv, mr) : get_tile<Kind::kBf16Cvt>(nv, mr);
}

// Panels per tile and most rows per block, for M rows (register budget, see kMaxMR).
void plan(Kind kd, int64_t M, int* nv, int* mr_max) {
  const bool cvt = kd == Kind::kBf16Cvt;
  if constexpr (VPP == 1) {  // AVX-512: 32 zmm registers, one per panel row
    if (M == 1 || (M == 2 && !cvt)) { *nv = 8; *mr_max = 2; }
    else if (M <= (cvt ? 5 : 6)) { *nv = 4; *mr_max = cvt ? 5 : 6; }
    else { *nv = 2; *mr_max = cvt ? 13 : 14; }
  } else {                   // AVX2: 16 ymm registers, two per panel row
    // Zen 3 runs 2 FMAs per cycle at 4 cycles' latency: 8 independent accumulators keep
    // the FMA units busy. 1-2 rows get them from more panels (for bfloat16 widened one
    // column vector at a time, see kWidenFirst): measured on the demo target's products,
    // 1 row 0.9x and 2 rows 0.8x the time of 2 panels at 1 row / 1 panel at 2 rows.
    if (M == 1) { *nv = 4; *mr_max = 1; }
    else if (M == 2) { *nv = 2; *mr_max = 2; }
    else { *nv = 1; *mr_max = cvt ? 5 : 6; }
  }
}

// Column tiles [t0, t1), in units of nv panels (the last tile may be narrower).
void run_tiles(const Problem& p, int nv, int mr_max, int64_t t0, int64_t t1) {
  const int64_t nblocks = (p.M + mr_max - 1) / mr_max;
  for (int64_t t = t0; t < t1; ++t) {
    int64_t pan = t * nv;
    int64_t left = std::min<int64_t>(nv, p.P - pan);
    while (left > 0) {  // a full tile, or the remainder panels one at a time
      const int this_nv = left >= nv ? nv : 1;
      int64_t m0 = 0;
      for (int64_t b = 0; b < nblocks; ++b) {  // near-equal row blocks
        const int64_t rows = (p.M - m0) / (nblocks - b);
        if (this_nv == nv) {
          get_tile(p.kind, nv, static_cast<int>(rows))(p, m0, pan);
        } else {  // 1-panel tiles take up to kMaxMR rows
          for (int64_t r0 = m0; r0 < m0 + rows;) {
            const int r = static_cast<int>(std::min<int64_t>(kMaxMR, m0 + rows - r0));
            get_tile(p.kind, 1, r)(p, r0, pan);
            r0 += r;
          }
        }
        m0 += rows;
      }
      pan += this_nv;
      left -= this_nv;
    }
  }
}

ffi::Error SkinnyDotImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer w,
                         ffi::ResultBuffer<ffi::F32> y, int64_t nthreads,
                         int64_t chunks_per_thread, int64_t prefetch) {
  const auto xd = x.dimensions();
  const auto yd = y->dimensions();
  if (xd.size() < 1 || yd.size() != xd.size())
    return ffi::Error::InvalidArgument("skinny_dot: x and y must have the same rank >= 1");
  Kind kind;
  if (w.element_type() == ffi::DataType::F32) kind = Kind::kF32;
  else if (w.element_type() == ffi::DataType::BF16) kind = Kind::kBf16Cvt;
  else return ffi::Error::InvalidArgument("skinny_dot: packed weights must be f32 or bf16");
  const int64_t K = xd.back(), N = yd.back();
  const int64_t M = K ? static_cast<int64_t>(x.element_count()) / K : 0;
  Problem p{kind, M, K, N, (N + 15) / 16, x.typed_data(), w.untyped_data(), y->typed_data(),
            static_cast<int>(prefetch)};
  const int64_t expect = kind == Kind::kF32 ? p.P * K * 16 : p.P * ((K + 1) / 2) * 32;
  if (static_cast<int64_t>(w.element_count()) != expect)
    return ffi::Error::InvalidArgument("skinny_dot: packed weights do not match [K, N]");
  if (M == 0 || N == 0) return ffi::Error::Success();
  if (K == 0) {
    std::memset(p.y, 0, sizeof(float) * M * N);
    return ffi::Error::Success();
  }
  int nv, mr_max;
  plan(kind, M, &nv, &mr_max);
  const int64_t ntiles = (p.P + nv - 1) / nv;
  const int64_t nchunks = specdec::chunk_count(pool, nthreads, chunks_per_thread, ntiles);
  specdec::parallel_chunks(pool, nthreads, nchunks, [&p, nv, mr_max, ntiles, nchunks](int64_t c) {
    run_tiles(p, nv, mr_max, ntiles * c / nchunks, ntiles * (c + 1) / nchunks);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecSkinnyDot, SkinnyDotImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("nthreads")
                                  .Attr<int64_t>("chunks")
                                  .Attr<int64_t>("prefetch"));
