// Attention over a packed key pool on AMX tiles, in bfloat16 (worker/runtime/kernels/__init__.py).
//
// boundserve::packed_attention_amx(q [Tq, Hq, D], k [Tk, Hkv, D], v [Tk, Hkv, D], intervals [6 * max_keys])
// -> [Tq, Hq, D]: boundserve::packed_attention's contract (packed_attention.cpp) for bfloat16 and heads a
// multiple of 32 wide, and its arithmetic: scores summed in float32 and scaled by 1/sqrt(D), the softmax
// online in float32 (a query that sees no key gets zeros), the probabilities rounded to bfloat16, times v
// summed in float32. What differs is where the products run: q·k and p·v on AMX tiles. One TDPBF16PS
// adds to a 16 x 16 float32 tile (C) the product of a 16 x 32 bfloat16 tile (A: 16 rows of 32 elements)
// with a 32 x 16 one (B, stored as 16 rows of 16 pairs: row j holds rows 2j and 2j + 1 interleaved).
//
// Layout of the work:
//   - k and v are repacked once per call as packed_attention.cpp packs bfloat16 (attention_parts.h),
//     which is the B layout, keys padded with zeros to a multiple of 32 (Tk32):
//       k [Hkv][Tk32/16][D/2][16] pairs of D: the B tile of q·kᵀ for 16 keys and 32 of D is 16 rows
//         (pairs of D) of 16 keys, 64 bytes apart;
//       v [Hkv][Tk32/2][D] pairs of keys: the B tile of p·v for 32 keys and 16 columns is 16 rows (pairs
//         of keys) of 16 columns, 4·D bytes apart;
//   - the query vectors of K/V head h are ordered row by row (vector m: row m / G, query head
//     h·G + m % G, G = Hq / Hkv) and taken 32 at a time: a task is 32 vectors (two A tiles of 16 rows;
//     the last task's missing vectors are zeros) and walks the key ranges its rows see (32-aligned, never
//     one key twice), 512 keys per step (a scoring sample's rows see fewer, so its task runs one step: O is
//     rescaled, loaded onto and stored from the tiles once, and the work switches between the tiles and
//     the vector units fewer times, each switch costing the wait for the other's stores):
//       S [32 vectors][512 keys] float32 = the task's copy of its q [32][D] (A tiles, 32 of D) · kᵀ
//         (B tiles), 32 keys at a time, over D / 32;
//       the softmax (packed_attention.cpp's, per vector: keys outside a row's intervals masked, running
//         max and sum) writes P [32][512] bfloat16 and the factor each row of O is rescaled by;
//       O [32][D] float32, in memory, rescaled, += P (A tiles, 32 keys) · v (B tiles), 32 columns at a
//         time;
//   - tile registers: 0-3 the four 16 x 16 float32 accumulators (two 16-vector tiles times two tiles
//     of 16 keys, or of 16 columns), 4-5 the two A tiles, 6-7 the two B tiles;
//   - tasks are spread over the intra-op threads (at::parallel_for) in the order of q's rows, every K/V
//     head of a block of rows before the next block; each thread loads the tile
//     configuration for its tasks and releases the tiles after (the next kernel on that thread, oneDNN's
//     GEMMs included, configures its own). Scratch is per thread.
// Nothing here calls Python: two threads may run it at once.

#include <ATen/cpu/Utils.h>
#include <torch/library.h>

#include <cpuid.h>

#include <cmath>

#include "attention_parts.h"

namespace boundserve {
namespace {

constexpr int64_t kVectorsPerTask = 32;  // two tiles of 16 rows
constexpr int64_t kKeysPerStep = 512;    // a multiple of kKeyAlign (S of a step: 64 KiB, in L2)
constexpr int64_t kKeyAlign = 32;        // keys of one A tile of p·v
constexpr int64_t kPanel = 32;           // columns of O one p·v pass accumulates: two tiles of 16

// LDTILECFG's 64 bytes (palette 1): per tile register its row count and bytes per row.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// Every tile here is 16 rows of 64 bytes: 16 float32 (C), 32 bfloat16 (A) or 16 pairs of bfloat16 (B).
TileConfig tile_config() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.bytes_per_row[t] = 64;
    config.rows[t] = 16;
  }
  return config;
}

// The tiles configured on this thread while it lives.
struct TileScope {
  TileScope() {
    static const TileConfig config = tile_config();
    _tile_loadconfig(&config);
  }
  ~TileScope() { _tile_release(); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// Whether this CPU has AMX-TILE and AMX-BF16 (CPUID leaf 7: EDX bits 24 and 22) and Linux lets this
// process use the tile data (arch_prctl ARCH_REQ_XCOMP_PERM, which at::cpu::init_amx asks once).
bool amx_ready() {
  static const bool ready = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    const bool tiles = (edx >> 24) & 1, bf16 = (edx >> 22) & 1;
    return tiles && bf16 && at::cpu::init_amx();
  }();
  return ready;
}

// S[0:32][0:32] = Q · K[0:32]ᵀ: Q the task's 32 vectors [32][D] bfloat16; `keys` the packed k at the
// first of 32 keys (two groups of 16: [D/2][16] pairs each); S float32, kKeysPerStep floats a row.
void score_block(const uint16_t* q, const uint32_t* keys, int64_t d, float* s) {
  const int64_t group = d / 2 * 16;  // uint32 between the two 16-key groups
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t c = 0; c < d; c += 32) {
    _tile_loadd(4, q + c, d * 2);                        // vectors 0-15, D [c, c + 32)
    _tile_loadd(5, q + 16 * d + c, d * 2);               // vectors 16-31
    _tile_loadd(6, keys + c / 2 * 16, 64);               // keys 0-15: pairs c/2 .. c/2 + 15 of D
    _tile_loadd(7, keys + group + c / 2 * 16, 64);       // keys 16-31
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  constexpr int64_t stride = kKeysPerStep * sizeof(float);
  _tile_stored(0, s, stride);
  _tile_stored(1, s + 16, stride);
  _tile_stored(2, s + 16 * kKeysPerStep, stride);
  _tile_stored(3, s + 16 * kKeysPerStep + 16, stride);
}

// O[0:32][0:32] += P[0:32][0 : 32 · chunks] · V: P bfloat16, kKeysPerStep a row; `values` the packed v
// at the step's first pair of keys and the panel's first column ([pairs][D] pairs); O float32, D a row.
void value_block(const uint16_t* p, const uint32_t* values, int64_t d, int64_t chunks, float* o) {
  const int64_t o_stride = d * sizeof(float);
  _tile_loadd(0, o, o_stride);  // vectors 0-15, columns 0-15 of the panel
  _tile_loadd(1, o + 16, o_stride);
  _tile_loadd(2, o + 16 * d, o_stride);  // vectors 16-31
  _tile_loadd(3, o + 16 * d + 16, o_stride);
  constexpr int64_t p_stride = kKeysPerStep * sizeof(uint16_t);
  for (int64_t i = 0; i < chunks; ++i) {
    _tile_loadd(4, p + kKeyAlign * i, p_stride);                      // vectors 0-15, keys [32i, 32i + 32)
    _tile_loadd(5, p + 16 * kKeysPerStep + kKeyAlign * i, p_stride);  // vectors 16-31
    const uint32_t* pairs = values + kKeyAlign / 2 * i * d;           // 16 pairs of keys, D pairs apart
    _tile_loadd(6, pairs, o_stride);                                   // columns 0-15
    _tile_loadd(7, pairs + 16, o_stride);                              // columns 16-31
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, o, o_stride);
  _tile_stored(1, o + 16, o_stride);
  _tile_stored(2, o + 16 * d, o_stride);
  _tile_stored(3, o + 16 * d + 16, o_stride);
}

struct Scratch {
  std::vector<uint16_t> q, probs;     // [32][D], [32][kKeysPerStep] bfloat16
  std::vector<float> scores, out;     // [32][kKeysPerStep], [32][D]
  float max[kVectorsPerTask], sum[kVectorsPerTask], rescale[kVectorsPerTask];
  explicit Scratch(int64_t d)
      : q(kVectorsPerTask * d), probs(kVectorsPerTask * kKeysPerStep), scores(kVectorsPerTask * kKeysPerStep),
        out(kVectorsPerTask * d) {}
};

// The task's vectors [m0, m0 + count) of K/V head h: where vector m's row of q and of the output starts.
inline int64_t vector_offset(const Shape& s, int64_t h, int64_t m) {
  return ((m / s.group) * s.hq + h * s.group + m % s.group) * s.d;
}

// 2^y on the visible lanes, 0 on the others: attention_parts.h's exp2_ps without its clamp, which the masked
// lanes (any y) and large negative y (2^round(y) underflows to 0 in the scaling) do not need.
inline __m512 exp2_visible(__mmask16 visible, __m512 y) {
  const __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm512_maskz_scalef_ps(visible, exp2_fraction(_mm512_sub_ps(y, n)), n);
}

// The online softmax of one step, keys [c0, c0 + n), for the task's vectors (local index 0 .. count - 1,
// global m0 + local): P written, each vector's max, sum and rescale factor updated. packed_attention.cpp's
// arithmetic, row by row (the G vectors of a row share its masks), in two passes over S as the tiles stored
// it: the largest visible score, then 2^(S · scale - max) with the scaling in the same FMA (max and sum kept
// in the scaled, exp2 domain). A 16-key group the row does not see gets zeros without an exp.
void softmax_step(const Shape& s, const int64_t* intervals, int64_t m0, int64_t count, int64_t c0, int64_t n,
                  Scratch& w) {
  const float scale = exp2_scale(s.d);
  const __m512 scales = _mm512_set1_ps(scale);
  const int64_t groups = n / 16;
  for (int64_t row = m0 / s.group; row <= (m0 + count - 1) / s.group; ++row) {
    __mmask16 visible[kKeysPerStep / 16];
    const bool whole = sees_all(intervals, s.max_keys, row, c0, n);  // nothing to mask
    for (int64_t g = 0; g < groups; ++g)
      visible[g] = whole ? 0xFFFF : visible_keys(intervals, s.max_keys, row, c0 + 16 * g);
    const int64_t first = std::max(row * s.group, m0) - m0, last = std::min((row + 1) * s.group, m0 + count) - m0;
    for (int64_t m = first; m < last; ++m) {
      const float* sc = w.scores.data() + m * kKeysPerStep;
      uint16_t* pr = w.probs.data() + m * kKeysPerStep;
      __m512 top = _mm512_set1_ps(kNegInf);
      for (int64_t g = 0; g < groups; ++g) top = _mm512_mask_max_ps(top, visible[g], top, _mm512_loadu_ps(sc + 16 * g));
      const float new_max = std::max(w.max[m], _mm512_reduce_max_ps(top) * scale);
      if (new_max == kNegInf) {  // nothing visible yet
        std::memset(pr, 0, n * sizeof(uint16_t));
        w.rescale[m] = 1.0f;
        continue;
      }
      const __m512 shift = _mm512_set1_ps(new_max);
      __m512 total = _mm512_setzero_ps();
      for (int64_t g = 0; g < groups; ++g) {
        __m512 p = _mm512_setzero_ps();
        if (visible[g]) p = exp2_visible(visible[g], _mm512_fmsub_ps(_mm512_loadu_ps(sc + 16 * g), scales, shift));
        total = _mm512_add_ps(total, p);
        BFloat16::store(pr + 16 * g, p);
      }
      // O holds nothing while nothing was visible: left as it is (2^-inf would zero it)
      const float rescale = w.max[m] == kNegInf ? 1.0f : std::exp2(w.max[m] - new_max);
      w.rescale[m] = rescale;
      w.sum[m] = w.sum[m] * rescale + _mm512_reduce_add_ps(total);
      w.max[m] = new_max;
    }
  }
}

// One task: vectors [m0, m0 + count) of K/V head h (count <= 32).
void attend(const Shape& s, int64_t tk32, const uint16_t* q, const uint32_t* kp, const uint32_t* vp,
            const int64_t* intervals, int64_t h, int64_t m0, int64_t count, Scratch& w, uint16_t* out) {
  for (int64_t m = 0; m < kVectorsPerTask; ++m) {  // the task's q, zeros past its vectors
    uint16_t* dst = w.q.data() + m * s.d;
    if (m < count) std::memcpy(dst, q + vector_offset(s, h, m0 + m), s.d * sizeof(uint16_t));
    else std::memset(dst, 0, s.d * sizeof(uint16_t));
  }
  // rows past the vectors multiply zeros: their P must hold no NaN
  std::fill(w.probs.begin() + count * kKeysPerStep, w.probs.end(), uint16_t{0});
  std::fill(w.out.begin(), w.out.end(), 0.0f);
  std::fill(w.max, w.max + kVectorsPerTask, kNegInf);
  std::fill(w.sum, w.sum + kVectorsPerTask, 0.0f);
  const uint32_t* kh = kp + h * (s.d / 2) * tk32;
  const uint32_t* vh = vp + h * (tk32 / 2) * s.d;
  const int64_t row0 = m0 / s.group, row1 = (m0 + count - 1) / s.group + 1;
  for (const auto& [first, last] : key_ranges(intervals, s.max_keys, row0, row1, kKeyAlign)) {
    for (int64_t c0 = first; c0 < last; c0 += kKeysPerStep) {
      const int64_t n = std::min(kKeysPerStep, last - c0);
      for (int64_t x = 0; x < n; x += kKeyAlign) score_block(w.q.data(), kh + (c0 + x) / 2 * s.d, s.d, w.scores.data() + x);
      softmax_step(s, intervals, m0, count, c0, n, w);
      for (int64_t m = 0; m < count; ++m) {
        if (w.rescale[m] == 1.0f) continue;
        float* o = w.out.data() + m * s.d;
        const __m512 factor = _mm512_set1_ps(w.rescale[m]);
        for (int64_t col = 0; col < s.d; col += 16) _mm512_storeu_ps(o + col, _mm512_mul_ps(_mm512_loadu_ps(o + col), factor));
      }
      for (int64_t col = 0; col < s.d; col += kPanel)
        value_block(w.probs.data(), vh + c0 / 2 * s.d + col, s.d, n / kKeyAlign, w.out.data() + col);
    }
  }
  // out = accumulated / sum, in bfloat16 (zeros where nothing was visible)
  for (int64_t m = 0; m < count; ++m) {
    const float inv = w.sum[m] > 0.0f ? 1.0f / w.sum[m] : 0.0f;
    uint16_t* dst = out + vector_offset(s, h, m0 + m);
    for (int64_t col = 0; col < s.d; col += 16)
      BFloat16::store(dst + col, _mm512_mul_ps(_mm512_loadu_ps(w.out.data() + m * s.d + col), _mm512_set1_ps(inv)));
  }
}

at::Tensor packed_attention_amx(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                const at::Tensor& intervals_in) {
  const Shape s = check_inputs("boundserve::packed_attention_amx", q_in, k_in, v_in, intervals_in);
  TORCH_CHECK(q_in.scalar_type() == at::kBFloat16, "boundserve::packed_attention_amx takes bfloat16 only, got ",
              q_in.scalar_type(), " (float32: boundserve::packed_attention)");
  TORCH_CHECK(s.d % 32 == 0, "head size ", s.d, ": boundserve::packed_attention_amx takes a multiple of 32 (the 32 ",
              "bfloat16 of an AMX tile's row)");
  TORCH_CHECK(amx_ready(), "boundserve::packed_attention_amx needs AMX-TILE and AMX-BF16 and the OS's permission to ",
              "use AMX tile data; this CPU or kernel lacks them (boundserve::packed_attention runs without AMX)");
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const at::Tensor intervals = intervals_in.contiguous();
  at::Tensor out = at::empty_like(q);
  if (s.tq == 0) return out;
  const int64_t tk32 = (s.tk + kKeyAlign - 1) / kKeyAlign * kKeyAlign;
  at::Tensor kp = at::empty({s.hkv * (s.d / 2) * tk32}, q.options().dtype(at::kInt));
  at::Tensor vp = at::empty({s.hkv * (tk32 / 2) * s.d}, q.options().dtype(at::kInt));
  auto* kpd = reinterpret_cast<uint32_t*>(kp.data_ptr<int32_t>());
  auto* vpd = reinterpret_cast<uint32_t*>(vp.data_ptr<int32_t>());
  pack_keys_values<BFloat16>(s, tk32, static_cast<const uint16_t*>(k.data_ptr()),
                             static_cast<const uint16_t*>(v.data_ptr()), kpd, vpd);
  const auto* qd = static_cast<const uint16_t*>(q.data_ptr());
  const int64_t* table = intervals.data_ptr<int64_t>();
  auto* od = static_cast<uint16_t*>(out.data_ptr());
  const int64_t vectors = s.tq * s.group, tasks = (vectors + kVectorsPerTask - 1) / kVectorsPerTask;
  at::parallel_for(0, tasks * s.hkv, 1, [&](int64_t begin, int64_t end) {
    TileScope tiles;
    Scratch scratch(s.d);
    for (int64_t task = begin; task < end; ++task) {
      // K/V heads fastest: a thread's tasks walk q and the output row after row, every head of a row in turn.
      // Head after head, each task read 512-byte pieces of q rows 4 KB apart: on Qwen3-0.6B's shapes (one
      // thread, CPU time) the call took 35.4 ms in that order, 31.8 ms in this one; without its products and
      // softmax (the copies, the repacking, the stores) 16.3 ms against 8.9
      const int64_t h = task % s.hkv, m0 = (task / s.hkv) * kVectorsPerTask;
      attend(s, tk32, qd, kpd, vpd, table, h, m0, std::min(kVectorsPerTask, vectors - m0), scratch, od);
    }
  });
  return out;
}

}  // namespace
}  // namespace boundserve

TORCH_LIBRARY_FRAGMENT(boundserve, m) {
  m.def("packed_attention_amx(Tensor q, Tensor k, Tensor v, Tensor intervals) -> Tensor");
}

TORCH_LIBRARY_IMPL(boundserve, CPU, m) { m.impl("packed_attention_amx", &boundserve::packed_attention_amx); }
