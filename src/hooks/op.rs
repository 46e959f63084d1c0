//! aclop launches: every input and output data buffer is an access (inputs
//! read, outputs written). The `flops` int attribute, when a program sets
//! one, is remembered per attribute object (the interposer's state) so
//! launches can carry it.

use std::ffi::{c_void, CStr};
use std::os::raw::{c_char, c_int};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::args::*;
use super::{Cx, Real};
use crate::ffi::*;
use crate::real::RealFn;
use u3m_core::engine::{Api, Call, Launch, LaunchKind, Queue, Range};
use u3m_core::opclass::OpClass;

static GET_ADDR: RealFn = RealFn::new(b"aclGetDataBufferAddr\0");
static GET_SIZE: RealFn = RealFn::new(b"aclGetDataBufferSizeV2\0");
static DESC_FORMAT: RealFn = RealFn::new(b"aclGetTensorDescFormat\0");
static DESC_SIZE: RealFn = RealFn::new(b"aclGetTensorDescSize\0");

/// attr object -> flops, a small lock-free table (entries are reused when the
/// attribute object is destroyed).
const ATTR_SLOTS: usize = 1024;
static ATTR_KEY: [AtomicUsize; ATTR_SLOTS] = [const { AtomicUsize::new(0) }; ATTR_SLOTS];
static ATTR_FLOPS: [AtomicU64; ATTR_SLOTS] = [const { AtomicU64::new(0) }; ATTR_SLOTS];

fn attr_slot(attr: usize, insert: bool) -> Option<usize> {
    let start = (attr >> 4).wrapping_mul(0x9e37_79b9) % ATTR_SLOTS;
    for k in 0..ATTR_SLOTS {
        let i = (start + k) % ATTR_SLOTS;
        let cur = ATTR_KEY[i].load(Ordering::Acquire);
        if cur == attr {
            return Some(i);
        }
        if cur == 0 {
            if !insert {
                return None;
            }
            if ATTR_KEY[i]
                .compare_exchange(0, attr, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Some(i);
            }
        }
    }
    None
}

fn attr_flops(attr: *const c_void) -> Option<u64> {
    if attr.is_null() {
        return None;
    }
    attr_slot(attr as usize, false).map(|i| ATTR_FLOPS[i].load(Ordering::Acquire))
}

pub unsafe fn set_attr_int(_cx: &Cx, real: Real<aclopSetAttrInt>, a: aclopSetAttrInt) -> aclError {
    let r = real.call(a);
    if r == ACL_SUCCESS
        && !a.attr.is_null()
        && !a.name.is_null()
        && CStr::from_ptr(a.name).to_bytes() == b"flops"
        && a.value >= 0
    {
        if let Some(i) = attr_slot(a.attr as usize, true) {
            ATTR_FLOPS[i].store(a.value as u64, Ordering::Release);
        }
    }
    r
}

pub unsafe fn destroy_attr(_cx: &Cx, real: Real<aclopDestroyAttr>, a: aclopDestroyAttr) {
    if !a.attr.is_null() {
        if let Some(i) = attr_slot(a.attr as usize, false) {
            // tombstone-free removal is unnecessary: the key is simply cleared
            // (a later insert may reuse the slot; probing tolerates holes by
            // scanning the whole table when a key is absent)
            ATTR_FLOPS[i].store(0, Ordering::Release);
            ATTR_KEY[i].store(usize::MAX, Ordering::Release);
        }
    }
    real.call(a)
}

/// The real `aclGetDataBufferAddr` and `aclGetDataBufferSizeV2`, resolved
/// once per launch (None: the runtime lacks one; the launch then has no
/// ranges, as before).
type Getters = (GetAddr, GetSize);
type GetAddr = unsafe extern "C" fn(*const c_void) -> *mut c_void;
type GetSize = unsafe extern "C" fn(*const c_void) -> usize;

fn getters() -> Option<Getters> {
    let (ga, gs) = (GET_ADDR.get()?, GET_SIZE.get()?);
    // SAFETY: the real aclGetDataBufferAddr / aclGetDataBufferSizeV2, whose
    // prototypes these are
    unsafe {
        Some((
            std::mem::transmute::<*mut c_void, GetAddr>(ga),
            std::mem::transmute::<*mut c_void, GetSize>(gs),
        ))
    }
}

/// The real `aclGetTensorDescFormat` and `aclGetTensorDescSize` (None: the
/// runtime lacks one; no output is then known to be written whole).
type DescGetters = (
    unsafe extern "C" fn(*const c_void) -> c_int,
    unsafe extern "C" fn(*const c_void) -> usize,
);

fn desc_getters() -> Option<DescGetters> {
    let (f, s) = (DESC_FORMAT.get()?, DESC_SIZE.get()?);
    // SAFETY: the real aclGetTensorDescFormat / aclGetTensorDescSize, whose
    // prototypes these are (aclFormat is a C enum: an int)
    unsafe {
        Some((
            std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*const c_void) -> c_int>(f),
            std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*const c_void) -> usize>(s),
        ))
    }
}

/// ACL_FORMAT_ND: a plain row-major layout of the description's dims.
const FORMAT_ND: c_int = 2;

/// The bytes an output writes whole from its buffer's start, by its tensor
/// description `d`: a contiguous ND tensor of known size (no dynamic dim,
/// a dtype of known width) is written element by element, every byte of
/// it; anything else (another format, an unknown size, no description) is
/// 0: not known to be written whole.
///
/// # Safety
/// `d` is null or a tensor description the program passed to the launch.
unsafe fn desc_whole((format, size): DescGetters, d: *const c_void) -> u64 {
    if d.is_null() || format(d) != FORMAT_ND {
        return 0;
    }
    size(d) as u64
}

/// Outputs written whole (`fill`) that overlap an input (an in-place
/// operator, an output aliasing an input) are read first: not whole. Past
/// `ALIAS_CHECK_MAX` input × output pairs, no output is (conservative, and
/// no quadratic scan of a wide launch).
fn unwhole_aliases(ranges: &mut [Range], nin: usize) {
    let (ins, outs) = ranges.split_at_mut(nin);
    let check = ins.len() * outs.len() <= ALIAS_CHECK_MAX;
    for o in outs.iter_mut().filter(|o| o.whole) {
        o.whole = check
            && !ins
                .iter()
                .any(|i| i.addr < o.addr + o.len && o.addr < i.addr + i.len);
    }
}

const ALIAS_CHECK_MAX: usize = 4096;

/// How many data buffer pointers `list` holds (0 for a null list or n <= 0).
fn count(list: *const *const c_void, n: c_int) -> usize {
    if list.is_null() || n <= 0 {
        0
    } else {
        n as usize
    }
}

/// Writes the (addr, size) of each non-null data buffer of `list` (`n`
/// pointers) at `out`, in order; returns how many it wrote (at most `2n`).
/// Outputs (`descs`: their descriptions) known to be written whole
/// (`desc_whole`) are marked so over the description's bytes; the rest of
/// a larger buffer follows as a plain write.
///
/// # Safety
/// `list` points to `n` data buffer pointers (null or live), `descs.1` (when
/// not null) to `n` tensor descriptions (null or live); `out` has room for
/// `2n` ranges.
#[inline(always)]
unsafe fn fill(
    (ga, gs): Getters,
    list: *const *const c_void,
    n: usize,
    write: bool,
    descs: (Option<DescGetters>, *const *const c_void),
    out: *mut Range,
) -> usize {
    // the next entry to write (a cursor, not a count beside it: one value
    // fewer to keep across the getter calls)
    let mut o = out;
    for i in 0..n {
        // SAFETY: the program passed `n` data buffers at `list` (the
        // operator's prototype); the runtime reads the same array
        let b = *list.add(i);
        if b.is_null() {
            continue;
        }
        let (addr, len) = (ga(b) as u64, gs(b) as u64);
        let whole = match descs {
            (Some(dg), d) if write && !d.is_null() => desc_whole(dg, *d.add(i)).min(len),
            _ => 0,
        };
        if whole > 0 {
            o.write(Range {
                addr,
                len: whole,
                write,
                whole: true,
            });
            o = o.add(1);
        }
        if whole < len || len == 0 {
            o.write(Range {
                addr: addr + whole,
                len: len - whole,
                write,
                whole: false,
            });
            o = o.add(1);
        }
    }
    // SAFETY: `o` moved forward from `out` within the `2n` entries
    o.offset_from(out) as usize
}

/// Operators with at most this many data buffers decode them into an array
/// on the stack (left uninitialised: only what `fill` writes is read); wider
/// ones into the thread's range buffer (`ranges.rs`), however many.
const STACK_RANGES: usize = 16;

/// The operator type at `p` (a C string), its class and hash: this thread's
/// last aclop type (`guard::OpName`) when `p` names the same bytes, else
/// classified (`classify_bytes`) and kept. Inlined into the hook (only the
/// comparison: a new name goes to `op_name_new`).
///
/// # Safety
/// `p` is a non-null C string, live for `'a`.
#[inline(always)]
unsafe fn op_name<'a>(t: &crate::guard::Thread, p: *const c_char) -> (&'a [u8], OpClass, u64) {
    let last = &t.op_name;
    let len = last.len.get() as usize;
    if len != 0 && same_name(last.bytes.as_ptr() as *const u8, len, p as *const u8) {
        let name = std::slice::from_raw_parts(p as *const u8, len);
        return (name, last.class.get(), last.hash.get());
    }
    op_name_new(t, p)
}

/// Whether the C string at `p` is the kept name `kept` (`len` bytes, then
/// zeros to `OP_NAME_BYTES`): its first `len` bytes are those and the next
/// is its NUL. x86-64: compared 8 bytes at a time when every word read
/// lies in the page of `p`'s first byte (a load within a mapped page
/// cannot fault, whatever follows the string's NUL; the loads are `asm`,
/// outside the language's object bounds), else byte by byte, reading no
/// byte past a mismatch (a kept name has no NUL: every byte of `p` read
/// before a mismatch is not its terminator).
///
/// # Safety
/// `p` is a non-null C string; `kept` holds `OP_NAME_BYTES` bytes, `len` in
/// 1..=OP_NAME_MAX.
#[inline(always)]
unsafe fn same_name(kept: *const u8, len: usize, p: *const u8) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // the bytes compared: the name and its NUL, in whole words
        let n = len + 1;
        let words = n.div_ceil(8);
        if (p as usize & (PAGE - 1)) + words * 8 <= PAGE {
            let mut off = 0;
            while off + 8 < n {
                if load8(p.add(off)) != (kept.add(off) as *const u64).read_unaligned() {
                    return false;
                }
                off += 8;
            }
            // the last word: its first `n - off` bytes (1..=8)
            let mask = u64::MAX >> (8 * (8 - (n - off)));
            let w = load8(p.add(off)) ^ (kept.add(off) as *const u64).read_unaligned();
            return w & mask == 0;
        }
    }
    let mut i = 0;
    while i < len && *p.add(i) == *kept.add(i) {
        i += 1;
    }
    i == len && *p.add(len) == 0
}

/// The smallest page size on x86-64: a load that does not cross a
/// multiple of it stays in one mapped page.
#[cfg(target_arch = "x86_64")]
const PAGE: usize = 4096;

/// The 8 bytes at `p` (a little-endian word), read with one load.
///
/// # Safety
/// `[p, p + 8)` lies in a mapped, readable page.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn load8(p: *const u8) -> u64 {
    let v: u64;
    std::arch::asm!(
        "mov {v}, qword ptr [{p}]",
        p = in(reg) p,
        v = out(reg) v,
        options(nostack, readonly, preserves_flags, pure),
    );
    v
}

/// `op_name` for a name other than the kept one: classified and kept.
///
/// # Safety
/// As `op_name`.
#[cold]
#[inline(never)]
unsafe fn op_name_new<'a>(t: &crate::guard::Thread, p: *const c_char) -> (&'a [u8], OpClass, u64) {
    let last = &t.op_name;
    let name = CStr::from_ptr(p).to_bytes();
    let (class, hash) = u3m_core::opclass::classify_bytes(name);
    if (1..=crate::guard::OP_NAME_MAX).contains(&name.len()) {
        let mut bytes = [0; crate::guard::OP_NAME_BYTES];
        bytes[..name.len()].copy_from_slice(name);
        last.bytes.set(bytes);
        last.len.set(name.len() as u8);
        last.class.set(class);
        last.hash.set(hash);
    }
    (name, class, hash)
}

/// An aclop launch, decoded: the input and output data buffers are its
/// ranges (inputs read, outputs written), the `flops` attribute its work.
///
/// # Safety
/// The arguments of an aclop execute call the program made: `op_type` null
/// or a C string, `ins`/`outs` null or `nin`/`nout` data buffer pointers
/// (null or live).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn launch(
    cx: &Cx,
    op_type: *const c_char,
    nin: c_int,
    ins: *const *const c_void,
    nout: c_int,
    out_descs: *const *const c_void,
    outs: *const *const c_void,
    attr: *const c_void,
    stream: aclrtStream,
    real: impl FnMut() -> aclError,
) -> aclError {
    let (nin, nout) = (count(ins, nin), count(outs, nout));
    let get = if nin + nout > 0 { getters() } else { None };
    let Some(get) = get else {
        return run(cx, op_type, &[], attr, stream, real);
    };
    let descs = (
        // (two real getter calls per output: only once the residency says
        // whole writes matter, to a copy-in or to what the policy learns)
        if out_descs.is_null() || !cx.eng.whole_writes_matter() {
            None
        } else {
            desc_getters()
        },
        out_descs,
    );
    let none = (None, std::ptr::null());
    if nin + 2 * nout <= STACK_RANGES {
        let mut buf = [const { std::mem::MaybeUninit::<Range>::uninit() }; STACK_RANGES];
        let out = buf.as_mut_ptr() as *mut Range;
        let ki = fill(get, ins, nin, false, none, out);
        let k = ki + fill(get, outs, nout, true, descs, out.add(ki));
        // SAFETY: `fill` wrote the first `k` entries
        let ranges = std::slice::from_raw_parts_mut(out, k);
        // (without the description getters no output is marked whole)
        if descs.0.is_some() {
            unwhole_aliases(ranges, ki);
        }
        return run(cx, op_type, ranges, attr, stream, real);
    }
    // every buffer, however many (the per-thread buffer grows and is reused)
    super::ranges::with(cx, |ranges| {
        ranges.reserve(nin + 2 * nout);
        let out = ranges.spare_capacity_mut().as_mut_ptr() as *mut Range;
        let ki = fill(get, ins, nin, false, none, out);
        let k = ki + fill(get, outs, nout, true, descs, out.add(ki));
        // SAFETY: `fill` wrote the first `k` entries of the spare capacity
        ranges.set_len(k);
        if descs.0.is_some() {
            unwhole_aliases(ranges, ki);
        }
        run(cx, op_type, ranges, attr, stream, real)
    })
}

/// The engine call of a decoded aclop launch.
///
/// # Safety
/// `op_type` null or a C string.
#[inline(always)]
unsafe fn run(
    cx: &Cx,
    op_type: *const c_char,
    ranges: &[Range],
    attr: *const c_void,
    stream: aclrtStream,
    real: impl FnMut() -> aclError,
) -> aclError {
    // the name classified once: the class for the policy, the hash for the
    // heat table
    let (name, class, op_hash) = if op_type.is_null() {
        (None, OpClass::Other, None)
    } else {
        let (n, c, h) = op_name(cx.thread(), op_type);
        (Some(n), c, Some(h))
    };
    let call = Call::Launch(Launch {
        kind: LaunchKind::Aclop,
        name,
        class,
        op_hash,
        ranges,
        resident: None,
        flops: attr_flops(attr),
        q: Queue::on(stream as u64),
        api: Api::Acl,
    });
    cx.run(&call, real)
}

#[inline(always)]
pub unsafe fn execute(cx: &Cx, real: Real<aclopExecute>, a: aclopExecute) -> aclError {
    launch(
        cx,
        a.op_type,
        a.num_inputs,
        a.inputs,
        a.num_outputs,
        a.output_desc,
        a.outputs as *const *const c_void,
        a.attr,
        a.stream,
        || real.call(a),
    )
}

#[inline(always)]
pub unsafe fn execute_v2(cx: &Cx, real: Real<aclopExecuteV2>, a: aclopExecuteV2) -> aclError {
    launch(
        cx,
        a.op_type,
        a.num_inputs,
        a.inputs as *const *const c_void,
        a.num_outputs,
        a.output_desc as *const *const c_void,
        a.outputs as *const *const c_void,
        a.attr,
        a.stream,
        || real.call(a),
    )
}

#[inline(always)]
pub unsafe fn compile_and_execute(
    cx: &Cx,
    real: Real<aclopCompileAndExecute>,
    a: aclopCompileAndExecute,
) -> aclError {
    launch(
        cx,
        a.op_type,
        a.num_inputs,
        a.inputs,
        a.num_outputs,
        a.output_desc,
        a.outputs as *const *const c_void,
        a.attr,
        a.stream,
        || real.call(a),
    )
}

#[inline(always)]
pub unsafe fn compile_and_execute_v2(
    cx: &Cx,
    real: Real<aclopCompileAndExecuteV2>,
    a: aclopCompileAndExecuteV2,
) -> aclError {
    launch(
        cx,
        a.op_type,
        a.num_inputs,
        a.inputs as *const *const c_void,
        a.num_outputs,
        a.output_desc as *const *const c_void,
        a.outputs as *const *const c_void,
        a.attr,
        a.stream,
        || real.call(a),
    )
}

#[cfg(test)]
mod tests {
    use super::op_name;
    use std::os::raw::c_char;
    use u3m_core::opclass::classify_bytes;

    #[test]
    fn the_kept_op_name_serves_only_the_same_bytes() {
        let t = crate::guard::thread();
        let long = [b'A'; crate::guard::OP_NAME_MAX + 1];
        let mut long = long.to_vec();
        long.push(0);
        let names: &[&[u8]] = &[
            b"ConcatD\0",
            b"ConcatD\0",
            b"Concat\0",
            b"ConcatD\0",
            b"ConcatDV2\0",
            b"ConcatD\0",
            b"MatMul\0",
            b"aclnnInplaceAdd\0",
            b"Add\0",
            b"\0",
            b"Add\0",
            &long,
            b"Add\0",
            &long,
            &long,
        ];
        for n in names {
            // SAFETY: a NUL-terminated name, live for the call
            let (name, class, hash) = unsafe { op_name(t, n.as_ptr() as *const c_char) };
            assert_eq!(name, &n[..n.len() - 1]);
            assert_eq!((class, hash), classify_bytes(name), "{:?}", name);
        }
    }

    /// Names ending at the very end of a readable page followed by an
    /// unreadable one, at every offset near it and every length up to
    /// `OP_NAME_MAX + 1`, against kept names that are the same, a prefix,
    /// or an extension: the right answer each time, and no read past the
    /// readable page (a fault would end the test).
    #[test]
    fn a_name_at_a_page_end_is_compared_without_reading_the_next_page() {
        let t = crate::guard::thread();
        let page = 4096usize;
        // SAFETY: a fresh private mapping of two pages, the second made
        // unreadable; unmapped at the end
        let base = unsafe {
            let m = libc::mmap(
                std::ptr::null_mut(),
                2 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(m, libc::MAP_FAILED);
            assert_eq!(
                libc::mprotect((m as *mut u8).add(page) as *mut _, page, libc::PROT_NONE),
                0
            );
            m as *mut u8
        };
        let max = crate::guard::OP_NAME_MAX;
        for len in 1..=max + 1 {
            let name: Vec<u8> = (0..len).map(|k| b'A' + (k % 26) as u8).collect();
            for gap in 0..24 {
                // the name and its NUL end `gap` bytes before the second page
                let at = page - gap - len - 1;
                // SAFETY: `at + len + 1 <= page`: in the readable page
                let p = unsafe {
                    let q = base.add(at);
                    std::ptr::copy_nonoverlapping(name.as_ptr(), q, len);
                    *q.add(len) = 0;
                    q as *const c_char
                };
                let others: [&[u8]; 3] = [&name, &name[..len - 1], &[&name[..], b"Z"].concat()];
                for kept in others {
                    if !kept.is_empty() && kept.len() <= max {
                        let mut k = kept.to_vec();
                        k.push(0);
                        // SAFETY: a NUL-terminated name, live for the call
                        unsafe { op_name(t, k.as_ptr() as *const c_char) };
                    }
                    // SAFETY: a NUL-terminated name in the mapping
                    let (got, class, hash) = unsafe { op_name(t, p) };
                    assert_eq!(got, &name[..], "len {len} gap {gap}");
                    assert_eq!((class, hash), classify_bytes(&name), "len {len} gap {gap}");
                }
            }
        }
        // SAFETY: the mapping made above, no longer used
        unsafe { libc::munmap(base as *mut _, 2 * page) };
    }
}
