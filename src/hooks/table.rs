//! Every hooked function, declared once. Prototypes are the real CANN 8.x ones
//! (torch_npu 2.14.0's headers); the second field is returned when the
//! underlying runtime lacks the function.

use std::ffi::c_void;
use std::os::raw::{c_char, c_int};

use crate::ffi::*;

use super::{aclnn, alloc, copy, graph, hccl, hostwait, kernel, op, vmm};

const NS: aclError = ACL_ERROR_RT_FEATURE_NOT_SUPPORT;
const HNS: HcclResult = HCCL_E_NOT_SUPPORT;
const ACLNN_NS: aclnnStatus = ACLNN_ERR_INNER;

super::hooks! {
    // --- lifecycle and the current device (observed, never changed) ---
    fn aclInit(config_path: *const c_char) -> aclError, NS => alloc::acl_init;
    fn aclFinalize() -> aclError, NS => alloc::acl_finalize;
    fn aclrtSetDevice(device_id: i32) -> aclError, NS => alloc::set_device;
    fn aclrtSetCurrentContext(context: *mut c_void) -> aclError, NS => alloc::set_context;
    fn aclrtCreateContext(context: *mut *mut c_void, device_id: i32) -> aclError, NS => alloc::create_context;
    fn aclrtDestroyContext(context: *mut c_void) -> aclError, NS => alloc::destroy_context;

    // --- allocation ---
    fn aclrtMalloc(dev_ptr: *mut *mut c_void, size: usize, policy: c_int) -> aclError, NS => alloc::malloc;
    fn aclrtMallocAlign32(dev_ptr: *mut *mut c_void, size: usize, policy: c_int) -> aclError, NS => alloc::malloc_align32;
    fn aclrtMallocCached(dev_ptr: *mut *mut c_void, size: usize, policy: c_int) -> aclError, NS => alloc::malloc_cached;
    fn aclrtMallocWithCfg(dev_ptr: *mut *mut c_void, size: usize, policy: c_int, cfg: *mut c_void) -> aclError, NS => alloc::malloc_with_cfg;
    fn aclrtFree(dev_ptr: *mut c_void) -> aclError, NS => alloc::free;
    fn aclrtMallocHost(host_ptr: *mut *mut c_void, size: usize) -> aclError, NS => alloc::malloc_host;
    fn aclrtMallocHostWithCfg(ptr: *mut *mut c_void, size: u64, cfg: *mut c_void) -> aclError, NS => alloc::malloc_host_with_cfg;
    fn aclrtFreeHost(host_ptr: *mut c_void) -> aclError, NS => alloc::free_host;
    fn aclrtHostRegister(ptr: *mut c_void, size: u64, type_: c_int, dev_ptr: *mut *mut c_void) -> aclError, NS => alloc::host_register;
    fn aclrtHostRegisterV2(ptr: *mut c_void, size: u64, flag: u32) -> aclError, NS => alloc::host_register_v2;
    fn aclrtHostUnregister(ptr: *mut c_void) -> aclError, NS => alloc::host_unregister;
    fn aclrtGetMemInfo(attr: c_int, free: *mut usize, total: *mut usize) -> aclError, NS => alloc::get_mem_info;
    fn aclrtResetDevice(device_id: i32) -> aclError, NS => alloc::reset_device;
    fn aclrtResetDeviceForce(device_id: i32) -> aclError, NS => alloc::reset_device_force;
    fn aclrtIpcMemGetExportKey(dev_ptr: *mut c_void, size: usize, key: *mut c_char, len: usize, flags: u64) -> aclError, NS => vmm::ipc_export_key;
    fn aclrtIpcMemImportByKey(dev_ptr: *mut *mut c_void, key: *const c_char, flags: u64) -> aclError, NS => vmm::ipc_import_key;
    fn aclrtIpcMemClose(key: *const c_char) -> aclError, NS => vmm::ipc_close;

    // --- virtual memory ---
    fn aclrtReserveMemAddress(vir_ptr: *mut *mut c_void, size: usize, alignment: usize, expect_ptr: *mut c_void, flags: u64) -> aclError, NS => vmm::reserve;
    fn aclrtReleaseMemAddress(vir_ptr: *mut c_void) -> aclError, NS => vmm::release;
    fn aclrtMallocPhysical(handle: *mut aclrtDrvMemHandle, size: usize, prop: *const aclrtPhysicalMemProp, flags: u64) -> aclError, NS => vmm::malloc_physical;
    fn aclrtFreePhysical(handle: aclrtDrvMemHandle) -> aclError, NS => vmm::free_physical;
    fn aclrtMapMem(vir_ptr: *mut c_void, size: usize, offset: usize, handle: aclrtDrvMemHandle, flags: u64) -> aclError, NS => vmm::map;
    fn aclrtUnmapMem(vir_ptr: *mut c_void) -> aclError, NS => vmm::unmap;
    fn aclrtMemExportToShareableHandle(handle: aclrtDrvMemHandle, handle_type: c_int, flags: u64, shareable: *mut u64) -> aclError, NS => vmm::export_shareable;
    fn aclrtMemImportFromShareableHandle(shareable: u64, device_id: i32, handle: *mut aclrtDrvMemHandle) -> aclError, NS => vmm::import_shareable;
    fn aclrtMemSetPidToShareableHandle(shareable: u64, pid: *mut i32, pid_num: usize) -> aclError, NS => vmm::set_pid_shareable;

    // --- copies ---
    fn aclrtMemcpy(dst: *mut c_void, dest_max: usize, src: *const c_void, count: usize, kind: c_int) -> aclError, NS => copy::memcpy;
    fn aclrtMemcpyAsync(dst: *mut c_void, dest_max: usize, src: *const c_void, count: usize, kind: c_int, stream: aclrtStream) -> aclError, NS => copy::memcpy_async;
    fn aclrtMemcpyAsyncWithCondition(dst: *mut c_void, dest_max: usize, src: *const c_void, count: usize, kind: c_int, stream: aclrtStream) -> aclError, NS => copy::memcpy_async_cond;
    fn aclrtMemcpy2d(dst: *mut c_void, dpitch: usize, src: *const c_void, spitch: usize, width: usize, height: usize, kind: c_int) -> aclError, NS => copy::memcpy_2d;
    fn aclrtMemcpy2dAsync(dst: *mut c_void, dpitch: usize, src: *const c_void, spitch: usize, width: usize, height: usize, kind: c_int, stream: aclrtStream) -> aclError, NS => copy::memcpy_2d_async;
    fn aclrtMemcpyBatch(dsts: *mut *mut c_void, dest_maxs: *mut usize, srcs: *mut *mut c_void, sizes: *mut usize, num_batches: usize, attrs: *mut aclrtMemcpyBatchAttr, attrs_indexes: *mut usize, num_attrs: usize, fail_index: *mut usize) -> aclError, NS => copy::memcpy_batch;
    fn aclrtMemcpyBatchAsync(dsts: *mut *mut c_void, dest_maxs: *mut usize, srcs: *mut *mut c_void, sizes: *mut usize, num_batches: usize, attrs: *mut aclrtMemcpyBatchAttr, attrs_indexes: *mut usize, num_attrs: usize, fail_index: *mut usize, stream: aclrtStream) -> aclError, NS => copy::memcpy_batch_async;

    // --- sets ---
    fn aclrtMemset(dev_ptr: *mut c_void, max_count: usize, value: i32, count: usize) -> aclError, NS => copy::memset;
    fn aclrtMemsetAsync(dev_ptr: *mut c_void, max_count: usize, value: i32, count: usize, stream: aclrtStream) -> aclError, NS => copy::memset_async;
    fn aclrtMemsetD32(ptr: *mut c_void, mem_size: usize, value: u32, n: usize) -> aclError, NS => copy::memset_d32;
    fn aclrtMemsetD32Async(ptr: *mut c_void, mem_size: usize, value: u32, n: usize, stream: aclrtStream) -> aclError, NS => copy::memset_d32_async;
    fn aclrtCmoAsync(src: *mut c_void, size: usize, cmo_type: c_int, stream: aclrtStream) -> aclError, NS => copy::cmo_async;
    fn aclrtValueWrite(dev_addr: *mut c_void, value: u64, flag: u32, stream: aclrtStream) -> aclError, NS => copy::value_write;
    fn aclrtValueWait(dev_addr: *mut c_void, value: u64, flag: u32, stream: aclrtStream) -> aclError, NS => copy::value_wait;

    // --- work that waits for the host (hostwait.rs) ---
    fn aclrtLaunchHostFunc(stream: aclrtStream, func: *mut c_void, args: *mut c_void) -> aclError, NS => hostwait::launch_host_func;
    fn aclrtLaunchCallback(func: *mut c_void, user_data: *mut c_void, block_type: c_int, stream: aclrtStream) -> aclError, NS => hostwait::launch_callback;
    fn aclrtWaitAndResetNotify(notify: *mut c_void, stream: aclrtStream, timeout: u32) -> aclError, NS => hostwait::wait_notify;
    fn aclrtCntNotifyWaitWithTimeout(cnt_notify: *mut c_void, stream: aclrtStream, info: *mut c_void) -> aclError, NS => hostwait::wait_cnt_notify;

    // --- operator launches (aclop) ---
    fn aclopExecute(op_type: *const c_char, num_inputs: c_int, input_desc: *const *const c_void, inputs: *const *const c_void, num_outputs: c_int, output_desc: *const *const c_void, outputs: *const *mut c_void, attr: *const c_void, stream: aclrtStream) -> aclError, NS => op::execute;
    fn aclopExecuteV2(op_type: *const c_char, num_inputs: c_int, input_desc: *mut *mut c_void, inputs: *mut *mut c_void, num_outputs: c_int, output_desc: *mut *mut c_void, outputs: *mut *mut c_void, attr: *mut c_void, stream: aclrtStream) -> aclError, NS => op::execute_v2;
    fn aclopCompileAndExecute(op_type: *const c_char, num_inputs: c_int, input_desc: *const *const c_void, inputs: *const *const c_void, num_outputs: c_int, output_desc: *const *const c_void, outputs: *const *mut c_void, attr: *const c_void, engine_type: c_int, compile_flag: c_int, op_path: *const c_char, stream: aclrtStream) -> aclError, NS => op::compile_and_execute;
    fn aclopCompileAndExecuteV2(op_type: *const c_char, num_inputs: c_int, input_desc: *mut *mut c_void, inputs: *mut *mut c_void, num_outputs: c_int, output_desc: *mut *mut c_void, outputs: *mut *mut c_void, attr: *mut c_void, engine_type: c_int, compile_flag: c_int, op_path: *const c_char, stream: aclrtStream) -> aclError, NS => op::compile_and_execute_v2;
    fn aclopSetAttrInt(attr: *mut c_void, name: *const c_char, value: i64) -> aclError, NS => op::set_attr_int;
    fn aclopDestroyAttr(attr: *const c_void) -> (), () => op::destroy_attr;

    // --- aclnn objects (the execute phase of every operator is generic: aclnn.rs) ---
    fn aclCreateTensor(view_dims: *const i64, view_dims_num: u64, data_type: c_int, stride: *const i64, offset: i64, format: c_int, storage_dims: *const i64, storage_dims_num: u64, tensor_data: *mut c_void) -> *mut c_void, std::ptr::null_mut() => aclnn::create_tensor;
    fn aclDestroyTensor(tensor: *const c_void) -> aclnnStatus, NS => aclnn::destroy_tensor;
    fn aclCreateTensorList(value: *const *const c_void, size: u64) -> *mut c_void, std::ptr::null_mut() => aclnn::create_tensor_list;
    fn aclDestroyTensorList(list: *const c_void) -> aclnnStatus, NS => aclnn::destroy_tensor_list;
    fn aclSetAclOpExecutorRepeatable(executor: *mut c_void) -> aclnnStatus, ACLNN_NS => aclnn::set_executor_repeatable;
    fn aclDestroyAclOpExecutor(executor: *mut c_void) -> aclnnStatus, ACLNN_NS => aclnn::destroy_executor;
    // execute phases exported for programs linking libopapi directly (see aclnn::direct)
    fn aclnnAdd(workspace: *mut c_void, workspace_size: u64, executor: *mut c_void, stream: aclrtStream) -> aclnnStatus, ACLNN_NS => aclnn::direct::aclnnAdd;
    fn aclnnMul(workspace: *mut c_void, workspace_size: u64, executor: *mut c_void, stream: aclrtStream) -> aclnnStatus, ACLNN_NS => aclnn::direct::aclnnMul;
    fn aclnnMatmul(workspace: *mut c_void, workspace_size: u64, executor: *mut c_void, stream: aclrtStream) -> aclnnStatus, ACLNN_NS => aclnn::direct::aclnnMatmul;
    fn aclnnSoftmax(workspace: *mut c_void, workspace_size: u64, executor: *mut c_void, stream: aclrtStream) -> aclnnStatus, ACLNN_NS => aclnn::direct::aclnnSoftmax;
    fn aclnnAddGetWorkspaceSize(self_: *const c_void, other: *const c_void, alpha: *const c_void, out: *mut c_void, workspace_size: *mut u64, executor: *mut *mut c_void) -> aclnnStatus, ACLNN_NS => aclnn::direct::aclnnAddGetWorkspaceSize;
    fn aclnnMulGetWorkspaceSize(self_: *const c_void, other: *const c_void, out: *mut c_void, workspace_size: *mut u64, executor: *mut *mut c_void) -> aclnnStatus, ACLNN_NS => aclnn::direct::aclnnMulGetWorkspaceSize;
    fn aclnnMatmulGetWorkspaceSize(self_: *const c_void, mat2: *const c_void, out: *mut c_void, cube_math_type: i8, workspace_size: *mut u64, executor: *mut *mut c_void) -> aclnnStatus, ACLNN_NS => aclnn::direct::aclnnMatmulGetWorkspaceSize;
    fn aclnnSoftmaxGetWorkspaceSize(self_: *const c_void, dim: i64, out: *mut c_void, workspace_size: *mut u64, executor: *mut *mut c_void) -> aclnnStatus, ACLNN_NS => aclnn::direct::aclnnSoftmaxGetWorkspaceSize;

    // --- graph capture and replay ---
    fn aclmdlRICaptureBegin(stream: aclrtStream, mode: c_int) -> aclError, NS => graph::capture_begin;
    fn aclmdlRICaptureEnd(stream: aclrtStream, model_ri: *mut *mut c_void) -> aclError, NS => graph::capture_end;
    fn aclmdlRICaptureToModelRIBegin(stream: aclrtStream, model_ri: *mut c_void, mode: c_int) -> aclError, NS => graph::capture_to_model_begin;
    fn aclmdlRICaptureGetInfo(stream: aclrtStream, status: *mut c_int, model_ri: *mut *mut c_void) -> aclError, NS => graph::capture_get_info;
    fn aclmdlRICaptureThreadExchangeMode(mode: *mut c_int) -> aclError, NS => graph::capture_exchange_mode;
    fn aclmdlRICaptureTaskGrpBegin(stream: aclrtStream) -> aclError, NS => graph::task_grp_begin;
    fn aclmdlRICaptureTaskGrpEnd(stream: aclrtStream, handle: *mut *mut c_void) -> aclError, NS => graph::task_grp_end;
    fn aclmdlRICaptureTaskUpdateBegin(stream: aclrtStream, handle: *mut c_void) -> aclError, NS => graph::task_update_begin;
    fn aclmdlRICaptureTaskUpdateEnd(stream: aclrtStream) -> aclError, NS => graph::task_update_end;
    fn aclmdlRIExecuteAsync(model_ri: *mut c_void, stream: aclrtStream) -> aclError, NS => graph::ri_execute_async;
    fn aclmdlRIExecute(model_ri: *mut c_void, timeout: i32) -> aclError, NS => graph::ri_execute;
    fn aclmdlRIDestroy(model_ri: *mut c_void) -> aclError, NS => graph::ri_destroy;
    fn aclmdlExecute(model_id: u32, input: *const c_void, output: *mut c_void) -> aclError, NS => graph::mdl_execute;
    fn aclmdlExecuteAsync(model_id: u32, input: *const c_void, output: *mut c_void, stream: aclrtStream) -> aclError, NS => graph::mdl_execute_async;

    // --- HCCL collectives and memory registration ---
    fn HcclAllReduce(send_buf: *mut c_void, recv_buf: *mut c_void, count: u64, data_type: c_int, op: c_int, comm: HcclComm, stream: aclrtStream) -> HcclResult, HNS => hccl::all_reduce;
    fn HcclBroadcast(buf: *mut c_void, count: u64, data_type: c_int, root: u32, comm: HcclComm, stream: aclrtStream) -> HcclResult, HNS => hccl::broadcast;
    fn HcclAllGather(send_buf: *mut c_void, recv_buf: *mut c_void, send_count: u64, data_type: c_int, comm: HcclComm, stream: aclrtStream) -> HcclResult, HNS => hccl::all_gather;
    fn HcclReduceScatter(send_buf: *mut c_void, recv_buf: *mut c_void, recv_count: u64, data_type: c_int, op: c_int, comm: HcclComm, stream: aclrtStream) -> HcclResult, HNS => hccl::reduce_scatter;
    fn HcclReduce(send_buf: *mut c_void, recv_buf: *mut c_void, count: u64, data_type: c_int, op: c_int, root: u32, comm: HcclComm, stream: aclrtStream) -> HcclResult, HNS => hccl::reduce;
    fn HcclScatter(send_buf: *mut c_void, recv_buf: *mut c_void, recv_count: u64, data_type: c_int, root: u32, comm: HcclComm, stream: aclrtStream) -> HcclResult, HNS => hccl::scatter;
    fn HcclSend(send_buf: *mut c_void, count: u64, data_type: c_int, dest_rank: u32, comm: HcclComm, stream: aclrtStream) -> HcclResult, HNS => hccl::send;
    fn HcclRecv(recv_buf: *mut c_void, count: u64, data_type: c_int, src_rank: u32, comm: HcclComm, stream: aclrtStream) -> HcclResult, HNS => hccl::recv;
    fn HcclAlltoAll(send_buf: *const c_void, send_count: u64, send_type: c_int, recv_buf: *const c_void, recv_count: u64, recv_type: c_int, comm: HcclComm, stream: aclrtStream) -> HcclResult, HNS => hccl::all_to_all;
    fn HcclAlltoAllV(send_buf: *const c_void, send_counts: *const c_void, sdispls: *const c_void, send_type: c_int, recv_buf: *const c_void, recv_counts: *const c_void, rdispls: *const c_void, recv_type: c_int, comm: HcclComm, stream: aclrtStream) -> HcclResult, HNS => hccl::all_to_all_v;
    fn HcclAllGatherV(send_buf: *mut c_void, send_count: u64, recv_buf: *mut c_void, recv_counts: *const c_void, recv_displs: *const c_void, data_type: c_int, comm: HcclComm, stream: aclrtStream) -> HcclResult, HNS => hccl::all_gather_v;
    fn HcclReduceScatterV(send_buf: *mut c_void, send_counts: *const c_void, send_displs: *const c_void, recv_buf: *mut c_void, recv_count: u64, data_type: c_int, op: c_int, comm: HcclComm, stream: aclrtStream) -> HcclResult, HNS => hccl::reduce_scatter_v;
    fn HcclBatchSendRecv(items: *mut HcclSendRecvItem, item_num: u32, comm: HcclComm, stream: aclrtStream) -> HcclResult, HNS => hccl::batch_send_recv;
    fn HcclCommRegister(comm: HcclComm, addr: *mut c_void, size: u64, handle: *mut *mut c_void, flag: u32) -> HcclResult, HNS => hccl::comm_register;
    fn HcclCommDeregister(comm: HcclComm, handle: *mut c_void) -> HcclResult, HNS => hccl::comm_deregister;
    fn HcclCommSetMemoryRange(comm: HcclComm, base_vir_ptr: *mut c_void, size: usize, alignment: usize, flags: u64) -> HcclResult, HNS => hccl::set_memory_range;
    fn HcclCommUnsetMemoryRange(comm: HcclComm, base_vir_ptr: *mut c_void) -> HcclResult, HNS => hccl::unset_memory_range;
    fn HcclCommActivateCommMemory(comm: HcclComm, vir_ptr: *mut c_void, size: usize, offset: usize, handle: aclrtDrvMemHandle, flags: u64) -> HcclResult, HNS => hccl::activate_comm_memory;
    fn HcclCommDeactivateCommMemory(comm: HcclComm, vir_ptr: *mut c_void) -> HcclResult, HNS => hccl::deactivate_comm_memory;

    // --- kernel launches whose device pointers hide in an argument blob ---
    fn aclrtLaunchKernel(func: *mut c_void, num_blocks: u32, args: *const c_void, args_size: usize, stream: aclrtStream) -> aclError, NS => kernel::launch;
    fn aclrtLaunchKernelV2(func: *mut c_void, num_blocks: u32, args: *const c_void, args_size: usize, cfg: *mut c_void, stream: aclrtStream) -> aclError, NS => kernel::launch_v2;
    fn aclrtLaunchKernelWithConfig(func: *mut c_void, num_blocks: u32, stream: aclrtStream, cfg: *mut c_void, args_handle: *mut c_void, reserve: *mut c_void) -> aclError, NS => kernel::launch_with_config;
    fn aclrtLaunchKernelWithHostArgs(func: *mut c_void, num_blocks: u32, stream: aclrtStream, cfg: *mut c_void, host_args: *mut c_void, args_size: usize, place_holders: *mut c_void, place_holder_num: usize) -> aclError, NS => kernel::launch_with_host_args;
    fn rtKernelLaunch(stub_func: *const c_void, block_dim: u32, args: *mut c_void, args_size: u32, sm_desc: *mut c_void, stream: aclrtStream) -> rtError_t, RT_ERROR_FEATURE_NOT_SUPPORT => kernel::rt_kernel_launch;
}
