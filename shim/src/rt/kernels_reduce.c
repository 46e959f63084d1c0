#include "rt/kernels_util.h"
const sim_kernel_def kern_table_reduce[] = { { NULL, NULL, NULL, 0 } };
