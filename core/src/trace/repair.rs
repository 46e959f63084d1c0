//! What the recorder's writer thread does between what the interposer saw and
//! what it writes: turns VMM mappings into allocations (the format has no map
//! event) and keeps the file a valid trace whatever it is fed — events lost to
//! a full queue, frees u3m did not see, pointers into memory it never saw
//! allocated. Each repair is counted and (the first [`NOTE_LIMIT`]) explained
//! in a `# u3m: ...` comment line.
//!
//! VMM: a mapping (`aclrtMapMem`) is a live piece; each maximal run of
//! contiguous mapped pieces on a device is one allocation, tagged `vmm`. A map
//! that extends or joins runs is written as `F` of those runs followed by `A`
//! of the merged run; an unmap as `F` of its run followed by `A` of what
//! remains on either side. So tensors carved across two physical handles
//! (expandable segments) lie inside one allocation, and every range the
//! program can touch is inside a live allocation, as the format requires.

use std::collections::BTreeMap;

use super::event::{Body, CopyKind, Event};
use super::live::LiveSet;

/// Repairs explained in comments; the rest are only counted.
pub const NOTE_LIMIT: u64 = 100;

/// What the writer thread is fed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    Event(Event),
    /// `[addr, addr + bytes)` of `dev` became mapped (aclrtMapMem succeeded).
    Map {
        dev: u32,
        addr: u64,
        bytes: u64,
        t: Option<u64>,
    },
    /// The mapping starting at `addr` is about to be removed (aclrtUnmapMem).
    Unmap {
        dev: u32,
        addr: u64,
        t: Option<u64>,
    },
    /// A copy whose direction the caller did not know (ACL_MEMCPY_DEFAULT):
    /// each side is device memory iff it lies in a live allocation.
    CopyAuto {
        dev: u32,
        stream: u32,
        dst: u64,
        src: u64,
        bytes: u64,
        t: Option<u64>,
    },
}

/// What comes out: events to write, and comments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Event(Event),
    Comment(String),
}

#[derive(Debug, Default)]
pub struct Repair {
    live: LiveSet,
    /// (dev, start) -> bytes of each mapped piece.
    pieces: BTreeMap<(u32, u64), u64>,
    /// (dev, start) -> end of each run (a live allocation in `live`).
    runs: BTreeMap<(u32, u64), u64>,
    repaired: u64,
}

fn ev_at(body: Body, dev: u32, t: Option<u64>) -> Event {
    let mut e = Event::new(body).on_dev(dev);
    e.t = t;
    e
}

impl Repair {
    pub fn new() -> Repair {
        Repair::default()
    }

    /// Events repaired (changed or left out) so far.
    pub fn repaired(&self) -> u64 {
        self.repaired
    }

    /// The allocations live in what has been written.
    pub fn live(&self) -> &LiveSet {
        &self.live
    }

    fn note(&mut self, out: &mut Vec<Output>, what: impl FnOnce() -> String) {
        self.repaired += 1;
        if self.repaired <= NOTE_LIMIT {
            out.push(Output::Comment(format!("u3m: {}", what())));
            if self.repaired == NOTE_LIMIT {
                out.push(Output::Comment(format!(
                    "u3m: further repairs are only counted (first {NOTE_LIMIT} noted)"
                )));
            }
        }
    }

    fn emit_free(&mut self, out: &mut Vec<Output>, dev: u32, addr: u64, t: Option<u64>) {
        self.live.remove(dev, addr);
        out.push(Output::Event(ev_at(Body::Free { addr }, dev, t)));
    }

    fn emit_run(&mut self, out: &mut Vec<Output>, dev: u32, start: u64, end: u64, t: Option<u64>) {
        // Runs are built from pieces that overlap nothing live, so this cannot fail.
        if self.live.insert(dev, start, end - start).is_ok() {
            self.runs.insert((dev, start), end);
            let mut e = ev_at(
                Body::Alloc {
                    addr: start,
                    bytes: end - start,
                },
                dev,
                t,
            );
            e.tag = Some("vmm".to_string());
            out.push(Output::Event(e));
        }
    }

    /// Frees live allocations overlapping `[addr, addr+bytes)` (their frees
    /// were not seen: the runtime handed the memory out again).
    fn evict(
        &mut self,
        out: &mut Vec<Output>,
        dev: u32,
        addr: u64,
        bytes: u64,
        t: Option<u64>,
        why: &str,
    ) {
        for a in self.live.all_overlapping(dev, addr, bytes) {
            self.note(out, || {
                format!(
                    "{why} {addr:#x} {bytes} overlaps the live allocation {:#x} {}: freed here",
                    a.addr, a.bytes
                )
            });
            if let Some(end) = self.runs.remove(&(dev, a.addr)) {
                let gone: Vec<_> = self
                    .pieces
                    .range((dev, a.addr)..(dev, end))
                    .map(|(k, _)| *k)
                    .collect();
                for k in gone {
                    self.pieces.remove(&k);
                }
            }
            self.emit_free(out, dev, a.addr, t);
        }
    }

    /// Feeds one input; appends what to write to `out`.
    pub fn push(&mut self, input: Input, out: &mut Vec<Output>) {
        match input {
            Input::Event(ev) => self.event(ev, out),
            Input::Map {
                dev,
                addr,
                bytes,
                t,
            } => self.map(dev, addr, bytes, t, out),
            Input::Unmap { dev, addr, t } => self.unmap(dev, addr, t, out),
            Input::CopyAuto {
                dev,
                stream,
                dst,
                src,
                bytes,
                t,
            } => {
                let d = self.live.resolve(dev, dst, bytes).is_some();
                let s = self.live.resolve(dev, src, bytes).is_some();
                let kind = match (d, s) {
                    (true, true) => CopyKind::D2D,
                    (true, false) => CopyKind::H2D,
                    (false, true) => CopyKind::D2H,
                    (false, false) => CopyKind::H2H,
                };
                let mut e = ev_at(
                    Body::Copy {
                        kind,
                        dst,
                        src,
                        bytes,
                    },
                    dev,
                    t,
                );
                e.stream = stream;
                self.event(e, out);
            }
        }
    }

    fn map(&mut self, dev: u32, addr: u64, bytes: u64, t: Option<u64>, out: &mut Vec<Output>) {
        let Some(end) = addr.checked_add(bytes).filter(|_| bytes > 0) else {
            self.note(out, || {
                format!("map {addr:#x} {bytes} on device {dev}: empty or wraps: left out")
            });
            return;
        };
        let clash = self
            .pieces
            .range((dev, 0)..(dev, end))
            .next_back()
            .filter(|((_, a), b)| a + **b > addr);
        if let Some(((_, a), b)) = clash {
            let (a, b) = (*a, *b);
            self.note(out, || {
                format!("map {addr:#x} {bytes} overlaps the mapping {a:#x} {b}: left out")
            });
            return;
        }
        self.evict(out, dev, addr, bytes, t, "map");
        let mut start = addr;
        let mut stop = end;
        // a run ending exactly at addr, and one starting exactly at end
        if let Some((&(_, s), &e)) = self.runs.range((dev, 0)..(dev, addr)).next_back() {
            if e == addr {
                self.runs.remove(&(dev, s));
                self.emit_free(out, dev, s, t);
                start = s;
            }
        }
        if let Some(e) = self.runs.remove(&(dev, end)) {
            self.emit_free(out, dev, end, t);
            stop = e;
        }
        self.pieces.insert((dev, addr), bytes);
        self.emit_run(out, dev, start, stop, t);
    }

    fn unmap(&mut self, dev: u32, addr: u64, t: Option<u64>, out: &mut Vec<Output>) {
        let Some(bytes) = self.pieces.remove(&(dev, addr)) else {
            self.note(out, || {
                format!("unmap {addr:#x} on device {dev}: no mapping starts there: left out")
            });
            return;
        };
        let end = addr + bytes;
        let Some((&(_, s), &e)) = self.runs.range((dev, 0)..=(dev, addr)).next_back() else {
            return;
        };
        self.runs.remove(&(dev, s));
        self.emit_free(out, dev, s, t);
        if s < addr {
            self.emit_run(out, dev, s, addr, t);
        }
        if end < e {
            self.emit_run(out, dev, end, e, t);
        }
    }

    fn event(&mut self, mut ev: Event, out: &mut Vec<Output>) {
        let dev = ev.dev;
        match &mut ev.body {
            Body::Alloc { addr, bytes } => {
                let (addr, bytes) = (*addr, *bytes);
                if addr.checked_add(bytes.max(1)).is_none() {
                    self.note(out, || {
                        format!("A {addr:#x} {bytes}: wraps around: left out")
                    });
                    return;
                }
                self.evict(out, dev, addr, bytes, ev.t, "A");
                let _ = self.live.insert(dev, addr, bytes);
            }
            Body::Free { addr } => {
                let addr = *addr;
                if self.runs.contains_key(&(dev, addr)) || self.live.remove(dev, addr).is_none() {
                    self.note(out, || {
                        format!("F {addr:#x} on device {dev}: not the start of a live allocation: left out")
                    });
                    return;
                }
            }
            Body::Op {
                op_type,
                inputs,
                outputs,
            } => {
                let before = inputs.len() + outputs.len();
                let live = &self.live;
                inputs.retain(|r| live.resolve_range(dev, *r).is_some());
                outputs.retain(|r| live.resolve_range(dev, *r).is_some());
                let dropped = before - inputs.len() - outputs.len();
                if dropped > 0 {
                    let op = op_type.clone();
                    self.note(out, || {
                        format!("O {op}: {dropped} range(s) outside every live allocation left out")
                    });
                }
            }
            Body::Copy {
                kind,
                dst,
                src,
                bytes,
            } => {
                let ok = (!kind.dst_on_device() || self.live.resolve(dev, *dst, *bytes).is_some())
                    && (!kind.src_on_device() || self.live.resolve(dev, *src, *bytes).is_some());
                if !ok {
                    let (k, d, s, b) = (*kind, *dst, *src, *bytes);
                    self.note(out, || {
                        format!("M {k} {d:#x} {s:#x} {b}: device side outside every live allocation: left out")
                    });
                    return;
                }
            }
            Body::Set { addr, bytes } => {
                if self.live.resolve(dev, *addr, *bytes).is_none() {
                    let (a, b) = (*addr, *bytes);
                    self.note(out, || {
                        format!("S {a:#x} {b}: outside every live allocation: left out")
                    });
                    return;
                }
            }
        }
        out.push(Output::Event(ev));
    }
}
