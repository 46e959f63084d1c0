//! Address-free view of a trace, for comparing two recordings of "the same" run
//! (a program and acl_replay's replay of its trace) whose allocations landed at
//! different device addresses and whose host buffers differ.
//!
//! Device addresses become (allocation ordinal, offset) — ordinals count `A`
//! events in trace order; host addresses become the ordinal of their first
//! appearance; (dev, stream) pairs of `O`/`M`/`S` become the ordinal of their
//! first appearance (the interposer numbers the replayer's streams its own
//! way), and the stream of `A`/`F` (which have none in ACL) is not compared.
//! `t`, `flops` and `tag` are informational and dropped. acl_replay's own
//! liberties are applied to both sides: a zero-byte `A` counts as one byte and
//! zero-byte `M`/`S` events (which it skips) are left out.

use std::collections::HashMap;

use super::event::{Body, CopyKind, Event, Range};
use super::live::LiveSet;

/// A device range: allocation ordinal, offset into it, length. An address in
/// no live allocation (an invalid trace) keeps its raw value with `alloc: u64::MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DevRange {
    pub alloc: u64,
    pub offset: u64,
    pub bytes: u64,
}

/// One side of a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    Dev {
        alloc: u64,
        offset: u64,
    },
    /// Ordinal of the host address's first appearance.
    Host(u64),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NormBody {
    Alloc {
        bytes: u64,
    },
    Free {
        alloc: u64,
    },
    Op {
        op_type: String,
        inputs: Vec<DevRange>,
        outputs: Vec<DevRange>,
    },
    Copy {
        kind: CopyKind,
        dst: Side,
        src: Side,
        bytes: u64,
    },
    Set {
        range: DevRange,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NormEvent {
    pub dev: u32,
    /// Ordinal of the (dev, stream) pair; `None` for `A` and `F`.
    pub stream: Option<u32>,
    pub body: NormBody,
}

#[derive(Debug, Default)]
pub struct Normalizer {
    live: LiveSet,
    streams: HashMap<(u32, u32), u32>,
    hosts: HashMap<u64, u64>,
}

impl Normalizer {
    pub fn new() -> Normalizer {
        Normalizer::default()
    }

    fn dev_range(&self, dev: u32, r: Range) -> DevRange {
        match self.live.resolve_range(dev, r) {
            Some(a) => DevRange {
                alloc: a.ordinal,
                offset: r.addr - a.addr,
                bytes: r.bytes,
            },
            None => DevRange {
                alloc: u64::MAX,
                offset: r.addr,
                bytes: r.bytes,
            },
        }
    }

    fn side(&mut self, dev: u32, on_device: bool, addr: u64, bytes: u64) -> Side {
        if on_device {
            let r = self.dev_range(dev, Range::new(addr, bytes));
            Side::Dev {
                alloc: r.alloc,
                offset: r.offset,
            }
        } else {
            let n = self.hosts.len() as u64;
            Side::Host(*self.hosts.entry(addr).or_insert(n))
        }
    }

    fn stream(&mut self, dev: u32, stream: u32) -> Option<u32> {
        let n = self.streams.len() as u32;
        Some(*self.streams.entry((dev, stream)).or_insert(n))
    }

    /// The normalised form of the next event, or `None` for one left out.
    pub fn push(&mut self, ev: &Event) -> Option<NormEvent> {
        let dev = ev.dev;
        let (stream, body) = match &ev.body {
            Body::Alloc { addr, bytes } => {
                let bytes = (*bytes).max(1);
                let _ = self.live.insert(dev, *addr, bytes);
                (None, NormBody::Alloc { bytes })
            }
            Body::Free { addr } => {
                let alloc = self.live.remove(dev, *addr).map_or(u64::MAX, |a| a.ordinal);
                (None, NormBody::Free { alloc })
            }
            Body::Op {
                op_type,
                inputs,
                outputs,
            } => {
                let inputs = inputs.iter().map(|r| self.dev_range(dev, *r)).collect();
                let outputs = outputs.iter().map(|r| self.dev_range(dev, *r)).collect();
                (
                    self.stream(dev, ev.stream),
                    NormBody::Op {
                        op_type: op_type.clone(),
                        inputs,
                        outputs,
                    },
                )
            }
            Body::Copy {
                kind,
                dst,
                src,
                bytes,
            } => {
                if *bytes == 0 {
                    return None;
                }
                let dst = self.side(dev, kind.dst_on_device(), *dst, *bytes);
                let src = self.side(dev, kind.src_on_device(), *src, *bytes);
                (
                    self.stream(dev, ev.stream),
                    NormBody::Copy {
                        kind: *kind,
                        dst,
                        src,
                        bytes: *bytes,
                    },
                )
            }
            Body::Set { addr, bytes } => {
                if *bytes == 0 {
                    return None;
                }
                let range = self.dev_range(dev, Range::new(*addr, *bytes));
                (self.stream(dev, ev.stream), NormBody::Set { range })
            }
        };
        Some(NormEvent { dev, stream, body })
    }
}

/// The normalised form of a whole trace.
pub fn normalize(events: &[Event]) -> Vec<NormEvent> {
    let mut n = Normalizer::new();
    events.iter().filter_map(|e| n.push(e)).collect()
}

/// Where two normalised traces first differ (`None` if they are equal), with
/// the index and both events (`None` past an end), for test messages.
pub fn first_difference(
    a: &[NormEvent],
    b: &[NormEvent],
) -> Option<(usize, Option<NormEvent>, Option<NormEvent>)> {
    let n = a.len().max(b.len());
    (0..n)
        .find(|&i| a.get(i) != b.get(i))
        .map(|i| (i, a.get(i).cloned(), b.get(i).cloned()))
}
