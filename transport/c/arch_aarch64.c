/*
 * arch_aarch64.c -- aarch64: DC CVAC / DC CIVAC by the line size CTR_EL0 gives;
 * no non-coherent write kernel (the cached copy + write-back path).
 */
#include "internal.h"

#if defined(__aarch64__)

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

int
cpu_has(const char *name)
{
    return strcmp(name, "cached") == 0;
}

cxlkv_stream_fn
stream_kernel(const char *name)
{
    (void)name;
    return NULL;
}

void
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
#endif /* __aarch64__ */
