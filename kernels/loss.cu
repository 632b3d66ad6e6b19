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

// The vocabulary-parallel cross-entropy (t > 1, `spec/tensor-parallel.md`): each rank holds
// `width` = V' = ceil(V / t) logits columns per row, the vocabulary ids [offset, offset + width);
// the first `valid` = min(V', V - offset) are below the vocabulary, the rest are padding. One
// block per row (grid-stride), 256 threads, f32 as in runtime-cpu/src/ops/loss.rs.

// max[row] = the f32 maximum of the row's valid logits (-inf when the rank holds none).
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(256)
memo_cross_entropy_max(const memo_bf16* logits, float* max, memo_u64 rows, memo_u32 width, memo_u32 valid) {
    __shared__ float shared[32];
    for (memo_u64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const memo_bf16* l = logits + row * width;
        float m = -__int_as_float(0x7f800000);  // -inf (no math header under NVRTC)
        for (memo_u32 j = threadIdx.x; j < valid; j += blockDim.x) {
            m = fmaxf(m, memo_bf16_to_f32(l[j]));
        }
        m = memo_block_max(m, shared);
        if (threadIdx.x == 0) {
            max[row] = m;
        }
    }
}

// With max[row] the row's combined maximum m: sums[2 row] = sum of exp(l - m) over the valid
// logits, sums[2 row + 1] = the target's logit if this rank holds its column, else 0. A target
// >= vocab is reported (MEMO_STATUS_TARGET_OUT_OF_RANGE) and its row's sums are 0.
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(256)
memo_cross_entropy_sums(const memo_bf16* logits, const memo_u32* targets, const float* max, float* sums,
                        memo_u64 rows, memo_u32 width, memo_u32 valid, memo_u64 offset, memo_u32 vocab,
                        memo_u32* status, memo_u32 instruction) {
    __shared__ float shared[32];
    for (memo_u64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const memo_bf16* l = logits + row * width;
        const memo_u32 target = targets[row];
        if (target >= vocab) {
            if (threadIdx.x == 0) {
                memo_report(status, MEMO_STATUS_TARGET_OUT_OF_RANGE, instruction, (memo_u32)row, target);
                sums[2 * row] = 0.0f;
                sums[2 * row + 1] = 0.0f;
            }
            continue;
        }
        const float m = max[row];
        float z = 0.0f;
        for (memo_u32 j = threadIdx.x; j < valid; j += blockDim.x) {
            z += expf(memo_bf16_to_f32(l[j]) - m);
        }
        z = memo_block_sum(z, shared);
        if (threadIdx.x == 0) {
            const bool held = (memo_u64)target >= offset && (memo_u64)target - offset < valid;
            sums[2 * row] = z;
            sums[2 * row + 1] = held ? memo_bf16_to_f32(l[target - offset]) : 0.0f;
        }
    }
}

// With the row's combined maximum m and sums [z, target logit]: row_loss[row] = m + ln z -
// target logit (for memo_sum_into_scalar), and the logits become (exp(l - m) / z - onehot) /
// tokens, the padding columns 0. A target >= vocab is reported; its row keeps its logits and
// adds 0.
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(256)
memo_cross_entropy_finish(memo_bf16* logits, const memo_u32* targets, const float* max, const float* sums,
                          float* row_loss, memo_u64 rows, memo_u32 width, memo_u32 valid, memo_u64 offset,
                          memo_u32 vocab, float tokens, memo_u32* status, memo_u32 instruction) {
    for (memo_u64 row = blockIdx.x; row < rows; row += gridDim.x) {
        memo_bf16* l = logits + row * width;
        const memo_u32 target = targets[row];
        if (target >= vocab) {
            if (threadIdx.x == 0) {
                memo_report(status, MEMO_STATUS_TARGET_OUT_OF_RANGE, instruction, (memo_u32)row, target);
                row_loss[row] = 0.0f;
            }
            continue;
        }
        const float m = max[row];
        const float z = sums[2 * row];
        if (threadIdx.x == 0) {
            row_loss[row] = m + logf(z) - sums[2 * row + 1];
        }
        const bool held = (memo_u64)target >= offset && (memo_u64)target - offset < valid;
        const memo_u32 local = held ? (memo_u32)(target - offset) : 0xffffffffu;
        for (memo_u32 j = threadIdx.x; j < width; j += blockDim.x) {
            float g = 0.0f;
            if (j < valid) {
                const float p = expf(memo_bf16_to_f32(l[j]) - m) / z;
                g = j == local ? (p - 1.0f) / tokens : p / tokens;
            }
            l[j] = memo_f32_to_bf16(g);
        }
    }
}
