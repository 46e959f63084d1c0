//! The background thread: tier rounds (policy tick, DRAM spill, watermarks,
//! prefetch) every 20 ms, and every U3M_HOT_INTERVAL_MS the hottest chunks
//! written to the stats segment, so `u3m top` can show them without reading
//! the heat table. Publishing reads only; the hot path never waits for it.
//!
//! The rounds run on the runtime's clock. On a card that is wall time: a
//! round every 20 ms of it. On the simulator, whose time is simulated
//! (`aclsim_host_ns`, found at start), a round falls due at every 20 ms of
//! the simulator's host clock: the first tracked call that finds the clock
//! past it (checked before and after each tracked call) hands the round to
//! this thread and waits for it, so what the rounds do follows the device
//! timeline, not how fast the host ran (issue 10 part 5: `u3m replay` runs
//! its rounds the same way and predicts the library). The periods that
//! passed since the last round make one round (a host that waited through
//! several gets one, with their DRAM spill and prefetch budgets). A program
//! that makes no tracked call for 100 ms of wall time and has no thread
//! ready to run (idle: asleep, or waiting for input) still gets rounds, as
//! on a card. A program merely not scheduled for 100 ms — a loaded host —
//! is not idle: a round there would fall at a point of the program that
//! depends on the load, and the simulated figures with it (12 busy loops on
//! 2 cores moved a 2-layer AdamW run's 901 ms to 921–1083 ms before this
//! check; tests/replay_vs_lib.rs).
//!
//! Either clock: a round leaves the watermarks alone when the program made
//! room on demand since the last round (it is filling HBM itself; a
//! background eviction on top only competes with it for the link and evicts
//! what it is about to use: BENCHMARKS.md "Replay against the library").

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::Engine;
use crate::perthread::{Here, PerThread};
use crate::shm::{mono_ns, HotEntry, HOT_CAPACITY};

/// A background round's period on the runtime's clock.
pub const ROUND_NS: u64 = 20_000_000;
/// The most 20 ms periods one round covers; a longer gap is skipped, as
/// `u3m replay` does.
const MAX_PERIODS: u64 = 1000;
/// How long a call waits for the rounds it handed over: past it (a wedged
/// helper) the call goes on; nothing waits for ever.
const HANDOFF_WAIT: Duration = Duration::from_secs(2);

/// Wall ticks without a tracked call after which the simulator's program
/// counts as idle and gets a wall-time round.
const IDLE_TICKS: u32 = 5;

/// The simulator's host clock, simulated ns.
type ClockFn = unsafe extern "C" fn() -> u64;

#[derive(Default)]
struct Rounds {
    /// runtime-clock time up to which rounds were asked for / have run
    want: u64,
    done: u64,
}

#[derive(Default)]
pub struct Publisher {
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// the runtime's clock when it is not wall time (the simulator)
    clock: OnceLock<ClockFn>,
    /// runtime-clock time of the next round; 0: rounds are on wall time
    next: AtomicU64,
    rounds: Mutex<Rounds>,
    cv: Condvar,
    /// tracked calls in progress (counted only on the runtime's clock):
    /// each thread's own count, written by that thread with a load and a
    /// store (no read-modify-write on a line every calling thread shares),
    /// summed by `out_of_calls`
    in_call: PerThread<AtomicU64>,
    /// the same, for a call whose thread's count is unavailable (the
    /// thread is exiting)
    in_call_shared: AtomicU64,
    /// the residency's demand count at the last round
    demand_seen: AtomicU64,
}

/// A tracked call in progress (`Publisher::pace_call_in`): dropped when the
/// call is done, it checks the clock again. Holds the thread's count of
/// calls in progress (null: the shared one).
pub struct CallGuard<'a>(Option<(&'a Publisher, *const AtomicU64)>);

/// `n` += `by` on a count only the calling thread writes.
#[inline]
fn bump(n: &AtomicU64, by: i64) {
    n.store(
        n.load(Ordering::Relaxed).wrapping_add(by as u64),
        Ordering::Release,
    );
}

impl Drop for CallGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some((p, mine)) = self.0 {
            if mine.is_null() {
                p.in_call_shared.fetch_sub(1, Ordering::AcqRel);
            } else {
                // SAFETY: `pace_call_in` took it from `p.in_call` on this
                // thread (the guard is !Send): the thread's own count, held
                // by the thread's list and by `p` for as long as the thread
                // and `p` live
                bump(unsafe { &*mine }, -1);
            }
            p.pace();
        }
    }
}

/// Whether a thread of this process other than the calling one is ready to
/// run (state R in /proc: running, or runnable and waiting for a CPU). A
/// program the host's load keeps off the CPUs has one; an idle one (asleep,
/// blocked on input or a lock) has none. false when /proc cannot be read.
fn others_runnable() -> bool {
    // SAFETY: no arguments
    let me = unsafe { libc::syscall(libc::SYS_gettid) };
    runnable_in(std::path::Path::new("/proc/self/task"), me as i64)
}

/// [`others_runnable`] over a task directory (`TID/stat` entries), `me`
/// left out.
fn runnable_in(tasks: &std::path::Path, me: i64) -> bool {
    let Ok(dir) = std::fs::read_dir(tasks) else {
        return false;
    };
    dir.flatten().any(|t| {
        let name = t.file_name();
        let tid = name.to_str().and_then(|n| n.parse::<i64>().ok());
        tid.is_some_and(|tid| tid != me)
            && std::fs::read(t.path().join("stat")).is_ok_and(|b| stat_runnable(&b))
    })
}

/// The state field of a /proc task `stat` line is R: it follows the
/// command name's closing parenthesis (the name may hold spaces and
/// parentheses itself: the last one closes it).
fn stat_runnable(stat: &[u8]) -> bool {
    let Some(close) = stat.iter().rposition(|&c| c == b')') else {
        return false;
    };
    stat[close + 1..].iter().find(|c| !c.is_ascii_whitespace()) == Some(&b'R')
}

/// `aclsim_host_ns` when the runtime is the simulator.
fn simulated_clock() -> Option<ClockFn> {
    // SAFETY: a lookup by a NUL-terminated name; the symbol, when present,
    // is `uint64_t aclsim_host_ns(void)` (shim/src/sim.h)
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"aclsim_host_ns".as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: see above: the symbol has this signature
    Some(unsafe { std::mem::transmute::<*mut libc::c_void, ClockFn>(p) })
}

impl Publisher {
    pub fn start(&self, e: &'static Engine) {
        if e.residency.is_some() {
            if let Some(c) = simulated_clock() {
                if self.clock.set(c).is_ok() {
                    // SAFETY: the simulator's function, no arguments
                    let now = unsafe { c() };
                    self.next
                        .store((now / ROUND_NS + 1) * ROUND_NS, Ordering::Release);
                }
            }
        }
        let interval = Duration::from_millis(e.cfg.hot_interval_ms);
        let h = std::thread::Builder::new()
            .name("u3m-publish".into())
            .spawn(move || e.publisher.main(e, interval));
        if let (Ok(h), Ok(mut t)) = (h, self.thread.lock()) {
            *t = Some(h);
        }
    }

    /// The background thread.
    fn main(&self, e: &'static Engine, interval: Duration) {
        // tier work every 20 ms; the hot table at its own interval
        let tick = Duration::from_millis(20).min(interval);
        let mut since = Duration::ZERO;
        let mut last = Instant::now();
        // idle detection: the tracked-call clock at the last wall tick, and
        // the wall ticks since a call or a handed-over round
        let mut calls = None;
        let mut idle = 0u32;
        let mut secs = 0.0f64;
        while !self.stop.load(Ordering::Acquire) {
            let want = {
                let Ok(r) = self.rounds.lock() else { return };
                let left = tick.saturating_sub(last.elapsed());
                let Ok((r, _)) = self.cv.wait_timeout_while(r, left, |r| {
                    r.want <= r.done && !self.stop.load(Ordering::Acquire)
                }) else {
                    return;
                };
                (r.want > r.done).then_some(r.want)
            };
            if self.stop.load(Ordering::Acquire) {
                break;
            }
            // a panic here must not leave the hooks passing calls through
            // on memory the helper was moving (failure.rs)
            if let Some(want) = want {
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    self.run_due(e, want, &mut secs)
                }));
                if ran.is_err() {
                    self.fail(e);
                    return;
                }
                if let Ok(mut r) = self.rounds.lock() {
                    r.done = r.done.max(want);
                }
                self.cv.notify_all();
                // a call waited for these: the program is not idle
                idle = 0;
            }
            if last.elapsed() < tick {
                continue;
            }
            last = Instant::now();
            let ticked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.wall_tick(e, &mut calls, &mut idle, &mut secs)
            }));
            if ticked.is_err() {
                self.fail(e);
                return;
            }
            since += tick;
            if since >= interval {
                since = Duration::ZERO;
                publish_once(e);
            }
        }
    }

    /// 20 ms of wall time passed: a round on a card; on the simulator one
    /// only when the program made no tracked call (and waited for no round)
    /// for five whole ticks (100 ms): idle, not merely descheduled or slowed
    /// down by the simulator's threads.
    fn wall_tick(&self, e: &Engine, calls: &mut Option<u64>, idle: &mut u32, secs: &mut f64) {
        let Some(c) = self.clock.get() else {
            e.tier_tick(None, 1);
            return;
        };
        let now = e.residency.as_ref().map(|t| t.now());
        *idle = if now.is_some() && *calls == now && self.out_of_calls() && !others_runnable() {
            idle.saturating_add(1)
        } else {
            0
        };
        if *idle >= IDLE_TICKS {
            // SAFETY: the simulator's function, no arguments
            *secs = secs.max(unsafe { c() } as f64 / 1e9);
            e.tier_tick(Some(*secs), 1);
        }
        *calls = now;
    }

    /// Runs the round due on the runtime's clock up to `want`: the periods
    /// that passed since the last one are one round (a host that waited
    /// through several gets one covering them all: DRAM spill and prefetch
    /// budget for all the periods, the watermarks once), as `u3m replay`.
    fn run_due(&self, e: &Engine, want: u64, secs: &mut f64) {
        let next = self.next.load(Ordering::Acquire);
        if next == 0 || want < next {
            return;
        }
        let periods = ((want - next) / ROUND_NS + 1).min(MAX_PERIODS);
        let at = next + (periods - 1) * ROUND_NS;
        *secs = secs.max(at as f64 / 1e9);
        e.tier_tick(Some(*secs), periods);
        // a longer stall than MAX_PERIODS: the rest is skipped
        let next = (at + ROUND_NS).max((want / ROUND_NS + 1) * ROUND_NS);
        self.next.store(next, Ordering::Release);
    }

    /// [`pace_call_in`](Self::pace_call_in), the thread looked up here.
    #[cfg(test)]
    pub fn pace_call(&self) -> CallGuard<'_> {
        self.pace_call_in(None)
    }

    /// A tracked call's check, before it and (when the guard drops) after
    /// it: when the runtime's clock has passed the next round, the rounds
    /// due run (on this thread's behalf, by the background thread) before
    /// the call goes on. On a card (wall-time rounds) nothing. `here`: the
    /// calling thread's `LAST` looked up already (perthread.rs; None:
    /// looked up here).
    #[inline]
    pub(crate) fn pace_call_in(&self, here: Option<Here>) -> CallGuard<'_> {
        if self.next.load(Ordering::Acquire) == 0 {
            return CallGuard(None);
        }
        let mine = self
            .in_call
            .mine_in(
                here,
                || AtomicU64::new(0),
                |n| {
                    bump(n, 1);
                    n as *const AtomicU64
                },
            )
            .unwrap_or_else(|| {
                self.in_call_shared.fetch_add(1, Ordering::AcqRel);
                std::ptr::null()
            });
        self.pace();
        CallGuard(Some((self, mine)))
    }

    #[inline]
    fn pace(&self) {
        let next = self.next.load(Ordering::Acquire);
        if next == 0 {
            return;
        }
        let Some(c) = self.clock.get() else { return };
        // SAFETY: the simulator's function, no arguments
        let now = unsafe { c() };
        if now >= next {
            self.hand_over(now);
        }
    }

    #[cold]
    fn hand_over(&self, now: u64) {
        let Ok(mut r) = self.rounds.lock() else {
            return;
        };
        if r.done >= now {
            return;
        }
        r.want = r.want.max(now);
        self.cv.notify_all();
        let deadline = Instant::now() + HANDOFF_WAIT;
        while r.done < now && !self.stop.load(Ordering::Acquire) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            match self.cv.wait_timeout(r, left) {
                Ok((g, _)) => r = g,
                Err(_) => return,
            }
        }
    }

    /// Whether the program made no room on demand (`demand`: the
    /// residency's count now) since the last round asked; rounds run on
    /// this thread only, one at a time.
    pub fn quiet(&self, demand: u64) -> bool {
        self.demand_seen.swap(demand, Ordering::Relaxed) == demand
    }

    /// No tracked call in progress (the simulator's idle rounds).
    fn out_of_calls(&self) -> bool {
        let mut n = self.in_call_shared.load(Ordering::Acquire);
        self.in_call.each(
            |c| c.load(Ordering::Acquire) == 0,
            |c| n = n.wrapping_add(c.load(Ordering::Acquire)),
        );
        n == 0
    }

    fn fail(&self, e: &Engine) {
        e.background_failed();
        self.stop();
    }

    pub fn stop(&self) {
        // do not join: exit must not wait up to an interval (and a forked
        // child's copy of the thread does not exist); nothing waits for a
        // round any more
        self.next.store(0, Ordering::Release);
        self.stop.store(true, Ordering::Release);
        let _g = self.rounds.lock();
        self.cv.notify_all();
    }

    pub fn forget_after_fork(&self) {
        self.next.store(0, Ordering::Release);
        self.stop.store(true, Ordering::Release);
    }
}

/// Publishes the hottest chunks once.
pub fn publish_once(e: &Engine) {
    let Some(seg) = &e.seg else { return };
    let now = mono_ns();
    let hot = e.heat.hottest_chunks(HOT_CAPACITY, now);
    let entries: Vec<HotEntry> = hot
        .iter()
        .map(|c| HotEntry {
            addr: c.addr,
            len: c.bytes,
            device: c
                .alloc
                .and_then(|id| e.heat.alloc_info(id))
                .map(|a| a.dev)
                .unwrap_or(0),
            accesses: c.stats.accesses,
            heat: c.heat(now),
            class_mask: c.stats.classes.0 as u64,
            last_ns: c.stats.last_ns,
        })
        .collect();
    seg.publish_hot(&entries);
}

pub fn warn_opaque(e: &Engine) {
    static ONCE: AtomicBool = AtomicBool::new(false);
    if !ONCE.swap(true, Ordering::Relaxed) {
        if let Some(s) = &e.seg {
            s.event(
                crate::shm::EventKind::Info,
                crate::shm::NO_DEVICE,
                0,
                0,
                "opaque kernel launch (args handle)",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    /// Calls in progress on several threads are seen by `out_of_calls`
    /// (the idle rounds' check) until the last one ends, each thread's
    /// count kept on its own: fails if a call's end is lost or counted on
    /// another thread's count, or a call in progress is missed.
    #[test]
    fn calls_in_progress_are_counted_per_thread() {
        let p: &'static Publisher = Box::leak(Box::default());
        // rounds on the runtime's clock (no clock function: `pace` stops
        // there), so calls are tracked
        p.next.store(u64::MAX, Ordering::Release);
        assert!(p.out_of_calls());
        const T: usize = 6;
        let entered = Arc::new(Barrier::new(T + 1));
        let release = Arc::new(Barrier::new(T + 1));
        let done = Arc::new(Barrier::new(T + 1));
        let hs: Vec<_> = (0..T)
            .map(|k| {
                let (entered, release, done) = (entered.clone(), release.clone(), done.clone());
                std::thread::spawn(move || {
                    // calls that begin and end, some nested
                    for i in 0..1000 {
                        let _a = p.pace_call();
                        if i % 3 == k % 3 {
                            let _b = p.pace_call();
                        }
                    }
                    let g = p.pace_call();
                    let g2 = (k == 0).then(|| p.pace_call());
                    entered.wait();
                    release.wait();
                    drop(g);
                    // thread 0 still has one in progress until `done`
                    if k != 0 {
                        done.wait();
                        return;
                    }
                    done.wait();
                    drop(g2);
                })
            })
            .collect();
        entered.wait();
        assert!(!p.out_of_calls(), "calls in progress on every thread");
        release.wait();
        // threads drop their first call; thread 0 keeps a nested one
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!p.out_of_calls(), "thread 0's nested call is in progress");
        done.wait();
        for h in hs {
            h.join().unwrap();
        }
        assert!(p.out_of_calls(), "every call ended");
        // exited threads' counts are dropped once read at zero
        p.out_of_calls();
        assert_eq!(p.in_call.len(), 0);
    }

    #[test]
    fn a_stat_line_is_runnable_by_the_state_after_the_name() {
        assert!(stat_runnable(b"412 (acl_replay) R 1 412 412 0 -1"));
        assert!(!stat_runnable(b"412 (acl_replay) S 1 412 412 0 -1"));
        // a name with spaces and parentheses: the last ')' closes it
        assert!(stat_runnable(b"7 (a (b) R) R 1"));
        assert!(!stat_runnable(b"7 (a (b) R) S 1"));
        assert!(!stat_runnable(b"garbage"));
    }

    /// The idle rounds' check: a thread that spins is ready to run, one
    /// that sleeps is not. Fails if the check reads the wrong field, or
    /// counts the calling thread.
    #[test]
    fn a_spinning_thread_is_runnable_and_a_sleeping_one_is_not() {
        use std::sync::atomic::AtomicBool;
        // this process's other test threads may run: look for a state we
        // made, by asking about our own threads only through their effect
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let spin = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        });
        let seen = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(1));
            others_runnable()
        });
        stop.store(true, Ordering::Relaxed);
        spin.join().unwrap();
        assert!(seen, "a spinning thread was never seen ready to run");
        // the negative half on a task directory of our own (this process's
        // other tests may be running)
        let dir = std::env::temp_dir().join(format!("u3m-tasks-{}", std::process::id()));
        let task = |tid: i64, state: &str| {
            let d = dir.join(tid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("stat"), format!("{tid} (x y) {state} 1 2 3")).unwrap();
        };
        task(10, "R"); // the caller: left out
        task(11, "S");
        task(12, "D");
        assert!(!runnable_in(&dir, 10), "only the caller runs");
        task(13, "R");
        assert!(runnable_in(&dir, 10), "a second thread runs");
        assert!(!runnable_in(&dir.join("absent"), 10), "no /proc: false");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
