//! u3m-core: everything of u3m that is plain, testable Rust with no `extern "C"`
//! exports — the engine the interposer drives (`libu3m.so`, in `src/`) and the
//! code the `u3m` CLI shares with it (the stats segment's layout, the trace
//! format). Exports that interpose live only in the cdylib, so linking this
//! crate into a test or a tool never interposes anything.

pub mod acl;
pub mod config;
pub mod engine;
pub mod heat;
pub mod monitor;
pub mod opclass;
mod perthread;
pub mod plan;
pub mod policy;
pub mod residency;
pub mod roles;
pub mod shm;
pub mod store;
pub mod trace;

/// Version of u3m, reported by the CLI and written into the stats segment.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The unit tests' allocator: the system's, counting each thread's
/// allocations, so a test can show a path allocates nothing (`watched`).
#[cfg(test)]
pub(crate) mod test_alloc {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    struct Counting;

    thread_local! {
        static PAUSED: Cell<bool> = const { Cell::new(false) };
        static ALLOCS: Cell<u64> = const { Cell::new(0) };
    }

    fn count() {
        // try_with: the allocator runs while thread-locals are torn down
        if !PAUSED.try_with(Cell::get).unwrap_or(true) {
            let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        }
    }

    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            count();
            System.alloc(l)
        }
        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            System.dealloc(p, l)
        }
        unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
            count();
            System.alloc_zeroed(l)
        }
        unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
            count();
            System.realloc(p, l, n)
        }
    }

    #[global_allocator]
    static A: Counting = Counting;

    /// Allocations this thread has made so far (outside `unwatched`).
    pub fn allocs() -> u64 {
        ALLOCS.with(Cell::get)
    }

    /// How many allocations this thread made in `f`.
    pub fn watched(f: impl FnOnce()) -> u64 {
        let before = allocs();
        f();
        allocs() - before
    }

    /// Runs `f` with its allocations not counted (a fake runtime's own
    /// bookkeeping).
    pub fn unwatched<T>(f: impl FnOnce() -> T) -> T {
        let was = PAUSED.with(|w| w.replace(true));
        let r = f();
        PAUSED.with(|w| w.set(was));
        r
    }
}

/// The tests' deterministic random numbers: xorshift64 from `seed`, each
/// call a value below `m` (0 for m = 0).
#[cfg(test)]
pub(crate) fn test_rng(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut x = seed;
    move |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m.max(1)
    }
}
