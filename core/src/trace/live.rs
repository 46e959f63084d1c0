//! The live allocations of a trace, per device: what the validity rules of the
//! format are checked against (the reader), what the recorder's writer thread
//! repairs against, and what address normalisation numbers allocations by.
//! Not a hot-path structure (a BTreeMap per lookup is fine here).

use std::collections::BTreeMap;

use super::event::Range;

/// One live allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveAlloc {
    pub addr: u64,
    pub bytes: u64,
    /// 0 for the first `A` of the trace, 1 for the next, ... (all devices).
    pub ordinal: u64,
}

/// Why an allocation cannot become live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertError {
    /// `addr + bytes` does not fit in 64 bits.
    Wraps,
    /// It overlaps this live allocation on the same device.
    Overlaps(LiveAlloc),
}

/// A zero-byte allocation still occupies its address (acl_replay gives it one
/// byte), so two of them cannot share a start.
fn span(bytes: u64) -> u64 {
    bytes.max(1)
}

#[derive(Debug, Default, Clone)]
pub struct LiveSet {
    /// (device, start) -> allocation.
    map: BTreeMap<(u32, u64), LiveAlloc>,
    next_ordinal: u64,
}

impl LiveSet {
    pub fn new() -> LiveSet {
        LiveSet::default()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The live allocation with the largest start <= addr on `dev`.
    fn floor(&self, dev: u32, addr: u64) -> Option<&LiveAlloc> {
        self.map
            .range((dev, 0)..=(dev, addr))
            .next_back()
            .map(|(_, a)| a)
    }
    /// The live allocation with the smallest start > addr on `dev`.
    fn higher(&self, dev: u32, addr: u64) -> Option<&LiveAlloc> {
        if addr == u64::MAX {
            return None;
        }
        self.map
            .range((dev, addr + 1)..=(dev, u64::MAX))
            .next()
            .map(|(_, a)| a)
    }

    /// The first live allocation on `dev` that `[addr, addr + max(bytes, 1))` overlaps.
    pub fn overlapping(&self, dev: u32, addr: u64, bytes: u64) -> Option<LiveAlloc> {
        if let Some(p) = self.floor(dev, addr) {
            if addr - p.addr < span(p.bytes) {
                return Some(*p);
            }
        }
        match self.higher(dev, addr) {
            Some(n) if n.addr - addr < span(bytes) => Some(*n),
            _ => None,
        }
    }

    /// Makes `[addr, addr + bytes)` live on `dev`; returns its ordinal.
    pub fn insert(&mut self, dev: u32, addr: u64, bytes: u64) -> Result<u64, InsertError> {
        if addr.checked_add(span(bytes)).is_none() {
            return Err(InsertError::Wraps);
        }
        if let Some(hit) = self.overlapping(dev, addr, bytes) {
            return Err(InsertError::Overlaps(hit));
        }
        let ordinal = self.next_ordinal;
        self.next_ordinal += 1;
        self.map.insert(
            (dev, addr),
            LiveAlloc {
                addr,
                bytes,
                ordinal,
            },
        );
        Ok(ordinal)
    }

    /// Frees the live allocation that starts exactly at `addr` on `dev`.
    pub fn remove(&mut self, dev: u32, addr: u64) -> Option<LiveAlloc> {
        self.map.remove(&(dev, addr))
    }

    /// The live allocation on `dev` that `[addr, addr + bytes)` lies entirely
    /// inside (a range may start anywhere in it and end at its end; a zero-byte
    /// range may sit at its end).
    pub fn resolve(&self, dev: u32, addr: u64, bytes: u64) -> Option<LiveAlloc> {
        let p = self.floor(dev, addr)?;
        let off = addr - p.addr;
        if off > p.bytes || bytes > p.bytes - off {
            return None;
        }
        Some(*p)
    }

    pub fn resolve_range(&self, dev: u32, r: Range) -> Option<LiveAlloc> {
        self.resolve(dev, r.addr, r.bytes)
    }

    /// Every live allocation on `dev` overlapping `[addr, addr + max(bytes, 1))`, by address.
    pub fn all_overlapping(&self, dev: u32, addr: u64, bytes: u64) -> Vec<LiveAlloc> {
        let end = addr.saturating_add(span(bytes));
        let mut out = Vec::new();
        if let Some(p) = self.floor(dev, addr) {
            if addr - p.addr < span(p.bytes) {
                out.push(*p);
            }
        }
        if addr < u64::MAX {
            for (_, a) in self.map.range((dev, addr + 1)..(dev, end.max(addr + 1))) {
                out.push(*a);
            }
        }
        out
    }

    /// Every live allocation, by (device, address).
    pub fn iter(&self) -> impl Iterator<Item = (u32, &LiveAlloc)> {
        self.map.iter().map(|((d, _), a)| (*d, a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_and_containment() {
        let mut s = LiveSet::new();
        assert_eq!(s.insert(0, 0x1000, 0x1000), Ok(0));
        assert_eq!(
            s.insert(1, 0x1000, 0x1000),
            Ok(1),
            "other device, same addresses"
        );
        assert!(
            matches!(s.insert(0, 0x1fff, 1), Err(InsertError::Overlaps(a)) if a.addr == 0x1000)
        );
        assert!(
            matches!(s.insert(0, 0x800, 0x801), Err(InsertError::Overlaps(a)) if a.addr == 0x1000)
        );
        assert_eq!(s.insert(0, 0x800, 0x800), Ok(2), "adjacent below");
        assert_eq!(s.insert(0, 0x2000, 0), Ok(3), "adjacent above, zero bytes");
        assert!(
            matches!(s.insert(0, 0x2000, 5), Err(InsertError::Overlaps(a)) if a.addr == 0x2000)
        );
        assert_eq!(s.insert(0, u64::MAX - 1, 2), Err(InsertError::Wraps));
        assert_eq!(s.insert(0, u64::MAX - 1, 1), Ok(4));

        assert_eq!(s.resolve(0, 0x1000, 0x1000).map(|a| a.addr), Some(0x1000));
        assert_eq!(s.resolve(0, 0x1800, 0x800).map(|a| a.addr), Some(0x1000));
        assert_eq!(s.resolve(0, 0x1800, 0x801), None);
        assert_eq!(
            s.resolve(0, 0x2000, 0).map(|a| a.addr),
            Some(0x2000),
            "zero bytes at a zero-byte alloc"
        );
        assert_eq!(s.resolve(0, 0x2001, 0), None);
        assert_eq!(s.resolve(0, 0x10, 1), None);
        assert_eq!(s.resolve(2, 0x1000, 1), None);

        assert_eq!(
            s.all_overlapping(0, 0x900, 0x1800)
                .iter()
                .map(|a| a.addr)
                .collect::<Vec<_>>(),
            [0x800, 0x1000, 0x2000]
        );
        assert_eq!(s.remove(0, 0x1000).map(|a| a.ordinal), Some(0));
        assert_eq!(s.remove(0, 0x1000), None);
        assert_eq!(s.resolve(1, 0x1fff, 1).map(|a| a.ordinal), Some(1));
    }
}
