/*
 * internal.h -- what the transport's C files share and nothing outside them
 * sees: the run-time dispatch state (which instructions and kernels cpu_init
 * chose), the non-coherent primitives, the bounds checks, and the kernels one
 * file defines for another. The public contract is ../cxlkv_transport.h.
 *
 * Built by cffi (transport/build_transport.py) into cxlkv.transport._transport;
 * cffi releases the GIL around every call, so nothing here may touch Python.
 *
 * The files (each says what it holds at its top):
 *   dispatch.c       the dispatch state, its initialisation and getters/setters
 *   arch_x86.c       x86-64: CPUID, cache-line instructions, kernel choice
 *   arch_aarch64.c   aarch64: CTR_EL0, DC CVAC / DC CIVAC
 *   arch_generic.c   other architectures: fences only
 *   kernels_x86.c    AVX2 / AVX-512 / SSE2 / MOVDIR64B copy and streaming kernels
 *   nc.c             the non-coherent write and read pipeline, the test trace
 *   mapping.c        map, unmap, retire
 *   copies.c         the copy entry points (single, batched, hashed)
 *   copyhash.c       copy while hashing: the fused xxh3 copy kernels
 *   objheader.c      object headers: write and verify
 *   maintenance.c    flush, invalidate, prefault of a range
 *   index.c          the region index: store, get, probe
 *   guard.c          the SIGBUS guard
 *
 * Hot helpers are static inline here so every caller's loop keeps them inline;
 * everything else a file shares is declared here with hidden visibility (no
 * PLT or GOT indirection between the files of the one shared object).
 */
#ifndef CXLKV_TRANSPORT_INTERNAL_H
#define CXLKV_TRANSPORT_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "cxlkv_transport.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define CXLKV_X86 1
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

#pragma GCC visibility push(hidden)

/* ------------------------------------------------------------------------ */
/* Run-time CPU dispatch (dispatch.c; chosen by cpu_init in arch_*.c)        */
/* ------------------------------------------------------------------------ */

typedef void (*cxlkv_lines_fn)(char *start, const char *end, uint64_t line);

extern uint64_t g_line_bytes;
extern cxlkv_lines_fn g_flush_fn;
extern cxlkv_lines_fn g_invalidate_fn;
extern const char *g_flush_name;
extern const char *g_invalidate_name;
extern volatile int g_ready;

/* Copies of >= g_vector_min bytes use the AVX2 kernels where cpu_init found them. */
typedef void (*cxlkv_copy_fn)(char *dst, const char *src, size_t n, int stream);

extern cxlkv_copy_fn g_copy_fn;
extern const char *g_copy_kernel;
extern size_t g_vector_min;
extern size_t g_stream_threshold;

#define CXLKV_VECTOR_MIN_BYTES ((size_t)512)
#define CXLKV_STREAM_DEFAULT_BYTES ((size_t)16 << 20)

/*
 * Non-coherent ("flush" mode) copies: see nc.c.
 * g_stream_fn writes whole lines with non-temporal stores (dst 64-aligned,
 * n a multiple of 64, no fence); NULL: none known, the cached copy + write-back
 * path is used. g_wb_nf / g_drop_nf write back / drop lines WITHOUT a fence.
 */
typedef void (*cxlkv_stream_fn)(char *dst, const char *src, size_t n, int back);
typedef void (*cxlkv_lines_nf_fn)(const char *start, const char *end, uint64_t line);

extern cxlkv_stream_fn g_stream_fn;
extern const char *g_nc_write_name;
extern cxlkv_lines_nf_fn g_wb_nf;
extern cxlkv_lines_nf_fn g_drop_nf;
extern size_t g_nc_chunk;
/* copy + drop the next chunk's lines, mixed (NULL: drop, then copy_plain) */
typedef void (*cxlkv_copy_drop_fn)(char *dst, const char *src, size_t n, int stream,
                                   const char *drop, const char *drop_end);
extern cxlkv_copy_drop_fn g_copy_drop_fn;

#define CXLKV_NC_CHUNK_MIN_BYTES ((size_t)256)

/* Per architecture (arch_*.c): fill the dispatch state from the CPU; whether
 * the CPU runs the named non-coherent write kernel; that kernel (NULL: the
 * cached copy + write-back path). */
void cpu_init(void);
int cpu_has(const char *name);
cxlkv_stream_fn stream_kernel(const char *name);

/* cpu_init once (dispatch.c; a constructor, and idempotent) */
void cxlkv_init(void);

static inline void
ensure_ready(void)
{
    if (__builtin_expect(!g_ready, 0))
        cxlkv_init(); /* idempotent; only reached if constructors did not run */
}

/* ------------------------------------------------------------------------ */
/* Kernels (kernels_x86.c)                                                   */
/* ------------------------------------------------------------------------ */

/*
 * Direction: a load whose address matches a still-buffered store in bits
 * 11..0 waits for it ("4K aliasing"). Copying forwards, that happens when the
 * destination is a little ahead of the source modulo 4 KiB, so those copies
 * run backwards (measured: 20 -> 33 GB/s for 1 MiB at dst - src = 16 mod 4096).
 */
static inline int
copy_backwards(const char *dst, const char *src)
{
    size_t k = ((uintptr_t)dst - (uintptr_t)src) & 4095;

    return k != 0 && k < 2048;
}

#ifdef CXLKV_X86
/* Non-overlapping, n >= CXLKV_VECTOR_MIN_BYTES: cached or streaming stores. */
void copy_avx2(char *dst, const char *src, size_t n, int stream);
/* Whole lines with non-temporal / direct stores (g_stream_fn candidates). */
void stream_avx2(char *dst, const char *src, size_t n, int back);
void stream_avx512(char *dst, const char *src, size_t n, int back);
void stream_sse2(char *dst, const char *src, size_t n, int back);
void stream_movdir64b(char *dst, const char *src, size_t n, int back);
/* The read pipeline's inner loop: copy one chunk, drop the next one's lines. */
void copy_dropping_avx2(char *dst, const char *src, size_t n, int stream, const char *drop,
                        const char *drop_end);
#endif

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

/* Copy n bytes (non-overlapping) and return the xxh3_64 of the bytes stored
 * (copyhash.c: fused kernels where the CPU has them, else copy_hash_two_pass). */
typedef uint64_t (*cxlkv_copy_hash_fn)(char *dst, const char *src, size_t n);
extern cxlkv_copy_hash_fn g_copy_hash_fn;
extern const char *g_copy_hash_name;
uint64_t copy_hash_two_pass(char *dst, const char *src, size_t n);
void copy_hash_init(void);

/* ------------------------------------------------------------------------ */
/* Non-coherent primitives (nc.c)                                            */
/* ------------------------------------------------------------------------ */

/* Test-only event trace of the non-coherent kernels (cxlkv_nc_trace_start):
 * three words per event (kind, start address, end address). */
extern uint64_t *g_trace;
void nc_trace_add(uint64_t kind, const void *a, const void *b);

#define NC_TRACE(kind, a, b)                                   \
    do {                                                       \
        if (__builtin_expect(g_trace != NULL, 0))              \
            nc_trace_add((kind), (const void *)(a), (const void *)(b)); \
    } while (0)

#ifdef CXLKV_X86
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
#elif defined(__aarch64__)
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
#else
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
#endif

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

#define NC_LINE_DOWN(p) ((const char *)((uintptr_t)(p) & ~(uintptr_t)(g_line_bytes - 1)))

/* Non-coherent write of [dst, dst+n) (memmove semantics), without the closing
 * store fence: the caller issues nc_store_fence() once for all its writes. */
void nc_write_nf(char *dst, const char *src, size_t n);

/*
 * Non-coherent read of [src, src+n) into dst (non-overlapping), pipelined (nc.c).
 * `primed`: the first chunk's lines were dropped and fenced already (by the
 * previous range's `next`). `next`/`next_n`: the range read after this one: its
 * first chunk is dropped before this range's last chunk is copied, and fenced
 * before returning (the caller passes primed = 1 then). With `st`, each chunk
 * is hashed right after its copy: dst when `hash_dst`, else the source chunk
 * just loaded (the same bytes: see copy_hashed in copies.c).
 */
void nc_read(char *dst, const char *src, size_t n, int stream, XXH3_state_t *st, int hash_dst,
             int primed, const char *next, size_t next_n);

/* ------------------------------------------------------------------------ */
/* Bounds (every entry point on a region)                                    */
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

/* ------------------------------------------------------------------------ */
/* Object headers (objheader.c)                                              */
/* ------------------------------------------------------------------------ */

/* Whether the header + key at h describe key at version with a value_len-byte
 * value hashing to value_hash, header_bytes long (the readers' one check). */
int header_ok(const unsigned char *h, const char *key, uint64_t key_len,
              uint64_t header_bytes, uint64_t version, uint64_t value_len,
              uint64_t value_hash);

#pragma GCC visibility pop

#endif /* CXLKV_TRANSPORT_INTERNAL_H */
