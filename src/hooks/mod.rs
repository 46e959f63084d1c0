//! The hook table. Each hook is declared once (in `table.rs`); the `hooks!`
//! macro generates from that one line the exported wrapper, the typed pointer
//! to the real function, the dlsym redirection entry and the name list that
//! tests check against `nm -D`. Wrappers are thin: resolve the real function,
//! take the reentrancy guard, hand the decoded call to a family handler
//! (alloc.rs, vmm.rs, copy.rs, ...), which tells the engine what was touched
//! and forwards to the real function.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::guard::Guard;
use crate::real::RealFn;
use u3m_core::engine::Engine;
use u3m_core::opclass::OpClass;

pub mod aclnn;
mod alloc;
mod copy;
mod graph;
mod hccl;
mod kernel;
mod op;
pub mod table;
mod vmm;

pub use table::{HookId, TABLE};

/// One entry of the hook table.
pub struct HookEntry {
    pub name: &'static str,
    pub wrapper: *const c_void,
    pub real: &'static RealFn,
}

// The table is immutable and holds only function addresses.
unsafe impl Sync for HookEntry {}

/// A hook call in progress inside u3m: the engine and the reentrancy guard.
pub struct Cx {
    pub eng: &'static Engine,
    _guard: Guard,
}

impl Cx {
    /// Runs engine work; a panic disables u3m (pass-through from then on)
    /// instead of unwinding into C.
    #[inline]
    pub fn note<R: Default>(&self, f: impl FnOnce(&Engine) -> R) -> R {
        match catch_unwind(AssertUnwindSafe(|| f(self.eng))) {
            Ok(r) => r,
            Err(_) => {
                crate::init::disable("internal error (panic) in the engine");
                R::default()
            }
        }
    }
}

/// A return value for a call u3m refuses (only aclInit, after a
/// configuration error in tier mode).
pub trait FromAclError {
    fn from_acl_error(code: i32) -> Self;
}

impl FromAclError for i32 {
    fn from_acl_error(code: i32) -> i32 {
        code
    }
}

impl FromAclError for () {
    fn from_acl_error(_: i32) {}
}

impl FromAclError for *mut c_void {
    fn from_acl_error(_: i32) -> *mut c_void {
        std::ptr::null_mut()
    }
}

/// Some(error) when u3m refuses this call instead of forwarding it: aclInit
/// after an invalid U3M_* value in tier mode, so the process does not run
/// untiered (init.rs). Checked only when u3m is not active.
#[inline]
pub fn refused<R: FromAclError>(id: HookId) -> Option<R> {
    (id == HookId::aclInit && crate::init::start_refused())
        .then(|| R::from_acl_error(crate::ffi::ACL_ERROR_INVALID_PARAM))
}

/// Entry of every wrapper: Some when u3m is active and this thread is not
/// already inside u3m.
#[inline]
pub fn enter(id: HookId) -> Option<Cx> {
    let eng = crate::init::engine()?;
    let guard = Guard::enter()?;
    eng.count_call(id as u16);
    Some(Cx { eng, _guard: guard })
}

/// Runs `call` (an operation of `class`) inside tier mode's residency protocol: every managed chunk
/// `ranges` touch is resident (and pinned) before it, its use is recorded
/// after. Outside tier mode this is just `call()`.
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn around<R>(
    cx: &Cx,
    class: OpClass,
    dev: i32,
    stream: u64,
    ranges: &[u3m_core::engine::Range],
    overwrite: bool,
    sync: bool,
    call: impl FnOnce() -> R,
    ok: impl Fn(&R) -> bool,
    fail: impl Fn(i32) -> R,
) -> R {
    use u3m_core::engine::Prep;
    let p = cx.note(|e| e.tier_prepare(dev, class as u8, stream, ranges, overwrite, sync));
    if let Prep::Fail(code) = p {
        return fail(code);
    }
    let passive = matches!(p, Prep::Pass);
    let r = call();
    if !passive {
        let success = ok(&r);
        cx.note(move |e| e.tier_finish(p, stream, sync, success));
    }
    r
}

/// Like `enter`, for entry points outside the table (aclnn trampolines).
#[inline]
pub fn enter_uncounted() -> Option<Cx> {
    let eng = crate::init::engine()?;
    let guard = Guard::enter()?;
    Some(Cx { eng, _guard: guard })
}

/// The hook entry for an exact exported name.
pub fn find(name: &[u8]) -> Option<&'static HookEntry> {
    // TABLE is sorted by name at compile time order-independent: binary search
    // over a sorted index built once.
    let idx = sorted_index();
    idx.binary_search_by(|&i| TABLE[i as usize].name.as_bytes().cmp(name))
        .ok()
        .map(|k| &TABLE[idx[k] as usize])
}

fn sorted_index() -> &'static [u16] {
    use std::sync::OnceLock;
    static IDX: OnceLock<Vec<u16>> = OnceLock::new();
    IDX.get_or_init(|| {
        let mut v: Vec<u16> = (0..TABLE.len() as u16).collect();
        v.sort_by(|&a, &b| TABLE[a as usize].name.cmp(TABLE[b as usize].name));
        v
    })
}

/// Hook names, for the stats segment's label table and the `nm -D` test.
pub fn names() -> impl Iterator<Item = &'static str> {
    TABLE.iter().map(|h| h.name)
}

/// Declares the hooks: `fn NAME(ARGS) -> RET, NOT_SUPPORTED => HANDLER;`
/// where NOT_SUPPORTED is returned when no library defines NAME.
macro_rules! hooks {
    ( $( fn $name:ident ( $( $arg:ident : $ty:ty ),* $(,)? ) -> $ret:ty , $nosup:expr => $handler:path ; )* ) => {
        #[allow(non_camel_case_types, dead_code)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(u16)]
        pub enum HookId { $( $name ),* }

        #[allow(non_upper_case_globals)]
        pub mod real {
            use crate::real::RealFn;
            $( pub static $name: RealFn = RealFn::new(concat!(stringify!($name), "\0").as_bytes()); )*
        }

        $(
            #[allow(non_snake_case, clippy::missing_safety_doc)]
            #[cfg_attr(not(test), unsafe(no_mangle))]
            pub unsafe extern "C" fn $name( $( $arg : $ty ),* ) -> $ret {
                type F = unsafe extern "C" fn( $( $ty ),* ) -> $ret;
                let Some(p) = real::$name.get() else { return $nosup; };
                let f: F = unsafe { std::mem::transmute::<*mut std::ffi::c_void, F>(p) };
                match crate::hooks::enter(HookId::$name) {
                    Some(cx) => unsafe { $handler(&cx, f, $( $arg ),*) },
                    None => {
                        if let Some(r) = crate::hooks::refused::<$ret>(HookId::$name) {
                            return r;
                        }
                        unsafe { f( $( $arg ),* ) }
                    }
                }
            }
        )*

        pub static TABLE: &[crate::hooks::HookEntry] = &[
            $( crate::hooks::HookEntry {
                name: stringify!($name),
                wrapper: $name as *const std::ffi::c_void,
                real: &real::$name,
            } ),*
        ];
    };
}
pub(crate) use hooks;
