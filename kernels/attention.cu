// attention.cu: causal attention with rotary positions, FlashAttention-2 style (memory O(s)).
//
// Numerics follow runtime-cpu/src/ops/attention.rs (spec/plan-format.md, "Numerics every backend
// follows"). Layout: q, out, dout, dq are `sequences * s` rows of `heads * D` bf16 (head h in
// elements [h*D, (h+1)*D)); k, v, dk, dv rows of `kv_heads * D` bf16; lse is one f32 per (row,
// query head). Row r is position r % s of sequence r / s. Grouped-query attention: query head h
// attends with K/V head (first_query + h) / group (memo_plan_core's AttentionShape::kv_head;
// multi-head attention is kv_heads = heads, group = 1, first_query = 0). RoPE (base theta, a
// parameter: the model's rope_theta; pairs (2i, 2i+1)) rotates q and k as their tiles are loaded;
// dq and dk are rotated back before they are stored (gradients of the un-rotated q, k).
//
// Kernels (D = head dim 16, 32, 64 or 128; grid x = ceil(s / 64) tiles of 64 "owner" rows,
// y = query heads (forward, dq) or K/V heads (dk/dv), z = sequences; 128 threads; static shared
// memory under 48 KiB, no dynamic). Every kernel takes (..., s, heads, kv_heads, group,
// first_query, scale, theta_bits):
//   memo_attention_forward_dD        (q, k, v, out, lse, ...)
//       owner = 64 query rows; streams key tiles up to the causal limit; online softmax.
//   memo_attention_backward_dkdv_dD  (q, k, v, out, lse, dout, dq, dk, dv, ...)
//       owner = 64 keys of one K/V head; for each query head of the launch that uses it, in
//       increasing order, streams the query tiles from the owner's first key on, all into the
//       same f32 accumulators (dk, dv summed over the group deterministically, no atomics and no
//       scratch); a K/V head no query head of the launch uses (replicated K/V) gets zeros.
//   memo_attention_backward_dq_dD    (same parameters)
//       owner = 64 query rows; streams key tiles up to the causal limit; writes dq.
// The backward needs no scratch memory and no atomics: each kernel recomputes the probabilities
// from q, k and lse, and D_i = dout_i . out_i for the rows it visits.
//
// Two compute paths share the loads, masks and index arithmetic:
//   tensor (CUDA unless MEMO_ATTN_SCALAR is defined): mma.sync.m16n8k16 bf16 -> f32 by inline
//       PTX (sm_80+), one warp per 16 owner rows, fragments loaded from shared memory by explicit
//       index (the PTX ISA's documented register layout) and the softmax done in registers.
//       Inline PTX rather than nvcuda::wmma because <mma.h> needs crt/mma.h from a full CUDA
//       toolkit, which NVRTC does not embed and the runtime wheels do not ship.
//   scalar (HIP, or CUDA with -DMEMO_ATTN_SCALAR=1 for debugging): fp32 FMA, two threads per
//       owner row (each keeps half of the row's accumulators); any warp size, no shuffles.
// The tensor path comes in two variants that compute the same values (the CPU emulation,
// kernels/src/attention_emulation.rs, checks the fragments and the tile staging of both):
//   baseline (default; verified and measured on an H200, 2026-12-04): each lane reads its mma
//       fragment registers as 32-bit words (the B operands of P V, dS K, dS^T Q, P^T dO as pairs
//       of 16-bit elements); each streamed tile is loaded from global memory after the barrier
//       that frees its shared buffer, so every tile waits for its loads.
//   pipelined (-DMEMO_ATTN_PIPELINED=1; runtime-cuda: MEMO_CUDA_ATTENTION=pipelined; not yet run
//       on a GPU): one ldmatrix.x4 per A fragment or per two B fragments (.trans for the B
//       operands stored k-major); bf16 pairs packed by cvt.rn.bf16x2.f32 (round to nearest
//       even, as memo_f32_to_bf16; only NaN payloads differ); and the next streamed tiles'
//       global loads issued into registers before the current tile's math (memo_attn_fetch),
//       rotated and stored to shared memory after it (memo_attn_commit); scores masked only in
//       the tiles that cross the causal diagonal or the sequence's end; the backward's row
//       statistics spread over every thread (memo_attn_row_stats).
// Both round the rotated q, k tiles to bf16 in shared memory (as fused-rotary FlashAttention
// does; the CPU keeps them f32); the tensor path also rounds P and dS to bf16 as mma operands.
// Sums over the head dimension and over keys are f32; outputs are rounded to bf16 once.
//
// Alignment: pairs of bf16 are read and written as 32-bit words, so every argument must start
// 4-byte aligned (arena buffers are 256-byte aligned and a row is heads * D * 2 bytes, D even).
#include "memo_gpu.h"

#if defined(MEMO_CUDA) && !defined(MEMO_ATTN_SCALAR)
#define MEMO_ATTN_TENSOR 1
#else
#define MEMO_ATTN_TENSOR 0
#endif
#if !defined(MEMO_ATTN_PIPELINED) || !MEMO_ATTN_TENSOR
#undef MEMO_ATTN_PIPELINED
#define MEMO_ATTN_PIPELINED 0
#endif

// Threads per block and owner rows per block (the recipe in kernels/src/attention.rs relies on
// both: grid x = ceil(s / MEMO_ATTN_OWNER), block = MEMO_ATTN_THREADS).
#define MEMO_ATTN_THREADS 128
#define MEMO_ATTN_OWNER 64

// -inf without <math.h> (neither NVRTC nor hiprtc gets system headers).
#define MEMO_ATTN_NEG_INF (-__int_as_float(0x7f800000))

// ---------------------------------------------------------------------------------------------
// Shared helpers (both paths).

// Streamed tile rows per head dim, chosen so that every kernel's shared memory stays under
// 48 KiB (static shared memory needs no opt-in): forward 64 + 2N rows of D + 8 bf16, backward
// 128 + 2N rows. N is a multiple of 16 (an mma k-step).
template <int D> struct MemoAttnTiles;
template <> struct MemoAttnTiles<16> { static constexpr int FORWARD = 64; static constexpr int BACKWARD = 64; };
template <> struct MemoAttnTiles<32> { static constexpr int FORWARD = 64; static constexpr int BACKWARD = 64; };
template <> struct MemoAttnTiles<64> { static constexpr int FORWARD = 64; static constexpr int BACKWARD = 64; };
template <> struct MemoAttnTiles<128> { static constexpr int FORWARD = 32; static constexpr int BACKWARD = 16; };

// Element index of (sequence, position, head, 0) in a `heads * D`-wide bf16 tensor.
__device__ __forceinline__ memo_u64 memo_attn_elem(memo_u32 seq, memo_u32 s, memo_u32 pos, memo_u32 row_elems,
                                                  memo_u32 head, memo_u32 d) {
    return ((memo_u64)seq * s + pos) * row_elems + (memo_u64)head * d;
}

// Index of (sequence, position, head) in the f32 lse tensor (`heads` per row).
__device__ __forceinline__ memo_u64 memo_attn_lse_index(memo_u32 seq, memo_u32 s, memo_u32 pos, memo_u32 heads,
                                                       memo_u32 head) {
    return ((memo_u64)seq * s + pos) * heads + head;
}

// Grouped-query attention: the K/V head of query head `head` of this launch (kernels/src/attention.rs,
// memo_plan_core's AttentionShape::kv_head): `(first_query + head) / group`.
__device__ __forceinline__ memo_u32 memo_attn_kv_head(memo_u32 head, memo_u32 group, memo_u32 first_query) {
    return (first_query + head) / group;
}

__device__ __forceinline__ memo_u32 memo_attn_pack(float lo, float hi) {
#if MEMO_ATTN_PIPELINED
    memo_u32 bits;  // cvt.rn.bf16x2.f32 d, a, b puts a in the high half
    asm("cvt.rn.bf16x2.f32 %0, %2, %1;\n" : "=r"(bits) : "f"(lo), "f"(hi));
    return bits;
#else
    return (memo_u32)memo_f32_to_bf16(lo) | ((memo_u32)memo_f32_to_bf16(hi) << 16);
#endif
}

__device__ __forceinline__ float memo_attn_lo(memo_u32 bits) { return memo_bf16_to_f32((memo_bf16)(bits & 0xffffu)); }
__device__ __forceinline__ float memo_attn_hi(memo_u32 bits) { return memo_bf16_to_f32((memo_bf16)(bits >> 16)); }

// RoPE's inverse frequencies theta^(-2i/D) in double, as the CPU computes them (theta: the
// model's base, passed as the bits of a double).
template <int D> __device__ __forceinline__ void memo_attn_inv_freq(double* inv_freq, memo_u64 theta_bits) {
    const double theta = memo_f64_from_bits(theta_bits);
    for (int i = threadIdx.x; i < D / 2; i += MEMO_ATTN_THREADS) {
        inv_freq[i] = pow(theta, -2.0 * (double)i / (double)D);
    }
}

// A thread's rows in a tile load (memo_attn_load, memo_attn_commit): thread t moves pair
// t % (D/2) of rows t / (D/2), + STEP, + 2 STEP, ... (STEP = threads / (D/2)), so the angles of
// its rows grow by STEP * f at each step: one accurate memo_rope_cos_sin for the first row and one
// for the step, then each row's (cos, sin) is the previous one rotated by the step (4 FMAs
// instead of a sincosf per element; about 1 ulp of f32 per step, at most 32 steps, far below the
// bf16 rounding that follows).
template <int D> struct MemoAttnRows {
    static constexpr int PAIRS = D / 2;
    static constexpr int STEP = MEMO_ATTN_THREADS / PAIRS;
    static_assert(MEMO_ATTN_THREADS % PAIRS == 0, "each thread keeps one pair index for every row it loads");
    int pair, row0;
    float c, sn, step_c, step_s;

    __device__ __forceinline__ MemoAttnRows(memo_u32 first_pos, const double* inv_freq)
        : pair(threadIdx.x % PAIRS), row0(threadIdx.x / PAIRS), c(1.0f), sn(0.0f), step_c(1.0f), step_s(0.0f) {
        if (inv_freq != nullptr) {
            memo_rope_cos_sin(first_pos + (memo_u32)row0, inv_freq[pair], &c, &sn);
            memo_rope_cos_sin((memo_u32)STEP, inv_freq[pair], &step_c, &step_s);
        }
    }

    // Writes this thread's pair of tile row `row` (D + 8 bf16 apart in `dst`): the two bf16 of
    // `bits`, rotated when `rotate`, or zeros when the row is not `present` (past `s`); then
    // moves the rotation on to the thread's next row.
    __device__ __forceinline__ void put(memo_bf16* dst, int row, bool present, memo_u32 bits, bool rotate) {
        float x0 = 0.0f, x1 = 0.0f;
        if (present) {
            x0 = memo_attn_lo(bits);
            x1 = memo_attn_hi(bits);
            if (rotate) {
                const float y0 = x0 * c - x1 * sn;
                const float y1 = x0 * sn + x1 * c;
                x0 = y0;
                x1 = y1;
            }
        }
        *(memo_u32*)(dst + row * (D + 8) + 2 * pair) = memo_attn_pack(x0, x1);
        const float next_c = c * step_c - sn * step_s;
        sn = sn * step_c + c * step_s;
        c = next_c;
    }
};

// Loads `rows` rows of head `head` from position `first_pos` on into `dst` (row stride D + 8
// bf16), rotated by RoPE when `inv_freq` is non-null; rows at or past `s` are zero.
template <int D>
__device__ __forceinline__ void memo_attn_load(memo_bf16* dst, const memo_bf16* src, memo_u32 seq, memo_u32 head,
                                               memo_u32 s, memo_u32 row_elems, memo_u32 first_pos, int rows,
                                               const double* inv_freq) {
    MemoAttnRows<D> at(first_pos, inv_freq);
    for (int row = at.row0; row < rows; row += MemoAttnRows<D>::STEP) {
        const memo_u32 pos = first_pos + (memo_u32)row;
        const memo_u32 bits =
            pos < s ? *(const memo_u32*)(src + memo_attn_elem(seq, s, pos, row_elems, head, D) + 2 * at.pair) : 0u;
        at.put(dst, row, pos < s, bits, inv_freq != nullptr);
    }
}

// The streamed tile's staging registers (pipelined variant): the words memo_attn_load would read,
// fetched one tile ahead. Thread t holds pair t % (D/2) of rows t / (D/2) + i STEP, as there.
template <int D, int ROWS> struct MemoAttnStage {
    static constexpr int STEP = MemoAttnRows<D>::STEP;
    static constexpr int COUNT = ROWS / STEP;
    static_assert(ROWS % STEP == 0, "every thread stages the same number of rows");
    memo_u32 words[COUNT];
};

// Issues the global loads of `ROWS` rows from `first_pos` on (0 past `s`) into `stage`; nothing
// waits for them until memo_attn_commit reads the registers.
template <int D, int ROWS>
__device__ __forceinline__ void memo_attn_fetch(MemoAttnStage<D, ROWS>& stage, const memo_bf16* src, memo_u32 seq,
                                                memo_u32 head, memo_u32 s, memo_u32 row_elems, memo_u32 first_pos) {
    const int pair = threadIdx.x % (D / 2);
    const int row0 = threadIdx.x / (D / 2);
#pragma unroll
    for (int i = 0; i < MemoAttnStage<D, ROWS>::COUNT; ++i) {
        const memo_u32 pos = first_pos + (memo_u32)(row0 + i * MemoAttnStage<D, ROWS>::STEP);
        stage.words[i] =
            pos < s ? *(const memo_u32*)(src + memo_attn_elem(seq, s, pos, row_elems, head, D) + 2 * pair) : 0u;
    }
}

// Writes the staged rows to `dst` exactly as memo_attn_load writes them (rotated when `inv_freq`
// is non-null, zero past `s`).
template <int D, int ROWS>
__device__ __forceinline__ void memo_attn_commit(memo_bf16* dst, const MemoAttnStage<D, ROWS>& stage, memo_u32 s,
                                                 memo_u32 first_pos, const double* inv_freq) {
    MemoAttnRows<D> at(first_pos, inv_freq);
#pragma unroll
    for (int i = 0; i < MemoAttnStage<D, ROWS>::COUNT; ++i) {
        const int row = at.row0 + i * MemoAttnStage<D, ROWS>::STEP;
        at.put(dst, row, first_pos + (memo_u32)row < s, stage.words[i], inv_freq != nullptr);
    }
}

// The two streamed tiles of a kernel's loop (k and v, or q and dout), N rows each: in the
// pipelined variant the staging registers of the next iteration's tiles; empty in the baseline.
template <int D, int N> struct MemoAttnStream {
#if MEMO_ATTN_PIPELINED
    MemoAttnStage<D, N> a, b;
#endif

    // Before the loop: starts the loads of the first iteration's tiles (pipelined variant).
    __device__ __forceinline__ void begin(const memo_bf16* a_src, const memo_bf16* b_src, memo_u32 seq,
                                          memo_u32 head, memo_u32 s, memo_u32 row_elems, memo_u32 first_pos) {
#if MEMO_ATTN_PIPELINED
        memo_attn_fetch<D, N>(a, a_src, seq, head, s, row_elems, first_pos);
        memo_attn_fetch<D, N>(b, b_src, seq, head, s, row_elems, first_pos);
#endif
    }

    // After the barrier that frees the shared tiles: writes this iteration's tiles of head
    // `head` from `first_pos` on (`a_s` rotated by `inv_freq`, `b_s` not); the baseline loads
    // them now, the pipelined variant commits the staged words and, when there is a next
    // iteration, starts the loads of its tiles (head `next_head` from `next_pos`: the dk/dv
    // kernel moves on to the next query head of its group) before the math of this one.
    __device__ __forceinline__ void tiles(memo_bf16* a_s, const memo_bf16* a_src, memo_bf16* b_s,
                                          const memo_bf16* b_src, memo_u32 seq, memo_u32 head, memo_u32 s,
                                          memo_u32 row_elems, memo_u32 first_pos, bool has_next, memo_u32 next_head,
                                          memo_u32 next_pos, const double* inv_freq) {
#if MEMO_ATTN_PIPELINED
        memo_attn_commit<D, N>(a_s, a, s, first_pos, inv_freq);
        memo_attn_commit<D, N>(b_s, b, s, first_pos, nullptr);
        if (has_next) begin(a_src, b_src, seq, next_head, s, row_elems, next_pos);
#else
        (void)has_next;
        (void)next_head;
        (void)next_pos;
        memo_attn_load<D>(a_s, a_src, seq, head, s, row_elems, first_pos, N, inv_freq);
        memo_attn_load<D>(b_s, b_src, seq, head, s, row_elems, first_pos, N, nullptr);
#endif
    }
};

// For rows [0, ROWS) of a streamed/owner tile starting at `first_pos`: lse of the row and
// D_i = dout_i . out_i, from the bf16 dout tile already in shared memory and `out` in global
// memory; zero past `s`.
//   baseline: thread r < ROWS sums row r over the head dim in order, as the CPU does (the other
//       threads wait: at 16 rows a tile, 112 of 128).
//   pipelined: T = THREADS / ROWS adjacent lanes share a row; lane j sums pairs
//       [j P / T, (j + 1) P / T) (P = D / 2) in order, then the T partial sums are added by a
//       butterfly over those lanes (xor 1, 2, ..., T / 2: every lane gets the same total).
template <int D, int ROWS>
__device__ __forceinline__ void memo_attn_row_stats(float* lse_s, float* delta_s, const memo_bf16* dout_s,
                                                    const memo_bf16* out, const float* lse, memo_u32 seq,
                                                    memo_u32 head, memo_u32 s, memo_u32 heads, memo_u32 first_pos) {
    constexpr int LD = D + 8;
#if MEMO_ATTN_PIPELINED
    constexpr int T = MEMO_ATTN_THREADS / ROWS;
    constexpr int SHARE = D / 2 / T;  // pairs a lane sums
    static_assert(MEMO_ATTN_THREADS % ROWS == 0 && T <= 32 && (T & (T - 1)) == 0 && SHARE >= 1 && (D / 2) % T == 0,
                  "a row's lanes are a power of two inside one warp and split the row evenly");
    const int row = threadIdx.x / T, part = threadIdx.x % T;
    const memo_u32 pos = first_pos + (memo_u32)row;
    float delta = 0.0f;
    if (pos < s) {
        const memo_bf16* o = out + memo_attn_elem(seq, s, pos, heads * D, head, D);
#pragma unroll
        for (int i = 0; i < SHARE; ++i) {
            const int c = 2 * (part * SHARE + i);
            const memo_u32 ob = *(const memo_u32*)(o + c);
            const memo_u32 db = *(const memo_u32*)(dout_s + row * LD + c);
            delta += memo_attn_lo(db) * memo_attn_lo(ob);
            delta += memo_attn_hi(db) * memo_attn_hi(ob);
        }
    }
#pragma unroll
    for (int mask = 1; mask < T; mask <<= 1) delta += memo_shfl_xor(delta, mask);
    if (part == 0) {
        lse_s[row] = pos < s ? lse[memo_attn_lse_index(seq, s, pos, heads, head)] : 0.0f;
        delta_s[row] = delta;
    }
#else
    for (int row = threadIdx.x; row < ROWS; row += MEMO_ATTN_THREADS) {
        const memo_u32 pos = first_pos + (memo_u32)row;
        float l = 0.0f, delta = 0.0f;
        if (pos < s) {
            l = lse[memo_attn_lse_index(seq, s, pos, heads, head)];
            const memo_bf16* o = out + memo_attn_elem(seq, s, pos, heads * D, head, D);
            for (int c = 0; c < D; c += 2) {
                const memo_u32 ob = *(const memo_u32*)(o + c);
                const memo_u32 db = *(const memo_u32*)(dout_s + row * LD + c);
                delta += memo_attn_lo(db) * memo_attn_lo(ob);
                delta += memo_attn_hi(db) * memo_attn_hi(ob);
            }
        }
        lse_s[row] = l;
        delta_s[row] = delta;
    }
#endif
}

// Stores the pair (x0, x1) = elements (2 * pair, 2 * pair + 1) of row `pos`, rotated back by
// RoPE's inverse (the transpose) when `inv_freq` is non-null.
template <int D>
__device__ __forceinline__ void memo_attn_store_pair(memo_bf16* dst, memo_u32 seq, memo_u32 head, memo_u32 s,
                                                     memo_u32 row_elems, memo_u32 pos, int pair, float x0, float x1,
                                                     const double* inv_freq) {
    if (inv_freq != nullptr) {
        float c, sn;
        memo_rope_cos_sin(pos, inv_freq[pair], &c, &sn);
        const float y0 = x0 * c + x1 * sn;
        const float y1 = x1 * c - x0 * sn;
        x0 = y0;
        x1 = y1;
    }
    *(memo_u32*)(dst + memo_attn_elem(seq, s, pos, row_elems, head, D) + 2 * pair) = memo_attn_pack(x0, x1);
}

// bf16 element `i` of a shared tile, widened.
__device__ __forceinline__ float memo_attn_at(const memo_bf16* tile, int i) { return memo_bf16_to_f32(tile[i]); }

#if MEMO_ATTN_TENSOR
// ---------------------------------------------------------------------------------------------
// Tensor-core helpers (CUDA sm_80+). mma.sync.m16n8k16 register layout (PTX ISA, "Matrix
// Fragments for mma.m16n8k16 with floating point type"), with g = lane / 4, t = lane % 4, two
// bf16 per 32-bit register, the lower column/row index in the low half:
//   A (16 x 16, row): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..2t+1], a2 = A[g][2t+8..2t+9],
//                     a3 = A[g+8][2t+8..2t+9]
//   B (16 x 8, col):  b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
//   C (16 x 8, f32):  c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1]

// c += A B.
__device__ __forceinline__ void memo_mma(float (&c)[4], const memo_u32 (&a)[4], memo_u32 b0, memo_u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ memo_u32 memo_attn_word(const memo_bf16* p) { return *(const memo_u32*)p; }

__device__ __forceinline__ memo_u32 memo_attn_join(memo_bf16 lo, memo_bf16 hi) {
    return (memo_u32)lo | ((memo_u32)hi << 16);
}

#if MEMO_ATTN_PIPELINED
// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16 (PTX ISA, "Warp-level matrix load
// instruction: ldmatrix"): lanes 8j..8j+7 give the addresses of rows 0..7 of 8 x 8 matrix j
// (16 bytes each, 16-byte aligned: rows are D + 8 bf16 apart, columns multiples of 8); register
// j of lane (g, t) receives matrix j's elements [g][2t..2t+1], or with .trans [2t][g] and
// [2t+1][g]: exactly the mma fragment layouts above. Lane `lane` addresses row
// r + (matrix & 1) * 8 or r + (matrix >> 1) * 8 (r = lane % 8, matrix = lane / 8) as each
// caller says. The "memory" clobber keeps the compiler from moving the shared-memory stores of a
// tile past these reads (it cannot see what the asm reads).
__device__ __forceinline__ memo_u32 memo_attn_shared_address(const memo_bf16* p) {
    return (memo_u32)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void memo_ldmatrix_x4(memo_u32 (&r)[4], const memo_bf16* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(memo_attn_shared_address(row))
                 : "memory");
}
__device__ __forceinline__ void memo_ldmatrix_x4_trans(memo_u32 (&r)[4], const memo_bf16* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(memo_attn_shared_address(row))
                 : "memory");
}
#endif

// A fragment of k-step [k0, k0 + 16) of a row-major tile: `rows` points at the warp's first row.
// ldmatrix: matrices (rows 0-7, k0), (rows 8-15, k0), (rows 0-7, k0 + 8), (rows 8-15, k0 + 8).
__device__ __forceinline__ void memo_frag_a(memo_u32 (&a)[4], const memo_bf16* rows, int ld, int k0, int g, int t) {
#if MEMO_ATTN_PIPELINED
    const int lane = g * 4 + t;
    memo_ldmatrix_x4(a, rows + ((lane & 7) + (lane & 8)) * ld + k0 + ((lane >> 4) << 3));
#else
    a[0] = memo_attn_word(rows + g * ld + k0 + 2 * t);
    a[1] = memo_attn_word(rows + (g + 8) * ld + k0 + 2 * t);
    a[2] = memo_attn_word(rows + g * ld + k0 + 2 * t + 8);
    a[3] = memo_attn_word(rows + (g + 8) * ld + k0 + 2 * t + 8);
#endif
}

// The B fragments of n-tiles n0 and n0 + 8 (b[0], b[1] and b[2], b[3]) with
// B[k][n] = X[n0 + n][k0 + k] (X row-major, its rows are B's columns: Q K^T).
// ldmatrix: matrices (rows n0.., k0), (rows n0.., k0 + 8), (rows n0 + 8.., k0), (n0 + 8.., k0 + 8).
__device__ __forceinline__ void memo_frag_b_t2(memo_u32 (&b)[4], const memo_bf16* x, int ld, int n0, int k0, int g,
                                               int t) {
#if MEMO_ATTN_PIPELINED
    const int lane = g * 4 + t;
    memo_ldmatrix_x4(b, x + (n0 + (lane & 7) + ((lane >> 4) << 3)) * ld + k0 + (lane & 8));
#else
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        b[2 * i] = memo_attn_word(x + (n0 + 8 * i + g) * ld + k0 + 2 * t);
        b[2 * i + 1] = memo_attn_word(x + (n0 + 8 * i + g) * ld + k0 + 2 * t + 8);
    }
#endif
}

// The B fragments of n-tiles n0 and n0 + 8 (b[0], b[1] and b[2], b[3]) with
// B[k][n] = X[k0 + k][n0 + n] (X row-major, its rows are B's rows: P V).
// ldmatrix .trans: matrices (rows k0.., n0), (rows k0 + 8.., n0), (rows k0.., n0 + 8),
// (rows k0 + 8.., n0 + 8).
__device__ __forceinline__ void memo_frag_b2(memo_u32 (&b)[4], const memo_bf16* x, int ld, int k0, int n0, int g,
                                             int t) {
#if MEMO_ATTN_PIPELINED
    const int lane = g * 4 + t;
    memo_ldmatrix_x4_trans(b, x + (k0 + (lane & 7) + (lane & 8)) * ld + n0 + ((lane >> 4) << 3));
#else
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int n = n0 + 8 * i + g;
        b[2 * i] = memo_attn_join(x[(k0 + 2 * t) * ld + n], x[(k0 + 2 * t + 1) * ld + n]);
        b[2 * i + 1] = memo_attn_join(x[(k0 + 2 * t + 8) * ld + n], x[(k0 + 2 * t + 9) * ld + n]);
    }
#endif
}

// A fragment of k-step kk from accumulators (16 x 8 NT tiles): columns [16kk, 16kk + 16) are
// accumulator tiles 2kk and 2kk + 1, whose C layout is exactly A's layout.
template <int NT>
__device__ __forceinline__ void memo_frag_a_acc(memo_u32 (&a)[4], const float (&x)[NT][4], int kk) {
    a[0] = memo_attn_pack(x[2 * kk][0], x[2 * kk][1]);
    a[1] = memo_attn_pack(x[2 * kk][2], x[2 * kk][3]);
    a[2] = memo_attn_pack(x[2 * kk + 1][0], x[2 * kk + 1][1]);
    a[3] = memo_attn_pack(x[2 * kk + 1][2], x[2 * kk + 1][3]);
}

// acc (16 x 8 NT) = A B^T over K = D: A = 16 rows of `a_rows`, B^T = rows [0, 8 NT) of `b_rows`.
template <int D, int NT>
__device__ __forceinline__ void memo_mma_abt(float (&acc)[NT][4], const memo_bf16* a_rows, const memo_bf16* b_rows,
                                             int g, int t) {
    constexpr int LD = D + 8;
    static_assert(NT % 2 == 0, "B fragments come two n-tiles at a time");
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        memo_u32 a[4];
        memo_frag_a(a, a_rows, LD, kk * 16, g, t);
#pragma unroll
        for (int n = 0; n < NT; n += 2) {
            memo_u32 b[4];
            memo_frag_b_t2(b, b_rows, LD, n * 8, kk * 16, g, t);
            memo_mma(acc[n], a, b[0], b[1]);
            memo_mma(acc[n + 1], a, b[2], b[3]);
        }
    }
}

// acc (16 x D) += P X: P (16 x 8 NT) in accumulator registers, X = rows [0, 8 NT) of `x` (D wide).
template <int D, int NT>
__device__ __forceinline__ void memo_mma_px(float (&acc)[D / 8][4], const float (&p)[NT][4], const memo_bf16* x, int g,
                                            int t) {
    constexpr int LD = D + 8;
#pragma unroll
    for (int kk = 0; kk < NT / 2; ++kk) {
        memo_u32 a[4];
        memo_frag_a_acc<NT>(a, p, kk);
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
            memo_u32 b[4];
            memo_frag_b2(b, x, LD, kk * 16, n * 8, g, t);
            memo_mma(acc[n], a, b[0], b[1]);
            memo_mma(acc[n + 1], a, b[2], b[3]);
        }
    }
}

// Max and sum over the 4 lanes (t = 0..3) that share a row of an accumulator.
__device__ __forceinline__ float memo_quad_max(float v) {
    v = fmaxf(v, memo_shfl_xor(v, 1));
    return fmaxf(v, memo_shfl_xor(v, 2));
}
__device__ __forceinline__ float memo_quad_sum(float v) {
    v += memo_shfl_xor(v, 1);
    return v + memo_shfl_xor(v, 2);
}
#endif  // MEMO_ATTN_TENSOR

// ---------------------------------------------------------------------------------------------
// Forward.

template <int D>
__device__ __forceinline__ void memo_attention_forward(const memo_bf16* q, const memo_bf16* k, const memo_bf16* v,
                                                       memo_bf16* out, float* lse, memo_u32 s, memo_u32 heads,
                                                       memo_u32 kv_heads, memo_u32 group, memo_u32 first_query,
                                                       float scale, memo_u64 theta_bits) {
    constexpr int N = MemoAttnTiles<D>::FORWARD;
    constexpr int LD = D + 8;
    __shared__ __align__(16) memo_bf16 q_s[MEMO_ATTN_OWNER * LD];
    __shared__ __align__(16) memo_bf16 k_s[N * LD];
    __shared__ __align__(16) memo_bf16 v_s[N * LD];
    __shared__ double inv_freq[D / 2];

    // Longest tiles (most keys) first.
    const memo_u32 q0 = (gridDim.x - 1 - blockIdx.x) * MEMO_ATTN_OWNER;
    const memo_u32 head = blockIdx.y, seq = blockIdx.z, row_elems = heads * D;
    const memo_u32 kv = memo_attn_kv_head(head, group, first_query), kv_row_elems = kv_heads * D;
    const memo_u32 q_last = min(q0 + MEMO_ATTN_OWNER - 1, s - 1);  // last key any row of the tile sees

    MemoAttnStream<D, N> keys;  // k and v (K/V head kv)
    keys.begin(k, v, seq, kv, s, kv_row_elems, 0);
    memo_attn_inv_freq<D>(inv_freq, theta_bits);
    __syncthreads();
    memo_attn_load<D>(q_s, q, seq, head, s, row_elems, q0, MEMO_ATTN_OWNER, inv_freq);

#if MEMO_ATTN_TENSOR
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const memo_u32 pos0 = q0 + warp * 16 + g, pos1 = pos0 + 8;  // the rows of c0/c1 and c2/c3
    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    }
    // Running max and this lane's partial sums (its columns only) of rows pos0 and pos1.
    float m[2] = {MEMO_ATTN_NEG_INF, MEMO_ATTN_NEG_INF}, l[2] = {0.0f, 0.0f};
    for (memo_u32 k0 = 0; k0 <= q_last; k0 += N) {
        __syncthreads();  // the previous tiles are consumed (and q_s is written, first time)
        keys.tiles(k_s, k, v_s, v, seq, kv, s, kv_row_elems, k0, k0 + N <= q_last, kv, k0 + N, inv_freq);
        __syncthreads();
        float sc[N / 8][4];
        memo_mma_abt<D, N / 8>(sc, q_s + warp * 16 * LD, k_s, g, t);
        // Every key of the tile at or before the block's first row (hence inside the sequence):
        // nothing to mask (pipelined variant). Otherwise the tile crosses the diagonal or the end.
        const bool visible = MEMO_ATTN_PIPELINED && k0 + N <= q0 + 1;
        float tile_max[2] = {MEMO_ATTN_NEG_INF, MEMO_ATTN_NEG_INF};
#pragma unroll
        for (int n = 0; n < N / 8; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const memo_u32 key = k0 + n * 8 + 2 * t + (e & 1);
                const memo_u32 pos = e < 2 ? pos0 : pos1;
                float x = sc[n][e] * scale;
                if (!visible && (key > pos || key >= s)) x = MEMO_ATTN_NEG_INF;
                sc[n][e] = x;
                tile_max[e >> 1] = fmaxf(tile_max[e >> 1], x);
            }
        }
        float corr[2], m_new[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            // Key k0 = 0 is visible to every row, so m_new is finite from the first tile on.
            m_new[r] = fmaxf(m[r], memo_quad_max(tile_max[r]));
            corr[r] = expf(m[r] - m_new[r]);
            m[r] = m_new[r];
            l[r] *= corr[r];
        }
#pragma unroll
        for (int n = 0; n < N / 8; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float p = expf(sc[n][e] - m_new[e >> 1]);
                sc[n][e] = p;
                l[e >> 1] += p;
            }
        }
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            o[n][0] *= corr[0];
            o[n][1] *= corr[0];
            o[n][2] *= corr[1];
            o[n][3] *= corr[1];
        }
        memo_mma_px<D, N / 8>(o, sc, v_s, g, t);
    }
    const float sum0 = memo_quad_sum(l[0]), sum1 = memo_quad_sum(l[1]);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
        const int pair = n * 4 + t;  // columns n*8 + 2t, n*8 + 2t + 1
        if (pos0 < s) memo_attn_store_pair<D>(out, seq, head, s, row_elems, pos0, pair, o[n][0] / sum0, o[n][1] / sum0, nullptr);
        if (pos1 < s) memo_attn_store_pair<D>(out, seq, head, s, row_elems, pos1, pair, o[n][2] / sum1, o[n][3] / sum1, nullptr);
    }
    if (t == 0) {
        if (pos0 < s) lse[memo_attn_lse_index(seq, s, pos0, heads, head)] = m[0] + logf(sum0);
        if (pos1 < s) lse[memo_attn_lse_index(seq, s, pos1, heads, head)] = m[1] + logf(sum1);
    }
#else
    // Scalar: threads 2r and 2r + 1 share owner row r; each keeps half of the output columns.
    const int r = threadIdx.x >> 1, half = threadIdx.x & 1, c0 = half * (D / 2);
    const memo_u32 pos = q0 + r;
    float acc[D / 2];
#pragma unroll
    for (int c = 0; c < D / 2; ++c) acc[c] = 0.0f;
    float m = MEMO_ATTN_NEG_INF, l = 0.0f;
    for (memo_u32 k0 = 0; k0 <= q_last; k0 += N) {
        __syncthreads();
        keys.tiles(k_s, k, v_s, v, seq, kv, s, kv_row_elems, k0, k0 + N <= q_last, kv, k0 + N, inv_freq);
        __syncthreads();
        float sc[N];
        float tile_max = MEMO_ATTN_NEG_INF;
#pragma unroll
        for (int j = 0; j < N; ++j) {
            float dot = 0.0f;
            for (int c = 0; c < D; ++c) dot += memo_attn_at(q_s, r * LD + c) * memo_attn_at(k_s, j * LD + c);
            float x = dot * scale;
            const memo_u32 key = k0 + j;
            if (key > pos || key >= s) x = MEMO_ATTN_NEG_INF;
            sc[j] = x;
            tile_max = fmaxf(tile_max, x);
        }
        const float m_new = fmaxf(m, tile_max);
        const float corr = expf(m - m_new);
#pragma unroll
        for (int c = 0; c < D / 2; ++c) acc[c] *= corr;
        float tile_sum = 0.0f;
#pragma unroll
        for (int j = 0; j < N; ++j) {
            const float p = expf(sc[j] - m_new);
            tile_sum += p;
#pragma unroll
            for (int c = 0; c < D / 2; ++c) acc[c] += p * memo_attn_at(v_s, j * LD + c0 + c);
        }
        l = l * corr + tile_sum;
        m = m_new;
    }
    if (pos < s) {
#pragma unroll
        for (int c = 0; c < D / 2; c += 2) {
            memo_attn_store_pair<D>(out, seq, head, s, row_elems, pos, (c0 + c) / 2, acc[c] / l, acc[c + 1] / l, nullptr);
        }
        if (half == 0) lse[memo_attn_lse_index(seq, s, pos, heads, head)] = m + logf(l);
    }
#endif
}

// ---------------------------------------------------------------------------------------------
// Backward, kernel 1: dk and dv of 64 keys, streaming the query tiles at and after them.

template <int D>
__device__ __forceinline__ void memo_attention_backward_dkdv(const memo_bf16* q, const memo_bf16* k,
                                                             const memo_bf16* v, const memo_bf16* out,
                                                             const float* lse, const memo_bf16* dout, memo_bf16* dk,
                                                             memo_bf16* dv, memo_u32 s, memo_u32 heads,
                                                             memo_u32 kv_heads, memo_u32 group, memo_u32 first_query,
                                                             float scale, memo_u64 theta_bits) {
    constexpr int N = MemoAttnTiles<D>::BACKWARD;
    constexpr int LD = D + 8;
    __shared__ __align__(16) memo_bf16 k_s[MEMO_ATTN_OWNER * LD];
    __shared__ __align__(16) memo_bf16 v_s[MEMO_ATTN_OWNER * LD];
    __shared__ __align__(16) memo_bf16 q_s[N * LD];
    __shared__ __align__(16) memo_bf16 do_s[N * LD];
    __shared__ float lse_s[N];
    __shared__ float delta_s[N];
    __shared__ double inv_freq[D / 2];

    const memo_u32 k0 = blockIdx.x * MEMO_ATTN_OWNER;  // the longest (earliest) key tiles first
    const memo_u32 kv = blockIdx.y, seq = blockIdx.z, row_elems = heads * D, kv_row_elems = kv_heads * D;
    // The query heads of this launch that use K/V head kv, [h_begin, h_end): those with
    // kv * group <= first_query + head < (kv + 1) * group. Their dk and dv are summed in the same
    // f32 accumulators, head after head in increasing order (deterministic, no atomics); a K/V
    // head no query head uses (K and V replicated) keeps zero accumulators and stores zeros.
    const memo_u32 kv_first = kv * group, kv_end = kv_first + group;
    const memo_u32 h_begin = kv_first > first_query ? kv_first - first_query : 0;
    const memo_u32 h_end = min(kv_end > first_query ? kv_end - first_query : 0, heads);

    MemoAttnStream<D, N> queries;  // q and dout (query head h_begin first)
    if (h_begin < h_end) queries.begin(q, dout, seq, h_begin, s, row_elems, k0);
    memo_attn_inv_freq<D>(inv_freq, theta_bits);
    __syncthreads();
    memo_attn_load<D>(k_s, k, seq, kv, s, kv_row_elems, k0, MEMO_ATTN_OWNER, inv_freq);
    memo_attn_load<D>(v_s, v, seq, kv, s, kv_row_elems, k0, MEMO_ATTN_OWNER, nullptr);

#if MEMO_ATTN_TENSOR
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const memo_u32 key0 = k0 + warp * 16 + g, key1 = key0 + 8;  // the rows of c0/c1 and c2/c3
    float dk_acc[D / 8][4], dv_acc[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) dk_acc[n][e] = dv_acc[n][e] = 0.0f;
    }
#else
    const int r = threadIdx.x >> 1, half = threadIdx.x & 1, c0 = half * (D / 2);
    const memo_u32 key = k0 + r;
    float dk_acc[D / 2], dv_acc[D / 2];
#pragma unroll
    for (int c = 0; c < D / 2; ++c) dk_acc[c] = dv_acc[c] = 0.0f;
#endif

    for (memo_u32 head = h_begin; head < h_end; ++head) {
        for (memo_u32 i0 = k0; i0 < s; i0 += N) {
            __syncthreads();  // the previous query tile is consumed (and k_s, v_s written, first time)
            // The next tile: this head's next query tile, or the next head's first (k0 < s).
            const bool same_head = i0 + N < s;
            queries.tiles(q_s, q, do_s, dout, seq, head, s, row_elems, i0, same_head || head + 1 < h_end,
                          same_head ? head : head + 1, same_head ? i0 + N : k0, inv_freq);
            __syncthreads();
            memo_attn_row_stats<D, N>(lse_s, delta_s, do_s, out, lse, seq, head, s, heads, i0);
            __syncthreads();
#if MEMO_ATTN_TENSOR
            // Transposed scores: rows = this warp's 16 keys, columns = the tile's N queries.
            float p[N / 8][4], ds[N / 8][4];
            memo_mma_abt<D, N / 8>(p, k_s + warp * 16 * LD, q_s, g, t);
            memo_mma_abt<D, N / 8>(ds, v_s + warp * 16 * LD, do_s, g, t);  // dP^T = V dO^T
            // Every query of the tile at or after the block's last key and inside the sequence.
            const bool visible = MEMO_ATTN_PIPELINED && i0 >= k0 + MEMO_ATTN_OWNER - 1 && i0 + N <= s;
#pragma unroll
            for (int n = 0; n < N / 8; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = n * 8 + 2 * t + (e & 1);
                    const memo_u32 qpos = i0 + i;
                    const memo_u32 kpos = e < 2 ? key0 : key1;
                    const bool live = visible || (kpos <= qpos && qpos < s);
                    const float pij = live ? expf(p[n][e] * scale - lse_s[i]) : 0.0f;
                    p[n][e] = pij;
                    ds[n][e] = pij * (ds[n][e] - delta_s[i]);
                }
            }
            memo_mma_px<D, N / 8>(dv_acc, p, do_s, g, t);  // dV += P^T dO
            memo_mma_px<D, N / 8>(dk_acc, ds, q_s, g, t);  // dK += dS^T Q
#else
            for (int i = 0; i < N; ++i) {
                const memo_u32 qpos = i0 + i;
                if (key <= qpos && qpos < s) {
                    float dot = 0.0f, dp = 0.0f;
                    for (int c = 0; c < D; ++c) {
                        dot += memo_attn_at(q_s, i * LD + c) * memo_attn_at(k_s, r * LD + c);
                        dp += memo_attn_at(do_s, i * LD + c) * memo_attn_at(v_s, r * LD + c);
                    }
                    const float pij = expf(dot * scale - lse_s[i]);
                    const float dsij = pij * (dp - delta_s[i]);
#pragma unroll
                    for (int c = 0; c < D / 2; ++c) {
                        dv_acc[c] += pij * memo_attn_at(do_s, i * LD + c0 + c);
                        dk_acc[c] += dsij * memo_attn_at(q_s, i * LD + c0 + c);
                    }
                }
            }
#endif
        }
    }

    // dk is rotated back, except for an unused K/V head: its zeros stay +0.0 (a rotation could
    // make -0.0), as the CPU reference writes them.
    const double* dk_rope = h_begin < h_end ? inv_freq : nullptr;
#if MEMO_ATTN_TENSOR
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
        const int pair = n * 4 + t;
        if (key0 < s) {
            memo_attn_store_pair<D>(dk, seq, kv, s, kv_row_elems, key0, pair, dk_acc[n][0] * scale, dk_acc[n][1] * scale, dk_rope);
            memo_attn_store_pair<D>(dv, seq, kv, s, kv_row_elems, key0, pair, dv_acc[n][0], dv_acc[n][1], nullptr);
        }
        if (key1 < s) {
            memo_attn_store_pair<D>(dk, seq, kv, s, kv_row_elems, key1, pair, dk_acc[n][2] * scale, dk_acc[n][3] * scale, dk_rope);
            memo_attn_store_pair<D>(dv, seq, kv, s, kv_row_elems, key1, pair, dv_acc[n][2], dv_acc[n][3], nullptr);
        }
    }
#else
    if (key < s) {
#pragma unroll
        for (int c = 0; c < D / 2; c += 2) {
            const int pair = (c0 + c) / 2;
            memo_attn_store_pair<D>(dk, seq, kv, s, kv_row_elems, key, pair, dk_acc[c] * scale, dk_acc[c + 1] * scale, dk_rope);
            memo_attn_store_pair<D>(dv, seq, kv, s, kv_row_elems, key, pair, dv_acc[c], dv_acc[c + 1], nullptr);
        }
    }
#endif
}

// ---------------------------------------------------------------------------------------------
// Backward, kernel 2: dq of 64 query rows, streaming the key tiles up to the causal limit.

template <int D>
__device__ __forceinline__ void memo_attention_backward_dq(const memo_bf16* q, const memo_bf16* k, const memo_bf16* v,
                                                           const memo_bf16* out, const float* lse,
                                                           const memo_bf16* dout, memo_bf16* dq, memo_u32 s,
                                                           memo_u32 heads, memo_u32 kv_heads, memo_u32 group,
                                                           memo_u32 first_query, float scale, memo_u64 theta_bits) {
    constexpr int N = MemoAttnTiles<D>::BACKWARD;
    constexpr int LD = D + 8;
    __shared__ __align__(16) memo_bf16 q_s[MEMO_ATTN_OWNER * LD];
    __shared__ __align__(16) memo_bf16 do_s[MEMO_ATTN_OWNER * LD];
    __shared__ __align__(16) memo_bf16 k_s[N * LD];
    __shared__ __align__(16) memo_bf16 v_s[N * LD];
    __shared__ float lse_s[MEMO_ATTN_OWNER];
    __shared__ float delta_s[MEMO_ATTN_OWNER];
    __shared__ double inv_freq[D / 2];

    const memo_u32 q0 = (gridDim.x - 1 - blockIdx.x) * MEMO_ATTN_OWNER;  // longest tiles first
    const memo_u32 head = blockIdx.y, seq = blockIdx.z, row_elems = heads * D;
    const memo_u32 kv = memo_attn_kv_head(head, group, first_query), kv_row_elems = kv_heads * D;
    const memo_u32 q_last = min(q0 + MEMO_ATTN_OWNER - 1, s - 1);

    MemoAttnStream<D, N> keys;  // k and v (K/V head kv)
    keys.begin(k, v, seq, kv, s, kv_row_elems, 0);
    memo_attn_inv_freq<D>(inv_freq, theta_bits);
    __syncthreads();
    memo_attn_load<D>(q_s, q, seq, head, s, row_elems, q0, MEMO_ATTN_OWNER, inv_freq);
    memo_attn_load<D>(do_s, dout, seq, head, s, row_elems, q0, MEMO_ATTN_OWNER, nullptr);
    __syncthreads();
    memo_attn_row_stats<D, MEMO_ATTN_OWNER>(lse_s, delta_s, do_s, out, lse, seq, head, s, heads, q0);
    __syncthreads();

#if MEMO_ATTN_TENSOR
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int row0 = warp * 16 + g, row1 = row0 + 8;
    const memo_u32 pos0 = q0 + row0, pos1 = q0 + row1;
    const float lse_r[2] = {lse_s[row0], lse_s[row1]};
    const float delta_r[2] = {delta_s[row0], delta_s[row1]};
    float dq_acc[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
        dq_acc[n][0] = dq_acc[n][1] = dq_acc[n][2] = dq_acc[n][3] = 0.0f;
    }
#else
    const int r = threadIdx.x >> 1, half = threadIdx.x & 1, c0 = half * (D / 2);
    const memo_u32 pos = q0 + r;
    const float lse_r = lse_s[r], delta_r = delta_s[r];
    float dq_acc[D / 2];
#pragma unroll
    for (int c = 0; c < D / 2; ++c) dq_acc[c] = 0.0f;
#endif

    for (memo_u32 k0 = 0; k0 <= q_last; k0 += N) {
        __syncthreads();  // the previous key tile is consumed
        keys.tiles(k_s, k, v_s, v, seq, kv, s, kv_row_elems, k0, k0 + N <= q_last, kv, k0 + N, inv_freq);
        __syncthreads();
#if MEMO_ATTN_TENSOR
        float p[N / 8][4], ds[N / 8][4];
        memo_mma_abt<D, N / 8>(p, q_s + warp * 16 * LD, k_s, g, t);
        memo_mma_abt<D, N / 8>(ds, do_s + warp * 16 * LD, v_s, g, t);  // dP = dO V^T
        // Every key of the tile at or before the block's first row, every row inside the sequence.
        const bool visible = MEMO_ATTN_PIPELINED && k0 + N <= q0 + 1 && q0 + MEMO_ATTN_OWNER <= s;
#pragma unroll
        for (int n = 0; n < N / 8; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const memo_u32 key = k0 + n * 8 + 2 * t + (e & 1);
                const memo_u32 qpos = e < 2 ? pos0 : pos1;
                const bool live = visible || (key <= qpos && qpos < s);
                const float pij = live ? expf(p[n][e] * scale - lse_r[e >> 1]) : 0.0f;
                ds[n][e] = pij * (ds[n][e] - delta_r[e >> 1]);
            }
        }
        memo_mma_px<D, N / 8>(dq_acc, ds, k_s, g, t);  // dQ += dS K
#else
        for (int j = 0; j < N; ++j) {
            const memo_u32 key = k0 + j;
            if (key <= pos && pos < s) {
                float dot = 0.0f, dp = 0.0f;
                for (int c = 0; c < D; ++c) {
                    dot += memo_attn_at(q_s, r * LD + c) * memo_attn_at(k_s, j * LD + c);
                    dp += memo_attn_at(do_s, r * LD + c) * memo_attn_at(v_s, j * LD + c);
                }
                const float pij = expf(dot * scale - lse_r);
                const float dsij = pij * (dp - delta_r);
#pragma unroll
                for (int c = 0; c < D / 2; ++c) dq_acc[c] += dsij * memo_attn_at(k_s, j * LD + c0 + c);
            }
        }
#endif
    }

#if MEMO_ATTN_TENSOR
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
        const int pair = n * 4 + t;
        if (pos0 < s) memo_attn_store_pair<D>(dq, seq, head, s, row_elems, pos0, pair, dq_acc[n][0] * scale, dq_acc[n][1] * scale, inv_freq);
        if (pos1 < s) memo_attn_store_pair<D>(dq, seq, head, s, row_elems, pos1, pair, dq_acc[n][2] * scale, dq_acc[n][3] * scale, inv_freq);
    }
#else
    if (pos < s) {
#pragma unroll
        for (int c = 0; c < D / 2; c += 2) {
            memo_attn_store_pair<D>(dq, seq, head, s, row_elems, pos, (c0 + c) / 2, dq_acc[c] * scale, dq_acc[c + 1] * scale, inv_freq);
        }
    }
#endif
}

// ---------------------------------------------------------------------------------------------
// Entry points, one per head dim.

#define MEMO_ATTENTION_KERNELS(D)                                                                            \
    extern "C" __global__ void MEMO_LAUNCH_BOUNDS(MEMO_ATTN_THREADS) memo_attention_forward_d##D(             \
        const memo_bf16* q, const memo_bf16* k, const memo_bf16* v, memo_bf16* out, float* lse, memo_u32 s,  \
        memo_u32 heads, memo_u32 kv_heads, memo_u32 group, memo_u32 first_query, float scale,                \
        memo_u64 theta_bits) {                                                                               \
        memo_attention_forward<D>(q, k, v, out, lse, s, heads, kv_heads, group, first_query, scale,         \
                                  theta_bits);                                                               \
    }                                                                                                        \
    extern "C" __global__ void MEMO_LAUNCH_BOUNDS(MEMO_ATTN_THREADS) memo_attention_backward_dkdv_d##D(      \
        const memo_bf16* q, const memo_bf16* k, const memo_bf16* v, const memo_bf16* out, const float* lse, \
        const memo_bf16* dout, memo_bf16* dq, memo_bf16* dk, memo_bf16* dv, memo_u32 s, memo_u32 heads,     \
        memo_u32 kv_heads, memo_u32 group, memo_u32 first_query, float scale, memo_u64 theta_bits) {         \
        (void)dq;                                                                                            \
        memo_attention_backward_dkdv<D>(q, k, v, out, lse, dout, dk, dv, s, heads, kv_heads, group,         \
                                        first_query, scale, theta_bits);                                     \
    }                                                                                                        \
    extern "C" __global__ void MEMO_LAUNCH_BOUNDS(MEMO_ATTN_THREADS) memo_attention_backward_dq_d##D(        \
        const memo_bf16* q, const memo_bf16* k, const memo_bf16* v, const memo_bf16* out, const float* lse, \
        const memo_bf16* dout, memo_bf16* dq, memo_bf16* dk, memo_bf16* dv, memo_u32 s, memo_u32 heads,     \
        memo_u32 kv_heads, memo_u32 group, memo_u32 first_query, float scale, memo_u64 theta_bits) {         \
        (void)dk;                                                                                            \
        (void)dv;                                                                                            \
        memo_attention_backward_dq<D>(q, k, v, out, lse, dout, dq, s, heads, kv_heads, group, first_query,  \
                                      scale, theta_bits);                                                    \
    }

MEMO_ATTENTION_KERNELS(16)
MEMO_ATTENTION_KERNELS(32)
MEMO_ATTENTION_KERNELS(64)
MEMO_ATTENTION_KERNELS(128)
