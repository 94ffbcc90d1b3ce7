// Attention over a packed key pool in bfloat16 on a CPU with AVX512-BF16 (compile/kernels/__init__.py).
//
// boundserve::packed_attention(q [Tq, Hq, D], k [Tk, Hkv, D], v [Tk, Hkv, D], intervals [6 * max_keys])
// -> [Tq, Hq, D], all bfloat16 but the int64 intervals: query row i (pool row i + Tk - Tq) sees the
// keys of three intervals [lo, hi) of pool rows, read from intervals[f * max_keys + i] for f = 0..5
// (its own segment up to itself, its parent's segment, its grandparent's: compile/attention.py's
// interval table). Scores are bfloat16 dot products summed in float32 and scaled by 1/sqrt(D); the
// softmax runs in float32 online over chunks of keys (a query that sees no key gets zeros); the
// probabilities are rounded to bfloat16 and multiplied with v, summed in float32.
//
// Layout of the work:
//   - k and v are repacked once per call for the dot-product instruction (vdpbf16ps multiplies pairs
//     of bfloat16 and adds both products into one float32 lane): k as [Hkv][Tk/16][D/2][16] pairs
//     along D, so 16 keys' pairs sit in one vector and a group of 16 keys is one contiguous run; v as
//     [Hkv][Tk/2][D] pairs of consecutive keys, so 16 columns of two keys sit in one vector;
//   - a task is 32 query rows and one K/V head: the rows' G = Hq/Hkv query heads that share it, 32 G
//     query vectors, walk the key ranges any of the rows sees (the union of their intervals, 16-key
//     aligned, never one key twice), 128 keys per step; keys outside a row's intervals are masked, and
//     each tile of 4 query vectors reads only the 16-key groups its rows' spans touch (on the diagonal
//     of a causal segment, fewer than the task's);
//   - tasks are spread over the intra-op threads (at::parallel_for); scratch is per thread.
// Nothing here calls Python: two threads may run it at once.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

namespace boundserve {
namespace {

constexpr int64_t kRowsPerTask = 32;
constexpr int64_t kKeysPerStep = 128;  // a multiple of 16
constexpr int64_t kFields = 6;        // lo, hi of the own, parent and grandparent intervals
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// 2^y for y <= 0 (float32, relative error ~1e-7): 2^round(y) times a degree-6 polynomial of the rest.
inline __m512 exp2_ps(__m512 y) {
  y = _mm512_max_ps(y, _mm512_set1_ps(-126.0f));
  const __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(y, n);  // [-0.5, 0.5]
  __m512 p = _mm512_set1_ps(1.5403530393381610e-4f);  // ln(2)^k / k!, k = 6 .. 0
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

inline __m512bh as_pairs(__m512i x) { return reinterpret_cast<__m512bh>(x); }

// scores[r][0 : 16 * G] = q_r . keys, for 4 query vectors r (pairs along D, `pairs` of them) and
// G groups of 16 keys, each packed [pair][key].
template <int G>
void score_tile(const uint32_t* const q[4], const uint32_t* keys, int64_t pairs, float* const scores[4]) {
  __m512 acc[4][G];
  for (int r = 0; r < 4; ++r)
    for (int g = 0; g < G; ++g) acc[r][g] = _mm512_setzero_ps();
  for (int64_t j = 0; j < pairs; ++j) {
    __m512i k[G];
    for (int g = 0; g < G; ++g) k[g] = _mm512_loadu_si512(keys + (g * pairs + j) * 16);
    for (int r = 0; r < 4; ++r) {
      const __m512i qj = _mm512_set1_epi32(static_cast<int>(q[r][j]));
      for (int g = 0; g < G; ++g) acc[r][g] = _mm512_dpbf16_ps(acc[r][g], as_pairs(qj), as_pairs(k[g]));
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int g = 0; g < G; ++g) _mm512_storeu_ps(scores[r] + 16 * g, acc[r][g]);
}

// out[r][0 : 16 * C] = out[r] * scale[r] + p_r . values, for R query vectors r whose probabilities
// are bfloat16 pairs of consecutive keys (`pairs` of them) and values packed [pair][column] with
// `value_stride` columns per pair.
template <int R, int C>
void value_tile(const uint32_t* const p[R], const float scale[R], const uint32_t* values, int64_t value_stride,
                int64_t pairs, float* const out[R]) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r) {
    const __m512 s = _mm512_set1_ps(scale[r]);
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_mul_ps(_mm512_loadu_ps(out[r] + 16 * c), s);
  }
  for (int64_t j = 0; j < pairs; ++j) {
    __m512i v[C];
    for (int c = 0; c < C; ++c) v[c] = _mm512_loadu_si512(values + j * value_stride + 16 * c);
    for (int r = 0; r < R; ++r) {
      const __m512i pj = _mm512_set1_epi32(static_cast<int>(p[r][j]));
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], as_pairs(pj), as_pairs(v[c]));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out[r] + 16 * c, acc[r][c]);
}

using ScoreTile = void (*)(const uint32_t* const*, const uint32_t*, int64_t, float* const*);
constexpr ScoreTile kScoreTiles[4] = {score_tile<1>, score_tile<2>, score_tile<3>, score_tile<4>};

struct Shape {
  int64_t tq, tk, hq, hkv, d, group, max_keys;
  int64_t pairs() const { return d / 2; }
};

// k [Tk, Hkv, D] -> [Hkv][Tk16/16][D/2][16] pairs along D; v -> [Hkv][Tk16/2][D] pairs of keys (zero past Tk).
void pack_keys_values(const Shape& s, int64_t tk16, const uint16_t* k, const uint16_t* v, uint32_t* kp,
                      uint32_t* vp) {
  const int64_t pairs = s.pairs(), row = s.hkv * s.d;  // elements between consecutive keys
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i key_offsets = _mm512_mullo_epi32(lane, _mm512_set1_epi32(static_cast<int>(row / 2)));
  at::parallel_for(0, s.hkv * (tk16 / 16), 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t h = task / (tk16 / 16), t0 = (task % (tk16 / 16)) * 16;
      const __mmask16 present = static_cast<__mmask16>((1u << std::min<int64_t>(16, std::max<int64_t>(0, s.tk - t0))) - 1);
      // 16 keys' pair j, one vector: a gather of 32-bit pairs down the 16 rows
      const auto* first = reinterpret_cast<const int*>(k + (t0 * s.hkv + h) * s.d);
      uint32_t* group = kp + (h * (tk16 / 16) + t0 / 16) * pairs * 16;
      for (int64_t j = 0; j < pairs; ++j)
        _mm512_storeu_si512(group + j * 16, _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), present, key_offsets,
                                                                         first + j, 4));
      // two consecutive keys' columns interleaved, 16 columns at a time
      for (int64_t t = t0; t < t0 + 16; t += 2) {
        uint32_t* out = vp + (h * (tk16 / 2) + t / 2) * s.d;
        if (t + 1 < s.tk) {
          const uint16_t* even = v + (t * s.hkv + h) * s.d;
          const uint16_t* odd = even + row;
          for (int64_t c = 0; c < s.d; c += 16) {
            const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(even + c)));
            const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(odd + c)));
            _mm512_storeu_si512(out + c, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
          }
        } else {
          for (int64_t c = 0; c < s.d; ++c) out[c] = t < s.tk ? uint32_t{v[(t * s.hkv + h) * s.d + c]} : 0u;
        }
      }
    }
  });
}

// The key ranges rows [i0, i1) see between them: 16-aligned, sorted, disjoint.
std::vector<std::pair<int64_t, int64_t>> key_ranges(const int64_t* intervals, int64_t max_keys, int64_t i0,
                                                    int64_t i1) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t f = 0; f < kFields; f += 2) {
      const int64_t lo = intervals[f * max_keys + i], hi = intervals[(f + 1) * max_keys + i];
      if (lo < hi) ranges.emplace_back(lo / 16 * 16, (hi + 15) / 16 * 16);
    }
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second)
      merged.back().second = std::max(merged.back().second, r.second);
    else
      merged.push_back(r);
  }
  return merged;
}

struct Scratch {
  std::vector<float> scores, out, max, sum, rescale;
  std::vector<float> spare;  // where a tile's rows past the last vector write
  std::vector<uint16_t> probs;
  std::vector<int64_t> first_key, end_key;  // per row: the span of its intervals
  std::vector<std::pair<int64_t, int64_t>> tile_groups;  // per 4-vector tile: the 16-key groups of a step it reads
  explicit Scratch(int64_t rows, int64_t vectors, int64_t d)
      : scores(vectors * kKeysPerStep), out(vectors * d), max(vectors), sum(vectors), rescale(vectors),
        spare(std::max<int64_t>(d, kKeysPerStep)), probs(vectors * kKeysPerStep), first_key(rows), end_key(rows),
        tile_groups((vectors + 3) / 4) {}
};

// One task: rows [i0, i1) of K/V head h.
void attend(const Shape& s, int64_t tk16, const uint16_t* q, const uint32_t* kp, const uint32_t* vp,
            const int64_t* intervals, int64_t i0, int64_t i1, int64_t h, Scratch& w, uint16_t* out) {
  const int64_t rows = i1 - i0, vectors = rows * s.group, pairs = s.pairs();
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.d)) * M_LOG2E);  // exp2 domain
  std::fill(w.out.begin(), w.out.begin() + vectors * s.d, 0.0f);
  std::fill(w.max.begin(), w.max.begin() + vectors, kNegInf);
  std::fill(w.sum.begin(), w.sum.begin() + vectors, 0.0f);
  auto query = [&](int64_t m) {  // vector m = row * G + head in group
    return reinterpret_cast<const uint32_t*>(q + ((i0 + m / s.group) * s.hq + h * s.group + m % s.group) * s.d);
  };
  for (int64_t r = 0; r < rows; ++r) {
    w.first_key[r] = std::numeric_limits<int64_t>::max();
    w.end_key[r] = 0;
    for (int64_t f = 0; f < kFields; f += 2) {
      const int64_t lo = intervals[f * s.max_keys + i0 + r], hi = intervals[(f + 1) * s.max_keys + i0 + r];
      if (lo < hi) {
        w.first_key[r] = std::min(w.first_key[r], lo);
        w.end_key[r] = std::max(w.end_key[r], hi);
      }
    }
  }
  const uint32_t* kh = kp + h * pairs * tk16;
  const uint32_t* vh = vp + h * (tk16 / 2) * s.d;
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);

  for (const auto& [first, last] : key_ranges(intervals, s.max_keys, i0, i1)) {
    for (int64_t c0 = first; c0 < last; c0 += kKeysPerStep) {
      const int64_t n = std::min(kKeysPerStep, last - c0), groups = n / 16;
      // scores against keys [c0, c0 + n), 4 vectors at a time, over the 16-key groups their rows' spans
      // touch (a group no row of the tile sees is left out of its scores and of its product with v)
      for (int64_t m = 0; m < vectors; m += 4) {
        int64_t lo = c0 + n, hi = c0;
        for (int64_t r = m / s.group; r <= std::min(m + 3, vectors - 1) / s.group; ++r) {
          lo = std::min(lo, w.first_key[r]);
          hi = std::max(hi, w.end_key[r]);
        }
        lo = std::max(lo, c0);
        hi = std::min(hi, c0 + n);
        const int64_t g0 = lo < hi ? (lo - c0) / 16 : 0, g1 = lo < hi ? (hi - c0 + 15) / 16 : 0;
        w.tile_groups[m / 4] = {g0, g1};
        if (g0 == g1) continue;
        for (int64_t g = g0; g < g1; g += 4) {  // at most 4 groups a tile: 16 accumulators
          const uint32_t* qs[4];
          float* ss[4];
          for (int r = 0; r < 4; ++r) {
            const int64_t mm = std::min(m + r, vectors - 1);  // past the end: recompute the last vector
            qs[r] = query(mm);
            ss[r] = w.scores.data() + mm * kKeysPerStep + 16 * g;
          }
          kScoreTiles[std::min<int64_t>(4, g1 - g) - 1](qs, kh + (c0 + 16 * g) * pairs, pairs, ss);
        }
      }
      // online softmax: mask each row's keys to its intervals, update its running max and sum
      for (int64_t r = 0; r < rows; ++r) {
        __mmask16 visible[kKeysPerStep / 16];
        for (int64_t g = 0; g < groups; ++g) {
          const __m512i key = _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int>(c0 + 16 * g)));
          __mmask16 any = 0;
          for (int64_t f = 0; f < kFields; f += 2) {
            const int lo = static_cast<int>(intervals[f * s.max_keys + i0 + r]);
            const int hi = static_cast<int>(intervals[(f + 1) * s.max_keys + i0 + r]);
            any |= _mm512_cmpge_epi32_mask(key, _mm512_set1_epi32(lo)) & _mm512_cmplt_epi32_mask(key, _mm512_set1_epi32(hi));
          }
          visible[g] = any;
        }
        for (int64_t m = r * s.group; m < (r + 1) * s.group; ++m) {
          float* sc = w.scores.data() + m * kKeysPerStep;
          __m512 top = _mm512_set1_ps(kNegInf);
          for (int64_t g = 0; g < groups; ++g) {
            const __m512 y = _mm512_mask_mul_ps(_mm512_set1_ps(kNegInf), visible[g], _mm512_loadu_ps(sc + 16 * g),
                                                _mm512_set1_ps(scale));
            _mm512_storeu_ps(sc + 16 * g, y);
            top = _mm512_max_ps(top, y);
          }
          const float new_max = std::max(w.max[m], _mm512_reduce_max_ps(top));
          uint16_t* pr = w.probs.data() + m * kKeysPerStep;
          if (new_max == kNegInf) {  // nothing visible yet
            std::memset(pr, 0, n * sizeof(uint16_t));
            w.rescale[m] = 1.0f;
            continue;
          }
          __m512 total = _mm512_setzero_ps();
          for (int64_t g = 0; g < groups; ++g) {
            const __m512 p = _mm512_maskz_mov_ps(
                visible[g], exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(sc + 16 * g), _mm512_set1_ps(new_max))));
            total = _mm512_add_ps(total, p);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(pr + 16 * g),
                                reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(p)));
          }
          const float rescale = std::exp2(w.max[m] - new_max);  // 0 while nothing was visible
          w.rescale[m] = rescale;
          w.sum[m] = w.sum[m] * rescale + _mm512_reduce_add_ps(total);
          w.max[m] = new_max;
        }
      }
      // out = out * rescale + probabilities . values, 64 columns (or 32, or 16) at a time
      const uint32_t* vc = vh + (c0 / 2) * s.d;
      for (int64_t col = 0; col < s.d;) {
        const int64_t width = s.d - col >= 64 ? 64 : s.d - col >= 32 ? 32 : 16;
        for (int64_t m = 0; m < vectors; m += 4) {
          // a row the tile's groups leave out has no visible key in this step: its rescale is 1
          const auto [g0, g1] = w.tile_groups[m / 4];
          if (g0 == g1) continue;
          const uint32_t* ps[4];
          float* os[4];
          float sc[4];
          for (int r = 0; r < 4; ++r) {
            const int64_t mm = m + r < vectors ? m + r : -1;
            ps[r] = reinterpret_cast<const uint32_t*>(w.probs.data() + (mm < 0 ? m : mm) * kKeysPerStep) + 8 * g0;
            os[r] = mm < 0 ? w.spare.data() : w.out.data() + mm * s.d + col;
            sc[r] = mm < 0 ? 0.0f : w.rescale[mm];
          }
          const uint32_t* vg = vc + 8 * g0 * s.d + col;
          if (width == 64) value_tile<4, 4>(ps, sc, vg, s.d, 8 * (g1 - g0), os);
          else if (width == 32) value_tile<4, 2>(ps, sc, vg, s.d, 8 * (g1 - g0), os);
          else value_tile<4, 1>(ps, sc, vg, s.d, 8 * (g1 - g0), os);
        }
        col += width;
      }
    }
  }
  // out = accumulated / sum, in bfloat16 (zeros where nothing was visible)
  for (int64_t m = 0; m < vectors; ++m) {
    const float inv = w.sum[m] > 0.0f ? 1.0f / w.sum[m] : 0.0f;
    uint16_t* dst = out + ((i0 + m / s.group) * s.hq + h * s.group + m % s.group) * s.d;
    for (int64_t col = 0; col < s.d; col += 16) {
      const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(w.out.data() + m * s.d + col), _mm512_set1_ps(inv));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + col), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)));
    }
  }
}

at::Tensor packed_attention(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                            const at::Tensor& intervals_in) {
  TORCH_CHECK(q_in.device().is_cpu(), "boundserve::packed_attention runs on a CPU");
  TORCH_CHECK(q_in.scalar_type() == at::kBFloat16 && k_in.scalar_type() == at::kBFloat16 &&
                  v_in.scalar_type() == at::kBFloat16,
              "boundserve::packed_attention takes bfloat16 q, k, v");
  TORCH_CHECK(q_in.dim() == 3 && k_in.dim() == 3 && v_in.sizes() == k_in.sizes(),
              "q [Tq, Hq, D], k and v [Tk, Hkv, D] expected, got ", q_in.sizes(), ", ", k_in.sizes(), ", ",
              v_in.sizes());
  TORCH_CHECK(intervals_in.scalar_type() == at::kLong && intervals_in.dim() == 1 && intervals_in.numel() % kFields == 0,
              "intervals: a 1-D int64 table of 6 fields expected, got ", intervals_in.sizes());
  const Shape s{q_in.size(0), k_in.size(0), q_in.size(1), k_in.size(1), q_in.size(2),
                q_in.size(1) / std::max<int64_t>(k_in.size(1), 1), intervals_in.numel() / kFields};
  TORCH_CHECK(k_in.size(2) == s.d && s.d % 16 == 0, "head size ", s.d, ": q and k must agree, a multiple of 16");
  TORCH_CHECK(s.hkv > 0 && s.hq % s.hkv == 0, s.hq, " query heads are not a multiple of ", s.hkv, " K/V heads");
  TORCH_CHECK(s.max_keys >= s.tq && s.tq <= s.tk, "intervals for ", s.max_keys, " rows, ", s.tq, " queries, ", s.tk,
              " keys");
  TORCH_CHECK(s.tk < (int64_t{1} << 31), "more keys than 32-bit lanes index");
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const at::Tensor intervals = intervals_in.contiguous();
  at::Tensor out = at::empty_like(q);
  if (s.tq == 0) return out;
  const int64_t tk16 = (s.tk + 15) / 16 * 16;
  at::Tensor kp = at::empty({s.hkv * s.pairs() * tk16}, q.options().dtype(at::kInt));
  at::Tensor vp = at::empty({s.hkv * (tk16 / 2) * s.d}, q.options().dtype(at::kInt));
  auto* kpd = reinterpret_cast<uint32_t*>(kp.data_ptr<int32_t>());
  auto* vpd = reinterpret_cast<uint32_t*>(vp.data_ptr<int32_t>());
  const auto* qd = reinterpret_cast<const uint16_t*>(q.data_ptr<at::BFloat16>());
  pack_keys_values(s, tk16, reinterpret_cast<const uint16_t*>(k.data_ptr<at::BFloat16>()),
                   reinterpret_cast<const uint16_t*>(v.data_ptr<at::BFloat16>()), kpd, vpd);
  const int64_t* table = intervals.data_ptr<int64_t>();
  auto* od = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const int64_t blocks = (s.tq + kRowsPerTask - 1) / kRowsPerTask;
  at::parallel_for(0, blocks * s.hkv, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch(kRowsPerTask, kRowsPerTask * s.group, s.d);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / s.hkv, h = task % s.hkv;
      attend(s, tk16, qd, kpd, vpd, table, b * kRowsPerTask, std::min(s.tq, (b + 1) * kRowsPerTask), h, scratch, od);
    }
  });
  return out;
}

}  // namespace
}  // namespace boundserve

TORCH_LIBRARY(boundserve, m) {
  m.def("packed_attention(Tensor q, Tensor k, Tensor v, Tensor intervals) -> Tensor");
}

TORCH_LIBRARY_IMPL(boundserve, CPU, m) { m.impl("packed_attention", &boundserve::packed_attention); }
