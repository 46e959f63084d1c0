/* libnnopbase.so stand-in: the aclnn object model (tensors, scalars, arrays,
 * lists) and the registry of live objects that libopapi consults.
 * Behaviour follows the real nnopbase (acl_op_api.cpp): creation with a NULL
 * array and a non-zero count returns NULL; destroying NULL is a success; a
 * tensor list owns its tensors. Unlike the real library, a pointer that is not
 * a live object of the right kind is reported (ACLNN_ERR_PARAM_INVALID) instead
 * of being dereferenced. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "nnopbase/aclnn_objects.h"

/* ------------------------------------------------------------- registry */

static pthread_mutex_t g_reg_lock = PTHREAD_MUTEX_INITIALIZER;
static nn_obj **g_bucket;
static size_t g_nbucket;   /* power of two */
static size_t g_nlive;

static size_t bucket_of(const void *p, size_t nb)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)(x & (nb - 1));
}

/* With the lock held. Keeps about one object per bucket. */
static void grow(void)
{
    size_t nb = g_nbucket ? g_nbucket * 2 : 1024;
    nn_obj **b = calloc(nb, sizeof *b);
    if (!b) return;                        /* keep the old table: chains just get longer */
    for (size_t i = 0; i < g_nbucket; i++) {
        nn_obj *o = g_bucket[i];
        while (o) {
            nn_obj *next = o->next;
            size_t k = bucket_of(o, nb);
            o->next = b[k];
            b[k] = o;
            o = next;
        }
    }
    free(g_bucket);
    g_bucket = b;
    g_nbucket = nb;
}

SIM_API void aclsim_nn_register(nn_obj *o, uint32_t kind)
{
    o->magic = NN_MAGIC;
    o->kind = kind;
    pthread_mutex_lock(&g_reg_lock);
    if (g_nlive >= g_nbucket) grow();
    if (g_nbucket) {
        size_t k = bucket_of(o, g_nbucket);
        o->next = g_bucket[k];
        g_bucket[k] = o;
        g_nlive++;
    }
    pthread_mutex_unlock(&g_reg_lock);
}

/* With the lock held: the link that points at p, or NULL. Only registered
 * (live) objects are dereferenced, never p itself. */
static nn_obj **find_link(const void *p)
{
    if (!g_nbucket) return NULL;
    nn_obj **l = &g_bucket[bucket_of(p, g_nbucket)];
    while (*l && (const void *)*l != p) l = &(*l)->next;
    return *l ? l : NULL;
}

SIM_API nn_obj *aclsim_nn_lookup(const void *p, uint32_t kind)
{
    if (!p) return NULL;
    pthread_mutex_lock(&g_reg_lock);
    nn_obj **l = find_link(p);
    nn_obj *o = (l && (*l)->kind == kind && (*l)->magic == NN_MAGIC) ? *l : NULL;
    pthread_mutex_unlock(&g_reg_lock);
    return o;
}

SIM_API int aclsim_nn_unregister(const void *p, uint32_t kind)
{
    if (!p) return 0;
    int ok = 0;
    pthread_mutex_lock(&g_reg_lock);
    nn_obj **l = find_link(p);
    if (l && (*l)->kind == kind) {
        nn_obj *o = *l;
        *l = o->next;
        o->next = NULL;
        o->magic = 0;
        g_nlive--;
        ok = 1;
    }
    pthread_mutex_unlock(&g_reg_lock);
    return ok;
}

static const char *kind_name(uint32_t k)
{
    switch (k) {
    case NN_TENSOR: return "aclTensor";
    case NN_SCALAR: return "aclScalar";
    case NN_INT_ARRAY: return "aclIntArray";
    case NN_FLOAT_ARRAY: return "aclFloatArray";
    case NN_BOOL_ARRAY: return "aclBoolArray";
    case NN_TENSOR_LIST: return "aclTensorList";
    case NN_SCALAR_LIST: return "aclScalarList";
    case NN_EXECUTOR: return "aclOpExecutor";
    default: return "object";
    }
}

/* Shared destroy path: NULL is fine, a non-live pointer is reported. */
static aclnnStatus destroy_obj(const char *api, const void *p, uint32_t kind)
{
    if (!p) return ACLNN_SUCCESS;
    if (!aclsim_nn_unregister(p, kind)) {
        aclsim_log("%s: %p is not a live %s (never created, or already destroyed)", api, p, kind_name(kind));
        return ACLNN_ERR_PARAM_INVALID;
    }
    free((void *)p);
    return ACLNN_SUCCESS;
}

/* --------------------------------------------------------------- tensors */

ACL_FUNC_VISIBILITY aclTensor *aclCreateTensor(const int64_t *viewDims, uint64_t viewDimsNum, aclDataType dataType,
    const int64_t *stride, int64_t offset, aclFormat format, const int64_t *storageDims, uint64_t storageDimsNum,
    void *tensorData)
{
    if ((!viewDims && viewDimsNum > 0) || (!storageDims && storageDimsNum > 0)) return NULL;
    if (viewDimsNum > SIM_MAX_DIMS || storageDimsNum > SIM_MAX_DIMS) {
        aclsim_log("aclCreateTensor: %llu view dims / %llu storage dims (the simulator supports up to %d)",
            (unsigned long long)viewDimsNum, (unsigned long long)storageDimsNum, SIM_MAX_DIMS);
        return NULL;
    }
    aclTensor *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->dtype = dataType;
    t->format = format;
    t->ndim = (int)viewDimsNum;
    t->storage_ndim = (int)storageDimsNum;
    t->offset = offset;
    t->data = tensorData;
    int64_t contig = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        t->dims[i] = viewDims[i];
        /* no stride array: the view is contiguous */
        t->strides[i] = stride ? stride[i] : contig;
        contig *= viewDims[i] > 0 ? viewDims[i] : 1;
    }
    for (int i = 0; i < t->storage_ndim; i++) t->storage_dims[i] = storageDims[i];
    aclsim_nn_register(&t->h, NN_TENSOR);
    return t;
}

ACL_FUNC_VISIBILITY aclnnStatus aclDestroyTensor(const aclTensor *tensor)
{
    return destroy_obj("aclDestroyTensor", tensor, NN_TENSOR);
}

ACL_FUNC_VISIBILITY aclnnStatus aclGetViewShape(const aclTensor *tensor, int64_t **viewDims, uint64_t *viewDimsNum)
{
    if (!tensor || !viewDims || !viewDimsNum) return ACLNN_ERR_PARAM_NULLPTR;
    const aclTensor *t = (const aclTensor *)aclsim_nn_lookup(tensor, NN_TENSOR);
    if (!t) {
        aclsim_log("aclGetViewShape: %p is not a live aclTensor", (const void *)tensor);
        return ACLNN_ERR_PARAM_INVALID;
    }
    /* the caller releases it with delete[] (or free): plain int64 array */
    int64_t *d = malloc((size_t)(t->ndim ? t->ndim : 1) * sizeof *d);
    if (!d) return NN_ERR_INNER_NULLPTR;
    for (int i = 0; i < t->ndim; i++) d[i] = t->dims[i];
    *viewDims = d;
    *viewDimsNum = (uint64_t)t->ndim;
    return ACLNN_SUCCESS;
}

/* --------------------------------------------------------------- scalars */

ACL_FUNC_VISIBILITY aclScalar *aclCreateScalar(void *value, aclDataType dataType)
{
    if (!value) return NULL;
    aclScalar *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->dtype = dataType;
    size_t n = kern_dtype_size(dataType);
    memcpy(s->value, value, n < sizeof s->value ? n : sizeof s->value);
    aclsim_nn_register(&s->h, NN_SCALAR);
    return s;
}

ACL_FUNC_VISIBILITY aclnnStatus aclDestroyScalar(const aclScalar *scalar)
{
    return destroy_obj("aclDestroyScalar", scalar, NN_SCALAR);
}

/* ---------------------------------------------------------------- arrays */

#define DEFINE_ARRAY(Type, Elem, kind, create, destroy)                                   \
    ACL_FUNC_VISIBILITY Type *create(const Elem *value, uint64_t size)                   \
    {                                                                                       \
        if (!value && size > 0) return NULL;                                                \
        if (size > ((uint64_t)1 << 40) / sizeof(Elem)) return NULL;                         \
        Type *a = malloc(sizeof *a + (size_t)size * sizeof(Elem));                          \
        if (!a) return NULL;                                                                \
        a->n = size;                                                                        \
        if (size) memcpy(a->v, value, (size_t)size * sizeof(Elem));                         \
        aclsim_nn_register(&a->h, kind);                                                    \
        return a;                                                                           \
    }                                                                                       \
    ACL_FUNC_VISIBILITY aclnnStatus destroy(const Type *array)                              \
    {                                                                                       \
        return destroy_obj(#destroy, array, kind);                                          \
    }

DEFINE_ARRAY(aclIntArray, int64_t, NN_INT_ARRAY, aclCreateIntArray, aclDestroyIntArray)
DEFINE_ARRAY(aclFloatArray, float, NN_FLOAT_ARRAY, aclCreateFloatArray, aclDestroyFloatArray)
DEFINE_ARRAY(aclBoolArray, bool, NN_BOOL_ARRAY, aclCreateBoolArray, aclDestroyBoolArray)

/* ----------------------------------------------------------------- lists */

ACL_FUNC_VISIBILITY aclTensorList *aclCreateTensorList(const aclTensor *const *value, uint64_t size)
{
    if (!value && size > 0) return NULL;
    if (size > ((uint64_t)1 << 32)) return NULL;
    aclTensorList *l = malloc(sizeof *l + (size_t)size * sizeof(l->v[0]));
    if (!l) return NULL;
    l->n = size;
    for (uint64_t i = 0; i < size; i++) l->v[i] = value[i];
    aclsim_nn_register(&l->h, NN_TENSOR_LIST);
    return l;
}

ACL_FUNC_VISIBILITY aclScalarList *aclCreateScalarList(const aclScalar *const *value, uint64_t size)
{
    if (!value && size > 0) return NULL;
    if (size > ((uint64_t)1 << 32)) return NULL;
    aclScalarList *l = malloc(sizeof *l + (size_t)size * sizeof(l->v[0]));
    if (!l) return NULL;
    l->n = size;
    for (uint64_t i = 0; i < size; i++) l->v[i] = value[i];
    aclsim_nn_register(&l->h, NN_SCALAR_LIST);
    return l;
}

/* A list owns its elements (the real library destroys them with the list). */
ACL_FUNC_VISIBILITY aclnnStatus aclDestroyTensorList(const aclTensorList *array)
{
    if (!array) return ACLNN_SUCCESS;
    if (!aclsim_nn_unregister(array, NN_TENSOR_LIST)) {
        aclsim_log("aclDestroyTensorList: %p is not a live aclTensorList", (const void *)array);
        return ACLNN_ERR_PARAM_INVALID;
    }
    aclnnStatus st = ACLNN_SUCCESS;
    for (uint64_t i = 0; i < array->n; i++)
        if (array->v[i] && destroy_obj("aclDestroyTensorList", array->v[i], NN_TENSOR)) st = ACLNN_ERR_PARAM_INVALID;
    free((void *)array);
    return st;
}

ACL_FUNC_VISIBILITY aclnnStatus aclDestroyScalarList(const aclScalarList *array)
{
    if (!array) return ACLNN_SUCCESS;
    if (!aclsim_nn_unregister(array, NN_SCALAR_LIST)) {
        aclsim_log("aclDestroyScalarList: %p is not a live aclScalarList", (const void *)array);
        return ACLNN_ERR_PARAM_INVALID;
    }
    aclnnStatus st = ACLNN_SUCCESS;
    for (uint64_t i = 0; i < array->n; i++)
        if (array->v[i] && destroy_obj("aclDestroyScalarList", array->v[i], NN_SCALAR)) st = ACLNN_ERR_PARAM_INVALID;
    free((void *)array);
    return st;
}

/* -------------------------------------------------------------- executor */

/* Executors are created by libopapi and normally freed by the launch. The
 * real library returns ACLNN_ERR_INNER_NULLPTR for NULL and ACLNN_ERR_INNER
 * for a pointer it does not recognise. */
ACL_FUNC_VISIBILITY aclnnStatus aclDestroyAclOpExecutor(aclOpExecutor *executor)
{
    if (!executor) return NN_ERR_INNER_NULLPTR;
    if (!aclsim_nn_unregister(executor, NN_EXECUTOR)) {
        aclsim_log("aclDestroyAclOpExecutor: %p is not a live executor (already launched or destroyed?)",
            (void *)executor);
        return ACLNN_ERR_INNER;
    }
    free(executor);
    return ACLNN_SUCCESS;
}
