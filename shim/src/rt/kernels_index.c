#include "rt/kernels_util.h"
const sim_kernel_def kern_table_index[] = { { NULL, NULL, NULL, 0 } };
