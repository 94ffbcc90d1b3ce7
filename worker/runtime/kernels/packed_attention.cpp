// Attention over a packed key pool on a CPU with AVX512-BF16, in bfloat16 or float32
// (worker/runtime/kernels/__init__.py).
//
// boundserve::packed_attention(q [Tq, Hq, D], k [Tk, Hkv, D], v [Tk, Hkv, D], intervals [6 * max_keys])
// -> [Tq, Hq, D], q, k, v and the output all bfloat16 or all float32, the intervals int64: query row i
// (pool row i + Tk - Tq) sees the keys of three intervals [lo, hi) of pool rows, read from
// intervals[f * max_keys + i] for f = 0..5 (its own segment up to itself, its parent's segment, its
// grandparent's: compile/attention.py's interval table). Scores are dot products summed in float32 and
// scaled by 1/sqrt(D); the softmax runs in float32 online over chunks of keys (a query that sees no key
// gets zeros); the probabilities, in q's dtype (rounded to bfloat16 for bfloat16), are multiplied with
// v, summed in float32.
//
// Layout of the work (a "unit" is 32 bits of q, k, v or probabilities: a pair of bfloat16, which
// vdpbf16ps multiplies and adds into one float32 lane, or one float, which an FMA takes):
//   - k and v are repacked once per call: k as [Hkv][Tk/16][D units][16] (a unit of D for 16 keys
//     in one vector, a group of 16 keys one contiguous run); v as [Hkv][Tk units][D], a unit of keys
//     per column (bfloat16: pairs of consecutive keys), so 16 columns sit in one vector;
//   - a task is 32 query rows and one K/V head: the rows' G = Hq/Hkv query heads that share it, 32 G
//     query vectors, walk the key ranges any of the rows sees (the union of their intervals, 16-key
//     aligned, never one key twice), 128 keys per step; keys outside a row's intervals are masked, and
//     each tile of 4 query vectors reads only the 16-key groups its rows' spans touch (on the diagonal
//     of a causal segment, fewer than the task's);
//   - tasks are spread over the intra-op threads (at::parallel_for); scratch is per thread.
// Nothing here calls Python: two threads may run it at once.

#include <torch/library.h>

#include <cmath>

#include "attention_parts.h"

namespace boundserve {
namespace {

constexpr int64_t kRowsPerTask = 32;
constexpr int64_t kKeysPerStep = 128;  // a multiple of 16

// scores[r][0 : 16 * G] = q_r . keys, for 4 query vectors r (`units` units of D) and G groups of 16
// keys, each packed [unit][key].
template <typename T, int G>
void score_tile(const uint32_t* const q[4], const uint32_t* keys, int64_t units, float* const scores[4]) {
  __m512 acc[4][G];
  for (int r = 0; r < 4; ++r)
    for (int g = 0; g < G; ++g) acc[r][g] = _mm512_setzero_ps();
  for (int64_t j = 0; j < units; ++j) {
    __m512i k[G];
    for (int g = 0; g < G; ++g) k[g] = _mm512_loadu_si512(keys + (g * units + j) * 16);
    for (int r = 0; r < 4; ++r) {
      const __m512i qj = _mm512_set1_epi32(static_cast<int>(q[r][j]));
      for (int g = 0; g < G; ++g) acc[r][g] = T::madd(acc[r][g], qj, k[g]);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int g = 0; g < G; ++g) _mm512_storeu_ps(scores[r] + 16 * g, acc[r][g]);
}

// out[r][0 : 16 * C] = out[r] * scale[r] + p_r . values, for R query vectors r whose probabilities
// are `units` units of keys and values packed [unit][column] with `value_stride` columns per unit.
template <typename T, int R, int C>
void value_tile(const uint32_t* const p[R], const float scale[R], const uint32_t* values, int64_t value_stride,
                int64_t units, float* const out[R]) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r) {
    const __m512 s = _mm512_set1_ps(scale[r]);
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_mul_ps(_mm512_loadu_ps(out[r] + 16 * c), s);
  }
  for (int64_t j = 0; j < units; ++j) {
    __m512i v[C];
    for (int c = 0; c < C; ++c) v[c] = _mm512_loadu_si512(values + j * value_stride + 16 * c);
    for (int r = 0; r < R; ++r) {
      const __m512i pj = _mm512_set1_epi32(static_cast<int>(p[r][j]));
      for (int c = 0; c < C; ++c) acc[r][c] = T::madd(acc[r][c], pj, v[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out[r] + 16 * c, acc[r][c]);
}

using ScoreTile = void (*)(const uint32_t* const*, const uint32_t*, int64_t, float* const*);
template <typename T>
constexpr ScoreTile kScoreTiles[4] = {score_tile<T, 1>, score_tile<T, 2>, score_tile<T, 3>, score_tile<T, 4>};

struct Scratch {
  std::vector<float> scores, out, max, sum, rescale;
  std::vector<float> spare;  // where a tile's rows past the last vector write
  std::vector<uint32_t> probs;  // per vector: a step's probabilities, kKeysPerStep elements
  std::vector<int64_t> first_key, end_key;  // per row: the span of its intervals
  std::vector<std::pair<int64_t, int64_t>> tile_groups;  // per 4-vector tile: the 16-key groups of a step it reads
  explicit Scratch(int64_t rows, int64_t vectors, int64_t d)
      : scores(vectors * kKeysPerStep), out(vectors * d), max(vectors), sum(vectors), rescale(vectors),
        spare(std::max<int64_t>(d, kKeysPerStep)), probs(vectors * kKeysPerStep), first_key(rows), end_key(rows),
        tile_groups((vectors + 3) / 4) {}
};

// One task: rows [i0, i1) of K/V head h.
template <typename T>
void attend(const Shape& s, int64_t tk16, const typename T::Element* q, const uint32_t* kp, const uint32_t* vp,
            const int64_t* intervals, int64_t i0, int64_t i1, int64_t h, Scratch& w, typename T::Element* out) {
  using Element = typename T::Element;
  constexpr int64_t kGroupUnits = 16 / T::kPerUnit, kStepUnits = kKeysPerStep / T::kPerUnit;  // units of keys
  const int64_t rows = i1 - i0, vectors = rows * s.group, units = s.d / T::kPerUnit;
  const float scale = exp2_scale(s.d);
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
  const uint32_t* kh = kp + h * units * tk16;
  const uint32_t* vh = vp + h * (tk16 / T::kPerUnit) * s.d;

  for (const auto& [first, last] : key_ranges(intervals, s.max_keys, i0, i1, 16)) {
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
          kScoreTiles<T>[std::min<int64_t>(4, g1 - g) - 1](qs, kh + (c0 + 16 * g) * units, units, ss);
        }
      }
      // online softmax: mask each row's keys to its intervals, update its running max and sum
      for (int64_t r = 0; r < rows; ++r) {
        __mmask16 visible[kKeysPerStep / 16];
        for (int64_t g = 0; g < groups; ++g) visible[g] = visible_keys(intervals, s.max_keys, i0 + r, c0 + 16 * g);
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
          Element* pr = reinterpret_cast<Element*>(w.probs.data() + m * kStepUnits);
          if (new_max == kNegInf) {  // nothing visible yet
            std::memset(pr, 0, n * sizeof(Element));
            w.rescale[m] = 1.0f;
            continue;
          }
          __m512 total = _mm512_setzero_ps();
          for (int64_t g = 0; g < groups; ++g) {
            const __m512 p = _mm512_maskz_mov_ps(
                visible[g], exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(sc + 16 * g), _mm512_set1_ps(new_max))));
            total = _mm512_add_ps(total, p);
            T::store(pr + 16 * g, p);
          }
          const float rescale = std::exp2(w.max[m] - new_max);  // 0 while nothing was visible
          w.rescale[m] = rescale;
          w.sum[m] = w.sum[m] * rescale + _mm512_reduce_add_ps(total);
          w.max[m] = new_max;
        }
      }
      // out = out * rescale + probabilities . values, 64 columns (or 32, or 16) at a time
      const uint32_t* vc = vh + (c0 / T::kPerUnit) * s.d;
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
            ps[r] = w.probs.data() + (mm < 0 ? m : mm) * kStepUnits + kGroupUnits * g0;
            os[r] = mm < 0 ? w.spare.data() : w.out.data() + mm * s.d + col;
            sc[r] = mm < 0 ? 0.0f : w.rescale[mm];
          }
          const uint32_t* vg = vc + kGroupUnits * g0 * s.d + col;
          const int64_t step = kGroupUnits * (g1 - g0);
          if (width == 64) value_tile<T, 4, 4>(ps, sc, vg, s.d, step, os);
          else if (width == 32) value_tile<T, 4, 2>(ps, sc, vg, s.d, step, os);
          else value_tile<T, 4, 1>(ps, sc, vg, s.d, step, os);
        }
        col += width;
      }
    }
  }
  // out = accumulated / sum, in q's dtype (zeros where nothing was visible)
  for (int64_t m = 0; m < vectors; ++m) {
    const float inv = w.sum[m] > 0.0f ? 1.0f / w.sum[m] : 0.0f;
    Element* dst = out + ((i0 + m / s.group) * s.hq + h * s.group + m % s.group) * s.d;
    for (int64_t col = 0; col < s.d; col += 16)
      T::store(dst + col, _mm512_mul_ps(_mm512_loadu_ps(w.out.data() + m * s.d + col), _mm512_set1_ps(inv)));
  }
}

// The call in one precision: repack k and v, then the tasks over the intra-op threads.
template <typename T>
void run(const Shape& s, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& intervals,
         at::Tensor& out) {
  using Element = typename T::Element;
  const int64_t tk16 = (s.tk + 15) / 16 * 16;
  at::Tensor kp = at::empty({s.hkv * (s.d / T::kPerUnit) * tk16}, q.options().dtype(at::kInt));
  at::Tensor vp = at::empty({s.hkv * (tk16 / T::kPerUnit) * s.d}, q.options().dtype(at::kInt));
  auto* kpd = reinterpret_cast<uint32_t*>(kp.data_ptr<int32_t>());
  auto* vpd = reinterpret_cast<uint32_t*>(vp.data_ptr<int32_t>());
  const auto* qd = static_cast<const Element*>(q.data_ptr());
  pack_keys_values<T>(s, tk16, static_cast<const Element*>(k.data_ptr()), static_cast<const Element*>(v.data_ptr()),
                      kpd, vpd);
  const int64_t* table = intervals.data_ptr<int64_t>();
  auto* od = static_cast<Element*>(out.data_ptr());
  const int64_t blocks = (s.tq + kRowsPerTask - 1) / kRowsPerTask;
  at::parallel_for(0, blocks * s.hkv, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch(kRowsPerTask, kRowsPerTask * s.group, s.d);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / s.hkv, h = task % s.hkv;
      attend<T>(s, tk16, qd, kpd, vpd, table, b * kRowsPerTask, std::min(s.tq, (b + 1) * kRowsPerTask), h, scratch,
                od);
    }
  });
}

at::Tensor packed_attention(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                            const at::Tensor& intervals_in) {
  const Shape s = check_inputs("boundserve::packed_attention", q_in, k_in, v_in, intervals_in);
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const at::Tensor intervals = intervals_in.contiguous();
  at::Tensor out = at::empty_like(q);
  if (s.tq == 0) return out;
  if (q.scalar_type() == at::kBFloat16) run<BFloat16>(s, q, k, v, intervals, out);
  else run<Float32>(s, q, k, v, intervals, out);
  return out;
}

}  // namespace
}  // namespace boundserve

TORCH_LIBRARY(boundserve, m) {
  m.def("packed_attention(Tensor q, Tensor k, Tensor v, Tensor intervals) -> Tensor");
}

TORCH_LIBRARY_IMPL(boundserve, CPU, m) { m.impl("packed_attention", &boundserve::packed_attention); }
