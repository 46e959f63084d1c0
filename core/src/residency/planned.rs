//! Evictions an outside schedule names (`u3m replay --policy plan`): a
//! policy whose `Placement::plan_out` says a chunk leaves HBM after its
//! last use before a gap has it evicted as soon as that use is complete,
//! before any fault-in needs the room — as the schedule's physics have it
//! (bench/pipeline_bound.py: a chunk out between two uses leaves at the
//! gap's start). Only `u3m replay`'s driver calls it, after each call
//! (`evict_planned`): the library's hooks and `finish` know nothing of it.
//!
//! The chunks the schedule has out from that call on are noted in last-use
//! order (`Dev::planned`); the oldest noted ones whose
//! uses are complete leave as ordinary evictions (`evict`: a clean one
//! dropped, a dirty one copied out asynchronously on u3m's device-to-host
//! stream), while fewer than `PLANNED_DEPTH` copy-outs are in flight. A
//! copy-out starts only once the chunk's uses are complete, as every
//! eviction's does; a chunk needed again before its copy lands is taken
//! back (`rescue`).

use std::sync::atomic::Ordering::Relaxed;

use super::state::State;
use super::Shard as Residency;

/// Copy-outs in flight on a device (any cause) under which a planned one
/// may start: past a fault-in's own bound (`evict::COPY_OUT_DEPTH`, 16), so
/// that planned copy-outs do not hold up the ones a fault-in waits for.
const PLANNED_DEPTH: usize = 64;
/// Chunks noted per device, at most (a bound on the list, not a tuning).
const PLANNED_MAX: usize = 1 << 16;

impl Residency {
    /// After a call: `keys` (policy keys of chunks it touched) are out of
    /// HBM from now in the schedule — noted, in order — and the noted
    /// chunks whose uses are complete leave (see the module doc). Called by
    /// `u3m replay`'s driver after each call while a schedule runs (an
    /// empty `keys` only evicts), never by the library's hooks: `finish`,
    /// every call's path, does nothing for it.
    pub fn evict_planned(&self, keys: &[u64]) {
        let Ok(mut st) = self.st.lock() else {
            return;
        };
        let st = &mut *st;
        for &k in keys {
            let Some((id, i)) = st.resolve(k) else {
                continue;
            };
            let b = &st.backings[&id];
            let c = &b.chunks[i as usize];
            if b.pinned || !c.in_hbm() || c.out_ev != 0 || c.unfilled {
                continue;
            }
            if st.dev(self.shard).planned.len() < PLANNED_MAX {
                st.dev_mut(self.shard).planned.push_back((id, i));
            }
        }
        // (this state is one device's: `Shard::shard`)
        if !st.dev(self.shard).lost {
            self.evict_planned_on(st, self.shard);
        }
    }

    fn evict_planned_on(&self, st: &mut State, dev: u32) {
        let ordered = self.may_order_after_program();
        while ordered || st.dev(dev).outgoing.len() < PLANNED_DEPTH {
            let Some(&(id, i)) = st.dev(dev).planned.front() else {
                break;
            };
            let Some(b) = st
                .backings
                .get(&id)
                .filter(|b| (i as usize) < b.chunks.len())
            else {
                st.dev_mut(dev).planned.pop_front();
                continue;
            };
            let c = &b.chunks[i as usize];
            if b.pinned || !c.may_leave() || c.unfilled {
                // used again, taken, or gone meanwhile
                st.dev_mut(dev).planned.pop_front();
                continue;
            }
            // (the list is in last-use order: behind a busy one, the rest
            // are busy too, or nearly)
            if !ordered
                && c.uses
                    .iter()
                    .any(|&(_, ev)| !self.rt.event_done(ev).unwrap_or(true))
            {
                break;
            }
            let key = b.key(id, i);
            st.dev_mut(dev).planned.pop_front();
            // (a later call may have brought it back into the plan's HBM)
            if !self.policy.plan_out(key) {
                continue;
            }
            if self.evict(st, id, i).is_err() {
                break;
            }
            self.c.planned_outs.fetch_add(1, Relaxed);
        }
    }
}
