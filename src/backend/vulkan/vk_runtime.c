#define _GNU_SOURCE /* dl_iterate_phdr, RTLD_NOLOAD, RTLD_NODELETE */
#include "backend/vulkan/vk_runtime.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vulkan/vulkan.h>

/* ---- state (one device per process; the table is shared) ---- */

typedef struct {
    char *host;   /* mapped pointer */
    size_t bytes; /* size asked for */
    VkBuffer buf;
    VkDeviceMemory mem;
    uint64_t addr;
} vk_block;

typedef struct {
    uint64_t lo, hi; /* device address range */
} vk_range;

typedef struct {
    vk_block blk;
    size_t used;
} vk_chunk;

static struct {
    VkInstance inst;
    VkDebugUtilsMessengerEXT messenger;
    VkPhysicalDevice phys;
    VkDevice dev;
    VkQueue queue;
    uint32_t qfamily;
    uint32_t mem_type;
    VkCommandPool pool;
    VkCommandBuffer cmd;
    VkFence fence;
    VkPipelineLayout layout;
    VkPipeline *pipes; /* [vk_shader_count], created on first use */
    int recording;
    long dispatches;
    char desc[320];
    uint32_t subgroup, shared_bytes;
    VkDeviceSize max_alloc;
    /* allocations sorted by host address */
    vk_block *blocks;
    int n_blocks, cap_blocks;
    /* staging ring: chunks kept until the next sync */
    vk_chunk *chunks;
    int n_chunks, cap_chunks;
    /* hazard tracking since the last barrier, and the current op's accesses */
    vk_range *wr, *rd, *op_wr, *op_rd;
    int n_wr, n_rd, n_op_wr, n_op_rd, cap_wr, cap_rd, cap_op_wr, cap_op_rd;
    /* the last staged layout */
    uint64_t lay_addr;
    const int32_t *lay_host;
    size_t lay_bytes;
} V;

static pthread_mutex_t vk_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *no_gpu_msg = "no usable Vulkan GPU (software devices such as lavapipe are used "
                                "only when named, e.g. --device vulkan:0, or with "
                                "NEEDLE_VULKAN_SOFTWARE=1)";

static void die(const char *what, VkResult r)
{
    fprintf(stderr, "needle: vulkan: %s failed (VkResult %d)\n", what, (int)r);
    abort();
}
#define VKCHECK(call)                                                                              \
    do {                                                                                           \
        VkResult r_ = (call);                                                                      \
        if (r_ != VK_SUCCESS)                                                                      \
            die(#call, r_);                                                                        \
    } while (0)

static void push_range(vk_range **a, int *n, int *cap, uint64_t lo, uint64_t hi)
{
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        *a = realloc(*a, sizeof **a * (size_t)*cap);
        if (!*a)
            die("out of host memory", VK_ERROR_OUT_OF_HOST_MEMORY);
    }
    (*a)[(*n)++] = (vk_range){lo, hi};
}

/* ---- validation (NEEDLE_VULKAN_VALIDATE=1): any error aborts ---- */

static VKAPI_ATTR VkBool32 VKAPI_CALL on_debug(VkDebugUtilsMessageSeverityFlagBitsEXT sev,
                                               VkDebugUtilsMessageTypeFlagsEXT type,
                                               const VkDebugUtilsMessengerCallbackDataEXT *data,
                                               void *user)
{
    (void)type;
    (void)user;
    if (sev & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) {
        fprintf(stderr, "needle: vulkan validation error: %s\n", data->pMessage);
        abort();
    }
    if (sev & VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT)
        fprintf(stderr, "needle: vulkan validation warning: %s\n", data->pMessage);
    return VK_FALSE;
}

static int has_ext(const VkExtensionProperties *e, uint32_t n, const char *name)
{
    for (uint32_t i = 0; i < n; i++)
        if (!strcmp(e[i].extensionName, name))
            return 1;
    return 0;
}

static int has_layer(const char *name)
{
    uint32_t n = 0;
    vkEnumerateInstanceLayerProperties(&n, NULL);
    VkLayerProperties *l = calloc(n ? n : 1, sizeof *l);
    vkEnumerateInstanceLayerProperties(&n, l);
    int found = 0;
    for (uint32_t i = 0; i < n; i++)
        found |= !strcmp(l[i].layerName, name);
    free(l);
    return found;
}

static const char *type_name(VkPhysicalDeviceType t)
{
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete GPU";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated GPU";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual GPU";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "software (CPU)";
    default: return "other";
    }
}

/* What we need from a device; NULL when usable, else the reason. */
static const char *unusable(VkPhysicalDevice pd)
{
    VkPhysicalDeviceProperties p;
    vkGetPhysicalDeviceProperties(pd, &p);
    if (VK_API_VERSION_MINOR(p.apiVersion) < 2 && VK_API_VERSION_MAJOR(p.apiVersion) == 1)
        return "Vulkan 1.2 or newer is needed";
    VkPhysicalDeviceVulkan12Features f12 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceFeatures2 f = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                   .pNext = &f12};
    vkGetPhysicalDeviceFeatures2(pd, &f);
    if (!f12.bufferDeviceAddress)
        return "the bufferDeviceAddress feature is needed";
    if (!f.features.shaderInt64)
        return "the shaderInt64 feature is needed";
    return NULL;
}

static int pick_device(int index, int allow_sw, int *no_device, char *err, size_t errlen)
{
    uint32_t n = 0;
    if (vkEnumeratePhysicalDevices(V.inst, &n, NULL) != VK_SUCCESS || !n) {
        *no_device = 1;
        snprintf(err, errlen, "no Vulkan device");
        return -1;
    }
    VkPhysicalDevice *pd = calloc(n, sizeof *pd);
    vkEnumeratePhysicalDevices(V.inst, &n, pd);
    int best = -1, best_rank = 99;
    if (index >= 0) {
        if ((uint32_t)index >= n) {
            *no_device = 1;
            snprintf(err, errlen, "no Vulkan device %d (this machine has %u)", index, n);
            free(pd);
            return -1;
        }
        const char *why = unusable(pd[index]);
        if (why) {
            VkPhysicalDeviceProperties p;
            vkGetPhysicalDeviceProperties(pd[index], &p);
            snprintf(err, errlen, "Vulkan device %d (%s) cannot run needle: %s", index,
                     p.deviceName, why);
            free(pd);
            return -1;
        }
        best = index;
    } else {
        for (uint32_t i = 0; i < n; i++) {
            VkPhysicalDeviceProperties p;
            vkGetPhysicalDeviceProperties(pd[i], &p);
            int rank = p.deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU      ? 0
                       : p.deviceType == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU  ? 1
                       : p.deviceType == VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU     ? 2
                       : p.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU && allow_sw ? 3
                                                                                 : 99;
            if (rank < best_rank && !unusable(pd[i])) {
                best = (int)i;
                best_rank = rank;
            }
        }
        if (best < 0) {
            *no_device = 1;
            snprintf(err, errlen, "%s", no_gpu_msg);
            free(pd);
            return -1;
        }
    }
    V.phys = pd[best];
    free(pd);
    return best;
}

/* ---- software drivers are left out of a search for a GPU ---- */

/* A search for a GPU (no index, software not allowed) never picks a
 * software device, so the loader need not load one: lavapipe (Mesa,
 * lvp_icd.<arch>.json) maps LLVM and allocates at instance creation, and
 * SwiftShader (vk_swiftshader_icd.json) is the same kind. The loader's
 * driver filter compares these globs with the manifest file names. */
#define VK_SOFTWARE_DRIVERS "*lvp_icd*,*swiftshader*"
#define VK_FILTER_ENV "VK_LOADER_DRIVERS_DISABLE"

/* Adds the software drivers to the user's own filter, if any; returns the
 * value to put back (NULL: unset it), or (char *)-1 on failure. */
static char *filter_software(void)
{
    const char *old = getenv(VK_FILTER_ENV);
    char *saved = old ? strdup(old) : NULL;
    if (old && !saved)
        return (char *)-1;
    size_t n = (old ? strlen(old) + 1 : 0) + sizeof VK_SOFTWARE_DRIVERS;
    char *val = malloc(n);
    if (!val) {
        free(saved);
        return (char *)-1;
    }
    snprintf(val, n, "%s%s%s", old && *old ? old : "", old && *old ? "," : "", VK_SOFTWARE_DRIVERS);
    setenv(VK_FILTER_ENV, val, 1);
    free(val);
    return saved;
}

static void filter_restore(char *saved)
{
    if (saved == (char *)-1)
        return;
    if (saved)
        setenv(VK_FILTER_ENV, saved, 1);
    else
        unsetenv(VK_FILTER_ENV);
    free(saved);
}

/* ---- sanitizer builds: drivers stay resident ---- */

#if defined(__SANITIZE_ADDRESS__)
#define VK_KEEP_DRIVERS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define VK_KEEP_DRIVERS 1
#endif
#endif

#ifdef VK_KEEP_DRIVERS
typedef struct {
    char **names;
    int n, cap;
} name_list;

static int collect_name(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    name_list *l = data;
    if (!info->dlpi_name || !info->dlpi_name[0])
        return 0;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        char **a = realloc(l->names, sizeof *a * (size_t)cap);
        if (!a)
            return 1;
        l->names = a;
        l->cap = cap;
    }
    if ((l->names[l->n] = strdup(info->dlpi_name)))
        l->n++;
    return 0;
}

/* LeakSanitizer reports at exit; a driver the loader has unloaded by then
 * (vkDestroyInstance after no device was chosen) shows its leaks as
 * "<unknown module>", which tests/lsan_drivers.supp cannot match. Every
 * module loaded now (the drivers this instance opened) is marked
 * RTLD_NODELETE, so the loader's dlclose leaves it mapped. Names first,
 * dlopen after: dl_iterate_phdr holds the loader's lock. */
static void keep_drivers_resident(void)
{
    name_list l = {0};
    dl_iterate_phdr(collect_name, &l);
    for (int i = 0; i < l.n; i++) {
        dlopen(l.names[i], RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);
        free(l.names[i]);
    }
    free(l.names);
}
#endif

static int open_instance(int index, int allow_software, int filtered, int validate, int *no_device,
                         char *err, size_t errlen)
{
    uint32_t ne = 0;
    if (vkEnumerateInstanceExtensionProperties(NULL, &ne, NULL) != VK_SUCCESS) {
        *no_device = 1;
        snprintf(err, errlen, "%s", filtered ? no_gpu_msg : "no Vulkan driver");
        return -1;
    }
    VkExtensionProperties *ie = calloc(ne ? ne : 1, sizeof *ie);
    vkEnumerateInstanceExtensionProperties(NULL, &ne, ie);
    const char *exts[4];
    uint32_t n_exts = 0;
    VkInstanceCreateFlags iflags = 0;
    /* MoltenVK (macOS) is a portability implementation: listed only when asked */
    if (has_ext(ie, ne, VK_KHR_PORTABILITY_ENUMERATION_EXTENSION_NAME)) {
        exts[n_exts++] = VK_KHR_PORTABILITY_ENUMERATION_EXTENSION_NAME;
        iflags |= VK_INSTANCE_CREATE_ENUMERATE_PORTABILITY_BIT_KHR;
    }
    if (validate && has_ext(ie, ne, VK_EXT_DEBUG_UTILS_EXTENSION_NAME))
        exts[n_exts++] = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
    free(ie);
    const char *layers[] = {"VK_LAYER_KHRONOS_validation"};
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
                             .pApplicationName = "needle",
                             .apiVersion = VK_API_VERSION_1_2};
    VkInstanceCreateInfo ici = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                                .flags = iflags,
                                .pApplicationInfo = &app,
                                .enabledExtensionCount = n_exts,
                                .ppEnabledExtensionNames = exts,
                                .enabledLayerCount = validate ? 1 : 0,
                                .ppEnabledLayerNames = layers};
    VkResult r = vkCreateInstance(&ici, NULL, &V.inst);
    if (r != VK_SUCCESS) {
        *no_device = r == VK_ERROR_INCOMPATIBLE_DRIVER;
        if (filtered && *no_device)
            snprintf(err, errlen, "%s", no_gpu_msg);
        else
            snprintf(err, errlen, "no Vulkan driver (vkCreateInstance: %d)", (int)r);
        return -1;
    }
#ifdef VK_KEEP_DRIVERS
    keep_drivers_resident();
#endif
    if (validate) {
        PFN_vkCreateDebugUtilsMessengerEXT mk =
            (PFN_vkCreateDebugUtilsMessengerEXT)vkGetInstanceProcAddr(
                V.inst, "vkCreateDebugUtilsMessengerEXT");
        VkDebugUtilsMessengerCreateInfoEXT dci = {
            .sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
            .messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                               VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
            .messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                           VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                           VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
            .pfnUserCallback = on_debug};
        if (mk)
            mk(V.inst, &dci, NULL, &V.messenger);
    }
    int idx = pick_device(index, allow_software, no_device, err, errlen);
    if (idx < 0 && filtered && *no_device)
        snprintf(err, errlen, "%s", no_gpu_msg); /* also when only software was there */
    if (idx < 0) {
        vkDestroyInstance(V.inst, NULL);
        V.inst = VK_NULL_HANDLE;
    }
    return idx;
}

int vk_open(int index, int allow_software, int validate, int *no_device, char *err, size_t errlen)
{
    *no_device = 0;
    if (validate && !has_layer("VK_LAYER_KHRONOS_validation")) {
        snprintf(err, errlen,
                 "NEEDLE_VULKAN_VALIDATE is set but VK_LAYER_KHRONOS_validation is "
                 "not installed (Debian: vulkan-validationlayers)");
        return -1;
    }
    /* the filter is the process environment, read by the loader while it
     * scans for drivers: in place only while the instance is made */
    int filtered = index < 0 && !allow_software;
    char *saved = filtered ? filter_software() : (char *)-1;
    int idx = open_instance(index, allow_software, filtered, validate, no_device, err, errlen);
    if (filtered)
        filter_restore(saved);
    if (idx < 0)
        return -1;

    /* queue: a compute-capable family */
    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(V.phys, &nq, NULL);
    VkQueueFamilyProperties *qf = calloc(nq ? nq : 1, sizeof *qf);
    vkGetPhysicalDeviceQueueFamilyProperties(V.phys, &nq, qf);
    V.qfamily = UINT32_MAX;
    for (uint32_t i = 0; i < nq && V.qfamily == UINT32_MAX; i++)
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT)
            V.qfamily = i;
    free(qf);
    if (V.qfamily == UINT32_MAX) {
        snprintf(err, errlen, "the Vulkan device has no compute queue");
        return -1;
    }
    uint32_t nde = 0;
    vkEnumerateDeviceExtensionProperties(V.phys, NULL, &nde, NULL);
    VkExtensionProperties *de = calloc(nde ? nde : 1, sizeof *de);
    vkEnumerateDeviceExtensionProperties(V.phys, NULL, &nde, de);
    const char *dexts[2];
    uint32_t n_dexts = 0;
    /* the spec requires enabling it where present (MoltenVK) */
    if (has_ext(de, nde, "VK_KHR_portability_subset"))
        dexts[n_dexts++] = "VK_KHR_portability_subset";
    free(de);
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qci = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                   .queueFamilyIndex = V.qfamily,
                                   .queueCount = 1,
                                   .pQueuePriorities = &prio};
    VkPhysicalDeviceVulkan12Features f12 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
        .bufferDeviceAddress = VK_TRUE};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                    .pNext = &f12,
                                    .features = {.shaderInt64 = VK_TRUE}};
    VkDeviceCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
                              .pNext = &f2,
                              .queueCreateInfoCount = 1,
                              .pQueueCreateInfos = &qci,
                              .enabledExtensionCount = n_dexts,
                              .ppEnabledExtensionNames = dexts};
    VkResult r = vkCreateDevice(V.phys, &dci, NULL, &V.dev);
    if (r != VK_SUCCESS) {
        snprintf(err, errlen, "vkCreateDevice failed (%d)", (int)r);
        return -1;
    }
    vkGetDeviceQueue(V.dev, V.qfamily, 0, &V.queue);

    /* memory: host-visible and coherent (the host reads results in place
     * after a sync), device-local too where the device has such a type */
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(V.phys, &mp);
    VkMemoryPropertyFlags want =
        VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    /* device-local only when its heap is big (resizable BAR, unified
     * memory); a 256 MB BAR window would not hold a model */
    const VkDeviceSize big = (VkDeviceSize)2 << 30;
    int pick = -1;
    VkDeviceSize pick_heap = 0;
    for (int pass = 0; pass < 2 && pick < 0; pass++)
        for (uint32_t i = 0; i < mp.memoryTypeCount && pick < 0; i++) {
            VkMemoryPropertyFlags fl = mp.memoryTypes[i].propertyFlags;
            VkDeviceSize heap = mp.memoryHeaps[mp.memoryTypes[i].heapIndex].size;
            int local = (fl & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) && heap >= big;
            if ((fl & want) == want && (pass == 1 || local)) {
                pick = (int)i;
                pick_heap = heap;
            }
        }
    if (pick < 0) {
        snprintf(err, errlen, "the Vulkan device has no host-visible coherent memory");
        return -1;
    }
    V.mem_type = (uint32_t)pick;

    VkPhysicalDeviceSubgroupProperties sg = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceMaintenance3Properties m3 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES, .pNext = &sg};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
                                      .pNext = &m3};
    vkGetPhysicalDeviceProperties2(V.phys, &p2);
    V.subgroup = sg.subgroupSize;
    V.shared_bytes = p2.properties.limits.maxComputeSharedMemorySize;
    V.max_alloc = m3.maxMemoryAllocationSize;
    if (V.shared_bytes < 16384 || p2.properties.limits.maxComputeWorkGroupInvocations < 256) {
        snprintf(err, errlen,
                 "the Vulkan device allows %u bytes of shared memory and %u invocations per "
                 "workgroup; needle's shaders need 16384 and 256",
                 V.shared_bytes, p2.properties.limits.maxComputeWorkGroupInvocations);
        return -1;
    }
    snprintf(
        V.desc, sizeof V.desc, "%s (%s, Vulkan %u.%u, %.1f GB %s memory)", p2.properties.deviceName,
        type_name(p2.properties.deviceType), VK_API_VERSION_MAJOR(p2.properties.apiVersion),
        VK_API_VERSION_MINOR(p2.properties.apiVersion), (double)pick_heap / 1e9,
        mp.memoryTypes[pick].propertyFlags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT ? "device-local"
                                                                                 : "host");

    VkCommandPoolCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                   .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                   .queueFamilyIndex = V.qfamily};
    VKCHECK(vkCreateCommandPool(V.dev, &pci, NULL, &V.pool));
    VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                       .commandPool = V.pool,
                                       .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                       .commandBufferCount = 1};
    VKCHECK(vkAllocateCommandBuffers(V.dev, &cai, &V.cmd));
    VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VKCHECK(vkCreateFence(V.dev, &fci, NULL, &V.fence));
    VkPushConstantRange pcr = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .offset = 0, .size = 8};
    VkPipelineLayoutCreateInfo plci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                       .pushConstantRangeCount = 1,
                                       .pPushConstantRanges = &pcr};
    VKCHECK(vkCreatePipelineLayout(V.dev, &plci, NULL, &V.layout));
    V.pipes = calloc((size_t)vk_shader_count, sizeof *V.pipes);
    return idx;
}

const char *vk_device_description(void)
{
    return V.desc;
}
uint32_t vk_subgroup_size(void)
{
    return V.subgroup;
}
uint32_t vk_max_shared_bytes(void)
{
    return V.shared_bytes;
}

/* ---- memory ---- */

static void vk_flush(int reset_ring);

static int block_create(vk_block *b, size_t bytes)
{
    size_t sz = bytes ? (bytes + 255) & ~(size_t)255 : 256;
    if (V.max_alloc && sz > V.max_alloc)
        return -1;
    VkBufferCreateInfo bci = {
        .sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
        .size = sz,
        .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT |
                 VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT,
        .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    if (vkCreateBuffer(V.dev, &bci, NULL, &b->buf) != VK_SUCCESS)
        return -1;
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(V.dev, b->buf, &req);
    if (!(req.memoryTypeBits & (1u << V.mem_type))) {
        vkDestroyBuffer(V.dev, b->buf, NULL);
        return -1;
    }
    VkMemoryAllocateFlagsInfo fl = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO,
                                    .flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT};
    VkMemoryAllocateInfo mai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                .pNext = &fl,
                                .allocationSize = req.size,
                                .memoryTypeIndex = V.mem_type};
    if (vkAllocateMemory(V.dev, &mai, NULL, &b->mem) != VK_SUCCESS) {
        vkDestroyBuffer(V.dev, b->buf, NULL);
        return -1;
    }
    void *host;
    if (vkBindBufferMemory(V.dev, b->buf, b->mem, 0) != VK_SUCCESS ||
        vkMapMemory(V.dev, b->mem, 0, VK_WHOLE_SIZE, 0, &host) != VK_SUCCESS) {
        vkDestroyBuffer(V.dev, b->buf, NULL);
        vkFreeMemory(V.dev, b->mem, NULL);
        return -1;
    }
    b->host = host;
    b->bytes = sz;
    VkBufferDeviceAddressInfo ai = {.sType = VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO,
                                    .buffer = b->buf};
    b->addr = vkGetBufferDeviceAddress(V.dev, &ai);
    return 0;
}

static void block_destroy(vk_block *b)
{
    vkUnmapMemory(V.dev, b->mem);
    vkDestroyBuffer(V.dev, b->buf, NULL);
    vkFreeMemory(V.dev, b->mem, NULL);
}

void *vk_alloc(size_t bytes)
{
    vk_block b;
    pthread_mutex_lock(&vk_lock);
    if (block_create(&b, bytes)) {
        pthread_mutex_unlock(&vk_lock);
        return NULL;
    }
    memset(b.host, 0, b.bytes);
    if (V.n_blocks == V.cap_blocks) {
        int cap = V.cap_blocks ? 2 * V.cap_blocks : 32;
        vk_block *nb = realloc(V.blocks, sizeof *nb * (size_t)cap);
        if (!nb) {
            block_destroy(&b);
            pthread_mutex_unlock(&vk_lock);
            return NULL;
        }
        V.blocks = nb;
        V.cap_blocks = cap;
    }
    int i = V.n_blocks++;
    while (i > 0 && V.blocks[i - 1].host > b.host) {
        V.blocks[i] = V.blocks[i - 1];
        i--;
    }
    V.blocks[i] = b;
    pthread_mutex_unlock(&vk_lock);
    return b.host;
}

/* The block holding [p, p + bytes), or NULL. */
static const vk_block *find_block(const void *p, size_t bytes)
{
    const char *c = p;
    int lo = 0, hi = V.n_blocks - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const vk_block *b = &V.blocks[mid];
        if (c < b->host)
            hi = mid - 1;
        else if (c >= b->host + b->bytes)
            lo = mid + 1;
        else
            return c + bytes <= b->host + b->bytes ? b : NULL;
    }
    return NULL;
}

void vk_free(void *p)
{
    if (!p)
        return;
    /* nothing recorded may still use it; the staging ring is kept, since
     * an op may free (grow) scratch after staging its inputs */
    vk_flush(0);
    pthread_mutex_lock(&vk_lock);
    for (int i = 0; i < V.n_blocks; i++)
        if (V.blocks[i].host == p) {
            block_destroy(&V.blocks[i]);
            memmove(&V.blocks[i], &V.blocks[i + 1],
                    sizeof *V.blocks * (size_t)(V.n_blocks - i - 1));
            V.n_blocks--;
            break;
        }
    pthread_mutex_unlock(&vk_lock);
}

/* ---- staging ring ---- */

static uint64_t stage(const void *src, size_t bytes, void **dst_host)
{
    size_t need = (bytes + 15) & ~(size_t)15;
    vk_chunk *c = V.n_chunks ? &V.chunks[V.n_chunks - 1] : NULL;
    if (!c || c->used + need > c->blk.bytes) {
        if (V.n_chunks == V.cap_chunks) {
            V.cap_chunks = V.cap_chunks ? 2 * V.cap_chunks : 8;
            V.chunks = realloc(V.chunks, sizeof *V.chunks * (size_t)V.cap_chunks);
            if (!V.chunks)
                die("out of host memory", VK_ERROR_OUT_OF_HOST_MEMORY);
        }
        size_t sz = need > ((size_t)16 << 20) ? need : ((size_t)16 << 20);
        c = &V.chunks[V.n_chunks];
        if (block_create(&c->blk, sz))
            die("allocating the staging ring", VK_ERROR_OUT_OF_DEVICE_MEMORY);
        c->used = 0;
        V.n_chunks++;
    }
    char *h = c->blk.host + c->used;
    if (src)
        memcpy(h, src, bytes);
    if (dst_host)
        *dst_host = h;
    uint64_t a = c->blk.addr + c->used;
    c->used += need;
    return a;
}

uint64_t vk_in(const void *p, size_t bytes)
{
    const vk_block *b = find_block(p, bytes ? bytes : 1);
    if (!b)
        return stage(p, bytes, NULL);
    uint64_t a = b->addr + (uint64_t)((const char *)p - b->host);
    push_range(&V.op_rd, &V.n_op_rd, &V.cap_op_rd, a, a + bytes);
    return a;
}

uint64_t vk_in_opt(const void *p, size_t bytes)
{
    return p ? vk_in(p, bytes) : 0;
}

uint64_t vk_out(void *p, size_t bytes)
{
    const vk_block *b = find_block(p, bytes ? bytes : 1);
    if (!b) {
        fprintf(stderr,
                "needle: vulkan backend: an op's output (%p, %zu bytes) is not in memory from "
                "the backend's alloc (see the memory rule in backend.h)\n",
                p, bytes);
        abort();
    }
    uint64_t a = b->addr + (uint64_t)((char *)p - b->host);
    push_range(&V.op_wr, &V.n_op_wr, &V.cap_op_wr, a, a + bytes);
    return a;
}

uint64_t vk_out_opt(void *p, size_t bytes)
{
    return p ? vk_out(p, bytes) : 0;
}

uint64_t vk_layout(const nd_layout *L)
{
    size_t nseg = (size_t)L->n_seg * 3, n = (size_t)L->N;
    size_t bytes = (nseg + 2 * n) * sizeof(int32_t);
    if (V.lay_host && V.lay_bytes == bytes) {
        const int32_t *h = V.lay_host;
        int same = 1;
        for (int s = 0; s < L->n_seg && same; s++)
            same = h[3 * s] == L->seg[s].start && h[3 * s + 1] == L->seg[s].len &&
                   h[3 * s + 2] == L->seg[s].parent;
        if (same && !memcmp(h + nseg, L->row_seg, n * 4) && !memcmp(h + nseg + n, L->pos, n * 4))
            return V.lay_addr;
    }
    void *hv;
    uint64_t a = stage(NULL, bytes, &hv);
    int32_t *h = hv;
    for (int s = 0; s < L->n_seg; s++) {
        h[3 * s] = L->seg[s].start;
        h[3 * s + 1] = L->seg[s].len;
        h[3 * s + 2] = L->seg[s].parent;
    }
    memcpy(h + nseg, L->row_seg, n * 4);
    memcpy(h + nseg + n, L->pos, n * 4);
    V.lay_host = h;
    V.lay_bytes = bytes;
    V.lay_addr = a;
    return a;
}

/* ---- recording ---- */

static VkPipeline pipeline(const char *name)
{
    for (int i = 0; i < vk_shader_count; i++) {
        if (strcmp(vk_shader_srcs[i].name, name))
            continue;
        if (V.pipes[i])
            return V.pipes[i];
        VkShaderModuleCreateInfo smci = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                         .codeSize = vk_shader_srcs[i].size,
                                         .pCode = vk_shader_srcs[i].code};
        VkShaderModule sm;
        VKCHECK(vkCreateShaderModule(V.dev, &smci, NULL, &sm));
        VkComputePipelineCreateInfo cpci = {
            .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
            .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                      .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                      .module = sm,
                      .pName = "main"},
            .layout = V.layout};
        VKCHECK(vkCreateComputePipelines(V.dev, VK_NULL_HANDLE, 1, &cpci, NULL, &V.pipes[i]));
        vkDestroyShaderModule(V.dev, sm, NULL);
        return V.pipes[i];
    }
    fprintf(stderr, "needle: vulkan backend: no shader named %s\n", name);
    abort();
}

static int overlaps(const vk_range *a, int na, const vk_range *b, int nb)
{
    for (int i = 0; i < na; i++)
        for (int j = 0; j < nb; j++)
            if (a[i].lo < b[j].hi && b[j].lo < a[i].hi)
                return 1;
    return 0;
}

void vk_dispatch(const char *name, const void *args, size_t args_bytes, uint32_t gx, uint32_t gy,
                 uint32_t gz)
{
    uint64_t a = stage(args, args_bytes, NULL);
    if (!V.recording) {
        VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                       .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
        VKCHECK(vkBeginCommandBuffer(V.cmd, &bi));
        V.recording = 1;
        /* host writes (staged data, mapped memory) before the first dispatch */
        VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                              .srcAccessMask = VK_ACCESS_HOST_WRITE_BIT,
                              .dstAccessMask =
                                  VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT};
        vkCmdPipelineBarrier(V.cmd, VK_PIPELINE_STAGE_HOST_BIT,
                             VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
    }
    /* read-after-write, write-after-write, write-after-read */
    if (overlaps(V.op_rd, V.n_op_rd, V.wr, V.n_wr) || overlaps(V.op_wr, V.n_op_wr, V.wr, V.n_wr) ||
        overlaps(V.op_wr, V.n_op_wr, V.rd, V.n_rd)) {
        VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                              .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
                              .dstAccessMask =
                                  VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT};
        vkCmdPipelineBarrier(V.cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                             VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
        V.n_wr = V.n_rd = 0;
    }
    for (int i = 0; i < V.n_op_wr; i++)
        push_range(&V.wr, &V.n_wr, &V.cap_wr, V.op_wr[i].lo, V.op_wr[i].hi);
    for (int i = 0; i < V.n_op_rd; i++)
        push_range(&V.rd, &V.n_rd, &V.cap_rd, V.op_rd[i].lo, V.op_rd[i].hi);
    V.n_op_wr = V.n_op_rd = 0;
    /* a long list costs more to scan than a barrier */
    if (V.n_wr + V.n_rd > 256) {
        VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                              .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
                              .dstAccessMask =
                                  VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT};
        vkCmdPipelineBarrier(V.cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                             VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
        V.n_wr = V.n_rd = 0;
    }
    vkCmdBindPipeline(V.cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline(name));
    vkCmdPushConstants(V.cmd, V.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, 8, &a);
    if (gx && gy && gz)
        vkCmdDispatch(V.cmd, gx, gy, gz);
    V.dispatches++;
}

uint32_t vk_groups(long n, long per)
{
    long g = (n + per - 1) / per;
    return g < 1 ? 1 : g > 65535 ? 65535 : (uint32_t)g;
}

void vk_sync(void)
{
    vk_flush(1);
}

static void vk_flush(int reset_ring)
{
    pthread_mutex_lock(&vk_lock);
    if (V.recording) {
        VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                              .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
                              .dstAccessMask = VK_ACCESS_HOST_READ_BIT | VK_ACCESS_HOST_WRITE_BIT};
        vkCmdPipelineBarrier(V.cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                             VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
        VKCHECK(vkEndCommandBuffer(V.cmd));
        VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
                           .commandBufferCount = 1,
                           .pCommandBuffers = &V.cmd};
        VKCHECK(vkQueueSubmit(V.queue, 1, &si, V.fence));
        VKCHECK(vkWaitForFences(V.dev, 1, &V.fence, VK_TRUE, UINT64_MAX));
        VKCHECK(vkResetFences(V.dev, 1, &V.fence));
        VKCHECK(vkResetCommandBuffer(V.cmd, 0));
        V.recording = 0;
    }
    V.n_wr = V.n_rd = 0; /* everything recorded has run */
    if (!reset_ring) {
        pthread_mutex_unlock(&vk_lock);
        return;
    }
    /* keep the first chunk of the ring, free the rest */
    for (int i = 1; i < V.n_chunks; i++)
        block_destroy(&V.chunks[i].blk);
    if (V.n_chunks)
        V.chunks[0].used = 0;
    V.n_chunks = V.n_chunks ? 1 : 0;
    V.n_wr = V.n_rd = V.n_op_wr = V.n_op_rd = 0;
    V.lay_host = NULL;
    pthread_mutex_unlock(&vk_lock);
}
