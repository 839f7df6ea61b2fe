/*
 * copyhash.c -- copy while hashing: one pass that moves n bytes and returns
 * the xxh3_64 (seed 0) of the bytes it stored, equal to
 * XXH3_64bits(dst, n) -- and to python-xxhash's xxh3_64_intdigest -- bit for
 * bit (tests/transport/test_copy_hash.py checks every kernel against it).
 *
 * Why: a reader that holds no lease (the region index, docs/index.md) must hash
 * the bytes it delivers, not a second load of the source. Copying, then
 * hashing the destination, is two passes; the second one, from this core's
 * cache, cost as much as a third of a 1 MiB read (measured on this project's
 * 2-vCPU Xeon VM: memcpy 71-83 us, copy then hash 141-194 us, this kernel
 * 68-85 us, at every dst - src offset mod 4 KiB). The fused kernels load each
 * 64-byte stripe of the source once, store it, and feed the same register to
 * xxh3's accumulator: the hash is of exactly the bytes stored, and the copy
 * runs at memcpy's speed because the hash's arithmetic hides under the loads.
 *
 * The accumulate and scramble steps are those of xxHash 0.8.4 (Yann Collet,
 * BSD 2-Clause; third_party/xxhash/xxhash.h: XXH3_accumulate_512_avx512 /
 * _avx2, XXH3_scrambleAcc_avx512 / _avx2, XXH3_hashLong_internal_loop) with a
 * store added after each load; the short-input paths (n <= 240), the last
 * stripe and the final merge are xxHash's own functions, run on the stored
 * destination.
 *
 * Kernels: "avx512" (AVX-512F), "avx2", and "two-pass" (copy, then XXH3_64bits
 * of the destination chunk by chunk: other CPUs and architectures). Chosen at
 * load (copy_hash_init); cxlkv_set_copy_hash_kernel() picks another (tests,
 * benchmarks). Source and destination must not overlap.
 */
#include "internal.h"

#ifdef CXLKV_X86
#include <immintrin.h>
#endif

/* xxHash's internals (kSecret, the accumulators' initial values, the scalar
 * stripe, mergeAccs), as private static functions of this file only. */
#define XXH_INLINE_ALL
#include "xxhash.h"

cxlkv_copy_hash_fn g_copy_hash_fn = copy_hash_two_pass;
const char *g_copy_hash_name = "two-pass";

uint64_t
copy_hash_two_pass(char *dst, const char *src, size_t n)
{
    XXH3_state_t state;
    size_t done = 0;

    if (n <= CXLKV_HASH_CHUNK_BYTES) {
        if (n != 0)
            copy_plain(dst, src, n, 0);
        return XXH3_64bits(n != 0 ? (const void *)dst : (const void *)"", n);
    }
    (void)XXH3_64bits_reset(&state);
    while (done < n) {
        size_t c = n - done < CXLKV_HASH_CHUNK_BYTES ? n - done : CXLKV_HASH_CHUNK_BYTES;

        copy_plain(dst + done, src + done, c, 0);
        (void)XXH3_64bits_update(&state, dst + done, c);
        done += c;
    }
    return XXH3_64bits_digest(&state);
}

/* XXH3_hashLong_64b's geometry for the default secret (192 bytes). */
#define STRIPE 64
#define STRIPES_PER_BLOCK ((sizeof(XXH3_kSecret) - STRIPE) / 8) /* 16 */
#define BLOCK (STRIPE * STRIPES_PER_BLOCK)                        /* 1024 bytes */

/* The end of a long hash, on the destination once every byte is stored: the
 * last stripe (overlapping the one before), then the merge. */
static uint64_t
finish_long(xxh_u64 *acc, const char *dst, size_t n)
{
    const xxh_u8 *secret = XXH3_kSecret;

    XXH3_accumulate_512_scalar(acc, dst + n - STRIPE,
                               secret + sizeof(XXH3_kSecret) - STRIPE - 7 /* XXH_SECRET_LASTACC_START */);
    return XXH3_mergeAccs(acc, secret + 11 /* XXH_SECRET_MERGEACCS_START */, (xxh_u64)n * XXH_PRIME64_1);
}

#ifdef CXLKV_X86

__attribute__((target("avx512f"))) static inline __m512i
stripe_avx512(__m512i acc, char *dst, const char *src, const xxh_u8 *secret)
{
    __m512i const data = _mm512_loadu_si512((const void *)src);
    __m512i const key = _mm512_loadu_si512((const void *)secret);
    __m512i const data_key = _mm512_xor_si512(data, key);
    __m512i const product = _mm512_mul_epu32(data_key, _mm512_srli_epi64(data_key, 32));
    __m512i const swapped = _mm512_shuffle_epi32(data, (_MM_PERM_ENUM)_MM_SHUFFLE(1, 0, 3, 2));

    _mm512_storeu_si512((void *)dst, data);
    return _mm512_add_epi64(product, _mm512_add_epi64(acc, swapped));
}

__attribute__((target("avx512f"))) static inline __m512i
scramble_avx512(__m512i acc, const xxh_u8 *secret)
{
    __m512i const prime32 = _mm512_set1_epi32((int)XXH_PRIME32_1);
    __m512i const key = _mm512_loadu_si512((const void *)secret);
    __m512i const data_key = _mm512_ternarylogic_epi32(key, acc, _mm512_srli_epi64(acc, 47), 0x96);
    __m512i const lo = _mm512_mul_epu32(data_key, prime32);
    __m512i const hi = _mm512_mul_epu32(_mm512_srli_epi64(data_key, 32), prime32);

    return _mm512_add_epi64(lo, _mm512_slli_epi64(hi, 32));
}

__attribute__((target("avx512f"))) static uint64_t
copy_hash_avx512(char *dst, const char *src, size_t n)
{
    const xxh_u8 *secret = XXH3_kSecret;
    XXH_ALIGN(64) xxh_u64 acc[8] = XXH3_INIT_ACC;
    size_t const blocks = (n - 1) / BLOCK, stripes = ((n - 1) - BLOCK * blocks) / STRIPE;
    size_t b, s, done;
    __m512i a;

    if (n <= XXH3_MIDSIZE_MAX) {
        if (n != 0)
            memcpy(dst, src, n);
        return XXH3_64bits(n != 0 ? (const void *)dst : (const void *)"", n);
    }
    a = _mm512_load_si512((const void *)acc);
    for (b = 0; b < blocks; b++) {
        const size_t at = b * BLOCK;

        for (s = 0; s < STRIPES_PER_BLOCK; s++)
            a = stripe_avx512(a, dst + at + s * STRIPE, src + at + s * STRIPE, secret + s * 8);
        a = scramble_avx512(a, secret + sizeof(XXH3_kSecret) - STRIPE);
    }
    for (s = 0; s < stripes; s++)
        a = stripe_avx512(a, dst + blocks * BLOCK + s * STRIPE, src + blocks * BLOCK + s * STRIPE, secret + s * 8);
    done = blocks * BLOCK + stripes * STRIPE;
    memcpy(dst + done, src + done, n - done); /* the last 1..64 bytes */
    _mm512_store_si512((void *)acc, a);
    return finish_long(acc, dst, n);
}

__attribute__((target("avx2"))) static inline void
stripe_avx2(__m256i acc[2], char *dst, const char *src, const xxh_u8 *secret)
{
    int i;

    for (i = 0; i < 2; i++) {
        __m256i const data = _mm256_loadu_si256((const __m256i *)(const void *)(src + 32 * i));
        __m256i const key = _mm256_loadu_si256((const __m256i *)(const void *)(secret + 32 * i));
        __m256i const data_key = _mm256_xor_si256(data, key);
        __m256i const product = _mm256_mul_epu32(data_key, _mm256_srli_epi64(data_key, 32));
        __m256i const swapped = _mm256_shuffle_epi32(data, _MM_SHUFFLE(1, 0, 3, 2));

        _mm256_storeu_si256((__m256i *)(void *)(dst + 32 * i), data);
        acc[i] = _mm256_add_epi64(product, _mm256_add_epi64(acc[i], swapped));
    }
}

__attribute__((target("avx2"))) static inline void
scramble_avx2(__m256i acc[2], const xxh_u8 *secret)
{
    __m256i const prime32 = _mm256_set1_epi32((int)XXH_PRIME32_1);
    int i;

    for (i = 0; i < 2; i++) {
        __m256i const key = _mm256_loadu_si256((const __m256i *)(const void *)(secret + 32 * i));
        __m256i const data_key = _mm256_xor_si256(_mm256_xor_si256(acc[i], _mm256_srli_epi64(acc[i], 47)), key);
        __m256i const lo = _mm256_mul_epu32(data_key, prime32);
        __m256i const hi = _mm256_mul_epu32(_mm256_srli_epi64(data_key, 32), prime32);

        acc[i] = _mm256_add_epi64(lo, _mm256_slli_epi64(hi, 32));
    }
}

__attribute__((target("avx2"))) static uint64_t
copy_hash_avx2(char *dst, const char *src, size_t n)
{
    const xxh_u8 *secret = XXH3_kSecret;
    XXH_ALIGN(64) xxh_u64 acc[8] = XXH3_INIT_ACC;
    size_t const blocks = (n - 1) / BLOCK, stripes = ((n - 1) - BLOCK * blocks) / STRIPE;
    size_t b, s, done;
    __m256i a[2];

    if (n <= XXH3_MIDSIZE_MAX) {
        if (n != 0)
            memcpy(dst, src, n);
        return XXH3_64bits(n != 0 ? (const void *)dst : (const void *)"", n);
    }
    a[0] = _mm256_load_si256((const __m256i *)(const void *)acc);
    a[1] = _mm256_load_si256((const __m256i *)(const void *)(acc + 4));
    for (b = 0; b < blocks; b++) {
        const size_t at = b * BLOCK;

        for (s = 0; s < STRIPES_PER_BLOCK; s++)
            stripe_avx2(a, dst + at + s * STRIPE, src + at + s * STRIPE, secret + s * 8);
        scramble_avx2(a, secret + sizeof(XXH3_kSecret) - STRIPE);
    }
    for (s = 0; s < stripes; s++)
        stripe_avx2(a, dst + blocks * BLOCK + s * STRIPE, src + blocks * BLOCK + s * STRIPE, secret + s * 8);
    done = blocks * BLOCK + stripes * STRIPE;
    memcpy(dst + done, src + done, n - done);
    _mm256_store_si256((__m256i *)(void *)acc, a[0]);
    _mm256_store_si256((__m256i *)(void *)(acc + 4), a[1]);
    return finish_long(acc, dst, n);
}

#endif /* CXLKV_X86 */

static cxlkv_copy_hash_fn
copy_hash_kernel(const char *name)
{
#ifdef CXLKV_X86
    if (strcmp(name, "avx512") == 0 && __builtin_cpu_supports("avx512f"))
        return copy_hash_avx512;
    if (strcmp(name, "avx2") == 0 && __builtin_cpu_supports("avx2"))
        return copy_hash_avx2;
#endif
    if (strcmp(name, "two-pass") == 0)
        return copy_hash_two_pass;
    return NULL;
}

void
copy_hash_init(void)
{
#ifdef CXLKV_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        g_copy_hash_fn = copy_hash_avx512;
        g_copy_hash_name = "avx512";
    } else if (__builtin_cpu_supports("avx2")) {
        g_copy_hash_fn = copy_hash_avx2;
        g_copy_hash_name = "avx2";
    }
#endif
}

const char *
cxlkv_copy_hash_kernel(void)
{
    ensure_ready();
    return g_copy_hash_name;
}

int
cxlkv_set_copy_hash_kernel(const char *name)
{
    static const char *const names[] = {"avx512", "avx2", "two-pass"};
    cxlkv_copy_hash_fn fn;
    size_t i;

    ensure_ready();
    if (name == NULL || (fn = copy_hash_kernel(name)) == NULL)
        return CXLKV_E_INVAL;
    for (i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i]) == 0)
            g_copy_hash_name = names[i]; /* a static string: `name` is the caller's */
    g_copy_hash_fn = fn;
    return CXLKV_OK;
}

int
cxlkv_copy_hash(void *dst, const void *src, uint64_t length, uint64_t *hash_out)
{
    if (hash_out == NULL || (length != 0 && (dst == NULL || src == NULL)))
        return CXLKV_E_INVAL;
    if (!disjoint((const char *)dst, (const char *)src, length))
        return CXLKV_E_INVAL;
    ensure_ready();
    *hash_out = g_copy_hash_fn((char *)dst, (const char *)src, (size_t)length);
    return CXLKV_OK;
}
