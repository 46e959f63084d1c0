//! The buffered policy decides as the unbuffered one: same accesses, same
//! order, at every decision — one thread, several threads (with their
//! calls serialized by a lock, as the residency's shard lock does, and
//! exiting with calls still buffered), and in a forked child.

use super::super::{Cand, Lru, Markov, Place, Placement, Predictive, Touch};
use super::*;
use std::sync::{mpsc, Mutex};
use std::time::Duration;

const MB2: u64 = 2 << 20;

fn xorshift(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut x = seed;
    move |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    }
}

/// A call of a mixed workload at logical time `t`: loops of two periods,
/// a chunk written every call, irregular keys; 1–5 keys.
fn call(t: u64, rnd: &mut impl FnMut(u64) -> u64) -> (u8, Vec<u64>, Vec<Touch>) {
    let n = 1 + rnd(5) as usize;
    let mut keys = Vec::with_capacity(n);
    for j in 0..n as u64 {
        let k = match (t + j) % 4 {
            0 => (t / 4 + j) % 120,
            1 => 120 + (t / 4) % 90,
            2 => 210,
            _ => 220 + rnd(100),
        };
        if !keys.contains(&(k * MB2)) {
            keys.push(k * MB2);
        }
    }
    // the Buffered wrapper hands touches over as they came: every kind
    let writes = keys
        .iter()
        .map(|k| Touch::new((k / MB2) % 3 != 1, (k / MB2) % 3 == 0))
        .collect();
    ((t % 7) as u8, keys, writes)
}

/// Every decision of the two policies at `now`, compared.
fn same_decisions(a: &dyn Placement, b: &dyn Placement, now: u64, last: &[u64], at: &str) {
    let cands: Vec<Cand> = (0..last.len() as u64)
        .map(|k| Cand {
            key: k * MB2,
            last: last[k as usize],
            dirty: k % 5 == 0,
        })
        .collect();
    let (mut oa, mut ob) = (cands.clone(), cands.clone());
    a.order(now, &mut oa);
    b.order(now, &mut ob);
    assert_eq!(oa, ob, "{at}: order");
    let (mut ta, mut tb) = (cands.clone(), cands.clone());
    a.order_top(now, &mut ta, 17);
    b.order_top(now, &mut tb, 17);
    assert_eq!(ta, tb, "{at}: order_top");
    assert_eq!(a.order_ttl(), b.order_ttl(), "{at}: order_ttl");
    for k in 0..last.len() as u64 {
        let key = k * MB2;
        assert_eq!(
            a.predicts(now, key, 40),
            b.predicts(now, key, 40),
            "{at}: predicts {k}"
        );
        assert_eq!(
            a.next_use(now, key),
            b.next_use(now, key),
            "{at}: next_use {k}"
        );
        assert_eq!(a.place(now, key), b.place(now, key), "{at}: place {k}");
    }
    let (mut ua, mut ub) = (Vec::new(), Vec::new());
    a.upcoming(now, 200, &mut ua);
    b.upcoming(now, 200, &mut ub);
    ua.sort_unstable();
    ub.sort_unstable();
    assert_eq!(ua, ub, "{at}: upcoming");
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    a.drain_events(&mut ea);
    b.drain_events(&mut eb);
    assert_eq!(ea, eb, "{at}: events");
}

fn policies() -> Vec<(Box<dyn Placement>, Box<dyn Placement>)> {
    vec![
        (Box::new(Predictive::new()), Box::new(Predictive::new())),
        (
            Box::new(Predictive::with_params(0.5, 0.0)),
            Box::new(Predictive::with_params(0.5, 0.0)),
        ),
        (Box::new(Lru::new()), Box::new(Lru::new())),
        (Box::new(Markov::new()), Box::new(Markov::new())),
    ]
}

/// One thread: after runs of buffered calls shorter and longer than a
/// buffer, frees of keys with calls buffered, ticks and calls with more
/// keys than a buffer holds, every decision equals the unbuffered
/// policy's. Fails if a decision does not apply the buffer first (the
/// predictive model would lack the calls since the last one), if a full
/// buffer loses calls, or if calls are applied out of order. Every other
/// call comes through `on_access_here` with the thread's `LAST`, as the
/// residency's calls do (1 to 5 keys: one-key calls take `Calls::push`'s
/// own branch).
#[test]
fn one_thread_decides_as_unbuffered() {
    for (plain, inner) in policies() {
        let name = plain.name();
        let b = Buffered::new(inner);
        let mut rnd = xorshift(0x9e37_79b9_7f4a_7c15);
        let mut last = vec![0u64; 330];
        let mut t = 0u64;
        let mut decisions = 0;
        for round in 0..60u64 {
            // 0 to 3 buffers' worth of calls before the next decision
            let n = rnd(3 * CALLS as u64 + 1);
            for _ in 0..n {
                t += 1;
                let (class, keys, writes) = call(t, &mut rnd);
                for k in &keys {
                    last[(k / MB2) as usize] = t;
                }
                plain.on_access(t, class, &keys, &writes);
                if t % 2 == 0 {
                    b.on_access(t, class, &keys, &writes);
                } else {
                    // as the residency calls it, with the thread's `LAST`
                    let here = crate::perthread::Here::now();
                    b.on_access_here(here, t, class, &keys, &writes);
                }
            }
            match round % 6 {
                1 => {
                    let key = (220 + rnd(100)) * MB2;
                    plain.on_free(key);
                    b.on_free(key);
                }
                2 => {
                    let secs = round as f64 * 0.3;
                    plain.tick(secs, 0.9);
                    b.tick(secs, 0.9);
                }
                3 => {
                    t += 1;
                    let keys: Vec<u64> = (0..KEYS as u64 + 7).map(|k| (k % 330) * MB2).collect();
                    let keys: Vec<u64> = keys
                        .into_iter()
                        .collect::<std::collections::BTreeSet<_>>()
                        .into_iter()
                        .collect();
                    let writes = vec![Touch::READ; keys.len()];
                    for k in &keys {
                        last[(k / MB2) as usize] = t;
                    }
                    plain.on_access(t, 2, &keys, &writes);
                    b.on_access(t, 2, &keys, &writes);
                }
                _ => {}
            }
            same_decisions(&*plain, &b, t + 1, &last, &format!("{name} round {round}"));
            decisions += 1;
        }
        assert!(
            decisions == 60 && t > 60 * CALLS as u64,
            "{name}: {t} calls"
        );
    }
}

/// The test's own check: a policy given the same calls one fewer gives
/// another order (else the comparisons above prove nothing).
#[test]
fn a_lost_call_changes_the_decisions() {
    let (a, b) = (Predictive::new(), Predictive::new());
    let mut rnd = xorshift(7);
    let mut last = vec![0u64; 330];
    for t in 1..=400u64 {
        let (class, keys, writes) = call(t, &mut rnd);
        for k in &keys {
            last[(k / MB2) as usize] = t;
        }
        a.on_access(t, class, &keys, &writes);
        if t != 399 {
            b.on_access(t, class, &keys, &writes);
        }
    }
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        same_decisions(&a, &b, 401, &last, "lost")
    }));
    assert!(r.is_err(), "one call fewer went unnoticed");
}

/// Several threads make calls with the clock read and the access given
/// under one lock (the shard lock of the residency), some decide under it
/// too; a twin unbuffered policy gets every call and decision at the same
/// place. Every decision is equal, and after the threads exit with calls
/// still in their buffers, the final decisions are too. Fails when a
/// decision misses another thread's buffered calls, or applies them out of
/// clock order, or when an exited thread's buffer is lost.
#[test]
fn threads_decide_as_unbuffered() {
    decide_in_threads(false);
}

/// The same with an applier thread (engine/applier.rs) taking the due
/// buffers concurrently with the calls and the decisions: every decision
/// is still the unbuffered policy's.
#[test]
fn threads_decide_as_unbuffered_with_an_applier() {
    decide_in_threads(true);
}

fn decide_in_threads(with_applier: bool) {
    for (plain, inner) in policies() {
        let name = plain.name();
        let b = Buffered::new(inner);
        let stop = AtomicBool::new(false);
        struct Shared {
            t: u64,
            last: Vec<u64>,
        }
        let lock = Mutex::new(Shared {
            t: 0,
            last: vec![0; 330],
        });
        std::thread::scope(|s| {
            let applier = with_applier.then(|| {
                let (b, stop) = (&b, &stop);
                let h = s.spawn(move || {
                    while !stop.load(Acquire) {
                        std::thread::park_timeout(Duration::from_millis(5));
                        b.apply_deferred();
                    }
                });
                b.set_applier(h.thread().clone());
                h
            });
            let calls: Vec<_> = (0..6u64)
                .map(|th| {
                    let (plain, b, lock) = (&plain, &b, &lock);
                    s.spawn(move || {
                        let mut rnd = xorshift(0x1234_5678 + th * 77);
                        for i in 0..700u64 {
                            let mut g = lock.lock().unwrap();
                            g.t += 1;
                            let t = g.t;
                            let (class, keys, writes) = call(t, &mut rnd);
                            for k in &keys {
                                g.last[(k / MB2) as usize] = t;
                            }
                            plain.on_access(t, class, &keys, &writes);
                            b.on_access(t, class, &keys, &writes);
                            if (i + th) % 97 == 0 {
                                let at = format!("{name} thread {th} call {i}");
                                same_decisions(&**plain, b, t + 1, &g.last, &at);
                            }
                            drop(g);
                            // outside the lock, as the engine does after a
                            // call: applies every buffer when this one is due,
                            // concurrently with the others' calls
                            b.after_call();
                            if i % 13 == 0 {
                                std::thread::yield_now();
                            }
                        }
                    })
                })
                .collect();
            let joined: Vec<_> = calls.into_iter().map(|h| h.join()).collect();
            // stopped before any failure is reported (the scope waits for it)
            stop.store(true, Release);
            if let Some(h) = applier {
                h.thread().unpark();
                h.join().unwrap();
            }
            for j in joined {
                j.unwrap();
            }
        });
        let g = lock.lock().unwrap();
        assert_eq!(g.t, 6 * 700);
        // the exited threads' buffers still held calls (the last < CALLS
        // of each): applied by this decision, then dropped
        same_decisions(&*plain, &b, g.t + 1, &g.last, &format!("{name} end"));
        drop(g);
        // the exited threads' buffers are dropped by an apply (once their
        // thread-local destructors have run: they may lag the join)
        let mut left = usize::MAX;
        for t in 0..1000u64 {
            b.on_access(10_000 + t, 0, &[MB2], &[Touch::READ]);
            b.order(10_001 + t, &mut []);
            left = b.registry().bufs.len();
            if left == 1 {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(left, 1, "{name}: exited threads' buffers kept");
    }
}

/// `after_call` applies the buffers once one is due (half full),
/// not before; what it applied is what the policy then decides on. Fails
/// if `after_call` does nothing (the buffer would fill to `CALLS`) or
/// applies every call (no buffering).
#[test]
fn after_call_applies_when_due() {
    let b = Buffered::new(Box::new(Predictive::new()));
    let plain = Predictive::new();
    let held = |b: &Buffered| b.reg.this_thread(|x| x.lock().n);
    let mut rnd = xorshift(99);
    let mut last = vec![0u64; 330];
    let mut max_held = 0;
    for t in 1..=5 * CALLS as u64 {
        let (class, keys, writes) = call(t, &mut rnd);
        for k in &keys {
            last[(k / MB2) as usize] = t;
        }
        plain.on_access(t, class, &keys, &writes);
        b.on_access(t, class, &keys, &writes);
        b.after_call();
        let n = held(&b).unwrap();
        assert!(n < DUE_CALLS, "call {t}: {n} calls held after after_call");
        max_held = max_held.max(n);
    }
    assert_eq!(max_held, DUE_CALLS - 1, "never buffered up to due");
    same_decisions(&plain, &b, 5 * CALLS as u64 + 1, &last, "after_call");
}

/// Lru behind a lock a test can hold (an applier inside the policy).
struct Gated {
    gate: Mutex<()>,
    lru: Lru,
}

impl Placement for Gated {
    fn name(&self) -> &'static str {
        "gated"
    }
    fn on_access(&self, now: u64, class: u8, keys: &[u64], writes: &[Touch]) {
        let _g = self.gate.lock().unwrap();
        self.lru.on_access(now, class, keys, writes)
    }
    fn order(&self, now: u64, cands: &mut [Cand]) {
        let _g = self.gate.lock().unwrap();
        self.lru.order(now, cands)
    }
    fn predicts(&self, now: u64, key: u64, w: u64) -> bool {
        let _g = self.gate.lock().unwrap();
        self.lru.predicts(now, key, w)
    }
}

/// What a forked child sees: `after_fork_child` on a thread of its own
/// (the forking thread) while other threads hold what the parent's
/// threads could have held at the fork; the child's calls and decisions
/// must come back (10 s timeout) and say the predictions made.
fn child_after_fork(
    b: &'static Buffered,
    hold: impl FnOnce() -> Box<dyn FnOnce() + Send> + Send + 'static,
) -> (bool, bool, Vec<u64>) {
    // another thread's buffered call, then that thread holds its buffer
    // (mid-call at the fork)
    let (held_tx, held_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let other = std::thread::spawn(move || {
        b.on_access(1, 0, &[MB2], &[Touch::READ]);
        let me = b.reg.mine_arc().unwrap();
        let _g = me.lock();
        held_tx.send(()).unwrap();
        let _ = go_rx.recv();
    });
    held_rx.recv().unwrap();
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        b.on_access(2, 0, &[2 * MB2], &[Touch::READ]);
        let release = hold();
        b.after_fork_child();
        b.on_access(3, 0, &[3 * MB2], &[Touch::READ]);
        let p = (b.predicts(4, 2 * MB2, 10), b.predicts(4, 3 * MB2, 10));
        let mut c: Vec<Cand> = [(3, 3), (1, 1), (2, 2)]
            .iter()
            .map(|&(k, last)| Cand {
                key: k * MB2,
                last,
                dirty: false,
            })
            .collect();
        b.order(4, &mut c);
        let _ = b.place(4, MB2) == Some(Place::Hbm);
        let order = c.iter().map(|c| c.key / MB2).collect::<Vec<_>>();
        done_tx.send((p, order, release)).unwrap();
    });
    let ((p2, p3), order, release) = done_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the child waited for a lock held at the fork");
    release();
    go_tx.send(()).unwrap();
    other.join().unwrap();
    (p2, p3, order)
}

/// A thread holds `lock` until the returned closure is called.
fn held_by_a_thread<T: Send + 'static>(lock: &'static Mutex<T>) -> Box<dyn FnOnce() + Send> {
    let (tx, rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        let _g = lock.lock().unwrap_or_else(|e| e.into_inner());
        tx.send(()).unwrap();
        let _ = go_rx.recv();
    });
    rx.recv().unwrap();
    Box::new(move || {
        go_tx.send(()).unwrap();
        t.join().unwrap();
    })
}

/// A forked child whose parent had a thread inside a call (its buffer
/// locked): the child's own buffered call and its calls after the fork
/// reach the policy (predicted), the held buffer is left alone.
#[test]
fn after_fork_child_applies_what_it_can_lock() {
    let b: &'static Buffered = Box::leak(Box::new(Buffered::new(Box::new(Lru::new()))));
    let (p2, p3, order) = child_after_fork(b, || Box::new(|| {}));
    assert_eq!((p2, p3), (true, true));
    assert_eq!(b.registry().bufs.len(), 2, "registry usable");
    assert_eq!(order, vec![1, 2, 3]);
}

/// A forked child whose parent had an applier inside the policy (the
/// registry and the policy's own lock held at the fork): the child never
/// calls the policy (it would wait for ever) — it orders by recency and
/// predicts nothing. Without `cut_off` the call after the fork blocks on
/// the policy's lock (the test fails on its timeout).
#[test]
fn after_fork_child_never_waits_for_an_applier() {
    let g: &'static Gated = Box::leak(Box::new(Gated {
        gate: Mutex::new(()),
        lru: Lru::new(),
    }));
    struct ByRef(&'static Gated);
    impl Placement for ByRef {
        fn name(&self) -> &'static str {
            self.0.name()
        }
        fn on_access(&self, now: u64, class: u8, keys: &[u64], writes: &[Touch]) {
            self.0.on_access(now, class, keys, writes)
        }
        fn order(&self, now: u64, cands: &mut [Cand]) {
            self.0.order(now, cands)
        }
        fn predicts(&self, now: u64, key: u64, w: u64) -> bool {
            self.0.predicts(now, key, w)
        }
    }
    let b: &'static Buffered = Box::leak(Box::new(Buffered::new(Box::new(ByRef(g)))));
    let (p2, p3, order) = child_after_fork(b, move || {
        let reg = held_by_a_thread(b.reg.mutex());
        let gate = held_by_a_thread(&g.gate);
        Box::new(move || {
            gate();
            reg();
        })
    });
    assert_eq!((p2, p3), (false, false), "cut off: no predictions");
    assert_eq!(order, vec![1, 2, 3], "recency order");
}

/// With an applier thread: a due buffer wakes it (once) and its call goes
/// on without applying; a buffer the applier has not taken by
/// `OVERDUE_CALLS` is applied by its own thread after its call; what the
/// applier applies is what the policy then decides on. Fails if the due
/// buffer does not wake the applier (the helper below never reports), if
/// the call applies at `DUE_CALLS` although there is an applier, or if
/// nothing applies an overdue buffer (it fills to `CALLS`).
#[test]
fn a_due_buffer_wakes_the_applier_and_its_call_goes_on() {
    let b = Buffered::new(Box::new(Predictive::new()));
    let plain = Predictive::new();
    let held = |b: &Buffered| b.reg.this_thread(|x| x.lock().n).unwrap();
    let mut rnd = xorshift(7);
    let mut last = vec![0u64; 330];
    let mut t = 0u64;
    let mut step = |b: &Buffered, t: &mut u64| {
        *t += 1;
        let (class, keys, writes) = call(*t, &mut rnd);
        for k in &keys {
            last[(k / MB2) as usize] = *t;
        }
        plain.on_access(*t, class, &keys, &writes);
        b.on_access(*t, class, &keys, &writes);
        b.after_call();
    };
    let (woken_tx, woken_rx) = mpsc::channel();
    std::thread::scope(|s| {
        // here, so that a failure below drops it and the helper ends
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let bb = &b;
        let h = s.spawn(move || {
            // an applier that reports its wake-up, then applies when told
            std::thread::park();
            let _ = woken_tx.send(());
            if go_rx.recv().is_ok() {
                bb.apply_deferred();
            }
        });
        b.set_applier(h.thread().clone());
        let mut max_held = 0;
        for _ in 0..4 * CALLS {
            step(&b, &mut t);
            let n = held(&b);
            assert!(
                n < OVERDUE_CALLS,
                "call {t}: {n} calls held after after_call"
            );
            max_held = max_held.max(n);
        }
        // the call went on past due: its own thread applied only when overdue
        assert_eq!(
            max_held,
            OVERDUE_CALLS - 1,
            "the call applied before overdue"
        );
        let woken = woken_rx.recv_timeout(Duration::from_secs(10));
        if woken.is_err() {
            // let the helper end (the scope waits for it)
            h.thread().unpark();
        }
        woken.expect("the due buffer did not wake the applier");
        // buffered again up to due: the applier takes it
        while held(&b) < DUE_CALLS {
            step(&b, &mut t);
        }
        go_tx.send(()).unwrap();
        h.join().unwrap();
        assert_eq!(held(&b), 0, "the applier did not apply");
    });
    same_decisions(&plain, &b, t + 1, &last, "applier");
}

/// `after_call_flag` is the due flag `after_call` reads (the residency
/// skips `after_call` while it is clear): clear while no buffer is due, set
/// by the call that makes one due (no applier thread: its own thread
/// applies after the call), clear again once `after_call` applied them.
/// Fails if the flag handed out is not the one `note_due` sets (the
/// residency would then skip every `after_call`).
#[test]
fn the_after_call_flag_is_set_while_a_buffer_is_due() {
    let b = Buffered::new(Box::new(Lru::new()));
    let f = b.after_call_flag().expect("a flag");
    for t in 1..DUE_CALLS as u64 {
        b.on_access(t, 0, &[t * MB2], &[Touch::READ]);
    }
    assert!(!f.load(Relaxed), "not due yet");
    b.on_access(DUE_CALLS as u64, 0, &[MB2], &[Touch::READ]);
    assert!(f.load(Relaxed), "due");
    b.after_call();
    assert!(!f.load(Relaxed), "applied");
}

/// `merge_order` gives what sorting gives: lists in clock order with
/// runs long and short, ties between lists, empty lists, and lists out of
/// order (sorted instead), for up to more lists than it merges.
#[test]
fn the_merge_order_is_the_sorted_order() {
    let mut rnd = xorshift(0x2545_f491_4f6c_dd1d);
    let (mut order, mut heads, mut sorted) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..400 {
        let lists = 1 + rnd(MERGE_LISTS as u64 + 3) as usize;
        let mut taken: Vec<Box<Calls>> = Vec::new();
        let mut clock = 0;
        for _ in 0..lists {
            let mut c = Calls::boxed();
            let n = rnd(40) as usize;
            for _ in 0..n {
                // ticks shared between lists (ties), runs of many calls, and
                // now and then one out of order
                clock += rnd(3);
                let now = if round % 5 == 0 && rnd(20) == 0 {
                    rnd(clock + 1)
                } else {
                    clock
                };
                c.push(now, 0, &[1], &[Touch::READ]);
            }
            if rnd(2) == 0 {
                clock = clock.saturating_sub(rnd(30));
            }
            taken.push(c);
        }
        merge_order(&taken, &mut order, &mut heads);
        sort_order(&taken, &mut sorted);
        assert_eq!(order, sorted, "round {round}");
    }
}
