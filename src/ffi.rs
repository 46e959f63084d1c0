//! The C types and constants of the CANN surface u3m hooks (values from the
//! real headers; see docs/acl-surface.md §2).
#![allow(non_camel_case_types, dead_code)]

use std::os::raw::{c_int, c_void};

pub type aclError = c_int;
pub type aclnnStatus = i32;
pub type HcclResult = c_int;
pub type rtError_t = i32;
pub type aclrtStream = *mut c_void;
pub type aclrtEvent = *mut c_void;
pub type aclrtDrvMemHandle = *mut c_void;
pub type HcclComm = *mut c_void;
pub type size_t = usize;

pub const ACL_SUCCESS: aclError = 0;
pub const ACL_ERROR_INVALID_PARAM: aclError = 100000;
/// What u3m returns for a hooked function the underlying runtime lacks.
pub const ACL_ERROR_RT_FEATURE_NOT_SUPPORT: aclError = 207000;
pub const ACL_ERROR_RT_MEMORY_ALLOCATION: aclError = 207001;
pub const HCCL_E_NOT_SUPPORT: HcclResult = 5;
/// rtError_t has no public "not supported" value; CANN's runtime uses the
/// ACL feature-not-support code.
pub const RT_ERROR_FEATURE_NOT_SUPPORT: rtError_t = 207000;
pub const ACLNN_ERR_INNER_NULLPTR: aclnnStatus = 561103;
/// aclnn's generic internal error: returned for an operator the library lacks.
pub const ACLNN_ERR_INNER: aclnnStatus = 561000;

/// aclrtMemcpyKind
pub const MEMCPY_H2H: c_int = 0;
pub const MEMCPY_H2D: c_int = 1;
pub const MEMCPY_D2H: c_int = 2;
pub const MEMCPY_D2D: c_int = 3;
pub const MEMCPY_DEFAULT: c_int = 4;
pub const MEMCPY_HOST_TO_BUF_TO_DEVICE: c_int = 5;
pub const MEMCPY_INNER_D2D: c_int = 6;
pub const MEMCPY_INTER_D2D: c_int = 7;

/// aclrtMemLocationType
pub const MEM_LOCATION_HOST: u32 = 0;
pub const MEM_LOCATION_DEVICE: u32 = 1;
pub const MEM_LOCATION_HOST_NUMA: u32 = 4;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct aclrtMemLocation {
    pub id: u32,
    pub type_: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct aclrtMemcpyBatchAttr {
    pub dst_loc: aclrtMemLocation,
    pub src_loc: aclrtMemLocation,
    pub rsv: [u8; 16],
}

#[repr(C)]
pub struct aclrtPhysicalMemProp {
    pub handle_type: c_int,
    pub allocation_type: c_int,
    pub mem_attr: c_int,
    pub location: aclrtMemLocation,
    pub reserve: u64,
}

/// HcclSendRecvType (hccl_types.h): HCCL_SEND = 0, HCCL_RECV = 1.
pub const HCCL_RECV: c_int = 1;

#[repr(C)]
pub struct HcclSendRecvItem {
    pub send_recv_type: c_int,
    pub buf: *mut c_void,
    pub count: u64,
    pub data_type: c_int,
    pub remote_rank: u32,
}

const _: () = assert!(std::mem::size_of::<aclrtMemcpyBatchAttr>() == 32);
const _: () = assert!(std::mem::size_of::<aclrtPhysicalMemProp>() == 32);
const _: () = assert!(std::mem::size_of::<HcclSendRecvItem>() == 32);

/// Bytes per element of an aclDataType (aclDataTypeSize), 0 if unknown or
/// sub-byte (those are sized by the caller from the byte footprint).
pub fn acl_dtype_size(dt: c_int) -> u64 {
    match dt {
        0 => 4,       // FLOAT
        1 => 2,       // FLOAT16
        2 => 1,       // INT8
        3 => 4,       // INT32
        4 => 1,       // UINT8
        6 => 2,       // INT16
        7 => 2,       // UINT16
        8 => 4,       // UINT32
        9 => 8,       // INT64
        10 => 8,      // UINT64
        11 => 8,      // DOUBLE
        12 => 1,      // BOOL
        16 => 8,      // COMPLEX64
        17 => 16,     // COMPLEX128
        27 => 2,      // BF16
        33 => 4,      // COMPLEX32
        34..=37 => 1, // HIFLOAT8, FLOAT8_*
        _ => 0,
    }
}

/// Bytes per element of an HcclDataType.
pub fn hccl_dtype_size(dt: c_int) -> u64 {
    match dt {
        0 | 7 | 14 | 15 | 16 | 17 => 1,
        1 | 3 | 8 | 11 => 2,
        2 | 4 | 9 => 4,
        5 | 6 | 10 => 8,
        12 => 16,
        _ => 0,
    }
}
