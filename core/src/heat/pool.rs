//! Index allocator for fixed-capacity slot arrays (allocation slots, chunk
//! records), used on the cold path only.
//!
//! A released index waits in a FIFO quarantine until `delay` other indices
//! have been released after it, and only then becomes reusable. Each reuse
//! starts a new epoch of the slot, and the hot path tells epochs apart by a
//! 16-bit tag; the quarantine means a stale toucher could only be fooled by
//! the same slot coming round 2^16 times during one touch, i.e. after
//! 2^16 · delay frees — see docs/heat.md. Reusable indices are taken LIFO so
//! that the memory in use stays near the live set.

use std::collections::VecDeque;

pub(crate) struct IndexPool {
    cap: u32,
    fresh: u32,
    delay: usize,
    quarantine: VecDeque<u32>,
    ready: Vec<u32>,
}

/// Quarantine length for a pool of `live` indices: 1024, or an eighth of a
/// small pool. Pools allocate `live + delay` slots so that `live` indices can
/// always be in use at once.
pub(crate) fn reuse_delay(live: usize) -> usize {
    (live / 8).clamp(1, 1024)
}

impl IndexPool {
    pub fn new(slots: usize, delay: usize) -> IndexPool {
        IndexPool {
            cap: slots.min(u32::MAX as usize) as u32,
            fresh: 0,
            delay,
            quarantine: VecDeque::new(),
            ready: Vec::new(),
        }
    }

    pub fn take(&mut self) -> Option<u32> {
        if let Some(i) = self.ready.pop() {
            return Some(i);
        }
        if self.fresh < self.cap {
            self.fresh += 1;
            return Some(self.fresh - 1);
        }
        None
    }

    pub fn give(&mut self, i: u32) {
        self.quarantine.push_back(i);
        while self.quarantine.len() > self.delay {
            if let Some(j) = self.quarantine.pop_front() {
                self.ready.push(j);
            }
        }
    }

    /// Indices ever handed out (slots whose memory may be committed).
    pub fn high_water(&self) -> u32 {
        self.fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quarantine_delays_reuse() {
        let mut p = IndexPool::new(4, 2);
        let a: Vec<u32> = (0..4).map(|_| p.take().unwrap()).collect();
        assert_eq!(a, vec![0, 1, 2, 3]);
        assert_eq!(p.take(), None);
        p.give(1);
        p.give(3);
        assert_eq!(p.take(), None, "two released, both still in quarantine");
        p.give(0);
        assert_eq!(p.take(), Some(1), "oldest leaves quarantine first");
        assert_eq!(p.take(), None);
    }

    #[test]
    fn delay_sizes() {
        assert_eq!(reuse_delay(1), 1);
        assert_eq!(reuse_delay(64), 8);
        assert_eq!(reuse_delay(1 << 20), 1024);
    }
}
