/*
 * mapping.c -- map a DAX device or a file MAP_SHARED (cxlkv_map: geometry from
 * sysfs for device DAX), unmap, and retire (a mapping replaced by an inaccessible
 * one, so late users fault instead of touching reused memory).
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <unistd.h>

/* Read one unsigned decimal or 0x-hex integer from a sysfs file. */
static int
read_sysfs_u64(const char *path, uint64_t *value)
{
    char buf[64];
    char *end;
    ssize_t n;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0)
        return -1;
    n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) {
        errno = n == 0 ? EIO : errno;
        return -1;
    }
    buf[n] = '\0';
    errno = 0;
    *value = strtoull(buf, &end, 0);
    if (errno != 0 || end == buf) {
        errno = errno ? errno : EINVAL;
        return -1;
    }
    return 0;
}

/*
 * Size and alignment of the DAX device behind char device `st`:
 * /sys/dev/char/MAJ:MIN links to the device directory whose name (daxX.Y)
 * is looked up in /sys/bus/dax/devices/. A char device without that entry
 * is not a DAX device.
 */
static int
dax_geometry(const struct stat *st, uint64_t *size, uint64_t *align, int *err)
{
    char link[64], target[PATH_MAX], path[PATH_MAX + 64];
    const char *name;
    ssize_t n;

    snprintf(link, sizeof link, "/sys/dev/char/%u:%u", major(st->st_rdev),
             minor(st->st_rdev));
    n = readlink(link, target, sizeof target - 1);
    if (n < 0)
        return CXLKV_E_NOT_MAPPABLE;
    target[n] = '\0';
    name = strrchr(target, '/');
    name = name ? name + 1 : target;

    snprintf(path, sizeof path, "/sys/bus/dax/devices/%s/size", name);
    if (read_sysfs_u64(path, size) != 0) {
        if (errno == ENOENT)
            return CXLKV_E_NOT_MAPPABLE;
        *err = errno;
        return CXLKV_E_SYSFS;
    }
    snprintf(path, sizeof path, "/sys/bus/dax/devices/%s/align", name);
    if (read_sysfs_u64(path, align) != 0 || *align == 0)
        *align = CXLKV_DAX_ALIGN_BYTES; /* kernels before 5.10 have no align file */
    return CXLKV_OK;
}

int
cxlkv_map(const char *path, uint64_t want_size_bytes, int create,
          cxlkv_region_t *out, int *err_errno)
{
    struct stat st;
    uint64_t size = 0, align = cxlkv_page_bytes();
    int fd, rc = CXLKV_OK, is_dax = 0, created = 0;
    void *base;

    if (err_errno == NULL || out == NULL || path == NULL)
        return CXLKV_E_INVAL;
    *err_errno = 0;
    memset(out, 0, sizeof *out);
    if (create && want_size_bytes == 0)
        return CXLKV_E_INVAL;

    fd = open(path, O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0660);
    if (fd < 0) {
        *err_errno = errno;
        return CXLKV_E_OPEN;
    }
    if (fstat(fd, &st) != 0) {
        *err_errno = errno;
        rc = CXLKV_E_STAT;
        goto out_close;
    }
    if (S_ISREG(st.st_mode)) {
        size = (uint64_t)st.st_size;
        if (size == 0 && create) {
            if (want_size_bytes > (uint64_t)INT64_MAX ||
                ftruncate(fd, (off_t)want_size_bytes) != 0) {
                *err_errno = want_size_bytes > (uint64_t)INT64_MAX ? EFBIG : errno;
                rc = CXLKV_E_TRUNCATE;
                goto out_close;
            }
            size = want_size_bytes;
            created = 1;
        }
    } else if (S_ISCHR(st.st_mode)) {
        rc = dax_geometry(&st, &size, &align, err_errno);
        if (rc != CXLKV_OK)
            goto out_close;
        is_dax = 1;
    } else {
        rc = CXLKV_E_NOT_MAPPABLE;
        goto out_close;
    }

    out->size_bytes = size;
    out->align_bytes = align;
    out->is_dax = is_dax;
    out->created = created;
    if (size == 0) {
        rc = CXLKV_E_SIZE_ZERO;
        goto out_close;
    }
    if (want_size_bytes != 0 && size != want_size_bytes) {
        rc = CXLKV_E_SIZE_MISMATCH;
        goto out_close;
    }
    if (is_dax && size % align != 0) {
        rc = CXLKV_E_ALIGN;
        goto out_close;
    }
    if (size > (uint64_t)SIZE_MAX) {
        rc = CXLKV_E_TOO_LARGE;
        goto out_close;
    }
    base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        *err_errno = errno;
        rc = CXLKV_E_MMAP;
        goto out_close;
    }
    out->base = base;

out_close:
    close(fd); /* the mapping keeps the file referenced */
    return rc;
}

int
cxlkv_unmap(cxlkv_region_t *r, int *err_errno)
{
    *err_errno = 0;
    if (r == NULL)
        return CXLKV_E_INVAL;
    if (r->base == NULL)
        return CXLKV_OK;
    if (munmap(r->base, (size_t)r->size_bytes) != 0) {
        *err_errno = errno;
        return CXLKV_E_MMAP;
    }
    r->base = NULL;
    r->size_bytes = 0;
    return CXLKV_OK;
}

int
cxlkv_retire(cxlkv_region_t *r, int *err_errno)
{
    void *p;

    *err_errno = 0;
    if (r == NULL)
        return CXLKV_E_INVAL;
    if (r->base == NULL)
        return CXLKV_OK;
    p = mmap(r->base, (size_t)r->size_bytes, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        *err_errno = errno;
        return CXLKV_E_MMAP;
    }
    r->base = NULL;
    r->size_bytes = 0;
    return CXLKV_OK;
}

