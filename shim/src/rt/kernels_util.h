/* Helpers shared by the typed operator kernels (kernels_nn.c, kernels_math.c,
 * kernels_index.c, kernels_reduce.c, kernels_llm.c), defined in
 * kernels_util.c. Values travel as double (floating types; one rounding when
 * stored) or int64 (integer types and bool, exact). */
#ifndef ACLSIM_KERNELS_UTIL_H_
#define ACLSIM_KERNELS_UTIL_H_

#include "rt/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* float32, float16, bfloat16, double */
int kn_flt_dtype(int dt);
/* kn_flt_dtype or an integer type (or bool) */
int kn_num_dtype(int dt);

/* One element at p of type dt. Stores round once (float16/bfloat16 through
 * float32, to nearest even); float -> integer truncates, NaN -> 0. */
double kn_ld_d(const unsigned char *p, int dt);
int64_t kn_ld_i(const unsigned char *p, int dt);
int64_t kn_d_to_i(double v);
void kn_st_d(unsigned char *p, int dt, double v);
void kn_st_i(unsigned char *p, int dt, int64_t v);

/* Row-major copies of a view (malloc'd, at least one element; NULL when out
 * of memory) and stores of a row-major array into a view. */
double *kn_load_d(const sim_tensor *t);
int64_t *kn_load_i(const sim_tensor *t);
void kn_store_d(const sim_tensor *t, const double *v);
void kn_store_i(const sim_tensor *t, const int64_t *v);

/* Checks. Each logs why (naming the operator) and returns the code. */
aclError kn_fail(const sim_op_args *a, aclError e, const char *why);
aclError kn_oom(const sim_op_args *a);
aclError kn_counts(const sim_op_args *a, int nin_min, int nin_max, int nout_min, int nout_max);
/* ACL_ERROR_UNSUPPORTED_DATA_TYPE with the refusal line (kern_refuse). */
aclError kn_refuse_type(const sim_op_args *a, const char *why);
/* kn_refuse_type unless every tensor's type satisfies ok(); `what` lists
 * the supported types for the message. */
aclError kn_types(const sim_op_args *a, int (*ok)(int), const char *what);
int kn_same_shape(const sim_tensor *x, const sim_tensor *y);
aclError kn_shape_fail(const sim_op_args *a, const char *why, const sim_tensor *x, const sim_tensor *y);
int kn_broadcasts_to(const sim_tensor *x, const sim_tensor *y);
/* y is exactly the broadcast shape of inputs in[first .. first+n) */
aclError kn_bcast_out(const sim_op_args *a, int first, int n, const sim_tensor *y);

/* A numeric attribute as double (float or int attribute). */
double kn_attr_d(const sim_op_args *a, const char *name, double def);
/* axis (negative counts from the end) for rank nd; -1 if out of range */
int kn_norm_axis(int64_t axis, int nd);
/* Inputs in[first .. first+n) viewed with y's shape (broadcasting) and
 * loaded as double (d[k]) or, with ints, int64 (iv[k]). 0 (everything freed)
 * when out of memory or not broadcastable. */
int kn_load_bcast(const sim_op_args *a, int first, int n, const sim_tensor *y, int ints, double **d, int64_t **iv);

/* The kernel tables of the typed kernel files (NULL-name terminated). */
extern const sim_kernel_def kern_table_math[];
extern const sim_kernel_def kern_table_index[];
extern const sim_kernel_def kern_table_reduce[];
extern const sim_kernel_def kern_table_llm[];

#ifdef __cplusplus
}
#endif

#endif
