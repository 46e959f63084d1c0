/* Operator side of libascendcl.so: data buffers, tensor descriptions, op
 * attributes, aclopExecute(V2), and the launch path every operator API
 * (aclop, aclop compiler, aclnn) goes through: aclsim_launch_op validates,
 * copies its arguments into a work item and queues it on the stream; the
 * kernel runs on the stream worker after the core's range check.
 * Conventions: docs/simulator-ops.md. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"
#include "rt/kernels.h"

#define OP_MAGIC_BUFFER 0x44425546u   /* "DBUF" */
#define OP_MAGIC_DESC   0x54445343u   /* "TDSC" */
#define OP_MAGIC_ATTR   0x4f415452u   /* "OATR" */
#define OP_UNKNOWN_RANK (-2)          /* dims[0] == -2: rank unknown */

/* Objects carry a magic tag, cleared on destroy, so a wrong or destroyed
 * pointer handed back is usually recognised instead of being used. */
struct aclDataBuffer {
    uint32_t magic;
    void *data;
    size_t size;
};

struct aclTensorDesc {
    uint32_t magic;
    aclDataType dtype;
    aclFormat format;
    aclMemType placement;
    char *name;             /* aclSetTensorDescName (diagnostics only) */
    int ndim;
    int64_t *dims;          /* separate, so aclSetTensorShape can resize it */
};

/* Types beyond sim_attr's scalar ones: kept with the attribute set (and
 * validated) but not passed to kernels, whose attributes are scalars. */
enum { OP_ATTR_STRING = 100, OP_ATTR_LIST };

typedef struct op_attr_item {
    char *name;
    int type;               /* enum sim_attr_type, OP_ATTR_STRING or OP_ATTR_LIST */
    int64_t i;
    float f;
    void *blob;             /* string or list values (owned) */
} op_attr_item;

struct aclopAttr {
    uint32_t magic;
    int n, cap;
    op_attr_item *items;
};

/* ------------------------------------------------------------ data types */

ACL_FUNC_VISIBILITY size_t aclDataTypeSize(aclDataType dataType)
{
    return kern_dtype_size(dataType);
}

ACL_FUNC_VISIBILITY float aclFloat16ToFloat(aclFloat16 value)
{
    return kern_f16_to_f32(value);
}

ACL_FUNC_VISIBILITY aclFloat16 aclFloatToFloat16(float value)
{
    return kern_f32_to_f16(value);
}

/* ---------------------------------------------------------- data buffers */

ACL_FUNC_VISIBILITY aclDataBuffer *aclCreateDataBuffer(void *data, size_t size)
{
    aclDataBuffer *b = malloc(sizeof *b);
    if (!b) return NULL;
    b->magic = OP_MAGIC_BUFFER;
    b->data = data;
    b->size = size;
    return b;
}

static int buffer_ok(const aclDataBuffer *b) { return b && b->magic == OP_MAGIC_BUFFER; }

ACL_FUNC_VISIBILITY aclError aclDestroyDataBuffer(const aclDataBuffer *dataBuffer)
{
    if (!dataBuffer) return ACL_ERROR_INVALID_PARAM;
    if (!buffer_ok(dataBuffer)) {
        aclsim_log("aclDestroyDataBuffer: %p is not a live data buffer", (const void *)dataBuffer);
        return ACL_ERROR_INVALID_PARAM;
    }
    ((aclDataBuffer *)dataBuffer)->magic = 0;
    free((void *)dataBuffer);
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclUpdateDataBuffer(aclDataBuffer *dataBuffer, void *data, size_t size)
{
    if (!buffer_ok(dataBuffer)) return ACL_ERROR_INVALID_PARAM;
    dataBuffer->data = data;
    dataBuffer->size = size;
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY void *aclGetDataBufferAddr(const aclDataBuffer *dataBuffer)
{
    return buffer_ok(dataBuffer) ? dataBuffer->data : NULL;
}

ACL_FUNC_VISIBILITY uint32_t aclGetDataBufferSize(const aclDataBuffer *dataBuffer)
{
    return buffer_ok(dataBuffer) ? (uint32_t)dataBuffer->size : 0;
}

ACL_FUNC_VISIBILITY size_t aclGetDataBufferSizeV2(const aclDataBuffer *dataBuffer)
{
    return buffer_ok(dataBuffer) ? dataBuffer->size : 0;
}

/* ---------------------------------------------------- tensor descriptions */

ACL_FUNC_VISIBILITY aclTensorDesc *aclCreateTensorDesc(aclDataType dataType, int numDims, const int64_t *dims,
    aclFormat format)
{
    if (numDims < 0 || (numDims > 0 && !dims)) {
        aclsim_log("aclCreateTensorDesc: numDims %d with dims %p", numDims, (const void *)dims);
        return NULL;
    }
    aclTensorDesc *d = malloc(sizeof *d);
    if (!d) return NULL;
    d->dims = malloc((size_t)(numDims ? numDims : 1) * sizeof(int64_t));
    if (!d->dims) { free(d); return NULL; }
    d->name = NULL;
    d->magic = OP_MAGIC_DESC;
    d->dtype = dataType;
    d->format = format;
    d->placement = ACL_MEMTYPE_DEVICE;
    d->ndim = numDims;
    if (numDims) memcpy(d->dims, dims, (size_t)numDims * sizeof(int64_t));
    return d;
}

static int desc_ok(const aclTensorDesc *d) { return d && d->magic == OP_MAGIC_DESC; }

ACL_FUNC_VISIBILITY void aclDestroyTensorDesc(const aclTensorDesc *desc)
{
    if (!desc) return;
    if (!desc_ok(desc)) {
        aclsim_log("aclDestroyTensorDesc: %p is not a live tensor description", (const void *)desc);
        return;
    }
    ((aclTensorDesc *)desc)->magic = 0;
    free(desc->dims);
    free(desc->name);
    free((void *)desc);
}

ACL_FUNC_VISIBILITY aclDataType aclGetTensorDescType(const aclTensorDesc *desc)
{
    return desc_ok(desc) ? desc->dtype : ACL_DT_UNDEFINED;
}

ACL_FUNC_VISIBILITY aclFormat aclGetTensorDescFormat(const aclTensorDesc *desc)
{
    return desc_ok(desc) ? desc->format : ACL_FORMAT_UNDEFINED;
}

ACL_FUNC_VISIBILITY size_t aclGetTensorDescElementCount(const aclTensorDesc *desc)
{
    if (!desc_ok(desc)) return 0;
    size_t n = 1;
    for (int i = 0; i < desc->ndim; i++) {
        if (desc->dims[i] < 0) return 0;          /* dynamic dim */
        if (__builtin_mul_overflow(n, (size_t)desc->dims[i], &n)) return 0;
    }
    return n;
}

ACL_FUNC_VISIBILITY size_t aclGetTensorDescSize(const aclTensorDesc *desc)
{
    if (!desc_ok(desc)) return 0;
    size_t n = aclGetTensorDescElementCount(desc), bytes;
    if (__builtin_mul_overflow(n, kern_dtype_size(desc->dtype), &bytes)) return 0;
    return bytes;
}

ACL_FUNC_VISIBILITY size_t aclGetTensorDescNumDims(const aclTensorDesc *desc)
{
    if (!desc_ok(desc)) return 0;
    if (desc->ndim > 0 && desc->dims[0] == OP_UNKNOWN_RANK) return (size_t)0xFFFFFFFFFFFFFFFEull;
    return (size_t)desc->ndim;
}

ACL_FUNC_VISIBILITY aclError aclGetTensorDescDimV2(const aclTensorDesc *desc, size_t index, int64_t *dimSize)
{
    if (!desc_ok(desc) || !dimSize || index >= (size_t)desc->ndim) return ACL_ERROR_INVALID_PARAM;
    *dimSize = desc->dims[index];
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclSetTensorPlaceMent(aclTensorDesc *desc, aclMemType memType)
{
    if (!desc_ok(desc)) return ACL_ERROR_INVALID_PARAM;
    desc->placement = memType;
    return ACL_SUCCESS;
}

ACL_FUNC_VISIBILITY aclError aclSetTensorFormat(aclTensorDesc *desc, aclFormat format)
{
    if (!desc_ok(desc)) return ACL_ERROR_INVALID_PARAM;
    desc->format = format;
    return ACL_SUCCESS;
}

/* Replaces the shape (torch_npu reuses descriptions across launches). */
ACL_FUNC_VISIBILITY aclError aclSetTensorShape(aclTensorDesc *desc, int numDims, const int64_t *dims)
{
    if (!desc_ok(desc) || numDims < 0 || (numDims > 0 && !dims)) return ACL_ERROR_INVALID_PARAM;
    int64_t *nd = malloc((size_t)(numDims ? numDims : 1) * sizeof(int64_t));
    if (!nd) return ACL_ERROR_BAD_ALLOC;
    if (numDims) memcpy(nd, dims, (size_t)numDims * sizeof(int64_t));
    free(desc->dims);
    desc->dims = nd;
    desc->ndim = numDims;
    return ACL_SUCCESS;
}

/* void, as in CANN: a bad description or NULL name is ignored. */
ACL_FUNC_VISIBILITY void aclSetTensorDescName(aclTensorDesc *desc, const char *name)
{
    if (!desc_ok(desc) || !name) return;
    char *n = strdup(name);
    if (!n) return;
    free(desc->name);
    desc->name = n;
}

/* ------------------------------------------------------------ attributes */

ACL_FUNC_VISIBILITY aclopAttr *aclopCreateAttr(void)
{
    aclopAttr *a = calloc(1, sizeof *a);
    if (a) a->magic = OP_MAGIC_ATTR;
    return a;
}

static int attr_ok(const aclopAttr *a) { return a && a->magic == OP_MAGIC_ATTR; }

ACL_FUNC_VISIBILITY void aclopDestroyAttr(const aclopAttr *attr)
{
    if (!attr) return;
    if (!attr_ok(attr)) {
        aclsim_log("aclopDestroyAttr: %p is not a live op attribute set", (const void *)attr);
        return;
    }
    aclopAttr *a = (aclopAttr *)attr;
    for (int i = 0; i < a->n; i++) {
        free(a->items[i].name);
        free(a->items[i].blob);
    }
    free(a->items);
    a->magic = 0;
    free(a);
}

/* Sets (or replaces) attribute `name`; takes ownership of `blob`. */
static aclError attr_set_blob(aclopAttr *attr, const char *name, int type, int64_t i, float f, void *blob)
{
    if (!attr_ok(attr) || !name) { free(blob); return ACL_ERROR_INVALID_PARAM; }
    op_attr_item *it = NULL;
    for (int k = 0; k < attr->n; k++)
        if (strcmp(attr->items[k].name, name) == 0) it = &attr->items[k];
    if (!it) {
        if (attr->n == attr->cap) {
            int cap = attr->cap ? attr->cap * 2 : 8;
            op_attr_item *ni = realloc(attr->items, (size_t)cap * sizeof *ni);
            if (!ni) { free(blob); return ACL_ERROR_BAD_ALLOC; }
            attr->items = ni;
            attr->cap = cap;
        }
        char *nm = strdup(name);
        if (!nm) { free(blob); return ACL_ERROR_BAD_ALLOC; }
        it = &attr->items[attr->n++];
        it->name = nm;
        it->blob = NULL;
    }
    free(it->blob);
    it->type = type;
    it->i = i;
    it->f = f;
    it->blob = blob;
    return ACL_SUCCESS;
}

static aclError attr_set(aclopAttr *attr, const char *name, int type, int64_t i, float f)
{
    return attr_set_blob(attr, name, type, i, f, NULL);
}

/* A copy of n elements of size es (list attributes); NULL values with n > 0
 * is invalid. */
static aclError attr_set_list(aclopAttr *attr, const char *name, int n, const void *values, size_t es)
{
    if (n < 0 || (n > 0 && !values)) return ACL_ERROR_INVALID_PARAM;
    void *copy = malloc((size_t)(n ? n : 1) * es);
    if (!copy) return ACL_ERROR_BAD_ALLOC;
    if (n) memcpy(copy, values, (size_t)n * es);
    return attr_set_blob(attr, name, OP_ATTR_LIST, n, 0.0f, copy);
}

ACL_FUNC_VISIBILITY aclError aclopSetAttrBool(aclopAttr *attr, const char *attrName, uint8_t attrValue)
{
    return attr_set(attr, attrName, SIM_ATTR_BOOL, attrValue != 0, 0.0f);
}

ACL_FUNC_VISIBILITY aclError aclopSetAttrInt(aclopAttr *attr, const char *attrName, int64_t attrValue)
{
    return attr_set(attr, attrName, SIM_ATTR_INT, attrValue, 0.0f);
}

ACL_FUNC_VISIBILITY aclError aclopSetAttrFloat(aclopAttr *attr, const char *attrName, float attrValue)
{
    return attr_set(attr, attrName, SIM_ATTR_FLOAT, 0, attrValue);
}

/* a data type is an enum value: an int attribute to the kernels */
ACL_FUNC_VISIBILITY aclError aclopSetAttrDataType(aclopAttr *attr, const char *attrName, aclDataType attrValue)
{
    return attr_set(attr, attrName, SIM_ATTR_INT, attrValue, 0.0f);
}

ACL_FUNC_VISIBILITY aclError aclopSetAttrString(aclopAttr *attr, const char *attrName, const char *attrValue)
{
    if (!attrValue) return ACL_ERROR_INVALID_PARAM;
    char *v = strdup(attrValue);
    if (!v) return ACL_ERROR_BAD_ALLOC;
    return attr_set_blob(attr, attrName, OP_ATTR_STRING, 0, 0.0f, v);
}

ACL_FUNC_VISIBILITY aclError aclopSetAttrListBool(aclopAttr *attr, const char *attrName, int numValues,
    const uint8_t *values)
{
    return attr_set_list(attr, attrName, numValues, values, sizeof *values);
}

ACL_FUNC_VISIBILITY aclError aclopSetAttrListInt(aclopAttr *attr, const char *attrName, int numValues,
    const int64_t *values)
{
    return attr_set_list(attr, attrName, numValues, values, sizeof *values);
}

ACL_FUNC_VISIBILITY aclError aclopSetAttrListFloat(aclopAttr *attr, const char *attrName, int numValues,
    const float *values)
{
    return attr_set_list(attr, attrName, numValues, values, sizeof *values);
}

/* numLists lists; list k has numValues[k] values at values[k]: flattened */
ACL_FUNC_VISIBILITY aclError aclopSetAttrListListInt(aclopAttr *attr, const char *attrName, int numLists,
    const int *numValues, const int64_t *const values[])
{
    if (numLists < 0 || (numLists > 0 && (!numValues || !values))) return ACL_ERROR_INVALID_PARAM;
    size_t total = 0;
    for (int k = 0; k < numLists; k++) {
        if (numValues[k] < 0 || (numValues[k] > 0 && !values[k])) return ACL_ERROR_INVALID_PARAM;
        total += (size_t)numValues[k];
    }
    int64_t *flat = malloc((total + (size_t)numLists + 1) * sizeof(int64_t));
    if (!flat) return ACL_ERROR_BAD_ALLOC;
    size_t at = 0;
    for (int k = 0; k < numLists; k++) {
        flat[at++] = numValues[k];
        if (numValues[k]) memcpy(flat + at, values[k], (size_t)numValues[k] * sizeof(int64_t));
        at += (size_t)numValues[k];
    }
    return attr_set_blob(attr, attrName, OP_ATTR_LIST, numLists, 0.0f, flat);
}

/* ------------------------------------------------------------ op launch */

/* Which operators may run the hash kernel: only opaque byte-range operators
 * launched through aclop (every tensor a 1-D ACL_UINT8 range, how acl_replay
 * describes trace ranges). aclnn operators come from frameworks with typed
 * tensors (a 1-D uint8 aclnnAdd is a real uint8 addition), so they never do.
 * Any other operator without a kernel, or with element types its kernel does
 * not compute exactly, is refused — never answered with made-up numbers. */
static aclError op_check(const char *op_type, const sim_tensor *in, int nin, const sim_tensor *out, int nout,
    const sim_attr *attrs, int nattrs, uint64_t *flops, int allow_bytes)
{
    if (!op_type || nin < 0 || nout < 0 || nattrs < 0 || (nin && !in) || (nout && !out) || (nattrs && !attrs)) {
        aclsim_log("operator launch: invalid arguments (op %s, %d inputs, %d outputs, %d attrs)",
            op_type ? op_type : "(null)", nin, nout, nattrs);
        return ACL_ERROR_INVALID_PARAM;
    }
    char what[128];
    aclError e;
    for (int i = 0; i < nin; i++) {
        snprintf(what, sizeof what, "%s input %d", op_type, i);
        if ((e = kern_check_tensor(&in[i], what))) return e;
    }
    for (int j = 0; j < nout; j++) {
        snprintf(what, sizeof what, "%s output %d", op_type, j);
        if ((e = kern_check_tensor(&out[j], what))) return e;
    }
    sim_op_args a = { op_type, nin, nout, nattrs, in, out, attrs };
    int byte_range = allow_bytes && kern_is_byte_range_op(&a);
    const sim_kernel_def *k = byte_range ? NULL : kern_find(op_type);
    if (!k && !byte_range) {
        /* ACL_ERROR_OP_NOT_FOUND (acl_base_rt.h: 100024), what aclopExecuteV2 and
         * aclopCompileAndExecute return when no kernel is registered for the
         * type; libopapi maps it to ACLNN_ERR_INNER_FIND_KERNEL_ERROR */
        kern_refuse(&a, "no simulated kernel for this operator", ACL_ERROR_OP_NOT_FOUND);
        return ACL_ERROR_OP_NOT_FOUND;
    }
    uint64_t fl = 0;
    if (k && (e = k->check(&a, &fl))) return e;
    const sim_attr *fa = kern_attr(&a, "flops");
    if (fa) {
        int64_t v = kern_attr_int(&a, "flops", 0);
        if (v < 0) {
            aclsim_log("%s: attr flops = %lld is negative", op_type, (long long)v);
            return ACL_ERROR_INVALID_PARAM;
        }
        fl = (uint64_t)v;
    }
    if (flops) *flops = fl;
    return ACL_SUCCESS;
}

/* The GetWorkspaceSize phase of aclnn operators: typed tensors only. */
SIM_API aclError aclsim_op_check(const char *op_type, const sim_tensor *in, int nin, const sim_tensor *out,
    int nout, const sim_attr *attrs, int nattrs, uint64_t *flops)
{
    return op_check(op_type, in, nin, out, nout, attrs, nattrs, flops, 0);
}

/* ACLSIM_OPS_LOG=FILE: at exit, one line per distinct launched operator
 * signature — "API OP_TYPE in-dtypes->out-dtypes COUNT" — so tests can
 * prove which operators and element types a workload exercised. */
#define OPS_LOG_SLOTS 4096
static pthread_mutex_t g_ops_lock = PTHREAD_MUTEX_INITIALIZER;
static char *g_ops_key[OPS_LOG_SLOTS];
static uint64_t g_ops_count[OPS_LOG_SLOTS];
static const char *g_ops_path;
static int g_ops_state;   /* 0 unknown, 1 off, 2 on */

static void ops_log_write(void)
{
    FILE *f = fopen(g_ops_path, "w");
    if (!f) { aclsim_log("cannot write ACLSIM_OPS_LOG file '%s'", g_ops_path); return; }
    pthread_mutex_lock(&g_ops_lock);
    for (int i = 0; i < OPS_LOG_SLOTS; i++)
        if (g_ops_key[i]) fprintf(f, "%s %llu\n", g_ops_key[i], (unsigned long long)g_ops_count[i]);
    pthread_mutex_unlock(&g_ops_lock);
    fclose(f);
}

static void ops_log_record(const char *api, const sim_op_args *a)
{
    if (g_ops_state == 1) return;
    char key[512];
    size_t n = (size_t)snprintf(key, sizeof key, "%s %s ", api, a->op_type);
    /* element types, runs written once with a count (foreach lists): float32*21 */
    for (int side = 0; side < 2; side++) {
        const sim_tensor *t = side ? a->out : a->in;
        int cnt = side ? a->nout : a->nin;
        if (side && n < sizeof key) n += (size_t)snprintf(key + n, sizeof key - n, "->");
        for (int i = 0; i < cnt && n < sizeof key;) {
            int run = 1;
            while (i + run < cnt && t[i + run].dtype == t[i].dtype) run++;
            n += (size_t)snprintf(key + n, sizeof key - n, "%s%s", i ? "," : "", kern_dtype_name(t[i].dtype));
            if (run > 1 && n < sizeof key) n += (size_t)snprintf(key + n, sizeof key - n, "*%d", run);
            i += run;
        }
    }
    uint64_t h = 1469598103934665603ull;
    for (const char *c = key; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    pthread_mutex_lock(&g_ops_lock);
    if (g_ops_state == 0) {
        const char *v = getenv("ACLSIM_OPS_LOG");
        g_ops_state = v && *v ? 2 : 1;
        if (g_ops_state == 2) { g_ops_path = v; atexit(ops_log_write); }
    }
    if (g_ops_state == 2)
        for (uint64_t k = 0; k < OPS_LOG_SLOTS; k++) {
            int i = (int)((h + k) % OPS_LOG_SLOTS);
            if (!g_ops_key[i]) g_ops_key[i] = strdup(key);
            if (g_ops_key[i] && !strcmp(g_ops_key[i], key)) { g_ops_count[i]++; break; }
        }
    pthread_mutex_unlock(&g_ops_lock);
}

/* Everything a queued operator needs, in one allocation (plus snapshots of
 * host-placed inputs). */
typedef struct op_payload {
    sim_op_args args;
    const sim_kernel_def *k;
    void **snap;             /* per input: host snapshot or NULL */
    int nsnap;
} op_payload;

static aclError op_exec(sim_work *w)
{
    op_payload *p = w->payload;
    if (!p->k) return kern_hash_run(&p->args);
    /* every output empty (frameworks launch operators on empty tensors):
     * nothing to compute or write, as on the device */
    int empty = p->args.nout > 0;
    for (int j = 0; j < p->args.nout && empty; j++) empty = kern_numel(&p->args.out[j]) == 0;
    return empty ? ACL_SUCCESS : p->k->run(&p->args);
}

static void op_destroy(sim_work *w)
{
    op_payload *p = w->payload;
    if (!p) return;
    for (int i = 0; i < p->nsnap; i++) free(p->snap[i]);
    free(p);
    w->payload = NULL;
}

/* host_in[i] != 0: input i is host memory (aclSetTensorPlaceMent HOST); its
 * bytes are copied at launch, as the real runtime copies host inputs into the
 * task, and it has no device range to check. */
static aclError launch_common(aclrtStream stream, const char *api, const char *op_type, const sim_tensor *in,
    int nin, const sim_tensor *out, int nout, const sim_attr *attrs, int nattrs, const unsigned char *host_in,
    int allow_bytes)
{
    uint64_t flops = 0;
    aclError e = op_check(op_type, in, nin, out, nout, attrs, nattrs, &flops, allow_bytes);
    if (e) return e;
    sim_op_args probe = { op_type, nin, nout, nattrs, in, out, attrs };
    const sim_kernel_def *k = allow_bytes && kern_is_byte_range_op(&probe) ? NULL : kern_find(op_type);

    uint64_t touched = 0;
    int nranges = 0;
    for (int i = 0; i < nin; i++) {
        touched += kern_view_bytes(&in[i]);
        if (in[i].bytes && !(host_in && host_in[i])) nranges++;
    }
    for (int j = 0; j < nout; j++) {
        touched += kern_view_bytes(&out[j]);
        if (out[j].bytes) nranges++;
    }

    size_t tlen = strlen(op_type) + 1;
    size_t sz = sizeof(op_payload) + (size_t)(nin + nout) * sizeof(sim_tensor) + (size_t)nattrs * sizeof(sim_attr)
        + (size_t)nin * sizeof(void *) + tlen;
    op_payload *p = calloc(1, sz);
    if (!p) return ACL_ERROR_BAD_ALLOC;
    sim_tensor *t = (sim_tensor *)(p + 1);
    sim_attr *at = (sim_attr *)(t + nin + nout);
    void **snap = (void **)(at + nattrs);
    char *name = (char *)(snap + nin);
    if (nin) memcpy(t, in, (size_t)nin * sizeof(sim_tensor));
    if (nout) memcpy(t + nin, out, (size_t)nout * sizeof(sim_tensor));
    if (nattrs) memcpy(at, attrs, (size_t)nattrs * sizeof(sim_attr));
    for (int i = 0; i < nattrs; i++) at[i].name[sizeof at[i].name - 1] = 0;
    memcpy(name, op_type, tlen);
    p->args = (sim_op_args){ name, nin, nout, nattrs, t, t + nin, at };
    p->k = k;
    p->snap = snap;
    p->nsnap = nin;
    for (int i = 0; i < nin; i++) {
        if (!(host_in && host_in[i]) || !t[i].bytes) continue;
        snap[i] = malloc(t[i].bytes);
        if (!snap[i]) {
            for (int q = 0; q < i; q++) free(snap[q]);
            free(p);
            return ACL_ERROR_BAD_ALLOC;
        }
        memcpy(snap[i], t[i].base, t[i].bytes);
        t[i].data = (char *)snap[i] + ((char *)t[i].data - (char *)t[i].base);
        t[i].base = snap[i];
    }

    sim_work *w = aclsim_work_new(nranges);
    if (!w) {
        for (int i = 0; i < nin; i++) free(snap[i]);
        free(p);
        return ACL_ERROR_BAD_ALLOC;
    }
    int r = 0;
    for (int i = 0; i < nin; i++) {
        if (!in[i].bytes || (host_in && host_in[i])) continue;
        w->ranges[r++] = (sim_range){ (uintptr_t)in[i].base, in[i].bytes, k && ((k->writes_inputs >> i) & 1) ? 2 : 0 };
    }
    for (int j = 0; j < nout; j++)
        if (out[j].bytes) w->ranges[r++] = (sim_range){ (uintptr_t)out[j].base, out[j].bytes, 1 };
    w->nranges = r;
    snprintf(w->what, sizeof w->what, "%s(%s)", api ? api : "aclsim_launch_op", op_type);
    w->kind = SIM_WORK_OP;
    w->cost_ns = aclsim_op_cost_ns(flops, touched);
    w->flops = flops;          /* the stream recosts the roofline for host-mapped bytes */
    w->bytes = touched;
    w->exec = op_exec;
    w->destroy = op_destroy;
    w->payload = p;
    ops_log_record(api ? api : "aclsim_launch_op", &probe);
    return aclsim_submit(stream, w);
}

SIM_API aclError aclsim_launch_op(aclrtStream stream, const char *api, const char *op_type, const sim_tensor *in,
    int nin, const sim_tensor *out, int nout, const sim_attr *attrs, int nattrs)
{
    return launch_common(stream, api, op_type, in, nin, out, nout, attrs, nattrs, NULL, 0);
}

/* ------------------------------------------------------------------ aclop */

static aclError check_desc_array(const char *api, const char *role, int n, const aclTensorDesc *const d[])
{
    if (n == 0) return ACL_SUCCESS;
    if (!d) {
        aclsim_log("%s: %s description array is NULL with %d entries", api, role, n);
        return ACL_ERROR_INVALID_PARAM;
    }
    for (int i = 0; i < n; i++)
        if (!desc_ok(d[i])) {
            aclsim_log("%s: %s description %d is %s", api, role, i, d[i] ? "not a live tensor description" : "NULL");
            return ACL_ERROR_INVALID_PARAM;
        }
    return ACL_SUCCESS;
}

static aclError check_buffer_array(const char *api, const char *role, int n, const aclDataBuffer *const b[])
{
    if (n == 0) return ACL_SUCCESS;
    if (!b) {
        aclsim_log("%s: %s buffer array is NULL with %d entries", api, role, n);
        return ACL_ERROR_INVALID_PARAM;
    }
    for (int i = 0; i < n; i++) {
        if (!buffer_ok(b[i])) {
            aclsim_log("%s: %s buffer %d is %s", api, role, i, b[i] ? "not a live data buffer" : "NULL");
            return ACL_ERROR_INVALID_PARAM;
        }
        if (!b[i]->data && b[i]->size > 0) {
            aclsim_log("%s: %s buffer %d has NULL data and size %zu", api, role, i, b[i]->size);
            return ACL_ERROR_INVALID_PARAM;
        }
    }
    return ACL_SUCCESS;
}

/* The real runtime returns success without launching when every output is
 * empty (a zero dim in each output description). */
static int all_outputs_empty(int n, const aclTensorDesc *const d[])
{
    if (n == 0) return 0;
    for (int j = 0; j < n; j++) {
        int empty = 0;
        for (int k = 0; k < d[j]->ndim; k++)
            if (d[j]->dims[k] == 0) empty = 1;
        if (!empty) return 0;
    }
    return 1;
}

static aclError desc_to_tensor(const char *api, const char *op, const char *role, int idx, const aclTensorDesc *d,
    const aclDataBuffer *b, sim_tensor *t)
{
    memset(t, 0, sizeof *t);
    if (d->ndim > SIM_MAX_DIMS) {
        aclsim_log("%s(%s): %s %d has %d dims (the simulator supports up to %d)", api, op, role, idx, d->ndim,
            SIM_MAX_DIMS);
        return ACL_ERROR_INVALID_PARAM;
    }
    t->dtype = d->dtype;
    t->ndim = d->ndim;
    int64_t stride = 1;
    for (int k = d->ndim - 1; k >= 0; k--) {
        if (d->dims[k] < 0) {
            aclsim_log("%s(%s): %s %d has dynamic dim %d = %lld; execution needs static shapes", api, op, role, idx,
                k, (long long)d->dims[k]);
            return ACL_ERROR_INVALID_PARAM;
        }
        t->dims[k] = d->dims[k];
        t->strides[k] = stride;
        if (d->dims[k] > 1 && __builtin_mul_overflow(stride, d->dims[k], &stride)) return ACL_ERROR_INVALID_PARAM;
    }
    t->data = t->base = b->data;
    t->bytes = b->size;
    size_t need = aclGetTensorDescSize(d);
    if (need == 0 && aclGetTensorDescElementCount(d) != 0 && kern_dtype_size(d->dtype) != 0) {
        aclsim_log("%s(%s): %s %d description size overflows", api, op, role, idx);
        return ACL_ERROR_INVALID_PARAM;
    }
    if (b->size < need) {
        aclsim_log("%s(%s): %s %d buffer holds %zu bytes but its description needs %zu", api, op, role, idx,
            b->size, need);
        return ACL_ERROR_INVALID_PARAM;
    }
    return ACL_SUCCESS;
}

SIM_API aclError aclsim_op_execute(const char *api, const char *opType, int numInputs,
    const aclTensorDesc *const inputDesc[], const aclDataBuffer *const inputs[], int numOutputs,
    const aclTensorDesc *const outputDesc[], aclDataBuffer *const outputs[], const aclopAttr *attr,
    aclrtStream stream)
{
    if (!api) api = "aclopExecuteV2";
    if (!opType) {
        aclsim_log("%s: opType is NULL", api);
        return ACL_ERROR_INVALID_PARAM;
    }
    if (numInputs < 0 || numOutputs < 0) {
        aclsim_log("%s(%s): negative count (%d inputs, %d outputs)", api, opType, numInputs, numOutputs);
        return ACL_ERROR_INVALID_PARAM;
    }
    aclError e;
    if ((e = check_desc_array(api, "input", numInputs, inputDesc)) ||
        (e = check_desc_array(api, "output", numOutputs, outputDesc)))
        return e;
    if (all_outputs_empty(numOutputs, outputDesc)) return ACL_SUCCESS;
    if ((e = check_buffer_array(api, "input", numInputs, inputs)) ||
        (e = check_buffer_array(api, "output", numOutputs, (const aclDataBuffer *const *)outputs)))
        return e;
    if (attr && !attr_ok(attr)) {
        aclsim_log("%s(%s): attr %p is not a live op attribute set", api, opType, (const void *)attr);
        return ACL_ERROR_INVALID_PARAM;
    }
    if ((e = aclsim_check_ready())) return e;
    if ((e = aclsim_stream_check(stream))) return e;
    if (aclsim_fault_hit(SIM_FAULT_OP)) return ACL_ERROR_RT_AICORE_EXCEPTION;

    int nt = numInputs + numOutputs;
    int na = attr ? attr->n : 0;
    sim_tensor *t = calloc((size_t)(nt ? nt : 1), sizeof *t);
    sim_attr *sa = calloc((size_t)(na ? na : 1), sizeof *sa);
    unsigned char *host = calloc((size_t)(numInputs ? numInputs : 1), 1);
    if (!t || !sa || !host) { free(t); free(sa); free(host); return ACL_ERROR_BAD_ALLOC; }
    for (int i = 0; i < numInputs && !e; i++) {
        e = desc_to_tensor(api, opType, "input", i, inputDesc[i], inputs[i], &t[i]);
        host[i] = inputDesc[i]->placement != ACL_MEMTYPE_DEVICE;
    }
    for (int j = 0; j < numOutputs && !e; j++) {
        if (outputDesc[j]->placement != ACL_MEMTYPE_DEVICE) {
            aclsim_log("%s(%s): output %d is placed in host memory (not supported)", api, opType, j);
            e = ACL_ERROR_API_NOT_SUPPORT;
            break;
        }
        e = desc_to_tensor(api, opType, "output", j, outputDesc[j], outputs[j], &t[numInputs + j]);
    }
    int nsa = 0;
    for (int k = 0; k < na; k++) {
        const op_attr_item *it = &attr->items[k];
        if (it->type != SIM_ATTR_BOOL && it->type != SIM_ATTR_INT && it->type != SIM_ATTR_FLOAT) continue;
        snprintf(sa[nsa].name, sizeof sa[nsa].name, "%s", it->name);
        sa[nsa].type = it->type;
        sa[nsa].i = it->i;
        sa[nsa].f = it->f;
        nsa++;
    }
    if (!e) e = launch_common(stream, api, opType, t, numInputs, t + numInputs, numOutputs, sa, nsa, host, 1);
    free(t);
    free(sa);
    free(host);
    return e;
}

ACL_FUNC_VISIBILITY aclError aclopExecute(const char *opType, int numInputs, const aclTensorDesc *const inputDesc[],
    const aclDataBuffer *const inputs[], int numOutputs, const aclTensorDesc *const outputDesc[],
    aclDataBuffer *const outputs[], const aclopAttr *attr, aclrtStream stream)
{
    return aclsim_op_execute("aclopExecute", opType, numInputs, inputDesc, inputs, numOutputs, outputDesc, outputs,
        attr, stream);
}

ACL_FUNC_VISIBILITY aclError aclopExecuteV2(const char *opType, int numInputs, aclTensorDesc *inputDesc[],
    aclDataBuffer *inputs[], int numOutputs, aclTensorDesc *outputDesc[], aclDataBuffer *outputs[],
    aclopAttr *attr, aclrtStream stream)
{
    return aclsim_op_execute("aclopExecuteV2", opType, numInputs, (const aclTensorDesc *const *)inputDesc,
        (const aclDataBuffer *const *)inputs, numOutputs, (const aclTensorDesc *const *)outputDesc, outputs, attr,
        stream);
}
