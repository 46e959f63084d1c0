//! Evictions an outside schedule names: a chunk the schedule has out of
//! HBM after its last use before a gap is evicted as soon as that use is
//! complete, before any fault-in needs the room — as the schedule's
//! physics have it (bench/pipeline_bound.py: a chunk out between two uses
//! leaves at the gap's start). Two sources name them:
//! - `u3m replay --policy plan`: a policy whose `Placement::plan_out` says
//!   which chunks are out; the replay's driver calls `evict_planned` after
//!   each call;
//! - U3M_PLAN (schedule.rs), in the library or the replay: `finish` of the
//!   call an entry names (`follow_schedule`); a chunk used again since is
//!   back in (its `last` is later than the call's clock).
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
use std::sync::Arc;

use super::state::State;
use super::{schedule::Entry, Followed, Shard as Residency};
use crate::policy::Touch;

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
            if !st.may_plan_out(id, i) {
                continue;
            }
            if st.dev(self.shard).planned.len() < PLANNED_MAX {
                // (0: ask the policy whether it is still out)
                st.dev_mut(self.shard).planned.push_back((id, i, 0));
            }
        }
        // (this state is one device's: `Shard::shard`)
        if !st.dev(self.shard).lost {
            self.evict_planned_on(st, self.shard);
        }
    }

    /// U3M_PLAN, after the call at `clock` is queued on this device (with
    /// the lock held, from `finish`): the schedule's chunks for it, which the
    /// call touched (`chunks`), are noted as out and the noted ones leave as
    /// their uses allow. An entry naming a chunk the call did not touch
    /// means the schedule is not this run's: it stops for good.
    // (out of every call's path: only a run with U3M_PLAN comes here)
    #[inline(never)]
    pub(super) fn follow_schedule(
        &self,
        st: &mut State,
        f: &Arc<Followed>,
        clock: u64,
        (chunks, touches): (&[(u64, u32)], &[Touch]),
        stream: Option<u64>,
    ) {
        let dev = self.shard;
        if f.auto.is_some() {
            self.auto_note(st, f, clock, (chunks, touches), stream);
        }
        let entries = match (f.off.load(Relaxed), f.plan.get()) {
            // (what was noted before it stopped still leaves)
            (false, Some(plan)) => plan.at(dev, clock),
            _ => &[][..],
        };
        for e in entries {
            if !chunks.contains(&(e.id, e.chunk)) {
                self.stop_schedule(f, e, clock);
                break;
            }
            if st.may_plan_out(e.id, e.chunk) && st.dev(dev).planned.len() < PLANNED_MAX {
                st.dev_mut(dev).planned.push_back((e.id, e.chunk, clock));
                self.c.schedule_entries.fetch_add(1, Relaxed);
            }
        }
        if !st.dev(dev).planned.is_empty() && !st.dev(dev).lost {
            self.evict_planned_on(st, dev);
        }
    }

    /// The first entry the run does not match (at the call `clock`; the
    /// entry's own call differs under `repeat`): the schedule stops (what
    /// was noted still leaves) and the reason waits for the engine's line.
    #[cold]
    fn stop_schedule(&self, f: &Followed, e: &Entry, clock: u64) {
        if f.off.swap(true, Relaxed) {
            return;
        }
        let (dev, alloc) = super::schedule::ordinal_of(e.id);
        let repeated = match e.clock == clock {
            true => String::new(),
            false => format!(" (the entry's call {}, repeated)", e.clock),
        };
        let name = f.plan.get().map_or("", |p| p.name.as_str());
        let why = format!(
            "U3M_PLAN={}:{}: call {clock}{repeated} does not touch chunk {} of allocation {alloc} on device {dev}: \
             the run left the schedule (the schedule is not this run's, or its loop ended); \
             followed up to there ({} entries), not after",
            name,
            e.line,
            e.chunk,
            self.c.schedule_entries.load(Relaxed)
        );
        if let Ok(mut s) = f.stopped.lock() {
            *s = Some(why);
        }
        self.c.schedule_stops.fetch_add(1, Relaxed);
    }

    /// U3M_PLAN=auto, before a plan: the call is detected and recorded
    /// (autoplan.rs); a recorded, timed step goes to the planning thread.
    #[cold]
    fn auto_note(
        &self,
        st: &mut State,
        f: &Arc<Followed>,
        clock: u64,
        (chunks, touches): (&[(u64, u32)], &[Touch]),
        stream: Option<u64>,
    ) {
        let dev = self.shard;
        let cap = st.dev(dev).capacity / crate::engine::runtime::CHUNK;
        let rec = st
            .auto_rec
            .get_or_insert_with(|| Box::new(super::autoplan::Recorder::new()));
        let rt: &dyn crate::engine::runtime::Runtime = self.rt;
        super::autoplan::note_call(rec, f, rt, (dev, cap, clock), (chunks, touches), stream);
    }

    fn evict_planned_on(&self, st: &mut State, dev: u32) {
        let ordered = self.may_order_after_program();
        while ordered || st.dev(dev).outgoing.len() < PLANNED_DEPTH {
            let Some(&(id, i, armed)) = st.dev(dev).planned.front() else {
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
            let used_since = c.last > armed;
            st.dev_mut(dev).planned.pop_front();
            // (a later call may have brought it back into the plan's HBM)
            let out = match armed {
                0 => self.policy.plan_out(key),
                _ => !used_since,
            };
            if !out {
                continue;
            }
            if self.evict(st, id, i).is_err() {
                break;
            }
            self.c.planned_outs.fetch_add(1, Relaxed);
        }
    }
}
