/*
 * A stand-in for libze_loader.so.1 for tests: exports the Level Zero Sysman (zes*) calls that
 * pyzes 0.1.3 wraps and that memsaver uses, with devices, memory modules and processes read from
 * a control file on EVERY call, so a test can change "free" while a recorder is polling.
 *
 * Control file: path in $FAKE_ZE_CONTROL, lines "key=value" ('#' comments), numbers in C syntax
 * (decimal or 0x..); without one, zesInit fails with ZE_RESULT_ERROR_UNINITIALIZED. Keys (D = device index, M = module index, P = process index):
 *   drivers=1                      number of drivers (all devices belong to driver 0)
 *   devices=1                      number of devices
 *   frozen=0                       1: zesMemoryGetState keeps returning the first free it saw
 *   result.<call>=0x78000004       force a ze_result_t from <call> (every device)
 *   devD.result.<call>=...         force it for one device (and its memory modules)
 *   sleep_ms.<call>=300            sleep inside <call> (devD.sleep_ms.<call> for one device)
 *   devD.name / devD.uuid (32 hex digits) / devD.bdf (dddd:bb:dd.f) / devD.subdevices
 *   devD.device_id / devD.driver_version
 *   devD.modules=2  devD.modM.location=device|system  devD.modM.subdevice=-1|T
 *   devD.modM.size / devD.modM.free / devD.modM.physical
 *   devD.processes=1  devD.procP.pid / devD.procP.mem / devD.procP.shared
 *
 * Structure layouts follow zes_api.h / ze_api.h (spec 1.x); it is deliberately stricter than a
 * real driver in one way: a wrong stype is rejected with ZE_RESULT_ERROR_INVALID_ARGUMENT.
 * Build with -DFAKE_ZE_NO_ZESINIT to imitate a loader too old to export zesInit.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int32_t ze_result_t;
typedef uint8_t ze_bool_t;
typedef void *zes_driver_handle_t;
typedef void *zes_device_handle_t;
typedef void *zes_mem_handle_t;

#define ZE_RESULT_SUCCESS 0
#define ZE_RESULT_ERROR_UNINITIALIZED 0x78000001
#define ZE_RESULT_ERROR_INVALID_ARGUMENT 0x78000004
#define ZE_RESULT_ERROR_INVALID_NULL_HANDLE 0x78000005
#define ZE_RESULT_ERROR_INVALID_NULL_POINTER 0x78000007
#define ZE_RESULT_ERROR_INVALID_SIZE 0x78000008

#define ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES 0x1
#define ZES_STRUCTURE_TYPE_PCI_PROPERTIES 0x2
#define ZES_STRUCTURE_TYPE_MEM_PROPERTIES 0xb
#define ZES_STRUCTURE_TYPE_PROCESS_STATE 0x16
#define ZES_STRUCTURE_TYPE_MEM_STATE 0x1e

typedef struct { uint8_t id[16]; } ze_device_uuid_t;

typedef struct {
    int32_t stype;
    void *pNext;
    int32_t type;
    uint32_t vendorId;
    uint32_t deviceId;
    uint32_t flags;
    uint32_t subdeviceId;
    uint32_t coreClockRate;
    uint64_t maxMemAllocSize;
    uint32_t maxHardwareContexts;
    uint32_t maxCommandQueuePriority;
    uint32_t numThreadsPerEU;
    uint32_t physicalEUSimdWidth;
    uint32_t numEUsPerSubslice;
    uint32_t numSubslicesPerSlice;
    uint32_t numSlices;
    uint64_t timerResolution;
    uint32_t timestampValidBits;
    uint32_t kernelTimestampValidBits;
    ze_device_uuid_t uuid;
    char name[256];
} ze_device_properties_t;

typedef struct {
    int32_t stype;
    void *pNext;
    ze_device_properties_t core;
    uint32_t numSubdevices;
    char serialNumber[64];
    char boardNumber[64];
    char brandName[64];
    char modelName[64];
    char vendorName[64];
    char driverVersion[64];
} zes_device_properties_t;

typedef struct { uint32_t domain, bus, device, function; } zes_pci_address_t;
typedef struct { int32_t gen, width; int64_t maxBandwidth; } zes_pci_speed_t;
typedef struct {
    int32_t stype;
    void *pNext;
    zes_pci_address_t address;
    zes_pci_speed_t maxSpeed;
    ze_bool_t haveBandwidthCounters, havePacketCounters, haveReplayCounters;
} zes_pci_properties_t;

typedef struct {
    int32_t stype;
    void *pNext;
    int32_t type;
    ze_bool_t onSubdevice;
    uint32_t subdeviceId;
    int32_t location;
    uint64_t physicalSize;
    int32_t busWidth;
    int32_t numChannels;
} zes_mem_properties_t;

typedef struct {
    int32_t stype;
    const void *pNext;
    int32_t health;
    uint64_t free;
    uint64_t size;
} zes_mem_state_t;

typedef struct {
    int32_t stype;
    void *pNext;
    uint32_t processId;
    uint64_t memSize;
    uint64_t sharedSize;
    uint32_t engines;
} zes_process_state_t;

/* ---- control file ------------------------------------------------------------------------ */
#define MAX_KV 1024
#define MAX_DEV 16
#define MAX_MOD 16

typedef struct { char key[96]; char val[256]; } kv_t;
typedef struct { int n; kv_t kv[MAX_KV]; } cfg_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_initialized = 0;
static int g_have_frozen[MAX_DEV][MAX_MOD];
static uint64_t g_frozen_free[MAX_DEV][MAX_MOD];

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r')) *--e = 0;
    return s;
}

static cfg_t *cfg_load(void) {
    cfg_t *c = calloc(1, sizeof(cfg_t));
    if (!c) return NULL;
    const char *path = getenv("FAKE_ZE_CONTROL");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) { /* no control file: behave like a loader with no GPU driver behind it */
        snprintf(c->kv[0].key, sizeof c->kv[0].key, "result.zesInit");
        snprintf(c->kv[0].val, sizeof c->kv[0].val, "0x78000001");
        c->n = 1;
        return c;
    }
    char line[512];
    while (fgets(line, sizeof line, f) && c->n < MAX_KV) {
        char *s = trim(line);
        if (!*s || *s == '#') continue;
        char *eq = strchr(s, '=');
        if (!eq) continue;
        *eq = 0;
        snprintf(c->kv[c->n].key, sizeof c->kv[c->n].key, "%s", trim(s));
        snprintf(c->kv[c->n].val, sizeof c->kv[c->n].val, "%s", trim(eq + 1));
        c->n++;
    }
    fclose(f);
    return c;
}

static const char *cfg_get(const cfg_t *c, const char *key) {
    const char *v = NULL;
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->kv[i].key, key) == 0) v = c->kv[i].val; /* last one wins */
    return v;
}

static const char *cfg_getf(const cfg_t *c, const char *fmt, int a, int b) {
    char key[96];
    snprintf(key, sizeof key, fmt, a, b);
    return cfg_get(c, key);
}

static long long cfg_num(const cfg_t *c, const char *fmt, int a, int b, long long dflt) {
    const char *v = cfg_getf(c, fmt, a, b);
    return v ? strtoll(v, NULL, 0) : dflt;
}

static uint64_t cfg_u64(const cfg_t *c, const char *fmt, int a, int b, uint64_t dflt) {
    const char *v = cfg_getf(c, fmt, a, b);
    return v ? strtoull(v, NULL, 0) : dflt;
}

/* Sleep and forced result for a call, optionally for one device (dev < 0: none). */
static ze_result_t forced(const cfg_t *c, const char *call, int dev) {
    char key[128];
    const char *v = NULL;
    long ms = 0;
    if (dev >= 0) {
        snprintf(key, sizeof key, "dev%d.sleep_ms.%s", dev, call);
        if ((v = cfg_get(c, key))) ms = strtol(v, NULL, 0);
    }
    snprintf(key, sizeof key, "sleep_ms.%s", call);
    if (!ms && (v = cfg_get(c, key))) ms = strtol(v, NULL, 0);
    if (ms > 0) {
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (dev >= 0) {
        snprintf(key, sizeof key, "dev%d.result.%s", dev, call);
        if ((v = cfg_get(c, key))) return (ze_result_t)strtoul(v, NULL, 0);
    }
    snprintf(key, sizeof key, "result.%s", call);
    if ((v = cfg_get(c, key))) return (ze_result_t)strtoul(v, NULL, 0);
    return ZE_RESULT_SUCCESS;
}

/* ---- handles: small integers in pointer clothing ------------------------------------------ */
#define DRIVER_BASE 0x1000u
#define DEVICE_BASE 0x10000u
#define MEM_BASE 0x100000u

static int n_devices(const cfg_t *c) {
    long long n = cfg_num(c, "devices", 0, 0, 0);
    return n < 0 ? 0 : (n > MAX_DEV ? MAX_DEV : (int)n);
}

static int n_modules(const cfg_t *c, int d) {
    long long n = cfg_num(c, "dev%d.modules", d, 0, 0);
    return n < 0 ? 0 : (n > MAX_MOD ? MAX_MOD : (int)n);
}

static int device_index(const cfg_t *c, void *h) {
    uintptr_t v = (uintptr_t)h;
    if (v < DEVICE_BASE || v >= DEVICE_BASE + (uintptr_t)n_devices(c)) return -1;
    return (int)(v - DEVICE_BASE);
}

static int mem_index(const cfg_t *c, void *h, int *dev) {
    uintptr_t v = (uintptr_t)h;
    if (v < MEM_BASE) return -1;
    v -= MEM_BASE;
    int d = (int)(v / 256), m = (int)(v % 256);
    if (d >= n_devices(c) || m >= n_modules(c, d)) return -1;
    *dev = d;
    return m;
}

/* Fill min(*pCount, total) handles; *pCount == 0 or no array: report the total. */
static void fill_handles(uint32_t *pCount, void **out, uint32_t total, uintptr_t base) {
    if (*pCount == 0 || !out) {
        *pCount = total;
        return;
    }
    if (*pCount > total) *pCount = total;
    for (uint32_t i = 0; i < *pCount; i++) out[i] = (void *)(base + i);
}

#define BEGIN(call)                                             \
    cfg_t *c = cfg_load();                                      \
    if (!c) return ZE_RESULT_ERROR_UNINITIALIZED;               \
    ze_result_t r = ZE_RESULT_SUCCESS;                          \
    pthread_mutex_lock(&g_lock);                                \
    int inited = g_initialized;                                 \
    pthread_mutex_unlock(&g_lock);                              \
    if (!inited && strcmp(call, "zesInit") != 0) {              \
        r = ZE_RESULT_ERROR_UNINITIALIZED;                      \
        goto done;                                              \
    }

/* ---- the API ------------------------------------------------------------------------------- */
#ifndef FAKE_ZE_NO_ZESINIT
ze_result_t zesInit(uint32_t flags) {
    BEGIN("zesInit")
    (void)flags;
    r = forced(c, "zesInit", -1);
    if (r == ZE_RESULT_SUCCESS) {
        pthread_mutex_lock(&g_lock);
        g_initialized = 1;
        pthread_mutex_unlock(&g_lock);
    }
done:
    free(c);
    return r;
}
#endif

ze_result_t zesDriverGet(uint32_t *pCount, zes_driver_handle_t *phDrivers) {
    BEGIN("zesDriverGet")
    if (!pCount) { r = ZE_RESULT_ERROR_INVALID_NULL_POINTER; goto done; }
    if ((r = forced(c, "zesDriverGet", -1))) goto done;
    long long n = cfg_num(c, "drivers", 0, 0, 1);
    fill_handles(pCount, phDrivers, n < 0 ? 0 : (uint32_t)n, DRIVER_BASE);
done:
    free(c);
    return r;
}

ze_result_t zesDeviceGet(zes_driver_handle_t hDriver, uint32_t *pCount, zes_device_handle_t *phDevices) {
    BEGIN("zesDeviceGet")
    uintptr_t k = (uintptr_t)hDriver;
    long long drivers = cfg_num(c, "drivers", 0, 0, 1);
    if (k < DRIVER_BASE || k >= DRIVER_BASE + (uintptr_t)drivers) { r = ZE_RESULT_ERROR_INVALID_NULL_HANDLE; goto done; }
    if (!pCount) { r = ZE_RESULT_ERROR_INVALID_NULL_POINTER; goto done; }
    if ((r = forced(c, "zesDeviceGet", -1))) goto done;
    fill_handles(pCount, phDevices, k == DRIVER_BASE ? (uint32_t)n_devices(c) : 0, DEVICE_BASE);
done:
    free(c);
    return r;
}

static void parse_uuid(const char *s, uint8_t out[16], int d) {
    memset(out, 0, 16);
    if (!s) { /* default: vendor 0x8086, then the device index */
        out[0] = 0x86; out[1] = 0x80; out[15] = (uint8_t)d;
        return;
    }
    int i = 0;
    while (*s && i < 16) {
        if (*s == '-') { s++; continue; }
        unsigned v;
        if (sscanf(s, "%2x", &v) != 1) break;
        out[i++] = (uint8_t)v;
        s += 2;
    }
}

ze_result_t zesDeviceGetProperties(zes_device_handle_t hDevice, zes_device_properties_t *p) {
    BEGIN("zesDeviceGetProperties")
    int d = device_index(c, hDevice);
    if (d < 0) { r = ZE_RESULT_ERROR_INVALID_NULL_HANDLE; goto done; }
    if (!p) { r = ZE_RESULT_ERROR_INVALID_NULL_POINTER; goto done; }
    if (p->stype != ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES) { r = ZE_RESULT_ERROR_INVALID_ARGUMENT; goto done; }
    if ((r = forced(c, "zesDeviceGetProperties", d))) goto done;
    void *next = p->pNext;
    memset(p, 0, sizeof *p);
    p->stype = ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES;
    p->pNext = next;
    p->core.type = 1; /* ZE_DEVICE_TYPE_GPU */
    p->core.vendorId = 0x8086;
    p->core.deviceId = (uint32_t)cfg_num(c, "dev%d.device_id", d, 0, 0x0bd5);
    const char *name = cfg_getf(c, "dev%d.name", d, 0);
    snprintf(p->core.name, sizeof p->core.name, "%s", name ? name : "Intel(R) Data Center GPU Max 1550");
    parse_uuid(cfg_getf(c, "dev%d.uuid", d, 0), p->core.uuid.id, d);
    p->numSubdevices = (uint32_t)cfg_num(c, "dev%d.subdevices", d, 0, 0);
    snprintf(p->serialNumber, sizeof p->serialNumber, "FAKE%04d", d);
    snprintf(p->boardNumber, sizeof p->boardNumber, "unknown");
    snprintf(p->brandName, sizeof p->brandName, "Intel(R) Data Center GPU");
    snprintf(p->modelName, sizeof p->modelName, "%.63s", p->core.name);
    snprintf(p->vendorName, sizeof p->vendorName, "Intel(R) Corporation");
    const char *drv = cfg_getf(c, "dev%d.driver_version", d, 0);
    snprintf(p->driverVersion, sizeof p->driverVersion, "%s", drv ? drv : "1.3.29735");
done:
    free(c);
    return r;
}

ze_result_t zesDevicePciGetProperties(zes_device_handle_t hDevice, zes_pci_properties_t *p) {
    BEGIN("zesDevicePciGetProperties")
    int d = device_index(c, hDevice);
    if (d < 0) { r = ZE_RESULT_ERROR_INVALID_NULL_HANDLE; goto done; }
    if (!p) { r = ZE_RESULT_ERROR_INVALID_NULL_POINTER; goto done; }
    if (p->stype != ZES_STRUCTURE_TYPE_PCI_PROPERTIES) { r = ZE_RESULT_ERROR_INVALID_ARGUMENT; goto done; }
    if ((r = forced(c, "zesDevicePciGetProperties", d))) goto done;
    unsigned dom = 0, bus = 0x3a + (unsigned)d, dev = 0, fn = 0;
    const char *bdf = cfg_getf(c, "dev%d.bdf", d, 0);
    if (bdf) sscanf(bdf, "%x:%x:%x.%x", &dom, &bus, &dev, &fn);
    p->address.domain = dom;
    p->address.bus = bus;
    p->address.device = dev;
    p->address.function = fn;
    p->maxSpeed.gen = 5;
    p->maxSpeed.width = 16;
    p->maxSpeed.maxBandwidth = -1;
done:
    free(c);
    return r;
}

ze_result_t zesDeviceEnumMemoryModules(zes_device_handle_t hDevice, uint32_t *pCount, zes_mem_handle_t *phMemory) {
    BEGIN("zesDeviceEnumMemoryModules")
    int d = device_index(c, hDevice);
    if (d < 0) { r = ZE_RESULT_ERROR_INVALID_NULL_HANDLE; goto done; }
    if (!pCount) { r = ZE_RESULT_ERROR_INVALID_NULL_POINTER; goto done; }
    if ((r = forced(c, "zesDeviceEnumMemoryModules", d))) goto done;
    fill_handles(pCount, phMemory, (uint32_t)n_modules(c, d), MEM_BASE + (uintptr_t)d * 256);
done:
    free(c);
    return r;
}

ze_result_t zesMemoryGetProperties(zes_mem_handle_t hMemory, zes_mem_properties_t *p) {
    BEGIN("zesMemoryGetProperties")
    int d = -1;
    int m = mem_index(c, hMemory, &d);
    if (m < 0) { r = ZE_RESULT_ERROR_INVALID_NULL_HANDLE; goto done; }
    if (!p) { r = ZE_RESULT_ERROR_INVALID_NULL_POINTER; goto done; }
    if (p->stype != ZES_STRUCTURE_TYPE_MEM_PROPERTIES) { r = ZE_RESULT_ERROR_INVALID_ARGUMENT; goto done; }
    if ((r = forced(c, "zesMemoryGetProperties", d))) goto done;
    const char *loc = cfg_getf(c, "dev%d.mod%d.location", d, m);
    long long sub = cfg_num(c, "dev%d.mod%d.subdevice", d, m, -1);
    uint64_t size = cfg_u64(c, "dev%d.mod%d.size", d, m, 0);
    p->type = 0; /* ZES_MEM_TYPE_HBM */
    p->onSubdevice = sub >= 0;
    p->subdeviceId = sub >= 0 ? (uint32_t)sub : 0;
    p->location = (loc && strcmp(loc, "system") == 0) ? 0 : 1; /* ZES_MEM_LOC_SYSTEM / _DEVICE */
    p->physicalSize = cfg_u64(c, "dev%d.mod%d.physical", d, m, size);
    p->busWidth = -1;
    p->numChannels = -1;
done:
    free(c);
    return r;
}

ze_result_t zesMemoryGetState(zes_mem_handle_t hMemory, zes_mem_state_t *s) {
    BEGIN("zesMemoryGetState")
    int d = -1;
    int m = mem_index(c, hMemory, &d);
    if (m < 0) { r = ZE_RESULT_ERROR_INVALID_NULL_HANDLE; goto done; }
    if (!s) { r = ZE_RESULT_ERROR_INVALID_NULL_POINTER; goto done; }
    if (s->stype != ZES_STRUCTURE_TYPE_MEM_STATE) { r = ZE_RESULT_ERROR_INVALID_ARGUMENT; goto done; }
    if ((r = forced(c, "zesMemoryGetState", d))) goto done;
    uint64_t size = cfg_u64(c, "dev%d.mod%d.size", d, m, 0);
    uint64_t free_ = cfg_u64(c, "dev%d.mod%d.free", d, m, size);
    int frozen = (int)cfg_num(c, "frozen", 0, 0, 0) || (int)cfg_num(c, "dev%d.frozen", d, 0, 0);
    pthread_mutex_lock(&g_lock);
    if (!g_have_frozen[d][m]) {
        g_have_frozen[d][m] = 1;
        g_frozen_free[d][m] = free_;
    }
    if (frozen) free_ = g_frozen_free[d][m];
    else g_frozen_free[d][m] = free_; /* a driver freezes at whatever it last showed */
    pthread_mutex_unlock(&g_lock);
    s->health = 1; /* ZES_MEM_HEALTH_OK */
    s->free = free_;
    s->size = size;
done:
    free(c);
    return r;
}

ze_result_t zesDeviceProcessesGetState(zes_device_handle_t hDevice, uint32_t *pCount, zes_process_state_t *pProcesses) {
    BEGIN("zesDeviceProcessesGetState")
    int d = device_index(c, hDevice);
    if (d < 0) { r = ZE_RESULT_ERROR_INVALID_NULL_HANDLE; goto done; }
    if (!pCount) { r = ZE_RESULT_ERROR_INVALID_NULL_POINTER; goto done; }
    if ((r = forced(c, "zesDeviceProcessesGetState", d))) goto done;
    long long n = cfg_num(c, "dev%d.processes", d, 0, 0);
    uint32_t total = n < 0 ? 0 : (uint32_t)n;
    if (*pCount == 0 || !pProcesses) { *pCount = total; goto done; }
    if (*pCount < total) { *pCount = total; r = ZE_RESULT_ERROR_INVALID_SIZE; goto done; }
    for (uint32_t i = 0; i < total; i++) {
        zes_process_state_t *ps = &pProcesses[i];
        if (ps->stype != ZES_STRUCTURE_TYPE_PROCESS_STATE) { r = ZE_RESULT_ERROR_INVALID_ARGUMENT; goto done; }
        ps->processId = (uint32_t)cfg_num(c, "dev%d.proc%d.pid", d, (int)i, 0);
        ps->memSize = cfg_u64(c, "dev%d.proc%d.mem", d, (int)i, 0);
        ps->sharedSize = cfg_u64(c, "dev%d.proc%d.shared", d, (int)i, 0);
        ps->engines = 0;
    }
    *pCount = total;
done:
    free(c);
    return r;
}
