/*
 * index.c -- the region index (layout in cxlkv_transport.h): the master's slot
 * store and the readers' get and probe, single and batched, coherent or
 * non-coherent, each hit verified against its object header.
 */
#include "internal.h"

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
 * Copy n bytes (non-overlapping) with cached stores and hash what was stored,
 * in one pass (copyhash.c): the reader holds no lease, so the hash must be of
 * the bytes it delivers, not of a second load of the source.
 */
static inline uint64_t
copy_hash_dst(char *dst, const char *src, uint64_t n)
{
    return g_copy_hash_fn(dst, src, (size_t)n);
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
        if (hb < CXLKV_OBJ_HEADER_BYTES || !in_bounds(rr->size_bytes, ext, hb) ||
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
    return key_len >= 1 && key_len <= CXLKV_OBJ_MAX_KEY_BYTES;
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

