/* SPDX-License-Identifier: Apache-2.0 */
/* The fake driver of fake_cuda_gpus.c: FAKE_NDEV GPUs, GPU i with bus id
 * 0000:(18+i):00.0 and UUID bytes 0x10+i, granularity FAKE_GRAN. */
#ifndef GSHM_TESTS_FAKE_CUDA_GPUS_H
#define GSHM_TESTS_FAKE_CUDA_GPUS_H

#include <cuda.h>

#define FAKE_NDEV 2
#define FAKE_GRAN (2u << 20)
#define FAKE_GPU0_LOCATION "cuda:GPU-10101010-1010-1010-1010-101010101010"

/* The next call of the driver named fake_fail_call (then reset to NULL)
 * returns fake_fail_with. */
extern const char *fake_fail_call;
extern CUresult fake_fail_with;
/* Driver calls made that make, map, free or fail something. */
extern unsigned fake_calls;

#endif
