// memo_gpu.h: the portability header every kernel in kernels/ includes first.
//
// One kernel source compiles with NVRTC (the options define MEMO_CUDA) and with hiprtc (MEMO_HIP);
// see memo_kernels::compile_options. What differs between the two lives here and nowhere else:
//   memo_bf16                bf16 storage type (2 bytes, the bits of the top half of an f32)
//   memo_bf16_to_f32(x)      widen
//   memo_f32_to_bf16(x)      round to nearest even (NaN stays NaN), as the CPU reference does
//   MEMO_WARP_SIZE           32 on NVIDIA, 64 on AMD (CDNA)
//   memo_shfl_xor(v, mask)   butterfly shuffle of a float across the whole warp
//   MEMO_LAUNCH_BOUNDS(n)    __launch_bounds__(n)
//   memo_u32 / memo_u64      fixed-width integers (hiprtc and NVRTC have no <stdint.h> by default)
// bf16 is handled as raw 16-bit patterns with our own conversions, so results do not depend on
// either vendor's bf16 header (and hiprtc of ROCm 5.x has none that works under hiprtc).
#pragma once

#if !defined(MEMO_CUDA) && !defined(MEMO_HIP)
#error "compile with -DMEMO_CUDA=1 (NVRTC) or -DMEMO_HIP=1 (hiprtc): see memo_kernels::compile_options"
#endif

typedef unsigned int memo_u32;
typedef unsigned long long memo_u64;
typedef unsigned short memo_bf16;

#if defined(MEMO_HIP)
// hiprtc defines __HIPCC_RTC__ and provides the device API itself; it can include only the
// headers handed to hiprtcCreateProgram (ROCm 5.x fails on this include), so only hipcc needs it.
#if !defined(__HIPCC_RTC__)
#include <hip/hip_runtime.h>
#endif
#define MEMO_WARP_SIZE 64
#define memo_shfl_xor(v, mask) __shfl_xor((v), (mask), MEMO_WARP_SIZE)
#else
#define MEMO_WARP_SIZE 32
#define memo_shfl_xor(v, mask) __shfl_xor_sync(0xffffffffu, (v), (mask), MEMO_WARP_SIZE)
#endif

#define MEMO_LAUNCH_BOUNDS(n) __launch_bounds__(n)

__device__ __forceinline__ float memo_bf16_to_f32(memo_bf16 x) {
    return __uint_as_float(((memo_u32)x) << 16);
}

__device__ __forceinline__ memo_bf16 memo_f32_to_bf16(float f) {
    memo_u32 bits = __float_as_uint(f);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        return (memo_bf16)((bits >> 16) | 0x0040u);  // quiet NaN
    }
    bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest, ties to even
    return (memo_bf16)(bits >> 16);
}

// Sum of `v` over the warp (every lane gets the total).
__device__ __forceinline__ float memo_warp_sum(float v) {
    for (int mask = MEMO_WARP_SIZE / 2; mask > 0; mask >>= 1) {
        v += memo_shfl_xor(v, mask);
    }
    return v;
}

// Maximum of `v` over the warp (every lane gets it).
__device__ __forceinline__ float memo_warp_max(float v) {
    for (int mask = MEMO_WARP_SIZE / 2; mask > 0; mask >>= 1) {
        v = fmaxf(v, memo_shfl_xor(v, mask));
    }
    return v;
}

// Sum of `v` over the block, returned to every thread. The block must be whole warps (the
// recipes use 256 or 1024 threads), `shared` must hold 32 floats (1024 / 32 warps at most).
// Deterministic: each warp's butterfly, then every thread adds the warp totals in warp order.
__device__ __forceinline__ float memo_block_sum(float v, float* shared) {
    v = memo_warp_sum(v);
    const unsigned lane = threadIdx.x % MEMO_WARP_SIZE;
    const unsigned warp = threadIdx.x / MEMO_WARP_SIZE;
    const unsigned warps = blockDim.x / MEMO_WARP_SIZE;
    __syncthreads();  // an earlier call's readers are done with `shared`
    if (lane == 0) {
        shared[warp] = v;
    }
    __syncthreads();
    float total = 0.0f;
    for (unsigned w = 0; w < warps; ++w) {
        total += shared[w];
    }
    return total;
}

// Maximum of `v` over the block, returned to every thread (same rules as memo_block_sum).
__device__ __forceinline__ float memo_block_max(float v, float* shared) {
    v = memo_warp_max(v);
    const unsigned lane = threadIdx.x % MEMO_WARP_SIZE;
    const unsigned warp = threadIdx.x / MEMO_WARP_SIZE;
    const unsigned warps = blockDim.x / MEMO_WARP_SIZE;
    __syncthreads();
    if (lane == 0) {
        shared[warp] = v;
    }
    __syncthreads();
    float total = shared[0];
    for (unsigned w = 1; w < warps; ++w) {
        total = fmaxf(total, shared[w]);
    }
    return total;
}

// Status words a kernel writes when its input is bad (the backend zeroes them at allocation,
// reads them at synchronize, and memo_kernels::status_error turns them into an error):
//   [0] code (MEMO_STATUS_*), [1] the plan instruction, [2] and [3] what the code says.
// The first failure wins (compare-and-swap on the code); later ones are dropped.
#define MEMO_STATUS_TOKEN_OUT_OF_RANGE 1u   // [2] row in the argument, [3] the id
#define MEMO_STATUS_TARGET_OUT_OF_RANGE 2u  // [2] row in the argument, [3] the id
#define MEMO_STATUS_NOT_FINITE 3u           // [2] the bits of the f32 value, [3] unused

// The double whose bits are `bits` (a kernel parameter that carries an f64 as a memo_u64, e.g.
// RoPE's base).
__device__ __forceinline__ double memo_f64_from_bits(memo_u64 bits) { return __longlong_as_double((long long)bits); }

// cos and sin of the rotary angle pos * inv_freq. The CPU takes sin/cos of the f64 angle and
// rounds to f32; here the angle is reduced modulo 2 pi in double (the angle reaches 1e6 rad at 1M
// tokens, so an f32 angle would be off by 0.06 rad) and sincosf runs on the reduced f32 angle:
// ~1 ulp of f32. Used by attention.cu (RoPE fused into the loads) and rope.cu (the cuDNN path).
__device__ __forceinline__ void memo_rope_cos_sin(memo_u32 pos, double inv_freq, float* c, float* sn) {
    const double two_pi_hi = 6.283185307179586;
    const double two_pi_lo = 2.4492935982947064e-16;
    const double angle = (double)pos * inv_freq;
    const double turns = rint(angle * (1.0 / 6.283185307179586));
    double reduced = fma(-turns, two_pi_hi, angle);
    reduced = fma(-turns, two_pi_lo, reduced);
    sincosf((float)reduced, sn, c);
}

__device__ __forceinline__ void memo_report(memo_u32* status, memo_u32 code, memo_u32 instruction, memo_u32 a,
                                            memo_u32 b) {
    if (atomicCAS(status, 0u, code) == 0u) {
        status[1] = instruction;
        status[2] = a;
        status[3] = b;
        __threadfence();
    }
}
