//! The cold path: allocations come and go, reservations are mapped and
//! unmapped, memory is pinned. Everything here runs under the table's mutex
//! and publishes to the lock-free structures in an order the hot path relies
//! on (see docs/heat.md, "The generation scheme").

use std::sync::atomic::Ordering::*;

use super::addr_map::{
    owner_word, ChunkSlot, Meta, CHUNK, MULTI_OWNERS, PAGE, PAGE_SHIFT, VA_LIMIT,
};
use super::alloc_table::AllocSlot;
use super::record::Raw;
use super::{
    chunk_base, info_word, overlap, AllocId, AllocInfo, AllocKind, Cold, HeatTable, Owner, PinMask,
    PinReason,
};

impl HeatTable {
    /// Live allocations overlapping `[start, end)`, in address order, as
    /// (index, base, len).
    pub(super) fn owners_in(&self, c: &Cold, start: u64, end: u64) -> Vec<(u32, u64, u64)> {
        self.owners_iter(c, start, end).collect()
    }

    /// [`owners_in`](Self::owners_in) without collecting (no allocation).
    pub(super) fn owners_iter<'a>(
        &'a self,
        c: &'a Cold,
        start: u64,
        end: u64,
    ) -> impl Iterator<Item = (u32, u64, u64)> + 'a {
        let before = c.by_base.range(..start).next_back().and_then(|(&b, &i)| {
            let l = self.slot(i).len.load(Relaxed);
            (b + l > start).then_some((i, b, l))
        });
        before.into_iter().chain(
            c.by_base
                .range(start..end)
                .map(move |(&b, &i)| (i, b, self.slot(i).len.load(Relaxed))),
        )
    }

    /// Live allocations overlapping `[start, end)`, last first, with one
    /// descent of `by_base` instead of [`owners_iter`](Self::owners_iter)'s
    /// two: live allocations never overlap, so their ends rise with their
    /// bases, and the first one found ending at or before `start` ends the
    /// walk.
    pub(super) fn owners_rev<'a>(
        &'a self,
        c: &'a Cold,
        start: u64,
        end: u64,
    ) -> impl Iterator<Item = (u32, u64, u64)> + 'a {
        c.by_base
            .range(..end)
            .rev()
            .map(move |(&b, &i)| (i, b, self.slot(i).len.load(Relaxed)))
            .take_while(move |&(_, b, l)| b + l > start)
    }

    pub(super) fn slot(&self, idx: u32) -> &AllocSlot {
        // Cold-path indices come from the pool, always in range.
        self.allocs.slot(idx).expect("allocation index in range")
    }

    pub(super) fn owner_list(&self, c: &Cold, chunk: u64) -> Vec<Owner> {
        self.owners_iter(c, chunk, chunk + CHUNK)
            .map(|(i, b, l)| (owner_word(i, self.slot(i).gen()), b, l))
            .collect()
    }

    /// Republish the owners of the chunk at `chunk` after a change.
    pub(super) fn refresh_chunk(&self, c: &Cold, cs: &ChunkSlot, chunk: u64) {
        let owners = self.owner_list(c, chunk);
        let pages = self.map.set_owners(cs, chunk, &owners);
        let mut m = Meta::load(cs);
        m.pages = pages;
        m.store(cs);
    }

    /// [`refresh_chunk`](Self::refresh_chunk) after the allocation
    /// `[s, e)` came or went (its `Meta` already counts it, or no longer
    /// does): when the chunk's page table holds the other owners
    /// (`Meta::pages`), only the pages of `[s, e)` are rewritten — an
    /// allocation and free of a small buffer next to a live one no longer
    /// rewrites all 512 pages of the chunk, twice.
    pub(super) fn refresh_span(&self, c: &Cold, cs: &ChunkSlot, chunk: u64, s: u64, e: u64) {
        let m = Meta::load(cs);
        if !m.pages || m.owners == 0 {
            return self.refresh_chunk(c, cs, chunk);
        }
        let (s, e) = (s.max(chunk), e.min(chunk + CHUNK));
        let p0 = ((s - chunk) >> PAGE_SHIFT) as usize;
        let p1 = ((e - 1 - chunk) >> PAGE_SHIFT) as usize + 1;
        let (ps, pe) = (chunk + p0 as u64 * PAGE, chunk + p1 as u64 * PAGE);
        let word = |(i, b, l): (u32, u64, u64)| (owner_word(i, self.slot(i).gen()), b, l);
        // the span's owners, in address order, on the stack: besides the
        // allocation that came, only those sharing its first or last page
        // (at most 2 × (MULTI_OWNERS - 1)) can overlap its pages, so a
        // malloc or free next to a live buffer allocates nothing here
        let mut near = [(0u64, 0u64, 0u64); 2 * MULTI_OWNERS];
        let mut n = 0;
        let mut far = None;
        for o in self.owners_rev(c, ps, pe) {
            if n == near.len() {
                // not reached while the page limit holds; correct anyway
                far = Some(
                    self.owners_iter(c, ps, pe)
                        .map(word)
                        .collect::<Vec<Owner>>(),
                );
                break;
            }
            near[n] = word(o);
            n += 1;
        }
        near[..n].reverse();
        let owners = far.as_deref().unwrap_or(&near[..n]);
        let single = if m.owners == 1 && owners.len() == 1 {
            // the one owner left is in the span
            owners[0].0
        } else if m.owners == 1 {
            self.owners_rev(c, chunk, chunk + CHUNK)
                .next()
                .map(|o| word(o).0)
                .unwrap_or(0)
        } else {
            0
        };
        if !self
            .map
            .set_owners_span(cs, chunk, owners, (p0, p1), m.owners, single)
        {
            self.refresh_chunk(c, cs, chunk);
        }
    }

    /// Record in place for `cs`, taking one from the pool if it has none.
    pub(super) fn ensure_chunk_rec(&self, c: &mut Cold, cs: &ChunkSlot) {
        if cs.rec.load(Relaxed) != 0 {
            return;
        }
        // The pool holds max_chunks + the reuse delay; the limit is max_chunks.
        let room = (c.chunks_tracked as usize) < self.config.max_chunks;
        match if room { c.chunk_pool.take() } else { None } {
            Some(ri) => {
                let e = self.chunk_recs[ri as usize].epoch.load(Relaxed) & 0xffff_ffff;
                cs.rec.store(e << 32 | (ri as u64 + 1), Release);
                c.chunks_tracked += 1;
            }
            None => c.chunks_untracked += 1,
        }
    }

    /// Close the chunk's record (its counts end with this occupancy);
    /// returns its final access count.
    pub(super) fn release_chunk_rec(&self, c: &mut Cold, cs: &ChunkSlot) -> u64 {
        let rw = cs.rec.swap(0, AcqRel);
        if rw == 0 {
            return 0;
        }
        let ri = (rw as u32 - 1) as usize;
        let r = &self.chunk_recs[ri];
        let e = r.epoch.load(Relaxed);
        let fin = r.rec.swap_epoch(e, e + 1);
        r.epoch.store((e + 1) & 0xffff_ffff, Relaxed);
        c.chunk_pool.give(ri as u32);
        c.chunks_tracked -= 1;
        fin.0[0]
    }

    /// Register a new allocation `[base, base+len)` on device `dev`. None if
    /// it overlaps a live allocation, the table is full, the range is empty
    /// or beyond [`VA_LIMIT`], more than [`MULTI_OWNERS`] allocations would
    /// share a 4 KiB page, or memory for the map runs out (all counted in
    /// `totals().failed_allocs`).
    pub fn on_alloc(&self, dev: u32, base: u64, len: u64, kind: AllocKind) -> Option<AllocId> {
        // calls buffered raw resolve against the map before this allocation
        self.before_map_change();
        let mut c = self.lock();
        let id = self.try_alloc(&mut c, dev, base, len, kind);
        if id.is_none() {
            c.failed_allocs += 1;
        }
        id
    }

    pub(super) fn try_alloc(
        &self,
        c: &mut Cold,
        dev: u32,
        base: u64,
        len: u64,
        kind: AllocKind,
    ) -> Option<AllocId> {
        let end = base.checked_add(len)?;
        if len == 0 || end > VA_LIMIT {
            return None;
        }
        // one walk over the live allocations overlapping the first to the
        // last page: one inside [base, end) is an overlap (refused); the
        // others share the first or the last page (at most MULTI_OWNERS - 1
        // each, so the walk is short)
        let pages = [base & !(PAGE - 1), (end - 1) & !(PAGE - 1)];
        let mut sharing = [0usize; 2];
        for (_, b, l) in self.owners_rev(c, pages[0], pages[1] + PAGE) {
            if b < end && b + l > base {
                return None;
            }
            for (n, p) in sharing.iter_mut().zip(pages) {
                *n += (b < p + PAGE && b + l > p) as usize;
            }
        }
        // Everything that can fail happens before anything is published.
        let (first_chunk, last_chunk) = (chunk_base(base), chunk_base(end - 1));
        let mut r = first_chunk >> 30;
        while r <= (end - 1) >> 30 {
            if self.map.ensure_region(r << 30)? {
                c.regions.push(r as usize);
            }
            r += 1;
        }
        // Only the first and last chunk (and page) can be shared.
        for (i, chunk) in [first_chunk, last_chunk].into_iter().enumerate() {
            if i == 1 && chunk == first_chunk {
                break; // one chunk: checked already
            }
            // the chunk's owner count (kept under this lock) says whether
            // anyone else is in it
            let cs = self.map.chunk(chunk)?;
            if Meta::load(cs).owners == 0 {
                continue;
            }
            let (mut multi, mut nm) = ([0usize; 2], 0);
            for (page, n) in pages.into_iter().zip(sharing) {
                if chunk_base(page) != chunk {
                    continue;
                }
                if n + 1 > MULTI_OWNERS {
                    return None;
                }
                if n > 0 {
                    multi[nm] = ((page - chunk) >> PAGE_SHIFT) as usize;
                    nm += 1;
                }
            }
            if !self.map.reserve_pages(cs, &multi[..nm]) {
                return None;
            }
        }
        if c.by_base.len() >= self.config.max_allocs {
            return None;
        }
        let idx = c.alloc_pool.take()?;
        let slot = self.slot(idx);
        let pins = if kind == AllocKind::HostAlias {
            PinReason::HostRegistered.bit()
        } else {
            0
        };
        let gen = slot.open(base, len, info_word(dev, kind, pins));
        c.by_base.insert(base, idx);
        let w = owner_word(idx, gen);
        let mut chunk = first_chunk;
        loop {
            let cs = self.map.chunk(chunk).expect("region installed above");
            let part = overlap(base, end, chunk, chunk + CHUNK);
            let mut m = Meta::load(cs);
            m.owners += 1;
            m.bytes += part as u32;
            if kind != AllocKind::Reserved {
                m.mapped = true;
            }
            m.pins |= pins;
            if m.pins != 0 {
                // Newly pinned chunks count whole; already pinned ones grow.
                c.pinned_bytes += if Meta::load(cs).pins == 0 {
                    m.bytes as u64
                } else {
                    part
                };
            }
            m.store(cs);
            if part == CHUNK {
                self.map.set_owners(cs, chunk, &[(w, base, len)]);
                let mut m = Meta::load(cs);
                m.pages = false;
                m.store(cs);
            } else {
                self.refresh_span(c, cs, chunk, base, end);
            }
            if kind != AllocKind::Reserved {
                self.ensure_chunk_rec(c, cs);
            }
            if chunk == last_chunk {
                break;
            }
            chunk += CHUNK;
        }
        match kind {
            AllocKind::Malloc => c.device_bytes += len,
            AllocKind::Reserved => c.reserved_bytes += len,
            AllocKind::HostAlias => c.host_alias_bytes += len,
        }
        Some(AllocId(idx, gen))
    }

    /// Unregister the allocation based at `base` (exactly); returns its final
    /// statistics. Its chunks lose it as owner (a chunk left empty ends its
    /// occupancy: record closed, mapped and pin marks cleared); its ranges go
    /// stale at once and are reused later.
    pub fn on_free(&self, base: u64) -> Option<AllocInfo> {
        // accesses buffered before the free count for this allocation
        self.drain();
        let mut c = self.lock();
        let Some(idx) = c.by_base.remove(&base) else {
            c.unknown_frees += 1;
            return None;
        };
        let slot = self.slot(idx);
        let len = slot.len.load(Relaxed);
        let info = slot.info.load(Relaxed);
        let mapped = slot.mapped.load(Relaxed);
        // Dead first: from here no reader resolves to it; then unpublish;
        // then close the record, which rejects touches still in flight.
        let gen = slot.kill();
        let end = base + len;
        let mut closed = 0;
        let mut chunk = chunk_base(base);
        while chunk < end {
            if let Some(cs) = self.map.chunk(chunk) {
                let part = overlap(base, end, chunk, chunk + CHUNK);
                let mut m = Meta::load(cs);
                m.owners = m.owners.saturating_sub(1);
                m.bytes = m.bytes.saturating_sub(part as u32);
                if m.pins != 0 {
                    c.pinned_bytes = c.pinned_bytes.saturating_sub(part);
                }
                if m.owners == 0 {
                    cs.owner.store(0, Release);
                    closed += self.release_chunk_rec(&mut c, cs);
                    Meta::default().store(cs);
                } else {
                    m.store(cs);
                    self.refresh_span(&c, cs, chunk, base, end);
                }
            }
            chunk += CHUNK;
        }
        let raw = slot.rec.swap_epoch(gen as u64, gen.wrapping_add(1) as u64);
        let kind = AllocKind::from_code(info >> 32 & 0xff);
        match kind {
            AllocKind::Malloc => c.device_bytes -= len,
            AllocKind::Reserved => {
                c.reserved_bytes -= len;
                c.mapped_bytes = c.mapped_bytes.saturating_sub(mapped);
            }
            AllocKind::HostAlias => c.host_alias_bytes -= len,
        }
        c.alloc_pool.give(idx);
        let mut fin = self.make_info(AllocId(idx, gen), base, len, info, mapped, raw);
        fin.closed_chunk_accesses = closed;
        Some(fin)
    }

    pub(super) fn make_info(
        &self,
        id: AllocId,
        base: u64,
        len: u64,
        info: u64,
        mapped: u64,
        raw: Raw,
    ) -> AllocInfo {
        let kind = AllocKind::from_code(info >> 32 & 0xff);
        AllocInfo {
            id,
            dev: info as u32,
            base,
            len,
            kind,
            pinned: PinMask((info >> 40) as u8),
            mapped_bytes: if kind == AllocKind::Reserved {
                mapped
            } else {
                len
            },
            stats: raw.stats(),
            closed_chunk_accesses: 0,
        }
    }

    /// Apply `f(chunk slot, chunk base, bytes of the chunk in [s,e) ∩ alloc)`
    /// to every chunk of every live allocation of a `kinds` kind overlapping
    /// `[s, e)`; `g(slot)` once per allocation first. Returns whether any
    /// allocation overlapped.
    pub(super) fn for_chunks_in(
        &self,
        c: &mut Cold,
        s: u64,
        e: u64,
        reserved_only: bool,
        mut g: impl FnMut(&AllocSlot),
        mut f: impl FnMut(&Self, &mut Cold, &ChunkSlot, &AllocSlot, u64),
    ) -> bool {
        let mut any = false;
        for (idx, b, l) in self.owners_in(c, s, e) {
            let slot = self.slot(idx);
            if reserved_only && slot.info.load(Relaxed) >> 32 & 0xff != AllocKind::Reserved.code() {
                continue;
            }
            any = true;
            g(slot);
            let (s0, e0) = (s.max(b), e.min(b + l));
            let mut chunk = chunk_base(s0);
            while chunk < e0 {
                if let Some(cs) = self.map.chunk(chunk) {
                    // Whole chunk ∩ allocation: the unit that is mapped or pinned.
                    let part = overlap(b, b + l, chunk, chunk + CHUNK);
                    f(self, c, cs, slot, part);
                }
                chunk += CHUNK;
            }
        }
        any
    }

    /// Chunks of reservations in `[va, va+len)` are now backed. Returns
    /// whether the range fell in a live reservation.
    pub fn on_map(&self, va: u64, len: u64) -> bool {
        self.before_map_change();
        let mut c = self.lock();
        let end = va.saturating_add(len);
        self.for_chunks_in(
            &mut c,
            va,
            end,
            true,
            |_| {},
            |t, c, cs, slot, part| {
                let mut m = Meta::load(cs);
                if !m.mapped {
                    m.mapped = true;
                    m.store(cs);
                    slot.mapped.fetch_add(part, Relaxed);
                    c.mapped_bytes += part;
                }
                t.ensure_chunk_rec(c, cs);
            },
        )
    }

    /// Chunks of reservations in `[va, va+len)` are no longer backed (their
    /// statistics stay).
    pub fn on_unmap(&self, va: u64, len: u64) -> bool {
        self.before_map_change();
        let mut c = self.lock();
        let end = va.saturating_add(len);
        self.for_chunks_in(
            &mut c,
            va,
            end,
            true,
            |_| {},
            |_, c, cs, slot, part| {
                let mut m = Meta::load(cs);
                if m.mapped {
                    m.mapped = false;
                    m.store(cs);
                    slot.mapped
                        .fetch_sub(part.min(slot.mapped.load(Relaxed)), Relaxed);
                    c.mapped_bytes = c.mapped_bytes.saturating_sub(part);
                }
            },
        )
    }

    /// Mark `[base, base+len)` never-move for `reason`: every live allocation
    /// overlapping it, and every chunk of those allocations the range
    /// touches. Marks last as long as the allocation (chunk marks: as long as
    /// the chunk stays occupied). Returns whether anything was marked.
    pub fn set_pinned(&self, base: u64, len: u64, reason: PinReason) -> bool {
        let mut c = self.lock();
        let end = base.saturating_add(len.max(1));
        let bit = reason.bit();
        self.for_chunks_in(
            &mut c,
            base,
            end,
            false,
            |slot| {
                slot.info.fetch_or((bit as u64) << 40, Relaxed);
            },
            |_, c, cs, _, _| {
                let mut m = Meta::load(cs);
                if m.pins == 0 {
                    c.pinned_bytes += m.bytes as u64;
                }
                m.pins |= bit;
                m.store(cs);
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::{AllocKind, HeatTable};
    use super::{CHUNK, PAGE};

    const B: u64 = 0x1_0000_0000;

    /// Random allocations and frees in a 3-chunk window (sub-page buffers
    /// sharing pages, page- and chunk-crossing ones), against a model of
    /// what is live: every allocation the model allows is accepted, every
    /// overlap refused, and every address and chunk resolves to exactly
    /// the model's owner. Fails if the one-descent owner walk
    /// (`owners_rev`) stops early or late, or if a span refresh rewrites
    /// the wrong pages.
    #[test]
    fn the_map_follows_random_allocations_and_frees() {
        for seed in 1..=6u64 {
            let mut rnd = crate::test_rng(seed * 0x9e37_79b9);
            let t = HeatTable::new(4096, 4096);
            let mut live: BTreeMap<u64, (u64, super::super::AllocId)> = BTreeMap::new();
            for step in 0..1500 {
                if rnd(3) > 0 || live.is_empty() {
                    // sizes from 1 KiB (at most 4 per page: under the
                    // page limit) to 1.5 chunks, at 1 KiB offsets
                    let base = B + rnd(3 * CHUNK / 1024) * 1024;
                    let len = match rnd(3) {
                        0 => (1 + rnd(3)) * 1024,
                        1 => (1 + rnd(64)) * PAGE,
                        _ => 1024 + rnd(3 * CHUNK / 2),
                    };
                    let overlaps = live
                        .range(..base + len)
                        .next_back()
                        .is_some_and(|(&b, &(l, _))| b + l > base);
                    let got = t.on_alloc(0, base, len, AllocKind::Malloc);
                    assert_eq!(
                        got.is_some(),
                        !overlaps,
                        "seed {seed} step {step}: {base:#x}+{len}"
                    );
                    if let Some(id) = got {
                        live.insert(base, (len, id));
                    }
                } else {
                    let k = rnd(live.len() as u64) as usize;
                    let base = *live.keys().nth(k).unwrap();
                    assert!(t.on_free(base).is_some(), "seed {seed} step {step}");
                    live.remove(&base);
                }
                for _ in 0..24 {
                    let a = B + rnd(4 * CHUNK);
                    let want = live
                        .range(..=a)
                        .next_back()
                        .filter(|(&b, &(l, _))| a < b + l)
                        .map(|(_, &(_, id))| id);
                    assert_eq!(
                        t.lookup(a).map(|x| x.0),
                        want,
                        "seed {seed} step {step}: {a:#x}"
                    );
                }
                for c in 0..4 {
                    let (cs, ce) = (B + c * CHUNK, B + (c + 1) * CHUNK);
                    let owners = live
                        .iter()
                        .filter(|(&b, &(l, _))| b < ce && b + l > cs)
                        .count();
                    let info = t.chunk_info(cs).map(|i| i.owners).unwrap_or(0);
                    assert_eq!(info as usize, owners, "seed {seed} step {step}: chunk {c}");
                }
            }
        }
    }
}
