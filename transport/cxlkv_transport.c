/*
 * cxlkv_transport.c -- map a CXL region and move bytes in and out of it.
 *
 * See cxlkv_transport.h for the contract of each function. Built by cffi
 * (transport/build_transport.py) into cxlkv.transport._transport; cffi
 * releases the GIL around every call, so nothing here may touch Python.
 *
 * Portability: builds for any x86-64 (no -march): the CLWB and CLFLUSHOPT
 * paths are compiled with per-function target attributes and chosen at load
 * time from CPUID. aarch64 uses DC CVAC / DC CIVAC; other architectures get
 * fences only (and report "none").
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "cxlkv_transport.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#define CXLKV_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

/* xxHash (vendored, third_party/xxhash): on x86 the AVX2/AVX-512 variants of
 * XXH3_64bits_update are chosen at run time by xxh_x86dispatch.c. The state
 * type is used on the stack, hence XXH_STATIC_LINKING_ONLY. */
#define XXH_STATIC_LINKING_ONLY
#if defined(__x86_64__)
#include "xxh_x86dispatch.h"
#else
#include "xxhash.h"
#endif

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux >= 5.14; older kernels answer EINVAL */
#endif

/* ------------------------------------------------------------------------ */
/* Run-time CPU dispatch                                                     */
/* ------------------------------------------------------------------------ */

typedef void (*cxlkv_lines_fn)(char *start, const char *end, uint64_t line);

static uint64_t g_line_bytes = 64;
static cxlkv_lines_fn g_flush_fn;
static cxlkv_lines_fn g_invalidate_fn;
static const char *g_flush_name = "none";
static const char *g_invalidate_name = "none";
static volatile int g_ready;

/* Copies of >= g_vector_min bytes use the AVX2 kernels where cpu_init found them. */
typedef void (*cxlkv_copy_fn)(char *dst, const char *src, size_t n, int stream);

static cxlkv_copy_fn g_copy_fn;
static const char *g_copy_kernel = "memmove";
static size_t g_vector_min = SIZE_MAX;
static size_t g_stream_threshold = SIZE_MAX;

#define CXLKV_VECTOR_MIN_BYTES ((size_t)512)
#define CXLKV_STREAM_DEFAULT_BYTES ((size_t)16 << 20)

/*
 * Non-coherent ("flush" mode) copies: see "Non-coherent copies" below.
 * g_stream_fn writes whole lines with non-temporal stores (dst 64-aligned,
 * n a multiple of 64, no fence); NULL: none known, the cached copy + write-back
 * path is used. g_wb_nf / g_drop_nf write back / drop lines WITHOUT a fence.
 */
typedef void (*cxlkv_stream_fn)(char *dst, const char *src, size_t n, int back);
typedef void (*cxlkv_lines_nf_fn)(const char *start, const char *end, uint64_t line);

static cxlkv_stream_fn g_stream_fn;
static const char *g_nc_write_name = "cached";
static cxlkv_lines_nf_fn g_wb_nf;
static cxlkv_lines_nf_fn g_drop_nf;
static size_t g_nc_chunk = (size_t)128 << 10;
/* copy + drop the next chunk's lines, mixed (NULL: drop, then copy_plain) */
typedef void (*cxlkv_copy_drop_fn)(char *dst, const char *src, size_t n, int stream,
                                   const char *drop, const char *drop_end);
static cxlkv_copy_drop_fn g_copy_drop_fn;

#define CXLKV_NC_CHUNK_MIN_BYTES ((size_t)256)

/* Test-only event trace of the non-coherent kernels (cxlkv_nc_trace_start):
 * three words per event (kind, start address, end address). */
static uint64_t *g_trace;
static uint64_t g_trace_cap, g_trace_n;

static void
nc_trace_add(uint64_t kind, const void *a, const void *b)
{
    if (g_trace_n < g_trace_cap) {
        uint64_t *e = g_trace + 3 * g_trace_n;
        e[0] = kind;
        e[1] = (uint64_t)(uintptr_t)a;
        e[2] = (uint64_t)(uintptr_t)b;
    }
    g_trace_n++;
}

#define NC_TRACE(kind, a, b)                                   \
    do {                                                       \
        if (__builtin_expect(g_trace != NULL, 0))              \
            nc_trace_add((kind), (const void *)(a), (const void *)(b)); \
    } while (0)

#ifdef CXLKV_X86
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

/* Orders the write-backs and non-temporal stores before every later store. */
static inline void
nc_store_fence_hw(void)
{
    _mm_sfence();
}

/* Between dropping lines and loading them: loads cannot pass an earlier
 * MFENCE, and MFENCE cannot pass an earlier CLFLUSH/CLFLUSHOPT (Intel SDM
 * Vol. 3A, 9.2.2 "Memory Ordering in P6 and More Recent Processor Families").
 * SFENCE and LFENCE do not order a later load after CLFLUSHOPT. */
static inline void
nc_load_fence_hw(void)
{
    _mm_mfence();
}

/*
 * Copy kernels (AVX2), used for non-overlapping copies of at least
 * CXLKV_VECTOR_MIN_BYTES. Why not glibc's memmove (2.36) for these:
 *
 *  - from a few KiB it uses REP MOVSB, which AMD Zen runs at 2.5 GB/s when
 *    source and destination are not mutually aligned -- a page-aligned region
 *    offset against a malloc'ed buffer at 16 mod 64, i.e. most copy_out calls
 *    into numpy arrays; these loops run at 40-90 GB/s there;
 *  - it chooses non-temporal stores from the L3 size the CPU reports; VMs that
 *    report a huge L3 keep cached stores up to hundreds of MiB (half the
 *    bandwidth from 16 MiB on) and a 4-page loop that falls to 4.5 GB/s on
 *    mutually misaligned buffers.
 *
 * Direction: a load whose address matches a still-buffered store in bits
 * 11..0 waits for it ("4K aliasing"). Copying forwards, that happens when the
 * destination is a little ahead of the source modulo 4 KiB, so those copies
 * run backwards (measured: 20 -> 33 GB/s for 1 MiB at dst - src = 16 mod 4096).
 *
 * Cached ("vec") kernels: one unaligned vector at each end, unaligned loads
 * and aligned stores in between. Streaming ("nt") kernels: non-temporal
 * aligned stores that bypass the cache, then SFENCE, for copies past the
 * stream threshold (the data is bound for another host or a device, not for
 * this core's cache).
 */
static inline int
copy_backwards(const char *dst, const char *src)
{
    size_t k = ((uintptr_t)dst - (uintptr_t)src) & 4095;

    return k != 0 && k < 2048;
}

#define LOADU(p) _mm256_loadu_si256((const __m256i *)(p))
#define STOREU(p, v) _mm256_storeu_si256((__m256i *)(p), (v))
#define STORE(p, v) _mm256_store_si256((__m256i *)(p), (v))
#define STREAM(p, v) _mm256_stream_si256((__m256i *)(p), (v))

__attribute__((target("avx2"))) static void
vec_forward(char *dst, const char *src, size_t n)
{
    size_t head = (32 - ((uintptr_t)dst & 31)) & 31, i;
    __m256i first = LOADU(src), last = LOADU(src + n - 32);

    dst += head;
    src += head;
    n -= head;
    for (i = 0; i + 128 <= n; i += 128) {
        __m256i v0 = LOADU(src + i), v1 = LOADU(src + i + 32);
        __m256i v2 = LOADU(src + i + 64), v3 = LOADU(src + i + 96);
        STORE(dst + i, v0);
        STORE(dst + i + 32, v1);
        STORE(dst + i + 64, v2);
        STORE(dst + i + 96, v3);
    }
    for (; i + 32 <= n; i += 32)
        STORE(dst + i, LOADU(src + i));
    STOREU(dst - head, first);
    STOREU(dst + n - 32, last);
}

__attribute__((target("avx2"))) static void
vec_backward(char *dst, const char *src, size_t n)
{
    size_t i = n - ((uintptr_t)(dst + n) & 31); /* dst + i is 32-aligned */
    __m256i first = LOADU(src), last = LOADU(src + n - 32);

    while (i >= 128) {
        __m256i v0, v1, v2, v3;
        i -= 128;
        v3 = LOADU(src + i + 96);
        v2 = LOADU(src + i + 64);
        v1 = LOADU(src + i + 32);
        v0 = LOADU(src + i);
        STORE(dst + i + 96, v3);
        STORE(dst + i + 64, v2);
        STORE(dst + i + 32, v1);
        STORE(dst + i, v0);
    }
    while (i >= 32) {
        i -= 32;
        STORE(dst + i, LOADU(src + i));
    }
    STOREU(dst + n - 32, last);
    STOREU(dst, first);
}

__attribute__((target("avx2"))) static void
nt_forward(char *dst, const char *src, size_t n)
{
    size_t head = (64 - ((uintptr_t)dst & 63)) & 63, i;

    memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    for (i = 0; i + 128 <= n; i += 128) {
        __m256i v0 = LOADU(src + i), v1 = LOADU(src + i + 32);
        __m256i v2 = LOADU(src + i + 64), v3 = LOADU(src + i + 96);
        STREAM(dst + i, v0);
        STREAM(dst + i + 32, v1);
        STREAM(dst + i + 64, v2);
        STREAM(dst + i + 96, v3);
    }
    _mm_sfence();
    memcpy(dst + i, src + i, n - i);
}

__attribute__((target("avx2"))) static void
nt_backward(char *dst, const char *src, size_t n)
{
    size_t tail = (uintptr_t)(dst + n) & 63, i;

    memcpy(dst + n - tail, src + n - tail, tail);
    i = n - tail; /* dst + i is 64-aligned */
    while (i >= 128) {
        __m256i v0, v1, v2, v3;
        i -= 128;
        v3 = LOADU(src + i + 96);
        v2 = LOADU(src + i + 64);
        v1 = LOADU(src + i + 32);
        v0 = LOADU(src + i);
        STREAM(dst + i + 96, v3);
        STREAM(dst + i + 64, v2);
        STREAM(dst + i + 32, v1);
        STREAM(dst + i, v0);
    }
    _mm_sfence();
    memcpy(dst, src, i);
}

/*
 * Line-streaming kernels for non-coherent writes: dst 64-byte aligned, n a
 * multiple of 64, no overlap, NO fence (the caller issues one SFENCE per call).
 * Non-temporal stores to write-back memory go through write-combining buffers
 * straight to memory and evict the line from every cache level if it was
 * present (Intel SDM Vol. 1, 10.4.6.2 "Caching of Temporal vs. Non-Temporal
 * Data"); SFENCE then makes them globally visible before any later store.
 * `back`: run from the end (4K aliasing, see copy_backwards).
 */
__attribute__((target("avx2"))) static void
stream_avx2(char *dst, const char *src, size_t n, int back)
{
    size_t i;

    if (!back) {
        for (i = 0; i + 128 <= n; i += 128) {
            __m256i v0 = LOADU(src + i), v1 = LOADU(src + i + 32);
            __m256i v2 = LOADU(src + i + 64), v3 = LOADU(src + i + 96);
            STREAM(dst + i, v0);
            STREAM(dst + i + 32, v1);
            STREAM(dst + i + 64, v2);
            STREAM(dst + i + 96, v3);
        }
        if (i < n) {
            __m256i v0 = LOADU(src + i), v1 = LOADU(src + i + 32);
            STREAM(dst + i, v0);
            STREAM(dst + i + 32, v1);
        }
        return;
    }
    i = n;
    if (i & 64) {
        __m256i v0, v1;
        i -= 64;
        v1 = LOADU(src + i + 32);
        v0 = LOADU(src + i);
        STREAM(dst + i + 32, v1);
        STREAM(dst + i, v0);
    }
    while (i >= 128) {
        __m256i v0, v1, v2, v3;
        i -= 128;
        v3 = LOADU(src + i + 96);
        v2 = LOADU(src + i + 64);
        v1 = LOADU(src + i + 32);
        v0 = LOADU(src + i);
        STREAM(dst + i + 96, v3);
        STREAM(dst + i + 64, v2);
        STREAM(dst + i + 32, v1);
        STREAM(dst + i, v0);
    }
}

#define LOAD512(p) _mm512_loadu_si512((const void *)(p))
#define STREAM512(p, v) _mm512_stream_si512((void *)(p), (v))

/* One 64-byte store per line: a write-combining buffer fills in one instruction. */
__attribute__((target("avx512f"))) static void
stream_avx512(char *dst, const char *src, size_t n, int back)
{
    size_t i;

    if (!back) {
        for (i = 0; i + 256 <= n; i += 256) {
            __m512i v0 = LOAD512(src + i), v1 = LOAD512(src + i + 64);
            __m512i v2 = LOAD512(src + i + 128), v3 = LOAD512(src + i + 192);
            STREAM512(dst + i, v0);
            STREAM512(dst + i + 64, v1);
            STREAM512(dst + i + 128, v2);
            STREAM512(dst + i + 192, v3);
        }
        for (; i < n; i += 64)
            STREAM512(dst + i, LOAD512(src + i));
        return;
    }
    i = n;
    while (i & 255) {
        i -= 64;
        STREAM512(dst + i, LOAD512(src + i));
    }
    while (i >= 256) {
        __m512i v0, v1, v2, v3;
        i -= 256;
        v3 = LOAD512(src + i + 192);
        v2 = LOAD512(src + i + 128);
        v1 = LOAD512(src + i + 64);
        v0 = LOAD512(src + i);
        STREAM512(dst + i + 192, v3);
        STREAM512(dst + i + 128, v2);
        STREAM512(dst + i + 64, v1);
        STREAM512(dst + i, v0);
    }
}

#undef LOAD512
#undef STREAM512

/* SSE2 (every x86-64 CPU): the portable x86 streaming kernel. */
static void
stream_sse2(char *dst, const char *src, size_t n, int back)
{
    size_t i;

    (void)back; /* forwards only: the fallback kernel keeps to the simple loop */
    for (i = 0; i < n; i += 64) {
        __m128i v0 = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i v1 = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i v2 = _mm_loadu_si128((const __m128i *)(src + i + 32));
        __m128i v3 = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), v0);
        _mm_stream_si128((__m128i *)(dst + i + 16), v1);
        _mm_stream_si128((__m128i *)(dst + i + 32), v2);
        _mm_stream_si128((__m128i *)(dst + i + 48), v3);
    }
}

/* MOVDIR64B: one 64-byte direct store per line (weakly ordered like
 * non-temporal stores, ordered by SFENCE; Intel SDM Vol. 2, MOVDIR64B). */
__attribute__((target("movdir64b"))) static void
stream_movdir64b(char *dst, const char *src, size_t n, int back)
{
    size_t i;

    (void)back;
    for (i = 0; i < n; i += 64)
        _movdir64b(dst + i, src + i);
}

/*
 * The read pipeline's inner loop (x86, AVX2 + CLFLUSHOPT): copy [src, src+n)
 * to dst forwards and, one per 64 bytes copied, drop the lines of [drop,
 * drop_end) (the next chunk) -- mixing the drops into the copy rather than
 * issuing them all before it keeps them from filling the store buffer ahead of
 * the loads, so the two overlap. dst is brought to a 64-byte boundary with a
 * head copy; `stream`: non-temporal stores for the body, then SFENCE. No
 * closing MFENCE (nc_read issues it). n >= 128.
 */
/* each drop traced line by line (tests check the lines the loop really drops) */
#define CLFLUSHOPT_TRACED(p)                                   \
    do {                                                       \
        NC_TRACE(CXLKV_NC_EV_DROP, (p), (p) + 64);             \
        _mm_clflushopt((void *)(p));                           \
    } while (0)

__attribute__((target("avx2,clflushopt"))) static void
copy_dropping_avx2(char *dst, const char *src, size_t n, int stream, const char *drop,
                   const char *drop_end)
{
    size_t head = (64 - ((uintptr_t)dst & 63)) & 63, i;

    memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    /* the drops run from the end of [drop, drop_end) down (drop is on a line;
     * drop_end rounded up to one): walking up beside the loads, a drop would
     * sit a power-of-two chunk ahead of each load, at the same address modulo
     * 4 KiB (4K aliasing, see copy_backwards) */
    drop_end = (const char *)(((uintptr_t)drop_end + 63) & ~(uintptr_t)63);
    if (stream) {
        for (i = 0; i + 64 <= n; i += 64) {
            __m256i v0 = LOADU(src + i), v1 = LOADU(src + i + 32);
            if (drop_end > drop) {
                drop_end -= 64;
                CLFLUSHOPT_TRACED(drop_end);
            }
            STREAM(dst + i, v0);
            STREAM(dst + i + 32, v1);
        }
        _mm_sfence();
    } else {
        for (i = 0; i + 64 <= n; i += 64) {
            __m256i v0 = LOADU(src + i), v1 = LOADU(src + i + 32);
            if (drop_end > drop) {
                drop_end -= 64;
                CLFLUSHOPT_TRACED(drop_end);
            }
            STORE(dst + i, v0);
            STORE(dst + i + 32, v1);
        }
    }
    memcpy(dst + i, src + i, n - i);
    while (drop_end > drop) {
        drop_end -= 64;
        CLFLUSHOPT_TRACED(drop_end);
    }
}

#undef CLFLUSHOPT_TRACED

#undef LOADU
#undef STOREU
#undef STORE
#undef STREAM

/* Non-overlapping, n >= CXLKV_VECTOR_MIN_BYTES (>= 128, so the loops' end vectors exist). */
static void
copy_avx2(char *dst, const char *src, size_t n, int stream)
{
    int back = copy_backwards(dst, src);

    if (stream)
        (back ? nt_backward : nt_forward)(dst, src, n);
    else
        (back ? vec_backward : vec_forward)(dst, src, n);
}

static void
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

static int
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

static cxlkv_stream_fn
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

#elif defined(__aarch64__)

static void
flush_dc_cvac(char *p, const char *end, uint64_t line)
{
    for (; p < end; p += line)
        __asm__ volatile("dc cvac, %0" : : "r"(p) : "memory");
    __asm__ volatile("dsb ish" : : : "memory");
}

static void
invalidate_dc_civac(char *p, const char *end, uint64_t line)
{
    for (; p < end; p += line)
        __asm__ volatile("dc civac, %0" : : "r"(p) : "memory");
    __asm__ volatile("dsb ish" : : : "memory");
}

static void
lines_dc_cvac(const char *p, const char *end, uint64_t line)
{
    for (; p < end; p += line)
        __asm__ volatile("dc cvac, %0" : : "r"(p) : "memory");
}

static void
lines_dc_civac(const char *p, const char *end, uint64_t line)
{
    for (; p < end; p += line)
        __asm__ volatile("dc civac, %0" : : "r"(p) : "memory");
}

/* DSB waits for the cache maintenance before it and orders every later access. */
static inline void
nc_store_fence_hw(void)
{
    __asm__ volatile("dsb ish" : : : "memory");
}

static inline void
nc_load_fence_hw(void)
{
    __asm__ volatile("dsb ish" : : : "memory");
}

static int
cpu_has(const char *name)
{
    return strcmp(name, "cached") == 0;
}

static cxlkv_stream_fn
stream_kernel(const char *name)
{
    (void)name;
    return NULL;
}

static void
cpu_init(void)
{
    uint64_t ctr;

    /* CTR_EL0.DminLine (bits 19:16): log2 of the smallest D-cache line in words. */
    __asm__ volatile("mrs %0, ctr_el0" : "=r"(ctr));
    g_line_bytes = 4u << ((ctr >> 16) & 0xf);
    g_flush_fn = flush_dc_cvac;
    g_flush_name = "dc cvac";
    g_invalidate_fn = invalidate_dc_civac;
    g_invalidate_name = "dc civac";
    g_wb_nf = lines_dc_cvac;
    g_drop_nf = lines_dc_civac;
}

void
cxlkv_fence(void)
{
    __asm__ volatile("dmb ish" : : : "memory");
}

#else /* no user-space cache maintenance known: fences only */

static void
lines_fence_only(char *p, const char *end, uint64_t line)
{
    (void)p;
    (void)end;
    (void)line;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

static void
lines_none(const char *p, const char *end, uint64_t line)
{
    (void)p;
    (void)end;
    (void)line;
}

static inline void
nc_store_fence_hw(void)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

static inline void
nc_load_fence_hw(void)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

static int
cpu_has(const char *name)
{
    return strcmp(name, "cached") == 0;
}

static cxlkv_stream_fn
stream_kernel(const char *name)
{
    (void)name;
    return NULL;
}

static void
cpu_init(void)
{
    g_flush_fn = lines_fence_only;
    g_invalidate_fn = lines_fence_only;
    g_wb_nf = lines_none;
    g_drop_nf = lines_none;
}

void
cxlkv_fence(void)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
#endif

__attribute__((constructor)) static void
cxlkv_init(void)
{
    cpu_init();
    g_ready = 1;
}

static inline void
ensure_ready(void)
{
    if (__builtin_expect(!g_ready, 0))
        cxlkv_init(); /* idempotent; only reached if constructors did not run */
}

uint64_t
cxlkv_cache_line_bytes(void)
{
    ensure_ready();
    return g_line_bytes;
}

uint64_t
cxlkv_page_bytes(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (uint64_t)p : 4096u;
}

const char *
cxlkv_flush_instruction(void)
{
    ensure_ready();
    return g_flush_name;
}

const char *
cxlkv_invalidate_instruction(void)
{
    ensure_ready();
    return g_invalidate_name;
}

uint64_t
cxlkv_stream_threshold_bytes(void)
{
    ensure_ready();
    return g_stream_threshold == SIZE_MAX ? 0 : (uint64_t)g_stream_threshold;
}

void
cxlkv_set_stream_threshold_bytes(uint64_t bytes)
{
    ensure_ready();
    if (g_copy_fn == NULL || bytes == 0)
        g_stream_threshold = SIZE_MAX;
    else
        g_stream_threshold = bytes < 4096 ? 4096 : (size_t)bytes;
}

const char *
cxlkv_copy_kernel(void)
{
    ensure_ready();
    return g_copy_kernel;
}

/*
 * memmove semantics. Non-overlapping copies of >= g_vector_min bytes take the
 * copy kernel (streaming from g_stream_threshold bytes), the rest memmove.
 */
static inline void
copy_bytes(void *dst, const void *src, size_t n)
{
    if (n >= g_vector_min) {
        uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
        if (d + n <= s || s + n <= d) {
            g_copy_fn((char *)dst, (const char *)src, n, n >= g_stream_threshold);
            return;
        }
    }
    memmove(dst, src, n);
}

/* The non-coherent primitives, traced (cxlkv_nc_trace_start). */
static inline void
nc_store_fence(void)
{
    NC_TRACE(CXLKV_NC_EV_SFENCE, 0, 0);
    nc_store_fence_hw();
}

static inline void
nc_load_fence(void)
{
    NC_TRACE(CXLKV_NC_EV_MFENCE, 0, 0);
    nc_load_fence_hw();
}

static inline void
nc_wb(const char *a, const char *b)
{
    NC_TRACE(CXLKV_NC_EV_WB, a, b);
    g_wb_nf(a, b, g_line_bytes);
}

static inline void
nc_drop(const char *a, const char *b)
{
    NC_TRACE(CXLKV_NC_EV_DROP, a, b);
    g_drop_nf(a, b, g_line_bytes);
}

int
cxlkv_nc_trace_start(uint64_t *events, uint64_t capacity)
{
    if (events == NULL && capacity != 0)
        return CXLKV_E_INVAL;
    g_trace_n = 0;
    g_trace_cap = capacity;
    __atomic_store_n(&g_trace, events, __ATOMIC_RELEASE);
    return CXLKV_OK;
}

uint64_t
cxlkv_nc_trace_stop(void)
{
    __atomic_store_n(&g_trace, (uint64_t *)NULL, __ATOMIC_RELEASE);
    return g_trace_n;
}

const char *
cxlkv_nc_write_kernel(void)
{
    ensure_ready();
    return g_nc_write_name;
}

int
cxlkv_set_nc_write_kernel(const char *name)
{
    static const char *const names[] = {"avx512-nt", "avx2-nt", "sse2-nt", "movdir64b"};
    size_t i;

    ensure_ready();
    if (name == NULL || !cpu_has(name))
        return CXLKV_E_INVAL;
    g_stream_fn = stream_kernel(name);
    g_nc_write_name = "cached"; /* a static string: `name` is the caller's */
    for (i = 0; g_stream_fn != NULL && i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i]) == 0)
            g_nc_write_name = names[i];
    return CXLKV_OK;
}

uint64_t
cxlkv_nc_read_chunk_bytes(void)
{
    ensure_ready();
    return (uint64_t)g_nc_chunk;
}

void
cxlkv_set_nc_read_chunk_bytes(uint64_t bytes)
{
    ensure_ready();
    if (bytes == 0)
        g_nc_chunk = 0;
    else if (bytes < CXLKV_NC_CHUNK_MIN_BYTES)
        g_nc_chunk = CXLKV_NC_CHUNK_MIN_BYTES;
    else
        g_nc_chunk = (size_t)(bytes > ((uint64_t)1 << 40) ? ((uint64_t)1 << 40) : bytes) & ~(size_t)63;
}

/* ------------------------------------------------------------------------ */
/* Non-coherent copies (the `nc` argument; cxlkv_transport.h)               */
/* ------------------------------------------------------------------------ */
/*
 * WRITES (nc_write_nf + one nc_store_fence per call). Whole destination lines
 * are written with non-temporal stores (g_stream_fn): they bypass the caches
 * and evict the line where it was cached, so nothing of them stays in this
 * host's caches. Only the partial lines at either end are written through the
 * cache (a non-temporal store of part of a line would need the rest of the
 * line from the source, which is not ours); those one or two lines are written
 * back (CLWB, else CLFLUSHOPT/CLFLUSH). The one SFENCE at the end of the call
 * orders both the streaming stores and the write-backs before every later
 * store -- the put's object header and the PutEnd / index publication that
 * follow -- which is the writer's half of the discipline (as cached stores +
 * CLWB + SFENCE give; PMDK's pmem_memcpy does the same for persistent memory).
 * Cost: one pass over the bytes instead of a copy plus a write-back pass over
 * every line.
 *
 * READS (nc_read). The source is cut into chunks (the first may start
 * mid-line; the others start on a line; 16 KiB, then doubling up to
 * g_nc_chunk, 128 KiB). For chunk k:
 *
 *     drop the lines of chunk k+1          (CLFLUSHOPT, no fence)
 *     copy chunk k                         (loads of chunk k)
 *     MFENCE
 *
 * where on x86 with AVX2 the drops are mixed into the copy loop, one per 64
 * bytes copied (copy_dropping_avx2): issued all before the copy, a chunk's
 * CLFLUSHOPTs fill the store buffer and hold the loads back (measured: no gain
 * over the two-pass read); spread out, they overlap.
 * with chunk 0 dropped and fenced before the loop. Why no stale line can be
 * read: every line of chunk k+1 had its CLFLUSHOPT issued before the MFENCE
 * that precedes chunk k+1's loads in program order; MFENCE does not complete
 * before earlier CLFLUSHOPTs have (the line is then invalid in every cache
 * level of this coherence domain), and loads do not pass an earlier MFENCE
 * (SDM Vol. 3A 9.2.2). So each load of chunk k+1 misses every line this host
 * had cached before the call and reads memory. A line brought back in between
 * (a hardware prefetch while chunk k is copied, chunk k's own loads of a line
 * shared with chunk k+1) is filled from memory after the reader learned of the
 * object, i.e. after the writer's SFENCE: it holds the published bytes. The
 * drops of chunk k+1 overlap the copy of chunk k (CLFLUSHOPT is not ordered
 * with the loads and stores of other lines), so the range is walked once;
 * the MFENCE per chunk waits for that chunk's stores and drops to complete,
 * which is why chunks grow (few fences on a long range) from a short first one
 * (whose drop overlaps nothing). The last fence is skipped when nothing follows. On aarch64 the same pipeline
 * uses DC CIVAC and DSB ISH.
 */

#define NC_LINE_DOWN(p) ((const char *)((uintptr_t)(p) & ~(uintptr_t)(g_line_bytes - 1)))

static inline int
disjoint(const void *a, const void *b, uint64_t n)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x + n <= y || y + n <= x;
}

/* A cached copy (non-overlapping): the vector kernel from g_vector_min bytes. */
static inline void
copy_plain(char *dst, const char *src, size_t n, int stream)
{
    if (n >= g_vector_min)
        g_copy_fn(dst, src, n, stream);
    else if (n != 0)
        memcpy(dst, src, n);
}

/* Non-coherent write of [dst, dst+n) (memmove semantics), without the closing
 * store fence: the caller issues nc_store_fence() once for all its writes. */
static void
nc_write_nf(char *dst, const char *src, size_t n)
{
    uintptr_t d = (uintptr_t)dst, a, b;

    if (n == 0)
        return;
    a = (d + 63) & ~(uintptr_t)63; /* first whole line */
    b = (d + n) & ~(uintptr_t)63;  /* end of the last whole line */
    if (g_stream_fn == NULL || b <= a || !disjoint(dst, src, n)) {
        /* no streaming kernel, no whole line, or an overlapping source: through
         * the cache, then every line written back */
        NC_TRACE(CXLKV_NC_EV_STORE, dst, dst + n);
        memmove(dst, src, n);
        nc_wb(NC_LINE_DOWN(dst), dst + n);
        return;
    }
    if (a > d) {
        NC_TRACE(CXLKV_NC_EV_STORE, dst, a);
        memcpy(dst, src, a - d);
        nc_wb(NC_LINE_DOWN(dst), (const char *)a);
    }
    NC_TRACE(CXLKV_NC_EV_STREAM, a, b);
    g_stream_fn((char *)a, src + (a - d), b - a, copy_backwards((char *)a, src + (a - d)));
    if (d + n > b) {
        NC_TRACE(CXLKV_NC_EV_STORE, b, dst + n);
        memcpy((char *)b, src + (b - d), d + n - b);
        nc_wb((const char *)b, dst + n);
    }
}

/*
 * Chunk sizes: the first chunk of a range is at most CXLKV_NC_FIRST_CHUNK_BYTES
 * (its drop cannot overlap a copy, so it is kept short), each next one twice
 * the one before, up to g_nc_chunk (fewer fences on long ranges).
 */
#define CXLKV_NC_FIRST_CHUNK_BYTES ((size_t)16 << 10)

static inline size_t
nc_first_chunk(void)
{
    return g_nc_chunk < CXLKV_NC_FIRST_CHUNK_BYTES ? g_nc_chunk : CXLKV_NC_FIRST_CHUNK_BYTES;
}

static inline size_t
nc_next_chunk(size_t size)
{
    return size >= g_nc_chunk / 2 ? g_nc_chunk : 2 * size;
}

/* The end of the read chunk of `size` bytes that starts at p (p < end): on a
 * line boundary, or end. */
static inline const char *
nc_chunk_end(const char *p, const char *end, size_t size)
{
    uintptr_t q;

    if (g_nc_chunk == 0) /* two-pass mode: the whole range is one chunk */
        return end;
    q = ((uintptr_t)p + size) & ~(uintptr_t)63;
    return q >= (uintptr_t)end ? end : (const char *)q;
}

/* Drop the lines of the first chunk of [p, p+n) (no fence). */
static inline void
nc_drop_first(const char *p, size_t n)
{
    nc_drop(NC_LINE_DOWN(p), nc_chunk_end(p, p + n, nc_first_chunk()));
}

/*
 * Non-coherent read of [src, src+n) into dst (non-overlapping), pipelined as
 * described above. `primed`: the first chunk's lines were dropped and fenced
 * already (by the previous range's `next`). `next`/`next_n`: the range read
 * after this one: its first chunk is dropped before this range's last chunk
 * is copied, and fenced before returning (the caller passes primed = 1 then).
 * With `st`, each chunk is hashed right after its copy: dst when `hash_dst`,
 * else the source chunk just loaded (the same bytes: see copy_hashed).
 */
static void
nc_read(char *dst, const char *src, size_t n, int stream, XXH3_state_t *st, int hash_dst,
        int primed, const char *next, size_t next_n)
{
    const char *p = src, *end = src + n;

    if (n == 0) {
        if (next != NULL && next_n != 0) {
            nc_drop_first(next, next_n);
            nc_load_fence();
        }
        return;
    }
    if (!primed) {
        nc_drop_first(p, n);
        nc_load_fence();
    }
    size_t size = nc_first_chunk();

    while (p < end) {
        const char *q = nc_chunk_end(p, end, size), *da = NULL, *db = NULL;
        char *d = dst + (p - src);
        size_t len = (size_t)(q - p);
        int more = 1;

        if (q < end) {
            size = nc_next_chunk(size);
            da = q; /* on a line */
            db = nc_chunk_end(q, end, size);
        } else if (next != NULL && next_n != 0) {
            da = NC_LINE_DOWN(next);
            db = nc_chunk_end(next, next + next_n, nc_first_chunk());
        } else {
            more = 0;
        }
        if (g_copy_drop_fn != NULL && len >= 128 && !copy_backwards(d, p)) {
            /* the drops of the next chunk (every line of [da, db)) mixed into
             * this chunk's copy; all before the fence below, as above (the
             * kernel traces each drop it issues) */
            NC_TRACE(CXLKV_NC_EV_LOAD, p, q);
            g_copy_drop_fn(d, p, len, stream, da != NULL ? da : q, da != NULL ? db : q);
        } else {
            if (da != NULL)
                nc_drop(da, db);
            NC_TRACE(CXLKV_NC_EV_LOAD, p, q);
            copy_plain(d, p, len, stream);
        }
        if (st != NULL) {
            if (!hash_dst)
                NC_TRACE(CXLKV_NC_EV_LOAD, p, q);
            (void)XXH3_64bits_update(st, hash_dst ? dst + (p - src) : p, (size_t)(q - p));
        }
        if (more)
            nc_load_fence(); /* the drops above, before the next chunk's loads */
        p = q;
    }
}

/* ------------------------------------------------------------------------ */
/* Mapping                                                                   */
/* ------------------------------------------------------------------------ */

/* Read one unsigned decimal or 0x-hex integer from a sysfs file. */
static int
read_sysfs_u64(const char *path, uint64_t *value)
{
    char buf[64];
    char *end;
    ssize_t n;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0)
        return -1;
    n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) {
        errno = n == 0 ? EIO : errno;
        return -1;
    }
    buf[n] = '\0';
    errno = 0;
    *value = strtoull(buf, &end, 0);
    if (errno != 0 || end == buf) {
        errno = errno ? errno : EINVAL;
        return -1;
    }
    return 0;
}

/*
 * Size and alignment of the DAX device behind char device `st`:
 * /sys/dev/char/MAJ:MIN links to the device directory whose name (daxX.Y)
 * is looked up in /sys/bus/dax/devices/. A char device without that entry
 * is not a DAX device.
 */
static int
dax_geometry(const struct stat *st, uint64_t *size, uint64_t *align, int *err)
{
    char link[64], target[PATH_MAX], path[PATH_MAX + 64];
    const char *name;
    ssize_t n;

    snprintf(link, sizeof link, "/sys/dev/char/%u:%u", major(st->st_rdev),
             minor(st->st_rdev));
    n = readlink(link, target, sizeof target - 1);
    if (n < 0)
        return CXLKV_E_NOT_MAPPABLE;
    target[n] = '\0';
    name = strrchr(target, '/');
    name = name ? name + 1 : target;

    snprintf(path, sizeof path, "/sys/bus/dax/devices/%s/size", name);
    if (read_sysfs_u64(path, size) != 0) {
        if (errno == ENOENT)
            return CXLKV_E_NOT_MAPPABLE;
        *err = errno;
        return CXLKV_E_SYSFS;
    }
    snprintf(path, sizeof path, "/sys/bus/dax/devices/%s/align", name);
    if (read_sysfs_u64(path, align) != 0 || *align == 0)
        *align = CXLKV_DAX_ALIGN_BYTES; /* kernels before 5.10 have no align file */
    return CXLKV_OK;
}

int
cxlkv_map(const char *path, uint64_t want_size_bytes, int create,
          cxlkv_region_t *out, int *err_errno)
{
    struct stat st;
    uint64_t size = 0, align = cxlkv_page_bytes();
    int fd, rc = CXLKV_OK, is_dax = 0, created = 0;
    void *base;

    if (err_errno == NULL || out == NULL || path == NULL)
        return CXLKV_E_INVAL;
    *err_errno = 0;
    memset(out, 0, sizeof *out);
    if (create && want_size_bytes == 0)
        return CXLKV_E_INVAL;

    fd = open(path, O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0660);
    if (fd < 0) {
        *err_errno = errno;
        return CXLKV_E_OPEN;
    }
    if (fstat(fd, &st) != 0) {
        *err_errno = errno;
        rc = CXLKV_E_STAT;
        goto out_close;
    }
    if (S_ISREG(st.st_mode)) {
        size = (uint64_t)st.st_size;
        if (size == 0 && create) {
            if (want_size_bytes > (uint64_t)INT64_MAX ||
                ftruncate(fd, (off_t)want_size_bytes) != 0) {
                *err_errno = want_size_bytes > (uint64_t)INT64_MAX ? EFBIG : errno;
                rc = CXLKV_E_TRUNCATE;
                goto out_close;
            }
            size = want_size_bytes;
            created = 1;
        }
    } else if (S_ISCHR(st.st_mode)) {
        rc = dax_geometry(&st, &size, &align, err_errno);
        if (rc != CXLKV_OK)
            goto out_close;
        is_dax = 1;
    } else {
        rc = CXLKV_E_NOT_MAPPABLE;
        goto out_close;
    }

    out->size_bytes = size;
    out->align_bytes = align;
    out->is_dax = is_dax;
    out->created = created;
    if (size == 0) {
        rc = CXLKV_E_SIZE_ZERO;
        goto out_close;
    }
    if (want_size_bytes != 0 && size != want_size_bytes) {
        rc = CXLKV_E_SIZE_MISMATCH;
        goto out_close;
    }
    if (is_dax && size % align != 0) {
        rc = CXLKV_E_ALIGN;
        goto out_close;
    }
    if (size > (uint64_t)SIZE_MAX) {
        rc = CXLKV_E_TOO_LARGE;
        goto out_close;
    }
    base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        *err_errno = errno;
        rc = CXLKV_E_MMAP;
        goto out_close;
    }
    out->base = base;

out_close:
    close(fd); /* the mapping keeps the file referenced */
    return rc;
}

int
cxlkv_unmap(cxlkv_region_t *r, int *err_errno)
{
    *err_errno = 0;
    if (r == NULL)
        return CXLKV_E_INVAL;
    if (r->base == NULL)
        return CXLKV_OK;
    if (munmap(r->base, (size_t)r->size_bytes) != 0) {
        *err_errno = errno;
        return CXLKV_E_MMAP;
    }
    r->base = NULL;
    r->size_bytes = 0;
    return CXLKV_OK;
}

int
cxlkv_retire(cxlkv_region_t *r, int *err_errno)
{
    void *p;

    *err_errno = 0;
    if (r == NULL)
        return CXLKV_E_INVAL;
    if (r->base == NULL)
        return CXLKV_OK;
    p = mmap(r->base, (size_t)r->size_bytes, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        *err_errno = errno;
        return CXLKV_E_MMAP;
    }
    r->base = NULL;
    r->size_bytes = 0;
    return CXLKV_OK;
}

/* ------------------------------------------------------------------------ */
/* Copies                                                                    */
/* ------------------------------------------------------------------------ */

/* [offset, offset+length) inside [0, size); never computes offset+length. */
static inline int
in_bounds(uint64_t size, uint64_t offset, uint64_t length)
{
    return offset <= size && length <= size - offset;
}

static inline int
check(const cxlkv_region_t *r, uint64_t offset, uint64_t length)
{
    if (__builtin_expect(r == NULL || r->base == NULL, 0))
        return CXLKV_E_CLOSED;
    if (__builtin_expect(!in_bounds(r->size_bytes, offset, length), 0))
        return CXLKV_E_RANGE;
    return CXLKV_OK;
}

/*
 * One non-coherent copy out of the region (nc_read's `primed`/`next`); whether
 * the next range is primed on return. A destination overlapping the source (a
 * view of the region) is served by drop, fence, memmove.
 */
static int
nc_copy_out_one(char *dst, const char *src, size_t n, int primed, const char *next,
                size_t next_n)
{
    if (!disjoint(dst, src, n)) {
        nc_drop(NC_LINE_DOWN(src), src + n);
        nc_load_fence();
        NC_TRACE(CXLKV_NC_EV_LOAD, src, src + n);
        memmove(dst, src, n);
        return 0;
    }
    nc_read(dst, src, n, n >= g_stream_threshold, NULL, 0, primed, next, next_n);
    return next != NULL && next_n != 0;
}

int
cxlkv_copy_in(const cxlkv_region_t *r, uint64_t offset, const void *src,
              uint64_t length, int nc)
{
    int rc = check(r, offset, length);

    if (rc != CXLKV_OK)
        return rc;
    if (length != 0) {
        if (src == NULL)
            return CXLKV_E_INVAL;
        if (nc) {
            nc_write_nf((char *)r->base + offset, src, (size_t)length);
            nc_store_fence();
        } else {
            copy_bytes((char *)r->base + offset, src, (size_t)length);
        }
    }
    return CXLKV_OK;
}

int
cxlkv_copy_out(const cxlkv_region_t *r, uint64_t offset, void *dst,
               uint64_t length, int nc)
{
    int rc = check(r, offset, length);

    if (rc != CXLKV_OK)
        return rc;
    if (length != 0) {
        if (dst == NULL)
            return CXLKV_E_INVAL;
        if (nc)
            (void)nc_copy_out_one(dst, (const char *)r->base + offset, (size_t)length, 0, NULL, 0);
        else
            copy_bytes(dst, (const char *)r->base + offset, (size_t)length);
    }
    return CXLKV_OK;
}

/*
 * Chunked copy + xxh3 (see the header). Each chunk is hashed right after its
 * copy, while the side being hashed is still in this core's cache (chunks are
 * half of a 512 KiB L2). Below the stream threshold the copy uses cached
 * stores and copy_out hashes the destination; from the threshold on the copy
 * streams (non-temporal stores bypass the cache), so copy_out hashes the
 * source chunk it has just loaded instead -- the same bytes: the reader holds
 * a lease (the extent cannot change) and, in flush mode, invalidated the range
 * before the copy, so both loads see memory's bytes. Measured on the 2-vCPU
 * EPYC VM, 16 MiB: hashing a cached-store destination ran at 9-10 GB/s,
 * streaming + hashing the source at 13-15 GB/s (memcpy 15-17 GB/s).
 */
/* `nc` here: a non-coherent write (src -> region; reads use nc_read_hashed),
 * fenced at the end (1) or left to the caller's one fence for a batch (2). */
static int
copy_hashed(char *dst, const char *src, uint64_t length, int hash_dst, int nc,
            uint64_t *hash_out)
{
    XXH3_state_t state;
    uint64_t done = 0;
    int stream = length >= g_stream_threshold;

    if (stream)
        hash_dst = 0;
    if (XXH3_64bits_reset(&state) != XXH_OK)
        return CXLKV_E_INVAL;
    while (done < length) {
        uint64_t n = length - done;
        if (n > CXLKV_HASH_CHUNK_BYTES) {
            n = CXLKV_HASH_CHUNK_BYTES;
            if (nc) /* non-coherent writes: chunks end on a destination line */
                n -= (uint64_t)((uintptr_t)(dst + done + n) & 63);
        }
        if (nc)
            nc_write_nf(dst + done, src + done, (size_t)n);
        else if (n >= g_vector_min)
            g_copy_fn(dst + done, src + done, (size_t)n, stream);
        else
            memmove(dst + done, src + done, (size_t)n);
        XXH3_64bits_update(&state, (hash_dst ? dst : src) + done, (size_t)n);
        done += n;
    }
    if (nc == 1) /* 2: the caller fences once for its batch */
        nc_store_fence();
    *hash_out = XXH3_64bits_digest(&state);
    return CXLKV_OK;
}

/*
 * copy_hashed's non-coherent read (region -> dst): nc_read, each chunk hashed
 * after its copy -- dst below the stream threshold, the source chunk just
 * loaded from it on (see copy_hashed). `primed`/`next` as nc_read.
 */
static uint64_t
nc_read_hashed(char *dst, const char *src, uint64_t length, int primed, const char *next,
               size_t next_n)
{
    XXH3_state_t state;
    int stream = length >= g_stream_threshold;

    if (!stream && length <= CXLKV_HASH_CHUNK_BYTES) {
        /* small: copy, then one-shot hash of dst while it is in cache */
        nc_read(dst, src, (size_t)length, 0, NULL, 0, primed, next, next_n);
        return XXH3_64bits(length != 0 ? (const void *)dst : (const void *)"", (size_t)length);
    }
    (void)XXH3_64bits_reset(&state);
    nc_read(dst, src, (size_t)length, stream, &state, !stream, primed, next, next_n);
    return XXH3_64bits_digest(&state);
}

int
cxlkv_copy_in_hashed(const cxlkv_region_t *r, uint64_t offset, const void *src,
                     uint64_t length, uint64_t *hash_out, int nc)
{
    int rc = check(r, offset, length);
    char *dst;

    if (rc != CXLKV_OK)
        return rc;
    if (hash_out == NULL || (length != 0 && src == NULL))
        return CXLKV_E_INVAL;
    dst = (char *)r->base + offset;
    if (!disjoint(dst, src, length))
        return CXLKV_E_INVAL;
    return copy_hashed(dst, (const char *)src, length, 0, nc, hash_out);
}

int
cxlkv_copy_out_hashed(const cxlkv_region_t *r, uint64_t offset, void *dst,
                      uint64_t length, uint64_t *hash_out, int nc)
{
    int rc = check(r, offset, length);
    const char *src;

    if (rc != CXLKV_OK)
        return rc;
    if (hash_out == NULL || (length != 0 && dst == NULL))
        return CXLKV_E_INVAL;
    src = (const char *)r->base + offset;
    if (!disjoint(dst, src, length))
        return CXLKV_E_INVAL;
    if (nc) {
        *hash_out = nc_read_hashed((char *)dst, src, length, 0, NULL, 0);
        return CXLKV_OK;
    }
    return copy_hashed((char *)dst, src, length, 1, 0, hash_out);
}

uint64_t
cxlkv_xxh3_64(const void *buf, uint64_t length)
{
    return XXH3_64bits(buf, (size_t)length);
}

/* The first i >= from with lengths[i] != 0, else n. */
static inline uint64_t
next_nonempty(const uint64_t *lengths, uint64_t n, uint64_t from)
{
    while (from < n && lengths[from] == 0)
        from++;
    return from;
}

static int
check_many(const cxlkv_region_t *r, uint64_t n, const uint64_t *offsets,
           const void *const *ptrs, const uint64_t *lengths, uint64_t *bad_index)
{
    uint64_t i;

    *bad_index = 0;
    if (r == NULL || r->base == NULL)
        return CXLKV_E_CLOSED;
    if (n != 0 && (offsets == NULL || ptrs == NULL || lengths == NULL))
        return CXLKV_E_INVAL;
    for (i = 0; i < n; i++) {
        if (!in_bounds(r->size_bytes, offsets[i], lengths[i])) {
            *bad_index = i;
            return CXLKV_E_RANGE;
        }
        if (lengths[i] != 0 && ptrs[i] == NULL) {
            *bad_index = i;
            return CXLKV_E_INVAL;
        }
    }
    return CXLKV_OK;
}

int
cxlkv_copy_in_many(const cxlkv_region_t *r, uint64_t n,
                   const uint64_t *offsets, const void *const *srcs,
                   const uint64_t *lengths, uint64_t *bad_index, int nc)
{
    char *base;
    uint64_t i;
    int rc;

    if (bad_index == NULL)
        return CXLKV_E_INVAL;
    rc = check_many(r, n, offsets, srcs, lengths, bad_index);
    if (rc != CXLKV_OK)
        return rc;
    base = (char *)r->base;
    if (nc) {
        for (i = 0; i < n; i++)
            nc_write_nf(base + offsets[i], srcs[i], (size_t)lengths[i]);
        nc_store_fence();
        return CXLKV_OK;
    }
    for (i = 0; i < n; i++)
        if (lengths[i] != 0)
            copy_bytes(base + offsets[i], srcs[i], (size_t)lengths[i]);
    return CXLKV_OK;
}

int
cxlkv_copy_out_many(const cxlkv_region_t *r, uint64_t n,
                    const uint64_t *offsets, void *const *dsts,
                    const uint64_t *lengths, uint64_t *bad_index, int nc)
{
    const char *base;
    uint64_t i;
    int rc;

    if (bad_index == NULL)
        return CXLKV_E_INVAL;
    rc = check_many(r, n, offsets, (const void *const *)dsts, lengths, bad_index);
    if (rc != CXLKV_OK)
        return rc;
    base = (const char *)r->base;
    if (nc) {
        int primed = 0;

        for (i = next_nonempty(lengths, n, 0); i < n;) {
            uint64_t j = next_nonempty(lengths, n, i + 1);
            primed = nc_copy_out_one((char *)dsts[i], base + offsets[i], (size_t)lengths[i], primed,
                                     j < n ? base + offsets[j] : NULL, j < n ? (size_t)lengths[j] : 0);
            i = j;
        }
        return CXLKV_OK;
    }
    for (i = 0; i < n; i++)
        if (lengths[i] != 0)
            copy_bytes(dsts[i], base + offsets[i], (size_t)lengths[i]);
    return CXLKV_OK;
}

static int
check_ranges(const cxlkv_region_t *r, const void *buf, uint64_t buf_bytes,
             uint64_t n, const uint64_t *buf_offsets,
             const uint64_t *region_offsets, const uint64_t *lengths,
             uint64_t *bad_index)
{
    uint64_t i;

    *bad_index = 0;
    if (r == NULL || r->base == NULL)
        return CXLKV_E_CLOSED;
    if (n != 0 && (buf_offsets == NULL || region_offsets == NULL || lengths == NULL))
        return CXLKV_E_INVAL;
    if (buf == NULL && buf_bytes != 0)
        return CXLKV_E_INVAL;
    for (i = 0; i < n; i++) {
        if (!in_bounds(r->size_bytes, region_offsets[i], lengths[i]) ||
            !in_bounds(buf_bytes, buf_offsets[i], lengths[i])) {
            *bad_index = i;
            return CXLKV_E_RANGE;
        }
    }
    return CXLKV_OK;
}

int
cxlkv_copy_in_ranges(const cxlkv_region_t *r, const void *buf,
                     uint64_t buf_bytes, uint64_t n,
                     const uint64_t *buf_offsets,
                     const uint64_t *region_offsets, const uint64_t *lengths,
                     uint64_t *bad_index, int nc)
{
    char *base;
    uint64_t i;
    int rc;

    if (bad_index == NULL)
        return CXLKV_E_INVAL;
    rc = check_ranges(r, buf, buf_bytes, n, buf_offsets, region_offsets,
                      lengths, bad_index);
    if (rc != CXLKV_OK)
        return rc;
    base = (char *)r->base;
    if (nc) {
        for (i = 0; i < n; i++)
            nc_write_nf(base + region_offsets[i], (const char *)buf + buf_offsets[i],
                        (size_t)lengths[i]);
        nc_store_fence();
        return CXLKV_OK;
    }
    for (i = 0; i < n; i++)
        if (lengths[i] != 0)
            copy_bytes(base + region_offsets[i], (const char *)buf + buf_offsets[i],
                       (size_t)lengths[i]);
    return CXLKV_OK;
}

int
cxlkv_copy_out_ranges(const cxlkv_region_t *r, void *buf, uint64_t buf_bytes,
                      uint64_t n, const uint64_t *buf_offsets,
                      const uint64_t *region_offsets, const uint64_t *lengths,
                      uint64_t *bad_index, int nc)
{
    const char *base;
    uint64_t i;
    int rc;

    if (bad_index == NULL)
        return CXLKV_E_INVAL;
    rc = check_ranges(r, buf, buf_bytes, n, buf_offsets, region_offsets,
                      lengths, bad_index);
    if (rc != CXLKV_OK)
        return rc;
    base = (const char *)r->base;
    if (nc) {
        int primed = 0;

        for (i = next_nonempty(lengths, n, 0); i < n;) {
            uint64_t j = next_nonempty(lengths, n, i + 1);
            primed = nc_copy_out_one((char *)buf + buf_offsets[i], base + region_offsets[i],
                                     (size_t)lengths[i], primed,
                                     j < n ? base + region_offsets[j] : NULL,
                                     j < n ? (size_t)lengths[j] : 0);
            i = j;
        }
        return CXLKV_OK;
    }
    for (i = 0; i < n; i++)
        if (lengths[i] != 0)
            copy_bytes((char *)buf + buf_offsets[i], base + region_offsets[i],
                       (size_t)lengths[i]);
    return CXLKV_OK;
}

/*
 * Both hashed range copies: `out` copies region -> buf and hashes what lands in
 * buf, else buf -> region hashing the source. Overlapping sides are refused
 * before any byte moves (the hash would be of bytes the copy overwrote).
 */
static int
copy_ranges_hashed(const cxlkv_region_t *r, char *buf, uint64_t buf_bytes,
                   uint64_t n, const uint64_t *buf_offsets,
                   const uint64_t *region_offsets, const uint64_t *lengths,
                   uint64_t *hashes_out, uint64_t *bad_index, int out, int nc)
{
    char *base;
    uint64_t i;
    int rc;

    if (bad_index == NULL || (n != 0 && hashes_out == NULL))
        return CXLKV_E_INVAL;
    rc = check_ranges(r, buf, buf_bytes, n, buf_offsets, region_offsets,
                      lengths, bad_index);
    if (rc != CXLKV_OK)
        return rc;
    base = (char *)r->base;
    for (i = 0; i < n; i++) {
        if (!disjoint(buf + buf_offsets[i], base + region_offsets[i], lengths[i])) {
            *bad_index = i;
            return CXLKV_E_INVAL;
        }
    }
    if (nc && out) {
        int primed = 0;

        for (i = 0; i < n; i++) /* empty ranges: the hash of no bytes */
            if (lengths[i] == 0)
                hashes_out[i] = XXH3_64bits("", 0);
        for (i = next_nonempty(lengths, n, 0); i < n;) {
            uint64_t j = next_nonempty(lengths, n, i + 1);
            const char *nx = j < n ? base + region_offsets[j] : NULL;
            size_t nn = j < n ? (size_t)lengths[j] : 0;

            hashes_out[i] = nc_read_hashed(buf + buf_offsets[i], base + region_offsets[i],
                                           lengths[i], primed, nx, nn);
            primed = nx != NULL && nn != 0;
            i = j;
        }
        return CXLKV_OK;
    }
    for (i = 0; i < n; i++) {
        char *b = buf + buf_offsets[i];
        char *reg = base + region_offsets[i];
        char *dst = out ? b : reg;
        const char *src = out ? reg : b;
        if (lengths[i] > CXLKV_HASH_CHUNK_BYTES) {
            /* large: the chunked kernel keeps each hashed chunk in cache */
            rc = copy_hashed(dst, src, lengths[i], out, nc ? 2 : 0, &hashes_out[i]);
            if (rc != CXLKV_OK) {
                *bad_index = i;
                return rc;
            }
            continue;
        }
        if (nc)
            nc_write_nf(dst, src, (size_t)lengths[i]);
        else if (lengths[i] != 0)
            copy_bytes(dst, src, (size_t)lengths[i]);
        hashes_out[i] = XXH3_64bits(b, (size_t)lengths[i]);
    }
    if (nc)
        nc_store_fence();
    return CXLKV_OK;
}

int
cxlkv_copy_out_ranges_hashed(const cxlkv_region_t *r, void *buf,
                             uint64_t buf_bytes, uint64_t n,
                             const uint64_t *buf_offsets,
                             const uint64_t *region_offsets,
                             const uint64_t *lengths, uint64_t *hashes_out,
                             uint64_t *bad_index, int nc)
{
    return copy_ranges_hashed(r, (char *)buf, buf_bytes, n, buf_offsets, region_offsets,
                              lengths, hashes_out, bad_index, 1, nc);
}

int
cxlkv_copy_in_ranges_hashed(const cxlkv_region_t *r, const void *buf,
                            uint64_t buf_bytes, uint64_t n,
                            const uint64_t *buf_offsets,
                            const uint64_t *region_offsets,
                            const uint64_t *lengths, uint64_t *hashes_out,
                            uint64_t *bad_index, int nc)
{
    /* buf is only read: copy_ranges_hashed writes to the region when !out */
    return copy_ranges_hashed(r, (char *)buf, buf_bytes, n, buf_offsets, region_offsets,
                              lengths, hashes_out, bad_index, 0, nc);
}

/* Object header layout (cxlkv/objheader.py): little-endian fields. */
#define OBJ_HEADER_BYTES 64
#define OBJ_FIELDS_BYTES 56
#define OBJ_FORMAT_VERSION 1
#define OBJ_MAX_KEY_BYTES 4096

static inline uint64_t
load_u64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v); /* x86-64 and aarch64 Linux are little-endian */
    return v;
}

static inline uint32_t
load_u32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static int
header_ok(const unsigned char *h, const char *key, uint64_t key_len,
          uint64_t header_bytes, uint64_t version, uint64_t value_len,
          uint64_t value_hash)
{
    XXH3_state_t state;
    uint32_t klen;

    if (memcmp(h, "CXLKVOB1", 8) != 0)
        return 0;
    if ((uint32_t)h[8] + ((uint32_t)h[9] << 8) != OBJ_FORMAT_VERSION)
        return 0;
    klen = load_u32(h + 12);
    if (klen < 1 || klen > OBJ_MAX_KEY_BYTES || klen != key_len)
        return 0;
    if (load_u32(h + 48) != header_bytes ||
        header_bytes != OBJ_HEADER_BYTES + (((uint64_t)klen + 63) & ~(uint64_t)63))
        return 0;
    if (memcmp(h + OBJ_HEADER_BYTES, key, (size_t)klen) != 0)
        return 0;
    if (load_u64(h + 16) != XXH3_64bits(key, (size_t)klen))
        return 0;
    if (load_u64(h + 24) != version || load_u64(h + 32) != value_len ||
        load_u64(h + 40) != value_hash)
        return 0;
    if (klen <= 448) {
        /* short keys: one-shot over a copy (the streaming state costs more than the hash) */
        unsigned char buf[OBJ_FIELDS_BYTES + 448];
        memcpy(buf, h, OBJ_FIELDS_BYTES);
        memcpy(buf + OBJ_FIELDS_BYTES, h + OBJ_HEADER_BYTES, klen);
        return XXH3_64bits(buf, OBJ_FIELDS_BYTES + (size_t)klen) == load_u64(h + OBJ_FIELDS_BYTES);
    }
    if (XXH3_64bits_reset(&state) != XXH_OK ||
        XXH3_64bits_update(&state, h, OBJ_FIELDS_BYTES) != XXH_OK ||
        XXH3_64bits_update(&state, h + OBJ_HEADER_BYTES, (size_t)klen) != XXH_OK)
        return 0;
    return XXH3_64bits_digest(&state) == load_u64(h + OBJ_FIELDS_BYTES);
}

static inline void
store_u64(unsigned char *p, uint64_t v)
{
    memcpy(p, &v, sizeof v);
}

static inline void
store_u32(unsigned char *p, uint32_t v)
{
    memcpy(p, &v, sizeof v);
}

/* The checks both header batches start with (no pointer dereferenced per item yet). */
static int
header_args(const cxlkv_region_t *r, uint64_t n, const uint64_t *extent_offsets,
            const uint64_t *header_bytes, const char *keys, uint64_t keys_bytes,
            const uint64_t *key_offsets, const uint64_t *key_lens,
            const uint64_t *versions, const uint64_t *value_lens,
            const uint64_t *value_hashes, uint64_t *bad_index)
{
    if (bad_index == NULL)
        return CXLKV_E_INVAL;
    *bad_index = 0;
    if (r == NULL || r->base == NULL)
        return CXLKV_E_CLOSED;
    if (n != 0 && (extent_offsets == NULL || header_bytes == NULL ||
                   key_offsets == NULL || key_lens == NULL || versions == NULL ||
                   value_lens == NULL || value_hashes == NULL))
        return CXLKV_E_INVAL;
    if (keys == NULL && keys_bytes != 0)
        return CXLKV_E_INVAL;
    return CXLKV_OK;
}

int
cxlkv_write_headers(const cxlkv_region_t *r, uint64_t n,
                    const uint64_t *extent_offsets,
                    const uint64_t *header_bytes,
                    const char *keys, uint64_t keys_bytes,
                    const uint64_t *key_offsets, const uint64_t *key_lens,
                    const uint64_t *versions, const uint64_t *value_lens,
                    const uint64_t *value_hashes, int flush,
                    uint64_t *bad_index)
{
    uint64_t i;
    int rc = header_args(r, n, extent_offsets, header_bytes, keys, keys_bytes, key_offsets,
                         key_lens, versions, value_lens, value_hashes, bad_index);

    if (rc != CXLKV_OK)
        return rc;
    for (i = 0; i < n; i++) {
        if (!in_bounds(r->size_bytes, extent_offsets[i], header_bytes[i])) {
            *bad_index = i;
            return CXLKV_E_RANGE;
        }
        if (key_lens[i] < 1 || key_lens[i] > OBJ_MAX_KEY_BYTES ||
            !in_bounds(keys_bytes, key_offsets[i], key_lens[i]) ||
            header_bytes[i] != OBJ_HEADER_BYTES + ((key_lens[i] + 63) & ~(uint64_t)63)) {
            *bad_index = i;
            return CXLKV_E_INVAL;
        }
    }
    if (flush && n != 0)
        ensure_ready();
    for (i = 0; i < n; i++) {
        unsigned char *h = (unsigned char *)r->base + extent_offsets[i];
        const char *key = keys + key_offsets[i];
        uint64_t klen = key_lens[i];
        unsigned char head[OBJ_HEADER_BYTES];
        XXH3_state_t state;

        memset(head, 0, sizeof head);
        memcpy(head, "CXLKVOB1", 8);
        head[8] = OBJ_FORMAT_VERSION; /* u16 format version, u16 flags = 0 */
        store_u32(head + 12, (uint32_t)klen);
        store_u64(head + 16, XXH3_64bits(key, (size_t)klen));
        store_u64(head + 24, versions[i]);
        store_u64(head + 32, value_lens[i]);
        store_u64(head + 40, value_hashes[i]);
        store_u32(head + 48, (uint32_t)header_bytes[i]);
        if (XXH3_64bits_reset(&state) != XXH_OK ||
            XXH3_64bits_update(&state, head, OBJ_FIELDS_BYTES) != XXH_OK ||
            XXH3_64bits_update(&state, key, (size_t)klen) != XXH_OK) {
            *bad_index = i;
            return CXLKV_E_INVAL;
        }
        store_u64(head + OBJ_FIELDS_BYTES, XXH3_64bits_digest(&state));
        /* key and padding first, the header line last */
        memcpy(h + OBJ_HEADER_BYTES, key, (size_t)klen);
        memset(h + OBJ_HEADER_BYTES + klen, 0, (size_t)(header_bytes[i] - OBJ_HEADER_BYTES - klen));
        memcpy(h, head, sizeof head);
        NC_TRACE(CXLKV_NC_EV_STORE, h, h + header_bytes[i]);
        if (flush) /* written back now, fenced once for the batch below */
            nc_wb(NC_LINE_DOWN(h), (const char *)h + header_bytes[i]);
    }
    if (flush)
        nc_store_fence();
    return CXLKV_OK;
}

int
cxlkv_verify_headers(const cxlkv_region_t *r, uint64_t n,
                     const uint64_t *extent_offsets,
                     const uint64_t *header_bytes,
                     const char *keys, uint64_t keys_bytes,
                     const uint64_t *key_offsets, const uint64_t *key_lens,
                     const uint64_t *versions, const uint64_t *value_lens,
                     const uint64_t *value_hashes, int invalidate,
                     uint8_t *ok_out, uint64_t *bad_index)
{
    uint64_t i;
    int rc = header_args(r, n, extent_offsets, header_bytes, keys, keys_bytes, key_offsets,
                         key_lens, versions, value_lens, value_hashes, bad_index);

    if (rc != CXLKV_OK)
        return rc;
    if (n != 0 && ok_out == NULL)
        return CXLKV_E_INVAL;
    for (i = 0; i < n; i++) {
        if (header_bytes[i] < OBJ_HEADER_BYTES ||
            !in_bounds(r->size_bytes, extent_offsets[i], header_bytes[i])) {
            *bad_index = i;
            return CXLKV_E_RANGE;
        }
        if (!in_bounds(keys_bytes, key_offsets[i], key_lens[i])) {
            *bad_index = i;
            return CXLKV_E_INVAL;
        }
    }
    if (invalidate && n != 0) {
        /* every header's lines dropped, then ONE fence before any is read */
        ensure_ready();
        for (i = 0; i < n; i++) {
            const char *h = (const char *)r->base + extent_offsets[i];
            nc_drop(NC_LINE_DOWN(h), h + header_bytes[i]);
        }
        nc_load_fence();
    }
    for (i = 0; i < n; i++) {
        const unsigned char *h = (const unsigned char *)r->base + extent_offsets[i];
        /* the key must fit the header span the reader was given */
        if (key_lens[i] > header_bytes[i] - OBJ_HEADER_BYTES) {
            ok_out[i] = 0;
            continue;
        }
        NC_TRACE(CXLKV_NC_EV_LOAD, h, h + header_bytes[i]);
        ok_out[i] = (uint8_t)header_ok(h, keys + key_offsets[i], key_lens[i],
                                       header_bytes[i], versions[i], value_lens[i],
                                       value_hashes[i]);
    }
    return CXLKV_OK;
}

/* ------------------------------------------------------------------------ */
/* Cache maintenance and prefault                                            */
/* ------------------------------------------------------------------------ */

static int
run_lines(const cxlkv_region_t *r, uint64_t offset, uint64_t length,
          cxlkv_lines_fn fn)
{
    uintptr_t start;
    char *end;
    int rc = check(r, offset, length);

    if (rc != CXLKV_OK)
        return rc;
    ensure_ready();
    start = (uintptr_t)r->base + (uintptr_t)offset;
    end = (char *)start + length;
    start &= ~(uintptr_t)(g_line_bytes - 1);
    fn((char *)start, end, g_line_bytes); /* ends with the fence even for length 0 */
    return CXLKV_OK;
}

int
cxlkv_flush(const cxlkv_region_t *r, uint64_t offset, uint64_t length)
{
    ensure_ready();
    return run_lines(r, offset, length, g_flush_fn);
}

int
cxlkv_invalidate(const cxlkv_region_t *r, uint64_t offset, uint64_t length)
{
    ensure_ready();
    return run_lines(r, offset, length, g_invalidate_fn);
}

int
cxlkv_prefault(const cxlkv_region_t *r, uint64_t offset, uint64_t length,
               int *err_errno)
{
    uint64_t page = cxlkv_page_bytes();
    uintptr_t start, end;
    int rc = check(r, offset, length);

    *err_errno = 0;
    if (rc != CXLKV_OK)
        return rc;
    if (length == 0)
        return CXLKV_OK;
    /* The mapping starts on a page boundary, so rounding stays inside it. */
    start = ((uintptr_t)r->base + (uintptr_t)offset) & ~(uintptr_t)(page - 1);
    end = (uintptr_t)r->base + (uintptr_t)offset + (uintptr_t)length;
    if (madvise((void *)start, end - start, MADV_POPULATE_WRITE) == 0)
        return CXLKV_OK;
    if (errno != EINVAL && errno != ENOSYS) {
        *err_errno = errno;
        return CXLKV_E_PREFAULT;
    }
    /* Old kernel: a locked add of 0 write-faults each page without racing
     * other writers of the shared mapping. */
    for (; start < end; start += page)
        __atomic_fetch_add((volatile uint8_t *)start, 0, __ATOMIC_RELAXED);
    return CXLKV_OK;
}

/* ------------------------------------------------------------------------ */
/* Region index (layout in cxlkv_transport.h)                                */
/* ------------------------------------------------------------------------ */
/*
 * Seqlock on one cache line. The writer (the master, alone) makes seq odd,
 * publishes that before any field (release fence), writes the fields and the
 * checksum, then makes seq even with a release store; with flush it writes the
 * line back. A reader loads seq (acquire), the eight words, an acquire fence,
 * seq again: equal, even and a matching checksum is a slot one write left
 * whole. In non-coherent mode the slot is a single line written back whole, so
 * a reader that invalidated it sees the old or the new slot, never a mixture;
 * a reader that did not may see an old slot, whose extent then fails the
 * object header or value checksum after reuse (the master republishes or
 * tombstones a slot, flushed, before it reuses the extent).
 */
#define IX_BUCKET_BYTES ((uint64_t)CXLKV_INDEX_BUCKET_SLOTS * CXLKV_INDEX_SLOT_BYTES)

static inline void
cpu_relax(void)
{
#if defined(CXLKV_X86)
    _mm_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield" ::: "memory");
#endif
}

/* Drop the lines of [p, p+n) (with the invalidate fn's closing fence). */
static inline void
ix_invalidate(const char *p, uint64_t n)
{
    uintptr_t start = (uintptr_t)p & ~(uintptr_t)(g_line_bytes - 1);
    NC_TRACE(CXLKV_NC_EV_DROP, start, p + n);
    NC_TRACE(CXLKV_NC_EV_MFENCE, 0, 0);
    g_invalidate_fn((char *)start, p + n, g_line_bytes);
}

int
cxlkv_index_store(const cxlkv_region_t *r, uint64_t table_offset, uint64_t nslots,
                  uint64_t n, const uint64_t *slot_nos, const uint64_t *key_hashes,
                  const uint64_t *extent_offsets, const uint64_t *value_lens,
                  const uint64_t *versions, const uint64_t *value_hashes,
                  const uint32_t *header_bytes, const uint32_t *meta, int flush,
                  uint64_t *bad_index)
{
    char *table;
    uint64_t i;

    if (bad_index == NULL)
        return CXLKV_E_INVAL;
    *bad_index = 0;
    if (r == NULL || r->base == NULL)
        return CXLKV_E_CLOSED;
    if (n != 0 && (slot_nos == NULL || key_hashes == NULL || extent_offsets == NULL ||
                   value_lens == NULL || versions == NULL || value_hashes == NULL ||
                   header_bytes == NULL || meta == NULL))
        return CXLKV_E_INVAL;
    if (table_offset % CXLKV_INDEX_SLOT_BYTES != 0)
        return CXLKV_E_INVAL;
    if (nslots > UINT64_MAX / CXLKV_INDEX_SLOT_BYTES ||
        !in_bounds(r->size_bytes, table_offset, nslots * CXLKV_INDEX_SLOT_BYTES))
        return CXLKV_E_RANGE;
    for (i = 0; i < n; i++) {
        if (slot_nos[i] >= nslots) {
            *bad_index = i;
            return CXLKV_E_RANGE;
        }
    }
    ensure_ready();
    table = (char *)r->base + table_offset;
    for (i = 0; i < n; i++) {
        uint64_t *p = (uint64_t *)(table + slot_nos[i] * CXLKV_INDEX_SLOT_BYTES);
        uint64_t w[8], s;
        int k;

        /* flush mode: the seq from memory, not from a line this host cached
         * earlier (a master taking over may have read the slot while its
         * predecessor still wrote it); a seq that went back could let a reader
         * take two writes for one */
        if (flush)
            ix_invalidate((const char *)p, CXLKV_INDEX_SLOT_BYTES);
        s = (__atomic_load_n(p, __ATOMIC_RELAXED) + 1) & ~(uint64_t)1;
        __atomic_store_n(p, s + 1, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_RELEASE); /* odd seq before any field */
        w[0] = s + 2;
        w[1] = key_hashes[i];
        w[2] = extent_offsets[i];
        w[3] = value_lens[i];
        w[4] = versions[i];
        w[5] = value_hashes[i];
        w[6] = (uint64_t)header_bytes[i] | ((uint64_t)meta[i] << 32);
        w[7] = XXH3_64bits(w, 56);
        for (k = 1; k < 8; k++)
            __atomic_store_n(p + k, w[k], __ATOMIC_RELAXED);
        __atomic_store_n(p, s + 2, __ATOMIC_RELEASE);
        if (flush)
            g_flush_fn((char *)((uintptr_t)p & ~(uintptr_t)(g_line_bytes - 1)),
                       (char *)p + CXLKV_INDEX_SLOT_BYTES, g_line_bytes);
    }
    cxlkv_fence();
    return CXLKV_OK;
}

/* The index description's own checks (no index memory read). */
static int
ix_check(const cxlkv_index_t *ix)
{
    const cxlkv_region_t *r;
    uint64_t b;

    if (ix == NULL)
        return CXLKV_E_INVAL;
    r = ix->table_region;
    if (r == NULL || r->base == NULL)
        return CXLKV_E_CLOSED;
    b = ix->buckets;
    if (b == 0 || (b & (b - 1)) != 0 || ix->header_offset % CXLKV_INDEX_SLOT_BYTES != 0 ||
        ix->table_offset % CXLKV_INDEX_SLOT_BYTES != 0)
        return CXLKV_E_INVAL;
    if (!in_bounds(r->size_bytes, ix->header_offset, CXLKV_INDEX_HEADER_BYTES) ||
        b > UINT64_MAX / IX_BUCKET_BYTES ||
        !in_bounds(r->size_bytes, ix->table_offset, b * IX_BUCKET_BYTES))
        return CXLKV_E_RANGE;
    ensure_ready();
    return CXLKV_OK;
}

enum { IX_SLOT_UNSTABLE = -1, IX_SLOT_EMPTY = 0, IX_SLOT_OK = 1 };

/*
 * One stable read of the slot at p into w: IX_SLOT_OK (seq equal before and
 * after, even, checksum right), IX_SLOT_EMPTY (never written: all zero), or
 * IX_SLOT_UNSTABLE after CXLKV_INDEX_SLOT_SPINS tries (being written all along,
 * or torn/corrupt). A retry re-invalidates the line in invalidate mode: a
 * non-coherent cache would otherwise serve the same bytes forever.
 */
static int
ix_read_slot(const uint64_t *p, int invalidate, uint64_t w[8])
{
    int spin, k;

    for (spin = 0; spin < CXLKV_INDEX_SLOT_SPINS; spin++) {
        uint64_t s1, s2;

        if (spin != 0) {
            cpu_relax();
            if (invalidate) {
                ix_invalidate((const char *)p, CXLKV_INDEX_SLOT_BYTES);
                NC_TRACE(CXLKV_NC_EV_LOAD, p, (const char *)p + CXLKV_INDEX_SLOT_BYTES);
            }
        }
        s1 = __atomic_load_n(p, __ATOMIC_ACQUIRE);
        if (s1 & 1)
            continue;
        for (k = 0; k < 8; k++)
            w[k] = __atomic_load_n(p + k, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        s2 = __atomic_load_n(p, __ATOMIC_RELAXED);
        if (s1 != s2 || w[0] != s1)
            continue;
        if (XXH3_64bits(w, 56) == w[7])
            return IX_SLOT_OK;
        if ((w[0] | w[1] | w[2] | w[3] | w[4] | w[5] | w[6] | w[7]) == 0)
            return IX_SLOT_EMPTY;
    }
    return IX_SLOT_UNSTABLE;
}

/* The buckets of key hash h (into b; returns how many: 1 or 2). */
static inline int
ix_buckets(const cxlkv_index_t *ix, uint64_t h, uint64_t b[2])
{
    uint64_t mask = ix->buckets - 1;

    b[0] = h & mask;
    b[1] = (h >> 32) & mask;
    if (b[1] == b[0])
        b[1] = (b[0] + 1) & mask;
    return ix->buckets == 1 ? 1 : 2;
}

/*
 * The slot of key hash h into w: 1 found, 0 absent (every slot read stable), -1
 * unsure. In invalidate mode the caller has dropped both buckets' lines and
 * fenced (ix_lookup: with the publish line, one fence for all).
 */
static int
ix_find(const cxlkv_index_t *ix, uint64_t h, uint64_t w[8])
{
    const char *table = (const char *)ix->table_region->base + ix->table_offset;
    uint64_t b[2];
    int nb = ix_buckets(ix, h, b), unsure = 0, i, j;

    for (i = 0; i < nb; i++) {
        const char *bucket = table + b[i] * IX_BUCKET_BYTES;

        for (j = 0; j < CXLKV_INDEX_BUCKET_SLOTS; j++) {
            const uint64_t *p = (const uint64_t *)(bucket + (uint64_t)j * CXLKV_INDEX_SLOT_BYTES);
            uint64_t s1 = __atomic_load_n(p, __ATOMIC_ACQUIRE), kh;
            int rc;

            /* A slot stably holding another hash (or none: empty, tombstone) is
             * skipped on its seqlock alone; only a slot that may be the key's is
             * copied whole and checksummed. */
            kh = __atomic_load_n(p + 1, __ATOMIC_RELAXED);
            __atomic_thread_fence(__ATOMIC_ACQUIRE);
            if (!(s1 & 1) && kh != h && __atomic_load_n(p, __ATOMIC_RELAXED) == s1)
                continue;
            rc = ix_read_slot(p, ix->invalidate, w);
            if (rc == IX_SLOT_UNSTABLE)
                unsure = 1;
            else if (rc == IX_SLOT_OK && w[1] == h && ((w[6] >> 32) & CXLKV_IX_FLAG_LIVE))
                return 1;
        }
    }
    return unsure ? -1 : 0;
}

/*
 * Copy n bytes (non-overlapping) with cached stores and hash the destination,
 * chunk by chunk while it is in cache: the reader holds no lease, so the hash
 * must be of the bytes it delivers, not of a second load of the source.
 */
static uint64_t
copy_hash_dst(char *dst, const char *src, uint64_t n)
{
    XXH3_state_t state;
    uint64_t done = 0;

    if (n <= CXLKV_HASH_CHUNK_BYTES) {
        if (n >= g_vector_min)
            g_copy_fn(dst, src, (size_t)n, 0);
        else if (n != 0)
            memcpy(dst, src, (size_t)n);
        return XXH3_64bits(n != 0 ? (const void *)dst : (const void *)"", (size_t)n);
    }
    (void)XXH3_64bits_reset(&state);
    while (done < n) {
        uint64_t c = n - done;
        if (c > CXLKV_HASH_CHUNK_BYTES)
            c = CXLKV_HASH_CHUNK_BYTES;
        if (c >= g_vector_min)
            g_copy_fn(dst + done, src + done, (size_t)c, 0);
        else
            memcpy(dst + done, src + done, (size_t)c);
        (void)XXH3_64bits_update(&state, dst + done, (size_t)c);
        done += c;
    }
    return XXH3_64bits_digest(&state);
}

/* copy_hash_dst for non-coherent readers: nc_read with cached stores, dst
 * hashed; with n == 0 only the fence (for lines the caller dropped). */
static uint64_t
nc_read_hash_dst(char *dst, const char *src, uint64_t n)
{
    XXH3_state_t state;

    if (n == 0) {
        nc_load_fence();
        return XXH3_64bits("", 0);
    }
    if (n <= CXLKV_HASH_CHUNK_BYTES) {
        nc_read(dst, src, (size_t)n, 0, NULL, 0, 0, NULL, 0);
        return XXH3_64bits(dst, (size_t)n);
    }
    (void)XXH3_64bits_reset(&state);
    nc_read(dst, src, (size_t)n, 0, &state, 1, 0, NULL, 0);
    return XXH3_64bits_digest(&state);
}

/*
 * One lookup (ix checked, key length 1..4096): the get when !probe (dst of
 * dst_bytes), else the existence probe. Only a verification failure after a
 * found slot is redone (once); everything else answers at once.
 */
static int
ix_lookup(const cxlkv_index_t *ix, const char *key, uint64_t klen, char *dst,
          uint64_t dst_bytes, int probe, cxlkv_ix_result_t *out)
{
    const char *hp = (const char *)ix->table_region->base + ix->header_offset;
    uint64_t h = XXH3_64bits(key, (size_t)klen), w[8];
    int attempt;

    memset(out, 0, sizeof *out);
    for (attempt = 0; attempt < 2; attempt++) {
        uint64_t publish, overflow, ext, vlen, hb, vhash, version;
        uint32_t meta, region_no;
        const cxlkv_region_t *rr;
        const unsigned char *obj;
        int found;

        if (ix->invalidate) {
            /* the publish line and both buckets dropped, ONE fence before any is
             * read (the non-coherent read discipline: nc_read) */
            const char *table = (const char *)ix->table_region->base + ix->table_offset;
            uint64_t b[2];
            int nb = ix_buckets(ix, h, b), i;

            nc_drop(NC_LINE_DOWN(hp + CXLKV_INDEX_PUBLISH_OFFSET),
                      hp + CXLKV_INDEX_PUBLISH_OFFSET + 16);
            for (i = 0; i < nb; i++)
                nc_drop(table + b[i] * IX_BUCKET_BYTES, table + (b[i] + 1) * IX_BUCKET_BYTES);
            nc_load_fence();
            NC_TRACE(CXLKV_NC_EV_LOAD, hp + CXLKV_INDEX_PUBLISH_OFFSET, hp + CXLKV_INDEX_PUBLISH_OFFSET + 16);
            for (i = 0; i < nb; i++)
                NC_TRACE(CXLKV_NC_EV_LOAD, table + b[i] * IX_BUCKET_BYTES,
                         table + (b[i] + 1) * IX_BUCKET_BYTES);
        }
        publish = __atomic_load_n((const uint64_t *)(hp + CXLKV_INDEX_PUBLISH_OFFSET),
                                  __ATOMIC_ACQUIRE);
        overflow = __atomic_load_n((const uint64_t *)(hp + CXLKV_INDEX_OVERFLOW_OFFSET),
                                   __ATOMIC_ACQUIRE);
        if (publish == 0)
            break;
        found = ix_find(ix, h, w);
        if (found < 0)
            break;
        if (found == 0) {
            out->outcome = overflow != 0 ? CXLKV_IX_UNSURE : CXLKV_IX_MISS;
            return CXLKV_OK;
        }
        ext = w[2];
        vlen = w[3];
        version = w[4];
        vhash = w[5];
        hb = w[6] & 0xffffffffu;
        meta = (uint32_t)(w[6] >> 32);
        region_no = (meta >> 16) & 0xffu;
        if (region_no >= CXLKV_INDEX_MAX_REGIONS)
            break; /* no such region number: a slot this reader cannot place */
        out->tier = meta >> 24;
        out->value_len = vlen;
        out->version = version;
        out->extent_offset = ext;
        out->region_no = region_no;
        rr = ix->regions[region_no];
        if ((meta & CXLKV_IX_FLAG_ELSEWHERE) || rr == NULL || rr->base == NULL ||
            (!probe && ix->max_value_bytes != 0 && vlen > ix->max_value_bytes)) {
            out->outcome = CXLKV_IX_ELSEWHERE;
            return CXLKV_OK;
        }
        if (hb < OBJ_HEADER_BYTES || !in_bounds(rr->size_bytes, ext, hb) ||
            vlen > rr->size_bytes - ext - hb)
            break; /* an extent outside the region this reader mapped as region_no */
        obj = (const unsigned char *)rr->base + ext;
        if (probe) {
            if (ix->invalidate)
                ix_invalidate((const char *)obj, hb);
            NC_TRACE(CXLKV_NC_EV_LOAD, obj, obj + hb);
            if (header_ok(obj, key, klen, hb, version, vlen, vhash)) {
                out->outcome = CXLKV_IX_HIT;
                return CXLKV_OK;
            }
        } else {
            uint64_t got;

            if (dst_bytes < vlen) {
                out->outcome = CXLKV_IX_TOO_SMALL;
                return CXLKV_OK;
            }
            if (vlen != 0 && !disjoint(dst, obj + hb, vlen))
                return CXLKV_E_INVAL;
            if (ix->invalidate && ix->verify_first && attempt == 0) {
                /* verify first: the header's lines dropped (fenced), the value
                 * copied through the cache and hashed; a stale line makes the
                 * hash differ from the slot's, and the retry below drops every
                 * line (docs/transport.md, "Reads that verify first") */
                nc_drop(NC_LINE_DOWN(obj), (const char *)obj + hb);
                nc_load_fence();
                got = copy_hash_dst(dst, (const char *)obj + hb, vlen);
                NC_TRACE(CXLKV_NC_EV_VLOAD, obj + hb, obj + hb + vlen);
            } else if (ix->invalidate) {
                /* the header's lines dropped with the value's first chunk (one
                 * fence), the value read chunk by chunk (nc_read), dst hashed */
                nc_drop(NC_LINE_DOWN(obj), (const char *)obj + hb);
                got = nc_read_hash_dst(dst, (const char *)obj + hb, vlen);
            } else {
                got = copy_hash_dst(dst, (const char *)obj + hb, vlen);
            }
            __atomic_thread_fence(__ATOMIC_ACQUIRE); /* the header after the value */
            NC_TRACE(CXLKV_NC_EV_LOAD, obj, obj + hb);
            if (got == vhash && header_ok(obj, key, klen, hb, version, vlen, vhash)) {
                out->outcome = CXLKV_IX_HIT;
                return CXLKV_OK;
            }
        }
        out->retries = 1; /* the first copy did not verify: redo it once */
    }
    /* UNSURE: no field of a slot that did not verify is reported */
    out->outcome = CXLKV_IX_UNSURE;
    out->tier = 0;
    out->value_len = 0;
    out->version = 0;
    out->extent_offset = 0;
    out->region_no = 0;
    return CXLKV_OK;
}

static inline int
ix_key_ok(uint64_t key_len)
{
    return key_len >= 1 && key_len <= OBJ_MAX_KEY_BYTES;
}

int
cxlkv_index_get(const cxlkv_index_t *ix, const char *key, uint64_t key_len,
                void *dst, uint64_t dst_bytes, cxlkv_ix_result_t *out)
{
    int rc = ix_check(ix);

    if (rc != CXLKV_OK)
        return rc;
    if (key == NULL || out == NULL || !ix_key_ok(key_len) || (dst == NULL && dst_bytes != 0))
        return CXLKV_E_INVAL;
    return ix_lookup(ix, key, key_len, (char *)dst, dst_bytes, 0, out);
}

int
cxlkv_index_probe(const cxlkv_index_t *ix, const char *key, uint64_t key_len,
                  cxlkv_ix_result_t *out)
{
    int rc = ix_check(ix);

    if (rc != CXLKV_OK)
        return rc;
    if (key == NULL || out == NULL || !ix_key_ok(key_len))
        return CXLKV_E_INVAL;
    return ix_lookup(ix, key, key_len, NULL, 0, 1, out);
}

/* The batch calls' argument checks; *done names a bad key. */
static int
ix_batch_args(const cxlkv_index_t *ix, uint64_t n, const char *keys, uint64_t keys_bytes,
              const uint64_t *key_offsets, const uint64_t *key_lens,
              cxlkv_ix_result_t *out, uint64_t *done)
{
    uint64_t i;
    int rc;

    if (done == NULL)
        return CXLKV_E_INVAL;
    *done = 0;
    rc = ix_check(ix);
    if (rc != CXLKV_OK)
        return rc;
    if (n != 0 && (key_offsets == NULL || key_lens == NULL || out == NULL))
        return CXLKV_E_INVAL;
    if (keys == NULL && keys_bytes != 0)
        return CXLKV_E_INVAL;
    for (i = 0; i < n; i++) {
        if (!ix_key_ok(key_lens[i]) || !in_bounds(keys_bytes, key_offsets[i], key_lens[i])) {
            *done = i;
            return CXLKV_E_INVAL;
        }
    }
    return CXLKV_OK;
}

/* Key i's destination: dsts[i], else buf + buf_offsets[i], else none (probe). */
static int
ix_batch(const cxlkv_index_t *ix, uint64_t n, const char *keys,
         const uint64_t *key_offsets, const uint64_t *key_lens, void *const *dsts,
         char *buf, const uint64_t *buf_offsets, const uint64_t *dst_bytes,
         int probe, int prefix, cxlkv_ix_result_t *out, uint64_t *done)
{
    uint64_t i;

    for (i = 0; i < n; i++) {
        char *dst = NULL;
        int rc;

        if (!probe)
            dst = dsts != NULL ? (char *)dsts[i] : (buf != NULL ? buf + buf_offsets[i] : NULL);
        rc = ix_lookup(ix, keys + key_offsets[i], key_lens[i], dst, probe ? 0 : dst_bytes[i],
                       probe, &out[i]);
        if (rc != CXLKV_OK) {
            *done = i;
            return rc;
        }
        *done = i + 1;
        if (prefix && out[i].outcome != CXLKV_IX_HIT)
            break;
    }
    return CXLKV_OK;
}

int
cxlkv_index_get_many(const cxlkv_index_t *ix, uint64_t n, const char *keys,
                     uint64_t keys_bytes, const uint64_t *key_offsets,
                     const uint64_t *key_lens, void *const *dsts,
                     const uint64_t *dst_bytes, int prefix,
                     cxlkv_ix_result_t *out, uint64_t *done)
{
    uint64_t i;
    int rc = ix_batch_args(ix, n, keys, keys_bytes, key_offsets, key_lens, out, done);

    if (rc != CXLKV_OK)
        return rc;
    if (n != 0 && (dsts == NULL || dst_bytes == NULL))
        return CXLKV_E_INVAL;
    for (i = 0; i < n; i++) {
        if (dsts[i] == NULL && dst_bytes[i] != 0) {
            *done = i;
            return CXLKV_E_INVAL;
        }
    }
    return ix_batch(ix, n, keys, key_offsets, key_lens, dsts, NULL, NULL, dst_bytes, 0, prefix,
                    out, done);
}

int
cxlkv_index_get_ranges(const cxlkv_index_t *ix, uint64_t n, const char *keys,
                       uint64_t keys_bytes, const uint64_t *key_offsets,
                       const uint64_t *key_lens, void *buf, uint64_t buf_bytes,
                       const uint64_t *buf_offsets, const uint64_t *dst_bytes,
                       int prefix, cxlkv_ix_result_t *out, uint64_t *done,
                       uint64_t *bad_index)
{
    uint64_t i;
    int rc;

    if (bad_index == NULL)
        return CXLKV_E_INVAL;
    *bad_index = 0;
    rc = ix_batch_args(ix, n, keys, keys_bytes, key_offsets, key_lens, out, done);
    if (rc != CXLKV_OK) {
        *bad_index = done != NULL ? *done : 0;
        return rc;
    }
    if ((n != 0 && (buf_offsets == NULL || dst_bytes == NULL)) || (buf == NULL && buf_bytes != 0))
        return CXLKV_E_INVAL;
    for (i = 0; i < n; i++) {
        if (!in_bounds(buf_bytes, buf_offsets[i], dst_bytes[i])) {
            *bad_index = i;
            *done = i;
            return CXLKV_E_RANGE;
        }
    }
    return ix_batch(ix, n, keys, key_offsets, key_lens, NULL, (char *)buf, buf_offsets,
                    dst_bytes, 0, prefix, out, done);
}

int
cxlkv_index_probe_many(const cxlkv_index_t *ix, uint64_t n, const char *keys,
                       uint64_t keys_bytes, const uint64_t *key_offsets,
                       const uint64_t *key_lens, int prefix,
                       cxlkv_ix_result_t *out, uint64_t *done)
{
    int rc = ix_batch_args(ix, n, keys, keys_bytes, key_offsets, key_lens, out, done);

    if (rc != CXLKV_OK)
        return rc;
    return ix_batch(ix, n, keys, key_offsets, key_lens, NULL, NULL, NULL, NULL, 1, prefix,
                    out, done);
}

/* ------------------------------------------------------------------------ */
/* SIGBUS guard (see cxlkv_transport.h)                                      */
/* ------------------------------------------------------------------------ */

#include <signal.h>

#define CXLKV_GUARD_SLOTS 256

/* A slot is live while base != 0; the handler reads base, then size. Writers
 * (add/remove, serialised by the caller) publish size before base. */
static struct {
    uintptr_t base;
    uint64_t size;
    uint64_t hits;
} guard_slots[CXLKV_GUARD_SLOTS];
static uint64_t guard_total;
static struct sigaction guard_previous;
static int guard_installed;
static uintptr_t guard_page_bytes = 4096; /* set at install, read by the handler */

static void
guard_handler(int sig, siginfo_t *si, void *ctx)
{
    uintptr_t addr = (uintptr_t)si->si_addr;
    int i;

    if (si->si_code == BUS_ADRERR) {
        for (i = 0; i < CXLKV_GUARD_SLOTS; i++) {
            uintptr_t base = __atomic_load_n(&guard_slots[i].base, __ATOMIC_ACQUIRE);
            uint64_t size;
            uintptr_t page, end;
            int saved;

            if (base == 0 || addr < base)
                continue;
            size = __atomic_load_n(&guard_slots[i].size, __ATOMIC_RELAXED);
            end = base + (uintptr_t)size;
            if (addr >= end)
                continue;
            page = addr & ~(guard_page_bytes - 1);
            saved = errno;
            /* mmap is a plain system call here: safe in a handler in practice */
            if (mmap((void *)page, (size_t)(end - page), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED) {
                errno = saved;
                break; /* cannot absorb it: let the previous handler have it */
            }
            errno = saved;
            __atomic_add_fetch(&guard_slots[i].hits, 1, __ATOMIC_RELAXED);
            __atomic_add_fetch(&guard_total, 1, __ATOMIC_RELAXED);
            return; /* the access is retried on zero memory */
        }
    }
    /* Not ours: hand it to whoever had SIGBUS before (default: die with a core). */
    if (guard_previous.sa_flags & SA_SIGINFO) {
        if (guard_previous.sa_sigaction != NULL) {
            guard_previous.sa_sigaction(sig, si, ctx);
            return;
        }
    } else if (guard_previous.sa_handler != SIG_DFL && guard_previous.sa_handler != SIG_IGN &&
               guard_previous.sa_handler != NULL) {
        guard_previous.sa_handler(sig);
        return;
    }
    signal(SIGBUS, SIG_DFL); /* the fault repeats on return and kills the process */
}

int
cxlkv_guard_install(int *err_errno)
{
    struct sigaction sa;

    *err_errno = 0;
    if (__atomic_load_n(&guard_installed, __ATOMIC_ACQUIRE))
        return CXLKV_OK;
    guard_page_bytes = (uintptr_t)cxlkv_page_bytes();
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = guard_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &guard_previous) != 0) {
        *err_errno = errno;
        return CXLKV_E_INVAL;
    }
    __atomic_store_n(&guard_installed, 1, __ATOMIC_RELEASE);
    return CXLKV_OK;
}

int
cxlkv_guard_add(void *base, uint64_t size_bytes)
{
    int i;

    if (base == NULL || size_bytes == 0)
        return CXLKV_E_INVAL;
    for (i = 0; i < CXLKV_GUARD_SLOTS; i++) {
        if (__atomic_load_n(&guard_slots[i].base, __ATOMIC_ACQUIRE) == (uintptr_t)base)
            return CXLKV_OK;
    }
    for (i = 0; i < CXLKV_GUARD_SLOTS; i++) {
        if (__atomic_load_n(&guard_slots[i].base, __ATOMIC_ACQUIRE) == 0) {
            __atomic_store_n(&guard_slots[i].size, size_bytes, __ATOMIC_RELAXED);
            __atomic_store_n(&guard_slots[i].hits, 0, __ATOMIC_RELAXED);
            __atomic_store_n(&guard_slots[i].base, (uintptr_t)base, __ATOMIC_RELEASE);
            return CXLKV_OK;
        }
    }
    return CXLKV_E_TOO_LARGE;
}

int
cxlkv_guard_remove(void *base)
{
    int i;

    for (i = 0; i < CXLKV_GUARD_SLOTS; i++) {
        if (__atomic_load_n(&guard_slots[i].base, __ATOMIC_ACQUIRE) == (uintptr_t)base) {
            __atomic_store_n(&guard_slots[i].base, 0, __ATOMIC_RELEASE);
            return CXLKV_OK;
        }
    }
    return CXLKV_OK;
}

uint64_t
cxlkv_guard_hits(void *base)
{
    int i;

    for (i = 0; i < CXLKV_GUARD_SLOTS; i++) {
        if (__atomic_load_n(&guard_slots[i].base, __ATOMIC_ACQUIRE) == (uintptr_t)base)
            return __atomic_load_n(&guard_slots[i].hits, __ATOMIC_RELAXED);
    }
    return 0;
}

uint64_t
cxlkv_guard_total_hits(void)
{
    return __atomic_load_n(&guard_total, __ATOMIC_RELAXED);
}
