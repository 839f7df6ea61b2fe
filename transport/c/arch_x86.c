/*
 * arch_x86.c -- x86-64: the cache-line instructions (CLWB, CLFLUSHOPT, CLFLUSH),
 * each with a per-function target attribute, and cpu_init's choice among
 * them and among the copy kernels (kernels_x86.c) from CPUID.
 */
#include "internal.h"

#ifdef CXLKV_X86
#include <cpuid.h>

__attribute__((target("clwb"))) static void
flush_clwb(char *p, const char *end, uint64_t line)
{
    for (; p < end; p += line)
        _mm_clwb(p);
    _mm_sfence();
}

__attribute__((target("clflushopt"))) static void
flush_clflushopt(char *p, const char *end, uint64_t line)
{
    for (; p < end; p += line)
        _mm_clflushopt(p);
    _mm_sfence();
}

static void
flush_clflush(char *p, const char *end, uint64_t line)
{
    for (; p < end; p += line)
        _mm_clflush(p);
    _mm_sfence();
}

__attribute__((target("clflushopt"))) static void
invalidate_clflushopt(char *p, const char *end, uint64_t line)
{
    for (; p < end; p += line)
        _mm_clflushopt(p);
    _mm_mfence();
}

static void
invalidate_clflush(char *p, const char *end, uint64_t line)
{
    for (; p < end; p += line)
        _mm_clflush(p);
    _mm_mfence();
}

/* The same loops without the fence, for the non-coherent copies. */
__attribute__((target("clwb"))) static void
wb_clwb(const char *p, const char *end, uint64_t line)
{
    for (; p < end; p += line)
        _mm_clwb((void *)p);
}

__attribute__((target("clflushopt"))) static void
lines_clflushopt(const char *p, const char *end, uint64_t line)
{
    for (; p < end; p += line)
        _mm_clflushopt((void *)p);
}

static void
lines_clflush(const char *p, const char *end, uint64_t line)
{
    for (; p < end; p += line)
        _mm_clflush(p);
}


void
cpu_init(void)
{
    unsigned int a, b, c, d;
    int has_clflush = 0, has_clflushopt = 0, has_clwb = 0;

    if (__get_cpuid(1, &a, &b, &c, &d)) {
        has_clflush = (d >> 19) & 1;
        if (has_clflush && ((b >> 8) & 0xff) != 0)
            g_line_bytes = ((b >> 8) & 0xff) * 8u;
    }
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        has_clflushopt = (b >> 23) & 1;
        has_clwb = (b >> 24) & 1;
    }
    if (has_clwb) {
        g_flush_fn = flush_clwb;
        g_flush_name = "clwb";
    } else if (has_clflushopt) {
        g_flush_fn = flush_clflushopt;
        g_flush_name = "clflushopt";
    } else {
        /* CLFLUSH is part of SSE2, hence of every x86-64 CPU. */
        g_flush_fn = flush_clflush;
        g_flush_name = "clflush";
    }
    /* Every CPU with the REP MOVSB problem (FSRM: Zen 3+, Ice Lake+) has AVX2;
     * older ones keep glibc's memmove. */
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) { /* also checks the OS saves YMM state */
        g_copy_fn = copy_avx2;
        g_copy_kernel = "avx2";
        g_vector_min = CXLKV_VECTOR_MIN_BYTES;
        g_stream_threshold = CXLKV_STREAM_DEFAULT_BYTES;
    }
    if (has_clflushopt) {
        g_invalidate_fn = invalidate_clflushopt;
        g_invalidate_name = "clflushopt";
        g_drop_nf = lines_clflushopt;
    } else {
        g_invalidate_fn = invalidate_clflush;
        g_invalidate_name = "clflush";
        g_drop_nf = lines_clflush;
    }
    g_wb_nf = has_clwb ? wb_clwb : (has_clflushopt ? lines_clflushopt : lines_clflush);
    if (has_clflushopt && __builtin_cpu_supports("avx2") && g_line_bytes == 64)
        g_copy_drop_fn = copy_dropping_avx2;
    /* Non-coherent writes: AVX2 non-temporal stores where the CPU has AVX2 (the
     * AVX-512 and MOVDIR64B kernels measured no faster here: docs/transport.md),
     * else SSE2's (every x86-64). */
    if (__builtin_cpu_supports("avx2")) {
        g_stream_fn = stream_avx2;
        g_nc_write_name = "avx2-nt";
    } else {
        g_stream_fn = stream_sse2;
        g_nc_write_name = "sse2-nt";
    }
}

int
cpu_has(const char *name)
{
    unsigned int a, b, c, d;

    if (strcmp(name, "avx512-nt") == 0)
        return __builtin_cpu_supports("avx512f");
    if (strcmp(name, "avx2-nt") == 0)
        return __builtin_cpu_supports("avx2");
    if (strcmp(name, "movdir64b") == 0)
        return __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((c >> 28) & 1);
    return strcmp(name, "sse2-nt") == 0 || strcmp(name, "cached") == 0;
}

cxlkv_stream_fn
stream_kernel(const char *name)
{
    if (strcmp(name, "avx512-nt") == 0)
        return stream_avx512;
    if (strcmp(name, "avx2-nt") == 0)
        return stream_avx2;
    if (strcmp(name, "sse2-nt") == 0)
        return stream_sse2;
    if (strcmp(name, "movdir64b") == 0)
        return stream_movdir64b;
    return NULL;
}

void
cxlkv_fence(void)
{
    _mm_mfence();
}

#endif /* CXLKV_X86 */
