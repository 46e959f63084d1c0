//! Start-up, the state machine and process events (fork, exit).
//! States: UNINIT -> INITIALIZING -> READY | DISABLED, advanced by
//! compare-and-swap from the constructor or from whichever hook comes first.
//! The hot path asks only "is there an engine?" — one atomic load.

use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, Ordering};

use u3m_core::config::{Config, LogLevel, Mode};
use u3m_core::engine::Engine;

const UNINIT: u8 = 0;
const INITIALIZING: u8 = 1;
const READY: u8 = 2;
const DISABLED: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(UNINIT);
static ENGINE: AtomicPtr<Engine> = AtomicPtr::new(ptr::null_mut());
static LOG: AtomicU8 = AtomicU8::new(LogLevel::Warn as u8);
/// Set in a forked child: its trace goes to <U3M_TRACE>.<pid>, never over
/// the parent's file.
static FORKED: AtomicBool = AtomicBool::new(false);
/// An invalid U3M_* value in tier mode: aclInit fails rather than let the
/// process run untiered (U3M_ON_CONFIG_ERROR=passthrough opts out).
static REFUSED: AtomicBool = AtomicBool::new(false);

/// True when aclInit must fail (see `REFUSED`).
#[inline]
pub fn start_refused() -> bool {
    REFUSED.load(Ordering::Relaxed)
}

thread_local! {
    /// The residency lock, held by the forking thread from fork's prepare
    /// step to its parent/child step.
    static FORK_HOLD: std::cell::RefCell<Option<u3m_core::residency::ForkHold>> =
        const { std::cell::RefCell::new(None) };
}

/// Writes one line to stderr with a single write(2): no allocation, no lock,
/// never stdout.
pub fn log_line(parts: &[&str]) {
    let mut buf = [0u8; 512];
    let mut n = 0;
    for p in std::iter::once(&"u3m: ")
        .chain(parts.iter())
        .chain(std::iter::once(&"\n"))
    {
        let b = p.as_bytes();
        let k = b.len().min(buf.len() - n);
        buf[n..n + k].copy_from_slice(&b[..k]);
        n += k;
    }
    // SAFETY: writes `n` <= buf.len() initialised bytes of a live buffer.
    unsafe { libc::write(2, buf.as_ptr() as *const libc::c_void, n) };
}

pub fn warn(msg: &str) {
    if LOG.load(Ordering::Relaxed) >= LogLevel::Warn as u8 {
        log_line(&[msg]);
    }
}

/// A line at U3M_LOG=info or debug.
pub fn info(msg: &str) {
    if LOG.load(Ordering::Relaxed) >= LogLevel::Info as u8 {
        log_line(&[msg]);
    }
}

/// A warning printed at most once per call site.
#[macro_export]
macro_rules! warn_once_at {
    ($msg:expr) => {{
        static ONCE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !ONCE.swap(true, std::sync::atomic::Ordering::Relaxed) {
            $crate::init::warn($msg);
        }
    }};
}

pub fn warn_once(msg: &str) {
    static ONCE: AtomicBool = AtomicBool::new(false);
    if !ONCE.swap(true, Ordering::Relaxed) {
        warn(msg);
    }
}

/// The engine, when u3m is active (READY); None otherwise.
#[inline]
pub fn engine() -> Option<&'static Engine> {
    if STATE.load(Ordering::Acquire) == READY {
        // SAFETY: ENGINE is null or a leaked Box<Engine> (never freed),
        // published before READY with Release.
        return unsafe { ENGINE.load(Ordering::Acquire).as_ref() };
    }
    engine_slow()
}

#[cold]
fn engine_slow() -> Option<&'static Engine> {
    if STATE.load(Ordering::Acquire) == UNINIT {
        init();
    }
    if STATE.load(Ordering::Acquire) == READY {
        // SAFETY: as in `engine`.
        unsafe { ENGINE.load(Ordering::Acquire).as_ref() }
    } else {
        None
    }
}

/// Runs once (per process: again in a forked child).
pub fn init() {
    if STATE
        .compare_exchange(UNINIT, INITIALIZING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    crate::dl::resolve_real();
    let parsed = u3m_core::config::parse(Config::env_vars());
    let mut cfg = parsed.config.clone();
    if FORKED.load(Ordering::Acquire) {
        if let Some(t) = &cfg.trace {
            let mut p = t.clone().into_os_string();
            p.push(format!(".{}", std::process::id()));
            cfg.trace = Some(p.into());
        }
    }
    // the log level of a valid U3M_LOG holds for these lines too
    let say = cfg.log >= LogLevel::Warn;
    for u in &parsed.unknown {
        if say {
            log_line(&["warning: ", &u.to_string()]);
        }
    }
    if !parsed.errors.is_empty() {
        let all: Vec<String> = parsed.errors.iter().map(|e| e.to_string()).collect();
        let fail = parsed.must_fail();
        if cfg.log > LogLevel::Quiet {
            let then = if fail {
                " — tier mode does not start: aclInit returns ACL_ERROR_INVALID_PARAM (100000) rather than run untiered (U3M_ON_CONFIG_ERROR=passthrough runs without u3m)"
            } else {
                " — running as pass-through"
            };
            log_line(&["configuration error: ", &all.join("; "), then]);
        }
        REFUSED.store(fail, Ordering::Relaxed);
        STATE.store(DISABLED, Ordering::Release);
        return;
    }
    LOG.store(cfg.log as u8, Ordering::Relaxed);
    if cfg.mode == Mode::Off {
        STATE.store(DISABLED, Ordering::Release);
        return;
    }
    let (mode, passthrough) = (cfg.mode, cfg.passthrough_on_error);
    let names: Vec<&'static str> = crate::hooks::names().collect();
    static RT: crate::runtime::Real = crate::runtime::Real;
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Engine::new(cfg, &names, Some(&RT))
    })) {
        Ok(Ok(e)) => {
            let e: &'static Engine = Box::leak(Box::new(e));
            e.start_background();
            ENGINE.store(e as *const Engine as *mut Engine, Ordering::Release);
            STATE.store(READY, Ordering::Release);
        }
        Ok(Err(msg)) => {
            // e.g. U3M_SWAP_DIR unusable: in tier mode as invalid as a bad value
            let fail = mode == Mode::Tier && !passthrough;
            let then = if fail {
                " — tier mode does not start: aclInit returns ACL_ERROR_INVALID_PARAM (100000) (U3M_ON_CONFIG_ERROR=passthrough runs without u3m)"
            } else {
                " — running as pass-through"
            };
            log_line(&["cannot start: ", &msg, then]);
            REFUSED.store(fail, Ordering::Relaxed);
            STATE.store(DISABLED, Ordering::Release);
        }
        Err(_) => {
            log_line(&["cannot start (internal error) — running as pass-through"]);
            STATE.store(DISABLED, Ordering::Release);
        }
    }
}

/// Switches u3m to pass-through for the rest of the process.
pub fn disable(why: &str) {
    if STATE.swap(DISABLED, Ordering::AcqRel) == READY {
        log_line(&["disabled: ", why, " — running as pass-through"]);
    }
}

/// The device this thread set with aclrtSetDevice (-1: none seen yet;
/// kept with the guard's per-thread state, guard.rs).
#[inline]
pub fn current_device() -> i32 {
    crate::guard::current_device()
}

pub fn set_current_device(dev: i32) {
    crate::guard::set_current_device(dev);
}

/// After aclrtSetCurrentContext: ask the runtime which device that is.
pub fn refresh_current_device() {
    static GET: crate::real::RealFn = crate::real::RealFn::new(b"aclrtGetDevice\0");
    if let Some(p) = GET.get() {
        // SAFETY: `p` is the runtime's aclrtGetDevice(int32_t *), called
        // with a live local.
        let f: unsafe extern "C" fn(*mut i32) -> i32 = unsafe { std::mem::transmute(p) };
        let mut d = -1;
        if unsafe { f(&mut d) } == 0 {
            set_current_device(d);
        }
    }
}

/// At exit: flush the trace, remove the stats segment (only in the process
/// that created them — a forked child inherits the handler).
extern "C" fn at_exit() {
    // SAFETY: ENGINE is null or a leaked, never-freed Engine.
    if let Some(e) = unsafe { ENGINE.load(Ordering::Acquire).as_ref() } {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| e.shutdown()));
    }
}

/// fork's prepare step: when a child would keep the engine (tier mode with
/// managed memory), the residency lock is taken so that no other thread is
/// in the middle of changing the state the child inherits. Not when this
/// thread is inside u3m (it may hold the lock: fork from the runtime).
extern "C" fn at_fork_prepare() {
    if STATE.load(Ordering::Acquire) != READY || crate::guard::inside() {
        return;
    }
    // SAFETY: ENGINE is null or a leaked, never-freed Engine.
    if let Some(e) = unsafe { ENGINE.load(Ordering::Acquire).as_ref() } {
        if e.kept_after_fork() {
            let hold = e.hold_for_fork();
            FORK_HOLD.with(|h| *h.borrow_mut() = hold);
        }
    }
}

/// fork's parent step: the lock taken in prepare is released.
extern "C" fn at_fork_parent() {
    FORK_HOLD.with(|h| h.borrow_mut().take());
}

/// In a forked child. Tier mode with managed memory: the child keeps the
/// parent's engine — the runtime's state (device memory, mappings) is
/// fork-copied and so are u3m's DRAM copies, so the child reads the
/// parent's buffers and allocates its own as the stock runtime lets it;
/// what belonged to the parent's threads is reset (engine.continue_in_child).
/// Otherwise start clean (own stats segment, no inherited threads): the
/// next hook re-inits.
extern "C" fn at_fork_child() {
    let hold = FORK_HOLD.with(|h| h.borrow_mut().take());
    FORKED.store(true, Ordering::Release);
    // SAFETY: ENGINE is null or a leaked, never-freed Engine (fork copied it).
    if let Some(e) = unsafe { ENGINE.load(Ordering::Acquire).as_ref() } {
        if STATE.load(Ordering::Acquire) == READY && e.kept_after_fork() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                e.continue_in_child(hold)
            }));
            return;
        }
        drop(hold);
        e.forget_after_fork();
        crate::guard::forget_calls_row();
    }
    ENGINE.store(ptr::null_mut(), Ordering::Release); // the parent's engine is leaked in the child
    STATE.store(UNINIT, Ordering::Release);
}

/// At load: only what must happen before any lookup. The engine starts at
/// the first hooked call, so a process that never uses ACL (a shell, a
/// `timeout` wrapper that inherited LD_PRELOAD) gets no segment, no thread.
extern "C" fn ctor() {
    // SAFETY: registers plain extern "C" fns with no arguments, as atexit
    // and pthread_atfork expect; they live as long as the library.
    unsafe {
        libc::atexit(at_exit);
        libc::pthread_atfork(
            Some(at_fork_prepare),
            Some(at_fork_parent),
            Some(at_fork_child),
        );
    }
    crate::dl::resolve_real();
}

#[cfg(not(test))]
#[used]
#[unsafe(link_section = ".init_array")]
static CTOR: extern "C" fn() = ctor;
