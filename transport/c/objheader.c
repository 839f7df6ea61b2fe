/*
 * objheader.c -- object headers (layout: CXLKV_OBJ_* in cxlkv_transport.h,
 * each field documented in cxlkv/layout/objheader.py): the batched
 * write (cxlkv_write_headers) and verify (cxlkv_verify_headers), and the one
 * check every reader makes (header_ok, also used by the index reads).
 */
#include "internal.h"

static inline uint64_t
load_u64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v); /* x86-64 and aarch64 Linux are little-endian */
    return v;
}

static inline uint16_t
load_u16(const unsigned char *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint32_t
load_u32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

int
header_ok(const unsigned char *h, const char *key, uint64_t key_len,
          uint64_t header_bytes, uint64_t version, uint64_t value_len,
          uint64_t value_hash)
{
    XXH3_state_t state;
    uint32_t klen;

    if (load_u64(h) != CXLKV_OBJ_MAGIC_U64)
        return 0;
    if (load_u16(h + CXLKV_OBJ_FORMAT_VERSION_OFFSET) != CXLKV_OBJ_FORMAT_VERSION)
        return 0;
    klen = load_u32(h + CXLKV_OBJ_KEY_LEN_OFFSET);
    if (klen < 1 || klen > CXLKV_OBJ_MAX_KEY_BYTES || klen != key_len)
        return 0;
    if (load_u32(h + CXLKV_OBJ_HEADER_BYTES_OFFSET) != header_bytes ||
        header_bytes != CXLKV_OBJ_HEADER_BYTES + (((uint64_t)klen + 63) & ~(uint64_t)63))
        return 0;
    if (memcmp(h + CXLKV_OBJ_HEADER_BYTES, key, (size_t)klen) != 0)
        return 0;
    if (load_u64(h + CXLKV_OBJ_KEY_HASH_OFFSET) != XXH3_64bits(key, (size_t)klen))
        return 0;
    if (load_u64(h + CXLKV_OBJ_VERSION_OFFSET) != version || load_u64(h + CXLKV_OBJ_VALUE_LEN_OFFSET) != value_len ||
        load_u64(h + CXLKV_OBJ_VALUE_HASH_OFFSET) != value_hash)
        return 0;
    if (klen <= 448) {
        /* short keys: one-shot over a copy (the streaming state costs more than the hash) */
        unsigned char buf[CXLKV_OBJ_CHECKSUM_OFFSET + 448];
        memcpy(buf, h, CXLKV_OBJ_CHECKSUM_OFFSET);
        memcpy(buf + CXLKV_OBJ_CHECKSUM_OFFSET, h + CXLKV_OBJ_HEADER_BYTES, klen);
        return XXH3_64bits(buf, CXLKV_OBJ_CHECKSUM_OFFSET + (size_t)klen) == load_u64(h + CXLKV_OBJ_CHECKSUM_OFFSET);
    }
    if (XXH3_64bits_reset(&state) != XXH_OK ||
        XXH3_64bits_update(&state, h, CXLKV_OBJ_CHECKSUM_OFFSET) != XXH_OK ||
        XXH3_64bits_update(&state, h + CXLKV_OBJ_HEADER_BYTES, (size_t)klen) != XXH_OK)
        return 0;
    return XXH3_64bits_digest(&state) == load_u64(h + CXLKV_OBJ_CHECKSUM_OFFSET);
}

static inline void
store_u64(unsigned char *p, uint64_t v)
{
    memcpy(p, &v, sizeof v);
}

static inline void
store_u16(unsigned char *p, uint16_t v)
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
        if (key_lens[i] < 1 || key_lens[i] > CXLKV_OBJ_MAX_KEY_BYTES ||
            !in_bounds(keys_bytes, key_offsets[i], key_lens[i]) ||
            header_bytes[i] != CXLKV_OBJ_HEADER_BYTES + ((key_lens[i] + 63) & ~(uint64_t)63)) {
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
        unsigned char head[CXLKV_OBJ_HEADER_BYTES];
        XXH3_state_t state;

        memset(head, 0, sizeof head);
        store_u64(head, CXLKV_OBJ_MAGIC_U64);
        store_u16(head + CXLKV_OBJ_FORMAT_VERSION_OFFSET, CXLKV_OBJ_FORMAT_VERSION); /* flags: 0 */
        store_u32(head + CXLKV_OBJ_KEY_LEN_OFFSET, (uint32_t)klen);
        store_u64(head + CXLKV_OBJ_KEY_HASH_OFFSET, XXH3_64bits(key, (size_t)klen));
        store_u64(head + CXLKV_OBJ_VERSION_OFFSET, versions[i]);
        store_u64(head + CXLKV_OBJ_VALUE_LEN_OFFSET, value_lens[i]);
        store_u64(head + CXLKV_OBJ_VALUE_HASH_OFFSET, value_hashes[i]);
        store_u32(head + CXLKV_OBJ_HEADER_BYTES_OFFSET, (uint32_t)header_bytes[i]);
        if (XXH3_64bits_reset(&state) != XXH_OK ||
            XXH3_64bits_update(&state, head, CXLKV_OBJ_CHECKSUM_OFFSET) != XXH_OK ||
            XXH3_64bits_update(&state, key, (size_t)klen) != XXH_OK) {
            *bad_index = i;
            return CXLKV_E_INVAL;
        }
        store_u64(head + CXLKV_OBJ_CHECKSUM_OFFSET, XXH3_64bits_digest(&state));
        /* key and padding first, the header line last */
        memcpy(h + CXLKV_OBJ_HEADER_BYTES, key, (size_t)klen);
        memset(h + CXLKV_OBJ_HEADER_BYTES + klen, 0, (size_t)(header_bytes[i] - CXLKV_OBJ_HEADER_BYTES - klen));
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
        if (header_bytes[i] < CXLKV_OBJ_HEADER_BYTES ||
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
        if (key_lens[i] > header_bytes[i] - CXLKV_OBJ_HEADER_BYTES) {
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

