// Cross-entropy over a chunk of logits (runtime-cpu/src/ops/loss.rs) and the deterministic
// sum of f32 values into a scalar that it and the gradient norm share.
#include "memo_gpu.h"

// One block per row (grid-stride), 256 threads. In f32: m = max, z = sum exp(l - m),
// loss_r = m + ln z - l[target]; logits <- (exp(l - m) / z - [j == target]) / tokens.
// loss_r goes to row_loss[row] (f32) for memo_sum_into_scalar. A target >= vocab is
// reported (MEMO_STATUS_TARGET_OUT_OF_RANGE); its row keeps its logits and adds 0.
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(256)
memo_cross_entropy(memo_bf16* logits, const memo_u32* targets, float* row_loss, memo_u64 rows, memo_u32 vocab,
                   float tokens, memo_u32* status, memo_u32 instruction) {
    __shared__ float shared[32];
    for (memo_u64 row = blockIdx.x; row < rows; row += gridDim.x) {
        memo_bf16* l = logits + row * vocab;
        const memo_u32 target = targets[row];
        if (target >= vocab) {
            if (threadIdx.x == 0) {
                memo_report(status, MEMO_STATUS_TARGET_OUT_OF_RANGE, instruction, (memo_u32)row, target);
                row_loss[row] = 0.0f;
            }
            continue;
        }
        float m = -__int_as_float(0x7f800000);  // -inf (no math header under NVRTC)
        for (memo_u32 j = threadIdx.x; j < vocab; j += blockDim.x) {
            m = fmaxf(m, memo_bf16_to_f32(l[j]));
        }
        m = memo_block_max(m, shared);
        float z = 0.0f;
        for (memo_u32 j = threadIdx.x; j < vocab; j += blockDim.x) {
            z += expf(memo_bf16_to_f32(l[j]) - m);
        }
        z = memo_block_sum(z, shared);
        const float target_logit = memo_bf16_to_f32(l[target]);
        __syncthreads();  // every thread has read l[target] before it is overwritten
        if (threadIdx.x == 0) {
            row_loss[row] = m + logf(z) - target_logit;
        }
        for (memo_u32 j = threadIdx.x; j < vocab; j += blockDim.x) {
            const float p = expf(memo_bf16_to_f32(l[j]) - m) / z;
            l[j] = memo_f32_to_bf16(j == target ? (p - 1.0f) / tokens : p / tokens);
        }
    }
}

// *scalar += sum of values[0..count) (f32). One block of 1024 threads: thread t adds values
// t, t + 1024, ... in order, then memo_block_sum: a fixed order, so the result is the same on
// every run.
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(1024)
memo_sum_into_scalar(const float* values, memo_u64 count, float* scalar) {
    __shared__ float shared[32];
    float s = 0.0f;
    for (memo_u64 i = threadIdx.x; i < count; i += blockDim.x) {
        s += values[i];
    }
    const float total = memo_block_sum(s, shared);
    if (threadIdx.x == 0) {
        *scalar = *scalar + total;
    }
}
