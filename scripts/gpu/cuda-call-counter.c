/*
 * Counts a process's CUDA driver calls by kind: kernel launches, host-to-device and
 * device-to-host copies, synchronisations, memsets, allocations. A CUPTI injection library: the
 * driver loads it into any CUDA program started with
 *
 *     CUDA_INJECTION64_PATH=/path/to/libcuda-call-counter.so EMBER_CUDA_COUNTS=out.json PROGRAM ...
 *
 * and at exit it writes every driver call's name and count to $EMBER_CUDA_COUNTS as JSON, with
 * totals per kind. Two runs of `ember bench` that differ only in their step count then give the
 * exact calls of one step: (count(N2) - count(N1)) / (N2 - N1). Built and used by
 * scripts/gpu-check.sh; the runtime API (cuBLAS, cudart) goes through the driver, so its calls
 * are counted too. Host-to-device copies are also counted by size (`htod_bytes`: up to 64 B, 1 KiB,
 * 64 KiB, more), which tells a kernel's few bytes of shape metadata from a tensor's upload.
 */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CBID 4096

static unsigned long long counts[MAX_CBID];
static CUpti_SubscriberHandle subscriber;

/* Host-to-device copies by size: <= 64 B, <= 1 KiB, <= 64 KiB, larger; and their total bytes. */
static unsigned long long htod_sizes[4];
static unsigned long long htod_total_bytes;

static void count_htod(size_t bytes) {
    int bucket = bytes <= 64 ? 0 : bytes <= 1024 ? 1 : bytes <= 65536 ? 2 : 3;
    __atomic_fetch_add(&htod_sizes[bucket], 1ULL, __ATOMIC_RELAXED);
    __atomic_fetch_add(&htod_total_bytes, (unsigned long long)bytes, __ATOMIC_RELAXED);
}

static void CUPTIAPI on_call(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                             const void *data) {
    (void)userdata;
    const CUpti_CallbackData *info = (const CUpti_CallbackData *)data;
    if (domain == CUPTI_CB_DOMAIN_DRIVER_API && info->callbackSite == CUPTI_API_ENTER && cbid < MAX_CBID) {
        __atomic_fetch_add(&counts[cbid], 1ULL, __ATOMIC_RELAXED);
        if (cbid == CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2)
            count_htod(((const cuMemcpyHtoDAsync_v2_params *)info->functionParams)->ByteCount);
        else if (cbid == CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2)
            count_htod(((const cuMemcpyHtoD_v2_params *)info->functionParams)->ByteCount);
    }
}

static const char *kind_of(const char *name) {
    if (strncmp(name, "cuLaunch", 8) == 0) return "launch";
    if (strncmp(name, "cuMemcpyHtoD", 12) == 0) return "htod";
    if (strncmp(name, "cuMemcpyDtoH", 12) == 0) return "dtoh";
    if (strncmp(name, "cuMemcpyDtoD", 12) == 0) return "dtod";
    if (strncmp(name, "cuMemcpy", 8) == 0) return "memcpy_other";
    if (strstr(name, "Synchronize") != NULL) return "sync";
    if (strncmp(name, "cuMemset", 8) == 0) return "memset";
    if (strncmp(name, "cuMemAlloc", 10) == 0 || strncmp(name, "cuMemFree", 9) == 0) return "alloc";
    return "other";
}

static void write_counts(void) {
    const char *path = getenv("EMBER_CUDA_COUNTS");
    FILE *f = path ? fopen(path, "w") : stderr;
    if (!f) return;
    static const char *kinds[] = {"launch", "htod", "dtoh", "dtod", "memcpy_other", "sync", "memset", "alloc", "other"};
    unsigned long long totals[9] = {0};
    fprintf(f, "{\"calls\": {");
    int first = 1;
    for (unsigned i = 0; i < MAX_CBID; ++i) {
        if (counts[i] == 0) continue;
        const char *name = NULL;
        if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, i, &name) != CUPTI_SUCCESS || !name) name = "?";
        const char *kind = kind_of(name);
        for (int k = 0; k < 9; ++k)
            if (strcmp(kind, kinds[k]) == 0) totals[k] += counts[i];
        fprintf(f, "%s\"%s\": %llu", first ? "" : ", ", name, counts[i]);
        first = 0;
    }
    fprintf(f, "}, \"kinds\": {");
    for (int k = 0; k < 9; ++k) fprintf(f, "%s\"%s\": %llu", k ? ", " : "", kinds[k], totals[k]);
    fprintf(f, "}, \"htod_bytes\": {\"le_64\": %llu, \"le_1k\": %llu, \"le_64k\": %llu, \"gt_64k\": %llu, \"total\": %llu}}\n",
            htod_sizes[0], htod_sizes[1], htod_sizes[2], htod_sizes[3], htod_total_bytes);
    if (path) fclose(f);
}

int InitializeInjection(void) {
    if (cuptiSubscribe(&subscriber, (CUpti_CallbackFunc)on_call, NULL) != CUPTI_SUCCESS) {
        fprintf(stderr, "cuda-call-counter: cuptiSubscribe failed\n");
        return 0;
    }
    if (cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API) != CUPTI_SUCCESS) {
        fprintf(stderr, "cuda-call-counter: cuptiEnableDomain failed\n");
        return 0;
    }
    atexit(write_counts);
    return 1;
}
