/*
 * arch_generic.c -- architectures without known user-space cache maintenance:
 * fences only (flush and invalidate report "none").
 */
#include "internal.h"

#if !defined(CXLKV_X86) && !defined(__aarch64__)

static void
lines_fence_only(char *p, const char *end, uint64_t line)
{
    (void)p;
    (void)end;
    (void)line;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

static void
lines_none(const char *p, const char *end, uint64_t line)
{
    (void)p;
    (void)end;
    (void)line;
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
    g_flush_fn = lines_fence_only;
    g_invalidate_fn = lines_fence_only;
    g_wb_nf = lines_none;
    g_drop_nf = lines_none;
}

void
cxlkv_fence(void)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
#endif
