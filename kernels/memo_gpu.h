// memo_gpu.h: portability header for kernels compiled by NVRTC (MEMO_CUDA) and hiprtc (MEMO_HIP).
// Filled by the CUDA issue's work.
#pragma once
