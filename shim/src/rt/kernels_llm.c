#include "rt/kernels_util.h"
const sim_kernel_def kern_table_llm[] = { { NULL, NULL, NULL, 0 } };
