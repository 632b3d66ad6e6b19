// Per-element and per-row kernels: embedding lookup and its scatter-add, GeLU and its backward,
// the residual add, the bias broadcast of `linear`, and column sums (`linear`'s dbias).
// Arithmetic follows runtime-cpu/src/ops/elementwise.rs and linear.rs: bf16 storage, f32 math,
// one rounding per stored value. Every loop is grid-stride, so any row count works with any
// grid the recipe picks (memo_kernels::launch_steps).
#include "memo_gpu.h"

// GeLU, tanh approximation (runtime-cpu's GELU_C and GELU_A).
#define MEMO_GELU_C 0.7978846f
#define MEMO_GELU_A 0.044715f

__device__ __forceinline__ float memo_gelu(float x) {
    const float u = MEMO_GELU_C * (x + MEMO_GELU_A * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

__device__ __forceinline__ float memo_gelu_derivative(float x) {
    const float u = MEMO_GELU_C * (x + MEMO_GELU_A * x * x * x);
    const float t = tanhf(u);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * MEMO_GELU_C * (1.0f + 3.0f * MEMO_GELU_A * x * x);
}

// out[r] = embedding[tokens[r]] for `rows` rows of `width` bf16. An id >= vocab is reported
// (MEMO_STATUS_TOKEN_OUT_OF_RANGE) and its row written as zeros. One block per row.
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(256)
memo_embedding_forward(const memo_u32* tokens, const memo_bf16* embedding, memo_bf16* out, memo_u64 rows,
                       memo_u32 width, memo_u32 vocab, memo_u32* status, memo_u32 instruction) {
    for (memo_u64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const memo_u32 id = tokens[row];
        memo_bf16* dst = out + row * width;
        if (id >= vocab) {
            if (threadIdx.x == 0) {
                memo_report(status, MEMO_STATUS_TOKEN_OUT_OF_RANGE, instruction, (memo_u32)row, id);
            }
            for (memo_u32 j = threadIdx.x; j < width; j += blockDim.x) {
                dst[j] = 0;
            }
            continue;
        }
        const memo_bf16* src = embedding + (memo_u64)id * width;
        for (memo_u32 j = threadIdx.x; j < width; j += blockDim.x) {
            dst[j] = src[j];
        }
    }
}

// Columns of one thread in memo_embedding_backward (registers).
#define MEMO_EMB_COLS 8
// Tokens scanned per round of memo_embedding_backward (== its block size).
#define MEMO_EMB_TILE 256

// dembedding[tokens[r]] += dout[r], deterministic: block (v, c) owns vocabulary row v, columns
// [c * 256 * 8, (c + 1) * 256 * 8), and walks the tokens in row order, so each element's f32
// sum starts from the stored bf16 value and adds the rows of token v in row order, exactly as
// the CPU reference does; it is rounded once. No atomics. Cost: every block reads all tokens
// (vocab * rows compares; rounds without a match are skipped after one __syncthreads_count).
// Block (0, 0) also reports ids >= vocab. Block size must be MEMO_EMB_TILE.
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(MEMO_EMB_TILE)
memo_embedding_backward(const memo_u32* tokens, const memo_bf16* dout, memo_bf16* dembedding, memo_u64 rows,
                        memo_u32 width, memo_u32 vocab, memo_u32* status, memo_u32 instruction) {
    __shared__ memo_u32 tile[MEMO_EMB_TILE];
    const memo_u32 column0 = blockIdx.y * (MEMO_EMB_TILE * MEMO_EMB_COLS) + threadIdx.x;
    for (memo_u64 v = blockIdx.x; v < vocab; v += gridDim.x) {
        float sum[MEMO_EMB_COLS];
        memo_bf16* dst = dembedding + v * width;
#pragma unroll
        for (int c = 0; c < MEMO_EMB_COLS; ++c) {
            const memo_u32 j = column0 + c * MEMO_EMB_TILE;
            sum[c] = j < width ? memo_bf16_to_f32(dst[j]) : 0.0f;
        }
        for (memo_u64 base = 0; base < rows; base += MEMO_EMB_TILE) {
            const memo_u64 row = base + threadIdx.x;
            memo_u32 id = 0xffffffffu;
            if (row < rows) {
                id = tokens[row];
                if (id >= vocab && v == 0 && blockIdx.y == 0) {
                    memo_report(status, MEMO_STATUS_TOKEN_OUT_OF_RANGE, instruction, (memo_u32)row, id);
                }
            }
            __syncthreads();  // the previous round's readers are done with `tile`
            tile[threadIdx.x] = id;
            const int matches = __syncthreads_count(id == (memo_u32)v);
            if (matches == 0) {
                continue;
            }
            const memo_u64 count = rows - base < MEMO_EMB_TILE ? rows - base : MEMO_EMB_TILE;
            for (memo_u64 t = 0; t < count; ++t) {
                if (tile[t] != (memo_u32)v) {
                    continue;
                }
                const memo_bf16* src = dout + (base + t) * width;
#pragma unroll
                for (int c = 0; c < MEMO_EMB_COLS; ++c) {
                    const memo_u32 j = column0 + c * MEMO_EMB_TILE;
                    if (j < width) {
                        sum[c] += memo_bf16_to_f32(src[j]);
                    }
                }
            }
        }
#pragma unroll
        for (int c = 0; c < MEMO_EMB_COLS; ++c) {
            const memo_u32 j = column0 + c * MEMO_EMB_TILE;
            if (j < width) {
                dst[j] = memo_f32_to_bf16(sum[c]);
            }
        }
        __syncthreads();  // `tile` is reused by the next vocabulary row
    }
}

// y = gelu(x) over n elements.
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(256)
memo_gelu_forward(const memo_bf16* x, memo_bf16* y, memo_u64 n) {
    for (memo_u64 i = (memo_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (memo_u64)gridDim.x * blockDim.x) {
        y[i] = memo_f32_to_bf16(memo_gelu(memo_bf16_to_f32(x[i])));
    }
}

// dx = dy * gelu'(x) over n elements.
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(256)
memo_gelu_backward(const memo_bf16* x, const memo_bf16* dy, memo_bf16* dx, memo_u64 n) {
    for (memo_u64 i = (memo_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (memo_u64)gridDim.x * blockDim.x) {
        dx[i] = memo_f32_to_bf16(memo_bf16_to_f32(dy[i]) * memo_gelu_derivative(memo_bf16_to_f32(x[i])));
    }
}

// SwiGLU: x rows are [gate | up] (2 * width bf16), y rows width bf16: y = silu(gate) * up with
// silu(g) = g / (1 + exp(-g)), in f32, one rounding (runtime-cpu's formula). One thread per
// output element, grid-stride.
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(256)
memo_swiglu_forward(const memo_bf16* x, memo_bf16* y, memo_u64 rows, memo_u32 width) {
    const memo_u64 n = rows * width;
    for (memo_u64 i = (memo_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (memo_u64)gridDim.x * blockDim.x) {
        const memo_u64 row = i / width, j = i % width;
        const float g = memo_bf16_to_f32(x[row * 2 * width + j]);
        const float u = memo_bf16_to_f32(x[row * 2 * width + width + j]);
        y[i] = memo_f32_to_bf16(g / (1.0f + expf(-g)) * u);
    }
}

// SwiGLU backward: dx rows [dgate | dup] with s = sigmoid(g) = 1 / (1 + exp(-g)),
// dgate = dy * up * s * (1 + g * (1 - s)), dup = dy * silu(g), f32, one rounding each.
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(256)
memo_swiglu_backward(const memo_bf16* x, const memo_bf16* dy, memo_bf16* dx, memo_u64 rows, memo_u32 width) {
    const memo_u64 n = rows * width;
    for (memo_u64 i = (memo_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (memo_u64)gridDim.x * blockDim.x) {
        const memo_u64 row = i / width, j = i % width;
        const float g = memo_bf16_to_f32(x[row * 2 * width + j]);
        const float u = memo_bf16_to_f32(x[row * 2 * width + width + j]);
        const float d = memo_bf16_to_f32(dy[i]);
        const float s = 1.0f / (1.0f + expf(-g));
        dx[row * 2 * width + j] = memo_f32_to_bf16(d * u * s * (1.0f + g * (1.0f - s)));
        dx[row * 2 * width + width + j] = memo_f32_to_bf16(d * (g / (1.0f + expf(-g))));
    }
}

// y = a + b over n elements.
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(256)
memo_add(const memo_bf16* a, const memo_bf16* b, memo_bf16* y, memo_u64 n) {
    for (memo_u64 i = (memo_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (memo_u64)gridDim.x * blockDim.x) {
        y[i] = memo_f32_to_bf16(memo_bf16_to_f32(a[i]) + memo_bf16_to_f32(b[i]));
    }
}

// y[r][j] = row[j] for `rows` rows of `width` bf16: `linear` writes its bias into y, then the
// GEMM adds x W^T with beta = 1, so y = round(x W^T + bias) is rounded once, as on the CPU.
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(256)
memo_broadcast_row(const memo_bf16* row, memo_bf16* y, memo_u64 rows, memo_u32 width) {
    const memo_u64 n = rows * width;
    for (memo_u64 i = (memo_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (memo_u64)gridDim.x * blockDim.x) {
        y[i] = row[i % width];
    }
}

// y[r][j] = round(y[r][j] + bias[j]) (f32 sum) for `rows` rows of `width` bf16: `add_bias`,
// after `linear_no_bias` and the all-reduce of its partial sums (t > 1), as on the CPU.
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(256)
memo_add_bias(const memo_bf16* bias, memo_bf16* y, memo_u64 rows, memo_u32 width) {
    const memo_u64 n = rows * width;
    for (memo_u64 i = (memo_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (memo_u64)gridDim.x * blockDim.x) {
        y[i] = memo_f32_to_bf16(memo_bf16_to_f32(y[i]) + memo_bf16_to_f32(bias[i % width]));
    }
}

// Column sums, stage 1: block (c, k) sums column j = c * blockDim.x + threadIdx.x of rows
// [k * rows_per_chunk, min((k + 1) * rows_per_chunk, rows)) in row order into
// partial[k * width + j] (f32). Threads of a warp read adjacent columns (coalesced).
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(256)
memo_column_sum_partial(const memo_bf16* src, float* partial, memo_u64 rows, memo_u32 width,
                        memo_u64 rows_per_chunk) {
    const memo_u32 j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= width) {
        return;
    }
    const memo_u64 begin = (memo_u64)blockIdx.y * rows_per_chunk;
    const memo_u64 end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
    float sum = 0.0f;
    for (memo_u64 r = begin; r < end; ++r) {
        sum += memo_bf16_to_f32(src[r * width + j]);
    }
    partial[(memo_u64)blockIdx.y * width + j] = sum;
}

// Column sums, stage 2: dst[j] = round(sum over k in order of partial[k * width + j]).
extern "C" __global__ void MEMO_LAUNCH_BOUNDS(256)
memo_column_sum_finish(const float* partial, memo_bf16* dst, memo_u32 chunks, memo_u32 width) {
    const memo_u32 j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= width) {
        return;
    }
    float sum = 0.0f;
    for (memo_u32 k = 0; k < chunks; ++k) {
        sum += partial[(memo_u64)k * width + j];
    }
    dst[j] = memo_f32_to_bf16(sum);
}
