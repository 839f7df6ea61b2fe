/*
 * nc.c -- the non-coherent ("flush" mode) copies: the write (streaming stores,
 * write-backs, one fence) and the pipelined read (drop the next chunk, copy this
 * one, fence), and the test-only event trace of their primitives.
 */
#include "internal.h"

/* The trace (cxlkv_nc_trace_start): NC_TRACE in internal.h appends here. */
uint64_t *g_trace;
static uint64_t g_trace_cap, g_trace_n;

void
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


/* Non-coherent write of [dst, dst+n) (memmove semantics), without the closing
 * store fence: the caller issues nc_store_fence() once for all its writes. */
void
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
void
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

