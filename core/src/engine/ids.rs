//! Small stable ids for stream handles (trace `stream=<n>`), assigned in order
//! of first use; lock-free (a fixed open-addressing table of handle -> id).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const SLOTS: usize = 4096;

pub struct SmallIds {
    keys: Box<[AtomicU64]>,
    vals: Box<[AtomicU32]>,
    next: AtomicU32,
}

impl SmallIds {
    pub fn new() -> SmallIds {
        SmallIds {
            keys: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            vals: (0..SLOTS).map(|_| AtomicU32::new(u32::MAX)).collect(),
            next: AtomicU32::new(1),
        }
    }

    /// 0 for the NULL (default) stream; 1, 2, ... for others in order of
    /// first use. A full table maps further handles to 0 (the trace stays
    /// valid; only the stream split is lost).
    pub fn get(&self, handle: u64) -> u32 {
        if handle == 0 {
            return 0;
        }
        let mut i = (handle.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) as usize % SLOTS;
        for _ in 0..SLOTS {
            let k = self.keys[i].load(Ordering::Acquire);
            if k == handle {
                loop {
                    let v = self.vals[i].load(Ordering::Acquire);
                    if v != u32::MAX {
                        return v;
                    }
                    std::hint::spin_loop(); // the inserting thread is about to publish it
                }
            }
            if k == 0
                && self.keys[i]
                    .compare_exchange(0, handle, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                let id = self.next.fetch_add(1, Ordering::Relaxed);
                self.vals[i].store(id, Ordering::Release);
                return id;
            }
            if self.keys[i].load(Ordering::Acquire) == handle {
                continue; // lost the race to the same handle: re-read this slot
            }
            i = (i + 1) % SLOTS;
        }
        0
    }
}

impl Default for SmallIds {
    fn default() -> Self {
        SmallIds::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_ordered() {
        let s = SmallIds::new();
        assert_eq!(s.get(0), 0);
        assert_eq!(s.get(0x5000), 1);
        assert_eq!(s.get(0x7000), 2);
        assert_eq!(s.get(0x5000), 1);
    }
}
