//! Look-ahead prefetch (issue 10 part 3): after each tracked call, the
//! chunks the policy predicts within the next `depth` calls that live only
//! in DRAM start their copy-ins on u3m's host-to-device stream, so the call
//! that needs them finds them resident (or waits only for the rest of a copy
//! already under way: `after_copy_ins`).
//!
//! Under pressure a prefetch evicts, but only by Belady's rule on the
//! policy's predictions: a victim whose predicted next use is later than the
//! prefetched chunk's and than the end of the window (a dirty victim — it
//! costs a copy-out too — only when it is needed over twice as late). A
//! victim needed inside the window would come back within it: in a loop that
//! fits the window, swapping by the bare rule moves every chunk once per
//! loop where demand paging by MIN moves the excess only. A victim the policy cannot date, one
//! pinned by a call in flight, one whose last use has not completed, and one
//! the current call needs are never taken. The look-ahead never waits: a
//! chunk it cannot place now stays pending for the next call.
//!
//! The depth adapts. Each batch of copy-ins carries an event; the ticks from
//! issue to the event seen complete are the link's delivery time measured
//! in calls (`lag`). The look-ahead goes deeper while the link drains what
//! it was given before the next call (it could carry more) and it is not
//! short of room; it goes back to the distance of the first chunk it could
//! not place for want of a later-used victim (deeper than HBM can hold
//! would only evict what is needed sooner); and it never drops below twice
//! the measured lag. Bounds: `MIN_DEPTH`..`MAX_DEPTH` ticks.
//!
//! The look-ahead checks that its predictions pay: while fewer than
//! `TRUST` of the chunks it (or the background prefetch) brought in are
//! used before they leave HBM again, every such copy is link time taken
//! from the copies calls wait for, and it only probes (one chunk every
//! `PROBE_EVERY` calls) until the share recovers.
//!
//! Policies that do not know *when* (lru, seed-heat, markov) name no
//! upcoming chunks: the look-ahead then does nothing.

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::Ordering::Relaxed;

use super::evict::{Protect, COPY_OUT_DEPTH};
use super::state::{Host, State};
use super::Shard as Residency;
use crate::engine::runtime::CHUNK;

/// Bounds of the look-ahead depth, logical ticks.
pub const MIN_DEPTH: u64 = 8;
pub const MAX_DEPTH: u64 = 4096;
/// Copy-ins one call's look-ahead may issue (bounds the work on a call's
/// path; the next call continues).
const MAX_PER_CALL: usize = 64;
/// The share of prefetched chunks that must be used before they leave HBM
/// for the look-ahead to run at full rate; below it the predictions are
/// worse than the link they would cost, and the look-ahead only probes: one
/// chunk per `PROBE_EVERY` calls, to notice when they improve.
const TRUST: f64 = 0.75;
const PROBE_EVERY: u32 = 32;
/// Verdicts (used or wasted) before the share is judged; until then at most
/// this many prefetched chunks await theirs.
const JUDGE: f64 = 32.0;
/// Batches in flight before the look-ahead stops issuing (the link is that
/// far behind: more would only queue).
const MAX_INFLIGHT: usize = 64;

/// Per-device look-ahead state (a field of `Dev`).
pub(super) struct Ahead {
    /// Current depth, ticks.
    pub depth: u64,
    /// The policy was asked for the chunks due up to this tick.
    pub frontier: u64,
    /// Predicted chunks not acted on yet: (tick, key). Filled from the
    /// policy's `upcoming` as the window moves, and by every chunk that
    /// leaves HBM predicted inside the window already asked for (a chunk is
    /// resident when its prediction is made — it was just used — and
    /// becomes a candidate only when it leaves).
    pub pending: BTreeSet<(u64, u64)>,
    /// Copy-in batches in flight: (event, tick issued); the event holds a
    /// reference of its own.
    pub inflight: VecDeque<(u64, u64)>,
    /// EMA of the ticks from issue to the batch's event seen complete.
    pub lag: f64,
    /// `upcoming`'s buffer (reused).
    pub buf: Vec<(u64, u64)>,
    /// Prefetched chunks used and wasted (left HBM unused), recently (both
    /// halved now and then), and the counters' values last seen.
    pub hits: f64,
    pub wasted: f64,
    pub seen: (u64, u64),
    /// Calls since the last probe while the predictions are not trusted.
    pub since_probe: u32,
}

impl Ahead {
    pub const fn new() -> Ahead {
        Ahead {
            depth: MIN_DEPTH * 4,
            frontier: 0,
            pending: BTreeSet::new(),
            inflight: VecDeque::new(),
            lag: 0.0,
            buf: Vec::new(),
            hits: 0.0,
            wasted: 0.0,
            seen: (0, 0),
            since_probe: 0,
        }
    }
}

/// Why a prefetch got no HBM.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum NoRoom {
    /// No victim is predicted later than the chunk: HBM holds what is
    /// needed sooner.
    Full,
    /// HBM is coming (a copy-out in flight) or the runtime refused: later.
    Later,
}

impl Residency {
    /// Turns the look-ahead prefetch on or off (on by default).
    pub fn set_look_ahead(&self, on: bool) {
        self.ahead_off.store(!on, Relaxed);
    }

    /// The look-ahead depth of `dev` now, ticks.
    pub fn look_ahead_depth(&self, dev: u32) -> u64 {
        self.st
            .lock()
            .map(|st| st.dev(dev).ahead.depth)
            .unwrap_or(0)
    }

    /// The look-ahead after a call that touched `chunks` (lock held; at
    /// once when nothing is held in DRAM: nothing to bring back).
    pub(super) fn look_ahead_after(&self, st: &mut State, chunks: &[(u64, u32)]) {
        if self.ahead_off.load(Relaxed) || st.dram.used() == 0 {
            return;
        }
        if let Some(dev) = chunks.first().and_then(|c| st.backings.get(&c.0)) {
            let dev = dev.dev;
            self.look_ahead(st, dev, chunks);
        }
    }

    /// The look-ahead after a call on `dev` (lock held): measure, extend the
    /// window, issue copy-ins, adapt the depth. `protect`: the chunks of the
    /// call just launched.
    pub(super) fn look_ahead(&self, st: &mut State, dev: u32, protect: &[(u64, u32)]) {
        if self.ahead_off.load(Relaxed) || st.dev(dev).lost {
            return;
        }
        let now = st.clock;
        // 0. are the predictions worth the link? (prefetched chunks used vs
        // gone unused, either prefetch)
        let (h, w) = (
            self.c.prefetch_hits.load(Relaxed),
            self.c.prefetch_wasted.load(Relaxed),
        );
        let per_call = {
            let a = &mut st.dev_mut(dev).ahead;
            a.hits += h.saturating_sub(a.seen.0) as f64;
            a.wasted += w.saturating_sub(a.seen.1) as f64;
            a.seen = (h, w);
            if a.hits + a.wasted > 1024.0 {
                a.hits /= 2.0;
                a.wasted /= 2.0;
            }
            if a.hits + a.wasted < JUDGE {
                // not judged yet: at most JUDGE prefetched chunks awaiting
                // their verdict (used, or gone unused) at a time
                let open = self
                    .c
                    .prefetches
                    .load(Relaxed)
                    .saturating_sub(h)
                    .saturating_sub(w);
                let room = (JUDGE as u64).saturating_sub(open) as usize;
                if room == 0 {
                    return;
                }
                room.min(MAX_PER_CALL)
            } else if a.hits >= TRUST * (a.hits + a.wasted) {
                a.since_probe = 0;
                MAX_PER_CALL
            } else {
                a.since_probe += 1;
                if a.since_probe < PROBE_EVERY {
                    return;
                }
                a.since_probe = 0;
                // predictions made while it idled may lie inside the window
                // asked for before: ask for the whole window again
                a.frontier = now;
                self.c.ahead_probes.fetch_add(1, Relaxed);
                1
            }
        };
        // 1. batches the link delivered: their delay in ticks
        let mut was_busy = false;
        while let Some(&(ev, t0)) = st.dev(dev).ahead.inflight.front() {
            match self.rt.event_done(ev) {
                Ok(false) => {
                    was_busy = true;
                    break;
                }
                r => {
                    st.dev_mut(dev).ahead.inflight.pop_front();
                    st.unref_event(ev);
                    if r.is_ok() {
                        let a = &mut st.dev_mut(dev).ahead;
                        a.lag = 0.8 * a.lag + 0.2 * now.saturating_sub(t0) as f64;
                    }
                }
            }
        }
        // 2. the window: chunks due up to now + depth not asked for yet —
        // asked for once half the window has passed, not at every call
        let depth = st.dev(dev).ahead.depth;
        let end = now.saturating_add(depth);
        let from = st.dev(dev).ahead.frontier.max(now);
        if from <= now.saturating_add(depth / 2) {
            let mut buf = std::mem::take(&mut st.dev_mut(dev).ahead.buf);
            buf.clear();
            self.policy.upcoming(from, end - from, &mut buf);
            let a = &mut st.dev_mut(dev).ahead;
            a.pending.extend(buf.iter().copied());
            a.frontier = end;
            a.buf = buf;
        }
        if st.dev(dev).ahead.pending.is_empty() {
            if !was_busy {
                self.deepen(st, dev);
            }
            return;
        }
        // 3. copy-ins, soonest first
        let mut filled: Vec<(u64, u32)> = Vec::new();
        let mut blocked: Option<(u64, NoRoom)> = None;
        let inflight_full = st.dev(dev).ahead.inflight.len() >= MAX_INFLIGHT;
        let mut stream = 0;
        // the call's chunks, summarised at the first copy-in asked for
        let mut prot = None;
        while let Some(&(t, key)) = st.dev(dev).ahead.pending.first() {
            if t <= now {
                // due: the call itself brings it in if it is absent
                st.dev_mut(dev).ahead.pending.pop_first();
                continue;
            }
            let Some((id, i)) = st.resolve(key) else {
                st.dev_mut(dev).ahead.pending.pop_first();
                continue;
            };
            let b = &st.backings[&id];
            let c = &b.chunks[i as usize];
            if b.dev != dev
                || b.pinned
                || b.vas.is_empty()
                || c.phys != 0
                || c.pins != 0
                || !matches!(c.host, Some(Host::Dram(_)))
            {
                // resident already (it comes back if it leaves), or
                // nothing this path can copy
                st.dev_mut(dev).ahead.pending.pop_first();
                continue;
            }
            if inflight_full || filled.len() >= per_call {
                break;
            }
            if stream == 0 {
                match self.dev_stream(st, dev) {
                    Ok(s) => stream = s,
                    Err(_) => break,
                }
            }
            let p = prot.get_or_insert_with(|| Protect::new(protect));
            let phys = match self.ahead_phys(st, dev, t, p) {
                Ok(p) => p,
                Err(why) => {
                    blocked = Some((t, why));
                    break;
                }
            };
            if !self.ahead_copy_in(st, id, i, phys, stream, now) {
                break;
            }
            st.dev_mut(dev).ahead.pending.pop_first();
            filled.push((id, i));
        }
        if !filled.is_empty() {
            // pinned while the batch had no use event yet: a later victim
            // search of this round must not take them
            for &(id, i) in &filled {
                let c = st.chunk_mut(id, i);
                c.pins = c.pins.saturating_sub(1);
                st.mark(id, i);
            }
            match self.use_event(st, stream) {
                Some(ev) => {
                    for &(id, i) in &filled {
                        st.set_use(id, i, stream, ev);
                    }
                    // the creation reference stays with the in-flight entry
                    st.dev_mut(dev).ahead.inflight.push_back((ev, now));
                }
                // no event: order everything after the copies the hard way
                None => {
                    let _ = self.rt.sync_stream(stream);
                }
            }
            let n = filled.len() as u64;
            self.c.prefetches.fetch_add(n, Relaxed);
            self.c.prefetch_bytes.fetch_add(n * CHUNK, Relaxed);
            self.c.ahead_prefetches.fetch_add(n, Relaxed);
        }
        // 4. the depth
        match blocked {
            Some((t, NoRoom::Full)) => {
                self.c.ahead_full.fetch_add(1, Relaxed);
                let a = &mut st.dev_mut(dev).ahead;
                let floor = (2.0 * a.lag).ceil() as u64;
                a.depth = (t - now).max(floor).clamp(MIN_DEPTH, MAX_DEPTH);
            }
            Some((_, NoRoom::Later)) => {}
            None if !was_busy && st.dev(dev).ahead.pending.is_empty() => self.deepen(st, dev),
            None => {}
        }
        let d = st.dev(dev).ahead.depth;
        self.c.ahead_depth.store(d, Relaxed);
    }

    /// Chunk `key` of `dev` left HBM: if the policy expects it inside the
    /// window already asked for, it becomes a candidate again.
    pub(super) fn ahead_note_left(&self, st: &mut State, dev: u32, key: u64) {
        if self.ahead_off.load(Relaxed) {
            return;
        }
        let now = st.clock;
        let frontier = st.dev(dev).ahead.frontier;
        if frontier <= now {
            return;
        }
        if let Some(t) = self.policy.next_use(now, key) {
            if t > now && t <= frontier {
                st.dev_mut(dev).ahead.pending.insert((t, key));
            }
        }
    }

    /// A prefetched chunk left HBM before any call used it: the look-ahead
    /// reached further than HBM holds (or than the predictions hold): a
    /// little shallower.
    pub(super) fn ahead_wasted(&self, st: &mut State, dev: u32) {
        let a = &mut st.dev_mut(dev).ahead;
        a.depth = (a.depth - a.depth / 16).max(MIN_DEPTH);
    }

    /// The link drained everything it was given and every predicted chunk
    /// in the window is placed: look further.
    fn deepen(&self, st: &mut State, dev: u32) {
        let a = &mut st.dev_mut(dev).ahead;
        a.depth = (a.depth + a.depth / 4).clamp(MIN_DEPTH, MAX_DEPTH);
        self.c.ahead_depth.store(a.depth, Relaxed);
    }

    /// HBM for a chunk predicted at tick `t`: free memory, else one victim
    /// by Belady's rule on predictions (`evict_ahead`). Never waits.
    fn ahead_phys(
        &self,
        st: &mut State,
        dev: u32,
        t: u64,
        protect: &Protect<'_>,
    ) -> Result<u64, NoRoom> {
        for _ in 0..4 {
            self.harvest(st, dev, 1);
            let room = self
                .rt
                .mem_info()
                .map(|(free, _)| free >= CHUNK)
                .unwrap_or(false);
            if room {
                return self
                    .rt
                    .malloc_physical(dev, CHUNK)
                    .map_err(|_| NoRoom::Later);
            }
            if st.dev(dev).outgoing.len() >= COPY_OUT_DEPTH {
                return Err(NoRoom::Later);
            }
            let beyond = st.clock.saturating_add(st.dev(dev).ahead.depth);
            match self.evict_ahead(st, dev, t, beyond, protect) {
                // a clean victim's HBM is free now
                Some(false) => continue,
                // a dirty one's once its copy-out lands
                Some(true) => return Err(NoRoom::Later),
                None => return Err(NoRoom::Full),
            }
        }
        Err(NoRoom::Later)
    }

    /// Issues the copy-in of chunk (id, i) from its DRAM copy into `phys` on
    /// `stream`; the chunk is resident (clean, its DRAM copy kept) from now.
    fn ahead_copy_in(
        &self,
        st: &mut State,
        id: u64,
        i: u32,
        phys: u64,
        stream: u64,
        now: u64,
    ) -> bool {
        if !self.dram_copy_in(st, id, i, phys, stream, now) {
            return false;
        }
        // until the batch's use event is recorded (`look_ahead`)
        st.chunk_mut(id, i).pins += 1;
        st.mark(id, i);
        true
    }
}
