// rope.cu: rotary positions (RoPE, base theta = the model's rope_theta, a parameter; pairs (2i, 2i+1)) as a kernel of its own, for the
// cuDNN attention path of runtime-cuda: cuDNN has no rotary fusion, so q and k are rotated into
// transients before cuDNN's forward and backward, and the gradients dq and dk are rotated back
// (the inverse rotation, in place) after cuDNN's backward. Our own attention kernels rotate while
// loading tiles (attention.cu) and do not use this.
//
// Arithmetic as runtime-cpu's attention and memo_gpu.h's memo_rope_cos_sin: the inverse frequency
// theta^(-2i/D) in double, the angle pos * f reduced modulo 2 pi in double, sincosf of the reduced
// f32 angle, the rotation in f32, one rounding to bf16.
#include "memo_gpu.h"

// y = RoPE(x) (inverse != 0: the inverse rotation, for gradients) over `rows` rows of
// `heads * head_dim` bf16; row r is position r % seq_len. One thread per pair, grid-stride. x and
// y may be the same buffer: each thread reads its pair before it writes it.
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(256)
memo_rope(const memo_bf16* x, memo_bf16* y, memo_u64 rows, memo_u32 heads, memo_u32 head_dim, memo_u32 seq_len, memo_u32 inverse,
          memo_u64 theta_bits) {
    const double theta = memo_f64_from_bits(theta_bits);
    const memo_u32 half = head_dim / 2;
    const memo_u64 n = rows * heads * half;
    for (memo_u64 i = (memo_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (memo_u64)gridDim.x * blockDim.x) {
        const memo_u32 pair = (memo_u32)(i % half);
        const memo_u64 row_head = i / half;
        const memo_u32 pos = (memo_u32)((row_head / heads) % seq_len);
        const double inv_freq = pow(theta, -2.0 * (double)pair / (double)head_dim);
        float c, sn;
        memo_rope_cos_sin(pos, inv_freq, &c, &sn);
        if (inverse) {
            sn = -sn;
        }
        const memo_u64 at = row_head * head_dim + 2 * (memo_u64)pair;
        const float a = memo_bf16_to_f32(x[at]);
        const float b = memo_bf16_to_f32(x[at + 1]);
        y[at] = memo_f32_to_bf16(a * c - b * sn);
        y[at + 1] = memo_f32_to_bf16(a * sn + b * c);
    }
}

// The log-sum-exp between the plan's layout ([rows, heads] f32, token-major) and cuDNN's
// head-major (sequence, head, position) statistics, for a cuDNN that refuses the plan's strided
// view: to_head_major != 0 copies token-major x into head-major y, else the reverse. One thread
// per element, grid-stride.
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(256)
memo_lse_transpose(const float* x, float* y, memo_u64 sequences, memo_u32 seq_len, memo_u32 heads, memo_u32 to_head_major) {
    const memo_u64 n = sequences * seq_len * heads;
    for (memo_u64 i = (memo_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (memo_u64)gridDim.x * blockDim.x) {
        // i indexes the token-major layout: ((seq * seq_len) + pos) * heads + head.
        const memo_u32 head = (memo_u32)(i % heads);
        const memo_u64 row = i / heads;
        const memo_u32 pos = (memo_u32)(row % seq_len);
        const memo_u64 seq = row / seq_len;
        const memo_u64 j = (seq * heads + head) * seq_len + pos;
        if (to_head_major) {
            y[j] = x[i];
        } else {
            y[i] = x[j];
        }
    }
}
