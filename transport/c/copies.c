/*
 * copies.c -- the copy entry points: one range, many ranges of one buffer, and
 * the fused copy + xxh3 forms, each coherent
 * (copy_bytes and the kernels) or non-coherent (nc.c).
 */
#include "internal.h"

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
    if (!nc && !stream) { /* one pass: the bytes stored are the bytes loaded (copyhash.c) */
        *hash_out = g_copy_hash_fn(dst, src, (size_t)length);
        return CXLKV_OK;
    }
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

/* The first i >= from with lengths[i] != 0, else n. */
static inline uint64_t
next_nonempty(const uint64_t *lengths, uint64_t n, uint64_t from)
{
    while (from < n && lengths[from] == 0)
        from++;
    return from;
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
 * One range of a hashed batch copy (every path but the non-coherent read):
 * from CXLKV_HASH_CHUNK_BYTES on chunk by chunk, each chunk hashed while in
 * cache; below it one fused pass (copyhash.c); nc: non-temporal stores into
 * the region, hashing the source (the caller fences once for the batch).
 */
static int
copy_range_hashed(char *dst, const char *src, uint64_t length, int out, int nc,
                  uint64_t *hash_out)
{
    if (length > CXLKV_HASH_CHUNK_BYTES)
        return copy_hashed(dst, src, length, out, nc ? 2 : 0, hash_out);
    if (!nc) {
        *hash_out = g_copy_hash_fn(dst, src, (size_t)length);
        return CXLKV_OK;
    }
    nc_write_nf(dst, src, (size_t)length);
    *hash_out = XXH3_64bits(src, (size_t)length);
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
    for (i = 0; i < n; i++) { /* nc here: into the region (the read returned above) */
        char *b = buf + buf_offsets[i];
        char *reg = base + region_offsets[i];

        rc = copy_range_hashed(out ? b : reg, out ? reg : b, lengths[i], out, nc, &hashes_out[i]);
        if (rc != CXLKV_OK) {
            *bad_index = i;
            return rc;
        }
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

int
cxlkv_copy_in_gather_hashed(const cxlkv_region_t *r, uint64_t n,
                            const void *const *srcs,
                            const uint64_t *region_offsets,
                            const uint64_t *lengths, uint64_t *hashes_out,
                            uint64_t *bad_index, int nc)
{
    char *base;
    uint64_t i;
    int rc;

    if (bad_index == NULL)
        return CXLKV_E_INVAL;
    *bad_index = 0;
    if (r == NULL || r->base == NULL)
        return CXLKV_E_CLOSED;
    if (n != 0 && (srcs == NULL || region_offsets == NULL || lengths == NULL || hashes_out == NULL))
        return CXLKV_E_INVAL;
    base = (char *)r->base;
    for (i = 0; i < n; i++) { /* every range checked before any byte moves */
        if (!in_bounds(r->size_bytes, region_offsets[i], lengths[i])) {
            *bad_index = i;
            return CXLKV_E_RANGE;
        }
        if (lengths[i] != 0 && (srcs[i] == NULL ||
                                !disjoint(srcs[i], base + region_offsets[i], lengths[i]))) {
            *bad_index = i;
            return CXLKV_E_INVAL;
        }
    }
    for (i = 0; i < n; i++) {
        if (lengths[i] == 0) { /* the source may be NULL */
            hashes_out[i] = XXH3_64bits("", 0);
            continue;
        }
        rc = copy_range_hashed(base + region_offsets[i], (const char *)srcs[i], lengths[i], 0, nc,
                               &hashes_out[i]);
        if (rc != CXLKV_OK) {
            *bad_index = i;
            return rc;
        }
    }
    if (nc)
        nc_store_fence();
    return CXLKV_OK;
}
