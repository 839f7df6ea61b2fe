/*
 * kernels_x86.c -- the x86 copy kernels: AVX2 cached and streaming copies,
 * the non-coherent write kernels (AVX2, AVX-512, SSE2, MOVDIR64B) and the read
 * pipeline's copy-and-drop loop. cpu_init (arch_x86.c) picks among them.
 */
#include "internal.h"

#ifdef CXLKV_X86

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
 * Direction: copies whose destination is a little ahead of the source modulo
 * 4 KiB run backwards (copy_backwards in internal.h: "4K aliasing").
 *
 * Cached ("vec") kernels: one unaligned vector at each end, unaligned loads
 * and aligned stores in between. Streaming ("nt") kernels: non-temporal
 * aligned stores that bypass the cache, then SFENCE, for copies past the
 * stream threshold (the data is bound for another host or a device, not for
 * this core's cache).
 */

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
__attribute__((target("avx2"))) void
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
__attribute__((target("avx512f"))) void
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
void
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
__attribute__((target("movdir64b"))) void
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

__attribute__((target("avx2,clflushopt"))) void
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
void
copy_avx2(char *dst, const char *src, size_t n, int stream)
{
    int back = copy_backwards(dst, src);

    if (stream)
        (back ? nt_backward : nt_forward)(dst, src, n);
    else
        (back ? vec_backward : vec_forward)(dst, src, n);
}

#endif /* CXLKV_X86 */
