/*
 * dispatch.c -- the run-time CPU dispatch state: which cache-line
 * instructions, copy kernels and non-coherent kernels this process uses, set
 * once at load by cpu_init (arch_x86.c, arch_aarch64.c, arch_generic.c), and
 * the getters and setters of cxlkv_transport.h over it.
 *
 * Portability: builds for any x86-64 (no -march): the CLWB and CLFLUSHOPT
 * paths are compiled with per-function target attributes and chosen at load
 * time from CPUID. aarch64 uses DC CVAC / DC CIVAC; other architectures get
 * fences only (and report "none").
 */
#include "internal.h"

#include <unistd.h>

uint64_t g_line_bytes = 64;
cxlkv_lines_fn g_flush_fn;
cxlkv_lines_fn g_invalidate_fn;
const char *g_flush_name = "none";
const char *g_invalidate_name = "none";
volatile int g_ready;

cxlkv_copy_fn g_copy_fn;
const char *g_copy_kernel = "memmove";
size_t g_vector_min = SIZE_MAX;
size_t g_stream_threshold = SIZE_MAX;

cxlkv_stream_fn g_stream_fn;
const char *g_nc_write_name = "cached";
cxlkv_lines_nf_fn g_wb_nf;
cxlkv_lines_nf_fn g_drop_nf;
size_t g_nc_chunk = (size_t)128 << 10;
cxlkv_copy_drop_fn g_copy_drop_fn;

__attribute__((constructor)) void
cxlkv_init(void)
{
    cpu_init();
    copy_hash_init();
    g_ready = 1;
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
