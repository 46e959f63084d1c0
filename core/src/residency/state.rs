//! What the residency manager knows, behind its one lock: backings (what the
//! program allocated) and their 2 MiB chunks, the VA map, per-device data,
//! the DRAM and NVMe stores, and the pool of use events. Plain data and
//! bookkeeping: no runtime calls (those live in the modules that act:
//! lifecycle, protocol, migrate, evict, prefetch, lost).

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::protocol::{Need, Token};
use super::MAX_DEVICES;
use crate::engine::runtime::CHUNK;
use crate::policy::{Cand, Placement, RankTail};
use crate::store::dram::{DramSlot, DramStore, HostAllocator};
use crate::store::nvme::{NvmeSlot, NvmeStore};

/// Where a chunk's host copy lives.
pub(super) enum Host {
    Dram(DramSlot),
    Nvme(NvmeSlot),
}

/// One 2 MiB chunk of a backing.
#[derive(Default)]
pub(super) struct Chunk {
    /// Physical handle while resident (0: not in HBM).
    pub phys: u64,
    /// A host copy: the only copy when not resident; a clean copy when
    /// resident and not dirty.
    pub host: Option<Host>,
    pub dirty: bool,
    /// Calls in progress that need it.
    pub pins: u32,
    /// (stream, event) recorded after the latest use on each stream.
    pub uses: Vec<(u64, u64)>,
    /// Logical clock of the latest use.
    pub last: u64,
    /// Its only current copy was in the HBM of a device that disappeared.
    pub lost: bool,
    /// Brought back by the background prefetch and not used since.
    pub prefetched: bool,
    /// `phys` is a host physical handle (HOST_NUMA) mapped at the chunk's
    /// VAs, not HBM: the device reaches it over the link (`hostmap`).
    pub on_host: bool,
    /// Leaving HBM: the event recorded after its copy-out (a `Dev::outgoing`
    /// entry); 0 otherwise. Still mapped and resident until that completes.
    pub out_ev: u64,
    /// Calls that read it without writing it since it was last written
    /// (saturating): a read-once stream's chunks are read again and again
    /// (`hostmap::map_streams`).
    pub ro_uses: u8,
    /// `State::touches` when it was last used: chunks touched since, an
    /// upper bound of its reuse distance (`hostmap::map_streams`).
    pub last_touches: u64,
    /// Chunks touched between its last two uses (its previous reuse
    /// distance; 0 before it has one).
    pub reuse: u64,
    /// Mapped for a call that writes it whole, without its copy-in: its
    /// memory holds nothing of it yet, and its host copy is kept until a
    /// call using it succeeds (`finish`) — a call that fails writes
    /// nothing, so the chunk goes back to its host copy (`unfilled_back`),
    /// or with none (a first touch given another chunk's HBM under
    /// U3M_HANDOFF) to no memory at all; so too when its call fails before
    /// it runs (`release_reserved`). While that call waits unlocked for
    /// other work the chunk stays mapped, unpinned: a call reading it gives
    /// it back first (`fault_in`; one in flight: it waits), and an eviction
    /// drops it with no copy-out (`needs_copy_out`).
    pub unfilled: bool,
    /// Its contents were discarded (`Residency::discard`) since it was last
    /// written: evicting it needs no copy-out, and with no host copy its
    /// next use maps fresh memory.
    pub discarded: bool,
}

impl Chunk {
    /// Evicting it needs a copy-out (no current host copy, not discarded).
    #[inline]
    pub fn needs_copy_out(&self) -> bool {
        !self.unfilled && (self.dirty || (self.host.is_none() && !self.discarded))
    }

    /// In HBM (mapped at its VAs with device memory).
    #[inline]
    pub fn in_hbm(&self) -> bool {
        self.phys != 0 && !self.on_host
    }

    /// In HBM and free to leave it: no call holds it, no copy-out is
    /// taking it (a victim candidate, its backing not pinned).
    #[inline]
    pub fn may_leave(&self) -> bool {
        self.in_hbm() && self.pins == 0 && self.out_ev == 0
    }
}

pub(super) enum Kind {
    /// aclrtMalloc family: VA reserved by u3m, mapped at `va` for life.
    Malloc,
    /// A handle u3m handed out for aclrtMallocPhysical.
    Vmm,
}

/// What the program allocated: an aclrtMalloc-family allocation or a
/// physical handle u3m handed out.
pub(super) struct Backing {
    pub dev: u32,
    pub kind: Kind,
    pub size: u64,
    /// What the backing counts against the device's virtual capacity: its
    /// size, less an aclrtMalloc's padding chunk (see `malloc_room`).
    pub charged: u64,
    pub chunks: Vec<Chunk>,
    /// VAs the backing is mapped at (Malloc: exactly its own).
    pub vas: Vec<u64>,
    pub pinned: bool,
    /// Its chunk 0's place in the last walk of its device's candidates
    /// (`evict::walk_victims`; `u32::MAX` before one): chunk i's is
    /// `place + i` while `State::structure` stays as that walk found it.
    /// (A cell: the walk reads the backings shared.)
    pub place: std::cell::Cell<u32>,
    /// A real physical handle of the backing's whole size that replaced its
    /// chunks (a multi-chunk VMM handle exported for IPC): mapped whole,
    /// never moves; 0 otherwise. Read with `real()`; changed only by
    /// `State::set_real` / `State::take_real`, which forget the VA entry
    /// kept across calls (`Vas`).
    real: u64,
}

impl Backing {
    pub fn new(dev: u32, kind: Kind, size: u64, vas: Vec<u64>) -> Backing {
        Backing {
            dev,
            kind,
            size,
            charged: size,
            chunks: (0..size / CHUNK).map(|_| Chunk::default()).collect(),
            vas,
            pinned: false,
            place: std::cell::Cell::new(u32::MAX),
            real: 0,
        }
    }

    /// The real physical handle that replaced the backing's chunks (0: none).
    #[inline]
    pub fn real(&self) -> u64 {
        self.real
    }

    /// The policy's name for chunk `i`: the device VA of the backing's
    /// first mapping, else (a VMM handle mapped nowhere) a key above every VA.
    pub fn key(&self, id: u64, i: u32) -> u64 {
        key_of(self.vas.first().copied(), id, i)
    }

    /// What `prepare`'s one-chunk path reads of the backing, for the kept
    /// VA entry (`Vas::keep_at`).
    pub fn kept_at(&mut self) -> KeptAt {
        KeptAt {
            dev: self.dev,
            chunks: self.chunks.as_mut_ptr() as usize,
            n: self.chunks.len(),
            first_va: self.vas.first().copied(),
        }
    }
}

/// `Backing::key` of a backing whose first mapping is `first_va`.
#[inline]
pub fn key_of(first_va: Option<u64>, id: u64, i: u32) -> u64 {
    match first_va {
        Some(va) => va + i as u64 * CHUNK,
        None => (1 << 63) | (id << 24) | i as u64,
    }
}

/// The kept VA entry's backing as `prepare` reads it (`Backing::kept_at`):
/// its device, its chunk vector (address and length) and its first
/// mapping. Valid exactly as long as the entry stays kept: the backing
/// leaves `backings` only after its VA entries left `vas`, and its mappings
/// (`Backing::vas`) change only with `vas` (each change forgets the entry);
/// its chunk vector is never reallocated (made whole in `Backing::new`) and
/// its device never changes. A rehash of `backings` moves the `Backing`,
/// not its vector's buffer.
#[derive(Clone, Copy)]
pub(super) struct KeptAt {
    pub dev: u32,
    /// the chunk vector's buffer (a pointer as usize: `State` is `Send`)
    pub chunks: usize,
    pub n: usize,
    pub first_va: Option<u64>,
}

/// A dirty chunk's copy-out in flight on u3m's device-to-host stream. Its
/// HBM is unmapped and freed only once `ev` completes (`migrate::harvest`).
pub(super) struct Outgoing {
    pub id: u64,
    pub i: u32,
    /// The DRAM slot the copy lands in: the chunk's host copy once complete.
    /// None: a clean chunk evicted while still in use (U3M_HANDOFF): no
    /// copy, `ev` marks where u3m's stream has waited for its uses.
    pub slot: Option<Host>,
    /// Recorded on the device-to-host stream after the copy (one reference).
    pub ev: u64,
    /// The staging buffer the copy lands in when `slot` is on NVMe (written
    /// out to the slot once `ev` completes, then back to `Dev::staging_free`);
    /// 0 for a DRAM slot.
    pub staging: u64,
    /// A VMM handle's chunk: the VA of u3m's own the copy reads the chunk
    /// at (the program may unmap the handle's VAs at any time), unmapped
    /// and given back (`give_move_va`) once `ev` completes; 0 for an
    /// allocation's chunk (read at the allocation's VA, mapped until the
    /// copy lands: freeing it settles first).
    pub va: u64,
    /// The chunk's HBM, given to a copy-in before this copy landed
    /// (`take_outgoing`); 0: not taken.
    pub taken: u64,
    /// Where that HBM is still mapped for the copy to read (the
    /// allocation's VA of the chunk), until the copy is complete: `harvest`
    /// unmaps it then, or freeing the allocation (`drop_copy_vas_of`); 0:
    /// none.
    pub taken_va: u64,
}

/// A chunk's move between HBM and a host handle (hostmap.rs) whose copy
/// was queued, not waited for: the chunk's VAs map its new memory already,
/// the copy is a use of the chunk (every call orders itself after it), and
/// its old memory stays, mapped at scratch VAs for the copy to read, until
/// `ev` completes.
pub(super) struct Moved {
    /// Recorded on u3m's stream after the copy (one reference, this entry's).
    pub ev: u64,
    /// Scratch VAs mapped for the copy (0: none): the old memory's, and the
    /// new memory's when the chunk is mapped nowhere.
    pub vas: [u64; 2],
    /// The old physical handle, freed once the copy landed.
    pub old: u64,
    /// `old` is a host handle (else HBM): which of `Dev::host_mapped` and
    /// `Dev::resident` still counts it until then.
    pub host: bool,
}

/// Per-device data. Today inside the one residency lock; the unit a
/// per-device lock would cover.
pub(super) struct Dev {
    /// u3m's own stream for copy-ins and synchronous copies (0: not created yet).
    pub stream: u64,
    /// u3m's stream for asynchronous copy-outs (0: not created yet): apart
    /// from `stream`, so copy-outs overlap copy-ins.
    pub out_stream: u64,
    /// Copy-outs issued on `out_stream`, oldest first (they complete in order).
    pub outgoing: VecDeque<Outgoing>,
    /// The eviction order (`evict::victims`), kept between evictions.
    pub order: VictimOrder,
    /// A 2 MiB pinned staging buffer for NVMe transfers.
    pub staging: u64,
    /// Pinned 2 MiB staging buffers for NVMe copy-ins and copy-outs, one
    /// per transfer in flight (`migrate::take_staging`): spare ones ...
    pub staging_free: Vec<u64>,
    /// ... and those an issued copy-in may still read: (event recorded on
    /// u3m's stream after the copy, one reference; buffer), free again once
    /// the event completes — never waited for with the lock held.
    pub staging_busy: Vec<(u64, u64)>,
    pub resident: u64,
    /// Bytes of chunks host-mapped (in host handles at their VAs).
    pub host_mapped: u64,
    /// Chunks moved between HBM and a host handle whose copy may still be
    /// in flight (`hostmap::move_chunk`): their old memory is given back
    /// once the copy's event completes (`hostmap::reap_moves`).
    pub moves: Vec<Moved>,
    /// Spare 2 MiB VAs u3m maps a moving chunk's old memory at for its copy.
    pub move_vas: Vec<u64>,
    pub managed_virtual: u64,
    pub capacity: u64,
    /// The device disappeared (card failure): its HBM is gone, nothing on it
    /// is called again; chunks with a current host copy stay readable.
    pub lost: bool,
    /// The look-ahead prefetch's window, pending chunks and depth.
    pub ahead: super::ahead::Ahead,
    /// Chunks an outside schedule has out, in the order of their last use,
    /// evicted once that use is complete (planned.rs): (backing id, index,
    /// the clock of the call U3M_PLAN named it after; 0: `u3m replay
    /// --policy plan`'s, whose policy says whether it is still out).
    pub planned: VecDeque<(u64, u32, u64)>,
    /// The event recorded after the latest copy-ins on `stream` (one
    /// reference; 0: none yet): complete, the link's host-to-device
    /// direction has nothing queued of u3m's.
    pub last_in: u64,
}

impl Dev {
    pub const fn new() -> Dev {
        Dev {
            stream: 0,
            out_stream: 0,
            outgoing: VecDeque::new(),
            order: VictimOrder::new(),
            staging: 0,
            staging_free: Vec::new(),
            staging_busy: Vec::new(),
            resident: 0,
            host_mapped: 0,
            moves: Vec::new(),
            move_vas: Vec::new(),
            managed_virtual: 0,
            capacity: 0,
            lost: false,
            ahead: super::ahead::Ahead::new(),
            planned: VecDeque::new(),
            last_in: 0,
        }
    }
}

/// The policy's eviction order over a device's resident chunks, kept
/// between evictions: built from every candidate (`Placement::order_top`:
/// the first `ORDER_TOP` of the policy's order) when the policy's
/// `order_ttl` calls have passed, and re-keyed in between — after
/// `REBUILD_TAKEN` evictions from it, the entries it holds and the chunks
/// calls touched since it was ordered (`touched`, fed by
/// `protocol::prepare`: under a predictive policy often the best victims;
/// and chunks a prefetch made resident, `prefetch::dram_copy_in`)
/// are ordered again at the current time: one ordering of about
/// `ORDER_TOP` chunks where there was a sort of every resident chunk.
/// A ranking policy (`Placement::order_ranked`) sorts only the order's
/// first segment; the rest is sorted a segment at a time as evictions
/// reach it (`has`): a build that gives one victim (RAG decode: an
/// eviction every few calls, a build per eviction) weighs every
/// candidate but sorts 32 of them.
/// Entries are skipped once they stop being candidates (evicted, leaving,
/// pinned) or were used after it was last ordered (touched: they come
/// back re-keyed). Also built when used up, when `touched` overflowed, and
/// at every eviction for a policy whose `order_ttl` is 0 (Belady).
/// A policy that maintains its order (`Placement::order_kept`) is not given
/// every candidate to weigh at a build, only those that changed since the
/// last (`prev`, `evict::Delta`); `tail` then reads its order on.
pub(super) struct VictimOrder {
    /// The order's first entries, in order (more come from `tail` as
    /// evictions reach them: `has`).
    pub cands: Vec<Cand>,
    /// The rest of it, sorted when reached (`Placement::order_ranked`;
    /// empty for a policy that sorts all at once).
    pub tail: RankTail,
    /// The first entry not yet skipped or taken.
    pub next: usize,
    /// `State::clock` when last ordered (built or re-keyed).
    pub built_at: u64,
    /// `State::clock` when built from every candidate.
    pub full_at: u64,
    /// Chunks evicted from this order.
    pub taken: usize,
    /// Every candidate is in `cands` (not only the first `ORDER_TOP`).
    pub complete: bool,
    /// Keys of chunks touched by calls since it was last ordered (repeats
    /// allowed; at most `TOUCHED_MAX`).
    pub touched: Vec<u64>,
    /// More were touched than `touched` holds: build from every candidate.
    pub overflow: bool,
    /// What the last demand eviction's scan learnt about this order's front
    /// (evict.rs `evict_in_order`; cleared when it is built or re-keyed).
    pub busy: Option<BusyFront>,
    /// The policy's maintained order behind builds (`Placement::order_kept`):
    /// this order's owner id there (0: none yet) and its latest build.
    pub owner: u64,
    pub epoch: u64,
    /// The candidates at that build, each with its place in the walk of
    /// the device's chunks (`evict::walk_victims`), in walk order ...
    pub prev_seq: Vec<u32>,
    pub prev: Vec<Cand>,
    /// ... (edited in place by a build from the marks) and the buffers a
    /// walk of every chunk collects into and diffs with.
    pub cur_seq: Vec<u32>,
    pub cur: Vec<Cand>,
    pub gone: Vec<u64>,
    pub new: Vec<Cand>,
    /// Keys of chunks whose standing as a candidate (in HBM, unpinned, no
    /// copy-out in flight; last use; dirty) may have changed since the last
    /// build, and of every chunk pinned or leaving HBM then (they change
    /// again when unpinned or gone, unmarked): a build re-reads only these
    /// (`evict::track_victims`) instead of walking every chunk, while
    /// `State::structure` is what the last walk found (`walked`) and they
    /// did not overflow (`marks_over`; at most `TOUCHED_MAX`).
    pub marks: Vec<u64>,
    pub marks_over: bool,
    /// (`track_victims`' buffer, reused)
    pub read: Vec<super::evict::Marked>,
    pub edits: Vec<super::evict::Edit>,
    /// The last build read the marks only (`track_victims`).
    pub from_marks: bool,
    /// Test builds check such a build against a walk (off: a test that
    /// loses marks on purpose).
    #[cfg_attr(not(debug_assertions), allow(dead_code))]
    pub checked: bool,
    /// Builds from the marks, and from a walk of every chunk.
    pub tracked: u64,
    pub walks: u64,
    pub walked: u64,
    /// Whether dirty chunks written whole next go first (U3M_OUT_FIRST).
    pub balance: super::balance::Balance,
}

/// A run of the kept order's entries, from `next` to `end`, in which every
/// candidate was in use by queued work when last scanned, each waiting for
/// one of `events` (all pending then): while every one of those events is
/// still pending, no entry of the run can be taken, and the next scan
/// starts at `end` (with `seen` usable entries counted, `first` the
/// first busy one's key and `earliest` the key of the one last used
/// earliest), instead of asking every entry again.
/// Distinct pending events a demand eviction's scan remembers (`BusyFront`).
pub(super) const BUSY_EVENTS: usize = 32;

#[derive(Clone, Copy)]
pub(super) struct BusyFront {
    pub end: usize,
    pub seen: usize,
    pub first: u64,
    pub earliest: u64,
    pub events: [u64; BUSY_EVENTS],
    pub n: usize,
}

/// Candidates a kept order holds: the first of the policy's order
/// (`Placement::order_top`), not every resident chunk: evictions take from
/// its front, and the chunks touched since it was ordered are re-keyed into
/// it; one used up before its end is built again, and a fresh one with
/// none to give is built whole before eviction gives up
/// (`evict::evict_one`).
pub(super) const ORDER_TOP: usize = 1024;
/// Evictions from a kept order after which it is re-keyed.
pub(super) const REBUILD_TAKEN: usize = 32;
/// Touched keys a kept order remembers before it overflows.
pub(super) const TOUCHED_MAX: usize = 4096;

impl VictimOrder {
    pub const fn new() -> VictimOrder {
        VictimOrder {
            cands: Vec::new(),
            tail: RankTail::new(),
            next: 0,
            built_at: 0,
            full_at: 0,
            taken: 0,
            complete: false,
            touched: Vec::new(),
            overflow: false,
            busy: None,
            owner: 0,
            epoch: 0,
            prev_seq: Vec::new(),
            prev: Vec::new(),
            cur_seq: Vec::new(),
            cur: Vec::new(),
            gone: Vec::new(),
            new: Vec::new(),
            marks: Vec::new(),
            marks_over: false,
            read: Vec::new(),
            edits: Vec::new(),
            from_marks: false,
            checked: true,
            tracked: 0,
            walks: 0,
            walked: u64::MAX,
            balance: super::balance::Balance::new(),
        }
    }

    /// Whether the order must be built from every candidate before the
    /// next eviction (at logical time `now`; `ttl`: the policy's
    /// `order_ttl`).
    pub fn stale(&self, now: u64, ttl: u64) -> bool {
        (self.next >= self.cands.len() && self.tail.is_empty())
            || self.overflow
            || ttl == 0
            || now >= self.full_at + ttl
    }

    /// Whether entry `k` exists, sorting the tail's next segment into
    /// `cands` when `k` reaches it.
    /// (`p`: the policy, which gives a maintained order's segments.)
    #[inline]
    pub fn has(&mut self, k: usize, p: &dyn Placement) -> bool {
        while k >= self.cands.len() && !self.tail.is_empty() {
            self.tail.take_next_from(p, &mut self.cands);
        }
        k < self.cands.len()
    }

    /// Whether the entries must be re-keyed: after `REBUILD_TAKEN`
    /// evictions from it (the chunks touched since are missing from it),
    /// where it was sorted whole before.
    pub fn needs_rekey(&self) -> bool {
        self.taken >= REBUILD_TAKEN
    }

    /// A call touched `keys` (policy keys). Inlined: once the list has
    /// overflowed (the steady state between rebuilds) a call does only the
    /// test, not a call.
    /// They are marked too (`marks`).
    #[inline]
    pub fn note_touched(&mut self, keys: &[u64]) {
        if self.overflow && self.marks_over {
            return;
        }
        self.note_touched_list(keys);
    }

    #[inline(never)]
    fn note_touched_list(&mut self, keys: &[u64]) {
        push_capped(&mut self.marks, &mut self.marks_over, keys);
        push_capped(&mut self.touched, &mut self.overflow, keys);
    }

    /// Chunks `keys` may have changed as candidates (`marks`).
    #[inline]
    pub fn mark_all(&mut self, keys: &[u64]) {
        push_capped(&mut self.marks, &mut self.marks_over, keys);
    }
}

/// Appends `keys` to `list` until it would pass `TOUCHED_MAX`; then empties
/// it and sets `over` (the list no longer tells all) until its reader clears it.
#[inline]
fn push_capped(list: &mut Vec<u64>, over: &mut bool, keys: &[u64]) {
    if *over {
        return;
    }
    if list.len() + keys.len() > TOUCHED_MAX {
        *over = true;
        list.clear();
        return;
    }
    list.extend_from_slice(keys);
}

/// A device index clamped into the table.
#[inline]
pub(super) fn dev_index(dev: u32) -> usize {
    (dev as usize).min(MAX_DEVICES - 1)
}

pub(super) struct State {
    pub backings: IdMap<Backing>,
    /// The next backing id: ids of a device's state are its index modulo
    /// `MAX_DEVICES`, so a handle names its device (`shards`).
    pub next_id: u64,
    /// VA start -> (backing id, bytes) for every mapped backing, and the
    /// entry the last call's last range was found in.
    pub vas: Vas,
    pub devs: [Dev; MAX_DEVICES],
    /// The process's DRAM and NVMe stores, shared by every device's state
    /// (each behind its own short lock, taken under a device's lock).
    pub dram: Shared<DramStore<Box<dyn HostAllocator>>>,
    pub nvme: Option<Shared<NvmeStore>>,
    /// event -> number of chunk uses referring to it; free events
    pub event_refs: IdMap<u32>,
    /// Events u3m recorded on a device's own copy-in stream (`Dev::stream`)
    /// -> (that stream, its place in the stream's record order): the
    /// stream runs them in that order, so a copy-in found pending means
    /// every later one is (`evict_in_order`). Entries go with the last
    /// reference (`unref_event`).
    pub in_order: IdMap<(u64, u64)>,
    /// The last place given in `in_order`.
    pub in_last: u64,
    /// Complete-or-pending events to reuse, oldest first: taken from near
    /// the front (`pooled_event`), so a deque (a Vec's `remove` moved the
    /// whole pool each time: 32 GiB LoRA step ~293 M instructions).
    pub free_events: VecDeque<u64>,
    /// Logical clock: one tick per call that touched managed memory.
    pub clock: u64,
    pub recently_freed: VecDeque<u64>,
    /// Host slots no longer needed that an issued copy-in may still be
    /// reading, with the device whose u3m stream may read them (the chunk's):
    /// given back only after that stream is synchronised.
    pub pending_free: Vec<(u32, Host)>,
    /// Deferred host slots behind a fence: (event recorded on the device's
    /// u3m stream after every copy that may read the slot, one reference
    /// per entry; device; slot), given back once the event is complete
    /// (`migrate::reclaim`, never a wait).
    pub fenced_free: Vec<(u64, u32, Host)>,
    /// An event an eviction must see complete (waited for without the lock).
    pub wait_for: Option<u64>,
    /// CLOCK_MONOTONIC when the current call's first absent chunk was met
    /// (its fault-in stall starts there); taken by `prepare`.
    pub stall_from: Option<u64>,
    /// Buffers `prepare` reuses so a call allocates nothing once warm:
    /// (backing, chunk, overwritten whole, written) per range and chunk,
    /// the chunks it needs, the policy keys, finished calls' tokens.
    pub call_chunks: Vec<(u64, u32, bool, bool)>,
    pub call_need: Vec<Need>,
    pub call_keys: Vec<u64>,
    /// U3M_PLAN=auto's detection and recording on this device (made by the
    /// first call that follows the schedule: autoplan.rs).
    pub auto_rec: Option<Box<super::autoplan::Recorder>>,
    pub tokens: Vec<Token>,
    /// Chunks touched by calls so far, summed over calls (with `clock`: how
    /// many calls HBM holds, `hostmap::map_streams`).
    pub touches: u64,
    /// Use fences recorded since the last call (`fence`): their opening
    /// references are dropped here (a reused buffer).
    pub closed_fences: Vec<u64>,
    /// The read-once probe (U3M_HOST_MAP=probe: `probe`, `hostmap`).
    pub probe: super::probe::Marks,
    /// Every chunk copied in or evicted, while a tool asks for them
    /// (`Residency::set_move_log`; `u3m replay --audit`); None otherwise.
    pub moves: Option<Vec<Move>>,
    /// Changes when a backing comes or goes, is mapped or unmapped at a VA,
    /// pinned, or given a real handle, and when many chunks change at once
    /// (a fork, a lost device): the victim orders' next builds then walk
    /// every chunk (`VictimOrder::walked`).
    pub structure: u64,
}

/// One chunk moving between HBM and the host (`State::moves`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    /// The logical clock (`State::clock`) when it moved.
    pub tick: u64,
    /// The chunk's key: its backing's first VA + offset.
    pub key: u64,
    pub kind: MoveKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoveKind {
    /// Copied into HBM from the host: for a call that needs it (`demand`:
    /// from DRAM or NVMe after an eviction, or a host-mapped chunk moved
    /// back), or ahead of use by a prefetch.
    In { demand: bool },
    /// Evicted: copied out (`dirty`) or dropped, with the policy's
    /// prediction of its next use then (`Placement::next_use`: u64::MAX
    /// dead — written whole before any read —, None undated).
    Out { dirty: bool, next: Option<u64> },
}

/// An entry of `Vas` kept across calls: (VA start, backing id, bytes, the
/// backing has a real handle).
pub(super) type KeptVa = (u64, u64, u64, bool);

/// The VA map: VA start -> (backing id, bytes) for every mapped backing.
/// It also keeps the entry the last call's last range was found in, for
/// the next call's first range (protocol.rs `prepare_in`: an operator's
/// ranges are mostly in one allocation, found again without a walk). Every
/// change of the map goes through `insert` / `remove`, and every change of
/// a backing's real handle through `State::set_real` / `take_real`: each
/// forgets the kept entry, so it is never served stale.
#[derive(Default)]
pub(super) struct Vas {
    map: BTreeMap<u64, (u64, u64)>,
    /// the kept entry, and its backing when the caller gave it (`keep_at`)
    kept: Option<(KeptVa, Option<KeptAt>)>,
}

impl Vas {
    #[inline]
    pub fn get(&self, va: &u64) -> Option<&(u64, u64)> {
        self.map.get(va)
    }

    #[inline]
    pub fn range<R: std::ops::RangeBounds<u64>>(
        &self,
        r: R,
    ) -> std::collections::btree_map::Range<'_, u64, (u64, u64)> {
        self.map.range(r)
    }

    pub fn insert(&mut self, va: u64, e: (u64, u64)) -> Option<(u64, u64)> {
        self.kept = None;
        self.map.insert(va, e)
    }

    pub fn remove(&mut self, va: &u64) -> Option<(u64, u64)> {
        self.kept = None;
        self.map.remove(va)
    }

    /// The entry kept by the last call (None: none, or forgotten since).
    #[inline]
    pub fn kept(&self) -> Option<KeptVa> {
        self.kept.map(|k| k.0)
    }

    /// The kept entry with its backing's `KeptAt` (None: none kept, or
    /// kept without it).
    #[inline]
    pub fn kept_at(&self) -> Option<(KeptVa, KeptAt)> {
        match self.kept {
            Some((e, Some(at))) => Some((e, at)),
            _ => None,
        }
    }

    /// Keeps `e`, an entry of the map as it is now (with its backing's
    /// `real() != 0`), for the next call; `at`: its backing's `kept_at()`
    /// now, if known.
    #[inline]
    pub fn keep_at(&mut self, e: KeptVa, at: Option<KeptAt>) {
        self.kept = Some((e, at));
    }
}

impl State {
    /// Backing `id`'s real handle is now `real` (0: none).
    pub fn set_real(&mut self, id: u64, real: u64) {
        self.vas.kept = None;
        self.structure += 1;
        if let Some(b) = self.backings.get_mut(&id) {
            b.real = real;
        }
    }

    /// Takes the real handle of `b` (a backing being released, out of
    /// `backings` already): `b.real()` is 0 after.
    pub fn take_real(&mut self, b: &mut Backing) -> u64 {
        self.vas.kept = None;
        self.structure += 1;
        std::mem::take(&mut b.real)
    }

    pub fn new(
        dram: Shared<DramStore<Box<dyn HostAllocator>>>,
        nvme: Option<Shared<NvmeStore>>,
        first_id: u64,
    ) -> State {
        State {
            backings: IdMap::default(),
            next_id: first_id,
            vas: Vas::default(),
            devs: [const { Dev::new() }; MAX_DEVICES],
            dram,
            nvme,
            event_refs: IdMap::default(),
            in_order: IdMap::default(),
            in_last: 0,
            free_events: VecDeque::new(),
            clock: 0,
            recently_freed: VecDeque::new(),
            pending_free: Vec::new(),
            fenced_free: Vec::new(),
            wait_for: None,
            stall_from: None,
            call_chunks: Vec::new(),
            call_need: Vec::new(),
            call_keys: Vec::new(),
            auto_rec: None,
            tokens: Vec::new(),
            touches: 0,
            closed_fences: Vec::new(),
            probe: Default::default(),
            moves: None,
            structure: 0,
        }
    }

    /// Notes chunk (id, i) moving as `kind` while a move log is kept.
    #[inline]
    pub fn note_move(&mut self, id: u64, i: u32, kind: MoveKind) {
        if let Some(m) = self.moves.as_mut() {
            let key = self.backings.get(&id).map_or(0, |b| b.key(id, i));
            m.push(Move {
                tick: self.clock,
                key,
                kind,
            });
        }
    }

    #[inline]
    pub fn dev(&self, dev: u32) -> &Dev {
        &self.devs[dev_index(dev)]
    }

    #[inline]
    pub fn dev_mut(&mut self, dev: u32) -> &mut Dev {
        &mut self.devs[dev_index(dev)]
    }

    /// Chunk `i` of backing `id`.
    #[inline]
    pub fn chunk(&self, id: u64, i: u32) -> &Chunk {
        &self.backings[&id].chunks[i as usize]
    }

    /// Chunk `i` of backing `id` may have changed as a victim candidate
    /// (`VictimOrder::marks`).
    #[inline]
    pub fn mark(&mut self, id: u64, i: u32) {
        if let Some(b) = self.backings.get(&id) {
            let key = b.key(id, i);
            self.devs[dev_index(b.dev)].order.mark_all(&[key]);
        }
    }

    #[inline]
    pub fn chunk_mut(&mut self, id: u64, i: u32) -> &mut Chunk {
        &mut self.backings.get_mut(&id).expect("backing").chunks[i as usize]
    }

    /// Whether the device holding backing `id` is lost.
    pub fn backing_lost(&self, id: u64) -> bool {
        self.backings
            .get(&id)
            .map(|b| self.dev(b.dev).lost)
            .unwrap_or(false)
    }

    /// Gives a host slot back to its store.
    pub fn free_host(&mut self, h: Host) {
        match h {
            Host::Dram(s) => {
                let _ = self.dram.free(s);
            }
            Host::Nvme(s) => {
                if let Some(n) = self.nvme.as_mut() {
                    let _ = n.free(s);
                }
            }
        }
    }

    /// Makes `ev` (recorded on `stream`) the latest use of chunk (id, i) on
    /// that stream, taking a reference and dropping the one of the event it
    /// replaces.
    pub fn set_use(&mut self, id: u64, i: u32, stream: u64, ev: u64) {
        let mut old = None;
        if let Some(c) = self
            .backings
            .get_mut(&id)
            .and_then(|b| b.chunks.get_mut(i as usize))
        {
            match c.uses.iter_mut().find(|u| u.0 == stream) {
                Some(u) => {
                    if u.1 == ev {
                        return;
                    }
                    old = Some(u.1);
                    u.1 = ev;
                }
                None => c.uses.push((stream, ev)),
            }
        } else {
            return;
        }
        *self.event_refs.entry(ev).or_insert(0) += 1;
        if let Some(o) = old {
            self.unref_event(o);
        }
    }

    /// Drops one reference to `ev`; the last one returns it to the pool.
    pub fn unref_event(&mut self, ev: u64) {
        if let Some(r) = self.event_refs.get_mut(&ev) {
            *r -= 1;
            if *r == 0 {
                self.event_refs.remove(&ev);
                if !self.in_order.is_empty() {
                    self.in_order.remove(&ev);
                }
                self.free_events.push_back(ev);
            }
        }
    }

    /// The place of `ev` in `dev`'s copy-in order, if it is one: a copy-in
    /// recorded after a pending one is pending too.
    #[inline]
    pub fn copy_in_place(&self, dev: u32, ev: u64) -> Option<u64> {
        let own = self.dev(dev).stream;
        self.in_order
            .get(&ev)
            .filter(|&&(s, _)| s == own)
            .map(|&(_, place)| place)
    }

    /// Drops the use `ev` of chunk (id, i), found complete, with its
    /// reference: it orders nothing any more, and kept, every later look
    /// at the chunk would ask the runtime about it again.
    pub fn forget_use(&mut self, id: u64, i: u32, ev: u64) {
        let Some(c) = self
            .backings
            .get_mut(&id)
            .and_then(|b| b.chunks.get_mut(i as usize))
        else {
            return;
        };
        if let Some(k) = c.uses.iter().position(|u| u.1 == ev) {
            c.uses.remove(k);
            self.unref_event(ev);
        }
    }

    /// Whether a schedule may note chunk (id, i) as out (planned.rs):
    /// in HBM, no copy-out of it in flight, not mapped unfilled for a
    /// call, its backing not pinned. Not live: false.
    pub fn may_plan_out(&self, id: u64, i: u32) -> bool {
        self.backings.get(&id).is_some_and(|b| {
            !b.pinned
                && b.chunks
                    .get(i as usize)
                    .is_some_and(|c| c.in_hbm() && c.out_ev == 0 && !c.unfilled)
        })
    }

    /// Chunk (backing id, index) of a policy key (`Backing::key`'s inverse).
    pub fn resolve(&self, key: u64) -> Option<(u64, u32)> {
        if key & (1 << 63) != 0 {
            let id = (key & !(1 << 63)) >> 24;
            let i = (key & 0xff_ffff) as u32;
            return self
                .backings
                .get(&id)
                .filter(|b| (i as usize) < b.chunks.len() && b.vas.is_empty())
                .map(|_| (id, i));
        }
        let (start, _, id, _) = self.resolve_va(key)?;
        Some((id, ((key - start) / CHUNK) as u32))
    }

    /// `resolve` of a VA key: the VA entry (start, length, backing id)
    /// holding it, when that is its backing's first mapping; and the
    /// backing.
    fn resolve_va(&self, key: u64) -> Option<(u64, u64, u64, &Backing)> {
        let (&start, &(id, len)) = self.vas.range(..=key).next_back()?;
        if key >= start + len {
            return None;
        }
        let b = self.backings.get(&id)?;
        // keys name a chunk by its backing's first VA
        if b.vas.first() != Some(&start) {
            return None;
        }
        Some((start, len, id, b))
    }
}

/// `State::resolve` over keys met while the state does not change (one
/// scan of a victim order): a key inside the VA entry the previous one
/// resolved in needs no look-up — a tensor's chunks sit together in the
/// order, and a look-up (a B-tree walk and a hash probe) was a fifth of an
/// eviction's host time on the 8-layer LoRA trace. Whoever changes `vas`
/// or `backings` must start a new one.
#[derive(Default)]
pub(super) struct Resolver {
    start: u64,
    end: u64,
    id: u64,
}

impl Resolver {
    /// `State::resolve` of `key`, with the chunk's backing: on a VA
    /// look-up the backing it read (a scan's candidates, scattered over
    /// allocations on RAG, miss the memo nearly all, and the caller's
    /// look-up of the backing was a second hash probe).
    #[inline]
    pub fn resolve_in<'s>(&mut self, st: &'s State, key: u64) -> Option<(u64, u32, &'s Backing)> {
        if key >= self.start && key < self.end {
            let i = ((key - self.start) / CHUNK) as u32;
            return Some((self.id, i, &st.backings[&self.id]));
        }
        if key & (1 << 63) != 0 {
            let (id, i) = st.resolve(key)?;
            return Some((id, i, &st.backings[&id]));
        }
        let (start, len, id, b) = st.resolve_va(key)?;
        (self.start, self.end, self.id) = (start, start + len, id);
        Some((id, ((key - start) / CHUNK) as u32, b))
    }
}

/// A store shared by every device's state: each operation takes its own
/// short lock, a leaf (no residency lock is ever taken under it).
pub(super) struct Shared<T>(std::sync::Arc<std::sync::Mutex<T>>);

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Shared(self.0.clone())
    }
}

impl<T> Shared<T> {
    pub fn new(t: T) -> Shared<T> {
        Shared(std::sync::Arc::new(std::sync::Mutex::new(t)))
    }

    /// The store (a panic inside one operation leaves it usable: each
    /// operation keeps it consistent).
    pub fn lock(&self) -> std::sync::MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Shared<DramStore<Box<dyn HostAllocator>>> {
    pub fn alloc(&self, len: u64) -> Result<DramSlot, crate::store::StoreError> {
        self.lock().alloc(len)
    }
    pub fn free(&self, slot: DramSlot) -> Result<(), crate::store::StoreError> {
        self.lock().free(slot)
    }
    pub fn used(&self) -> u64 {
        self.lock().used()
    }
    pub fn shrink(&self) -> u64 {
        self.lock().shrink()
    }
}

impl Shared<NvmeStore> {
    pub fn alloc(&self, len: u64) -> Result<NvmeSlot, crate::store::StoreError> {
        self.lock().alloc(len)
    }
    pub fn free(&self, slot: NvmeSlot) -> Result<(), crate::store::StoreError> {
        self.lock().free(slot)
    }
    pub fn used(&self) -> u64 {
        self.lock().used()
    }
    pub fn read(&self, slot: &NvmeSlot, dst: &mut [u8]) -> Result<(), crate::store::StoreError> {
        self.lock().read(slot, dst)
    }
    pub fn read_at(
        &self,
        slot: &NvmeSlot,
        at: u64,
        dst: &mut [u8],
    ) -> Result<(), crate::store::StoreError> {
        self.lock().read_at(slot, at, dst)
    }
    pub fn write(&self, slot: &NvmeSlot, src: &[u8]) -> Result<(), crate::store::StoreError> {
        self.lock().write(slot, src)
    }
    #[cfg(test)]
    pub fn set_faults(&self, f: crate::store::nvme::NvmeFaults) {
        self.lock().set_faults(f)
    }
}

/// A map keyed by u3m's own integers (backing ids, event handles): hashed
/// by one multiply instead of SipHash — the keys are not the program's to
/// choose, so flooding is no concern, and every tracked call looks its
/// chunks' backings up several times.
pub(super) type IdMap<V> = HashMap<u64, V, std::hash::BuildHasherDefault<IdHasher>>;

#[derive(Default, Clone, Copy)]
pub(super) struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    #[inline]
    fn finish(&self) -> u64 {
        // mixes into the low bits (the bucket) and the top bits (the tag):
        // event handles are pointers whose low bits are all alike
        let h = (self.0 ^ (self.0 >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^ (h >> 32)
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        self.0 = x;
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
}

/// u3m's handles for aclrtMallocPhysical: odd values with a tag, so they can
/// never be mistaken for a runtime pointer.
const HANDLE_TAG: u64 = 0x0075_3300_0000_0001;

pub(super) fn handle_of(id: u64) -> u64 {
    HANDLE_TAG | (id << 1)
}

pub(super) fn id_of(h: u64) -> Option<u64> {
    if h & 0xffff_0000_0000_0001 == HANDLE_TAG & 0xffff_0000_0000_0001
        && h & 0x0000_ff00_0000_0000 == HANDLE_TAG & 0x0000_ff00_0000_0000
    {
        Some((h & 0x0000_00ff_ffff_fffe) >> 1)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_hashes_spread_aligned_keys() {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let b = BuildHasherDefault::<IdHasher>::default();
        // 4096 pointer-like keys 64 B apart: distinct low 12 bits (buckets)
        // and more than one top-7-bit tag
        let lo: std::collections::HashSet<u64> = (0..4096u64)
            .map(|k| b.hash_one(0x5555_0000_0000 + k * 64) & 0xfff)
            .collect();
        assert!(lo.len() > 2000, "{} distinct buckets", lo.len());
        let tags: std::collections::HashSet<u64> =
            (0..4096u64).map(|k| b.hash_one(1 + k) >> 57).collect();
        assert!(tags.len() > 64, "{} tags", tags.len());
    }

    #[test]
    fn handles_round_trip_and_are_recognisable() {
        for id in [1u64, 2, 1000, (1 << 38) - 1] {
            assert_eq!(id_of(handle_of(id)), Some(id));
        }
        assert_eq!(id_of(0x5555_0000_1000), None);
        assert_eq!(id_of(0x1000_0000_0000), None);
    }
}

/// A device's state behind its lock. In test builds each thread counts the
/// residency locks it holds (`locks_held`), so the fake runtime can tell a
/// synchronisation made with one held (`fake::Seen::locked_waits`); in
/// other builds it is the mutex alone.
pub(super) struct StLock(std::sync::Mutex<State>);

#[cfg(test)]
thread_local! {
    static HELD: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Residency locks the calling thread holds (test builds).
#[cfg(test)]
pub(crate) fn locks_held() -> u32 {
    HELD.with(|h| h.get())
}

/// A held device state (see `StLock`).
pub(super) struct StGuard<'a>(std::sync::MutexGuard<'a, State>);

impl<'a> StGuard<'a> {
    #[inline]
    fn new(g: std::sync::MutexGuard<'a, State>) -> StGuard<'a> {
        #[cfg(test)]
        HELD.with(|h| h.set(h.get() + 1));
        StGuard(g)
    }
}

impl Drop for StGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        #[cfg(test)]
        HELD.with(|h| h.set(h.get() - 1));
    }
}

impl std::ops::Deref for StGuard<'_> {
    type Target = State;
    #[inline]
    fn deref(&self) -> &State {
        &self.0
    }
}

impl std::ops::DerefMut for StGuard<'_> {
    #[inline]
    fn deref_mut(&mut self) -> &mut State {
        &mut self.0
    }
}

impl StLock {
    pub fn new(st: State) -> StLock {
        StLock(std::sync::Mutex::new(st))
    }

    #[inline]
    pub fn lock(&self) -> std::sync::LockResult<StGuard<'_>> {
        match self.0.lock() {
            Ok(g) => Ok(StGuard::new(g)),
            Err(e) => Err(std::sync::PoisonError::new(StGuard::new(e.into_inner()))),
        }
    }

    #[inline]
    pub fn try_lock(&self) -> std::sync::TryLockResult<StGuard<'_>> {
        match self.0.try_lock() {
            Ok(g) => Ok(StGuard::new(g)),
            Err(std::sync::TryLockError::WouldBlock) => Err(std::sync::TryLockError::WouldBlock),
            Err(std::sync::TryLockError::Poisoned(e)) => Err(std::sync::TryLockError::Poisoned(
                std::sync::PoisonError::new(StGuard::new(e.into_inner())),
            )),
        }
    }
}
