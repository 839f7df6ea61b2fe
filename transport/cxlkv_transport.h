/*
 * cxlkv_transport.h -- C API of the cxlkv transport.
 *
 * Maps one region (a DAX character device or a regular file standing in for
 * one) MAP_SHARED read-write and moves bytes between it and caller memory.
 *
 * This header is both the C interface of the files in c/ (one per concern;
 * c/internal.h lists them and holds what they share) and the cffi cdef
 * (transport/build_transport.py feeds it to ffi.cdef() with preprocessor lines
 * removed), so it holds only declarations cffi understands: no macros with
 * expressions, no inline functions.
 *
 * Conventions:
 *   - offsets and lengths are in bytes, as uint64_t;
 *   - every function that touches region bytes checks
 *     offset <= size_bytes && length <= size_bytes - offset
 *     (so offset + length never overflows) and returns CXLKV_E_RANGE instead;
 *   - functions return a cxlkv_status value (0 = success); none of them
 *     aborts or raises a signal on bad arguments;
 *   - functions never take a lock: callers serialise cxlkv_unmap() against
 *     the other calls on the same region;
 *   - copies have memmove semantics (a source overlapping its destination,
 *     e.g. a view of the region itself, is copied correctly) and their stores
 *     are globally visible, in order, when the function returns.
 */
#ifndef CXLKV_TRANSPORT_H
#define CXLKV_TRANSPORT_H

#include <stdint.h>
#include <stddef.h>

/* Mapping alignment of device DAX in bytes (2 MiB pages). */
#define CXLKV_DAX_ALIGN_BYTES 2097152

enum cxlkv_status {
    CXLKV_OK = 0,
    CXLKV_E_RANGE = 1,          /* offset/length outside the region or buffer */
    CXLKV_E_CLOSED = 2,         /* the region is not mapped */
    CXLKV_E_INVAL = 3,          /* a bad argument (null pointer, size 0 on create, ...) */
    CXLKV_E_OPEN = 4,           /* open(2) failed; errno reported */
    CXLKV_E_STAT = 5,           /* fstat(2) failed; errno reported */
    CXLKV_E_NOT_MAPPABLE = 6,   /* neither a regular file nor a DAX char device */
    CXLKV_E_SIZE_ZERO = 7,      /* the file or device has size 0 */
    CXLKV_E_SIZE_MISMATCH = 8,  /* actual size (in size_bytes) != requested */
    CXLKV_E_TRUNCATE = 9,       /* ftruncate(2) failed; errno reported */
    CXLKV_E_SYSFS = 10,         /* DAX size or alignment unreadable from sysfs */
    CXLKV_E_ALIGN = 11,         /* DAX size not a multiple of its alignment */
    CXLKV_E_MMAP = 12,          /* mmap(2) failed; errno reported */
    CXLKV_E_TOO_LARGE = 13,     /* size does not fit the address space */
    CXLKV_E_PREFAULT = 14       /* faulting pages in failed (out of memory); errno reported */
};

/* One mapped region. Zero-initialise before cxlkv_map(). */
typedef struct cxlkv_region {
    void *base;            /* first byte of the mapping; NULL when not mapped */
    uint64_t size_bytes;   /* mapped length in bytes (actual size on E_SIZE_MISMATCH) */
    uint64_t align_bytes;  /* mapping alignment: page size, or the DAX alignment */
    int is_dax;            /* 1: DAX character device, 0: regular file */
    int created;           /* 1: cxlkv_map() created or sized the file */
} cxlkv_region_t;

/*
 * Map `path` MAP_SHARED read-write into `out`.
 *
 * want_size_bytes == 0: use the file's size (fstat) or the DAX device's size
 *   (/sys/bus/dax/devices/<dev>/size).
 * want_size_bytes > 0: the size must match, else CXLKV_E_SIZE_MISMATCH with
 *   the actual size in out->size_bytes.
 * create != 0: create a missing regular file (mode 0600 | umask) and size an
 *   empty one to want_size_bytes (which must then be > 0).
 * On failure *err_errno holds errno (0 when none applies) and out->base is NULL.
 */
int cxlkv_map(const char *path, uint64_t want_size_bytes, int create,
              cxlkv_region_t *out, int *err_errno);

/* Unmap. The address range is released; idempotent. */
int cxlkv_unmap(cxlkv_region_t *r, int *err_errno);

/*
 * Unmap for a region whose bytes may still be referenced (a live zero-copy
 * view, a copy in another thread): the range is replaced in place by private
 * anonymous zero memory, so a stale access reads zeros instead of faulting.
 * The address range (not the memory) stays reserved for the process lifetime.
 */
int cxlkv_retire(cxlkv_region_t *r, int *err_errno);

/*
 * Coherence of a copy: the last argument (`nc`) of every copy call below.
 *
 * 0: coherent memory (one host, hardware-coherent CXL): plain copies.
 * Non-zero: non-coherent sharing ("flush" mode, docs/transport.md):
 *  - a copy INTO the region leaves its bytes in memory, not in this CPU's
 *    caches, when it returns: whole destination lines are written with
 *    non-temporal stores (cxlkv_nc_write_kernel()), the partial lines at either
 *    end through the cache and written back (CLWB / CLFLUSHOPT / DC CVAC), then
 *    one store fence (SFENCE / DSB) for the whole call -- the same guarantee as
 *    a plain copy followed by cxlkv_flush(), without a second pass;
 *  - a copy OUT of the region reads no line this CPU cached before the call:
 *    the source is read in chunks (up to cxlkv_nc_read_chunk_bytes()), each
 *    chunk's lines dropped (CLFLUSHOPT / DC CIVAC) before the full fence
 *    (MFENCE / DSB) that precedes its loads, the next chunk's lines dropped
 *    while this one is copied -- the guarantee of cxlkv_invalidate() then a
 *    copy, in one pass.
 */
#define CXLKV_COHERENT 0
#define CXLKV_NONCOHERENT 1

/* Copy `length` bytes from `src` into the region at `offset`. */
int cxlkv_copy_in(const cxlkv_region_t *r, uint64_t offset, const void *src,
                  uint64_t length, int nc);

/* Copy `length` bytes from the region at `offset` into `dst`. */
int cxlkv_copy_out(const cxlkv_region_t *r, uint64_t offset, void *dst,
                   uint64_t length, int nc);

/*
 * Fused copy + checksum (xxh3_64, seed 0: equal to python-xxhash's
 * xxh3_64_intdigest): the same copies as cxlkv_copy_in / cxlkv_copy_out. Below
 * the stream threshold in one pass, each stripe hashed from the register it was
 * stored from (cxlkv_copy_hash, c/copyhash.c): the hash is of the bytes both
 * sides now hold. From the stream threshold on, and for non-coherent copies, in
 * chunks of CXLKV_HASH_CHUNK_BYTES, each hashed right after it is copied, while
 * in this core's cache: copy_in hashes the source (what was written), copy_out
 * the source chunk it has just loaded (streamed stores leave the destination
 * out of cache); see copy_hashed() in c/copies.c for why that is the same
 * bytes under a lease. Source and destination must not overlap
 * (CXLKV_E_INVAL). *hash_out is written only on CXLKV_OK.
 */
#define CXLKV_HASH_CHUNK_BYTES 262144
int cxlkv_copy_in_hashed(const cxlkv_region_t *r, uint64_t offset, const void *src,
                         uint64_t length, uint64_t *hash_out, int nc);
int cxlkv_copy_out_hashed(const cxlkv_region_t *r, uint64_t offset, void *dst,
                          uint64_t length, uint64_t *hash_out, int nc);

/*
 * N copies between one buffer `buf` of `buf_bytes` bytes and the region:
 * buf[buf_offsets[i] .. +lengths[i]) -> region[region_offsets[i] .. +lengths[i]).
 * Both sides are bounds-checked before any byte moves.
 */
int cxlkv_copy_in_ranges(const cxlkv_region_t *r, const void *buf,
                         uint64_t buf_bytes, uint64_t n,
                         const uint64_t *buf_offsets,
                         const uint64_t *region_offsets,
                         const uint64_t *lengths, uint64_t *bad_index, int nc);

/* region[region_offsets[i] .. +lengths[i]) -> buf[buf_offsets[i] .. +lengths[i]). */
int cxlkv_copy_out_ranges(const cxlkv_region_t *r, void *buf,
                          uint64_t buf_bytes, uint64_t n,
                          const uint64_t *buf_offsets,
                          const uint64_t *region_offsets,
                          const uint64_t *lengths, uint64_t *bad_index, int nc);

/*
 * cxlkv_copy_out_ranges, hashing each range (xxh3_64, seed 0) right after its
 * copy, from the destination while it is in cache: hashes_out[i] is the hash of
 * the lengths[i] bytes delivered to buf[buf_offsets[i]..). A range whose two
 * sides overlap is refused (CXLKV_E_INVAL, *bad_index) before any byte moves.
 */
int cxlkv_copy_out_ranges_hashed(const cxlkv_region_t *r, void *buf,
                                 uint64_t buf_bytes, uint64_t n,
                                 const uint64_t *buf_offsets,
                                 const uint64_t *region_offsets,
                                 const uint64_t *lengths, uint64_t *hashes_out,
                                 uint64_t *bad_index, int nc);

/*
 * cxlkv_copy_in_ranges, hashing each source range (xxh3_64, seed 0) right
 * after its copy, while it is in cache: hashes_out[i] is the hash of the
 * lengths[i] bytes taken from buf[buf_offsets[i]..). A range whose two sides
 * overlap is refused (CXLKV_E_INVAL, *bad_index) before any byte moves.
 */
int cxlkv_copy_in_ranges_hashed(const cxlkv_region_t *r, const void *buf,
                                uint64_t buf_bytes, uint64_t n,
                                const uint64_t *buf_offsets,
                                const uint64_t *region_offsets,
                                const uint64_t *lengths, uint64_t *hashes_out,
                                uint64_t *bad_index, int nc);

/*
 * Copy N separate sources into the region, hashing each (xxh3_64, seed 0) right
 * after its copy, while it is in cache: srcs[i] (lengths[i] bytes) goes to
 * region_offsets[i] and hashes_out[i] is the hash of its bytes — a batch of
 * values that live in separate buffers (the SDK's direct puts) in one call.
 * Every range is checked before any byte moves: CXLKV_E_RANGE (a range
 * outside the region) or CXLKV_E_INVAL (a NULL source, or one that overlaps
 * its region range) names it in *bad_index. nc: as cxlkv_copy_in.
 */
int cxlkv_copy_in_gather_hashed(const cxlkv_region_t *r, uint64_t n,
                                const void *const *srcs,
                                const uint64_t *region_offsets,
                                const uint64_t *lengths, uint64_t *hashes_out,
                                uint64_t *bad_index, int nc);

/*
 * The object header's layout (cxlkv/layout/objheader.py documents each field): one
 * 64-byte line of little-endian fields, then the key, zero padding to the next
 * 64 bytes, the value. Offsets are from the extent's start. The checksummed
 * fields are [0, CXLKV_OBJ_CHECKSUM_OFFSET); the header checksum is their xxh3_64
 * followed by the key bytes'. The magic is b"CXLKVOB1" read as a little-endian
 * u64. Python reads these through cffi (cxlkv.transport.bindings checks
 * cxlkv/layout/objheader.py against them at import).
 */
#define CXLKV_OBJ_HEADER_BYTES 64
#define CXLKV_OBJ_MAGIC_U64 3549486688370448451
#define CXLKV_OBJ_FORMAT_VERSION 1
#define CXLKV_OBJ_MAX_KEY_BYTES 4096
#define CXLKV_OBJ_FORMAT_VERSION_OFFSET 8
#define CXLKV_OBJ_FLAGS_OFFSET 10
#define CXLKV_OBJ_KEY_LEN_OFFSET 12
#define CXLKV_OBJ_KEY_HASH_OFFSET 16
#define CXLKV_OBJ_VERSION_OFFSET 24
#define CXLKV_OBJ_VALUE_LEN_OFFSET 32
#define CXLKV_OBJ_VALUE_HASH_OFFSET 40
#define CXLKV_OBJ_HEADER_BYTES_OFFSET 48
#define CXLKV_OBJ_CHECKSUM_OFFSET 56

/*
 * Write N object headers (layout above), each followed by its key
 * and zero padding up to header_bytes[i], at region offset extent_offsets[i]:
 * the key keys[key_offsets[i] .. +key_lens[i]), version versions[i], a
 * value_lens[i]-byte value whose xxh3_64 is value_hashes[i]. header_bytes[i]
 * must be 64 + the key length rounded up to 64. With `flush` each written span
 * is written back (then one fence). Every span and key range is checked before
 * anything is written: CXLKV_E_RANGE (a span outside the region) or
 * CXLKV_E_INVAL (a bad key range or header_bytes) names it in *bad_index.
 */
int cxlkv_write_headers(const cxlkv_region_t *r, uint64_t n,
                        const uint64_t *extent_offsets,
                        const uint64_t *header_bytes,
                        const char *keys, uint64_t keys_bytes,
                        const uint64_t *key_offsets, const uint64_t *key_lens,
                        const uint64_t *versions, const uint64_t *value_lens,
                        const uint64_t *value_hashes, int flush,
                        uint64_t *bad_index);

/*
 * Check N object headers (layout above) against what a reader
 * expects, in one call. Object i's extent starts at region offset
 * extent_offsets[i] and its value at extent_offsets[i] + header_bytes[i]; it
 * must describe the key keys[key_offsets[i] .. +key_lens[i]) (UTF-8 bytes) at
 * version versions[i] with a value_lens[i]-byte value whose xxh3_64 is
 * value_hashes[i]: magic, format version, key length, stored key bytes, key
 * hash, header_bytes, header checksum, version, value length and value
 * checksum all match. With `invalidate` the header and key lines are
 * invalidated first (non-coherent mode). ok_out[i] is 1 when object i is
 * valid, else 0 (the caller finds out why the slow way). Returns CXLKV_OK, or
 * CXLKV_E_RANGE (a header span outside the region: *bad_index names it;
 * nothing is checked), CXLKV_E_CLOSED, CXLKV_E_INVAL.
 */
int cxlkv_verify_headers(const cxlkv_region_t *r, uint64_t n,
                         const uint64_t *extent_offsets,
                         const uint64_t *header_bytes,
                         const char *keys, uint64_t keys_bytes,
                         const uint64_t *key_offsets, const uint64_t *key_lens,
                         const uint64_t *versions, const uint64_t *value_lens,
                         const uint64_t *value_hashes, int invalidate,
                         uint8_t *ok_out, uint64_t *bad_index);

/*
 * Write back every cache line of [offset, offset+length) towards memory
 * (CLWB, else CLFLUSHOPT, else CLFLUSH; DC CVAC on aarch64), then SFENCE.
 */
int cxlkv_flush(const cxlkv_region_t *r, uint64_t offset, uint64_t length);

/*
 * Drop every cache line of [offset, offset+length) so the next read comes
 * from memory (CLFLUSHOPT, else CLFLUSH; DC CIVAC on aarch64), then MFENCE.
 * Dirty lines are written back first (the instructions do both).
 */
int cxlkv_invalidate(const cxlkv_region_t *r, uint64_t offset, uint64_t length);

/* Full memory fence (MFENCE; DMB ISH on aarch64). */
void cxlkv_fence(void);

/*
 * Fault in every page of [offset, offset+length) for writing, without
 * changing any byte (MADV_POPULATE_WRITE, else an atomic add of 0 per page).
 */
int cxlkv_prefault(const cxlkv_region_t *r, uint64_t offset, uint64_t length,
                   int *err_errno);

/*
 * Copies of at least this many bytes use non-temporal stores that bypass the
 * cache (then SFENCE) when the "avx2" kernel is in use; smaller ones use cached
 * stores. Default 16 MiB; 0 (also the value without the kernel) disables
 * streaming. Process-wide; set it before copies start.
 */
uint64_t cxlkv_stream_threshold_bytes(void);
void cxlkv_set_stream_threshold_bytes(uint64_t bytes);

/*
 * Copy kernel chosen at run time for copies of 512 bytes and more: "avx2"
 * (x86-64 vector loops, streaming from the threshold above) or "memmove"
 * (glibc: CPUs without AVX2, other architectures).
 */
const char *cxlkv_copy_kernel(void);

/*
 * Copy while hashing: copy `length` bytes from `src` to `dst` (non-overlapping:
 * CXLKV_E_INVAL) and set *hash_out to the xxh3_64 (seed 0) of the bytes
 * stored -- XXH3_64bits(dst, length), python-xxhash's xxh3_64_intdigest -- in
 * one pass (c/copyhash.c). The index reads and the hashed copies above use the
 * same kernel. cxlkv_copy_hash_kernel() names it: "avx512", "avx2" (x86-64,
 * chosen at load from CPUID) or "two-pass" (copy, then hash the destination
 * while in cache); cxlkv_set_copy_hash_kernel() picks another one (tests,
 * benchmarks): CXLKV_OK, or CXLKV_E_INVAL for a name unknown or not supported
 * here.
 */
int cxlkv_copy_hash(void *dst, const void *src, uint64_t length, uint64_t *hash_out);
const char *cxlkv_copy_hash_kernel(void);
int cxlkv_set_copy_hash_kernel(const char *name);

/* Cache line size in bytes used by flush/invalidate. */
uint64_t cxlkv_cache_line_bytes(void);

/* System page size in bytes. */
uint64_t cxlkv_page_bytes(void);

/* Name of the flush instruction chosen at run time ("clwb", "clflushopt", ...). */
const char *cxlkv_flush_instruction(void);

/* Name of the invalidate instruction chosen at run time. */
const char *cxlkv_invalidate_instruction(void);

/*
 * Non-coherent copy kernels (the `nc` copies above), chosen at load from CPUID:
 * cxlkv_nc_write_kernel() names how whole lines are written: "avx512-nt",
 * "avx2-nt", "sse2-nt" (non-temporal stores), "movdir64b" (64-byte direct
 * stores), or "cached" (a cached copy, then every line written back: aarch64,
 * other architectures). cxlkv_set_nc_write_kernel() picks another one (tests,
 * benchmarks): CXLKV_OK, or CXLKV_E_INVAL for a name unknown or not supported
 * by this CPU. Process-wide; set it before copies start.
 *
 * cxlkv_nc_read_chunk_bytes(): the largest invalidate-and-copy chunk of an
 * `nc` copy out (default 128 KiB; a range's first chunk is at most 16 KiB and
 * each next one twice the one before). cxlkv_set_nc_read_chunk_bytes(0) selects the
 * two-pass read instead (drop every line of the range, one fence, then copy:
 * what cxlkv_invalidate() + a copy does; for comparison); other values are
 * rounded down to a multiple of 64, at least 256.
 */
/*
 * Test-only: record what the non-coherent kernels do, for a replay against a
 * cache model (cxlkv/transport/emulate.py, KernelTrace). Between start and
 * stop, every non-coherent copy, write_headers(flush), verify_headers
 * (invalidate) and index lookup (invalidate) appends events of three words
 * (kind, start address, end address) to `events` (room for `capacity`
 * events); stop returns how many were produced (more than capacity: the rest
 * were dropped). One thread at a time; nothing else may copy meanwhile.
 */
#define CXLKV_NC_EV_LOAD 1
#define CXLKV_NC_EV_STORE 2
#define CXLKV_NC_EV_STREAM 3
#define CXLKV_NC_EV_WB 4
#define CXLKV_NC_EV_DROP 5
#define CXLKV_NC_EV_SFENCE 6
#define CXLKV_NC_EV_MFENCE 7
/* VLOAD: loads of bytes the kernel hashes and checks against a checksum it read
 * fresh before it uses them (the first copy of a read that verifies first) */
#define CXLKV_NC_EV_VLOAD 8
int cxlkv_nc_trace_start(uint64_t *events, uint64_t capacity);
uint64_t cxlkv_nc_trace_stop(void);

const char *cxlkv_nc_write_kernel(void);
int cxlkv_set_nc_write_kernel(const char *name);
uint64_t cxlkv_nc_read_chunk_bytes(void);
void cxlkv_set_nc_read_chunk_bytes(uint64_t bytes);

/* ------------------------------------------------------------------------ */
/* Region index: the master's committed-object table (issue 17)             */
/* ------------------------------------------------------------------------ */
/*
 * Layout (little-endian, offsets absolute in the region; cxlkv/layout/index.py writes
 * the header page, these calls write and read the slots):
 *
 * Index header page at header_offset (CXLKV_INDEX_HEADER_BYTES):
 *   [0,8) magic "CXLKVIX1"; [8,12) u32 format version; [12,16) u32 bucket
 *   slots (8); [16,24) u64 buckets (a power of two); [24,32) u64 table_offset;
 *   [32,40) u64 xxh3_64 of [0,32); [64,72) u64 publish word (0: no master
 *   publishes, every lookup is UNSURE; else the master's epoch); [72,80) u64
 *   overflow (committed objects not in the index: a key not found is UNSURE,
 *   not MISS); [128,192) owner lease; [256,260) u32 region count, 16-byte
 *   region uuids from 320 (region number i = entry i).
 * Slot table at table_offset: buckets * CXLKV_INDEX_BUCKET_SLOTS slots of
 *   CXLKV_INDEX_SLOT_BYTES (one cache line); bucket b = slots [8b, 8b+8).
 * Slot: 0 u64 seq (seqlock: even stable, odd being written); 8 u64 key_hash
 *   (xxh3_64 of the key's UTF-8 bytes); 16 u64 extent_offset (the object
 *   header's region offset); 24 u64 value_len; 32 u64 version; 40 u64 value
 *   checksum (xxh3_64 of the value); 48 u32 header_bytes; 52 u16 flags
 *   (CXLKV_IX_FLAG_*); 54 u8 region_no; 55 u8 tier; 56 u64 xxh3_64 of [0,56)
 *   with the final seq in place. Flags 0 (a tombstone; an all-zero
 *   never-written slot) is an empty slot.
 * Buckets of key hash h (B buckets): b1 = h & (B-1), b2 = (h >> 32) & (B-1),
 *   b2 = (b1 + 1) & (B-1) when equal, only b1 when B == 1; probed b1 then b2.
 */
#define CXLKV_INDEX_HEADER_BYTES 4096
#define CXLKV_INDEX_FORMAT_VERSION 1
#define CXLKV_INDEX_SLOT_BYTES 64
#define CXLKV_INDEX_BUCKET_SLOTS 8
#define CXLKV_INDEX_MAX_REGIONS 32
#define CXLKV_INDEX_PUBLISH_OFFSET 64
#define CXLKV_INDEX_OVERFLOW_OFFSET 72
#define CXLKV_INDEX_LEASE_OFFSET 128
#define CXLKV_INDEX_REGION_TABLE_OFFSET 256
#define CXLKV_INDEX_REGION_UUIDS_OFFSET 320
#define CXLKV_INDEX_SLOT_SPINS 64
/* Slot flags: LIVE, a committed object; ELSEWHERE, committed but not
 * readable from a CXL region (the leased RPC path serves it). */
#define CXLKV_IX_FLAG_LIVE 1
#define CXLKV_IX_FLAG_ELSEWHERE 2

/*
 * Outcome of one index lookup (cxlkv_ix_result_t.outcome):
 *   HIT        value copied and verified (probe: object header verified);
 *   MISS       definitely not committed (no slot, overflow 0);
 *   ELSEWHERE  committed, not readable here (flag, region unmapped, too large);
 *   TOO_SMALL  committed; the destination is under value_len bytes;
 *   UNSURE     cannot tell (index inactive, overflowed miss, slot never
 *              stable, copy did not verify twice): the leased RPC path.
 */
#define CXLKV_IX_HIT 0
#define CXLKV_IX_MISS 1
#define CXLKV_IX_ELSEWHERE 2
#define CXLKV_IX_TOO_SMALL 3
#define CXLKV_IX_UNSURE 4

/*
 * A reader's view of one index; filled once by the caller, read-only to the
 * calls (any number of threads may share one). regions[i] is the mapping of
 * region number i (NULL, or a closed region: not mapped here, ELSEWHERE);
 * max_value_bytes: larger values answer ELSEWHERE (0: no limit); invalidate:
 * drop the cache lines of every index and extent range before reading it
 * (non-coherent sharing); verify_first (with invalidate): the first copy of a
 * value goes through the cache, unless its bytes hash to the slot's checksum
 * the lookup drops every line and copies again -- the slot and header lines
 * are dropped either way.
 */
typedef struct cxlkv_index {
    const cxlkv_region_t *table_region;
    uint64_t header_offset;
    uint64_t table_offset;
    uint64_t buckets;
    const cxlkv_region_t *regions[32];
    uint64_t max_value_bytes;
    int invalidate;
    int verify_first;
} cxlkv_index_t;

/* One lookup's answer. value_len/version/tier/extent_offset/region_no are the
 * slot's (HIT, ELSEWHERE, TOO_SMALL); 0 for MISS and UNSURE. retries: 1 when
 * the first copy did not verify and the lookup was redone. */
typedef struct cxlkv_ix_result {
    uint32_t outcome;
    uint32_t tier;
    uint64_t value_len;
    uint64_t version;
    uint64_t extent_offset;
    uint32_t region_no;
    uint32_t retries;
} cxlkv_ix_result_t;

/*
 * Master: publish N slots of the table at table_offset (nslots slots, 64-byte
 * aligned). Slot slot_nos[i] gets key_hashes[i], extent_offsets[i],
 * value_lens[i], versions[i], value_hashes[i], header_bytes[i] and
 * meta[i] = flags | region_no << 16 | tier << 24, under the seqlock (seq made
 * odd, fields, checksum, seq even and 2 past the old even value). A tombstone
 * is key hash 0, meta 0, the rest 0. With `flush` each slot line is first
 * invalidated (the old seq read from memory) and written back after; one
 * fence ends the call. Every slot is checked before any is written:
 * CXLKV_E_RANGE (table outside the region, slot_nos[i] >= nslots: *bad_index),
 * CXLKV_E_INVAL (a NULL array, a misaligned table), CXLKV_E_CLOSED.
 */
int cxlkv_index_store(const cxlkv_region_t *r, uint64_t table_offset, uint64_t nslots,
                      uint64_t n, const uint64_t *slot_nos, const uint64_t *key_hashes,
                      const uint64_t *extent_offsets, const uint64_t *value_lens,
                      const uint64_t *versions, const uint64_t *value_hashes,
                      const uint32_t *header_bytes, const uint32_t *meta, int flush,
                      uint64_t *bad_index);

/*
 * Reader: look the key (key_len UTF-8 bytes, 1..4096) up in the index and, when
 * it is committed in a mapped region, copy its value to dst (dst_bytes; NULL
 * when 0) and verify it: the slot's seqlock and checksum, the extent inside its
 * region, the object header (key bytes, version, lengths, value checksum) and
 * the xxh3_64 of the bytes delivered to dst. A copy that does not verify is
 * redone once from the probe, then UNSURE: dst may then hold any bytes, but
 * HIT means dst[0, value_len) is one committed version's value. No lock, no
 * lease: the caller's leased RPC path covers ELSEWHERE and UNSURE.
 * Returns CXLKV_OK (the answer in *out), CXLKV_E_INVAL (a NULL argument, a bad
 * key length, a bad index description, dst overlapping the value),
 * CXLKV_E_RANGE (the index outside its region), CXLKV_E_CLOSED.
 */
int cxlkv_index_get(const cxlkv_index_t *ix, const char *key, uint64_t key_len,
                    void *dst, uint64_t dst_bytes, cxlkv_ix_result_t *out);

/*
 * N lookups in one call: key i is keys[key_offsets[i] .. +key_lens[i]), its
 * destination dsts[i] (dst_bytes[i] bytes). With prefix != 0 the call stops
 * after the first key whose outcome is not HIT. *done: keys answered (out[0,
 * done) valid); on an error, the position that failed. Keys and destinations
 * are checked before any lookup (CXLKV_E_INVAL).
 */
int cxlkv_index_get_many(const cxlkv_index_t *ix, uint64_t n, const char *keys,
                         uint64_t keys_bytes, const uint64_t *key_offsets,
                         const uint64_t *key_lens, void *const *dsts,
                         const uint64_t *dst_bytes, int prefix,
                         cxlkv_ix_result_t *out, uint64_t *done);

/*
 * cxlkv_index_get_many into one buffer: key i's destination is
 * buf[buf_offsets[i] .. +dst_bytes[i]), checked against buf_bytes before any
 * lookup (CXLKV_E_RANGE, *bad_index).
 */
int cxlkv_index_get_ranges(const cxlkv_index_t *ix, uint64_t n, const char *keys,
                           uint64_t keys_bytes, const uint64_t *key_offsets,
                           const uint64_t *key_lens, void *buf, uint64_t buf_bytes,
                           const uint64_t *buf_offsets, const uint64_t *dst_bytes,
                           int prefix, cxlkv_ix_result_t *out, uint64_t *done,
                           uint64_t *bad_index);

/*
 * Existence: HIT when a stable LIVE slot is found and, when its region is
 * mapped, the extent's object header matches it (key, version, lengths, value
 * checksum field; the value bytes are not read); ELSEWHERE for an ELSEWHERE
 * slot or an unmapped region; MISS and UNSURE as cxlkv_index_get.
 */
int cxlkv_index_probe(const cxlkv_index_t *ix, const char *key, uint64_t key_len,
                      cxlkv_ix_result_t *out);

/* N probes (keys as cxlkv_index_get_many), prefix stop and *done likewise. */
int cxlkv_index_probe_many(const cxlkv_index_t *ix, uint64_t n, const char *keys,
                           uint64_t keys_bytes, const uint64_t *key_offsets,
                           const uint64_t *key_lens, int prefix,
                           cxlkv_ix_result_t *out, uint64_t *done);

/*
 * SIGBUS guard: a mapped file that shrinks (truncated by someone else) makes
 * every access past its new end raise SIGBUS, which kills the process. Once
 * installed, the guard's handler turns such a fault inside a registered
 * mapping into zero memory: the pages from the faulting one to the end of the
 * mapping are replaced by private anonymous zero pages (MAP_FIXED), the
 * faulting access is retried and succeeds (reads see zeros, writes land in
 * private memory), and the mapping's hit counter grows. Faults elsewhere (or
 * of another kind than BUS_ADRERR) go to the handler that was installed before.
 *
 * cxlkv_guard_install: install the handler once per process (idempotent);
 *   returns CXLKV_OK or CXLKV_E_INVAL with errno.
 * cxlkv_guard_add / cxlkv_guard_remove: register / forget a mapping (before
 *   unmapping it); at most 8192 at once (CXLKV_E_TOO_LARGE when full). Callers
 *   serialise add/remove; the handler reads the table without locks.
 * cxlkv_guard_hits: faults absorbed in the mapping starting at `base` since it
 *   was added (0 if unknown); cxlkv_guard_total_hits: in all mappings, ever.
 */
int cxlkv_guard_install(int *err_errno);
int cxlkv_guard_add(void *base, uint64_t size_bytes);
int cxlkv_guard_remove(void *base);
uint64_t cxlkv_guard_hits(void *base);
uint64_t cxlkv_guard_total_hits(void);

#endif /* CXLKV_TRANSPORT_H */
