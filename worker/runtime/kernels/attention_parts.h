// What both packed-attention kernels share (packed_attention.cpp: AVX512-BF16 or float32 FMAs;
// packed_attention_amx.cpp: AMX tiles): the call's checks and sizes, the precisions as 32-bit units,
// the repacking of k and v, the key ranges a block of query rows sees and the keys of a step each row
// sees, the softmax's scale, 2^y on 16 lanes.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

namespace boundserve {

constexpr int64_t kFields = 6;  // lo, hi of the own, parent and grandparent intervals
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// 2^f for f in [-0.5, 0.5] (float32, relative error ~1e-7): a degree-6 polynomial (ln(2)^k / k!, k = 6 .. 0).
inline __m512 exp2_fraction(__m512 f) {
  __m512 p = _mm512_set1_ps(1.5403530393381610e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
  return _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
}

// 2^y for y <= 0 (float32, relative error ~1e-7): 2^round(y) times 2^ of the rest.
inline __m512 exp2_ps(__m512 y) {
  y = _mm512_max_ps(y, _mm512_set1_ps(-126.0f));
  const __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm512_scalef_ps(exp2_fraction(_mm512_sub_ps(y, n)), n);
}

// The two precisions, as units (32 bits: a pair of bfloat16, which vdpbf16ps multiplies and adds into one
// float32 lane, or one float, which an FMA takes): how two vectors of units multiply into float32 lanes,
// and how float32 lanes are stored as the precision's elements.
struct BFloat16 {
  using Element = uint16_t;
  static constexpr int64_t kPerUnit = 2;  // elements per unit
  static __m512 madd(__m512 acc, __m512i a, __m512i b) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b));
  }
  static void store(Element* dst, __m512 x) {  // 16 lanes, rounded to nearest even
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)));
  }
};

struct Float32 {
  using Element = float;
  static constexpr int64_t kPerUnit = 1;
  static __m512 madd(__m512 acc, __m512i a, __m512i b) {
    return _mm512_fmadd_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(b), acc);
  }
  static void store(Element* dst, __m512 x) { _mm512_storeu_ps(dst, x); }
};

// The sizes of one call: Tq queries, Tk keys, Hq query and Hkv K/V heads of D, G = Hq / Hkv query heads
// per K/V head, intervals for max_keys rows.
struct Shape {
  int64_t tq, tk, hq, hkv, d, group, max_keys;
};

// k [Tk, Hkv, D] -> [Hkv][Tk16/16][D units][16]; v -> [Hkv][Tk16 units][D] (zero past Tk); tk16, the
// keys packed, is any multiple of 16 from Tk up.
template <typename T>
void pack_keys_values(const Shape& s, int64_t tk16, const typename T::Element* k, const typename T::Element* v,
                      uint32_t* kp, uint32_t* vp) {
  const int64_t units = s.d / T::kPerUnit, row = s.hkv * s.d;  // elements between consecutive keys
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i key_offsets = _mm512_mullo_epi32(lane, _mm512_set1_epi32(static_cast<int>(row / T::kPerUnit)));
  at::parallel_for(0, s.hkv * (tk16 / 16), 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t h = task / (tk16 / 16), t0 = (task % (tk16 / 16)) * 16;
      const __mmask16 present = static_cast<__mmask16>((1u << std::min<int64_t>(16, std::max<int64_t>(0, s.tk - t0))) - 1);
      // 16 keys' unit j, one vector: a gather of 32-bit units down the 16 rows
      const auto* first = reinterpret_cast<const int*>(k + (t0 * s.hkv + h) * s.d);
      uint32_t* group = kp + (h * (tk16 / 16) + t0 / 16) * units * 16;
      for (int64_t j = 0; j < units; ++j)
        _mm512_storeu_si512(group + j * 16, _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), present, key_offsets,
                                                                         first + j, 4));
      if constexpr (T::kPerUnit == 1) {  // each key's row as it is
        for (int64_t t = t0; t < t0 + 16; ++t) {
          float* out = reinterpret_cast<float*>(vp + (h * tk16 + t) * s.d);
          if (t < s.tk) std::memcpy(out, v + (t * s.hkv + h) * s.d, s.d * sizeof(float));
          else std::memset(out, 0, s.d * sizeof(float));
        }
      } else {  // two consecutive keys' columns interleaved, 16 columns at a time
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
    }
  });
}

// The checks every call passes (`op` names the operator in the errors), and its sizes.
inline Shape check_inputs(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& intervals) {
  TORCH_CHECK(q.device().is_cpu(), op, " runs on a CPU");
  const auto dtype = q.scalar_type();
  TORCH_CHECK((dtype == at::kBFloat16 || dtype == at::kFloat) && k.scalar_type() == dtype && v.scalar_type() == dtype,
              op, " takes q, k, v all bfloat16 or all float32, got ", q.scalar_type(), ", ", k.scalar_type(), ", ",
              v.scalar_type());
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.sizes() == k.sizes(), "q [Tq, Hq, D], k and v [Tk, Hkv, D] expected, got ",
              q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  TORCH_CHECK(intervals.scalar_type() == at::kLong && intervals.dim() == 1 && intervals.numel() % kFields == 0,
              "intervals: a 1-D int64 table of 6 fields expected, got ", intervals.sizes());
  const Shape s{q.size(0), k.size(0), q.size(1), k.size(1), q.size(2), q.size(1) / std::max<int64_t>(k.size(1), 1),
                intervals.numel() / kFields};
  TORCH_CHECK(k.size(2) == s.d && s.d % 16 == 0, "head size ", s.d, ": q and k must agree, a multiple of 16");
  TORCH_CHECK(s.hkv > 0 && s.hq % s.hkv == 0, s.hq, " query heads are not a multiple of ", s.hkv, " K/V heads");
  TORCH_CHECK(s.max_keys >= s.tq && s.tq <= s.tk, "intervals for ", s.max_keys, " rows, ", s.tq, " queries, ", s.tk,
              " keys");
  TORCH_CHECK(s.tk < (int64_t{1} << 31), "more keys than 32-bit lanes index");
  return s;
}

// 1/sqrt(D) · log2(e): a score times this is in the exp2 domain the softmax runs in.
inline float exp2_scale(int64_t d) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)) * M_LOG2E); }

// Which of keys [key0, key0 + 16) query row `row` sees (its three intervals of the table), one bit a key.
inline __mmask16 visible_keys(const int64_t* intervals, int64_t max_keys, int64_t row, int64_t key0) {
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i key = _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int>(key0)));
  __mmask16 any = 0;
  for (int64_t f = 0; f < kFields; f += 2) {
    const int lo = static_cast<int>(intervals[f * max_keys + row]);
    const int hi = static_cast<int>(intervals[(f + 1) * max_keys + row]);
    any |= _mm512_cmpge_epi32_mask(key, _mm512_set1_epi32(lo)) & _mm512_cmplt_epi32_mask(key, _mm512_set1_epi32(hi));
  }
  return any;
}

// Whether one of query row `row`'s intervals holds all keys [key0, key0 + n): a step with nothing to mask.
inline bool sees_all(const int64_t* intervals, int64_t max_keys, int64_t row, int64_t key0, int64_t n) {
  bool whole = false;
  for (int64_t f = 0; f < kFields; f += 2)
    whole |= intervals[f * max_keys + row] <= key0 && intervals[(f + 1) * max_keys + row] >= key0 + n;
  return whole;
}

// The key ranges rows [i0, i1) see between them: aligned to `align` keys, sorted, disjoint.
inline std::vector<std::pair<int64_t, int64_t>> key_ranges(const int64_t* intervals, int64_t max_keys, int64_t i0,
                                                           int64_t i1, int64_t align) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t f = 0; f < kFields; f += 2) {
      const int64_t lo = intervals[f * max_keys + i], hi = intervals[(f + 1) * max_keys + i];
      if (lo < hi) ranges.emplace_back(lo / align * align, (hi + align - 1) / align * align);
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

}  // namespace boundserve
