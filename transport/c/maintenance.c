/*
 * maintenance.c -- cache maintenance and prefault of a range of a region:
 * flush (write back), invalidate (drop), prefault (populate the page tables).
 */
#include "internal.h"

#include <errno.h>
#include <sys/mman.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux >= 5.14; older kernels answer EINVAL */
#endif

static int
run_lines(const cxlkv_region_t *r, uint64_t offset, uint64_t length,
          cxlkv_lines_fn fn)
{
    uintptr_t start;
    char *end;
    int rc = check(r, offset, length);

    if (rc != CXLKV_OK)
        return rc;
    ensure_ready();
    start = (uintptr_t)r->base + (uintptr_t)offset;
    end = (char *)start + length;
    start &= ~(uintptr_t)(g_line_bytes - 1);
    fn((char *)start, end, g_line_bytes); /* ends with the fence even for length 0 */
    return CXLKV_OK;
}

int
cxlkv_flush(const cxlkv_region_t *r, uint64_t offset, uint64_t length)
{
    ensure_ready();
    return run_lines(r, offset, length, g_flush_fn);
}

int
cxlkv_invalidate(const cxlkv_region_t *r, uint64_t offset, uint64_t length)
{
    ensure_ready();
    return run_lines(r, offset, length, g_invalidate_fn);
}

int
cxlkv_prefault(const cxlkv_region_t *r, uint64_t offset, uint64_t length,
               int *err_errno)
{
    uint64_t page = cxlkv_page_bytes();
    uintptr_t start, end;
    int rc = check(r, offset, length);

    *err_errno = 0;
    if (rc != CXLKV_OK)
        return rc;
    if (length == 0)
        return CXLKV_OK;
    /* The mapping starts on a page boundary, so rounding stays inside it. */
    start = ((uintptr_t)r->base + (uintptr_t)offset) & ~(uintptr_t)(page - 1);
    end = (uintptr_t)r->base + (uintptr_t)offset + (uintptr_t)length;
    if (madvise((void *)start, end - start, MADV_POPULATE_WRITE) == 0)
        return CXLKV_OK;
    if (errno != EINVAL && errno != ENOSYS) {
        *err_errno = errno;
        return CXLKV_E_PREFAULT;
    }
    /* Old kernel: a locked add of 0 write-faults each page without racing
     * other writers of the shared mapping. */
    for (; start < end; start += page)
        __atomic_fetch_add((volatile uint8_t *)start, 0, __ATOMIC_RELAXED);
    return CXLKV_OK;
}

