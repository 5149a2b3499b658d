/* The kernel paths this CPU runs, scalar first (the reference the others must equal). */
#ifndef MP_TEST_KERNEL_PATHS_H
#define MP_TEST_KERNEL_PATHS_H
#include "kernels.h"

static int kernel_paths(const mpk_impl *paths[4]) {
    int n = 0;
    paths[n++] = mpk_select(MPK_SCALAR);
    if (mpk_select(MPK_AVX2)) paths[n++] = mpk_select(MPK_AVX2);
    if (mpk_select(MPK_AVX512VBMI)) paths[n++] = mpk_select(MPK_AVX512VBMI);
    if (mpk_select(MPK_AVX512AMX)) paths[n++] = mpk_select(MPK_AVX512AMX);
    return n;
}
#endif
