/*
 * guard.c -- the SIGBUS guard (see cxlkv_transport.h): a region file that
 * shrinks under its mapping reads zeros instead of killing the process.
 */
#include "internal.h"

#include <errno.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

/* regions and tier files, and every shared buffer clientd maps (at most 4,096) */
#define CXLKV_GUARD_SLOTS 8192

/* A slot is live while base != 0; the handler reads base, then size. Writers
 * (add/remove, serialised by the caller) publish size before base. */
static struct {
    uintptr_t base;
    uint64_t size;
    uint64_t hits;
} guard_slots[CXLKV_GUARD_SLOTS];
static uint64_t guard_total;
static struct sigaction guard_previous;
static int guard_installed;
static uintptr_t guard_page_bytes = 4096; /* set at install, read by the handler */

static void
guard_handler(int sig, siginfo_t *si, void *ctx)
{
    uintptr_t addr = (uintptr_t)si->si_addr;
    int i;

    if (si->si_code == BUS_ADRERR) {
        for (i = 0; i < CXLKV_GUARD_SLOTS; i++) {
            uintptr_t base = __atomic_load_n(&guard_slots[i].base, __ATOMIC_ACQUIRE);
            uint64_t size;
            uintptr_t page, end;
            int saved;

            if (base == 0 || addr < base)
                continue;
            size = __atomic_load_n(&guard_slots[i].size, __ATOMIC_RELAXED);
            end = base + (uintptr_t)size;
            if (addr >= end)
                continue;
            page = addr & ~(guard_page_bytes - 1);
            saved = errno;
            /* mmap is a plain system call here: safe in a handler in practice */
            if (mmap((void *)page, (size_t)(end - page), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED) {
                errno = saved;
                break; /* cannot absorb it: let the previous handler have it */
            }
            errno = saved;
            __atomic_add_fetch(&guard_slots[i].hits, 1, __ATOMIC_RELAXED);
            __atomic_add_fetch(&guard_total, 1, __ATOMIC_RELAXED);
            return; /* the access is retried on zero memory */
        }
    }
    /* Not ours: hand it to whoever had SIGBUS before (default: die with a core). */
    if (guard_previous.sa_flags & SA_SIGINFO) {
        if (guard_previous.sa_sigaction != NULL) {
            guard_previous.sa_sigaction(sig, si, ctx);
            return;
        }
    } else if (guard_previous.sa_handler != SIG_DFL && guard_previous.sa_handler != SIG_IGN &&
               guard_previous.sa_handler != NULL) {
        guard_previous.sa_handler(sig);
        return;
    }
    signal(SIGBUS, SIG_DFL); /* the fault repeats on return and kills the process */
}

int
cxlkv_guard_install(int *err_errno)
{
    struct sigaction sa;

    *err_errno = 0;
    if (__atomic_load_n(&guard_installed, __ATOMIC_ACQUIRE))
        return CXLKV_OK;
    guard_page_bytes = (uintptr_t)cxlkv_page_bytes();
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = guard_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &guard_previous) != 0) {
        *err_errno = errno;
        return CXLKV_E_INVAL;
    }
    __atomic_store_n(&guard_installed, 1, __ATOMIC_RELEASE);
    return CXLKV_OK;
}

int
cxlkv_guard_add(void *base, uint64_t size_bytes)
{
    int i;

    if (base == NULL || size_bytes == 0)
        return CXLKV_E_INVAL;
    for (i = 0; i < CXLKV_GUARD_SLOTS; i++) {
        if (__atomic_load_n(&guard_slots[i].base, __ATOMIC_ACQUIRE) == (uintptr_t)base)
            return CXLKV_OK;
    }
    for (i = 0; i < CXLKV_GUARD_SLOTS; i++) {
        if (__atomic_load_n(&guard_slots[i].base, __ATOMIC_ACQUIRE) == 0) {
            __atomic_store_n(&guard_slots[i].size, size_bytes, __ATOMIC_RELAXED);
            __atomic_store_n(&guard_slots[i].hits, 0, __ATOMIC_RELAXED);
            __atomic_store_n(&guard_slots[i].base, (uintptr_t)base, __ATOMIC_RELEASE);
            return CXLKV_OK;
        }
    }
    return CXLKV_E_TOO_LARGE;
}

int
cxlkv_guard_remove(void *base)
{
    int i;

    for (i = 0; i < CXLKV_GUARD_SLOTS; i++) {
        if (__atomic_load_n(&guard_slots[i].base, __ATOMIC_ACQUIRE) == (uintptr_t)base) {
            __atomic_store_n(&guard_slots[i].base, 0, __ATOMIC_RELEASE);
            return CXLKV_OK;
        }
    }
    return CXLKV_OK;
}

uint64_t
cxlkv_guard_hits(void *base)
{
    int i;

    for (i = 0; i < CXLKV_GUARD_SLOTS; i++) {
        if (__atomic_load_n(&guard_slots[i].base, __ATOMIC_ACQUIRE) == (uintptr_t)base)
            return __atomic_load_n(&guard_slots[i].hits, __ATOMIC_RELAXED);
    }
    return 0;
}

uint64_t
cxlkv_guard_total_hits(void)
{
    return __atomic_load_n(&guard_total, __ATOMIC_RELAXED);
}
