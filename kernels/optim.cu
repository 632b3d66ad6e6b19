// The optimizer (runtime-cpu/src/ops/optim.rs): partial sums of squares for the global gradient
// norm, and AdamW on f32 master weights.
#include "memo_gpu.h"

// Block b sums g^2 over elements i = b * blockDim.x + threadIdx.x + k * gridDim.x * blockDim.x
// into partial[b]; memo_sum_into_scalar then adds the blocks' sums in order to sum_squares.
// The grid depends only on n (memo_kernels), so the order, and the bits, are fixed.
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(256)
memo_sum_squares_partial(const memo_bf16* grad, memo_u64 n, float* partial) {
    __shared__ float shared[32];
    float s = 0.0f;
    for (memo_u64 i = (memo_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (memo_u64)gridDim.x * blockDim.x) {
        const float g = memo_bf16_to_f32(grad[i]);
        s += g * g;
    }
    const float total = memo_block_sum(s, shared);
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = total;
    }
}

// One AdamW step over `rows` rows of `width` elements. The state row of a parameter row holds
// `width` f32 master weights, then `width` m, then `width` v. clip = min(1, max_grad_norm /
// sqrt(norm_squared)) (1 when max_grad_norm is 0); step_size = lr / (1 - beta1^step), decay =
// 1 - lr * weight_decay and correction2_sqrt = sqrt(1 - beta2^step) come from the host,
// computed as the CPU reference computes them. A non-finite norm_squared is reported
// (MEMO_STATUS_NOT_FINITE) and nothing is written, like the CPU's error before any update.
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(256)
memo_adamw(memo_bf16* parameter, const memo_bf16* grad, float* state, const float* norm_squared, memo_u64 rows,
           memo_u32 width, float beta1, float beta2, float eps, float max_grad_norm, float step_size, float decay,
           float correction2_sqrt, memo_u32* status, memo_u32 instruction) {
    const float nsq = *norm_squared;
    if (!isfinite(nsq)) {
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            memo_report(status, MEMO_STATUS_NOT_FINITE, instruction, __float_as_uint(nsq), 0u);
        }
        return;
    }
    const float grad_norm = sqrtf(nsq);
    const float clip = (max_grad_norm > 0.0f && grad_norm > max_grad_norm) ? max_grad_norm / grad_norm : 1.0f;
    const memo_u64 n = rows * width;
    for (memo_u64 i = (memo_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (memo_u64)gridDim.x * blockDim.x) {
        const memo_u64 row = i / width;
        const memo_u64 col = i - row * width;
        float* master = state + row * 3 * (memo_u64)width;
        float* first = master + width;
        float* second = first + width;
        const float g = memo_bf16_to_f32(grad[i]) * clip;
        float w = master[col] * decay;
        const float m = beta1 * first[col] + (1.0f - beta1) * g;
        const float v = beta2 * second[col] + (1.0f - beta2) * g * g;
        w -= step_size * m / (sqrtf(v) / correction2_sqrt + eps);
        master[col] = w;
        first[col] = m;
        second[col] = v;
        parameter[i] = memo_f32_to_bf16(w);
    }
}
