//! The call protocol: before a call, every chunk its ranges cover is made
//! resident and pinned (`prepare`); after it, the pins go and the use is
//! recorded as an event on the call's stream (`finish`). Ordering: the
//! caller's stream waits on u3m's copy events (or the host waits, for a
//! synchronous or captured call); an eviction waits for every use event.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use super::hostmap::Oversize;
use super::migrate::Arriving;
use super::state::{dev_index, key_of, Chunk, KeptAt, StGuard, State};
use super::{Fail, Shard as Residency, E_ALLOC, E_DEVICE_LOST};
use crate::acl::AclError;
use crate::config::ReadOnce;
use crate::engine::runtime::CHUNK;
use crate::engine::Range;
use crate::perthread::Here;
use crate::policy::Touch;
use crate::shm::layout::stall_bucket;

/// A call in progress: the chunks it pinned and whether it writes each.
/// A call of one chunk (the common call: `prepare_resident`) holds it
/// inline (`one`), with no vector taken from the pool and given back; any
/// other holds its chunks in `list` and `list_writes`.
#[derive(Default)]
pub struct Token {
    /// `one_chunk` and `one_write` hold the call's only chunk.
    one: bool,
    one_chunk: [(u64, u32); 1],
    one_write: [Touch; 1],
    /// With `one`: the chunk's address as `prepare` found it (0: none) and
    /// its backing's device, for `finish_in` without a look-up of the
    /// backing. Used only while the state's kept VA entry (`Vas::kept`) is
    /// still of that backing: a backing leaves `backings` only after its
    /// VA entries left `vas` (every change of which forgets the kept
    /// entry), ids are never reused, and a backing's chunk vector is never
    /// reallocated (made whole in `Backing::new`), so a kept entry of the
    /// same id means the same chunk vector, alive.
    one_at: usize,
    one_dev: u32,
    /// The logical clock `prepare` gave the call (U3M_PLAN's entries are
    /// by it: schedule.rs).
    clock: u64,
    list: Vec<(u64, u32)>,
    list_writes: Vec<Touch>,
}

impl Token {
    /// Whether the call touches managed memory at all.
    pub fn is_empty(&self) -> bool {
        !self.one && self.list.is_empty()
    }

    /// The chunks pinned: (backing id, index).
    #[inline(always)]
    pub(super) fn chunks(&self) -> &[(u64, u32)] {
        if self.one {
            &self.one_chunk
        } else {
            &self.list
        }
    }

    /// How the call touches each chunk of `chunks`.
    #[inline(always)]
    pub(super) fn writes(&self) -> &[Touch] {
        if self.one {
            &self.one_write
        } else {
            &self.list_writes
        }
    }

    /// Whether it holds a buffer of its own (the pool's: `finish_in` gives
    /// them back).
    #[inline(always)]
    pub(super) fn holds_buffers(&self) -> bool {
        self.list.capacity() != 0 || self.list_writes.capacity() != 0
    }

    /// Empties it (buffers kept).
    #[inline(always)]
    fn clear(&mut self) {
        self.one = false;
        self.list.clear();
        self.list_writes.clear();
    }
}

/// How the caller's stream must be ordered after fault-ins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// The call is queued on this stream: it waits on u3m's copy event.
    Stream(u64),
    /// The call is synchronous, or its stream is being captured: the host
    /// waits for the copies before the call (no work added to the stream).
    Host,
}

/// A chunk a call needs: (backing id, index, the call overwrites it whole).
pub(super) type Need = (u64, u32, bool);

/// Pushes the chunks of backing `id` (mapped at `start`, `len` bytes) that
/// range `r` (ending at `end`) covers: (id, index, overwritten whole,
/// written). Overwritten whole: `r` writes every byte of the chunk (`r.whole`,
/// or `overwrite`: every write of the call is whole) — and only if every
/// other range covering it does too (a read or a partial write of it keeps
/// its copy-in). A chunk equal to the last one pushed is merged into it (whole
/// only if both are, written if either is); `sorted` turns false when a
/// chunk comes before the last one pushed.
/// Whether range `r`, covering [lo, hi), overwrites the chunk starting at
/// `cs` whole: it covers all of it, and the call writes it whole (`r.whole`)
/// or every write of the call is whole (`overwrite`: a copy or memset).
#[inline(always)]
fn writes_whole(r: &Range, overwrite: bool, lo: u64, hi: u64, cs: u64) -> bool {
    (overwrite || r.whole) && r.write && lo <= cs && hi >= cs + CHUNK
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn push_chunks(
    all: &mut Vec<(u64, u32, bool, bool)>,
    sorted: &mut bool,
    id: u64,
    r: &Range,
    start: u64,
    len: u64,
    end: u64,
    overwrite: bool,
) {
    let lo = r.addr.max(start) - start;
    let hi = end.min(start + len) - start;
    for i in lo / CHUNK..hi.div_ceil(CHUNK) {
        let cs = i * CHUNK;
        let whole = writes_whole(r, overwrite, lo, hi, cs);
        let i = i as u32;
        if let Some(k) = all.last_mut() {
            if (k.0, k.1) == (id, i) {
                k.2 &= whole;
                k.3 |= r.write;
                continue;
            }
            if (k.0, k.1) > (id, i) {
                *sorted = false;
            }
        }
        all.push((id, i, whole, r.write));
    }
}

/// A call uses chunk `c` (pinned for it): its pin, clock, reuse distance
/// and read-only passes (`clock`, `touches`: the call's; `hbm_chunks`: its
/// device's HBM in chunks). Returns 1 when the background prefetch brought
/// it back and this is its first use since (a prefetch hit), else 0.
#[inline(always)]
fn note_use(c: &mut Chunk, clock: u64, touches: u64, write: bool, hbm_chunks: u64) -> u64 {
    c.pins += 1;
    // its previous reuse distance (0: first use)
    c.reuse = if c.last == 0 {
        0
    } else {
        touches.saturating_sub(c.last_touches)
    };
    c.last = clock;
    c.last_touches = touches;
    // read-only passes since the last write (hostmap.rs)
    if write {
        c.ro_uses = 0;
    } else if c.reuse > hbm_chunks {
        c.ro_uses = c.ro_uses.saturating_add(1);
    }
    std::mem::take(&mut c.prefetched) as u64
}

/// The most chunks `prepare_resident` takes: a call of more goes the
/// general path.
const FAST_CHUNKS: usize = 8;

impl Residency {
    /// Before a call touching `ranges`: every chunk they cover is resident
    /// and pinned. `overwrite`: write ranges replace whole chunks' contents
    /// (copies, memsets), so those chunks need no copy-in.
    /// `class`: the operator class of the call (OpClass as u8), for the policy.
    pub fn prepare(
        &self,
        dev: u32,
        class: u8,
        ranges: &[Range],
        overwrite: bool,
        order: Order,
    ) -> Result<Token, AclError> {
        let mut tok = Token::default();
        self.prepare_timed(&mut tok, dev, class, ranges, overwrite, order, None)
            .0
            .map(|()| tok)
    }

    /// [`prepare`](Self::prepare) into the caller's `tok` (empty on entry;
    /// filled in place, not moved through the callers: it is on the path
    /// of every call), and how long the call stalled in it (ns): from the
    /// moment it had to wait for the residency lock, found a chunk to move
    /// or wait for, or a copy-in in flight to wait for, to its end. None
    /// when it met none of these — the common call, which then reads no
    /// clock. On an error `tok` is left empty (nothing pinned). `here`: the
    /// calling thread's `LAST` if looked up already (perthread.rs), for the
    /// policy's `on_access_here`.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub fn prepare_timed(
        &self,
        tok: &mut Token,
        dev: u32,
        class: u8,
        ranges: &[Range],
        overwrite: bool,
        order: Order,
        here: Option<Here>,
    ) -> (Result<(), AclError>, Option<u64>) {
        let mut t0 = None;
        let r = self.prepare_in(tok, dev, class, ranges, overwrite, order, &mut t0, here);
        if r.is_err() {
            tok.clear();
        }
        (r, t0.map(|t| crate::shm::mono_ns().saturating_sub(t)))
    }

    /// The token a call fills: the caller's own if it has room already,
    /// else one finished calls gave back (no allocation per call).
    #[inline(always)]
    fn pooled_token(st: &mut State, tok: &mut Token) {
        debug_assert!(tok.is_empty());
        if !tok.holds_buffers() {
            if let Some(t) = st.tokens.pop() {
                // the token replaced owns no memory: nothing to drop (an
                // out-of-line drop call otherwise, on every call's path)
                std::mem::forget(std::mem::replace(tok, t));
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn prepare_in(
        &self,
        tok: &mut Token,
        dev: u32,
        class: u8,
        ranges: &[Range],
        overwrite: bool,
        order: Order,
        t0: &mut Option<u64>,
        here: Option<Here>,
    ) -> Result<(), AclError> {
        if !self.may_be_managed(ranges) {
            // nothing u3m manages (small allocations, host memory): no lock
            return Ok(());
        }
        let mut st = match self.st.try_lock() {
            Ok(st) => st,
            Err(std::sync::TryLockError::WouldBlock) => {
                *t0 = Some(crate::shm::mono_ns());
                self.st.lock().map_err(|_| E_ALLOC)?
            }
            Err(std::sync::TryLockError::Poisoned(_)) => return Err(E_ALLOC),
        };
        // the common call: one chunk, in the VA entry the last call kept,
        // resident with nothing to wait for (the general path's result, with
        // none of its vectors). The general path stays here, in this frame:
        // out of line, the calls that miss `prepare_one` (a memset or copy
        // outside the kept entry) paid a second call's frame and arguments,
        // +64 Ir per memset_sync call, against 4 Ir fewer per aclop call.
        if self.prepare_one(&mut st, tok, dev, class, ranges, overwrite, here) {
            return Ok(());
        }
        // every (chunk, range) the call covers, then merged per chunk: a
        // chunk is overwritten whole only if every range covering it does,
        // written if any does
        let mut all = std::mem::take(&mut st.call_chunks);
        all.clear();
        let mut ranges_seen = 0;
        // the VA entry the previous range was found in, (start, id, len,
        // real handle): an operator's ranges are mostly carved out of one
        // allocation, and a range inside it needs no walk of `vas`
        // (kept across calls under the lock: the next call's first range is
        // mostly in the same allocation; every change of `vas` or of a
        // backing's `real` forgets it: state.rs `Vas`)
        let mut last = st.vas.kept();
        // a walk of `vas` found a new entry to keep
        let mut found = false;
        // chunks pushed in ascending (id, index) order, a repeat merged
        // into the one before: then no sort is needed
        let mut sorted = true;
        for r in ranges {
            if r.len == 0 {
                continue;
            }
            let end = r.addr.saturating_add(r.len);
            let before = all.len();
            match last {
                Some((start, id, len, real)) if r.addr >= start && end <= start + len => {
                    if real {
                        continue;
                    }
                    // a range inside the chunk pushed last (an operator's
                    // small tensors): merged into it as `push_chunks` would
                    // (`lo`, `hi` lie in that chunk, so it is overwritten
                    // whole only if the range is exactly the chunk)
                    let (lo, hi) = (r.addr - start, end - start);
                    let first = lo / CHUNK;
                    if let Some(k) = all.last_mut() {
                        if hi > lo && (hi - 1) / CHUNK == first && (k.0, k.1) == (id, first as u32)
                        {
                            let cs = first * CHUNK;
                            k.2 &=
                                (overwrite || r.whole) && r.write && lo == cs && hi == cs + CHUNK;
                            k.3 |= r.write;
                            continue;
                        }
                    }
                    push_chunks(&mut all, &mut sorted, id, r, start, len, end, overwrite);
                }
                _ => {
                    for (&start, &(id, len)) in st.vas.range(..end).rev() {
                        if start + len <= r.addr {
                            break;
                        }
                        // a real handle: always in HBM
                        let real = st.backings.get(&id).map(|b| b.real() != 0).unwrap_or(false);
                        last = Some((start, id, len, real));
                        found = true;
                        if !real {
                            push_chunks(&mut all, &mut sorted, id, r, start, len, end, overwrite);
                        }
                    }
                }
            }
            ranges_seen += (all.len() > before) as u32;
        }
        if let (true, Some(e)) = (found, last) {
            // with what the next call's one-chunk path reads of its backing
            let at = if e.3 {
                None
            } else {
                st.backings.get_mut(&e.1).map(|b| b.kept_at())
            };
            st.vas.keep_at(e, at);
        }
        if all.is_empty() {
            st.call_chunks = all;
            return Ok(());
        }
        // one range covers each chunk once; several may overlap (chunks
        // pushed in order are merged already: see push_chunks)
        if ranges_seen > 1 && !sorted {
            all.sort_unstable_by_key(|c| (c.0, c.1));
            all.dedup_by(|c, kept| {
                let same = c.0 == kept.0 && c.1 == kept.1;
                if same {
                    kept.2 &= c.2;
                    kept.3 |= c.3;
                }
                same
            });
        }
        // the common call: every chunk in HBM, nothing in flight for it
        if !self.lost_any.load(Relaxed)
            && self.read_once != ReadOnce::Probe
            && self.prepare_resident::<FAST_CHUNKS>(&mut st, tok, dev, class, &all, None, here)
        {
            st.call_chunks = all;
            return Ok(());
        }
        let mut need = std::mem::take(&mut st.call_need);
        need.clear();
        Self::pooled_token(&mut st, tok);
        for &(id, i, whole, write) in &all {
            need.push((id, i, whole));
            tok.list.push((id, i));
            tok.list_writes.push(Touch::new(write, whole));
        }
        st.call_chunks = all;
        // nothing runs on a lost device (checked only once one is lost)
        if self.lost_any.load(Relaxed)
            && (st.dev(dev).lost || need.iter().any(|n| st.backing_lost(n.0)))
        {
            return Err(E_DEVICE_LOST);
        }
        // a call whose chunks cannot all be resident at once never runs on
        // what is not accessible: the excess is host-mapped (U3M_HOST_MAP),
        // or the call is refused before anything moves (checked when
        // something must move)
        let mut over = None;
        // the common case: every chunk in HBM with no copy-out in flight
        // (fault_in would find nothing to do for any of them)
        // (and whether one of them has a use on its device's copy-in
        // stream: a copy-in maybe still in flight, which `after_copy_ins`
        // or `wait_copy_ins` must look at; none: both would find nothing)
        let mut copy_ins = false;
        let resident = need.iter().all(|n| {
            let b = &st.backings[&n.0];
            let c = &b.chunks[n.1 as usize];
            let own = st.dev(b.dev).stream;
            copy_ins |= own != 0 && c.uses.iter().any(|u| u.0 == own);
            c.in_hbm() && c.out_ev == 0 && (!c.unfilled || n.2)
        });
        // the read-once probe may move chunks: look again after it
        let copy_ins = copy_ins || self.read_once == ReadOnce::Probe;
        let absent = !resident && need.iter().any(|n| !st.chunk(n.0, n.1).in_hbm());
        if self.read_once == ReadOnce::Probe {
            if let Order::Stream(s) = order {
                self.probe_tick(&mut st, dev, s);
            }
        }
        if absent {
            if let Err(o) = self.check_fits(&st, dev, &tok.list) {
                if !self.host_map {
                    self.refuse_oversize(o);
                    return Err(E_ALLOC);
                }
                over = Some(o);
            }
        }
        // other threads' calls pin what they use only briefly, but they need
        // this lock to unpin: on Busy let them run, then try again. A call
        // may wait a few times per chunk it needs (a victim's copy-out, a
        // copy-out of its own, a use), so the cap grows with its size: a
        // call of thousands of chunks on a full HBM is not refused midway
        let mut tries = 0;
        let max_tries = 2000 + 4 * need.len();
        // when this call met its first absent chunk (fault_in notes it in
        // the state; taken before the lock is dropped for a retry)
        st.stall_from = None;
        let mut stall_from = None;
        // chunks made resident for this call, pinned across retries
        let mut reserved: Vec<(u64, u32)> = Vec::new();
        // U3M_HOST_MAP=probe or stream: reads of host-mapped chunks served in place
        // by the last try (counted once the call goes ahead)
        let mut stream_reads = 0;
        // nothing to move (a host-mapped chunk is not resident: the read-once
        // streams' reads in place take the loop): only the copy-ins still in
        // flight for these chunks order the call
        let fast = resident;
        if !fast && t0.is_none() {
            *t0 = Some(crate::shm::mono_ns());
        }
        // a host-ordered call's own copy-ins, waited for without the lock
        let mut arriving = Arriving::default();
        // the chunks its evictions must not take, summarised once for all
        // its tries (`fault_in`)
        let mut protect = None;
        let host = order == Order::Host;
        loop {
            if fast {
                // nothing in flight for these chunks: nothing orders the call
                let mut settled = !copy_ins;
                if host && !settled {
                    let r;
                    (st, r) = self.wait_copy_ins(st, &need, &mut arriving, &mut reserved, t0);
                    settled = r?;
                }
                if !settled {
                    self.after_copy_ins(&mut st, &need, order, t0)?;
                }
                break;
            }
            let r = match over {
                None if absent && self.read_once != ReadOnce::Off => {
                    let map = self.read_once_maps(&st);
                    match self.map_streams(&mut st, dev, &need, &tok.list_writes, map) {
                        Ok((mapped, reads)) => {
                            stream_reads = reads;
                            let rest: Vec<Need> = need
                                .iter()
                                .copied()
                                .filter(|n| mapped.binary_search(&(n.0, n.1)).is_err())
                                .collect();
                            let a = host.then_some(&mut arriving);
                            self.fault_in(&mut st, &rest, dev, order, &mut reserved, a, &mut None)
                        }
                        Err(e) => Err(e),
                    }
                }
                None => {
                    let a = host.then_some(&mut arriving);
                    self.fault_in(&mut st, &need, dev, order, &mut reserved, a, &mut protect)
                }
                Some(o) => match self.map_to_host(&mut st, dev, &need, o.need - o.room) {
                    Ok(mapped) => {
                        let rest: Vec<Need> = need
                            .iter()
                            .copied()
                            .filter(|n| !mapped.contains(&(n.0, n.1)))
                            .collect();
                        let a = host.then_some(&mut arriving);
                        self.fault_in(&mut st, &rest, dev, order, &mut reserved, a, &mut None)
                    }
                    Err(Fail::Acl(e)) => {
                        self.refuse_oversize(Oversize {
                            host_map_failed: Some(e),
                            ..o
                        });
                        Err(Fail::Acl(E_ALLOC))
                    }
                    Err(e) => Err(e),
                },
            };
            stall_from = stall_from.or(st.stall_from.take());
            match r {
                Ok(()) => {
                    let mut settled = false;
                    if host {
                        let r;
                        (st, r) = self.wait_copy_ins(st, &need, &mut arriving, &mut reserved, t0);
                        match r {
                            Ok(s) => settled = s,
                            Err(e) => {
                                self.release_reserved(&mut st, &mut reserved);
                                return Err(e);
                            }
                        }
                    }
                    if !settled {
                        if let Err(e) = self.after_copy_ins(&mut st, &need, order, t0) {
                            self.release_reserved(&mut st, &mut reserved);
                            return Err(e);
                        }
                    }
                    // the call goes ahead: `note_use` pins its chunks
                    self.unreserve(&mut st, &mut reserved);
                    break;
                }
                Err(Fail::Busy) if tries < max_tries => {
                    self.demand.fetch_add(1, Relaxed);
                    // copy-ins already issued for this call carry a use
                    // event (fault_in): the retry orders itself after them
                    let wait = st.wait_for.take();
                    // keep what this call holds only while it waits for one
                    // of u3m's copy-outs (done without the host); a use
                    // event may need another thread's call, which may need
                    // this HBM
                    // (a chunk mapped unfilled for it stays mapped: another
                    // call reading it gives it back first, an eviction drops
                    // it without a copy-out — `Chunk::unfilled`)
                    if !wait.map(|ev| self.is_copy_out(&st, ev)).unwrap_or(false) {
                        self.unreserve(&mut st, &mut reserved);
                    }
                    // a reference while unlocked: the event cannot go back to
                    // the pool and be recorded again for other work meanwhile
                    let wait = wait.filter(|ev| st.event_refs.contains_key(ev));
                    if let Some(r) = wait.and_then(|ev| st.event_refs.get_mut(&ev)) {
                        *r += 1;
                    }
                    drop(st);
                    match wait {
                        // the oldest use of the coldest chunk, or the oldest
                        // copy-out: wait for it unlocked
                        Some(ev) => {
                            let _ = self.rt.sync_event(ev);
                        }
                        None => std::thread::sleep(std::time::Duration::from_micros(500)),
                    }
                    st = self.st.lock().map_err(|_| E_ALLOC)?;
                    if let Some(ev) = wait {
                        st.unref_event(ev);
                    }
                    tries += 1;
                }
                Err(e) => {
                    // copy-ins issued before the failure must not outlive
                    // the chunks they write (nothing else orders them)
                    let stream = st.dev(dev).stream;
                    if stream != 0 {
                        st = self.settle_failed_copy_ins(st, dev, stream, &reserved);
                    }
                    self.release_reserved(&mut st, &mut reserved);
                    return Err(e.acl());
                }
            }
        }
        // from the first absent chunk to all resident: the call's fault-in
        // stall (no clock read when nothing was absent)
        if let Some(t0) = stall_from {
            let ns = crate::shm::mono_ns().saturating_sub(t0);
            self.c.stall_count.fetch_add(1, Relaxed);
            self.c.stall_ns.fetch_add(ns, Relaxed);
            self.c.stall_buckets[stall_bucket(ns)].fetch_add(1, Relaxed);
        }
        if stream_reads != 0 {
            self.c.stream_reads.fetch_add(stream_reads, Relaxed);
        }
        st.clock = self.clock.fetch_add(1, Relaxed) + 1;
        let touches = st.touches;
        st.touches += tok.list.len() as u64;
        let clock = st.clock;
        tok.clock = clock;
        st.call_need = need;
        let mut keys = std::mem::take(&mut st.call_keys);
        keys.clear();
        let mut hits = 0;
        let hbm_chunks = st.dev(dev).capacity / CHUNK;
        for (k, &(id, i)) in tok.list.iter().enumerate() {
            if let Some(b) = st.backings.get_mut(&id) {
                keys.push(b.key(id, i));
                if let Some(c) = b.chunks.get_mut(i as usize) {
                    hits += note_use(c, clock, touches, tok.list_writes[k].writes(), hbm_chunks);
                }
            }
        }
        if hits != 0 {
            self.c.prefetch_hits.fetch_add(hits, Relaxed);
        }
        if keys.len() == tok.list_writes.len() {
            self.policy.on_access(clock, class, &keys, &tok.list_writes);
        }
        // the kept victim order re-keys them before its next eviction (evict.rs)
        st.dev_mut(dev).order.note_touched(&keys);
        st.call_keys = keys;
        Ok(())
    }

    /// `prepare` of a call whose ranges (those not empty) all lie in one
    /// chunk of the VA entry the last call kept (`Vas::kept`, not a real
    /// handle), that chunk resident with nothing to move or wait for
    /// (`prepare_resident`'s conditions), on a state with no lost device and
    /// no read-once probe. Does exactly what the general path does for such
    /// a call — the chunk's (overwritten whole, written) merged over the
    /// ranges as `push_chunks` and the merge in `prepare_in` do, then
    /// `prepare_resident` of that one chunk — without the call's chunk
    /// vector or a walk. false (and no change at all) for any other call:
    /// the general path then decides.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn prepare_one(
        &self,
        st: &mut State,
        tok: &mut Token,
        dev: u32,
        class: u8,
        ranges: &[Range],
        overwrite: bool,
        here: Option<Here>,
    ) -> bool {
        let Some(((start, id, len, false), at)) = st.vas.kept_at() else {
            return false;
        };
        // the first range not empty names the chunk: [cs, ce) its bytes in
        // the entry (a range in it covers no other chunk: `push_chunks`
        // pushes only it, and the ranges after it merge into it)
        let Some(k0) = ranges.iter().position(|r| r.len != 0) else {
            return false;
        };
        let a0 = ranges[k0].addr;
        if a0 < start {
            return false;
        }
        let i = (a0 - start) / CHUNK;
        if i > u32::MAX as u64 {
            return false;
        }
        let cs = start + i * CHUNK;
        let ce = cs.saturating_add(CHUNK).min(start.saturating_add(len));
        // (past the entry's end: every range fails the test below)
        if ce <= cs {
            return false;
        }
        let span = ce - cs;
        // overwritten whole if every range is (`writes_whole`: in [cs, ce),
        // it must be the whole chunk); written if any range writes
        let (mut whole, mut write) = (true, false);
        for r in &ranges[k0..] {
            if r.len == 0 {
                continue;
            }
            // in [cs, ce): one compare for the start (below `cs` wraps to
            // past `span`), then the length against what is left, so the
            // end cannot overflow (a range the old saturating test took only
            // when `ce` itself saturated now goes the general path, which
            // decides the same)
            let off = r.addr.wrapping_sub(cs);
            if off >= span || r.len > span - off {
                return false;
            }
            let end = r.addr + r.len;
            whole = whole && writes_whole(r, overwrite, r.addr, end, cs);
            write |= r.write;
        }
        // (asked last: a call that misses here asks again on the general path)
        if self.lost_any.load(Relaxed) || self.read_once == ReadOnce::Probe {
            return false;
        }
        self.prepare_resident::<1>(
            st,
            tok,
            dev,
            class,
            &[(id, i as u32, whole, write)],
            Some(at),
            here,
        )
    }

    /// `prepare` of a call none of whose chunks has anything to move or
    /// wait for: each in HBM, no copy-out of it in flight, no use of it on
    /// its device's copy-in stream (a copy-in maybe in flight) — exactly the
    /// calls the general path finds `resident` with no `copy_ins`, for which
    /// it only pins and notes the use. Does that with one look-up per chunk
    /// and nothing else; None (and no change at all) when a chunk does not
    /// qualify or the call has more than `FAST_CHUNKS` chunks: the general
    /// path then decides. Not for a lost device or the read-once probe
    /// (the caller checks). true: done, `tok` filled. `MAX`: the most
    /// chunks the caller can pass (`FAST_CHUNKS`, or 1 from `prepare_one`:
    /// its arrays are then one entry, not eight to zero on every call).
    #[inline(always)]
    fn prepare_resident<const MAX: usize>(
        &self,
        st: &mut State,
        tok: &mut Token,
        dev: u32,
        class: u8,
        all: &[(u64, u32, bool, bool)],
        at: Option<KeptAt>,
        here: Option<Here>,
    ) -> bool {
        if all.len() > MAX.min(FAST_CHUNKS) {
            return false;
        }
        let mut found = [std::ptr::null_mut::<Chunk>(); MAX];
        let mut keys_of = [0u64; MAX];
        let mut dev0 = 0;
        for (k, &(id, i, whole, _)) in all.iter().enumerate() {
            let (bdev, key, c) = match at {
                // `prepare_one`: the first (only) chunk's backing is the
                // kept entry's, read when it was kept (state.rs `KeptAt`)
                Some(a) if k == 0 => {
                    if i as usize >= a.n {
                        return false;
                    }
                    #[cfg(test)]
                    {
                        let b = st.backings.get(&id).expect("kept backing");
                        assert!(a.dev == b.dev && a.n == b.chunks.len());
                        assert!(key_of(a.first_va, id, i) == b.key(id, i));
                        assert!(std::ptr::eq(
                            (a.chunks as *const Chunk).wrapping_add(i as usize),
                            &b.chunks[i as usize]
                        ));
                    }
                    // SAFETY: chunk `i` of the kept entry's backing, alive
                    // and not moved since it was kept (`KeptAt`); the lock
                    // is held and no other reference to it exists
                    let c = unsafe { &mut *(a.chunks as *mut Chunk).add(i as usize) };
                    (a.dev, key_of(a.first_va, id, i), c)
                }
                _ => {
                    let Some(b) = st.backings.get_mut(&id) else {
                        return false;
                    };
                    let (bdev, key) = (b.dev, b.key(id, i));
                    let Some(c) = b.chunks.get_mut(i as usize) else {
                        return false;
                    };
                    (bdev, key, c)
                }
            };
            if k == 0 {
                dev0 = bdev;
            }
            let own = st.devs[dev_index(bdev)].stream;
            keys_of[k] = key;
            if !c.in_hbm()
                || c.out_ev != 0
                || (c.unfilled && !whole)
                || (own != 0 && c.uses.iter().any(|u| u.0 == own))
            {
                return false;
            }
            found[k] = c;
        }
        st.stall_from = None;
        // one chunk: held in the token itself; more: in the pool's vectors
        if let [(id, i, whole, write)] = *all {
            tok.one = true;
            tok.one_chunk = [(id, i)];
            tok.one_write = [Touch::new(write, whole)];
            tok.one_at = found[0] as usize;
            tok.one_dev = dev0;
        } else {
            Self::pooled_token(st, tok);
            for &(id, i, whole, write) in all {
                tok.list.push((id, i));
                tok.list_writes.push(Touch::new(write, whole));
            }
        }
        st.clock = self.clock.fetch_add(1, Relaxed) + 1;
        let touches = st.touches;
        st.touches += all.len() as u64;
        let clock = st.clock;
        tok.clock = clock;
        let hbm_chunks = st.devs[dev_index(dev)].capacity / CHUNK;
        let mut hits = 0;
        for (k, &(_, _, _, write)) in all.iter().enumerate() {
            // SAFETY: `found[k]` points into a backing's chunk vector, found
            // above under this same lock; nothing since has touched
            // `st.backings` (only other fields of the state), so it is live
            // and no other reference to it exists
            let c = unsafe { &mut *found[k] };
            hits += note_use(c, clock, touches, write, hbm_chunks);
        }
        if hits != 0 {
            self.c.prefetch_hits.fetch_add(hits, Relaxed);
        }
        // the policy keys, in the chunks' order (as `tok.writes()`)
        let keys = &keys_of[..all.len()];
        match self.buffered.get() {
            Some(b) => b.access_here(here, clock, class, keys, tok.writes()),
            None => self
                .policy
                .on_access_here(here, clock, class, keys, tok.writes()),
        }
        // the kept victim order re-keys them before its next eviction (evict.rs)
        st.devs[dev_index(dev)].order.note_touched(keys);
        true
    }

    /// Notes `[va, va+len)` entered in `State::vas` (with the lock held,
    /// before the program can use the address): `may_be_managed` then
    /// covers it.
    pub(super) fn note_va(&self, va: u64, len: u64) {
        self.va_lo.fetch_min(va, Release);
        self.va_hi.fetch_max(va.saturating_add(len), Release);
    }

    /// false when no range of the call can overlap an entry of
    /// `State::vas`: they all lie outside every VA range u3m ever managed.
    /// The program uses an address only after the call that returned or
    /// mapped it, which noted it first (`note_va`), so a range in managed
    /// memory is never missed; a false positive only takes the lock.
    #[inline]
    fn may_be_managed(&self, ranges: &[Range]) -> bool {
        let (lo, hi) = (self.va_lo.load(Acquire), self.va_hi.load(Acquire));
        ranges
            .iter()
            .any(|r| r.len > 0 && r.addr < hi && r.addr.saturating_add(r.len) > lo)
    }

    /// After the call: unpin; on success note the use on `stream` (the
    /// stream's use fence, recorded when someone asks or after
    /// `FENCE_CALLS` calls: fence.rs) and the writes (host copies go stale).
    pub fn finish(&self, mut tok: Token, stream: Option<u64>, ok: bool) {
        self.finish_in(&mut tok, stream, ok);
    }

    /// [`finish`](Self::finish) of the caller's token, in place; `tok` is
    /// left empty (its buffers back in the pool when it has room).
    pub fn finish_in(&self, tok: &mut Token, stream: Option<u64>, ok: bool) {
        if tok.is_empty() {
            return;
        }
        let Ok(mut st) = self.st.lock() else { return };
        // the stream's use fence (fence.rs), not an event per call — but on
        // the default stream an event recorded now, as before fences: "stream
        // 0" is a different stream in every context, so a fence shared under
        // that name could be recorded on the wrong one
        let eager = stream == Some(0);
        let (ev, full) = match (ok, stream) {
            (true, Some(0)) => (self.use_event(&mut st, 0), false),
            (true, Some(s)) => match self.call_fence(&mut st, s) {
                Some((e, full)) => (Some(e), full),
                None => (None, false),
            },
            _ => (None, false),
        };
        // chunks that name the fence now (one that already did changes no count)
        let named = if tok.one {
            // one chunk (the common call): no slices, no loop; and where
            // prepare found it while the kept VA entry is still of its
            // backing (see `Token::one_at`), no look-up
            let (id, i) = tok.one_chunk[0];
            let at = match st.vas.kept() {
                Some((_, kid, _, false)) if kid == id && tok.one_at != 0 => {
                    Some((tok.one_dev, tok.one_at as *mut Chunk))
                }
                _ => None,
            };
            #[cfg(test)]
            if let Some((d, p)) = at {
                let b = st.backings.get_mut(&id).expect("kept backing");
                assert!(d == b.dev && std::ptr::eq(p, &b.chunks[i as usize]));
            }
            self.finish_chunk(&mut st, (id, i), tok.one_write[0], ok, ev, stream, at)
        } else {
            let mut named = 0u32;
            for (&c, &w) in tok.list.iter().zip(&tok.list_writes) {
                named += self.finish_chunk(&mut st, c, w, ok, ev, stream, None);
            }
            named
        };
        if let (Some(e), true) = (ev, named > 0) {
            *st.event_refs.entry(e).or_insert(0) += named;
        }
        if let (Some(e), true) = (ev, eager) {
            // the reference taken at creation
            st.unref_event(e);
        }
        if let (true, Some(s)) = (full, stream) {
            // recorded by the call that fills it, on the calls' own thread
            self.fences.close_stream(s);
        }
        // the call is queued: start the copy-ins the next calls will need
        if ok {
            self.look_ahead_after(&mut st, tok.chunks());
            if let Some(f) = &self.schedule {
                self.follow_schedule(&mut st, f, tok.clock, (tok.chunks(), tok.writes()), stream);
            }
        }
        if tok.one {
            tok.one = false;
            return;
        }
        tok.list.clear();
        tok.list_writes.clear();
        if st.tokens.len() < 64 {
            st.tokens.push(std::mem::take(tok));
        }
    }

    /// `finish_in` of one chunk of the call, (backing id, index), touched
    /// as `w` says: its pin goes; on success a write makes it dirty (its
    /// host copy stale) and the chunk names `ev` on `stream`. Returns 1 when
    /// it names `ev` now and did not before (a reference to count), else 0.
    /// `at`: the chunk and its backing's device, known live (see
    /// `Token::one_at`); None: looked up.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn finish_chunk(
        &self,
        st: &mut State,
        (id, i): (u64, u32),
        w: Touch,
        ok: bool,
        ev: Option<u64>,
        stream: Option<u64>,
        at: Option<(u32, *mut Chunk)>,
    ) -> u32 {
        let mut named = 0;
        let mut stale = None;
        let mut old = None;
        let mut dev = 0;
        let mut unfilled = false;
        let found = match at {
            // SAFETY: chunk `i` of backing `id`, alive and not moved since
            // `prepare` found it (`Token::one_at`); the state's lock is
            // held and no other reference to the chunk exists
            Some((d, p)) => Some((d, unsafe { &mut *p })),
            None => st
                .backings
                .get_mut(&id)
                .and_then(|b| Some((b.dev, b.chunks.get_mut(i as usize)?))),
        };
        if let Some((d, c)) = found {
            dev = d;
            c.pins = c.pins.saturating_sub(1);
            if ok && w.writes() {
                c.dirty = true;
                // (moved out only when there is one: most chunks in HBM
                // have no host copy)
                if c.host.is_some() {
                    stale = c.host.take();
                }
            }
            if c.unfilled && (ok || c.pins == 0) {
                c.unfilled = false;
                if !ok {
                    unfilled = true;
                }
            }
            if let (Some(e), Some(s)) = (ev, stream) {
                if let Some(u) = c.uses.iter_mut().find(|u| u.0 == s) {
                    if u.1 != e {
                        old = Some(u.1);
                        u.1 = e;
                        named = 1;
                    }
                } else {
                    c.uses.push((s, e));
                    named = 1;
                }
            }
        }
        if let Some(h) = stale {
            st.pending_free.push((dev, h));
        }
        if unfilled {
            // the call failed before writing it: back to its host copy
            self.unfilled_back(st, id, i);
        }
        if let Some(o) = old {
            // never the fence itself: it holds its opening reference
            st.unref_event(o);
        }
        named
    }

    /// The use fence a call on `stream` names (fence.rs): the stream's open
    /// fence, or a new one (a pooled, complete event or a new event, with
    /// one reference held until it is recorded). Also drops the references
    /// of fences recorded meanwhile. `.1`: the fence is full, record it.
    fn call_fence(&self, st: &mut State, stream: u64) -> Option<(u64, bool)> {
        // the fence joined is open: none of the closed ones (an event is
        // pooled again only once these references are dropped, below)
        let joined = self
            .fences
            .take_closed_and_join(stream, &mut st.closed_fences);
        // most calls hand over none: the vector is moved out and back only
        // when there are references to drop
        if !st.closed_fences.is_empty() {
            let mut closed = std::mem::take(&mut st.closed_fences);
            for ev in closed.drain(..) {
                st.unref_event(ev);
            }
            st.closed_fences = closed;
        }
        if let Some(f) = joined {
            return Some(f);
        }
        let ev = self.pooled_event(st)?;
        st.event_refs.insert(ev, 1);
        self.fences.open(stream, ev);
        Some((ev, false))
    }

    /// A complete event from the pool, or a new one.
    pub(super) fn pooled_event(&self, st: &mut State) -> Option<u64> {
        let mut k = 0;
        while k < st.free_events.len() {
            if self.rt.event_done(st.free_events[k]).unwrap_or(false) {
                return st.free_events.remove(k);
            }
            k += 1;
            if k >= 8 {
                break; // the oldest are first: no need to scan a long tail
            }
        }
        self.rt.create_event().ok()
    }

    /// An event recorded on `stream` now (u3m's own copies). Pooled events
    /// are reused only once complete: re-recording a pending event would let
    /// a stream that waits on its older record run ahead when the newer one
    /// completes.
    pub(super) fn use_event(&self, st: &mut State, stream: u64) -> Option<u64> {
        let ev = self.pooled_event(st)?;
        if self.rt.record_event(ev, stream).is_err() {
            st.free_events.push_back(ev);
            return None;
        }
        st.event_refs.insert(ev, 1);
        if stream != 0 && st.devs.iter().any(|d| d.stream == stream) {
            // (records on the stream are made under this state's lock: this
            // is their order)
            st.in_last += 1;
            st.in_order.insert(ev, (stream, st.in_last));
        }
        Some(ev)
    }

    /// `Order::Host`: waits without the lock for the copy-ins still in
    /// flight into the chunks `need` names — this call's own (`arriving`,
    /// one reference each) and those another call or the prefetch issued —
    /// instead of holding the device's lock across the host's wait. Every
    /// needed chunk with memory is pinned meanwhile, so no eviction, host
    /// mapping or rescue-by-reuse moves it (an eviction never takes a pinned
    /// chunk, nor one whose copy-in is pending: it is a use), and another
    /// call needing one of these chunks orders itself after the same events
    /// (`after_copy_ins`, or its own `wait_copy_ins`). The wait cannot
    /// depend on the host: u3m's stream holds only copies. After the wait
    /// the lock is retaken and the copy-ins looked for again (the pins kept
    /// the chunks in place, so normally none is left). A failed wait undoes
    /// this call's own copy-ins — out of HBM, the host copies the chunks'
    /// only ones — unless another call holds or has written one of them.
    /// Returns the guard (retaken) in every case, and Ok(true) when no
    /// copy-in is left in flight for these chunks (false: still some after
    /// a few rounds, for `after_copy_ins`).
    pub(super) fn wait_copy_ins<'a>(
        &'a self,
        mut st: StGuard<'a>,
        need: &[Need],
        arriving: &mut Arriving,
        reserved: &mut Vec<(u64, u32)>,
        t0: &mut Option<u64>,
    ) -> (StGuard<'a>, Result<bool, AclError>) {
        let mut evs = std::mem::take(&mut arriving.evs);
        let mut rounds = 0;
        loop {
            let known = evs.len();
            self.pending_copy_ins(&mut st, need, &mut evs);
            // a reference while unlocked: the event cannot go back to the
            // pool and be recorded again for other work meanwhile
            for &ev in &evs[known..] {
                *st.event_refs.entry(ev).or_insert(0) += 1;
            }
            if evs.is_empty() {
                break;
            }
            if rounds >= 3 {
                // (still pending after 3 rounds: after_copy_ins waits)
                for ev in evs.drain(..) {
                    st.unref_event(ev);
                }
                arriving.chunks.clear();
                return (st, Ok(false));
            }
            if t0.is_none() {
                *t0 = Some(crate::shm::mono_ns());
            }
            let mut held: Vec<(u64, u32)> = Vec::new();
            for &(id, i, _) in need {
                if let Some(c) = st
                    .backings
                    .get_mut(&id)
                    .and_then(|b| b.chunks.get_mut(i as usize))
                {
                    if c.phys != 0 {
                        c.pins += 1;
                        held.push((id, i));
                    }
                    st.mark(id, i);
                }
            }
            drop(st);
            let mut err = None;
            for &ev in &evs {
                if let Err(e) = self.rt.sync_event(ev) {
                    err.get_or_insert(e);
                }
            }
            st = match self.st.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            self.unreserve(&mut st, &mut held);
            for ev in evs.drain(..) {
                st.unref_event(ev);
            }
            if let Some(e) = err {
                for (id, i) in std::mem::take(&mut arriving.chunks) {
                    let mine = reserved.iter().filter(|&&r| r == (id, i)).count() as u32;
                    let undo = st
                        .backings
                        .get(&id)
                        .and_then(|b| b.chunks.get(i as usize))
                        .map(|c| c.in_hbm() && c.pins == mine && !c.dirty)
                        .unwrap_or(false);
                    if undo {
                        self.undo_fault_in(&mut st, id, i, reserved);
                    }
                }
                return (st, Err(e));
            }
            rounds += 1;
        }
        arriving.chunks.clear();
        (st, Ok(true))
    }

    /// Adds to `evs` the copy-ins still in flight on u3m's stream for the
    /// chunks `need` names (not already listed), and forgets those complete.
    fn pending_copy_ins(&self, st: &mut State, need: &[Need], evs: &mut Vec<u64>) {
        let mut done: Vec<(u64, u32, u64)> = Vec::new();
        for &(id, i, _) in need {
            let Some(b) = st.backings.get(&id) else {
                continue;
            };
            let own = st.dev(b.dev).stream;
            if own == 0 {
                continue;
            }
            for &(s, ev) in &b.chunks[i as usize].uses {
                if s != own || evs.contains(&ev) {
                    continue;
                }
                if self.rt.event_done(ev).unwrap_or(true) {
                    done.push((id, i, ev));
                } else {
                    evs.push(ev);
                }
            }
        }
        // a completed copy-in orders nothing any more: forget it, so later
        // calls on the chunk do not query the runtime for it again
        for (id, i, ev) in done {
            st.forget_use(id, i, ev);
        }
    }

    /// Orders the caller after copy-ins still in flight for chunks it needs
    /// that were already resident (issued by another call or the prefetch).
    /// `t0`: when the call began to stall (set here if it must wait).
    /// A host-ordered call has waited for them already (`wait_copy_ins`).
    fn after_copy_ins(
        &self,
        st: &mut State,
        need: &[Need],
        order: Order,
        t0: &mut Option<u64>,
    ) -> Result<(), AclError> {
        let mut evs: Vec<u64> = Vec::new();
        self.pending_copy_ins(st, need, &mut evs);
        if !evs.is_empty() && t0.is_none() {
            *t0 = Some(crate::shm::mono_ns());
        }
        for ev in evs {
            match order {
                Order::Stream(s) => self.rt.stream_wait(s, ev)?,
                // u3m's stream holds only copies: waiting for it with the
                // lock held cannot depend on work the host has yet to issue
                Order::Host => self.rt.sync_event(ev)?,
            }
        }
        Ok(())
    }

    /// After a `make_room` that found every candidate still in use: waits,
    /// without the lock, for the use the eviction named (`st.wait_for`: a
    /// use fence — recorded now if it was open — or a copy-out), as a busy
    /// `prepare` does. false: there was nothing to wait for.
    pub fn wait_busy(&self) -> bool {
        let wait = {
            let Ok(mut st) = self.st.lock() else {
                return false;
            };
            let wait = st
                .wait_for
                .take()
                .filter(|ev| st.event_refs.contains_key(ev));
            // a reference while unlocked: the event cannot be pooled and
            // recorded again for other work meanwhile
            if let Some(r) = wait.and_then(|ev| st.event_refs.get_mut(&ev)) {
                *r += 1;
            }
            wait
        };
        let Some(ev) = wait else { return false };
        let _ = self.rt.sync_event(ev);
        if let Ok(mut st) = self.st.lock() {
            st.unref_event(ev);
        }
        true
    }

    /// Makes every managed chunk of [addr, addr+len) resident and pins the
    /// backings for good (exported memory must stay where it is).
    pub fn pin_range(&self, dev: u32, addr: u64, len: u64) -> Result<(), AclError> {
        if !self.active() {
            return Ok(());
        }
        let tok = self.prepare(
            dev,
            crate::opclass::OpClass::Other as u8,
            &[Range {
                addr,
                len,
                write: false,
                whole: false,
            }],
            false,
            Order::Host,
        )?;
        if let Ok(mut st) = self.st.lock() {
            st.structure += 1;
            for &(id, _) in tok.chunks() {
                if let Some(b) = st.backings.get_mut(&id) {
                    b.pinned = true;
                }
            }
        }
        self.finish(tok, None, true);
        Ok(())
    }
}
