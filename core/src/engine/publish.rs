//! The background publisher: every U3M_HOT_INTERVAL_MS it writes the hottest
//! chunks to the stats segment, so `u3m top` can show them without reading
//! the heat table. It reads only; the hot path never waits for it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

use super::Engine;
use crate::shm::{mono_ns, HotEntry, HOT_CAPACITY};

#[derive(Default)]
pub struct Publisher {
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Publisher {
    pub fn start(&self, e: &'static Engine) {
        let interval = Duration::from_millis(e.cfg.hot_interval_ms);
        let h = std::thread::Builder::new()
            .name("u3m-publish".into())
            .spawn(move || {
                // tier work runs every 20 ms; the hot table at its own interval
                let tick = Duration::from_millis(20).min(interval);
                let mut since = Duration::ZERO;
                while !e.publisher.stop.load(Ordering::Acquire) {
                    std::thread::sleep(tick);
                    // a panic here must not leave the hooks passing calls
                    // through on memory the helper was moving (failure.rs)
                    let ticked =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| e.tier_tick()));
                    if ticked.is_err() {
                        e.background_failed();
                        return;
                    }
                    since += tick;
                    if since >= interval {
                        since = Duration::ZERO;
                        publish_once(e);
                    }
                }
            });
        if let (Ok(h), Ok(mut t)) = (h, self.thread.lock()) {
            *t = Some(h);
        }
    }

    pub fn stop(&self) {
        // do not join: exit must not wait up to an interval (and a forked
        // child's copy of the thread does not exist)
        self.stop.store(true, Ordering::Release);
    }

    pub fn forget_after_fork(&self) {
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
