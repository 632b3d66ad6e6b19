// Layer norm, RMS norm and their backward (runtime-cpu/src/ops/norm.rs): per-row statistics in
// f32, two passes for layer norm (mean, then the mean of squared deviations), one for RMS norm
// (the mean of squares); eps is a parameter (the model's, KernelContext::norm_eps: 1e-5 for GPT). One block per row
// (grid-stride), the row's sums reduced with memo_block_sum (a fixed order, so a row's output does
// not depend on the launch it is in). Block size: 256 (whole warps, see memo_block_sum).
#include "memo_gpu.h"

// mean and 1 / sqrt(var + eps) of one row of `width` bf16.
__device__ __forceinline__ void memo_row_statistics(const memo_bf16* x, memo_u32 width, float eps, float* shared,
                                                    float* mean, float* rstd) {
    float s = 0.0f;
    for (memo_u32 j = threadIdx.x; j < width; j += blockDim.x) {
        s += memo_bf16_to_f32(x[j]);
    }
    const float m = memo_block_sum(s, shared) / (float)width;
    float q = 0.0f;
    for (memo_u32 j = threadIdx.x; j < width; j += blockDim.x) {
        const float d = memo_bf16_to_f32(x[j]) - m;
        q += d * d;
    }
    const float variance = memo_block_sum(q, shared) / (float)width;
    *mean = m;
    *rstd = 1.0f / sqrtf(variance + eps);
}

// y = (x - mean) * rstd * scale + shift, per row.
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(256)
memo_layer_norm_forward(const memo_bf16* x, const memo_bf16* scale, const memo_bf16* shift, memo_bf16* y,
                        memo_u64 rows, memo_u32 width, float eps) {
    __shared__ float shared[32];
    for (memo_u64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const memo_bf16* xr = x + row * width;
        memo_bf16* yr = y + row * width;
        float mean, rstd;
        memo_row_statistics(xr, width, eps, shared, &mean, &rstd);
        for (memo_u32 j = threadIdx.x; j < width; j += blockDim.x) {
            const float v = (memo_bf16_to_f32(xr[j]) - mean) * rstd;
            yr[j] = memo_f32_to_bf16(v * memo_bf16_to_f32(scale[j]) + memo_bf16_to_f32(shift[j]));
        }
    }
}

// Backward, stage 1 (per row): with xhat = (x - mean) * rstd and g = dy * scale,
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); the row's (mean, rstd) go to
// stats[2 * row], stats[2 * row + 1] for stage 2.
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(256)
memo_layer_norm_backward_rows(const memo_bf16* x, const memo_bf16* scale, const memo_bf16* dy, memo_bf16* dx,
                              float* stats, memo_u64 rows, memo_u32 width, float eps) {
    __shared__ float shared[32];
    for (memo_u64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const memo_bf16* xr = x + row * width;
        const memo_bf16* dyr = dy + row * width;
        memo_bf16* dxr = dx + row * width;
        float mean, rstd;
        memo_row_statistics(xr, width, eps, shared, &mean, &rstd);
        float sg = 0.0f, sgx = 0.0f;
        for (memo_u32 j = threadIdx.x; j < width; j += blockDim.x) {
            const float xhat = (memo_bf16_to_f32(xr[j]) - mean) * rstd;
            const float g = memo_bf16_to_f32(dyr[j]) * memo_bf16_to_f32(scale[j]);
            sg += g;
            sgx += g * xhat;
        }
        const float mean_g = memo_block_sum(sg, shared) / (float)width;
        const float mean_gx = memo_block_sum(sgx, shared) / (float)width;
        for (memo_u32 j = threadIdx.x; j < width; j += blockDim.x) {
            const float xhat = (memo_bf16_to_f32(xr[j]) - mean) * rstd;
            const float g = memo_bf16_to_f32(dyr[j]) * memo_bf16_to_f32(scale[j]);
            dxr[j] = memo_f32_to_bf16(rstd * (g - mean_g - xhat * mean_gx));
        }
        if (threadIdx.x == 0) {
            stats[2 * row] = mean;
            stats[2 * row + 1] = rstd;
        }
    }
}

// Backward, stage 2: partial sums over row chunks of dscale (dy * xhat) and dshift (dy) per
// column, like memo_column_sum_partial: block (c, k), column j, rows of chunk k in order;
// dscale's partials at partial[k * width + j], dshift's at partial[(chunks + k) * width + j].
// memo_column_sum_finish then adds the chunks in order and rounds.
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(256)
memo_layer_norm_backward_params(const memo_bf16* x, const memo_bf16* dy, const float* stats, float* partial,
                                memo_u64 rows, memo_u32 width, memo_u64 rows_per_chunk) {
    const memo_u32 j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= width) {
        return;
    }
    const memo_u64 begin = (memo_u64)blockIdx.y * rows_per_chunk;
    const memo_u64 end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
    float ds = 0.0f, dsh = 0.0f;
    for (memo_u64 r = begin; r < end; ++r) {
        const float d = memo_bf16_to_f32(dy[r * width + j]);
        const float xhat = (memo_bf16_to_f32(x[r * width + j]) - stats[2 * r]) * stats[2 * r + 1];
        ds += d * xhat;
        dsh += d;
    }
    partial[(memo_u64)blockIdx.y * width + j] = ds;
    partial[((memo_u64)gridDim.y + blockIdx.y) * width + j] = dsh;
}

// 1 / sqrt(mean(x^2) + eps) of one row of `width` bf16.
__device__ __forceinline__ float memo_row_rstd(const memo_bf16* x, memo_u32 width, float eps, float* shared) {
    float q = 0.0f;
    for (memo_u32 j = threadIdx.x; j < width; j += blockDim.x) {
        const float v = memo_bf16_to_f32(x[j]);
        q += v * v;
    }
    return 1.0f / sqrtf(memo_block_sum(q, shared) / (float)width + eps);
}

// RMS norm: y = x * rstd * scale, per row.
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(256)
memo_rms_norm_forward(const memo_bf16* x, const memo_bf16* scale, memo_bf16* y, memo_u64 rows, memo_u32 width,
                      float eps) {
    __shared__ float shared[32];
    for (memo_u64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const memo_bf16* xr = x + row * width;
        memo_bf16* yr = y + row * width;
        const float rstd = memo_row_rstd(xr, width, eps, shared);
        for (memo_u32 j = threadIdx.x; j < width; j += blockDim.x) {
            yr[j] = memo_f32_to_bf16(memo_bf16_to_f32(xr[j]) * rstd * memo_bf16_to_f32(scale[j]));
        }
    }
}

// RMS norm backward, stage 1 (per row): with xhat = x * rstd and g = dy * scale,
// dx = rstd * (g - xhat * mean(g * xhat)); the row's rstd goes to stats[row] for stage 2.
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(256)
memo_rms_norm_backward_rows(const memo_bf16* x, const memo_bf16* scale, const memo_bf16* dy, memo_bf16* dx,
                            float* stats, memo_u64 rows, memo_u32 width, float eps) {
    __shared__ float shared[32];
    for (memo_u64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const memo_bf16* xr = x + row * width;
        const memo_bf16* dyr = dy + row * width;
        memo_bf16* dxr = dx + row * width;
        const float rstd = memo_row_rstd(xr, width, eps, shared);
        float sgx = 0.0f;
        for (memo_u32 j = threadIdx.x; j < width; j += blockDim.x) {
            const float xhat = memo_bf16_to_f32(xr[j]) * rstd;
            sgx += memo_bf16_to_f32(dyr[j]) * memo_bf16_to_f32(scale[j]) * xhat;
        }
        const float mean_gx = memo_block_sum(sgx, shared) / (float)width;
        for (memo_u32 j = threadIdx.x; j < width; j += blockDim.x) {
            const float xhat = memo_bf16_to_f32(xr[j]) * rstd;
            const float g = memo_bf16_to_f32(dyr[j]) * memo_bf16_to_f32(scale[j]);
            dxr[j] = memo_f32_to_bf16(rstd * (g - xhat * mean_gx));
        }
        if (threadIdx.x == 0) {
            stats[row] = rstd;
        }
    }
}

// RMS norm backward, stage 2: partial sums over row chunks of dscale (dy * x * rstd) per column,
// as memo_layer_norm_backward_params: block (c, k), column j, rows of chunk k in order, the
// partial at partial[k * width + j]; memo_column_sum_finish adds the chunks in order and rounds.
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(256)
memo_rms_norm_backward_params(const memo_bf16* x, const memo_bf16* dy, const float* stats, float* partial,
                              memo_u64 rows, memo_u32 width, memo_u64 rows_per_chunk) {
    const memo_u32 j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= width) {
        return;
    }
    const memo_u64 begin = (memo_u64)blockIdx.y * rows_per_chunk;
    const memo_u64 end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
    float ds = 0.0f;
    for (memo_u64 r = begin; r < end; ++r) {
        ds += memo_bf16_to_f32(dy[r * width + j]) * (memo_bf16_to_f32(x[r * width + j]) * stats[r]);
    }
    partial[(memo_u64)blockIdx.y * width + j] = ds;
}
